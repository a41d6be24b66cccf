"""The pipeline protocol: what every pipeline gives for a policy of a :class:`hrm.problem.Problem`.

A pipeline is how an engine's schedule turns a layer's work into time: ``lanes`` (the max of
affine lanes, eq. 12 of MoE-Lightning) or ``expert-level`` (Klotski's list-scheduled task
graph). Each gives, from the same mechanism functions of :mod:`hrm.cost.latency` (one weight path,
one KV path, one host-DRAM charge, one dispatch α per task), for a problem (the machine's
rates, the model, the workload, the engine) and a policy:

- :meth:`Pipeline.times` — the prefill and decode time of a policy (:class:`PhaseTimes`);
- :meth:`Pipeline.memory` — its peak bytes per tier (:class:`MemoryUse`);
- :meth:`Pipeline.timeline` — list-scheduled decode layers (:class:`hrm.pipelines.list_scheduler.Timeline`)
  at a context, with the layers to schedule and the layer kind as keywords;
- :attr:`Pipeline.fields` — the engine fields it models (an engine setting another is refused).

:func:`hrm.estimate.estimate` turns times and memory into the one
:class:`hrm.estimate.EstimateResult` of every pipeline; each pipeline's search is registered
in :data:`solver.search.SEARCHES` under the pipeline's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from ..engines.schedules import PipelineFields
from ..policy import Policy
from ..problem import Problem
from .list_scheduler import Timeline

#: resources and lanes in words
RESOURCE_LABELS = {
    "gpu": "GPU compute/HBM",
    "cpu": "CPU compute/DRAM",
    "h2d": "CPU->GPU link",
    "d2h": "GPU->CPU link",
    "chain": "serial GPU-CPU chain",
    "all": "one unit (no overlap)",
    "copy": "CPU staging-copy team",
    "dram": "host DRAM bandwidth",
    "gpu+weights": "GPU chain waiting on the weight load",
    "gpu+ffn-weights": "GPU chain waiting on the FFN block's weight load (block by block)",
    "gpu+attention-weights": "GPU chain waiting on the attention block's weight load (block by block)",
    "host": "host thread issuing ops (launch + Python)",
    "host+gpu": "host issue then GPU work (sync per slot)",
    "disk": "disk read of weights beyond host memory",
    "dram+disk": "host DRAM bandwidth with the disk reads' writes",
}


def lane_label(name: str) -> str:
    """A lane's name for people (``X+weights``: lane X with the weight load of one slot)."""
    if name.endswith("+weights") and name not in RESOURCE_LABELS:
        return f"{lane_label(name[:-len('+weights')])} + weight load (sync per micro-batch)"
    return RESOURCE_LABELS.get(name, name)


@dataclass(frozen=True)
class PhaseTimes:
    """A policy's times: the prefill, the ``decode_steps`` decode steps (``decode_s`` in all),
    the mean decode step (``per_token_s``; the prefill when there is no decode step), the mean
    decode time per layer, per-layer busy seconds of each resource and lane, the bottleneck
    in words and notes."""

    prefill_s: float
    decode_s: float
    decode_steps: int
    per_token_s: float
    decode_layer_s: float
    resource_layer_s: dict[str, float]
    lane_layer_s: dict[str, float]
    bottleneck: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class MemoryUse:
    """A policy's peak bytes per tier and what makes them up (``{"gpu": {...}, "cpu": {...}}``,
    and ``"disk"`` when weights spill): ``cpu_peak_bytes`` is what stays in host memory,
    ``disk_bytes`` the weights spilled beyond it (docs/model.md §4.9; 0 without a disk tier)."""

    gpu_peak_bytes: float
    cpu_peak_bytes: float
    components: dict
    disk_bytes: float = 0.0


class Pipeline(Protocol):
    """One pipeline (module docstring): its ``name`` (what :attr:`hrm.engines.schedules.Schedule.pipeline`
    names), ``help`` in words, the engine ``fields`` it models, and its times, memory and
    timeline of a policy of a problem."""

    name: str
    help: str
    fields: PipelineFields

    def times(self, problem: Problem, policy: Policy) -> PhaseTimes:
        """The prefill and decode times of ``policy``."""
        ...

    def memory(self, problem: Problem, policy: Policy) -> MemoryUse:
        """The peak bytes per tier of ``policy``."""
        ...

    def timeline(self, problem: Problem, policy: Policy, *, context: float, layers: int = ...,
                 moe: bool = True) -> Timeline:
        """``layers`` list-scheduled decode layers of ``policy`` at ``context`` cached tokens
        (MoE layers, or a dense one with ``moe=False``)."""
        ...


@dataclass(frozen=True)
class PipelineFunctions:
    """A :class:`Pipeline` made of its module's functions: what each pipeline registers."""

    name: str
    help: str
    fields: PipelineFields
    times: Callable[[Problem, Policy], PhaseTimes]
    memory: Callable[[Problem, Policy], MemoryUse]
    timeline: Callable[..., Timeline]
