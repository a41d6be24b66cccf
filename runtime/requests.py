"""Requests and how they become micro-batches.

- Padded (FlexGen): consecutive groups of μ requests, every prompt left-padded to the
  workload's ``max_prompt_len``.
- Variable length (MoE-Lightning appendix A.2, **Algorithm 2** "Request Batching"): requests
  sorted by prompt length (longest first), each placed into the partition with the fewest
  tokens; a partition that reaches ``ubs`` requests becomes a micro-batch; a request that
  would overflow the partition's KV budget ``cache_size`` is aborted to the next batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hrm.errors import HRMError
from hrm.workload import Workload


@dataclass(frozen=True)
class Request:
    rid: int
    prompt: tuple[int, ...]

    @property
    def input_len(self) -> int:
        return len(self.prompt)


def prompt_lengths(workload: Workload, count: int, seed: int = 0) -> list[int]:
    """``count`` deterministic prompt lengths in [1, max_prompt_len] whose mean is close to
    ``prompt_len`` (one request at the maximum when count > 1): lo + (max−lo)·u^p with p set
    so that the mean matches."""
    avg, top = workload.prompt_len, workload.max_prompt_len
    if top == avg or count == 1:
        return [avg] * count
    lo = max(1, min(avg, 2 * avg - top))
    p = max((top - lo) / max(avg - lo, 1e-9) - 1.0, 0.0)
    u = (np.arange(count) + 0.5) / count
    u[-1] = 1.0
    lengths = np.clip(np.rint(lo + (top - lo) * u ** p), 1, top).astype(int)
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.permutation(lengths)]


def synthetic_requests(workload: Workload, count: int, vocab_size: int, seed: int = 0) -> list[Request]:
    """Deterministic requests with random token ids (id 0 is left for padding)."""
    rng = np.random.default_rng(seed + 1)
    return [Request(i, tuple(int(t) for t in rng.integers(1, vocab_size, size=length)))
            for i, length in enumerate(prompt_lengths(workload, count, seed))]


def request_batching(requests: list[Request], n_ub: int, ubs: int, gen_len: int, cache_size: int):
    """Algorithm 2 (MoE-Lightning, appendix A.2). Returns (micro_batches, aborted_requests).

    Partitions still open when the queue is exhausted become micro-batches too (the
    algorithm's listing only shows the full ones)."""
    partitions: list[list[Request]] = [[] for _ in range(n_ub)]
    sums = [0] * n_ub
    micro_batches: list[list[Request]] = []
    aborted: list[Request] = []
    for req in sorted(requests, key=lambda r: r.input_len, reverse=True):
        if not partitions:
            aborted.append(req)
            continue
        idx = int(np.argmin(sums))
        if sums[idx] + req.input_len + (1 + len(partitions[idx])) * gen_len > cache_size:
            aborted.append(req)
            continue
        partitions[idx].append(req)
        sums[idx] += req.input_len
        if len(partitions[idx]) == ubs:
            micro_batches.append(partitions.pop(idx))
            sums.pop(idx)
    micro_batches.extend(p for p in partitions if p)
    return micro_batches, aborted


def padded_batching(requests: list[Request], n_ub: int, ubs: int):
    """FlexGen: the first n·μ requests in order, μ per micro-batch; the rest wait."""
    take = requests[: n_ub * ubs]
    return [take[i: i + ubs] for i in range(0, len(take), ubs)], requests[n_ub * ubs:]


def plan_rounds(requests: list[Request], workload: Workload, n_ub: int, ubs: int) -> list[list[list[Request]]]:
    """All batches (rounds of ≤ n·μ requests) in execution order, each a list of micro-batches."""
    if workload.padding:
        too_long = [r.rid for r in requests if r.input_len > workload.max_prompt_len]
        if too_long:
            raise HRMError(f"request {too_long[0]} is longer than max_prompt_len={workload.max_prompt_len} (padding on)")
    cache_size = ubs * workload.max_prompt_len + ubs * workload.gen_len
    rounds, queue = [], list(requests)
    while queue:
        if workload.padding:
            mbs, queue = padded_batching(queue, n_ub, ubs)
        else:
            mbs, queue = request_batching(queue, n_ub, ubs, workload.gen_len, cache_size)
            if not mbs:
                raise HRMError(f"request {queue[0].rid} ({queue[0].input_len} tokens) does not fit a micro-batch's KV budget")
        rounds.append(mbs)
    return rounds
