"""Policy search API: ``search(hw, model, workload) -> SearchResult`` (SPEC §5).

Builds the mode terms from the hrm model, solves the MILP (Dinkelbach, exact), turns the
optimum into a :class:`hrm.policy.Policy`, re-evaluates it with :func:`hrm.estimate.estimate`
(the single source of the numbers the plan reports) and returns the plan.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

from hrm.engine import Engine, is_shipped, resolve_engine
from hrm.errors import HRMError, InfeasibleError
from hrm.estimate import EstimateResult, engine_problem, estimate, snap_weights_ratio, static_experts_in_words
from hrm.hardware import HardwareProfile
from hrm.memory import MemoryLimits, memory_limits
from hrm.model import ModelSpec
from hrm.options import DEFAULT_OPTIONS, ModelOptions
from hrm.plan import SCHEMA_VERSION, Plan, SolverInfo, SpecRef
from hrm.policy import Policy
from hrm.workload import Workload, check_context_window

from hrm.placement import make_placement

from . import exact, milp
from .milp import Choice
from .terms import DEFAULT_MAX_BATCH, LatencyLimits, Mode, Terms, allowed_placements, build_terms, tier_bytes

#: what the search maximises: end-to-end generation throughput, decode throughput, or — at a
#: pinned batch N — the inverse of the per-token latency (max decode throughput at fixed N is
#: min TPOT, so it is the decode objective with N fixed)
OBJECTIVES = ("generation", "decode", "latency")
from .verify import verify_optimum

SOLVER_NAME = "exact B&B"

CREATED_BY = "hrm-search 0.1.0"


@dataclass(frozen=True)
class Candidate:
    policy: Policy
    estimate: EstimateResult
    choice: Choice


@dataclass(frozen=True)
class SearchResult:
    best: Candidate
    alternatives: list[Candidate]
    plan: Plan
    solver_name: str
    seconds: float
    iterations: int
    verified: bool | None = None
    verify_objective: float | None = None
    verify_seconds: float | None = None
    extras: dict = field(default_factory=dict)


def choice_to_policy(terms: Terms, choice: Choice) -> Policy:
    mode = terms.modes[choice.mode_index]
    big = mode.micro_batch_size * choice.num_micro_batches
    return Policy(
        batch_size=big,
        micro_batch_size=mode.micro_batch_size,
        num_micro_batches=choice.num_micro_batches,
        attn_on_gpu=mode.attn_on_gpu,
        ffn_on_gpu=mode.ffn_on_gpu,
        weights_gpu_ratio=choice.gpu_experts / terms.expert_slots,
        kv_gpu_ratio=min(1.0, choice.gpu_kv_sequences / big) if mode.attn_on_gpu else 0.0,
    )


def _infeasible_reason(hw: HardwareProfile, model: ModelSpec, workload: Workload, terms: Terms, limits: MemoryLimits,
                       fixed: dict) -> str:
    """Name the limit that binds at the smallest footprint the constraints allow: per mode,
    the fewest micro-batches (n = 1, or the pinned n / N), no KV on the GPU, and the split
    of offloaded weights that is best for each tier (or the pinned r_w); the message gives
    the tier's need and its usable bytes."""
    from hrm import costs
    from hrm.units import GIB as gib

    if limits.shared:
        weights = costs.static_weight_bytes(model) + costs.total_expert_bytes(model)
        if weights > limits.cpu_bytes:
            return (f"model weights {weights / gib:.1f} GiB exceed usable host memory {limits.cpu_bytes / gib:.1f} GiB "
                    f"({hw.name}, CPU-only)")
        return f"even one sequence of {workload.max_context_len} tokens does not fit host memory {limits.cpu_bytes / gib:.1f} GiB"
    if not len(terms.modes):
        return "no placement is allowed"
    M = terms.expert_slots
    pinned_m = milp.snapped_expert_count(terms, fixed["weights_gpu_ratio"]) if "weights_gpu_ratio" in fixed else None
    rows = []
    for k in range(len(terms.modes)):
        n = fixed.get("num_micro_batches", 1)
        if "batch_size" in fixed:
            n = max(1, fixed["batch_size"] // int(terms.mu[k]))
        big = terms.mu[k] * n
        gpu_m = pinned_m if pinned_m is not None else (0 if terms.gpu_per_rw[k] > 0 else M)
        cpu_m = pinned_m if pinned_m is not None else (M if terms.cpu_per_rw[k] < 0 else 0)
        rows.append((tier_bytes(terms, k, big, gpu_m)[0], tier_bytes(terms, k, big, cpu_m)[1]))
    gpu_need = min(r[0] for r in rows)
    cpu_need = min(r[1] for r in rows)
    pinned = " with the --fix constraints" if fixed else ""
    if gpu_need > limits.gpu_bytes and gpu_need / limits.gpu_bytes >= cpu_need / limits.cpu_bytes:
        what = ("the pinned policy" if fixed else f"one micro-batch of prompt {workload.max_prompt_len}")
        return (f"GPU memory binds{pinned}: {what} needs at least {gpu_need / gib:.1f} GiB of "
                f"{limits.gpu_bytes / gib:.1f} GiB usable ({100 * gpu_need / limits.gpu_bytes:.0f}%)")
    if cpu_need > limits.cpu_bytes:
        return (f"CPU memory binds{pinned}: offloaded weights + KV of the smallest batch need at least "
                f"{cpu_need / gib:.1f} GiB of {limits.cpu_bytes / gib:.1f} GiB usable "
                f"({100 * cpu_need / limits.cpu_bytes:.0f}%)")
    weights = costs.static_weight_bytes(model) + costs.total_expert_bytes(model)
    if weights > limits.gpu_bytes + limits.cpu_bytes:
        return (f"model weights {weights / gib:.1f} GiB exceed usable GPU + CPU memory "
                f"{(limits.gpu_bytes + limits.cpu_bytes) / gib:.1f} GiB")
    return (f"GPU and CPU memory bind together{pinned}: no split of the offloaded weights fits both "
            f"(GPU {limits.gpu_bytes / gib:.1f} GiB, CPU {limits.cpu_bytes / gib:.1f} GiB usable)")


def engine_fixed(engine: Engine, model: ModelSpec, fixed: dict) -> tuple[dict, list[str]]:
    """The user's pins merged with what the engine fixes (a contradiction is refused), and
    r_w snapped to the engine's granularity (with a note saying so)."""
    fixed = dict(fixed)
    for key, value in engine.policy.fixed.items():
        value = int(value) if key == "num_micro_batches" else float(value)
        if key in fixed and abs(float(fixed[key]) - value) > 1e-9:
            raise HRMError(f"--fix {key}={fixed[key]:g}: engine {engine.name} runs {key}={value:g}")
        fixed[key] = value
    notes = []
    if "weights_gpu_ratio" in fixed:
        snapped = snap_weights_ratio(model, engine, fixed["weights_gpu_ratio"])
        if snapped != fixed["weights_gpu_ratio"]:
            notes.append(f"--fix rw={fixed['weights_gpu_ratio']:g} snapped to {snapped:.4g}: engine {engine.name} keeps "
                         f"{static_experts_in_words(model, engine, snapped)} on the GPU")
            fixed["weights_gpu_ratio"] = snapped
    return fixed, notes


def search(
    hw: HardwareProfile,
    model: ModelSpec,
    workload: Workload,
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
) -> SearchResult:
    """Best policy for the model on the machine and workload as ``engine`` runs it (default
    ``ideal`` with ``schedule``, default cgopipe) among those that meet ``latency_limits``
    (TPOT, TTFT); ``objective`` one of :data:`OBJECTIVES`. Raises InfeasibleError (exit 3)
    with the binding limit when no policy fits."""
    start = time.perf_counter()
    check_context_window(model, workload)
    engine = resolve_engine(engine, schedule)
    fixed, notes = engine_fixed(engine, model, dict(fixed or {}))
    latency_limits = latency_limits or LatencyLimits()
    if objective not in OBJECTIVES:
        raise HRMError(f"unknown objective '{objective}' ({', '.join(OBJECTIVES)})")
    if objective in ("decode", "latency") and workload.gen_len < 2:
        raise HRMError(f"--objective {objective} needs --gen-len >= 2 (there are no decode steps)")
    if latency_limits.tpot_s is not None and workload.gen_len < 2:
        raise HRMError("--max-tpot-ms needs --gen-len >= 2 (there are no decode steps)")
    if objective == "latency" and "batch_size" not in fixed:
        raise HRMError("--objective latency minimises the per-token latency at a given batch: pin it, e.g. --fix N=1")
    solve_for = "decode" if objective == "latency" else objective
    if max_batch < 1:
        raise HRMError(f"--max-batch must be positive, got {max_batch}")
    limits = limits or memory_limits(hw, options)
    request = SearchRequest(hw, model, workload, engine, objective, solve_for, fixed, notes, max_batch, options, limits,
                            top, solver, verify, hw_name, model_name, latency_limits, start)
    from hrm.schedules import pipeline_function

    return pipeline_function(engine.schedule, 1)(request)


@dataclass(frozen=True)
class SearchRequest:
    """A checked search (:func:`search`'s arguments, the engine resolved, its pins merged),
    handed to the search of the engine's pipeline."""

    hw: HardwareProfile
    model: ModelSpec
    workload: Workload
    engine: Engine
    objective: str
    solve_for: str
    fixed: dict
    notes: list
    max_batch: int
    options: ModelOptions
    limits: MemoryLimits
    top: int
    solver: str
    verify: bool
    hw_name: str | None
    model_name: str | None
    latency_limits: LatencyLimits
    start: float


def search_lanes(request: SearchRequest) -> SearchResult:
    """The exact branch and bound over the lanes pipeline's policies (:mod:`solver.exact`)."""
    (hw, model, workload, engine, objective, solve_for, fixed, notes, max_batch, options, limits, top, solver, verify,
     hw_name, model_name, latency_limits, start) = (getattr(request, f.name) for f in fields(request))
    # pinned static ratios imply the placement: weights on the GPU need experts on the GPU,
    # a KV share on the GPU needs attention there
    if fixed.get("weights_gpu_ratio", 0) > 0:
        fixed.setdefault("ffn_on_gpu", True)
    if fixed.get("kv_gpu_ratio", 0) > 0:
        fixed.setdefault("attn_on_gpu", True)
    placements = allowed_placements(engine, fixed.get("attn_on_gpu"), fixed.get("ffn_on_gpu"))
    if not placements:
        raise HRMError(engine_problem(engine, fixed.get("attn_on_gpu", False), fixed.get("ffn_on_gpu", True))
                       or "no placement is allowed by --fix and the engine")
    found = exact.solve(hw, model, workload, engine, options, limits, placements, max_batch, solve_for, fixed,
                        latency_limits)
    if found.best is None:
        suffix = f" (engine {engine.name})" if engine.name != "ideal" else ""
        if latency_limits and exact.solve(hw, model, workload, engine, options, limits, placements, max_batch,
                                          solve_for, fixed).best is not None:
            raise InfeasibleError(_latency_reason(hw, model, workload, engine, options, limits, placements,
                                                  max_batch, fixed, latency_limits) + suffix)
        smallest = [Mode(int(fixed.get("micro_batch_size", 1)), a, f) for a, f in placements]
        terms = build_terms(hw, model, workload, engine, options, limits, smallest)
        raise InfeasibleError(_infeasible_reason(hw, model, workload, terms, limits, fixed) + suffix)
    best = _candidate(hw, model, workload, engine, options, limits, found.terms, found.best.choice)
    # alternatives: the exact optimum of every other placement (A_g, F_g)
    alternatives = [_candidate(hw, model, workload, engine, options, limits, terms, mode_best.choice)
                    for mode_best, terms in found.by_placement[1:1 + max(0, top)]]
    seconds = time.perf_counter() - start
    space = search_space(found, max_batch, fixed)
    verified = verify_objective = verify_seconds = None
    if verify:
        check = verify_optimum(hw, model, workload, engine, options, limits, placements, max_batch, solve_for, fixed,
                               found.best.throughput, solver, latency_limits)
        verify_objective, verify_seconds = max(check.objective, check.milp_objective or 0.0), check.seconds
        verified = abs(verify_objective - found.best.throughput) <= 1e-9 * max(verify_objective, 1e-12)
    plan = make_plan(request, best.estimate, make_placement(model, best.choice.gpu_experts, best.policy.num_micro_batches,
                                                            whole_layers=engine.static_experts == "whole-layers"),
                     f"exact branch and bound over {space}{describe_limits(latency_limits)}", seconds, found.candidates)
    return SearchResult(best, alternatives, plan, SOLVER_NAME, seconds, found.modes_solved, verified,
                        verify_objective, verify_seconds,
                        {"objective": found.best.throughput, "objective_kind": objective, "notes": notes,
                         "latency_limits": latency_limits,
                         "engine": engine, "search_space": space, "modes_total": found.modes_total,
                         "candidates": found.candidates, "mu_max": found.mu_max,
                         "verify_modes": (check.modes_enumerated, check.modes_total) if verify else None})


def make_plan(request: SearchRequest, best: EstimateResult, placement, solver_name: str, seconds: float,
              candidates: int) -> Plan:
    """The plan of a search's optimum (SPEC §6), for every pipeline."""
    hw, model, engine = request.hw, request.model, request.engine
    return Plan(
        schema_version=SCHEMA_VERSION,
        hardware=SpecRef(name=request.hw_name or hw.name, sha256=hw.sha256()),
        model=SpecRef(name=request.model_name or model.name, sha256=model.sha256()),
        workload=request.workload,
        policy=best.policy,
        schedule=engine.schedule,
        engine=engine.name,
        engine_definition=None if is_shipped(engine) else engine,
        routing=model.routing,
        estimate=best.to_plan_estimate(),
        placement=placement,
        solver=SolverInfo(name=solver_name, seconds=seconds, optimal=True, candidates_evaluated=candidates),
        created_by=CREATED_BY,
    )


def describe_limits(latency_limits: LatencyLimits) -> str:
    """The limits in words for the plan's solver name ('' without any)."""
    parts = []
    if latency_limits.tpot_s is not None:
        parts.append(f"TPOT <= {latency_limits.tpot_s * 1e3:g} ms")
    if latency_limits.ttft_s is not None:
        parts.append(f"TTFT <= {latency_limits.ttft_s:g} s")
    return f", subject to {' and '.join(parts)}" if parts else ""


def _latency_reason(hw, model, workload, engine, options, limits, placements, max_batch, fixed,
                    latency_limits: LatencyLimits) -> str:
    """Why no policy meets the latency limits: what the fastest policy for the smallest batch
    (N = 1, or the pinned N) reaches — decode-optimal for TPOT, generation-optimal for TTFT."""
    parts = []
    for what, limit, per_step in (("TPOT", latency_limits.tpot_s, True), ("TTFT", latency_limits.ttft_s, False)):
        if limit is None:
            continue
        least = _least_time_s(hw, model, workload, engine, options, limits, placements, fixed, per_step)
        shown = (lambda s: f"{s * 1e3:.4g} ms") if per_step else (lambda s: f"{s:.4g} s")
        flag = "--max-tpot-ms" if per_step else "--max-ttft-s"
        if least is not None and least > limit * (1 + 1e-9):
            parts.append(f"{flag} {shown(limit)}: the fastest policy for {fixed.get('batch_size', 1)} request(s) "
                         f"has {what} {shown(least)}")
    if not parts:
        return (f"no policy meets {describe_limits(latency_limits)[len(', subject to '):]} together "
                f"within memory (each alone is reachable)")
    return "latency limit binds: " + "; ".join(parts)


def _least_time_s(hw, model, workload, engine, options, limits, placements, fixed, per_step: bool) -> float | None:
    """TPOT (``per_step``) or TTFT of the smallest batch's (N = 1, or the pinned N) best policy
    for decode, resp. for generation; None when not even that batch fits."""
    from hrm.estimate import estimate as estimate_policy

    pinned = dict(fixed)
    pinned.setdefault("batch_size", 1)
    found = exact.solve(hw, model, workload, engine, options, limits, placements, pinned["batch_size"],
                        "decode" if per_step and workload.gen_len >= 2 else "generation", pinned)
    if found.best is None:
        return None
    policy = choice_to_policy(found.terms, found.best.choice)
    result = estimate_policy(hw, model, workload, policy, options=options, limits=limits, engine=engine)
    return result.per_token_latency_s if per_step else result.prefill_latency_s


def search_space(found: exact.ExactResult, max_batch: int, fixed: dict) -> str:
    """What "optimal" ranges over, in words (the plan's solver name carries it)."""
    mu = (f"mu={fixed['micro_batch_size']}" if "micro_batch_size" in fixed
          else f"every integer mu 1..{found.mu_max}")
    return (f"{mu} ({found.modes_total} (mu, placement) modes, {found.modes_solved} solved, the rest bounded), "
            f"every n with N <= {max_batch}, every whole-expert r_w, continuous r_c")


def _candidate(hw, model, workload, engine, options, limits, terms, choice) -> Candidate:
    policy = choice_to_policy(terms, choice)
    return Candidate(policy, estimate(hw, model, workload, policy, options=options, limits=limits, engine=engine), choice)
