"""Closed-form upper bounds of a mode's throughput (the exact search's step 1,
:mod:`solver.lanes.exact`): no policy of mode k = (μ, A_g, F_g) beats
per_seq·μ / (a lower bound of T/n) (per_seq: :func:`hrm.cost.throughput.tokens_per_sequence`).

Per lane, T/n = a + s·b + (r·w + c)/n (a, b, w, c: the lane's per_micro_batch_s,
per_micro_batch_kv_cpu_s, per_layer_offloaded_weights_s and per_layer_s,
:class:`hrm.cost.latency.lane.Lane`) with the KV-on-CPU share s = 1 − z/N and the offloaded expert
share r = 1 − m/M; each term is taken at its least over the mode's policies (n ≤ n̄,
m ≤ m_max, z ≤ z_max, any sign of b, w, c), and where z is free the GPU bytes that static
experts and GPU KV share bound m·w + z·b jointly (a two-item knapsack, :class:`_KvRoom`).
Evaluated at the mean context of blocks of decode steps, Σ_t f(t) ≥ Σ_blocks |B|·f(t̄_B)
holds by Jensen's inequality because every lane is convex in the context within a block (each
operator's time is a roofline maximum of terms affine in the context; sums and maxima keep
convexity; tested in ``tests/test_search_exact.py``; blocks are cut where a local attention's
reads bend or fall, :func:`solver.lanes.terms.context_blocks`). The verifier
(:func:`solver.lanes.verify.verify_optimum`) re-derives the bounds with one column per decode
step, which needs no convexity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hrm.cost.throughput import tokens_per_sequence

from .terms import Terms, largest_static_experts, max_micro_batches

# Relative slack when comparing a bound with an incumbent: a bound within rounding of the
# incumbent cannot hold a strictly better policy.
BOUND_RTOL = 1e-9
# Decode steps are cut into this many blocks for the bounds, each evaluated at its mean
# context (Jensen per block): more blocks tighten the bound where the leading lane changes
# with the context, at a proportional cost per bound evaluation.
BOUND_BLOCKS = 4


def throughput_upper_bounds(terms: Terms, max_batch: int, objective: str = "generation",
                            nbar: np.ndarray | None = None, modes: np.ndarray | None = None,
                            micro_batches: np.ndarray | None = None, fixed: dict | None = None) -> np.ndarray:
    """Throughput no policy of each mode can exceed (module docstring); 0 when not
    even one micro-batch fits. With ``micro_batches`` (per mode of ``modes``): the bound for
    the policies with at most that many micro-batches (T/n only grows as n shrinks)."""
    if terms.step_index is not None:
        raise ValueError("bounds need terms with one column per step or per block (Jensen), not piecewise terms")
    nbar = max_micro_batches(terms, max_batch) if nbar is None else nbar
    k = np.arange(len(terms.mu)) if modes is None else np.asarray(modes, dtype=int)
    count = nbar[k] if micro_batches is None else np.minimum(micro_batches, nbar[k])
    n_top = np.maximum(count, 1).astype(float)
    rest = 1.0 - largest_static_experts(terms)[k] / terms.expert_slots
    share = smallest_kv_cpu_share(terms, k, fixed or {})
    room = _KvRoom.of(terms, k, fixed or {}, 1.0 - rest)
    decode = _lane_lower_bound(terms.per_micro_batch_s[k], terms.per_micro_batch_kv_cpu_s[k],
                               terms.per_layer_offloaded_weights_s[k][..., None], terms.per_layer_s[k],
                               share[:, None, None, None], rest[:, None, None, None], n_top[:, None, None, None],
                               room.expand(3))
    decode = (np.max(decode, axis=2) * terms.step_weight).sum(axis=-1) @ terms.kind_layers
    time_s = (decode + terms.steps * terms.head[k]
              + _amortised(np.asarray((terms.step_weight * terms.sync[k]).sum(axis=-1), dtype=float), n_top))
    if objective == "generation":
        pre = _lane_lower_bound(terms.prefill_per_micro_batch_s[k], terms.prefill_per_micro_batch_kv_cpu_s[k],
                                terms.prefill_per_layer_offloaded_weights_s[k], terms.prefill_per_layer_s[k],
                                share[:, None, None], rest[:, None, None], n_top[:, None, None], room.expand(2))
        time_s = time_s + np.max(pre, axis=2) @ terms.kind_layers + terms.head[k]
    # the tokens of one micro-batch over a lower bound of its time (a bound at or below 0
    # seconds bounds nothing)
    tokens = tokens_per_sequence(terms.gen_len, objective) * terms.mu[k]
    with np.errstate(divide="ignore"):
        bound = np.where(time_s > 0, tokens / np.maximum(time_s, 1e-300), np.inf)
    return np.where(count >= 1, bound, 0.0)


def smallest_kv_cpu_share(terms: Terms, k: np.ndarray, fixed: dict) -> np.ndarray:
    """The least share 1 − z/N of the KV on the CPU any policy of modes k has: 1 with
    attention on the CPU (z = 0), 1 − r_c when r_c is pinned, else 1 − z_max/μ (z ≤ z_max,
    N ≥ μ)."""
    attn = terms.attn_on_gpu[k]
    if "kv_gpu_ratio" in fixed:
        return np.where(attn, 1.0 - fixed["kv_gpu_ratio"], 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        free = np.clip(1.0 - most_kv_sequences_on_gpu(terms)[k] / terms.mu[k], 0.0, 1.0)
    return np.where(attn, free, 1.0)


def _gpu_room(terms: Terms) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """(room, per_rw, kv, exact) per mode: the bytes the GPU (or shared) limit leaves for the
    static experts (per_rw per unit of m/M) and the GPU KV (kv per sequence) at N = μ, the
    least N; ``exact`` where no term could shrink with N (else room is not a bound)."""
    lim = terms.limits
    if lim.shared:
        per_seq, per_rw = terms.gpu_per_seq + terms.cpu_per_seq, terms.gpu_per_rw + terms.cpu_per_rw
        room = lim.cpu_bytes - terms.gpu_const - terms.cpu_const
        kv = terms.gpu_kv_seq + terms.cpu_kv_seq
    else:
        per_seq, per_rw, kv = terms.gpu_per_seq, terms.gpu_per_rw, terms.gpu_kv_seq
        room = lim.gpu_bytes - terms.gpu_const
    return room - per_seq * terms.mu, per_rw, float(kv), per_seq >= 0


def most_kv_sequences_on_gpu(terms: Terms) -> np.ndarray:
    """z_max per mode: the most sequences whose KV any policy keeps on the GPU — the room at
    N = μ with the expert bytes at their least (inf where a term could shrink with N or the
    KV costs no bytes)."""
    room, per_rw, kv, exact = _gpu_room(terms)
    if kv <= 0:
        return np.full(len(terms.mu), np.inf)
    return np.where(exact, np.maximum(room - np.minimum(per_rw, 0.0), 0.0) / kv, np.inf)


def _amortised(value: np.ndarray, n_top: np.ndarray) -> np.ndarray:
    """A lower bound of value/n over 1 ≤ n ≤ n_top: value/n_top, or value itself when negative."""
    return np.where(value >= 0, value / n_top, value)


@dataclass(frozen=True)
class _KvRoom:
    """The GPU bytes shared by static experts and GPU KV, per mode, where z is free:
    x = m/M ≤ x_hi and y = z/μ ≤ y_hi with expert_bytes·x + kv_bytes·y ≤ room; NaN room
    where the knapsack does not apply (z pinned or zero, or a term could shrink)."""

    x_hi: np.ndarray
    y_hi: np.ndarray
    expert_bytes: np.ndarray
    kv_bytes: np.ndarray
    room: np.ndarray

    @classmethod
    def of(cls, terms: Terms, k: np.ndarray, fixed: dict, x_hi: np.ndarray) -> _KvRoom:
        room, per_rw, kv, exact = _gpu_room(terms)
        free = terms.attn_on_gpu[k] & ("kv_gpu_ratio" not in fixed) & exact[k] & (per_rw[k] >= 0) & (kv > 0)
        mu = terms.mu[k]
        with np.errstate(divide="ignore", invalid="ignore"):
            y_hi = most_kv_sequences_on_gpu(terms)[k] / mu
        return cls(x_hi=np.where(terms.ffn_on_gpu[k], x_hi, 0.0), y_hi=np.where(free, y_hi, 0.0),
                   expert_bytes=per_rw[k] * np.ones(len(k)), kv_bytes=kv * mu,
                   room=np.where(free, np.maximum(room[k], 0.0), np.nan))

    def expand(self, dims: int) -> _KvRoom:
        """The per-mode arrays shaped to broadcast against [mode, kind, lane(, step)]."""
        shape = (-1,) + (1,) * dims
        return _KvRoom(*(np.reshape(getattr(self, f), shape) for f in ("x_hi", "y_hi", "expert_bytes", "kv_bytes",
                                                                         "room")))

    def most_gain(self, w: np.ndarray, b: np.ndarray) -> np.ndarray:
        """max x·w + y·b over the knapsack (a linear program over two items: its optimum
        fills one item first, up to its cap or the room, then the other)."""
        wv, bv = np.maximum(w, 0.0), np.maximum(b, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            def fill(cap, per, left):  # as much of an item as its cap and the room allow
                return np.minimum(cap, np.where(per > 0, np.maximum(left, 0.0) / np.where(per > 0, per, 1.0), np.inf))
            x1 = fill(self.x_hi, self.expert_bytes, self.room)
            y1 = fill(self.y_hi, self.kv_bytes, self.room - self.expert_bytes * x1)
            y2 = fill(self.y_hi, self.kv_bytes, self.room)
            x2 = fill(self.x_hi, self.expert_bytes, self.room - self.kv_bytes * y2)
        return np.maximum(x1 * wv + y1 * bv, x2 * wv + y2 * bv)


def _lane_lower_bound(a, b, w, c, share, rest, n_top, room: _KvRoom) -> np.ndarray:
    """A lower bound of one lane's time per micro-batch, a + s·b + (r·w + c)/n, over the
    offloaded expert share r ∈ [rest, 1], 1 ≤ n ≤ n_top and the KV-on-CPU share
    s = 1 − z/(μn) ∈ [share, 1]; each term at its least (no sign of b, w or c is assumed).
    Where z is free (``room``), with x = m/M and y = z/μ the lane is also
    a + b + (w + c − x·w − y·b)/n, and (x, y) share the GPU bytes: the most x·w + y·b the
    knapsack admits bounds it for every n at once — the KV the GPU cannot hold stays on the
    CPU however many micro-batches there are, and experts take the room the KV would use."""
    least_v = np.minimum(rest * w, w) + c
    first = a + np.minimum(share * b, b) + _amortised(least_v, n_top)
    usable = np.isfinite(room.room) & (b >= 0)
    joint = a + b + _amortised(w + c - np.where(usable, room.most_gain(w, b), 0.0), n_top)
    return np.where(usable, np.maximum(first, joint), first)


def fewest_useful_micro_batches(terms: Terms, modes: np.ndarray, nbar: np.ndarray, max_batch: int, objective: str,
                                floor: float, fixed: dict) -> np.ndarray:
    """Per mode, the smallest n whose bound for "at most n micro-batches" beats ``floor``
    (the bound grows with n, so fewer micro-batches cannot beat it): bisection on n."""
    lo = np.ones(len(modes), dtype=int)
    hi = np.maximum(nbar[modes], 1).astype(int)
    while np.any(lo < hi):
        act = np.flatnonzero(lo < hi)
        mid = (lo[act] + hi[act]) // 2
        beats = (throughput_upper_bounds(terms, max_batch, objective, nbar, modes[act], mid, fixed)
                 > floor * (1 + BOUND_RTOL))
        hi[act] = np.where(beats, mid, hi[act])
        lo[act] = np.where(beats, lo[act], mid + 1)
    return lo
