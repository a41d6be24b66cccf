"""Policy search API: ``search(hw, model, workload) -> SearchResult``.

Checks the inputs once (context window, objective, pins, latency limits), resolves the
engine, builds the :class:`hrm.problem.Problem` and hands a :class:`SearchRequest` to the
search of the engine's pipeline (:data:`SEARCHES`); each re-evaluates its optimum with
:func:`hrm.estimate.estimate` (the single source of the numbers the plan reports) and
returns the plan.
"""

from __future__ import annotations

import time
from typing import Callable

from hrm.engines.engine import Engine, attention_engine, is_shipped, resolve_engine
from hrm.engines.space import engine_fixed, engine_max_batch, weights_levels
from hrm.errors import HRMError, InfeasibleError
from hrm.machine.hardware import HardwareProfile
from hrm.cost.memory import MemoryLimits
from hrm.model.spec import ModelSpec
from hrm.model.options import DEFAULT_OPTIONS, ModelOptions
from hrm.problem import make_problem
from hrm.engines.schedules import get_schedule
from hrm.workload import Workload, check_context_window

from .expert_level import search_klotski
from .lanes.search import SOLVER_NAME, choice_to_policy, search_lanes
from .request import (CREATED_BY, Candidate, SearchRequest, SearchResult, describe_limits, make_plan,
                      with_note)
from .lanes.terms import DEFAULT_MAX_BATCH, LatencyLimits

__all__ = ["OBJECTIVES", "SEARCHES", "CREATED_BY", "SOLVER_NAME", "Candidate", "SearchRequest", "SearchResult",
           "choice_to_policy", "describe_limits", "make_plan", "search"]

#: what the search maximises: end-to-end generation throughput, decode throughput, or — at a
#: pinned batch N — the inverse of the per-token latency (max decode throughput at fixed N is
#: min TPOT, so it is the decode objective with N fixed)
OBJECTIVES = ("generation", "decode", "latency")

#: the search of each pipeline (:attr:`hrm.engines.schedules.Schedule.pipeline`), by name
SEARCHES: dict[str, Callable[[SearchRequest], SearchResult]] = {
    "lanes": search_lanes,
    "expert-level": search_klotski,
}


def check_objective(objective: str, gen_len: int, fixed: dict, latency_limits: LatencyLimits, max_batch: int) -> str:
    """The throughput to maximise for ``objective`` (``decode`` for ``latency``), after the
    checks that it applies: decode steps for a decode objective or a TPOT limit, a pinned
    batch for ``latency``, a positive batch cap."""
    if objective not in OBJECTIVES:
        raise HRMError(f"unknown objective '{objective}' ({', '.join(OBJECTIVES)})")
    if objective in ("decode", "latency") and gen_len < 2:
        raise HRMError(f"--objective {objective} needs --gen-len >= 2 (there are no decode steps)")
    if latency_limits.tpot_s is not None and gen_len < 2:
        raise HRMError("--max-tpot-ms needs --gen-len >= 2 (there are no decode steps)")
    if objective == "latency" and "batch_size" not in fixed:
        raise HRMError("--objective latency minimises the per-token latency at a given batch: pin it, e.g. --fix N=1")
    if max_batch < 1:
        raise HRMError(f"--max-batch must be positive, got {max_batch}")
    return "decode" if objective == "latency" else objective


def search(hw: HardwareProfile, model: ModelSpec, workload: Workload, **kwargs) -> SearchResult:
    """Best policy for the model on the machine and workload as ``engine`` runs it (keywords:
    :func:`search_engine`). An engine that hands an attention tier to another engine file
    (``policy.attention_engines``: FlexGen's ``--cpu-cache-compute``) is searched over every
    tier, each with the engine that runs it, and the best is kept; an attention pin picks one."""
    engine = resolve_engine(kwargs.get("engine"), kwargs.get("schedule"), hw)
    tiers = engine.policy.attention_engines
    if not tiers or not is_shipped(engine):
        # an edited engine (a user's file, an --explain variant) keeps its own tiers: the
        # shipped engine a tier names would not carry the edits
        return search_engine(hw, model, workload, **kwargs)
    from hrm.engines.engine import load_engine

    attn = (kwargs.get("fixed") or {}).get("attn_on_gpu")
    if attn is not None:
        chosen = attention_engine(engine, bool(attn))
        return search_engine(hw, model, workload, **{**kwargs, "engine": chosen, "schedule": None})
    runs = [(engine, "own")] + [(load_engine(name), tier) for tier, name in tiers.items()]
    results, failures = [], []
    for candidate, tier in runs:
        try:
            results.append((search_engine(hw, model, workload, **{**kwargs, "engine": candidate, "schedule": None}),
                            candidate, tier))
        except (InfeasibleError, HRMError) as exc:
            failures.append(exc)
    if not results:
        raise failures[0]
    objective = kwargs.get("objective", "generation")
    best = max(results, key=lambda r: objective_score(r[0].best.estimate, objective))
    shown = "; ".join(f"engine {e.name} ({'attention on its own tiers' if t == 'own' else f'attn={t}'}) "
                      f"{_score_words(r.best.estimate, objective)}" for r, e, t in results)
    return with_note(best[0], f"both attention tiers searched, as engine {engine.name}'s flag chooses "
                              f"(policy.attention_engines): {shown}; kept engine {best[1].name}")


def _score_words(estimate, objective: str) -> str:
    if objective == "latency":
        return f"TPOT {estimate.per_token_latency_s * 1e3:.4g} ms"
    value = objective_score(estimate, objective)
    return f"{value:.4g} tok/s"


def search_engine(
    hw: HardwareProfile,
    model: ModelSpec,
    workload: Workload,
    *,
    schedule: str | None = None,
    objective: str = "generation",
    fixed: dict | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    options: ModelOptions = DEFAULT_OPTIONS,
    limits: MemoryLimits | None = None,
    top: int = 3,
    solver: str = "auto",
    verify: bool = False,
    hw_name: str | None = None,
    model_name: str | None = None,
    engine: str | Engine | None = None,
    latency_limits: LatencyLimits | None = None,
    time_limit_s: float | None = None,
) -> SearchResult:
    """Best policy for the model on the machine and workload as ``engine`` runs it (default
    :func:`hrm.engines.engine.default_engine_name`: moe-lightning on a GPU profile; ideal on a CPU-only
    one or with ``schedule``, default cgopipe) among those that meet ``latency_limits``
    (TPOT, TTFT); ``objective`` one of :data:`OBJECTIVES`. ``time_limit_s``: how long a
    search that is not exact by construction (Klotski's branch and bound) may schedule
    candidates before it returns its best, marked not proven optimal (None: its default).
    Raises InfeasibleError (exit 3) with the binding limit when no policy fits."""
    start = time.perf_counter()
    check_context_window(model, workload)
    engine = resolve_engine(engine, schedule, hw)
    fixed, notes = engine_fixed(engine, model, dict(fixed or {}))
    latency_limits = latency_limits or LatencyLimits()
    solve_for = check_objective(objective, workload.gen_len, fixed, latency_limits, max_batch)
    asked_max_batch = max_batch
    max_batch, notes = engine_max_batch(engine, max_batch, fixed, notes)
    base = SearchRequest(problem=make_problem(hw, model, workload, engine, options, limits), objective=objective,
                         solve_for=solve_for, fixed=fixed, notes=notes, max_batch=max_batch, top=top, solver=solver,
                         verify=verify, hw_name=hw_name, model_name=model_name, latency_limits=latency_limits,
                         start=start, asked_max_batch=asked_max_batch, time_limit_s=time_limit_s)
    run = SEARCHES[get_schedule(engine.schedule).pipeline]
    levels = weights_levels(engine, model, fixed)
    if levels is None:
        return run(base)
    return best_of_levels(run, base, levels)


def objective_score(estimate, objective: str) -> float:
    """What the search maximised, read off an estimate (higher is better): generation or
    decode tok/s, or minus the per-token latency (``latency``)."""
    return {"generation": estimate.generation_throughput_tok_s, "decode": estimate.decode_throughput_tok_s,
            "latency": -estimate.per_token_latency_s}[objective]


def best_of_levels(run, base: SearchRequest, levels: tuple[float, ...]) -> SearchResult:
    """One search per realisable r_w (pinned), the best by the objective: the engine's space
    is those placements alone (FlexGen's midpoint rule), not the continuum between them."""
    from dataclasses import replace

    results, failures = [], []
    for level in levels:
        request = replace(base, fixed={**base.fixed, "weights_gpu_ratio": level}, notes=list(base.notes))
        try:
            results.append(run(request))
        except InfeasibleError as exc:
            failures.append(exc)
    if not results:
        raise failures[0]
    best = max(results, key=lambda r: objective_score(r.best.estimate, base.objective))
    shown = " ".join(f"{v:.4g}" for v in levels)
    return with_note(best, f"rw searched at the {len(levels)} placements engine {base.engine.name}'s rule makes "
                           f"({base.engine.policy.weights_levels}): {shown}")
