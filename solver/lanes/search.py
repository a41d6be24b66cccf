"""The search of the lanes pipeline: the exact branch and bound of :mod:`solver.lanes.exact` over
every (μ, placement) mode, n, whole-expert r_w and continuous r_c; the optimum turned into
a :class:`hrm.policy.Policy` and re-evaluated by :func:`hrm.estimate.estimate_problem` (the
single source of the numbers the plan reports); and, when nothing fits, the limit that
binds in words."""

from __future__ import annotations

import time

from hrm.cost import costs
from hrm.engines.space import pinned_placements
from hrm.errors import InfeasibleError
from hrm.estimate import estimate_problem
from hrm.cost.memory import disk_spill_allowed
from hrm.placement import make_placement
from hrm.policy import Policy
from hrm.problem import Problem
from hrm.units import GIB

from . import exact
from ..request import Candidate, SearchRequest, SearchResult, SearchStats, describe_limits, make_plan
from .terms import Choice, LatencyLimits, Mode, Terms, build_terms, snapped_expert_count, tier_bytes
from .verify import verify_optimum

SOLVER_NAME = "exact B&B"


def choice_to_policy(terms: Terms, choice: Choice) -> Policy:
    """The policy of a point of the search space: N = μ·n, r_w = m/M, r_c = z/N."""
    mode = terms.modes[choice.mode_index]
    batch_size = mode.micro_batch_size * choice.num_micro_batches
    return Policy(
        batch_size=batch_size,
        micro_batch_size=mode.micro_batch_size,
        num_micro_batches=choice.num_micro_batches,
        attn_on_gpu=mode.attn_on_gpu,
        ffn_on_gpu=mode.ffn_on_gpu,
        weights_gpu_ratio=choice.gpu_experts / terms.expert_slots,
        kv_gpu_ratio=min(1.0, choice.gpu_kv_sequences / batch_size) if mode.attn_on_gpu else 0.0,
    )


def search_lanes(request: SearchRequest) -> SearchResult:
    """The exact branch and bound over the lanes pipeline's policies (:mod:`solver.lanes.exact`)."""
    problem, objective, limits = request.problem, request.solve_for, request.latency_limits
    fixed, placements = pinned_placements(problem.engine, request.fixed)
    found = exact.solve(problem, placements, request.max_batch, objective, fixed, limits)
    if found.best is None:
        raise InfeasibleError(_no_policy_reason(problem, placements, request.max_batch, objective, fixed, limits))
    best = _candidate(problem, found.terms, found.best.choice, fixed)
    # alternatives: the exact optimum of every other placement (A_g, F_g)
    alternatives = [_candidate(problem, terms, mode_best.choice, fixed)
                    for mode_best, terms in found.by_placement[1:1 + max(0, request.top)]]
    seconds = time.perf_counter() - request.start
    space = search_space(found, request.max_batch, fixed)
    check = None
    verified = verify_objective = verify_seconds = None
    if request.verify:
        check = verify_optimum(problem, placements, request.max_batch, objective, fixed, found.best.throughput,
                               request.solver, limits)
        verify_objective, verify_seconds = max(check.objective, check.milp_objective or 0.0), check.seconds
        verified = abs(verify_objective - found.best.throughput) <= 1e-9 * max(verify_objective, 1e-12)
    placement = make_placement(problem.model, int(round(best.choice.gpu_experts)), best.policy.num_micro_batches,
                               whole_layers=problem.engine.static_experts == "whole-layers")
    plan = make_plan(request, best.estimate, placement, f"exact branch and bound over {space}{describe_limits(limits)}",
                     seconds, found.candidates)
    stats = SearchStats(objective_value=found.best.throughput, objective_name=request.objective,
                        notes=tuple(request.notes), latency_limits=limits, engine=problem.engine,
                        search_space=space, modes_total=found.modes_total, candidates_evaluated=found.candidates,
                        mu_max=found.mu_max, verify_modes_enumerated=check.modes_enumerated if check else None,
                        verify_modes_total=check.modes_total if check else None)
    return SearchResult(best, alternatives, plan, SOLVER_NAME, seconds, found.modes_solved, verified,
                        verify_objective, verify_seconds, stats)


def _no_policy_reason(problem: Problem, placements, max_batch: int, objective: str, fixed: dict,
                      latency_limits: LatencyLimits) -> str:
    """Why no policy was found: the latency limits (when some policy fits memory without
    them), else the memory limit that binds; with the engine's name unless it is ideal."""
    engine = problem.engine
    suffix = f" (engine {engine.name})" if engine.name != "ideal" else ""
    if latency_limits and exact.solve(problem, placements, max_batch, objective, fixed).best is not None:
        return _latency_reason(problem, placements, fixed, latency_limits) + suffix
    smallest = [Mode(int(fixed.get("micro_batch_size", 1)), a, f) for a, f in placements]
    return _infeasible_reason(problem, build_terms(problem, smallest), fixed) + suffix


def _infeasible_reason(problem: Problem, terms: Terms, fixed: dict) -> str:
    """Name the limit that binds at the smallest footprint the constraints allow: per mode,
    the fewest micro-batches (n = 1, or the pinned n / N), no KV on the GPU, and the split
    of offloaded weights that is best for each tier (or the pinned r_w); the message gives
    the tier's need and its usable bytes."""
    hw, model, workload, limits = problem.hw, problem.model, problem.workload, problem.limits
    if limits.shared:
        weights = costs.static_weight_bytes(model) + costs.total_expert_bytes(model)
        if weights > limits.cpu_bytes:
            return (f"model weights {weights / GIB:.1f} GiB exceed usable host memory {limits.cpu_bytes / GIB:.1f} GiB "
                    f"({hw.name}, CPU-only)")
        return (f"even one sequence of {workload.max_context_len} tokens does not fit host memory "
                f"{limits.cpu_bytes / GIB:.1f} GiB")
    if not len(terms.modes):
        return "no placement is allowed"
    gpu_need, cpu_need = _smallest_tier_bytes(terms, fixed)
    pinned = " with the --fix constraints" if fixed else ""
    if gpu_need > limits.gpu_bytes and gpu_need / limits.gpu_bytes >= cpu_need / limits.cpu_bytes:
        what = ("the pinned policy" if fixed else f"one micro-batch of prompt {workload.max_prompt_len}")
        return (f"GPU memory binds{pinned}: {what} needs at least {gpu_need / GIB:.1f} GiB of "
                f"{limits.gpu_bytes / GIB:.1f} GiB usable ({100 * gpu_need / limits.gpu_bytes:.0f}%)")
    if cpu_need > limits.cpu_bytes:
        # with a disk tier the terms' CPU form is what stays on the host with every weight on disk
        spill = disk_spill_allowed(problem.engine, problem.rates.disk_read_bytes_s, limits)
        what = "buffers + KV of the smallest batch (every offloaded weight on disk)" if spill else \
            "offloaded weights + KV of the smallest batch"
        return (f"CPU memory binds{pinned}: {what} need at least "
                f"{cpu_need / GIB:.1f} GiB of {limits.cpu_bytes / GIB:.1f} GiB usable "
                f"({100 * cpu_need / limits.cpu_bytes:.0f}%)")
    weights = costs.static_weight_bytes(model) + costs.total_expert_bytes(model)
    if weights > limits.gpu_bytes + limits.cpu_bytes:
        return (f"model weights {weights / GIB:.1f} GiB exceed usable GPU + CPU memory "
                f"{(limits.gpu_bytes + limits.cpu_bytes) / GIB:.1f} GiB")
    return (f"GPU and CPU memory bind together{pinned}: no split of the offloaded weights fits both "
            f"(GPU {limits.gpu_bytes / GIB:.1f} GiB, CPU {limits.cpu_bytes / GIB:.1f} GiB usable)")


def _smallest_tier_bytes(terms: Terms, fixed: dict) -> tuple[float, float]:
    """(GPU, CPU) bytes of the smallest footprint over the modes of ``terms``: the fewest
    micro-batches, no KV on the GPU, and the static experts at each tier's best (or pinned)."""
    M = terms.expert_slots
    pinned_m = snapped_expert_count(terms, fixed["weights_gpu_ratio"]) if "weights_gpu_ratio" in fixed else None
    rows = []
    for k in range(len(terms.modes)):
        n = fixed.get("num_micro_batches", 1)
        if "batch_size" in fixed:
            n = max(1, fixed["batch_size"] // int(terms.mu[k]))
        batch_size = terms.mu[k] * n
        gpu_m = pinned_m if pinned_m is not None else (0 if terms.gpu_per_rw[k] > 0 else M)
        cpu_m = pinned_m if pinned_m is not None else (M if terms.cpu_per_rw[k] < 0 else 0)
        rows.append((tier_bytes(terms, k, batch_size, gpu_m)[0], tier_bytes(terms, k, batch_size, cpu_m)[1]))
    return min(r[0] for r in rows), min(r[1] for r in rows)


def _latency_reason(problem: Problem, placements, fixed: dict, latency_limits: LatencyLimits) -> str:
    """Why no policy meets the latency limits: what the fastest policy for the smallest batch
    (N = 1, or the pinned N) reaches — decode-optimal for TPOT, generation-optimal for TTFT."""
    parts = []
    for what, limit, per_step in (("TPOT", latency_limits.tpot_s, True), ("TTFT", latency_limits.ttft_s, False)):
        if limit is None:
            continue
        least = _least_time_s(problem, placements, fixed, per_step)
        shown = (lambda s: f"{s * 1e3:.4g} ms") if per_step else (lambda s: f"{s:.4g} s")
        flag = "--max-tpot-ms" if per_step else "--max-ttft-s"
        if least is not None and least > limit * (1 + 1e-9):
            parts.append(f"{flag} {shown(limit)}: the fastest policy for {fixed.get('batch_size', 1)} request(s) "
                         f"has {what} {shown(least)}")
    if not parts:
        return (f"no policy meets {describe_limits(latency_limits)[len(', subject to '):]} together "
                f"within memory (each alone is reachable)")
    return "latency limit binds: " + "; ".join(parts)


def _least_time_s(problem: Problem, placements, fixed: dict, per_step: bool) -> float | None:
    """TPOT (``per_step``) or TTFT of the smallest batch's (N = 1, or the pinned N) best policy
    for decode, resp. for generation; None when not even that batch fits."""
    pinned = dict(fixed)
    pinned.setdefault("batch_size", 1)
    objective = "decode" if per_step and problem.workload.gen_len >= 2 else "generation"
    found = exact.solve(problem, placements, pinned["batch_size"], objective, pinned)
    if found.best is None:
        return None
    result = estimate_problem(problem, choice_to_policy(found.terms, found.best.choice))
    return result.per_token_latency_s if per_step else result.prefill_latency_s


def search_space(found: exact.ExactResult, max_batch: int, fixed: dict) -> str:
    """What "optimal" ranges over, in words (the plan's solver name carries it)."""
    mu = (f"mu={fixed['micro_batch_size']}" if "micro_batch_size" in fixed
          else f"every integer mu 1..{found.mu_max}")
    return (f"{mu} ({found.modes_total} (mu, placement) modes, {found.modes_solved} solved, the rest bounded), "
            f"every n with N <= {max_batch}, every whole-expert r_w, continuous r_c")


def _candidate(problem: Problem, terms: Terms, choice: Choice, fixed: dict | None = None) -> Candidate:
    """The policy of ``choice``, estimated. An engine that places weights only at some r_w
    (``policy.weights_levels``, searched one pinned level at a time) keeps the pinned level
    itself: the search's m is whole expert matrices (the nearest to it), the level is what the
    engine places (FlexGen's --percent), and the estimate prices the level."""
    policy = choice_to_policy(terms, choice)
    pinned = (fixed or {}).get("weights_gpu_ratio")
    if pinned is not None and problem.engine.policy.weights_levels is not None and policy.ffn_on_gpu:
        policy = policy.model_copy(update={"weights_gpu_ratio": float(pinned)})
    return Candidate(policy, estimate_problem(problem, policy), choice)
