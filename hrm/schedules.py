"""Schedules as data (one registry): how a layer's resources combine into concurrent lanes,
which placements the schedule runs, and its launch order for the task timeline.

- ``lanes``: ``overlap`` — every resource its own lane (eq. 12: T = max over lanes);
  ``chain`` — per micro-batch pre-attn → D1 → CPU attention → D2 → post-attn back to back,
  only the weight transfer overlaps (FlexGen S3); ``serial`` — one lane, the sum;
- ``order``: the task launch order :mod:`hrm.timeline` uses — ``cgopipe`` (Algorithm 1,
  CPU attention two micro-batches ahead), ``chain`` (S3), ``serial``; GPU attention always
  prefetches the next micro-batch's KV (FlexGen S4 order).
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
)}


def get_schedule(name: str) -> Schedule:
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name}")
    return SCHEDULES[name]
