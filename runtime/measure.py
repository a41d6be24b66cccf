"""What a run measured: prefill and decode wall time, per-layer decode latency, throughput,
lane busy time, peak device-tier bytes — in the units and definitions of :mod:`hrm.estimate`
(decode steps = gen_len − 1; per-layer decode latency excludes the lm_head)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class RoundResult:
    """One batch of ≤ N sequences: prefill, then gen_len − 1 decode steps."""

    sequences: int
    prefill_s: float
    decode_s: float
    decode_steps: int
    prefill_window: tuple[float, float]
    decode_window: tuple[float, float]
    layer_marks: list[float]
    outputs: dict[int, dict]
    prompt_tokens: int


@dataclass
class RunResult:
    sequences: int
    gen_len: int
    num_layers: int
    prefill_s: float
    decode_s: float
    decode_steps: int
    head_busy_s: float
    layer_intervals_s: list[float]
    lane_busy_s: dict[str, float]
    peak_device_bytes: int
    peak_device_persistent_bytes: int
    device_kind: str
    outputs: dict[int, dict] = field(default_factory=dict)
    records: list = field(default_factory=list)
    rounds: int = 1

    # --- derived (the estimate's definitions) ---------------------------------------------
    @property
    def decode_layer_latency_s(self) -> float:
        """Mean per-layer decode time: decode wall time less the lm_head work, over steps × layers."""
        runs = self.decode_steps * self.num_layers
        return max(self.decode_s - self.head_busy_s, 0.0) / runs if runs else 0.0

    @property
    def decode_layer_latency_raw_s(self) -> float:
        runs = self.decode_steps * self.num_layers
        return self.decode_s / runs if runs else 0.0

    @property
    def decode_throughput_tok_s(self) -> float:
        return self.sequences * self.decode_steps / self.decode_s if self.decode_s else 0.0

    @property
    def generation_throughput_tok_s(self) -> float:
        total = self.prefill_s + self.decode_s
        return self.sequences * self.gen_len / total if total else 0.0

    @property
    def median_layer_interval_s(self) -> float:
        return float(np.median(self.layer_intervals_s)) if self.layer_intervals_s else 0.0

    def tokens(self, rid: int) -> list[int]:
        return self.outputs[rid]["tokens"]

    def logits(self, rid: int):
        return self.outputs[rid]["logits"]

    def summary(self) -> dict:
        return {
            "device": self.device_kind, "sequences": self.sequences, "rounds": self.rounds,
            "prefill_s": self.prefill_s, "decode_s": self.decode_s, "decode_steps": self.decode_steps,
            "decode_layer_latency_s": self.decode_layer_latency_s,
            "decode_layer_latency_raw_s": self.decode_layer_latency_raw_s,
            "median_layer_interval_s": self.median_layer_interval_s,
            "decode_throughput_tok_s": self.decode_throughput_tok_s,
            "generation_throughput_tok_s": self.generation_throughput_tok_s,
            "peak_device_bytes": self.peak_device_bytes,
            "lane_busy_s": self.lane_busy_s,
        }

    @classmethod
    def combine(cls, rounds: list[RoundResult], num_layers: int, gen_len: int, tier) -> "RunResult":
        """Sum rounds; busy time per lane and lm_head time are taken from the decode windows."""
        records = list(tier.tracer.records)
        busy: dict[str, float] = {}
        head = 0.0
        intervals: list[float] = []
        outputs: dict[int, dict] = {}
        for r in rounds:
            lo, hi = r.decode_window
            for rec in records:
                if rec.start_s >= lo and rec.end_s <= hi:
                    busy[rec.lane] = busy.get(rec.lane, 0.0) + rec.duration_s
            head += _head_time_s(records, r.decode_window, num_layers)
            marks = [lo] + r.layer_marks
            intervals += [b - a for a, b in zip(marks, marks[1:])]
            outputs.update(r.outputs)
        return cls(
            sequences=sum(r.sequences for r in rounds), gen_len=gen_len, num_layers=num_layers,
            prefill_s=sum(r.prefill_s for r in rounds), decode_s=sum(r.decode_s for r in rounds),
            decode_steps=rounds[0].decode_steps if rounds else 0, head_busy_s=head,
            layer_intervals_s=intervals, lane_busy_s=busy, peak_device_bytes=tier.peak_bytes(),
            peak_device_persistent_bytes=int(tier.memory.peak_persistent_bytes), device_kind=tier.kind,
            outputs=outputs, records=records, rounds=len(rounds),
        )


def _head_time_s(records, window, num_layers: int) -> float:
    """Device time spent in lm_head work during decode: the Head tasks when separate, else
    nothing (the head is folded into the last layer's PostAttn and measured with it)."""
    lo, hi = window
    return sum(r.duration_s for r in records if lo <= r.start_s and r.end_s <= hi and r.name.startswith("Head"))
