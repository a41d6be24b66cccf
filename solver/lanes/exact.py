"""Exact search over every integer micro-batch size μ (branch and bound over the modes).

A mode k = (μ, A_g, F_g) fixes the part of a policy the model is non-linear in; within a
mode the time is a sum of maxima of affine functions of (n, m, z) (:mod:`solver.lanes.terms`).
The search is exact over μ = 1 … μ_max (every integer whose smallest batch fits), every n,
every whole-expert m and continuous z:

1. **Bounds** (:mod:`solver.lanes.bounds`): no policy of mode k beats a closed-form bound of
   its throughput, each term of each lane at its least over the mode's policies.
2. **Exact solve of a mode** (:func:`best_in_modes`): every n; for each n the best z given m
   is the largest the memory admits (time is non-increasing in z, CPU memory shrinks with
   it), and φ(m) = T(n, m, z*(m)) is convex in m — T is jointly convex and non-increasing in
   z, z*(m) is concave — so a bisection on φ(m + g) − φ(m) over the feasible m interval
   finds the minimum (O(log M) evaluations instead of M/g + 1). The step sums are exact
   from piecewise terms (:func:`solver.lanes.terms.affine_pieces`: columns only where a
   coefficient changes slope).
3. **Branch and bound** (:func:`solve_placement`): per placement, modes in decreasing bound
   order are solved exactly, in batches, until the next bound is at or below the incumbent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

import numpy as np

from hrm.problem import Problem
from hrm.cost.throughput import end_to_end_time_s, throughput_tok_s

from .bounds import BOUND_BLOCKS, BOUND_RTOL, fewest_useful_micro_batches, throughput_upper_bounds
from .terms import (LATENCY_RTOL, Choice, LatencyLimits, Mode, Terms, build_terms, max_micro_batches,
                    meets_latency_limits, memory_terms, phase_times_s, snapped_expert_count, tier_bytes)

# Modes solved exactly per batch of coefficients (the first batch; later ones double up to
# the cap): small enough not to build terms for modes the bound will prune.
FIRST_BATCH, MAX_BATCH_OF_MODES = 4, 1024
# Elements per vectorised evaluation chunk (candidates × steps × lanes).
CHUNK_ELEMENTS = 4_000_000


@dataclass(frozen=True)
class ModeBest:
    throughput: float
    choice: Choice
    candidates: int


def candidate_micro_batch_sizes(problem: Problem, placements, max_batch: int, fixed: dict) -> list[Mode]:
    """Every (μ, A_g, F_g) whose smallest batch (n = 1, or the pinned n / N) fits the memory
    limits loosely (:func:`solver.lanes.terms.max_micro_batches`): μ = 1 … max_batch, or the pinned μ."""
    modes = []
    for attn, ffn in placements:
        if "micro_batch_size" in fixed:
            mu = np.array([float(fixed["micro_batch_size"])])
        else:
            top = max_batch
            if "num_micro_batches" in fixed:
                top = max_batch // max(1, int(fixed["num_micro_batches"]))
            mu = np.arange(1, top + 1, dtype=float)
        if "batch_size" in fixed:
            mu = mu[fixed["batch_size"] % mu == 0]
        mem = memory_terms(problem, mu, attn, ffn)
        nbar = max_micro_batches(mem, max_batch)
        need = np.ones_like(nbar)
        if "num_micro_batches" in fixed:
            need = need * int(fixed["num_micro_batches"])
        if "batch_size" in fixed:
            need = (fixed["batch_size"] // mu).astype(int)
        modes += [Mode(int(m), attn, ffn) for m in mu[nbar >= need]]
    return modes


def kv_on_gpu(terms: Terms, k: int, batch_size, gpu, cpu, fixed: dict) -> np.ndarray:
    """z for candidates of mode k with tier bytes (gpu, cpu) before GPU KV: the pinned r_c·N,
    or the largest z the GPU (shared) limit admits, at most N (time is non-increasing in z
    and CPU bytes shrink with it); 0 with attention on the CPU."""
    lim = terms.limits
    batch_size = np.asarray(batch_size, dtype=float) * np.ones_like(gpu)
    attn = terms.attn_on_gpu[k]
    if "kv_gpu_ratio" in fixed:
        return np.where(attn, fixed["kv_gpu_ratio"] * batch_size, 0.0)
    if lim.shared:
        per = terms.gpu_kv_seq + terms.cpu_kv_seq
        slack = np.full(np.shape(gpu), np.inf) if per <= 0 else (lim.cpu_bytes - gpu - cpu) / per
    else:
        slack = (lim.gpu_bytes - gpu) / terms.gpu_kv_seq
    z = np.where(attn, np.clip(slack, 0.0, batch_size), 0.0)
    return z if terms.kv_shares is None else realisable_kv(terms, k, batch_size, z)


def realisable_kv(terms: Terms, k, batch_size, z) -> np.ndarray:
    """The largest z' ≤ z the engine's KV split realises (``terms.kv_shares``): n·μ·s with s the
    largest realisable share of a micro-batch at most z/N (time is non-increasing in z, so the
    largest that fits is the best)."""
    k = np.broadcast_to(np.asarray(k), np.shape(z))
    batch_size = np.broadcast_to(np.asarray(batch_size, dtype=float), np.shape(z))
    out = np.zeros(np.shape(z))
    for mode in np.unique(k):
        sel = k == mode
        shares = terms.kv_shares[int(mode)]
        with np.errstate(divide="ignore", invalid="ignore"):
            wanted = np.where(batch_size[sel] > 0, np.asarray(z)[sel] / batch_size[sel], 0.0)
        idx = np.searchsorted(shares, wanted * (1 + 1e-12) + 1e-15, side="right") - 1
        out[sel] = shares[np.maximum(idx, 0)] * batch_size[sel]
    return out


def fits(terms: Terms, gpu, cpu, z) -> np.ndarray:
    """Whether candidates with tier bytes (gpu, cpu) before GPU KV and z GPU-KV sequences fit."""
    lim = terms.limits
    gpu_total = gpu + terms.gpu_kv_seq * z
    cpu_total = cpu + terms.cpu_kv_seq * z
    if lim.shared:
        return (gpu_total + cpu_total <= lim.cpu_bytes * (1 + 1e-12)) & (z >= 0)
    return (gpu_total <= lim.gpu_bytes * (1 + 1e-12)) & (cpu_total <= lim.cpu_bytes * (1 + 1e-12)) & (z >= 0)


def micro_batch_counts(terms: Terms, k: int, nbar: int, max_batch: int, fixed: dict) -> np.ndarray:
    """Every n of mode k the batch cap and the pins allow."""
    mu = terms.mu[k]
    ns = np.arange(1, nbar + 1, dtype=float)
    ns = ns[mu * ns <= max_batch]
    if "num_micro_batches" in fixed:
        ns = ns[ns == fixed["num_micro_batches"]]
    if "batch_size" in fixed:
        ns = ns[mu * ns == fixed["batch_size"]]
    return ns


def best_in_mode(terms: Terms, k: int, nbar: int, max_batch: int, objective: str, fixed: dict,
                 grid: bool = False) -> ModeBest | None:
    """The best (n, m, z) of mode k: by :func:`best_in_modes`, or (``grid``) over every
    feasible (n, m) pair — the verifier's enumeration."""
    if not grid:
        return best_in_modes(terms, np.array([k]), np.array([nbar]), max_batch, objective, fixed)[0]
    ns = micro_batch_counts(terms, k, nbar, max_batch, fixed)
    return _enumerate(terms, k, ns, static_expert_choices(terms, k, fixed), objective, fixed) if len(ns) else None


def static_expert_choices(terms: Terms, k: int, fixed: dict) -> np.ndarray:
    """Every m mode k may keep on the GPU: 0 with experts on the CPU, the pinned r_w, or every
    multiple of the engine's granularity g up to M."""
    if not terms.modes[k].ffn_on_gpu:
        return np.array([0.0])
    if "weights_gpu_ratio" in fixed:
        if terms.weights_levels:  # a placement level of the engine's rule: its own m (as best_in_modes)
            return np.array([fixed["weights_gpu_ratio"] * terms.expert_slots])
        return np.array([float(snapped_expert_count(terms, fixed["weights_gpu_ratio"]))])
    return np.arange(0, terms.expert_slots // terms.expert_step + 1, dtype=float) * terms.expert_step


def _candidates(terms: Terms, k, n, m, fixed: dict):
    batch_size = terms.mu[k] * np.asarray(n, dtype=float)
    gpu, cpu = tier_bytes(terms, k, batch_size, m)
    z = kv_on_gpu(terms, k, batch_size, gpu, cpu, fixed)
    return z, fits(terms, gpu, cpu, z)


def _enumerate(terms: Terms, k: int, ns, ms, objective: str, fixed: dict) -> ModeBest | None:
    best, count = None, 0
    rows = max(1, CHUNK_ELEMENTS // max(1, len(ms)))
    for lo in range(0, len(ns), rows):
        grid_n, grid_m = (x.ravel() for x in np.meshgrid(ns[lo:lo + rows], ms, indexing="ij"))
        z, ok = _candidates(terms, k, grid_n, grid_m, fixed)
        if terms.latency_limits:
            ok &= meets_latency_limits(terms, k, grid_n, grid_m, z)
        grid_n, grid_m, z = grid_n[ok], grid_m[ok], z[ok]
        if not len(grid_n):
            continue
        count += len(grid_n)
        value = throughputs(terms, k, grid_n, grid_m, z, objective)
        i = int(np.argmax(value))
        if best is None or value[i] > best[0]:
            m_i = float(grid_m[i]) if terms.weights_levels and "weights_gpu_ratio" in fixed else int(grid_m[i])
            best = (float(value[i]), Choice(k, int(grid_n[i]), m_i, float(z[i])))
    return None if best is None else ModeBest(best[0], best[1], count)


def feasible_expert_interval(terms: Terms, k, batch_size, fixed: dict) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi] of the m (reals) that fit, per candidate (mode k, N = batch_size). Every constraint
    is linear in m: with z fixed (0, or r_c·N) both tiers are; with z = z*(m) = min(N, GPU
    slack / kv) and kv_cpu ≤ 0 the CPU bytes are cpu(m) + max(kv_cpu·N, kv_cpu·slack(m)/kv),
    i.e. two linear constraints, and z* ≥ 0 is the GPU one."""
    lim = terms.limits
    M = terms.expert_slots
    rel = 1 + 1e-12  # the slack fits() allows
    lo, hi = np.full(np.shape(batch_size), -np.inf), np.full(np.shape(batch_size), np.inf)

    def at_most(slope, room):  # slope·m ≤ room
        nonlocal lo, hi
        slope = np.broadcast_to(slope, np.shape(batch_size))
        room = np.broadcast_to(room, np.shape(batch_size))
        with np.errstate(divide="ignore", invalid="ignore"):
            bound = room / np.where(slope != 0, slope, 1.0)
        hi = np.where(slope > 0, np.minimum(hi, bound), hi)
        lo = np.where(slope < 0, np.maximum(lo, bound), lo)
        hi = np.where((slope == 0) & (room < 0), -np.inf, hi)

    gpu0, cpu0 = tier_bytes(terms, k, batch_size, 0.0)  # bytes at m = 0
    g_rw, c_rw = terms.gpu_per_rw[k] / M, terms.cpu_per_rw[k] / M
    attn = terms.attn_on_gpu[k]
    free_z = attn & ("kv_gpu_ratio" not in fixed)
    z_fixed = fixed.get("kv_gpu_ratio", 0.0) * batch_size * attn
    if lim.shared:
        per = terms.gpu_kv_seq + terms.cpu_kv_seq
        z_use = np.where(free_z, 0.0 if per > 0 else batch_size, z_fixed)  # z* ≥ 0 iff the rest fits
        at_most(g_rw + c_rw, lim.cpu_bytes * rel - gpu0 - cpu0 - per * z_use)
        return lo, hi
    # fixed z: linear in both tiers
    zf = np.where(free_z, 0.0, z_fixed)
    at_most(np.where(free_z, 0.0, g_rw), np.where(free_z, np.inf, lim.gpu_bytes * rel - gpu0 - terms.gpu_kv_seq * zf))
    at_most(np.where(free_z, 0.0, c_rw), np.where(free_z, np.inf, lim.cpu_bytes * rel - cpu0 - terms.cpu_kv_seq * zf))
    # free z: gpu(m) ≤ G (z* ≥ 0); cpu(m) + kv_cpu·N ≤ C; cpu(m) + kv_cpu·(G − gpu(m))/kv_gpu ≤ C
    kv_g, kv_c = terms.gpu_kv_seq, terms.cpu_kv_seq
    at_most(np.where(free_z, g_rw, 0.0), np.where(free_z, lim.gpu_bytes * rel - gpu0, np.inf))
    at_most(np.where(free_z, c_rw, 0.0), np.where(free_z, lim.cpu_bytes * rel - cpu0 - kv_c * batch_size, np.inf))
    at_most(np.where(free_z, c_rw - kv_c * g_rw / kv_g, 0.0),
            np.where(free_z, lim.cpu_bytes * rel - cpu0 - kv_c * (lim.gpu_bytes - gpu0) / kv_g, np.inf))
    return lo, hi


def most_kv_on_gpu(terms: Terms, kk, nn, m_least, fixed: dict) -> np.ndarray:
    """An upper bound of z over the m ≥ ``m_least`` of candidates (kk, nn): z*(m_least) where
    expert bytes take room from the KV (z*(m) is then non-increasing in m), else N."""
    z_least_m, _ = _candidates(terms, kk, nn, m_least, fixed)
    per_rw = terms.gpu_per_rw + terms.cpu_per_rw if terms.limits.shared else terms.gpu_per_rw
    return np.where(per_rw[kk] >= 0, z_least_m, terms.mu[kk] * nn * terms.attn_on_gpu[kk])


def micro_batch_pairs(terms: Terms, ks, nbar, max_batch: int, fixed: dict,
                      n_min: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(mode, n) for every n ≥ ``n_min`` of every mode in ``ks`` the batch cap and the pins
    allow (the vectorised :func:`micro_batch_counts`)."""
    ks = np.asarray(ks, dtype=int)
    mu = terms.mu[ks]
    count = np.minimum(np.asarray(nbar, dtype=int), np.floor(max_batch / mu).astype(int))
    if "num_micro_batches" in fixed or "batch_size" in fixed:
        n = (np.full(len(ks), float(fixed["num_micro_batches"])) if "num_micro_batches" in fixed
             else fixed["batch_size"] / mu)
        keep = (n >= 1) & (n <= count) & (n == np.floor(n))
        if "batch_size" in fixed and "num_micro_batches" in fixed:
            keep &= mu * fixed["num_micro_batches"] == fixed["batch_size"]
        return ks[keep], n[keep]
    first = np.ones(len(ks), dtype=int) if n_min is None else np.maximum(np.asarray(n_min, dtype=int), 1)
    count = np.maximum(count - first + 1, 0)
    kk = np.repeat(ks, count)
    starts = np.cumsum(count) - count
    nn = np.arange(len(kk)) - np.repeat(starts, count) + np.repeat(first, count).astype(float)
    return kk, nn


def best_in_modes(terms: Terms, ks, nbar, max_batch: int, objective: str, fixed: dict,
                  floor: float = 0.0, n_min: np.ndarray | None = None) -> list[ModeBest | None]:
    """The best (n, m, z) of each mode in ``ks``, all candidates at once (module docstring,
    step 2): every n; m = the largest feasible when the time is non-increasing in m and z
    does not depend on it, else bisection on the convex φ(m); z = z*(m). Pairs (mode, n)
    that cannot beat ``floor`` even with the most experts that fit and all KV on the GPU
    (time is non-increasing in both) are dropped first; a mode left with none returns None."""
    out: list[ModeBest | None] = [None] * len(ks)
    pairs = _expert_ranges(terms, ks, nbar, max_batch, fixed, n_min)
    if pairs is None:
        return out
    evaluations = len(pairs.kk)
    if floor > 0 and len(pairs.kk):
        pairs = pairs.take(_may_beat(terms, pairs, objective, fixed, floor))
    if not len(pairs.kk):
        return out
    # time non-increasing in m, z independent of it: the largest m; else bisection on convex φ
    monotone = pairs.non_increasing & ~(pairs.attn & ("kv_gpu_ratio" not in fixed))
    start = np.where(monotone, pairs.hi, pairs.lo)
    m_int, count = convex_argmin(_time_at(terms, pairs, fixed, objective), start, pairs.hi)
    lo_ok, hi_ok, met, limited = _within_latency_limits(terms, pairs, fixed, start)
    evaluations += count + limited
    met &= lo_ok <= hi_ok
    if not np.any(met):
        return out
    m = np.clip(m_int[met], lo_ok[met], hi_ok[met]) * float(terms.expert_step)
    return _best_per_mode(terms, ks, pairs.kk[met], pairs.nn[met], m, objective, fixed, evaluations)


@dataclass(frozen=True)
class _Pairs:
    """The (mode, n) candidates of :func:`best_in_modes`: mode ``kk``, micro-batch count ``nn``,
    the range [lo, hi] of their static experts in steps of g, whether attention is on the GPU,
    and whether their time is non-increasing in m (no term gains from offloading)."""

    kk: np.ndarray
    nn: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    attn: np.ndarray
    non_increasing: np.ndarray

    def take(self, keep: np.ndarray) -> _Pairs:
        """The candidates where ``keep`` holds."""
        return _Pairs(*(getattr(self, f.name)[keep] for f in fields(self)))


def _expert_ranges(terms: Terms, ks, nbar, max_batch: int, fixed: dict, n_min: np.ndarray | None) -> _Pairs | None:
    """Every (mode, n) of ``ks`` the cap and pins allow with the whole steps of m that fit
    (the pinned r_w's own, snapped), those with none dropped; None when no pair is allowed."""
    M, g = terms.expert_slots, terms.expert_step
    kk, nn = micro_batch_pairs(terms, ks, nbar, max_batch, fixed, n_min)
    if not len(kk):
        return None
    ffn, attn = terms.ffn_on_gpu[kk], terms.attn_on_gpu[kk]
    lo, hi = feasible_expert_interval(terms, kk, terms.mu[kk] * nn, fixed)
    top = float(M // g)
    if "weights_gpu_ratio" in fixed:
        pinned = float(snapped_expert_count(terms, fixed["weights_gpu_ratio"]))
        lo_i = np.where(ffn, pinned / g, 0.0)
        hi_i = lo_i.copy()
        ok = (pinned >= lo * (1 - 1e-12) - 1e-9) & (pinned <= hi + 1e-9) | ~ffn
    else:
        lo_i = np.where(ffn, np.maximum(0.0, np.ceil(lo / g - 1e-9)), 0.0)
        hi_i = np.where(ffn, np.minimum(top, np.floor(hi / g + 1e-9)), 0.0)
        ok = lo_i <= hi_i
        ok &= ffn | ((lo <= 1e-9) & (hi >= -1e-9))
    kk = kk[ok]
    non_increasing = (np.all(terms.per_layer_offloaded_weights_s >= 0, axis=(1, 2))
                      & np.all(terms.prefill_per_layer_offloaded_weights_s >= 0, axis=(1, 2))
                      & np.all(terms.per_micro_batch_kv_cpu_s >= 0, axis=(1, 2, 3))
                      & np.all(terms.prefill_per_micro_batch_kv_cpu_s >= 0, axis=(1, 2)))[kk]
    return _Pairs(kk, nn[ok], lo_i[ok].astype(int), hi_i[ok].astype(int), attn[ok], non_increasing)


def _may_beat(terms: Terms, pairs: _Pairs, objective: str, fixed: dict, floor: float) -> np.ndarray:
    """Which pairs may beat ``floor``: those whose time could grow with m, and those whose
    throughput with the most experts that fit and the most KV on the GPU beats it."""
    g = float(terms.expert_step)
    z_most = most_kv_on_gpu(terms, pairs.kk, pairs.nn, pairs.lo * g, fixed)
    optimistic = throughputs(terms, pairs.kk, pairs.nn, pairs.hi * g, z_most, objective)
    return ~pairs.non_increasing | (optimistic > floor * (1 + BOUND_RTOL))


def _time_at(terms: Terms, pairs: _Pairs, fixed: dict, kind: str):
    """``at(sel, m_steps)``: the ``kind`` time of the pairs ``sel`` at m = m_steps·g, z = z*(m)."""
    g = float(terms.expert_step)

    def at(sel, m_int):
        m_bytes = m_int * g
        z_sel, _ = _candidates(terms, pairs.kk[sel], pairs.nn[sel], m_bytes, fixed)
        return chunked_time_s(terms, pairs.kk[sel], pairs.nn[sel], m_bytes, z_sel, kind)
    return at


def _within_latency_limits(terms: Terms, pairs: _Pairs, fixed: dict, start: np.ndarray):
    """(lo, hi, met, evaluations): the steps of m whose times meet every latency limit. Each
    limited time ψ is convex in m too, so {ψ ≤ L} is an interval and the best m is φ's
    minimiser clipped to the intersection of the intervals; ``met`` where ψ's own minimum
    (bisection from ``start``) meets its limit."""
    lo_ok, hi_ok, met = pairs.lo.copy(), pairs.hi.copy(), np.ones(len(pairs.kk), dtype=bool)
    evaluations = 0
    for kind, most_s in terms.latency_limits.checks(terms.steps):
        within = _time_at(terms, pairs, fixed, kind)

        def meets(sel, m, within=within, most_s=most_s):
            return within(sel, m) <= most_s * (1 + LATENCY_RTOL)

        psi_min, count = convex_argmin(within, start, pairs.hi)
        evaluations += count
        met &= meets(np.arange(len(pairs.kk)), psi_min)
        lo_ok = np.maximum(lo_ok, first_where(meets, pairs.lo, psi_min))
        hi_ok = np.minimum(hi_ok, last_where(meets, psi_min, pairs.hi))
    return lo_ok, hi_ok, met, evaluations


def _best_per_mode(terms: Terms, ks, kk, nn, m, objective: str, fixed: dict,
                   evaluations: int) -> list[ModeBest | None]:
    """The best of the candidates (kk, nn, m) per mode of ``ks``, z = z*(m) (None for a mode
    with no candidate that fits); each counts an even share of the ``evaluations``."""
    out: list[ModeBest | None] = [None] * len(ks)
    exact_level = "weights_gpu_ratio" in fixed and terms.weights_levels
    if exact_level:  # a placement level of the engine's rule: its own m, not the whole one below
        m = np.where(terms.ffn_on_gpu[kk], fixed["weights_gpu_ratio"] * terms.expert_slots, 0.0)
    z, fit = _candidates(terms, kk, nn, m, fixed)
    value = np.where(fit, throughputs(terms, kk, nn, m, z, objective), -np.inf)
    order = np.lexsort((-value, kk))  # by mode, best first
    first = order[np.r_[True, kk[order][1:] != kk[order][:-1]]]
    position = {int(k): i for i, k in enumerate(ks)}
    per_mode = max(1, evaluations // max(1, len(first)))
    for j in first:
        if np.isfinite(value[j]):
            choice = Choice(int(kk[j]), int(nn[j]), float(m[j]) if exact_level else int(m[j]), float(z[j]))
            out[position[int(kk[j])]] = ModeBest(float(value[j]), choice, per_mode)
    return out


def convex_argmin(f, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, int]:
    """Per candidate, the integer in [lo, hi] where the convex ``f(candidates, m)`` is least
    (bisection on f(m + 1) − f(m); the first of ties), and the evaluations it took."""
    lo, hi = np.array(lo, dtype=int), np.array(hi, dtype=int)
    evaluations = 0
    while np.any(lo < hi):
        act = np.flatnonzero(lo < hi)
        mid = (lo[act] + hi[act]) // 2
        t = f(np.concatenate([act, act]), np.concatenate([mid, mid + 1]))
        right = t[len(act):] < t[:len(act)]
        lo[act] = np.where(right, mid + 1, lo[act])
        hi[act] = np.where(right, hi[act], mid)
        evaluations += 2 * len(act)
    return lo, evaluations


def first_where(ok, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per candidate, the least integer in [lo, hi] where ``ok(candidates, m)`` holds, for ok
    false then true along m (hi + 1 where it never holds)."""
    lo, hi = np.array(lo, dtype=int), np.array(hi, dtype=int) + 1  # search [lo, hi + 1)
    while np.any(lo < hi):
        act = np.flatnonzero(lo < hi)
        mid = (lo[act] + hi[act]) // 2
        yes = ok(act, mid)
        hi[act] = np.where(yes, mid, hi[act])
        lo[act] = np.where(yes, lo[act], mid + 1)
    return lo


def last_where(ok, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per candidate, the largest integer in [lo, hi] where ``ok(candidates, m)`` holds, for ok
    true then false along m (lo − 1 where it never holds)."""
    return -first_where(lambda sel, m: ok(sel, -m), -np.array(hi, dtype=int), -np.array(lo, dtype=int))


def chunked_phase_times_s(terms: Terms, k: int, ns, ms, zs, objective: str) -> tuple[np.ndarray, np.ndarray]:
    """:func:`solver.lanes.terms.phase_times_s` (prefill, decode) over candidate arrays, in chunks."""
    prefill, decode = np.zeros(len(ns)), np.zeros(len(ns))
    step = max(1, CHUNK_ELEMENTS // max(1, terms.per_micro_batch_s.shape[-1] * terms.per_micro_batch_s.shape[2]))
    per_candidate = np.ndim(k) > 0
    for lo in range(0, len(ns), step):
        sl = slice(lo, lo + step)
        prefill[sl], decode[sl] = phase_times_s(terms, k[sl] if per_candidate else k, ns[sl], ms[sl], zs[sl], objective)
    return prefill, decode


def chunked_time_s(terms: Terms, k: int, ns, ms, zs, objective: str) -> np.ndarray:
    """:func:`solver.lanes.terms.total_time_s` over candidate arrays, in chunks."""
    return end_to_end_time_s(*chunked_phase_times_s(terms, k, ns, ms, zs, objective), objective)


def throughputs(terms: Terms, k: int, ns, ms, zs, objective: str) -> np.ndarray:
    """Tokens per second of candidate arrays of mode k (:func:`hrm.cost.throughput.throughput_tok_s`
    of N = μ·n sequences)."""
    prefill_s, decode_s = chunked_phase_times_s(terms, k, ns, ms, zs, objective)
    return throughput_tok_s(terms.mu[k] * ns, terms.gen_len, prefill_s, decode_s, objective)


@dataclass(frozen=True)
class PlacementResult:
    best: ModeBest | None
    terms: Terms | None  # the exact terms holding best.choice's mode (index into them)
    modes_solved: int
    modes_total: int
    candidates: int


def solve_placement(problem: Problem, bound_terms: Terms, idx: np.ndarray, max_batch: int, objective: str,
                    fixed: dict) -> PlacementResult:
    """Branch and bound over one placement's modes ``idx`` (indices into ``bound_terms``, the
    block-context coefficients): modes are solved exactly (piecewise terms, a few columns
    each) in decreasing order of their closed-form bound, in batches that double in size,
    until the next bound is at or below the incumbent. Within a batch, the incumbent drops
    the micro-batch counts (:func:`fewest_useful_micro_batches`) and the (mode, n) pairs
    (:func:`best_in_modes`) that cannot beat it."""
    nbar = max_micro_batches(bound_terms, max_batch)
    loose = throughput_upper_bounds(bound_terms, max_batch, objective, nbar, idx, fixed=fixed)
    best: tuple[ModeBest, Terms] | None = None
    solved = candidates = 0

    def incumbent() -> float:
        return best[0].throughput * (1 + BOUND_RTOL) if best else 0.0

    order = np.argsort(-loose, kind="stable")
    i, size = 0, FIRST_BATCH
    while i < len(order) and loose[order[i]] > incumbent():
        chosen = np.array([idx[j] for j in order[i:i + size] if loose[j] > incumbent()], dtype=int)
        i += size
        size = min(2 * size, MAX_BATCH_OF_MODES)
        floor = best[0].throughput if best else 0.0
        n_min = (fewest_useful_micro_batches(bound_terms, chosen, nbar, max_batch, objective, floor, fixed)
                 if floor else None)
        terms = build_terms(problem, [bound_terms.modes[j] for j in chosen], pieces=True,
                            latency_limits=bound_terms.latency_limits)
        found = best_in_modes(terms, np.arange(len(chosen)), nbar[chosen], max_batch, objective, fixed, floor=floor,
                              n_min=n_min)
        solved += len(chosen)
        for item in found:
            if item is None:
                continue
            candidates += item.candidates
            if best is None or item.throughput > best[0].throughput:
                best = (item, terms)
    return PlacementResult(best[0] if best else None, best[1] if best else None, solved, len(idx), candidates)


@dataclass(frozen=True)
class ExactResult:
    best: ModeBest | None
    terms: Terms | None
    by_placement: list[tuple[ModeBest, Terms]]  # best of every placement, descending
    mu_max: int
    modes_total: int
    modes_solved: int
    candidates: int
    seconds: float


def solve(problem: Problem, placements, max_batch: int, objective: str, fixed: dict,
          latency_limits: LatencyLimits | None = None) -> ExactResult:
    """The optimum over every μ, n, m and z of every allowed placement that meets the
    latency limits, and each placement's own optimum (the alternatives)."""
    start = time.perf_counter()
    modes = candidate_micro_batch_sizes(problem, placements, max_batch, fixed)
    per_place, solved, candidates = [], 0, 0
    if modes:
        # the bounds ignore the latency limits (still upper bounds); the exact solves apply them
        bound_terms = build_terms(problem, modes, blocks=BOUND_BLOCKS, latency_limits=latency_limits)
        for attn, ffn in placements:
            idx = np.flatnonzero((bound_terms.attn_on_gpu == attn) & (bound_terms.ffn_on_gpu == ffn))
            if not len(idx):
                continue
            result = solve_placement(problem, bound_terms, idx, max_batch, objective, fixed)
            solved += result.modes_solved
            candidates += result.candidates
            if result.best is not None:
                per_place.append((result.best, result.terms))
    per_place.sort(key=lambda item: -item[0].throughput)
    top = per_place[0] if per_place else (None, None)
    return ExactResult(top[0], top[1], per_place, max((m.micro_batch_size for m in modes), default=0), len(modes),
                       solved, candidates, time.perf_counter() - start)
