"""Schedules as data (one registry): how a layer's resources combine into concurrent lanes,
which placements the schedule runs, and its launch order for the task timeline.

- ``lanes``: ``overlap`` — every resource its own lane (eq. 12: T = max over lanes);
  ``chain`` — per micro-batch pre-attn → D1 → CPU attention → D2 → post-attn back to back,
  only the weight transfer overlaps (FlexGen S3); ``serial`` — one lane, the sum;
- ``order``: the task launch order :mod:`hrm.pipelines.lanes_timeline` uses — ``cgopipe`` (Algorithm 1,
  CPU attention two micro-batches ahead), ``chain`` (S3), ``serial``; GPU attention always
  prefetches the next micro-batch's KV (FlexGen S4 order);
- ``pipeline``: how a layer's time is found — ``lanes`` (the max of affine lane sums, eq.
  12: the exact MILP search of :mod:`solver.lanes.exact`) or ``expert-level`` (Klotski: the
  list-scheduled period of an expert-level task graph, :mod:`hrm.pipelines.expert_level_tasks`, searched by
  enumeration with lane bounds, :mod:`solver.expert_level`). The pipelines themselves are
  :data:`hrm.pipelines.PIPELINES`; :data:`PIPELINE_FIELDS` says which engine fields each models.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import HRMError


@dataclass(frozen=True)
class Schedule:
    name: str
    help: str
    lanes: str  # overlap | chain | serial
    order: str  # cgopipe | chain | serial
    attention: tuple[bool, ...] = (False, True)  # attn_on_gpu values it runs
    ffn: tuple[bool, ...] = (True, False)        # ffn_on_gpu values it runs
    pipeline: str = "lanes"                      # lanes | expert-level

    def refusal(self, attn_on_gpu: bool, ffn_on_gpu: bool) -> str | None:
        """Why a placement is not allowed (None if it is)."""
        if attn_on_gpu not in self.attention:
            return f"schedule {self.name} runs attention on the {'GPU (attn=gpu)' if self.attention[0] else 'CPU (attn=cpu)'}"
        if ffn_on_gpu not in self.ffn:
            return f"schedule {self.name} runs the FFN on the GPU (ffn=gpu)"
        return None


SCHEDULES: dict[str, Schedule] = {s.name: s for s in (
    Schedule("cgopipe", "MoE-Lightning CGOPipe: GPU, CPU, H2D and D2H overlap, weights paged (eq. 12)",
             "overlap", "cgopipe"),
    Schedule("flexgen", "FlexGen S4: attention on GPU, KV cache prefetched over the link with the weights",
             "overlap", "cgopipe", attention=(True,), ffn=(True,)),
    Schedule("flexgen-cpu-attn", "FlexGen S3: CPU attention not overlapped with GPU work; weights overlap",
             "chain", "chain", attention=(False,), ffn=(True,)),
    Schedule("sequential", "no overlap: every task of every resource back to back", "serial", "serial"),
    Schedule("klotski", "Klotski: n batches share each expert load; gate and hot experts prefetched during "
             "attention, cold ones after the gate, hot first (expert-level list schedule)", "expert-level",
             "expert-level", attention=(True,), ffn=(True,), pipeline="expert-level"),
)}

@dataclass(frozen=True)
class PipelineFields:
    """The engine fields a pipeline models: dotted field -> the values it models (None: any).
    An engine whose field differs from ideal's (the field's default) and is not modelled by
    its schedule's pipeline is refused (:func:`hrm.engines.engine.Engine`'s validator) rather than
    silently ignored. ``None`` for the whole map: every field."""

    pipeline: str
    models: dict[str, tuple | None] | None

    def refusal(self, field: str, value) -> str | None:
        """Why ``field`` = ``value`` (not ideal's) cannot run on this pipeline (None if it can)."""
        if self.models is None:
            return None
        if field not in self.models:
            return f"{field}: the {self.pipeline} pipeline does not model it (leave it at ideal's value)"
        allowed = self.models[field]
        if allowed is not None and value not in allowed:
            return (f"{field}: the {self.pipeline} pipeline models {', '.join(map(str, allowed))}, "
                    f"not {value}")
        return None


#: What each pipeline models. The expert-level pipeline (Klotski, :mod:`hrm.pipelines.expert_level_tasks`) runs
#: attention and every expert on the GPU over the same weight and KV paths as the lanes
#: (:func:`hrm.cost.latency.transfers.weight_transfer_s`, :func:`hrm.cost.latency.transfers.kv_load_s`), charges the
#: staging-copy team and host DRAM as capacity bounds, drains its pipeline once per step under
#: ``sync: per-step`` (its per-batch host reads are dispatch α), keeps whole layers of experts
#: (``static_experts``), sizes its expert load buffer in whole layers, and keeps whole layers
#: of experts beyond host memory on disk (``memory.disk_weights``, read once per pass).
PIPELINE_FIELDS: dict[str, PipelineFields] = {
    "lanes": PipelineFields("lanes", None),
    "expert-level": PipelineFields("expert-level", {
        "decode.weight_path": None, "prefill.weight_path": None, "decode.kv_cache": None, "prefill.kv_cache": None,
        "host_dram": None, "achieved_gpu_rates": None, "moe_kernel": None, "quant_kernel": None, "sync": ("none", "per-step"),
        "static_experts": ("continuous", "whole-layers"), "copy_threads": None, "numa_aware": None,
        "tensor_parallel.host_shared": None, "memory.gpu_weight_buffer_layers": (1.0, 2.0, 3.0, 4.0),
        "memory.pinned_staging_layers": None, "memory.cpu_holds_all_experts": None, "launches": None,
        "memory.disk_weights": None}),
}


def get_schedule(name: str) -> Schedule:
    """The schedule ``name``; a one-line HRMError for an unknown one."""
    if name not in SCHEDULES:
        raise HRMError(f"unknown schedule '{name}' (one of {', '.join(SCHEDULES)})")
    return SCHEDULES[name]
