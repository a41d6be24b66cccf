"""The policy MILP (SPEC §5) with PuLP, solved exactly by Dinkelbach iterations.

Throughput is a ratio, N·gen / T_total(policy). Dinkelbach's method maximises
F(x) − λ·G(x) (a MILP for fixed λ), sets λ ← F(x*)/G(x*) and repeats until the optimum of
F − λG is 0; λ is then the global optimum of F/G over the MILP's feasible set.

Variables (modes k = (μ, A_g, F_g) from :mod:`solver.terms`):
  y_k ∈ {0,1}, Σ y_k = 1           which mode
  n_k ∈ ℤ, y_k ≤ n_k ≤ n̄_k·y_k     micro-batches (N = Σ μ_k·n_k)
  m_k ∈ ℤ, 0 ≤ m_k ≤ M·y_k·F_k      experts kept on the GPU (r_w = m/M), m_k = g·e_k with
                                    e_k ∈ ℤ (g: the engine's static-expert granularity)
  0 ≤ z_k ≤ μ_k·n_k·A_g             sequences whose KV stays on the GPU (r_c = z/N)
  s_{κ,t}, p_κ ≥ 0                  layer time per kind κ at decode step t / prefill
with s_{κ,t} ≥ every lane of the schedule (the linearised max of eq. 12) and the memory
limits as linear constraints.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .terms import Terms
from .terms import total_time_s as terms_time_s


@dataclass(frozen=True)
class Choice:
    """A point of the search space in solver variables."""

    mode_index: int
    num_micro_batches: int
    gpu_experts: int  # m
    gpu_kv_sequences: float  # z


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


def total_time_s(terms: Terms, choice: Choice, objective: str = "generation") -> float:
    """The model's time for ``choice`` (prefill + decode steps, or decode only)."""
    return float(terms_time_s(terms, choice.mode_index, choice.num_micro_batches, choice.gpu_experts,
                              choice.gpu_kv_sequences, objective)[0])


def tokens(terms: Terms, choice: Choice, objective: str) -> float:
    per_seq = terms.gen_len if objective == "generation" else terms.steps
    return per_seq * terms.mu[choice.mode_index] * choice.num_micro_batches


def max_micro_batches(terms: Terms, max_batch: int) -> np.ndarray:
    """Upper bound n̄_k per mode from the batch cap and the memory limits, each tier at its
    loosest over the policies of the mode: m between 0 and m_max (the most experts one
    micro-batch leaves room for), z between 0 and N with attention on the GPU, 0 without."""
    from .exact import largest_static_experts

    lim = terms.limits
    mu = terms.mu
    attn = np.asarray(terms.attn_on_gpu, dtype=float)
    share = largest_static_experts(terms) / terms.expert_slots
    bound = np.floor(max_batch / mu)
    with np.errstate(divide="ignore", invalid="ignore"):
        if lim.shared:
            per = terms.gpu_per_seq + terms.cpu_per_seq + min(0.0, terms.gpu_kv_seq + terms.cpu_kv_seq) * attn
            room = (lim.cpu_bytes - terms.gpu_const - terms.cpu_const
                    - np.minimum(0, (terms.gpu_per_rw + terms.cpu_per_rw) * share))
            bound = np.minimum(bound, np.floor(room / np.maximum(per, 1e-9) / mu))
        else:
            per_gpu = terms.gpu_per_seq + min(0.0, terms.gpu_kv_seq) * attn
            room = lim.gpu_bytes - terms.gpu_const - np.minimum(0, terms.gpu_per_rw * share)
            bound = np.minimum(bound, np.floor(room / np.maximum(per_gpu, 1e-9) / mu))
            per_cpu = terms.cpu_per_seq + min(0.0, terms.cpu_kv_seq) * attn
            room = lim.cpu_bytes - terms.cpu_const - np.minimum(0, terms.cpu_per_rw * share)
            bound = np.minimum(bound, np.floor(room / np.maximum(per_cpu, 1e-9) / mu))
    return np.maximum(np.nan_to_num(bound, nan=0.0, neginf=0.0), 0).astype(int)


def solve_dinkelbach(terms: Terms, max_batch: int, objective: str = "generation", fixed: dict | None = None,
                     excluded_modes: tuple[int, ...] = (), solver: str = "auto", max_iterations: int = 30,
                     tolerance: float = 1e-7, incumbent: tuple[float, Choice] | None = None) -> MilpResult:
    """Global optimum of throughput over the modes, n, m and z (Dinkelbach on the MILP).

    ``incumbent`` (a feasible point and its throughput) starts λ there: if the MILP then finds
    nothing with F − λ·G > 0, the incumbent is proven optimal in one solve."""
    import pulp  # lazy: a search without --verify never loads it

    start = time.perf_counter()
    fixed = fixed or {}
    nbar = max_micro_batches(terms, max_batch)
    if "num_micro_batches" in fixed:
        nbar = np.where(nbar >= fixed["num_micro_batches"], fixed["num_micro_batches"], 0)
    if "batch_size" in fixed:
        big = fixed["batch_size"]
        nbar = np.where((big % terms.mu == 0) & (nbar >= big // terms.mu), big // terms.mu, 0)
    active = [k for k in range(len(terms.modes)) if nbar[k] >= 1 and k not in excluded_modes]
    backend, name = pick_solver(solver)
    if not active:
        return MilpResult(None, 0.0, 0, time.perf_counter() - start, name)
    problem, variables = _build(terms, active, nbar, max_batch, objective, fixed)
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
        if best is not None and lam > 0 and (gap is None or gap <= tolerance * lam * _time_scale(terms, best[0], objective)):
            break  # nothing beats λ: the incumbent is optimal
        choice = _read_choice(terms, variables, active)
        value = tokens(terms, choice, objective) / total_time_s(terms, choice, objective)
        if best is None or value > best[1]:
            best = (choice, value)
        if gap is None or gap <= tolerance * max(1.0, tokens(terms, choice, objective)) or value <= lam * (1 + 1e-12):
            break
        lam = value
    elapsed = time.perf_counter() - start
    if best is None:
        return MilpResult(None, 0.0, iterations, elapsed, name)
    return MilpResult(best[0], best[1], iterations, elapsed, name)


def _time_scale(terms: Terms, choice: Choice, objective: str) -> float:
    return total_time_s(terms, choice, objective)


def _build(terms: Terms, active, nbar, max_batch, objective, fixed):
    import pulp  # lazy: a search without --verify never loads it

    problem = pulp.LpProblem("hrm_policy", pulp.LpMaximize)
    M = terms.expert_slots
    y = {k: pulp.LpVariable(f"y_{k}", cat="Binary") for k in active}
    n = {k: pulp.LpVariable(f"n_{k}", lowBound=0, upBound=int(nbar[k]), cat="Integer") for k in active}
    g = terms.expert_step
    # m_k = g·e_k: the engine keeps whole groups of g expert matrices on the GPU
    e = {k: pulp.LpVariable(f"e_{k}", lowBound=0, upBound=M // g if terms.modes[k].ffn_on_gpu else 0, cat="Integer")
         for k in active}
    m = {k: g * e[k] for k in active}
    z = {k: pulp.LpVariable(f"z_{k}", lowBound=0) for k in active}
    problem += pulp.lpSum(y.values()) == 1
    for k in active:
        mode = terms.modes[k]
        problem += n[k] >= y[k]
        problem += n[k] <= int(nbar[k]) * y[k]
        problem += m[k] <= M * y[k]
        problem += z[k] <= (terms.mu[k] * n[k] if mode.attn_on_gpu else 0)
    if "weights_gpu_ratio" in fixed:
        target = snapped_expert_count(terms, fixed["weights_gpu_ratio"])
        for k in active:
            problem += m[k] == target * y[k]
    if "kv_gpu_ratio" in fixed:
        for k in active:
            problem += z[k] == fixed["kv_gpu_ratio"] * terms.mu[k] * n[k]
    big_n = pulp.lpSum(terms.mu[k] * n[k] for k in active)
    problem += big_n <= max_batch
    if "batch_size" in fixed:
        problem += big_n == fixed["batch_size"]
    lim = terms.limits
    gpu = pulp.lpSum(terms.gpu_const[k] * y[k] + terms.gpu_per_seq[k] * terms.mu[k] * n[k]
                     + terms.gpu_per_rw[k] / M * m[k] + terms.gpu_kv_seq * z[k] for k in active)
    cpu = pulp.lpSum(terms.cpu_const[k] * y[k] + terms.cpu_per_seq[k] * terms.mu[k] * n[k]
                     + terms.cpu_per_rw[k] / M * m[k] + terms.cpu_kv_seq * z[k] for k in active)
    if lim.shared:
        problem += gpu + cpu <= lim.cpu_bytes
    else:
        problem += gpu <= lim.gpu_bytes
        problem += cpu <= lim.cpu_bytes
    kinds, lanes = terms.a.shape[1], terms.a.shape[2]
    s = {(q, t): pulp.LpVariable(f"s_{q}_{t}", lowBound=0) for q in range(kinds) for t in range(terms.steps)}
    p = {q: pulp.LpVariable(f"p_{q}", lowBound=0) for q in range(kinds)}
    # n_k·(a+b) − z_k·b/μ_k per (mode, step): split each coefficient into intercept + slope
    # in the step index when it is affine (the usual case: every task sits on one side of
    # its roofline for all contexts); then 4 aggregate variables per lane replace the dense
    # mode × step rows. Modes whose coefficients are not affine keep dense terms.
    steps = np.arange(terms.steps, dtype=float)
    for q in range(kinds):
        for lane in range(lanes):
            agg0, agg1, dense = [], [], []
            for k in active:
                coef_n = terms.a[k, q, lane] + terms.b[k, q, lane]
                coef_z = -terms.b[k, q, lane] / terms.mu[k]
                fit_n, fit_z = _affine(coef_n, steps), _affine(coef_z, steps)
                if fit_n is None or fit_z is None:
                    dense.append((k, coef_n, coef_z))
                    continue
                agg0 += [(n[k], fit_n[0]), (z[k], fit_z[0])]
                agg1 += [(n[k], fit_n[1]), (z[k], fit_z[1])]
            weights = pulp.lpSum(terms.w[k, q, lane] * (y[k] - m[k] / M) for k in active if terms.w[k, q, lane])
            dense_c = []  # per-layer constants of the lane (c·y_k), affine in the step or dense
            for k in active:
                cc = terms.c[k, q, lane]
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
            problem += base == pulp.LpAffineExpression(agg0) + weights
            problem += slope == pulp.LpAffineExpression(agg1)
            for t in range(terms.steps):
                extra = pulp.LpAffineExpression([(n[k], cn[t]) for k, cn, _ in dense] + [(z[k], cz[t]) for k, _, cz in dense]
                                                + [(y[k], cc[t]) for k, cc in dense_c])
                problem += s[q, t] >= base + float(steps[t]) * slope + extra
        for lane in range(terms.pa.shape[2]):
            problem += p[q] >= pulp.lpSum(
                (terms.pa[k, q, lane] + terms.pb[k, q, lane]) * n[k] - terms.pb[k, q, lane] / terms.mu[k] * z[k]
                + terms.pw[k, q, lane] * (y[k] - m[k] / M) + terms.pc[k, q, lane] * y[k] for k in active)
    variables = {"y": y, "n": n, "m": m, "z": z, "s": s, "p": p, "N": big_n}
    # latency limits (solver.terms.LatencyLimits): decode time ≤ TPOT·steps, prefill ≤ TTFT;
    # s and p bound the lanes from above, so these hold iff the policy's own times do
    times = _time_exprs(terms, variables, active)
    for kind, most_s in terms.latency_limits.checks(terms.steps):
        problem += times[kind] <= most_s
    return problem, variables


def _time_exprs(terms: Terms, v, active) -> dict:
    """The decode and prefill time of the chosen policy as linear expressions (the sums of
    :func:`solver.terms.decode_time_s` / :func:`solver.terms.prefill_time_s`)."""
    import pulp  # lazy: a search without --verify never loads it

    n, s, p = v["n"], v["s"], v["p"]
    layers = terms.kind_layers
    decode = (pulp.lpSum(layers[q] * s[q, t] for (q, t) in s) + pulp.lpSum(terms.steps * terms.head[k] * n[k] for k in active)
              + pulp.lpSum(float(terms.sync[k].sum()) * v["y"][k] for k in active if np.any(terms.sync[k])))
    prefill = pulp.lpSum(layers[q] * p[q] for q in p) + pulp.lpSum(terms.head[k] * n[k] for k in active)
    return {"decode": decode, "prefill": prefill}


def _objective(terms: Terms, v, active, objective: str, lam: float):
    times = _time_exprs(terms, v, active)
    if objective == "generation":
        time_expr, per_seq = times["decode"] + times["prefill"], terms.gen_len
    else:
        time_expr, per_seq = times["decode"], terms.steps
    return per_seq * v["N"] - lam * time_expr


def _read_choice(terms: Terms, v, active) -> Choice:
    import pulp  # lazy: a search without --verify never loads it

    k = max(active, key=lambda j: v["y"][j].value() or 0.0)
    n = int(round(v["n"][k].value()))
    m = int(round(pulp.value(v["m"][k]) or 0))
    z = max(0.0, min(float(v["z"][k].value() or 0.0), terms.mu[k] * n))
    return Choice(k, n, m, z)


def snapped_expert_count(terms: Terms, weights_gpu_ratio: float) -> int:
    """m for a pinned r_w: the nearest multiple of the engine's granularity at or below
    r_w·M (the engine floors, e.g. ``int(E·wg)`` experts per layer)."""
    g = terms.expert_step
    raw = weights_gpu_ratio * terms.expert_slots
    return int(np.floor(raw / g + 1e-9)) * g if g > 1 else int(round(raw))


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
