"""End-to-end time and throughput of a batch (the end of the paper's eqs. 12-14): the one
home of N·tokens / time, used by the estimate, the MILP, the exact search's bounds, the
verifier and the expert-level search alike.

A batch of N sequences is one prefill (it yields each sequence's first token) and then
``gen_len − 1`` decode steps. The objectives count tokens over the time they take:

- ``generation``: N·gen_len tokens over prefill + decode (the paper's metric);
- ``decode``: N·(gen_len − 1) tokens over the decode steps alone;
- ``prefill``: the prefill alone (its time; used for the TTFT limit).
"""

from __future__ import annotations

import numpy as np

OBJECTIVE_KINDS = ("generation", "decode", "prefill")


def decode_steps(gen_len: int) -> int:
    """Decode steps of a request: the first token comes from the prefill."""
    return max(int(gen_len) - 1, 0)


def tokens_per_sequence(gen_len: int, objective: str = "generation") -> int:
    """Tokens one sequence contributes to ``objective``'s throughput."""
    if objective == "generation":
        return int(gen_len)
    if objective == "decode":
        return decode_steps(gen_len)
    raise ValueError(f"no throughput for objective '{objective}'")


def end_to_end_time_s(prefill_s, decode_s, objective: str = "generation"):
    """The time ``objective`` counts (arrays broadcast): prefill + decode, decode, or prefill."""
    if objective == "generation":
        return prefill_s + decode_s
    if objective == "decode":
        return decode_s
    if objective == "prefill":
        return prefill_s
    raise ValueError(f"unknown objective '{objective}' (one of {', '.join(OBJECTIVE_KINDS)})")


def throughput_tok_s(batch_size, gen_len: int, prefill_s, decode_s, objective: str = "generation"):
    """Tokens per second of a batch of ``batch_size`` sequences (arrays broadcast):
    N·tokens_per_sequence / end_to_end_time; 0 where the time is 0 (no decode steps)."""
    time_s = end_to_end_time_s(prefill_s, decode_s, objective)
    tokens = np.asarray(batch_size, dtype=float) * tokens_per_sequence(gen_len, objective)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.where(np.asarray(time_s) > 0, tokens / np.maximum(time_s, 1e-300), 0.0)
    return float(value) if np.ndim(value) == 0 else value
