"""Policy search API: ``search(hw, model, workload) -> SearchResult`` (SPEC §5).

Builds the mode terms from the hrm model, solves the MILP (Dinkelbach, exact), turns the
optimum into a :class:`hrm.policy.Policy`, re-evaluates it with :func:`hrm.estimate.estimate`
(the single source of the numbers the plan reports) and returns the plan.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from hrm.errors import HRMError, InfeasibleError
from hrm.estimate import EstimateResult, estimate, schedule_problem
from hrm.hardware import HardwareProfile
from hrm.memory import MemoryLimits, memory_limits
from hrm.model import ModelSpec
from hrm.options import DEFAULT_OPTIONS, ModelOptions
from hrm.plan import SCHEMA_VERSION, Plan, SolverInfo, SpecRef
from hrm.policy import Policy
from hrm.workload import Workload

from . import milp
from .placement import make_placement
from .milp import Choice
from .terms import DEFAULT_MAX_BATCH, MU_GRID, Terms, build_terms, enumerate_modes
from .verify import exhaustive

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


def _infeasible_reason(hw: HardwareProfile, model: ModelSpec, workload: Workload, terms: Terms, limits: MemoryLimits) -> str:
    """Name the binding limit at the smallest footprint (one sequence, μ = 1, best placement)."""
    from hrm import costs

    weights = costs.static_weight_bytes(model) + costs.total_expert_bytes(model)
    gib = 2**30
    if limits.shared:
        if weights > limits.cpu_bytes:
            return (f"model weights {weights / gib:.1f} GiB exceed usable host memory {limits.cpu_bytes / gib:.1f} GiB "
                    f"({hw.name}, CPU-only)")
        return f"even one sequence of {workload.max_context_len} tokens does not fit host memory {limits.cpu_bytes / gib:.1f} GiB"
    if costs.static_weight_bytes(model) > limits.gpu_bytes:
        return (f"non-expert weights {costs.static_weight_bytes(model) / gib:.1f} GiB exceed usable GPU memory "
                f"{limits.gpu_bytes / gib:.1f} GiB")
    if weights > limits.gpu_bytes + limits.cpu_bytes:
        return (f"model weights {weights / gib:.1f} GiB exceed usable GPU + CPU memory "
                f"{(limits.gpu_bytes + limits.cpu_bytes) / gib:.1f} GiB")
    i = int(np.argmin(terms.gpu_const)) if len(terms.modes) else 0
    if len(terms.modes) and terms.gpu_const[i] + terms.gpu_per_seq[i] > limits.gpu_bytes:
        return (f"GPU memory binds: one micro-batch of prompt {workload.max_prompt_len} needs "
                f"{terms.gpu_const[i] / gib:.1f} GiB of {limits.gpu_bytes / gib:.1f} GiB usable")
    return (f"CPU memory binds: offloaded weights + KV of one {workload.max_context_len}-token sequence exceed "
            f"{limits.cpu_bytes / gib:.1f} GiB usable")


def search(
    hw: HardwareProfile,
    model: ModelSpec,
    workload: Workload,
    schedule: str = "cgopipe",
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
) -> SearchResult:
    """Best policy for the model on the machine and workload; raises InfeasibleError
    (exit 3) with the binding limit when no policy fits."""
    start = time.perf_counter()
    fixed = dict(fixed or {})
    if objective not in ("generation", "decode"):
        raise HRMError(f"unknown objective '{objective}' (generation or decode)")
    if objective == "decode" and workload.gen_len < 2:
        raise HRMError("--objective decode needs --gen-len >= 2 (there are no decode steps)")
    if max_batch < 1:
        raise HRMError(f"--max-batch must be positive, got {max_batch}")
    limits = limits or memory_limits(hw, options)
    # pinned static ratios imply the placement: weights on the GPU need experts on the GPU,
    # a KV share on the GPU needs attention there
    if fixed.get("weights_gpu_ratio", 0) > 0:
        fixed.setdefault("ffn_on_gpu", True)
    if fixed.get("kv_gpu_ratio", 0) > 0:
        fixed.setdefault("attn_on_gpu", True)
    mu_grid = (fixed["micro_batch_size"],) if "micro_batch_size" in fixed else MU_GRID
    modes = enumerate_modes(schedule, mu_grid, fixed.get("attn_on_gpu"), fixed.get("ffn_on_gpu"))
    if not modes:
        raise HRMError(schedule_problem(fixed.get("attn_on_gpu", False), fixed.get("ffn_on_gpu", True), schedule)
                       or "no placement is allowed by --fix and the schedule")
    terms = build_terms(hw, model, workload, schedule, options, limits, modes)
    # warm start: a feasible point from a coarse enumeration (exact for CPU-attention modes)
    screen = exhaustive(terms, max_batch, objective, fixed, m_grid_points=9)
    incumbent = (screen.objective, screen.choice) if screen.choice is not None else None
    # modes whose throughput bound is below the incumbent cannot hold the optimum: leave them out
    pruned = ()
    if incumbent is not None:
        bounds = milp.mode_upper_bounds(terms, objective)
        pruned = tuple(int(k) for k in np.flatnonzero(bounds < incumbent[0] * (1 - 1e-9))
                       if k != incumbent[1].mode_index)
    result = milp.solve_dinkelbach(terms, max_batch, objective, fixed, excluded_modes=pruned, solver=solver,
                                   incumbent=incumbent)
    if result.choice is None:
        raise InfeasibleError(_infeasible_reason(hw, model, workload, terms, limits) +
                              (" (with the --fix constraints)" if fixed else ""))
    best = _candidate(hw, model, workload, schedule, options, limits, terms, result.choice)
    # alternatives: the exact optimum of the next-best other (μ, A_g, F_g) modes by the screen
    others = [c.mode_index for _, c in screen.ranked if c.mode_index != result.choice.mode_index][: max(0, top)]
    exact = exhaustive(terms, max_batch, objective, fixed, modes=others) if others else None
    alternatives = [_candidate(hw, model, workload, schedule, options, limits, terms, c)
                    for _, c in (exact.ranked if exact else [])]
    seconds = time.perf_counter() - start
    verified = verify_objective = verify_seconds = None
    if verify:
        check = exhaustive(terms, max_batch, objective, fixed)
        verify_objective, verify_seconds = check.objective, check.seconds
        verified = abs(check.objective - result.objective) <= 1e-3 * max(check.objective, 1e-12)
    plan = Plan(
        schema_version=SCHEMA_VERSION,
        hardware=SpecRef(name=hw_name or hw.name, sha256=hw.sha256()),
        model=SpecRef(name=model_name or model.name, sha256=model.sha256()),
        workload=workload,
        policy=best.policy,
        schedule=schedule,
        estimate=best.estimate.to_plan_estimate(),
        placement=make_placement(model, best.choice.gpu_experts, best.policy.num_micro_batches),
        solver=SolverInfo(name=f"MILP/{result.solver_name} (Dinkelbach, {result.iterations} iterations)",
                          seconds=seconds, optimal=True, candidates_evaluated=result.iterations * (1 + len(alternatives))),
        created_by=CREATED_BY,
    )
    return SearchResult(best, alternatives, plan, result.solver_name, seconds, result.iterations, verified,
                        verify_objective, verify_seconds, {"objective": result.objective, "objective_kind": objective})


def _candidate(hw, model, workload, schedule, options, limits, terms, choice) -> Candidate:
    policy = choice_to_policy(terms, choice)
    return Candidate(policy, estimate(hw, model, workload, policy, schedule, options, limits), choice)
