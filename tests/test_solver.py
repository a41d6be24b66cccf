"""The MILP (Dinkelbach from λ = 0, no warm start) against the exhaustive verifier."""

import functools
import json
import subprocess
import sys

import pytest

from hrm.engines.engine import as_engine
from hrm.errors import InfeasibleError
from hrm.estimate import estimate
from hrm.machine.hardware import load_hardware
from hrm.cost.memory import memory_limits
from hrm.model.spec import load_model
from hrm.model.options import ModelOptions
from hrm.problem import make_problem
from hrm.workload import make_workload
from solver.lanes import milp
from solver.lanes.bounds import throughput_upper_bounds
from solver.search import choice_to_policy, search
from solver.lanes.terms import build_terms, enumerate_modes
from solver.lanes.verify import exhaustive

MAX_BATCH = 1024
# The MILP and the enumeration are compared on the same set of modes: these μ values.
MU_GRID = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
CASES = [
    # hardware, model, workload preset, schedule, objective, fixed, gpu/cpu GiB overrides, padding
    ("l4", "mixtral", "mtbench", "cgopipe", "generation", {}, None, None, False),
    ("t4", "mixtral", "summarization", "cgopipe", "generation", {}, None, None, False),
    ("4xt4", "dbrx", "synthetic-reasoning", "cgopipe", "generation", {}, None, None, False),
    ("2xt4", "mixtral", "mtbench", "cgopipe", "generation", {}, None, None, False),
    ("a100-80g", "mixtral", "summarization", "cgopipe", "generation", {}, None, None, False),
    ("h100", "mixtral-8x22b", "mtbench", "cgopipe", "generation", {}, None, None, False),
    ("rtx3090", "qwen1.5-moe-a2.7b", "mtbench", "cgopipe", "generation", {}, None, None, False),
    ("cpu-only", "tiny-mixtral", "mtbench", "cgopipe", "generation", {}, None, None, False),
    ("l4", "deepseek-moe-16b", "summarization", "cgopipe", "generation", {}, None, None, False),
    ("t4", "olmoe", "mtbench", "cgopipe", "generation", {}, None, None, True),
    ("2xa100-80g", "mixtral", "synthetic-reasoning", "cgopipe", "generation", {}, None, None, False),
    ("a100-40g", "deepseek-v2-lite", "mtbench", "cgopipe", "generation", {}, None, None, False),
    ("h200", "dbrx", "summarization", "cgopipe", "generation", {}, None, None, False),
    ("l4", "mistral-7b", "mtbench", "cgopipe", "generation", {}, None, None, False),
    ("a100-40g", "qwen2-57b-a14b", "synthetic-reasoning", "cgopipe", "generation", {}, None, None, False),
    ("l4", "mixtral", "mtbench", "flexgen", "generation", {}, None, None, False),
    ("l4", "mixtral", "mtbench", "flexgen-cpu-attn", "generation", {}, None, None, False),
    ("t4", "mixtral", "mtbench", "sequential", "generation", {}, None, None, False),
    ("l4", "mixtral", "mtbench", "cgopipe", "decode", {}, None, None, False),
    ("t4", "mixtral", "mtbench", "cgopipe", "generation", {"micro_batch_size": 32}, None, None, False),
    ("l4", "mixtral", "mtbench", "cgopipe", "generation", {}, 8.0, None, False),
    ("a100-80g", "mixtral", "summarization", "cgopipe", "generation", {}, None, 120.0, True),
    ("h100", "mixtral", "summarization", "cgopipe", "generation", {"attn_on_gpu": True}, None, None, False),
]


@functools.cache  # a case's terms and enumeration are the same in every test of this file (one worker)
def _terms(hw_name, model_name, preset, schedule, gpu_mem, cpu_mem, padding):
    hw, model = load_hardware(hw_name), load_model(model_name)
    wl = make_workload(preset, gen_len=8, padding=padding)
    limits = memory_limits(hw, ModelOptions(), gpu_mem, cpu_mem)
    return hw, model, wl, limits, build_terms(make_problem(hw, model, wl, as_engine(schedule), ModelOptions(), limits),
                                              enumerate_modes(schedule, MU_GRID))


@functools.cache
def _exhaustive(case_index: int):
    """The enumeration's best of every mode of ``CASES[case_index]`` (its ``_terms``)."""
    hw_name, model_name, preset, schedule, objective, fixed, gpu_mem, cpu_mem, padding = CASES[case_index]
    return exhaustive(_terms(hw_name, model_name, preset, schedule, gpu_mem, cpu_mem, padding)[-1], MAX_BATCH,
                      objective)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}-{c[4]}-{i}" for i, c in enumerate(CASES)])
def test_milp_equals_exhaustive(case):
    hw_name, model_name, preset, schedule, objective, fixed, gpu_mem, cpu_mem, padding = case
    hw, model, wl, limits, terms = _terms(hw_name, model_name, preset, schedule, gpu_mem, cpu_mem, padding)
    if fixed.get("micro_batch_size"):
        terms = build_terms(make_problem(hw, model, wl, as_engine(schedule), ModelOptions(), limits),
                            enumerate_modes(schedule, (fixed["micro_batch_size"],)))
    if "attn_on_gpu" in fixed:
        terms = build_terms(make_problem(hw, model, wl, as_engine(schedule), ModelOptions(), limits),
                            enumerate_modes(schedule, MU_GRID, attn=fixed["attn_on_gpu"]))
    result = milp.solve_dinkelbach(terms, MAX_BATCH, objective, solver="cbc")
    check = exhaustive(terms, MAX_BATCH, objective) if fixed else _exhaustive(CASES.index(case))
    assert result.choice is not None and check.choice is not None
    assert result.objective == pytest.approx(check.objective, rel=1e-3)
    # the hrm estimate of the returned policy reports the same throughput
    policy = choice_to_policy(terms, result.choice)
    est = estimate(hw, model, wl, policy, schedule, limits=limits)
    assert est.feasible
    value = est.generation_throughput_tok_s if objective == "generation" else est.decode_throughput_tok_s
    assert value == pytest.approx(result.objective, rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES[:12], ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CASES[:12])])
def test_mode_bounds_hold_and_pruned_search_is_optimal(case):
    """search() leaves out modes whose throughput bound is below an incumbent: each bound
    (per-step and per-block) must lie above the exhaustive best of its mode, and the pruned
    search must still reach the verifier's optimum."""
    hw_name, model_name, preset, schedule, objective, fixed, gpu_mem, cpu_mem, padding = case
    hw, model, wl, limits, terms = _terms(hw_name, model_name, preset, schedule, gpu_mem, cpu_mem, padding)
    bounds = throughput_upper_bounds(terms, MAX_BATCH, objective)
    problem = make_problem(hw, model, wl, as_engine(schedule), ModelOptions(), limits)
    blocks = throughput_upper_bounds(build_terms(problem, terms.modes, blocks=4),
                                     MAX_BATCH, objective)
    check = _exhaustive(CASES.index(case))
    for value, choice in check.ranked:
        assert bounds[choice.mode_index] >= value * (1 - 1e-9)
        assert blocks[choice.mode_index] >= value * (1 - 1e-9)
    result = search(hw, model, wl, schedule=schedule, objective=objective, fixed=fixed, max_batch=MAX_BATCH,
                    limits=limits, top=0, verify=True)
    assert result.verified


@pytest.mark.slow
def test_cases_cover_gpu_attention_and_cpu_ffn():
    placements = set()
    for index, case in enumerate(CASES[:15]):
        hw_name, model_name, preset, schedule, objective, fixed, gpu_mem, cpu_mem, padding = case
        *_, terms = _terms(hw_name, model_name, preset, schedule, gpu_mem, cpu_mem, padding)
        check = _exhaustive(index)
        mode = terms.modes[check.choice.mode_index]
        placements.add((mode.attn_on_gpu, mode.ffn_on_gpu))
    assert (True, True) in placements or (True, False) in placements
    assert any(not ffn for _, ffn in placements)
    assert (False, True) in placements


@pytest.mark.slow
def test_search_highs_and_cbc_agree():
    hw, model, wl = load_hardware("t4"), load_model("mixtral"), make_workload("mtbench", gen_len=16)
    a = search(hw, model, wl, max_batch=512, solver="cbc", top=0, engine="ideal")
    b = search(hw, model, wl, max_batch=512, solver="auto", top=0, verify=True, engine="ideal")
    assert a.best.estimate.generation_throughput_tok_s == pytest.approx(b.best.estimate.generation_throughput_tok_s, rel=1e-6)
    assert b.verified


def test_fix_pins_policy():
    hw, model, wl = load_hardware("l4"), load_model("mixtral"), make_workload("mtbench", gen_len=16)
    res = search(hw, model, wl, fixed={"micro_batch_size": 36, "num_micro_batches": 14, "attn_on_gpu": False,
                                       "ffn_on_gpu": True, "weights_gpu_ratio": 0.1, "kv_gpu_ratio": 0.0}, top=1, engine="ideal")
    p = res.best.policy
    assert (p.micro_batch_size, p.num_micro_batches, p.attn_on_gpu) == (36, 14, False)
    assert p.weights_gpu_ratio == pytest.approx(round(0.1 * 256) / 256)


def test_fixed_static_ratios_imply_the_placement():
    """--fix rw=0.5 alone keeps the experts on the GPU (r_w means nothing for CPU experts);
    --fix rc=0.5 keeps attention on the GPU."""
    hw, model, wl = load_hardware("cpu-only"), load_model("tiny-mixtral"), make_workload("synthetic-reasoning", gen_len=8)
    p = search(hw, model, wl, fixed={"weights_gpu_ratio": 0.5, "micro_batch_size": 8, "num_micro_batches": 4}, top=0, engine="ideal").best.policy
    assert p.ffn_on_gpu and p.weights_gpu_ratio == pytest.approx(0.5)
    p = search(hw, model, wl, fixed={"kv_gpu_ratio": 0.5, "micro_batch_size": 8, "num_micro_batches": 4}, top=0, engine="ideal").best.policy
    assert p.attn_on_gpu and p.kv_gpu_ratio == pytest.approx(0.5)


def test_model_larger_than_memory_is_infeasible():
    hw, model, wl = load_hardware("cpu-only"), load_model("dbrx"), make_workload("mtbench")
    with pytest.raises(InfeasibleError, match="exceed"):
        search(hw, model, wl, engine="ideal")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "hrm_cli", *args], capture_output=True, text=True)


def test_cli_json_validates_against_committed_schema(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    out = _cli("search", "--hw", "l4.yaml", "--model", "mixtral", "--gen-len", "16", "--json",
               "--out", str(tmp_path / "plan.json"))
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    for key in ("schema_version", "hardware", "model", "workload", "policy", "schedule", "estimate",
                "placement", "solver", "created_by"):
        assert key in plan
    from hrm.plan import SCHEMA_PATH, plan_schema

    committed = json.loads(SCHEMA_PATH.read_text())
    assert committed == plan_schema(), "regenerate: python -m hrm.plan > hrm/data/plan.schema.json"
    jsonschema.validate(plan, committed)
    assert json.loads((tmp_path / "plan.json").read_text()) == plan
    shown = _cli("show", str(tmp_path / "plan.json"))
    assert shown.returncode == 0 and "mixtral" in shown.stdout


def test_cli_infeasible_exit_3():
    out = _cli("search", "--hw", "cpu-only", "--model", "dbrx")
    assert out.returncode == 3
    assert len(out.stderr.strip().splitlines()) == 1 and "memory" in out.stderr
    out = _cli("search", "--hw", "t4", "--model", "small-mixtral", "--prompt-len", "2000000", "--gen-len", "4")
    assert out.returncode == 3 and "GPU memory" in out.stderr
