"""The expert-level pipeline (Klotski, engine ``klotski``): a whole policy on the expert-level
list schedule of :mod:`hrm.pipelines.expert_level_tasks`.

A Klotski policy in the toolkit's terms: μ sequences per batch, n batches per group
(N = n·μ), attention and experts on the GPU, r_w the share of MoE layers whose experts stay
on the GPU (whole layers: the greedy fill's unit,
mindspore-lab/models@220d9e77 ``research/SYSU/Klotski/mixtral/configuration_mixtral.py:63-182``),
r_c the share of the KV cache on the GPU. Per layer kind (offloaded, resident MoE layers,
dense layers) one layer is list-scheduled (:func:`hrm.pipelines.expert_level_tasks.schedule_layer`); decode is
taken at the mean decode context (:func:`hrm.workload.mean_decode_context`).

Mechanisms beyond the paper's pipeline, from the same functions the lanes use: the weight
path (pinned, driver-staged or staged by a copy team: :func:`hrm.cost.latency.transfers.weight_transfer_s`),
the KV path (:func:`hrm.cost.latency.transfers.kv_load_s`, :func:`hrm.cost.latency.transfers.kv_cache_s`), host DRAM and
the staging-copy team as capacity bounds of the period, ``sync: per-step`` (each decode step
starts with an empty pipeline: its first layer takes its makespan from empty, not the
steady-state period), and the engine's expert buffers (``memory.gpu_weight_buffer_layers``
whole layers: the scheduler's prefetch slots and their GPU bytes). The paper's own disk
tier (§6.1, ``memory.disk_weights``): whole layers of experts beyond host memory on disk
(:func:`klotski_disk_bytes`, with :func:`hrm.cost.memory.disk_spill_allowed` of the lanes), read
once per pass overlapping the whole pass (:func:`klotski_times`). Its search is
:mod:`solver.expert_level`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cost import costs
from ..cost.latency.ops import lm_head_time_s
from ..engines.engine import IDEAL, Engine
from ..errors import HRMError
from .expert_level_tasks import KV_BUFFERS, ExpertSchedule, klotski_batches, klotski_layer, schedule_layer
from .list_scheduler import Timeline
from ..cost.memory import MemoryLimits, disk_spill_allowed, gpu_workspace_bytes, kv_bytes_per_sequence
from ..model.spec import ModelSpec
from ..policy import Policy
from ..problem import Problem
from ..machine.rates import Rates
from ..model.routing import Routing, uniform
from ..engines.schedules import PIPELINE_FIELDS
from ..units import dtype_bytes
from ..workload import mean_decode_context
from .base import MemoryUse, PhaseTimes, Pipeline, PipelineFunctions, lane_label

def resident_moe_layers(model: ModelSpec, weights_gpu_ratio: float) -> int:
    """MoE layers whose experts stay on the GPU: r_w·L, whole layers."""
    return int(round(float(weights_gpu_ratio) * model.num_moe_layers))


@dataclass(frozen=True)
class KlotskiTimes:
    """Times of a policy: per layer kind (``offloaded``, ``resident`` MoE layers, ``dense``)
    the scheduled decode and prefill layers and how many layers of each kind there are."""

    decode_step_s: float
    decode_steps: int
    prefill_s: float
    counts: dict[str, int]
    decode: dict[str, ExpertSchedule]
    prefill: dict[str, ExpertSchedule]
    context: float
    step_drain_s: float = 0.0  # per decode step, under sync: per-step (included in decode_step_s)
    #: per pass (a decode step, the prefill): reading the layers of experts kept on disk
    disk_read_s: float = 0.0

    @property
    def decode_s(self) -> float:
        return self.decode_step_s * self.decode_steps

    def per_layer_s(self, what: str = "period") -> dict[str, float]:
        """Decode: each resource's busy seconds per layer (``busy``), or the layer period
        (``period``), averaged over the layers."""
        total = sum(self.counts.values())
        if what == "period":
            return {"period": sum(c * self.decode[k].period_s for k, c in self.counts.items() if c) / total}
        out: dict[str, float] = {}
        for kind, count in self.counts.items():
            if count:
                for resource, busy in self.decode[kind].resource_busy_s.items():
                    out[resource] = out.get(resource, 0.0) + count * busy / total
        return out


def layer_kinds(model: ModelSpec, weights_gpu_ratio: float) -> dict[str, int]:
    resident = resident_moe_layers(model, weights_gpu_ratio)
    return {"offloaded": model.num_moe_layers - resident, "resident": resident, "dense": model.first_dense_layers}


def _kind_options(kind: str) -> dict:
    return {"offloaded": {"experts_resident": False}, "resident": {"experts_resident": True},
            "dense": {"moe": False}}[kind]


def expert_buffers(engine: Engine) -> int:
    """Layers of experts the GPU buffers for loads (``memory.gpu_weight_buffer_layers``; the
    expert-level pipeline models whole layers: :data:`hrm.engines.schedules.PIPELINE_FIELDS`)."""
    return int(engine.memory.gpu_weight_buffer_layers)


#: the order of a model's layer kinds (Klotski's greedy fill keeps the first MoE layers' experts)
KIND_ORDER = ("dense", "resident", "offloaded")


def klotski_times(model: ModelSpec, rates: Rates, workload, policy, engine: Engine = IDEAL,
                  routing: Routing | None = None, disk_read_s: float = 0.0) -> KlotskiTimes:
    """Prefill and decode time of ``policy`` run by Klotski: per layer kind one scheduled
    layer (:func:`schedule_layer`), decode at :func:`mean_decode_context`; per step the
    n batches' heads (and, under ``sync: per-step``, the first layer's fill from an empty
    pipeline); prefill one pass of the prompts through the same pipeline. ``disk_read_s``
    (:func:`klotski_disk_read_s`): the disk read of the layers kept on disk, which the CPU
    prefetches a window of layers ahead [Klotski §6.1], so it overlaps the whole pass: the
    layers take at least that long per step and in the prefill."""
    mu, n = policy.micro_batch_size, policy.num_micro_batches
    counts = layer_kinds(model, policy.weights_gpu_ratio)
    context = mean_decode_context(workload)
    buffers = expert_buffers(engine)
    common = dict(engine=engine, kv_gpu_ratio=policy.kv_gpu_ratio, dense_resident=True)
    decode, prefill, layers = {}, {}, {}
    for kind, count in counts.items():
        if count:
            options = {**common, **_kind_options(kind)}
            layers[kind] = klotski_layer(model, rates, mu, context, n, routing, **options)
            decode[kind] = schedule_layer(layers[kind], expert_buffers=buffers)
            prefill[kind] = schedule_layer(klotski_layer(model, rates, mu, context, n, routing,
                                                         prompt_len=workload.effective_prompt_len, **options),
                                           expert_buffers=buffers)
    drain = 0.0
    if engine.sync == "per-step":
        first = next(kind for kind in KIND_ORDER if counts[kind])
        alone = schedule_layer(layers[first], layers=1, expert_buffers=buffers)
        drain = max(alone.period_s - decode[first].period_s, 0.0)
    head = n * float(lm_head_time_s(model, rates, mu, engine))
    step = head + max(sum(count * decode[kind].period_s for kind, count in counts.items() if count),
                      disk_read_s) + drain
    pre = head + max(sum(count * prefill[kind].period_s for kind, count in counts.items() if count), disk_read_s)
    return KlotskiTimes(step, max(workload.gen_len - 1, 0), pre, counts, decode, prefill, context, drain,
                        disk_read_s)


@dataclass(frozen=True)
class KlotskiMemory:
    """Peak bytes per tier, affine in r_c: ``*_const`` + r_c·``*_per_kv_ratio``; arrays
    broadcast over μ, N and the resident layers."""

    gpu_const: np.ndarray | float
    gpu_per_kv_ratio: np.ndarray | float
    cpu_const: np.ndarray | float
    cpu_per_kv_ratio: np.ndarray | float
    components: dict

    def gpu_bytes(self, kv_gpu_ratio):
        return self.gpu_const + self.gpu_per_kv_ratio * np.asarray(kv_gpu_ratio, dtype=float)

    def cpu_bytes(self, kv_gpu_ratio):
        return self.cpu_const + self.cpu_per_kv_ratio * np.asarray(kv_gpu_ratio, dtype=float)


def klotski_memory(model: ModelSpec, workload, micro_batch, batch_size, resident_layers, *, engine: Engine,
                   routing: Routing | None = None) -> KlotskiMemory:
    """The engine's memory (module docstring). GPU: every non-expert weight and the
    embeddings (the greedy fill's first item), the experts of the resident layers, the
    engine's expert buffers (``memory.gpu_weight_buffer_layers`` layers of experts; Klotski
    reserves one, ``configuration_mixtral.py:113``) when any layer is offloaded, r_c of every
    sequence's KV cache, two batch buffers of one layer's host-resident KV, the hidden
    states of all N sequences, one batch's workspace and the largest expert call's
    activations (a batch's t·q_max tokens, prefill or decode). CPU: the offloaded layers'
    experts (every layer's with ``memory.cpu_holds_all_experts``), the pinned staging
    buffer (``memory.pinned_staging_layers`` layers of experts) when any layer is offloaded,
    and (1 − r_c) of the KV cache."""
    routing = routing or model.routing or uniform(model.num_experts, model.top_k)
    mu = np.asarray(micro_batch, dtype=float)
    batch_size = np.asarray(batch_size, dtype=float)
    resident = np.asarray(resident_layers, dtype=float)
    ab = dtype_bytes(model.activation_dtype)
    layer_experts = costs.layer_expert_bytes(model)
    offloaded = model.num_moe_layers - resident
    kv_seq = kv_bytes_per_sequence(model, workload)
    kv_buffers = KV_BUFFERS * mu * workload.max_context_len * costs.kv_bytes_per_token(model)
    q_max = float(routing.q.max())
    per_expert_token = (2 * model.hidden_size + 3 * model.expert_intermediate_size) * ab
    expert_call = mu * max(workload.effective_prompt_len, 1) * q_max * per_expert_token
    static = costs.static_weight_bytes(model)
    buffer = np.where(offloaded > 0, engine.memory.gpu_weight_buffer_layers * layer_experts, 0.0)
    staging = np.where(offloaded > 0, engine.memory.pinned_staging_layers * layer_experts, 0.0)
    on_cpu = (model.num_moe_layers if engine.memory.cpu_holds_all_experts else offloaded) * layer_experts
    hidden = batch_size * 2 * model.hidden_size * ab
    work = gpu_workspace_bytes(model, workload, mu, True) + expert_call
    return KlotskiMemory(
        gpu_const=static + resident * layer_experts + buffer + kv_buffers + hidden + work,
        gpu_per_kv_ratio=batch_size * kv_seq - kv_buffers,
        cpu_const=on_cpu + staging + batch_size * kv_seq,
        cpu_per_kv_ratio=-batch_size * kv_seq,
        components={"gpu": {"static_weights": static, "resident_experts": resident * layer_experts,
                            "expert_load_buffer": buffer, "kv_batch_buffers_at_rc0": kv_buffers, "hidden": hidden,
                            "workspace": work, "kv_per_sequence": kv_seq},
                    "cpu": {"offloaded_experts": on_cpu, "pinned_staging": staging, "kv_per_sequence": kv_seq}})


#: slack when rounding a spill up to whole layers (a spill within rounding of a whole number
#: of layers is that number)
DISK_LAYER_TOL = 1e-9


def klotski_disk_bytes(model: ModelSpec, memory: KlotskiMemory, kv_gpu_ratio, engine: Engine, rates: Rates,
                       limits: MemoryLimits):
    """Bytes of experts Klotski keeps on disk (``memory.disk_weights``, docs/model.md §4.9):
    whole layers of experts, the fewest that bring the host tier within its usable bytes —
    ⌈max(0, C − C_usable) / (one layer's experts)⌉ layers — as its placement does once the
    CPU budget is spent (``expert_offload_map[i] = 2`` for the last layers,
    mindspore-lab/models@220d9e77 research/SYSU/Klotski/mixtral/configuration_mixtral.py:63-182;
    paper §6.1). 0 where nothing may spill (:func:`hrm.cost.memory.disk_spill_allowed`). A policy
    fits only if they are at most the offloaded layers' experts."""
    cpu = np.asarray(memory.cpu_bytes(kv_gpu_ratio), dtype=float)
    if not disk_spill_allowed(engine, rates.disk_read_bytes_s, limits):
        return np.zeros(cpu.shape)
    layer = costs.layer_expert_bytes(model)
    over = np.maximum(cpu - limits.cpu_bytes, 0.0)
    return np.minimum(np.ceil(over / layer - DISK_LAYER_TOL) * layer, memory.components["cpu"]["offloaded_experts"])


def klotski_disk_read_s(disk_bytes, rates: Rates):
    """Seconds per pass to read ``disk_bytes`` from the profile's disk (0 without a spill)."""
    disk_bytes = np.asarray(disk_bytes, dtype=float)
    return disk_bytes / rates.disk_read_bytes_s if rates.disk_read_bytes_s else 0.0 * disk_bytes


def klotski_own_batches(model: ModelSpec, rates: Rates, workload, policy, engine: Engine = IDEAL,
                        routing: Routing | None = None) -> int | None:
    """Klotski's planner's n at this policy's μ and placement (inequalities 4-7 at the mean
    decode context, an offloaded layer)."""
    if not layer_kinds(model, policy.weights_gpu_ratio)["offloaded"]:
        return None
    return klotski_batches(model, rates, policy.micro_batch_size, mean_decode_context(workload), routing,
                           engine=engine, kv_gpu_ratio=policy.kv_gpu_ratio, dense_resident=True)


def expert_level_timeline(problem: Problem, policy: Policy, *, context: float, layers: int = 6,
                          moe: bool = True) -> Timeline:
    """The list-scheduled decode layers of ``policy`` at ``context`` cached tokens: its
    offloaded MoE layers, or its resident ones when every layer's experts are on the GPU (a
    dense layer with ``moe=False``); at least 3 layers (a steady-state period)."""
    model, engine = problem.model, problem.engine
    kinds = layer_kinds(model, policy.weights_gpu_ratio)
    kind = "dense" if not moe else "offloaded" if kinds["offloaded"] else "resident"
    layer = klotski_layer(model, problem.rates, policy.micro_batch_size, context, policy.num_micro_batches,
                          engine=engine, kv_gpu_ratio=policy.kv_gpu_ratio, dense_resident=True,
                          **_kind_options(kind))
    return schedule_layer(layer, layers=max(3, layers), expert_buffers=expert_buffers(engine)).timeline


def _check_gpu(problem: Problem) -> None:
    if problem.limits.shared or problem.hw.gpu is None:
        raise HRMError(f"engine {problem.engine.name}: profile '{problem.hw.name}' has no GPU (Klotski loads experts "
                       f"to a GPU)")


def expert_level_times(problem: Problem, policy: Policy) -> PhaseTimes:
    """:class:`PhaseTimes` from :func:`klotski_times`: the bottleneck is the busiest resource
    of the mean layer, with the bubble the schedule leaves above it; the note gives
    Klotski's own n (inequalities 4-7) at the policy's μ."""
    _check_gpu(problem)
    model, rates, workload, engine = problem.model, problem.rates, problem.workload, problem.engine
    disk = float(klotski_disk_bytes(model, _memory(problem, policy), policy.kv_gpu_ratio, engine, rates, problem.limits))
    times = klotski_times(model, rates, workload, policy, engine, disk_read_s=float(klotski_disk_read_s(disk, rates)))
    busy = times.per_layer_s("busy")
    period = times.per_layer_s("period")["period"]
    if disk > 0:  # the disk read, per layer, beside the scheduled resources
        busy["disk"] = times.disk_read_s / model.num_layers
        period = max(period, busy["disk"])
    top = max(busy, key=busy.get)
    bubble = period - busy[top]
    bottleneck = lane_label(top) + (f" (+{bubble / period:.0%} bubble)" if period and bubble / period >= 0.005 else "")
    own = klotski_own_batches(model, rates, workload, policy, engine)
    note = (f"Klotski's own planner (inequalities 4-7) at mu={policy.micro_batch_size}: "
            + (f"n={own}" if own is not None else "no n up to 512 hides the loads" if times.counts["offloaded"]
               else "no offloaded layer"))
    return PhaseTimes(prefill_s=times.prefill_s, decode_s=times.decode_s, decode_steps=times.decode_steps,
                      per_token_s=times.decode_step_s if times.decode_steps else times.prefill_s,
                      decode_layer_s=period, resource_layer_s=busy, lane_layer_s={**busy, "scheduled period": period},
                      bottleneck=bottleneck, notes=(note,))


def _memory(problem: Problem, policy: Policy) -> KlotskiMemory:
    return klotski_memory(problem.model, problem.workload, policy.micro_batch_size, policy.batch_size,
                          resident_moe_layers(problem.model, policy.weights_gpu_ratio), engine=problem.engine)


def expert_level_memory(problem: Problem, policy: Policy) -> MemoryUse:
    """:func:`klotski_memory` at the policy; the layers of experts on disk
    (:func:`klotski_disk_bytes`) leave the host tier."""
    _check_gpu(problem)
    memory = _memory(problem, policy)
    disk = float(klotski_disk_bytes(problem.model, memory, policy.kv_gpu_ratio, problem.engine, problem.rates,
                                    problem.limits))
    components = dict(memory.components)
    if disk > 0:
        components["disk"] = {"spilled_weights": disk}
    return MemoryUse(float(memory.gpu_bytes(policy.kv_gpu_ratio)), float(memory.cpu_bytes(policy.kv_gpu_ratio)) - disk,
                     components, disk)


#: the expert-level pipeline (:class:`hrm.pipelines.base.Pipeline`)
EXPERT_LEVEL: Pipeline = PipelineFunctions(
    "expert-level", "Klotski's expert-level list schedule per layer, searched by branch and bound (solver.expert_level)",
    PIPELINE_FIELDS["expert-level"], expert_level_times, expert_level_memory, expert_level_timeline)
