"""Exhaustive verifier: every mode, every n and every m of the declared grid, vectorised.

For given (mode, n, m) the time is non-increasing in z (the KV terms have non-negative
coefficients) while GPU memory grows and CPU memory shrinks with z, so the best z is the
largest one the GPU limit admits: z* = min(μ·n·A_g, GPU slack / KV bytes per sequence).
Everything else is enumerated. Uses the same coefficients as the MILP (:mod:`solver.terms`)
and the same time function, so agreement checks the optimisation, not a second model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .milp import Choice, max_micro_batches, snapped_expert_count
from .terms import Terms, tier_bytes, total_time_s


@dataclass(frozen=True)
class VerifyResult:
    choice: Choice | None
    objective: float
    candidates: int
    seconds: float
    ranked: list  # [(throughput, Choice)] best per mode, descending


def exhaustive(terms: Terms, max_batch: int, objective: str = "generation", fixed: dict | None = None,
               chunk_elements: int = 4_000_000, modes: list[int] | None = None, m_grid_points: int | None = None) -> VerifyResult:
    """Best policy per mode over the full grid. ``modes`` restricts the modes searched;
    ``m_grid_points`` thins the m grid of GPU-attention modes to that many points (then the
    result is a feasible lower bound, used to warm-start the MILP, not a verification)."""
    start = time.perf_counter()
    fixed = fixed or {}
    nbar = max_micro_batches(terms, max_batch)
    M = terms.expert_slots
    g = terms.expert_step
    lim = terms.limits
    candidates = 0
    per_mode: list = []
    for k, mode in enumerate(terms.modes):
        if modes is not None and k not in modes:
            continue
        mu = terms.mu[k]
        ns = np.arange(1, nbar[k] + 1, dtype=float)
        ns = ns[mu * ns <= max_batch]
        if "num_micro_batches" in fixed:
            ns = ns[ns == fixed["num_micro_batches"]]
        if "batch_size" in fixed:
            ns = ns[mu * ns == fixed["batch_size"]]
        if not len(ns):
            continue
        if not mode.ffn_on_gpu:
            ms = np.array([0.0])
        elif "weights_gpu_ratio" in fixed:
            ms = np.array([float(snapped_expert_count(terms, fixed["weights_gpu_ratio"]))])
        elif m_grid_points:
            ms = np.unique(np.round(np.linspace(0, M // g, m_grid_points))) * g
        else:
            ms = np.arange(0, M + 1, g, dtype=float)
        if mode.ffn_on_gpu and not mode.attn_on_gpu and len(ms) > 1:
            # z = 0: time is non-increasing in m and CPU memory shrinks with m, so the best m
            # for each n is the largest the GPU (or shared) limit admits.
            big = mu * ns
            room = (lim.cpu_bytes - terms.gpu_const[k] - terms.cpu_const[k] - (terms.gpu_per_seq[k] + terms.cpu_per_seq[k]) * big
                    if lim.shared else lim.gpu_bytes - terms.gpu_const[k] - terms.gpu_per_seq[k] * big)
            per_rw = (terms.gpu_per_rw[k] + terms.cpu_per_rw[k]) if lim.shared else terms.gpu_per_rw[k]
            if per_rw > 0:
                best_m = np.clip(np.floor(room / per_rw * M / g * (1 + 1e-12)) * g, 0, M // g * g)
            else:
                best_m = np.full(ns.shape, float(M))
            grid_n, grid_m = ns, best_m
        else:
            grid_n, grid_m = (x.ravel() for x in np.meshgrid(ns, ms, indexing="ij"))
        big = mu * grid_n
        gpu, cpu = tier_bytes(terms, k, big, grid_m)
        if "kv_gpu_ratio" in fixed:
            z = fixed["kv_gpu_ratio"] * big * (1.0 if mode.attn_on_gpu else 0.0)
        elif mode.attn_on_gpu:
            if lim.shared:
                slack_z = np.full(big.shape, np.inf) if terms.gpu_kv_seq + terms.cpu_kv_seq <= 0 else \
                    (lim.cpu_bytes - gpu - cpu) / (terms.gpu_kv_seq + terms.cpu_kv_seq)
            else:
                slack_z = (lim.gpu_bytes - gpu) / terms.gpu_kv_seq
            z = np.clip(slack_z, 0.0, big)
        else:
            z = np.zeros_like(big)
        gpu_total = gpu + terms.gpu_kv_seq * z
        cpu_total = cpu + terms.cpu_kv_seq * z
        ok = (gpu_total + cpu_total <= lim.cpu_bytes * (1 + 1e-12)) if lim.shared else \
            (gpu_total <= lim.gpu_bytes * (1 + 1e-12)) & (cpu_total <= lim.cpu_bytes * (1 + 1e-12))
        grid_n, grid_m, z = grid_n[ok], grid_m[ok], z[ok]
        if not len(grid_n):
            continue
        candidates += len(grid_n)
        throughput = _throughput(terms, k, grid_n, grid_m, z, objective, chunk_elements)
        best = int(np.argmax(throughput))
        per_mode.append((float(throughput[best]), Choice(k, int(grid_n[best]), int(grid_m[best]), float(z[best]))))
    per_mode.sort(key=lambda item: -item[0])
    elapsed = time.perf_counter() - start
    if not per_mode:
        return VerifyResult(None, 0.0, candidates, elapsed, [])
    return VerifyResult(per_mode[0][1], per_mode[0][0], candidates, elapsed, per_mode)


def _throughput(terms: Terms, k: int, ns, ms, zs, objective: str, chunk_elements: int) -> np.ndarray:
    """Throughput of candidate arrays, in chunks (:func:`solver.terms.total_time_s`)."""
    mu = terms.mu[k]
    per_seq = terms.gen_len if objective == "generation" else terms.steps
    out = np.empty(len(ns))
    step = max(1, chunk_elements // max(1, terms.steps * terms.a.shape[2]))
    for lo in range(0, len(ns), step):
        n = ns[lo:lo + step]
        out[lo:lo + step] = per_seq * mu * n / total_time_s(terms, k, n, ms[lo:lo + step], zs[lo:lo + step], objective)
    return out
