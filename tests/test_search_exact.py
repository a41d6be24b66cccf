"""The search is exact over every integer micro-batch size (issue: no pinned μ beats it).

Dense check: on small configurations (--max-batch keeps μ_max small enough to try every
μ), the search's optimum is ≥ the best of ``--fix mu=m`` over every m in 1..μ_max and equals
the verifier's. Pieces: the bisection over m equals the enumeration of every m, the
block bounds hold, and every lane is convex in the context (the Jensen step of the bounds).
"""

from __future__ import annotations

import numpy as np
import pytest

from hrm.engine import resolve_engine
from hrm.hardware import load_hardware
from hrm.memory import memory_limits
from hrm.model import load_model
from hrm.options import DEFAULT_OPTIONS
from hrm.workload import make_workload
from solver.exact import best_in_mode, best_in_modes, throughput_upper_bounds
from solver.milp import max_micro_batches
from solver.search import search
from solver.terms import build_terms, enumerate_modes

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


@pytest.mark.parametrize("case", DENSE, ids=[f"{c[0]}-{c[1]}-{c[4]}-{c[6]}-{i}" for i, c in enumerate(DENSE)])
def test_search_beats_every_pinned_micro_batch_size(case):
    args, kw, fixed = _args(case)
    result = search(*args, fixed=fixed, top=0, verify=True, **kw)
    assert result.verified, (result.extras["objective"], result.verify_objective)
    mu_max = result.extras["mu_max"]
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
    assert found == pytest.approx(result.extras["objective"], rel=1e-6)  # the estimate agrees with the terms


@pytest.mark.parametrize("hw_name,model_name,engine", [("l4", "mixtral", "ideal"), ("t4", "deepseek-v2-lite", "ideal"),
                                                       ("l4", "mixtral", "moe-lightning"), ("cpu-only", "tiny-mixtral", "ideal")])
def test_bisection_equals_enumeration_and_bounds_hold(hw_name, model_name, engine):
    hw, model, wl = load_hardware(hw_name), load_model(model_name), make_workload("mtbench", gen_len=24)
    eng = resolve_engine(engine, None)
    limits = memory_limits(hw, DEFAULT_OPTIONS)
    modes = enumerate_modes(eng, (1, 3, 17, 64, 101, 250, 512))
    terms = build_terms(hw, model, wl, eng, DEFAULT_OPTIONS, limits, modes)
    nbar = max_micro_batches(terms, 4096)
    fast = best_in_modes(terms, np.arange(len(modes)), nbar, 4096, "generation", {})
    blocks = throughput_upper_bounds(build_terms(hw, model, wl, eng, DEFAULT_OPTIONS, limits, modes, blocks=4), 4096)
    for k in range(len(modes)):
        grid = best_in_mode(terms, k, int(nbar[k]), 4096, "generation", {}, grid=True)
        assert (fast[k] is None) == (grid is None)
        if grid is not None:
            assert fast[k].throughput == pytest.approx(grid.throughput, rel=1e-9)
            assert blocks[k] >= grid.throughput * (1 - 1e-9)


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
    terms = build_terms(hw, model, wl, eng, DEFAULT_OPTIONS, limits, modes)
    nbar = max_micro_batches(terms, max_batch)
    bounds = throughput_upper_bounds(terms, max_batch, fixed=fixed)
    blocks = throughput_upper_bounds(build_terms(hw, model, wl, eng, DEFAULT_OPTIONS, limits, modes, blocks=4),
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
    terms = build_terms(hw, model, wl, eng, DEFAULT_OPTIONS, memory_limits(hw, DEFAULT_OPTIONS),
                        enumerate_modes(eng, (1, 7, 32, 128, 700)))
    for arr in (terms.a, terms.b, terms.c, terms.sync):
        second = np.diff(arr, n=2, axis=-1)
        scale = np.max(np.abs(arr), axis=-1, keepdims=True) + 1e-300
        assert np.all(second >= -1e-9 * scale)
