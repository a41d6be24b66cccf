"""Verifier: a proof, by other means than the search, that no policy beats its optimum.

:func:`verify_optimum` re-derives every (μ, placement) mode's throughput bound with one
column per decode step (exact sums over the steps: no convexity argument, unlike the
search's bounds at the mean context) and enumerates every feasible (n, m) of every mode
whose bound is above the search's optimum — all whole-expert m, not the search's
bisection. For given (mode, n, m) the time is non-increasing in z (the KV terms have
non-negative coefficients) while GPU memory grows and CPU memory shrinks with z, so the best
z is the largest one the GPU limit admits (:func:`solver.lanes.exact.kv_on_gpu`). Then the MILP
(:func:`solver.lanes.milp.solve_dinkelbach`, started at the enumeration's best) certifies the open
modes a third way: one solve proving that nothing has F − λ·G > 0 (not for an engine that
splits the KV only at whole rows, ``policy.kv_gpu_shares``: its z is not continuous, and
the enumeration, which takes the largest realisable z, certifies alone). All use the same
coefficients and time function, so agreement checks the optimisation, not a second model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from hrm.problem import Problem

from .bounds import BOUND_RTOL, throughput_upper_bounds
from .exact import best_in_mode, candidate_micro_batch_sizes
from .milp import solve_dinkelbach
from .terms import Choice, LatencyLimits, Terms, build_terms, max_micro_batches

# Modes per batch of per-step coefficients, and the (mode × decode step) columns a batch may
# hold: long generations take fewer modes per batch, so memory stays a few hundred MB.
VERIFY_MODES_PER_BATCH = 256
VERIFY_COLUMNS_PER_BATCH = 1 << 16
# Open modes per enumeration + MILP certificate (HiGHS time grows faster than the modes; 128
# balanced it against the per-chunk build on the slowest catalog cases).
VERIFY_MILP_MODES = 128


@dataclass(frozen=True)
class VerifyResult:
    choice: Choice | None
    objective: float
    candidates: int
    seconds: float
    ranked: list  # [(throughput, Choice)] best per mode enumerated, descending
    modes_total: int = 0
    modes_enumerated: int = 0
    milp_objective: float | None = None  # the MILP certificate's optimum over the open modes


def exhaustive(terms: Terms, max_batch: int, objective: str = "generation", fixed: dict | None = None,
               modes: list[int] | None = None) -> VerifyResult:
    """Best policy of every mode of ``terms`` (or of ``modes``) over every feasible (n, m)."""
    start = time.perf_counter()
    fixed = fixed or {}
    nbar = max_micro_batches(terms, max_batch)
    per_mode, candidates = [], 0
    for k in range(len(terms.modes)):
        if modes is not None and k not in modes:
            continue
        found = best_in_mode(terms, k, int(nbar[k]), max_batch, objective, fixed, grid=True)
        if found is not None:
            candidates += found.candidates
            per_mode.append((found.throughput, found.choice))
    per_mode.sort(key=lambda item: -item[0])
    best = per_mode[0] if per_mode else (0.0, None)
    return VerifyResult(best[1], best[0], candidates, time.perf_counter() - start, per_mode, len(terms.modes),
                        len(per_mode))


def verify_optimum(problem: Problem, placements, max_batch: int, objective: str, fixed: dict, claimed: float,
                   solver: str = "auto", latency_limits: LatencyLimits | None = None) -> VerifyResult:
    """The best throughput over every mode whose per-step bound exceeds ``claimed`` (every
    other mode is proven not to beat it by its bound), by enumeration and by the MILP;
    equals ``claimed`` when the search is right."""
    start = time.perf_counter()
    modes = candidate_micro_batch_sizes(problem, placements, max_batch, fixed)
    open_modes = []
    per_batch = int(np.clip(VERIFY_COLUMNS_PER_BATCH // max(1, problem.workload.gen_len), 1, VERIFY_MODES_PER_BATCH))
    for lo in range(0, len(modes), per_batch):
        terms = build_terms(problem, modes[lo:lo + per_batch], latency_limits=latency_limits)
        bounds = throughput_upper_bounds(terms, max_batch, objective, fixed=fixed)
        open_modes += [terms.modes[int(k)] for k in np.flatnonzero(bounds > claimed * (1 - BOUND_RTOL))]
    if not open_modes:
        return VerifyResult(None, 0.0, 0, time.perf_counter() - start, [], len(modes), 0)
    # the open modes in chunks: enumeration, then the MILP started at the claimed optimum (the
    # MILP's optimum is the best of its modes', so chunks certify the same; small MILPs solve
    # far faster than one over thousands of modes)
    ranked, candidates, certificate = [], 0, None
    for lo in range(0, len(open_modes), VERIFY_MILP_MODES):
        terms = build_terms(problem, open_modes[lo:lo + VERIFY_MILP_MODES], latency_limits=latency_limits)
        found = exhaustive(terms, max_batch, objective, fixed)
        candidates += found.candidates
        if found.choice is None:
            continue
        ranked += [(value, replace(choice, mode_index=choice.mode_index + lo)) for value, choice in found.ranked]
        if terms.kv_shares is not None:
            # the engine splits the KV only at whole rows (policy.kv_gpu_shares): the MILP's
            # continuous z is a relaxation of that space, so the enumeration alone certifies
            continue
        milp = solve_dinkelbach(terms, max_batch, objective, fixed, solver=solver,
                                incumbent=(max(claimed, found.objective), found.choice)).objective
        certificate = milp if certificate is None else max(certificate, milp)
    ranked.sort(key=lambda item: -item[0])
    best = ranked[0] if ranked else (0.0, None)
    return VerifyResult(best[1], best[0], candidates, time.perf_counter() - start, ranked, len(modes),
                        len(open_modes), certificate)
