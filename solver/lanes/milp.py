"""The policy MILP with PuLP, solved exactly by Dinkelbach iterations.

Throughput is a ratio, N·tokens per sequence / T(policy) (:mod:`hrm.cost.throughput`).
Dinkelbach's method maximises F(x) − λ·G(x) (a MILP for fixed λ), sets λ ← F(x*)/G(x*) and
repeats until the optimum of F − λG is 0; λ is then the global optimum of F/G over the
MILP's feasible set.

Variables (modes k = (μ, A_g, F_g) from :mod:`solver.lanes.terms`):
  y_k ∈ {0,1}, Σ y_k = 1           which mode
  n_k ∈ ℤ, y_k ≤ n_k ≤ n̄_k·y_k     micro-batches (N = Σ μ_k·n_k)
  m_k ∈ ℤ, 0 ≤ m_k ≤ M·y_k·F_k      experts kept on the GPU (r_w = m/M), m_k = g·e_k with
                                    e_k ∈ ℤ (g: the engine's static-expert granularity)
  0 ≤ z_k ≤ μ_k·n_k·A_g             sequences whose KV stays on the GPU (r_c = z/N)
  s_{κ,t}, p_κ ≥ 0                  layer time per kind κ at decode step t / prefill
with s_{κ,t} ≥ every lane of the schedule (the linearised max of eq. 12) and the memory
limits as linear constraints. A lane of kind κ in mode k at step t takes
n·A + (n − z/μ)·B + (1 − m/M)·W + C seconds, with A, B, W, C the lane's per_micro_batch_s,
per_micro_batch_kv_cpu_s, per_layer_offloaded_weights_s and per_layer_s
(:class:`hrm.cost.latency.lane.Lane`, the arrays of :class:`solver.lanes.terms.Terms`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from hrm.cost.throughput import end_to_end_time_s, throughput_tok_s, tokens_per_sequence

from .terms import Choice, Terms, max_micro_batches, phase_times_s, snapped_expert_count


@dataclass(frozen=True)
class MilpResult:
    choice: Choice | None
    objective: float  # throughput, tok/s
    iterations: int
    seconds: float
    solver_name: str


def pick_solver(name: str = "auto", msg: bool = False):
    """CBC (bundled) by default; HiGHS (highspy, in-process) when installed and asked or auto."""
    import pulp  # lazy: a search without --verify never loads it

    available = pulp.listSolvers(onlyAvailable=True)
    if name in ("auto", "highs") and "HiGHS" in available:
        return pulp.HiGHS(msg=msg, gapRel=1e-9, threads=1), "HiGHS"
    if name == "highs":
        from hrm.errors import HRMError

        raise HRMError("--solver highs: highspy is not installed (pip install highspy)")
    return pulp.PULP_CBC_CMD(msg=msg, gapRel=1e-9, threads=1), "CBC"


def batch_size(terms: Terms, choice: Choice) -> float:
    """N = μ·n of ``choice``."""
    return terms.mu[choice.mode_index] * choice.num_micro_batches


def choice_phase_times_s(terms: Terms, choice: Choice, objective: str = "generation") -> tuple[float, float]:
    """(prefill, decode) seconds of ``choice`` that ``objective`` counts
    (:func:`solver.lanes.terms.phase_times_s`)."""
    times = phase_times_s(terms, choice.mode_index, choice.num_micro_batches, choice.gpu_experts,
                          choice.gpu_kv_sequences, objective)
    return tuple(float(np.atleast_1d(t)[0]) for t in times)


def total_time_s(terms: Terms, choice: Choice, objective: str = "generation") -> float:
    """The model's time for ``choice`` (prefill + decode steps, or decode only)."""
    return end_to_end_time_s(*choice_phase_times_s(terms, choice, objective), objective)


def throughput(terms: Terms, choice: Choice, objective: str) -> float:
    """Tokens per second of ``choice`` (:func:`hrm.cost.throughput.throughput_tok_s`)."""
    return throughput_tok_s(batch_size(terms, choice), terms.gen_len, *choice_phase_times_s(terms, choice, objective),
                            objective)


def tokens(terms: Terms, choice: Choice, objective: str) -> float:
    """Tokens of the batch of ``choice`` that ``objective`` counts: N·tokens per sequence."""
    return batch_size(terms, choice) * tokens_per_sequence(terms.gen_len, objective)


def micro_batch_caps(terms: Terms, max_batch: int, fixed: dict) -> np.ndarray:
    """n̄_k per mode (:func:`solver.lanes.terms.max_micro_batches`) under the pins: the pinned n, or
    N/μ_k for a pinned N (0 where the mode cannot take it)."""
    nbar = max_micro_batches(terms, max_batch)
    if "num_micro_batches" in fixed:
        nbar = np.where(nbar >= fixed["num_micro_batches"], fixed["num_micro_batches"], 0)
    if "batch_size" in fixed:
        pinned = fixed["batch_size"]
        nbar = np.where((pinned % terms.mu == 0) & (nbar >= pinned // terms.mu), pinned // terms.mu, 0)
    return nbar


def solve_dinkelbach(terms: Terms, max_batch: int, objective: str = "generation", fixed: dict | None = None,
                     excluded_modes: tuple[int, ...] = (), solver: str = "auto", max_iterations: int = 30,
                     tolerance: float = 1e-7, incumbent: tuple[float, Choice] | None = None) -> MilpResult:
    """Global optimum of throughput over the modes, n, m and z (Dinkelbach on the MILP).

    ``incumbent`` (a feasible point and its throughput) starts λ there: if the MILP then finds
    nothing with F − λ·G > 0, the incumbent is proven optimal in one solve."""
    import pulp  # lazy: a search without --verify never loads it

    start = time.perf_counter()
    fixed = fixed or {}
    nbar = micro_batch_caps(terms, max_batch, fixed)
    active = [k for k in range(len(terms.modes)) if nbar[k] >= 1 and k not in excluded_modes]
    backend, name = pick_solver(solver)
    if not active:
        return MilpResult(None, 0.0, 0, time.perf_counter() - start, name)
    problem, variables = _build(terms, active, nbar, max_batch, fixed)
    lam, best, iterations = 0.0, None, 0
    if incumbent is not None and incumbent[1] is not None:
        lam, best = incumbent[0], (incumbent[1], incumbent[0])
    while iterations < max_iterations:
        iterations += 1
        problem.setObjective(_objective(terms, variables, active, objective, lam))
        status = problem.solve(backend)
        if pulp.LpStatus[status] != "Optimal":
            break
        gap = pulp.value(problem.objective)
        if best is not None and lam > 0 and (gap is None
                                             or gap <= tolerance * lam * total_time_s(terms, best[0], objective)):
            break  # nothing beats λ: the incumbent is optimal
        choice = _read_choice(terms, variables, active)
        value = throughput(terms, choice, objective)
        if best is None or value > best[1]:
            best = (choice, value)
        if gap is None or gap <= tolerance * max(1.0, tokens(terms, choice, objective)) or value <= lam * (1 + 1e-12):
            break
        lam = value
    elapsed = time.perf_counter() - start
    if best is None:
        return MilpResult(None, 0.0, iterations, elapsed, name)
    return MilpResult(best[0], best[1], iterations, elapsed, name)


def _build(terms: Terms, active, nbar, max_batch: int, fixed: dict):
    """The MILP without its objective: the variables, then the constraints on the choice, the
    memory, the lanes and the latency limits (in that order)."""
    import pulp  # lazy: a search without --verify never loads it

    problem = pulp.LpProblem("hrm_policy", pulp.LpMaximize)
    v = _variables(terms, active, nbar)
    _choice_constraints(problem, terms, v, active, nbar, max_batch, fixed)
    _memory_constraints(problem, terms, v, active)
    _lane_constraints(problem, terms, v, active)
    _latency_constraints(problem, terms, v, active)
    return problem, v


def _variables(terms: Terms, active, nbar) -> dict:
    """y_k, n_k, m_k = g·e_k, z_k per active mode; s_{κ,t} and p_κ per kind (module docstring)
    and the batch size N = Σ μ_k·n_k."""
    import pulp  # lazy: a search without --verify never loads it

    M, g = terms.expert_slots, terms.expert_step
    y = {k: pulp.LpVariable(f"y_{k}", cat="Binary") for k in active}
    n = {k: pulp.LpVariable(f"n_{k}", lowBound=0, upBound=int(nbar[k]), cat="Integer") for k in active}
    # m_k = g·e_k: the engine keeps whole groups of g expert matrices on the GPU
    e = {k: pulp.LpVariable(f"e_{k}", lowBound=0, upBound=M // g if terms.modes[k].ffn_on_gpu else 0, cat="Integer")
         for k in active}
    m = {k: g * e[k] for k in active}
    z = {k: pulp.LpVariable(f"z_{k}", lowBound=0) for k in active}
    kinds = terms.per_micro_batch_s.shape[1]
    s = {(q, t): pulp.LpVariable(f"s_{q}_{t}", lowBound=0) for q in range(kinds) for t in range(terms.steps)}
    p = {q: pulp.LpVariable(f"p_{q}", lowBound=0) for q in range(kinds)}
    batch = pulp.lpSum(terms.mu[k] * n[k] for k in active)
    return {"y": y, "n": n, "m": m, "z": z, "s": s, "p": p, "N": batch}


def _choice_constraints(problem, terms: Terms, v: dict, active, nbar, max_batch: int, fixed: dict) -> None:
    """One mode, its n, m and z within their ranges, the pins and the batch cap."""
    import pulp  # lazy: a search without --verify never loads it

    y, n, m, z = v["y"], v["n"], v["m"], v["z"]
    M = terms.expert_slots
    problem += pulp.lpSum(y.values()) == 1  # Σ_k y_k = 1
    for k in active:
        problem += n[k] >= y[k]  # n_k ≥ y_k
        problem += n[k] <= int(nbar[k]) * y[k]  # n_k ≤ n̄_k·y_k
        problem += m[k] <= M * y[k]  # m_k ≤ M·y_k
        problem += z[k] <= (terms.mu[k] * n[k] if terms.modes[k].attn_on_gpu else 0)  # z_k ≤ μ_k·n_k·A_g
    if "weights_gpu_ratio" in fixed:
        target = snapped_expert_count(terms, fixed["weights_gpu_ratio"])
        for k in active:
            problem += m[k] == target * y[k]  # m_k = m_pinned·y_k
    if "kv_gpu_ratio" in fixed:
        for k in active:
            problem += z[k] == fixed["kv_gpu_ratio"] * terms.mu[k] * n[k]  # z_k = r_c·μ_k·n_k
    problem += v["N"] <= max_batch  # N = Σ μ_k·n_k ≤ max_batch
    if "batch_size" in fixed:
        problem += v["N"] == fixed["batch_size"]  # N = N_pinned


def _memory_constraints(problem, terms: Terms, v: dict, active) -> None:
    """Per tier: Σ_k const_k·y_k + per_seq_k·μ_k·n_k + per_rw_k·m_k/M + kv_seq·z_k ≤ limit
    (:func:`solver.lanes.terms.tier_bytes` plus the GPU KV; one limit when the tiers share memory)."""
    import pulp  # lazy: a search without --verify never loads it

    y, n, m, z = v["y"], v["n"], v["m"], v["z"]
    M, lim = terms.expert_slots, terms.limits
    gpu = pulp.lpSum(terms.gpu_const[k] * y[k] + terms.gpu_per_seq[k] * terms.mu[k] * n[k]
                     + terms.gpu_per_rw[k] / M * m[k] + terms.gpu_kv_seq * z[k] for k in active)
    cpu = pulp.lpSum(terms.cpu_const[k] * y[k] + terms.cpu_per_seq[k] * terms.mu[k] * n[k]
                     + terms.cpu_per_rw[k] / M * m[k] + terms.cpu_kv_seq * z[k] for k in active)
    if lim.shared:
        problem += gpu + cpu <= lim.cpu_bytes  # GPU + CPU bytes ≤ host bytes
    else:
        problem += gpu <= lim.gpu_bytes  # GPU bytes ≤ usable GPU bytes
        problem += cpu <= lim.cpu_bytes  # CPU bytes ≤ usable CPU bytes


def _lane_constraints(problem, terms: Terms, v: dict, active) -> None:
    """s_{κ,t} ≥ every decode lane of kind κ at step t and p_κ ≥ every prefill lane (the
    linearised max of eq. 12), summed over the modes (only the chosen one is non-zero)."""
    for q in range(terms.per_micro_batch_s.shape[1]):
        for lane in range(terms.per_micro_batch_s.shape[2]):
            _decode_lane_constraints(problem, terms, v, active, q, lane)
        for lane in range(terms.prefill_per_micro_batch_s.shape[2]):
            _prefill_lane_constraint(problem, terms, v, active, q, lane)


def _decode_lane_constraints(problem, terms: Terms, v: dict, active, q: int, lane: int) -> None:
    """s_{q,t} ≥ Σ_k n_k·(A + B) − z_k·B/μ_k + (y_k − m_k/M)·W + y_k·C at every step t.

    Each coefficient (A + B, −B/μ, C) is split into intercept + slope in the step index when
    it is affine (the usual case: every task sits on one side of its roofline for all
    contexts); then 2 aggregate variables per lane (base, slope) replace the dense mode ×
    step rows. Modes whose coefficients are not affine keep dense terms."""
    import pulp  # lazy: a search without --verify never loads it

    y, n, m, z, s = v["y"], v["n"], v["m"], v["z"], v["s"]
    M = terms.expert_slots
    per_mb, per_mb_kv = terms.per_micro_batch_s, terms.per_micro_batch_kv_cpu_s
    weights, per_layer = terms.per_layer_offloaded_weights_s, terms.per_layer_s
    steps = np.arange(terms.steps, dtype=float)
    agg0, agg1, dense = [], [], []
    for k in active:
        coef_n = per_mb[k, q, lane] + per_mb_kv[k, q, lane]
        coef_z = -per_mb_kv[k, q, lane] / terms.mu[k]
        fit_n, fit_z = _affine(coef_n, steps), _affine(coef_z, steps)
        if fit_n is None or fit_z is None:
            dense.append((k, coef_n, coef_z))
            continue
        agg0 += [(n[k], fit_n[0]), (z[k], fit_z[0])]
        agg1 += [(n[k], fit_n[1]), (z[k], fit_z[1])]
    offloaded = pulp.lpSum(weights[k, q, lane] * (y[k] - m[k] / M) for k in active if weights[k, q, lane])
    dense_c = []  # per-layer constants of the lane (C·y_k), affine in the step or dense
    for k in active:
        cc = per_layer[k, q, lane]
        if not np.any(cc):
            continue
        fit_c = _affine(cc, steps)
        if fit_c is None:
            dense_c.append((k, cc))
            continue
        agg0.append((y[k], fit_c[0]))
        agg1.append((y[k], fit_c[1]))
    base = pulp.LpVariable(f"base_{q}_{lane}")
    slope = pulp.LpVariable(f"slope_{q}_{lane}")
    problem += base == pulp.LpAffineExpression(agg0) + offloaded  # the lane at step 0
    problem += slope == pulp.LpAffineExpression(agg1)  # its change per step
    for t in range(terms.steps):
        extra = pulp.LpAffineExpression([(n[k], cn[t]) for k, cn, _ in dense] + [(z[k], cz[t]) for k, _, cz in dense]
                                        + [(y[k], cc[t]) for k, cc in dense_c])
        problem += s[q, t] >= base + float(steps[t]) * slope + extra  # s_{q,t} ≥ lane(t)


def _prefill_lane_constraint(problem, terms: Terms, v: dict, active, q: int, lane: int) -> None:
    """p_q ≥ Σ_k n_k·(A + B) − z_k·B/μ_k + (y_k − m_k/M)·W + y_k·C with the prefill's A, B, W, C."""
    import pulp  # lazy: a search without --verify never loads it

    y, n, m, z = v["y"], v["n"], v["m"], v["z"]
    M = terms.expert_slots
    per_mb, per_mb_kv = terms.prefill_per_micro_batch_s, terms.prefill_per_micro_batch_kv_cpu_s
    weights, per_layer = terms.prefill_per_layer_offloaded_weights_s, terms.prefill_per_layer_s
    problem += v["p"][q] >= pulp.lpSum(
        (per_mb[k, q, lane] + per_mb_kv[k, q, lane]) * n[k] - per_mb_kv[k, q, lane] / terms.mu[k] * z[k]
        + weights[k, q, lane] * (y[k] - m[k] / M) + per_layer[k, q, lane] * y[k] for k in active)


def _latency_constraints(problem, terms: Terms, v: dict, active) -> None:
    """The latency limits (:class:`solver.lanes.terms.LatencyLimits`): decode time ≤ TPOT·steps,
    prefill ≤ TTFT; s and p bound the lanes from above, so these hold iff the policy's own
    times do."""
    times = _time_exprs(terms, v, active)
    for kind, most_s in terms.latency_limits.checks(terms.steps):
        problem += times[kind] <= most_s  # T_kind ≤ the limit


def _time_exprs(terms: Terms, v, active) -> dict:
    """The decode and prefill time of the chosen policy as linear expressions (the sums of
    :func:`solver.lanes.terms.decode_time_s` / :func:`solver.lanes.terms.prefill_time_s`)."""
    import pulp  # lazy: a search without --verify never loads it

    n, s, p = v["n"], v["s"], v["p"]
    layers = terms.kind_layers
    decode = (pulp.lpSum(layers[q] * s[q, t] for (q, t) in s)
              + pulp.lpSum(terms.steps * terms.head[k] * n[k] for k in active)
              + pulp.lpSum(float(terms.sync[k].sum()) * v["y"][k] for k in active if np.any(terms.sync[k])))
    prefill = pulp.lpSum(layers[q] * p[q] for q in p) + pulp.lpSum(terms.head[k] * n[k] for k in active)
    return {"decode": decode, "prefill": prefill}


def _objective(terms: Terms, v, active, objective: str, lam: float):
    """Dinkelbach's F − λ·G: N·tokens per sequence − λ·(the time ``objective`` counts)."""
    times = _time_exprs(terms, v, active)
    time_expr = times["decode"] + times["prefill"] if objective == "generation" else times["decode"]
    return tokens_per_sequence(terms.gen_len, objective) * v["N"] - lam * time_expr


def _read_choice(terms: Terms, v, active) -> Choice:
    import pulp  # lazy: a search without --verify never loads it

    k = max(active, key=lambda j: v["y"][j].value() or 0.0)
    n = int(round(v["n"][k].value()))
    m = int(round(pulp.value(v["m"][k]) or 0))
    z = max(0.0, min(float(v["z"][k].value() or 0.0), terms.mu[k] * n))
    return Choice(k, n, m, z)


def _affine(values: np.ndarray, steps: np.ndarray, rel_tol: float = 1e-12):
    """(intercept, slope) if ``values`` is affine in ``steps`` up to rounding, else None."""
    if len(values) == 0:  # no decode step (gen 1)
        return 0.0, 0.0
    if len(values) == 1:
        return float(values[0]), 0.0
    slope = (values[-1] - values[0]) / (steps[-1] - steps[0])
    fitted = values[0] + slope * (steps - steps[0])
    scale = max(float(np.max(np.abs(values))), 1e-300)
    if np.max(np.abs(fitted - values)) > rel_tol * scale * len(values):
        return None
    return float(values[0] - slope * steps[0]), float(slope)
