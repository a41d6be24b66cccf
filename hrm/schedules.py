"""Schedules as data (one registry): how a layer's resources combine into concurrent lanes,
which placements the schedule runs, and its launch order for the task timeline.

- ``lanes``: ``overlap`` — every resource its own lane (eq. 12: T = max over lanes);
  ``chain`` — per micro-batch pre-attn → D1 → CPU attention → D2 → post-attn back to back,
  only the weight transfer overlaps (FlexGen S3); ``serial`` — one lane, the sum;
- ``order``: the task launch order :mod:`hrm.timeline` uses — ``cgopipe`` (Algorithm 1,
  CPU attention two micro-batches ahead), ``chain`` (S3), ``serial``; GPU attention always
  prefetches the next micro-batch's KV (FlexGen S4 order);
- ``pipeline``: how a layer's time is found — ``lanes`` (the max of affine lane sums, eq.
  12: the exact MILP search of :mod:`solver.exact`) or ``expert-level`` (Klotski: the
  list-scheduled period of an expert-level task graph, :mod:`hrm.klotski`, searched by
  enumeration with lane bounds, :mod:`solver.klotski`). :data:`PIPELINES` names, per
  pipeline, the estimate and the search that serve it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    name: str
    help: str
    lanes: str  # overlap | chain | serial
    order: str  # cgopipe | chain | serial
    attention: tuple[bool, ...] = (False, True)  # attn_on_gpu values it runs
    ffn: tuple[bool, ...] = (True, False)        # ffn_on_gpu values it runs
    pipeline: str = "lanes"                      # lanes | expert-level

    def problem(self, attn_on_gpu: bool, ffn_on_gpu: bool) -> str | None:
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

#: per pipeline: (module:function of the estimate, module:function of the search) — the
#: lanes pipeline's are :func:`hrm.estimate.estimate_lanes` and :func:`solver.search.search_lanes`
PIPELINES: dict[str, tuple[str, str]] = {
    "lanes": ("hrm.estimate:estimate_lanes", "solver.search:search_lanes"),
    "expert-level": ("hrm.klotski:estimate_klotski", "solver.klotski:search_klotski"),
}


def pipeline_function(schedule: str, which: int):
    """The estimate (``which`` 0) or search (1) function of ``schedule``'s pipeline."""
    import importlib

    module, _, name = PIPELINES[get_schedule(schedule).pipeline][which].partition(":")
    return getattr(importlib.import_module(module), name)


def get_schedule(name: str) -> Schedule:
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name}")
    return SCHEDULES[name]
