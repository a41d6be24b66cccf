"""The search is exact over every integer micro-batch size (issue: no pinned μ beats it).

Dense check: on small configurations (--max-batch keeps μ_max small enough to try every
μ), the search's optimum is ≥ the best of ``--fix mu=m`` over every m in 1..μ_max and equals
the verifier's. Pieces: the bisection over m equals the enumeration of every m, the
block bounds hold, and every lane is convex in the context (the Jensen step of the bounds).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from hrm.engines.engine import resolve_engine
from hrm.machine.hardware import load_hardware
from hrm.cost.memory import memory_limits
from hrm.model.spec import load_model
from hrm.model.options import DEFAULT_OPTIONS
from hrm.problem import make_problem
from hrm.workload import make_workload
from solver.lanes.bounds import throughput_upper_bounds
from solver.lanes.exact import best_in_mode, best_in_modes
from solver.search import search
from solver.lanes.terms import (STEP_COEFFICIENTS, WEIGHTS_COEFFICIENT, affine_in_step, affine_pieces, build_terms,
                          enumerate_modes, max_micro_batches, piece_sum_weights, total_time_s)

# hw, model, preset, gen, engine, max_batch, objective, fixed, gpu GiB override
DENSE = [
    ("t4", "mixtral", "mtbench", 32, "ideal", 96, "generation", {}, None),
    ("l4", "mixtral", "mtbench", 32, "ideal", 80, "generation", {}, None),
    ("l4", "mixtral", "summarization", 16, "moe-lightning", 64, "generation", {}, None),
    ("l4", "mixtral", "mtbench", 16, "flexgen", 64, "generation", {}, None),
    ("l4", "mixtral", "mtbench", 16, "ideal", 64, "decode", {}, None),
    ("a100-40g", "deepseek-v2-lite", "mtbench", 16, "ideal", 48, "generation", {}, None),
    ("t4", "qwen1.5-moe-a2.7b", "synthetic-reasoning", 16, "ideal", 48, "generation", {}, 6.0),
    ("2xt4", "mixtral", "mtbench", 16, "deepspeed-zero", 48, "generation", {}, None),
    ("cpu-only", "tiny-mixtral", "mtbench", 16, "ideal", 64, "generation", {}, None),
    ("l4", "small-mixtral", "mtbench", 24, "ideal", 64, "generation", {"attn_on_gpu": True}, 0.05),
    ("h100", "olmoe-1b-7b", "summarization", 16, "ideal", 64, "generation", {}, 2.0),
    ("t4", "mixtral", "mtbench", 16, "ideal", 64, "generation", {"weights_gpu_ratio": 0.05}, None),
]


def _args(case):
    hw_name, model_name, preset, gen, engine, max_batch, objective, fixed, gpu_gib = case
    hw, model = load_hardware(hw_name), load_model(model_name)
    limits = memory_limits(hw, DEFAULT_OPTIONS, gpu_mem_gib=gpu_gib)
    return (hw, model, make_workload(preset, gen_len=gen)), dict(engine=engine, max_batch=max_batch,
                                                                  objective=objective, limits=limits), fixed


def _value(result, objective):
    est = result.best.estimate
    return est.generation_throughput_tok_s if objective == "generation" else est.decode_throughput_tok_s


@pytest.mark.slow
@pytest.mark.parametrize("case", DENSE, ids=[f"{c[0]}-{c[1]}-{c[4]}-{c[6]}-{i}" for i, c in enumerate(DENSE)])
def test_search_beats_every_pinned_micro_batch_size(case):
    args, kw, fixed = _args(case)
    result = search(*args, fixed=fixed, top=0, verify=True, **kw)
    assert result.verified, (result.stats.objective_value, result.verify_objective)
    mu_max = result.stats.mu_max
    assert 1 <= mu_max <= kw["max_batch"]
    best_pinned = 0.0
    for mu in range(1, mu_max + 1):
        try:
            pinned = search(*args, fixed={**fixed, "micro_batch_size": mu}, top=0, **kw)
        except Exception as exc:  # a μ no policy admits (one micro-batch does not fit)
            assert type(exc).__name__ == "InfeasibleError"
            continue
        best_pinned = max(best_pinned, _value(pinned, kw["objective"]))
    found = _value(result, kw["objective"])
    assert found >= best_pinned * (1 - 1e-9)
    assert found == pytest.approx(best_pinned, rel=1e-9)  # the optimum's own μ is one of them
    assert found == pytest.approx(result.stats.objective_value, rel=1e-6)  # the estimate agrees with the terms


@pytest.mark.slow
@pytest.mark.parametrize("hw_name,model_name,engine", [("l4", "mixtral", "ideal"), ("t4", "deepseek-v2-lite", "ideal"),
                                                       ("l4", "mixtral", "moe-lightning"), ("cpu-only", "tiny-mixtral", "ideal")])
def test_bisection_equals_enumeration_and_bounds_hold(hw_name, model_name, engine):
    hw, model, wl = load_hardware(hw_name), load_model(model_name), make_workload("mtbench", gen_len=24)
    eng = resolve_engine(engine, None)
    limits = memory_limits(hw, DEFAULT_OPTIONS)
    modes = enumerate_modes(eng, (1, 3, 17, 64, 101, 250, 512))
    terms = build_terms(make_problem(hw, model, wl, eng, DEFAULT_OPTIONS, limits), modes)
    nbar = max_micro_batches(terms, 4096)
    fast = best_in_modes(terms, np.arange(len(modes)), nbar, 4096, "generation", {})
    blocks = throughput_upper_bounds(build_terms(make_problem(hw, model, wl, eng, DEFAULT_OPTIONS, limits), modes,
                                                 blocks=4), 4096)
    for k in range(len(modes)):
        grid = best_in_mode(terms, k, int(nbar[k]), 4096, "generation", {}, grid=True)
        assert (fast[k] is None) == (grid is None)
        if grid is not None:
            assert fast[k].throughput == pytest.approx(grid.throughput, rel=1e-9)
            assert blocks[k] >= grid.throughput * (1 - 1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("fixed", [{}, {"kv_gpu_ratio": 0.5}, {"weights_gpu_ratio": 0.25}])
@pytest.mark.parametrize("hw_name,model_name,preset", [("a100-80g", "tiny-deepseek", "summarization"),
                                                       ("l4", "mixtral", "mtbench"), ("2xt4", "tiny-mixtral", "summarization"),
                                                       ("h100", "deepseek-v2-lite", "summarization")])
def test_bounds_hold_where_memory_binds_the_kv(hw_name, model_name, preset, fixed):
    """The closed-form bound (KV share at least 1 − z_max/μ, every sign of b, w, c) is above
    every mode's exact optimum — also at μ where the GPU holds only part of the KV."""
    hw, model, wl = load_hardware(hw_name), load_model(model_name), make_workload(preset, gen_len=24)
    eng = resolve_engine("ideal", None)
    limits = memory_limits(hw, DEFAULT_OPTIONS)
    max_batch = 16384
    modes = enumerate_modes(eng, (1, 40, 158, 238, 333, 1000, 4000, 8000, 12000, 14000, 14329, 15000, 16384))
    terms = build_terms(make_problem(hw, model, wl, eng, DEFAULT_OPTIONS, limits), modes)
    nbar = max_micro_batches(terms, max_batch)
    bounds = throughput_upper_bounds(terms, max_batch, fixed=fixed)
    blocks = throughput_upper_bounds(build_terms(make_problem(hw, model, wl, eng, DEFAULT_OPTIONS, limits), modes,
                                                 blocks=4),
                                     max_batch, fixed=fixed)
    checked = 0
    for k in range(len(modes)):
        grid = best_in_mode(terms, k, int(nbar[k]), max_batch, "generation", fixed, grid=True)
        if grid is not None:
            checked += 1
            assert bounds[k] >= grid.throughput * (1 - 1e-9) and blocks[k] >= grid.throughput * (1 - 1e-9)
    assert checked >= 4


@pytest.mark.parametrize("engine", ["ideal", "moe-lightning", "flexgen", "deepspeed-zero"])
@pytest.mark.parametrize("hw_name,model_name", [("l4", "mixtral"), ("t4", "deepseek-v2-lite"), ("a100-80g", "dbrx"),
                                                ("cpu-only", "tiny-mixtral"), ("4xt4", "qwen2-57b-a14b")])
def test_lanes_are_convex_in_the_context(engine, hw_name, model_name):
    """Every lane coefficient (a, b, c) and the per-step sync has non-negative second
    differences over the decode steps: the Jensen step of the bounds holds."""
    hw, model, wl = load_hardware(hw_name), load_model(model_name), make_workload("summarization", gen_len=200)
    eng = resolve_engine(engine, None)
    terms = build_terms(make_problem(hw, model, wl, eng, DEFAULT_OPTIONS, memory_limits(hw, DEFAULT_OPTIONS)),
                        enumerate_modes(eng, (1, 7, 32, 128, 700)))
    for arr in (getattr(terms, key) for key in STEP_COEFFICIENTS):
        second = np.diff(arr, n=2, axis=-1)
        scale = np.max(np.abs(arr), axis=-1, keepdims=True) + 1e-300
        assert np.all(second >= -1e-9 * scale)


@pytest.mark.parametrize("hw_name,model_name,engine,preset,gen", [
    ("l4", "mixtral", "ideal", "mtbench", 128), ("t4", "deepseek-v2-lite", "moe-lightning", "summarization", 64),
    ("a100-80g", "dbrx", "flexgen", "synthetic-reasoning", 300), ("4xt4", "qwen2-57b-a14b", "deepspeed-zero", "mtbench", 200),
    ("cpu-only", "tiny-mixtral", "ideal", "mtbench", 3)])
def test_piecewise_terms_equal_one_column_per_step(hw_name, model_name, engine, preset, gen):
    """The exact solve's piecewise terms (a few columns) give the same model time as one
    column per decode step, for random candidates of every mode, both objectives."""
    hw, model, wl = load_hardware(hw_name), load_model(model_name), make_workload(preset, gen_len=gen)
    eng = resolve_engine(engine, None)
    limits = memory_limits(hw, DEFAULT_OPTIONS)
    modes = enumerate_modes(eng, (1, 3, 17, 64, 250, 2000))
    full = build_terms(make_problem(hw, model, wl, eng, DEFAULT_OPTIONS, limits), modes)
    piecewise = build_terms(make_problem(hw, model, wl, eng, DEFAULT_OPTIONS, limits), modes, pieces=True)
    assert piecewise.per_micro_batch_s.shape[-1] <= min(full.per_micro_batch_s.shape[-1], 9)
    rng = np.random.default_rng(7)
    k = rng.integers(0, len(modes), 500)
    n = rng.integers(1, 40, 500).astype(float)
    m = rng.integers(0, full.expert_slots + 1, 500).astype(float) * full.ffn_on_gpu[k]
    z = rng.random(500) * full.mu[k] * n * full.attn_on_gpu[k]
    for objective in ("generation", "decode"):
        np.testing.assert_allclose(total_time_s(piecewise, k, n, m, z, objective), total_time_s(full, k, n, m, z, objective),
                                   rtol=1e-12)


@pytest.mark.parametrize("kinks", [(37,), (5, 90, 91), (1, 2, 150)])
def test_piecewise_terms_find_every_change_of_slope(kinks):
    """Coefficients with changes of slope (convex, as every lane is): the pieces put a column
    at each, and step sums over the pieces equal the dense sums."""
    hw, model, wl = load_hardware("l4"), load_model("mixtral"), make_workload("mtbench", gen_len=200)
    eng = resolve_engine("ideal", None)
    limits = memory_limits(hw, DEFAULT_OPTIONS)
    modes = enumerate_modes(eng, (2, 40, 300))
    full = build_terms(make_problem(hw, model, wl, eng, DEFAULT_OPTIONS, limits), modes)
    steps = np.arange(full.steps, dtype=float)
    rng = np.random.default_rng(len(kinks))
    bent = {key: getattr(full, key).copy() for key in STEP_COEFFICIENTS}
    for kink in kinks:  # a convex bend (slope grows after the kink) on random rows
        for key in ("per_micro_batch_s", "per_layer_s"):
            rows = rng.random(bent[key].shape[:-1]) < 0.3
            scale = np.abs(bent[key]).max(axis=-1, keepdims=True) * 1e-2
            bent[key] = bent[key] + rows[..., None] * scale * np.maximum(steps - kink, 0.0)
    dense = replace(full, **bent, affine=np.all(affine_in_step(bent["per_micro_batch_s"])
                                                & affine_in_step(bent["per_micro_batch_kv_cpu_s"])
                                                & affine_in_step(bent["per_layer_s"]), axis=2))

    def evaluate(at):
        cols = {key: val[..., at] for key, val in bent.items()}
        return {**cols, WEIGHTS_COEFFICIENT: getattr(full, WEIGHTS_COEFFICIENT)}

    index, coef = affine_pieces(evaluate, full.steps)
    assert set(kinks) <= set(index.tolist())
    piecewise = replace(full, **{key: coef[key] for key in STEP_COEFFICIENTS}, step_index=index,
                        step_weight=piece_sum_weights(index),
                        affine=np.ones(full.per_micro_batch_s.shape[:2], dtype=bool))
    k = rng.integers(0, len(modes), 300)
    n = rng.integers(1, 30, 300).astype(float)
    m = rng.integers(0, full.expert_slots + 1, 300).astype(float)
    z = rng.random(300) * full.mu[k] * n
    np.testing.assert_allclose(total_time_s(piecewise, k, n, m, z), total_time_s(dense, k, n, m, z), rtol=1e-11)
