"""Expert activation traces of a run (issue 13, part 1: skew measured, not assumed).

A :class:`RoutingRecorder` handed to :meth:`runtime.executor.PlanExecutor.run` keeps a
reference to the expert ids of every router call; nothing is copied or synchronised while
the run is timed, and without a recorder the executor does no routing bookkeeping at all.
After the run :meth:`RoutingRecorder.trace` counts them into the JSON that
:func:`hrm.model.routing.load_trace` reads (``hrm run --routing-trace FILE``)::

    {"format": "hrm-routing-trace/1", "model", "num_experts", "top_k", "router_skew",
     "layers":        one per MoE layer, every routed token: {"layer", "tokens", "expert_counts"}
                      (Σ expert_counts = top_k · tokens),
     "micro_batches": one per router call, in execution order: {"layer", "phase", "round",
                      "step", "micro_batch", "tokens", "distinct", "experts" (sorted ids),
                      "expert_counts"} ("pad_tokens" on a padded prefill),
     "sequences":     MoE-Infinity's expert activation matrix per request: {"sequence" (the
                      request id), "expert_counts": [[layer 0's counts], [layer 1's], ...]}}

Tokens are the real tokens of a router call: in a padded prefill (FlexGen left padding) the
pad slots are routed too but are left out of every count — each is a copy of the same pad
token at position 0, so they would pile onto one expert set and say nothing about the
workload; the call's ``pad_tokens`` says how many there were. Dense layers and one-expert
models have no router and no entry. ``micro_batches[].expert_counts`` makes a trace grow by
num_experts integers per router call (a test instrument, not a production log).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from hrm.plan import write_atomic
from hrm.model.routing import TRACE_FORMAT

from .batch import MicroBatch


@dataclass
class RouterCall:
    """One router call: where it ran and the ids it chose (a reference, read after the run)."""

    layer: int
    phase: str  # "prefill" | "decode"
    round: int
    step: int  # 0 for the prefill, 1..gen_len − 1 for decode steps
    mb: MicroBatch
    ids: torch.Tensor  # [rows, top_k] on the device tier


def real_rows(mb: MicroBatch, phase: str) -> tuple[list[int], list[int]]:
    """(row indices of real tokens, request id of each) in a router call's input: decode has
    one row per sequence; a prefill packs each sequence's slots, left pads first."""
    rids = [req.rid for req in mb.requests]
    if phase == "decode":
        return list(range(mb.size)), rids
    rows, owners = [], []
    for rid, off, pad, slots in zip(rids, mb.offsets, mb.pads.tolist(), mb.slots.tolist()):
        rows.extend(range(off + pad, off + slots))
        owners.extend([rid] * (slots - pad))
    return rows, owners


class RoutingRecorder:
    """Collects the router calls of one run; :meth:`trace` turns them into the JSON trace."""

    def __init__(self, num_experts: int, top_k: int):
        self.num_experts, self.top_k = num_experts, top_k
        self.calls: list[RouterCall] = []

    def record(self, layer: int, phase: str, round_index: int, step: int, mb: MicroBatch, ids: torch.Tensor) -> None:
        """Called by the executor on every router call (no copy, no device sync)."""
        self.calls.append(RouterCall(layer, phase, round_index, step, mb, ids))

    def trace(self, model: str, router_skew: float) -> dict:
        """The trace JSON object (module docstring) of the recorded calls."""
        ne, k = self.num_experts, self.top_k
        moe_layers = sorted({call.layer for call in self.calls})
        position = {layer: p for p, layer in enumerate(moe_layers)}
        layer_counts = torch.zeros(len(moe_layers), ne, dtype=torch.long)
        layer_tokens = [0] * len(moe_layers)
        per_sequence: dict[int, torch.Tensor] = {}
        micro_batches = []
        for call in self.calls:
            rows, owners = real_rows(call.mb, call.phase)
            ids = call.ids.cpu()[rows]  # [tokens, k]
            counts = torch.bincount(ids.reshape(-1), minlength=ne)
            p = position[call.layer]
            layer_counts[p] += counts
            layer_tokens[p] += len(rows)
            for rid, token_ids in zip(owners, ids):
                matrix = per_sequence.setdefault(rid, torch.zeros(len(moe_layers), ne, dtype=torch.long))
                matrix[p, token_ids] += 1  # a token's top-k ids are distinct
            micro_batches.append(self._call_entry(call, counts, len(rows), call.ids.shape[0] - len(rows)))
        return {
            "format": TRACE_FORMAT, "model": model, "num_experts": ne, "top_k": k, "router_skew": float(router_skew),
            "layers": [{"layer": layer, "tokens": layer_tokens[p], "expert_counts": layer_counts[p].tolist()}
                       for p, layer in enumerate(moe_layers)],
            "micro_batches": micro_batches,
            "sequences": [{"sequence": rid, "expert_counts": per_sequence[rid].tolist()}
                          for rid in sorted(per_sequence)],
        }

    @staticmethod
    def _call_entry(call: RouterCall, counts: torch.Tensor, tokens: int, pad_tokens: int) -> dict:
        experts = torch.nonzero(counts).reshape(-1).tolist()
        entry = {"layer": call.layer, "phase": call.phase, "round": call.round, "step": call.step,
                 "micro_batch": call.mb.index, "tokens": tokens, "distinct": len(experts), "experts": experts,
                 "expert_counts": counts.tolist()}
        if pad_tokens:
            entry["pad_tokens"] = pad_tokens
        return entry


def write_routing_trace(path: str | Path, trace: dict) -> None:
    """Write a trace atomically (a reader never sees half a file)."""
    write_atomic(path, json.dumps(trace) + "\n")
