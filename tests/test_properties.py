"""Property tests over every loader and CLI (issue 11): whatever the input — a perturbed
hardware profile, a policy string, a set of flags, a perturbed plan — the outcome is exit 0,
or exit 2/3 with exactly one line on stderr starting with ``error:``; never a traceback and
never a hang (each example runs under an alarm).

Runs are derandomized (the same examples in CI every time); set HRM_PROPERTY_RANDOM=1 (and
HRM_PROPERTY_SCALE=10 for ten times the examples) to explore new ones.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import io
import json
import math
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hrm.machine.hardware import CHECKOUT_PROFILES_DIR
from hrm_cli import main

SCALE = float(os.environ.get("HRM_PROPERTY_SCALE", "1"))
EXAMPLE_SECONDS = 60  # one example longer than this is a hang


def examples(n: int) -> settings:
    return settings(max_examples=max(1, int(n * SCALE)), deadline=None, database=None,
                    derandomize=not os.environ.get("HRM_PROPERTY_RANDOM"),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"one example ran longer than {EXAMPLE_SECONDS} s")


def outcome(args) -> int:
    """Run ``hrm ARGS`` in-process under an alarm; assert the exit-code contract; return the code."""
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(EXAMPLE_SECONDS)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in args])
            except SystemExit as exc:  # argparse
                code = exc.code
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    text = err.getvalue()
    assert "Traceback" not in text, text
    assert code in (0, 2, 3), (code, args, text)
    if code:
        lines = text.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:"), (args, text)
    return code


WORK = Path(tempfile.mkdtemp(prefix="hrm-properties-"))
atexit.register(shutil.rmtree, WORK, ignore_errors=True)

# --- values --------------------------------------------------------------------------------
ODD = [0, -1, 1e-300, 1e308, 1e9, 22350, 1000000, True, False, None, "", "abc", "1e3", ".inf", [], {}, [1],
       {"a": 1}, 0.5, 2, 64, float("nan"), float("inf"), -float("inf")]
VALUES = st.one_of(
    st.sampled_from(ODD),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-10**20, max_value=10**20),
    st.text(max_size=8),
)
NUMBER_TEXT = st.one_of(
    st.sampled_from(["0", "-1", "1", "2", "8", "64", "nan", "inf", "-inf", "1e9", "1e308", "1e-300", "abc", "",
                     "0.5", "1.5", "12.5", "1_000", "0x10", "22350", "-0", " 7 ", "1e3", "4096", "65537"]),
    st.integers(min_value=-10, max_value=10**7).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


def leaves(data, prefix=()):
    """Every (path, value) of a nested dict/list structure."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from leaves(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from leaves(value, (*prefix, index))
    if prefix:
        yield prefix, data


def perturb(base, draw) -> dict:
    """``base`` with 1-3 fields replaced by odd values, deleted, or an unknown key added."""
    data = copy.deepcopy(base)
    paths = [p for p, _ in leaves(data)]
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths))
        node = data
        try:
            for key in path[:-1]:
                node = node[key]
            action = draw(st.sampled_from(["set", "set", "set", "delete", "add"]))
            if action == "set":
                node[path[-1]] = draw(VALUES)
            elif action == "delete" and isinstance(node, dict):
                node.pop(path[-1], None)
            elif action == "add" and isinstance(node, dict):
                node[draw(st.sampled_from(["bogus", "memory_gib", "count", "cores"]))] = draw(VALUES)
        except (KeyError, IndexError, TypeError):  # an earlier edit replaced a parent
            continue
    return data


# --- 1. hardware profiles ---------------------------------------------------------------------
PROFILES = {name: yaml.safe_load((CHECKOUT_PROFILES_DIR / f"{name}.yaml").read_text())
            for name in ("l4", "2xt4", "cpu-only")}
PROFILES["cpu-only-emulated"] = {**PROFILES["cpu-only"], "emulation": {
    "threads": 2, "tflops": {"fp32": 0.05}, "memory_bandwidth_gbps": 10, "copy_gbps": 5,
    "matmul_tflops_vs_m": {"fp32": [{"x": 1, "y": 0.01}, {"x": 64, "y": 0.05}]}}}
PROFILES["l4-measured"] = {**PROFILES["l4"], "efficiency": {
    "gpu_matmul_tflops_vs_m": {"fp16": [{"x": 1, "y": 1.0}, {"x": 256, "y": 100.0}]}},
    "cpu": {**PROFILES["l4"]["cpu"], "dispatch": {"task_s": 1e-5, "attention_s": 2e-5}}}


@examples(60)
@given(data=st.data())
def test_any_hardware_profile(data):
    name = data.draw(st.sampled_from(sorted(PROFILES)))
    profile = perturb(PROFILES[name], data.draw)
    path = WORK / "hw.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False, allow_unicode=True))
    outcome(["estimate", "--engine", "ideal", "--hw", path, "--model", "tiny-mixtral", "--policy", "N=8,mu=4", "--gen-len", "16"])


@examples(15)
@given(text=st.text(max_size=200))
def test_any_hardware_text(text):
    path = WORK / "text.yaml"
    path.write_text(text)
    outcome(["estimate", "--engine", "ideal", "--hw", path, "--model", "tiny-mixtral", "--policy", "N=8,mu=4", "--gen-len", "16"])


def at_the_ends(draw, rng):
    """A value at either end of a plausible range, or in its middle (hrm.bounds)."""
    lo = rng.lo * (1 + 1e-9) + (1e-12 if rng.lo_open else 0.0)
    return draw(st.sampled_from([lo, rng.hi, (rng.lo + rng.hi) / 2]))


@examples(12)
@given(data=st.data())
def test_extreme_but_plausible_profiles_search(data):
    """Every field at an end of its range (the solver once failed on a bandwidth of 1e-300):
    the search finds a policy or says which limit binds."""
    from hrm import bounds

    draw = data.draw
    profile = copy.deepcopy(PROFILES["l4"])
    profile["gpu"]["memory_gib"] = at_the_ends(draw, bounds.GPU_MEMORY_GIB)
    profile["cpu"]["memory_gib"] = at_the_ends(draw, bounds.CPU_MEMORY_GIB)
    for section, key in (("gpu", "memory_bandwidth_gbps"), ("cpu", "memory_bandwidth_gbps"), ("link", "h2d_gbps"),
                         ("link", "d2h_gbps"), ("link", "h2d_pageable_gbps")):
        profile[section][key] = at_the_ends(draw, bounds.BANDWIDTH_GBPS)
    for section in ("gpu", "cpu"):
        for key in profile[section]["tflops"]:
            profile[section]["tflops"][key] = at_the_ends(draw, bounds.TFLOPS)
    profile["cpu"]["cores"] = draw(st.sampled_from([1, bounds.MAX_CORES]))
    count = draw(st.sampled_from([1, bounds.MAX_GPU_COUNT]))
    profile["gpu"]["count"] = count
    if count > 1:
        profile["gpu"]["gpu_to_gpu_gbps"] = at_the_ends(draw, bounds.BANDWIDTH_GBPS)
    path = WORK / "extreme.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    outcome(["search", "--hw", path, "--model", draw(st.sampled_from(["tiny-mixtral", "mixtral"])), "--gen-len", "16",
             "--engine", draw(st.sampled_from(["ideal", "flexgen", "moe-lightning", "deepspeed-zero"]))])


# --- 2. policy strings -------------------------------------------------------------------------
KEYS = st.sampled_from(["N", "mu", "n", "attn", "ffn", "rw", "rc", "μ", "batch_size", "foo", "", "MU", "Rw", "n "])
POLICY_VALUES = st.one_of(
    st.integers(min_value=-5, max_value=2**21).map(str),
    st.sampled_from(["gpu", "cpu", "true", "1", "0", "", "nan", "inf", "-0", "1e3", "0x10", "1_000", "0.5", "1.0001"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=4),
)
ITEM = st.one_of(st.tuples(KEYS, POLICY_VALUES).map(lambda kv: f"{kv[0]}={kv[1]}"), st.text(max_size=6))
POLICY_TEXT = st.tuples(st.lists(ITEM, max_size=6), st.sampled_from([",", " ", ", "])).map(lambda t: t[1].join(t[0]))


@examples(80)
@given(policy=POLICY_TEXT)
def test_any_policy_string(policy):
    outcome(["estimate", "--engine", "ideal", "--hw", "l4", "--model", "tiny-mixtral", "--policy", policy, "--gen-len", "16"])


def valid_policy():
    return st.builds(lambda mu, n, attn, ffn, rw, rc: (
        f"mu={mu},n={n},attn={attn},ffn={ffn},rw={rw if ffn == 'gpu' else 0},rc={rc if attn == 'gpu' else 0}"),
        st.integers(1, 512), st.integers(1, 64), st.sampled_from(["gpu", "cpu"]), st.sampled_from(["gpu", "cpu"]),
        st.sampled_from([0, 0.25, 1]), st.sampled_from([0, 0.5, 1]))


@examples(25)
@given(policy=valid_policy(), hw=st.sampled_from(["l4", "cpu-only", "2xt4"]))
def test_valid_policies_estimate(policy, hw):
    """Valid policies either estimate (0) or are refused by the engine/schedule in one line."""
    outcome(["estimate", "--engine", "ideal", "--hw", hw, "--model", "tiny-mixtral", "--policy", policy, "--gen-len", "16"])


# --- 3. flag sets ------------------------------------------------------------------------------
def flag_set(draw, flags: dict) -> list[str]:
    """A random subset of ``flags`` (name -> strategy of its value, or None for a switch)."""
    chosen = draw(st.lists(st.sampled_from(sorted(flags)), unique=True, max_size=len(flags)))
    args = []
    for name in chosen:
        args.append(name)
        if flags[name] is not None:
            args.append(draw(flags[name]))
    return args


SMALL_OR_ODD = st.one_of(st.sampled_from(["0", "-1", "nan", "inf", "1e9", "abc", "", "1.5", "1000000000",
                                          "131073", "65537"]),
                         st.integers(1, 512).map(str))
MEMORY = st.one_of(NUMBER_TEXT, st.floats(0.01, 5000).map(str))
UTIL = st.one_of(NUMBER_TEXT, st.floats(0, 1.2).map(str))
COMMON = {
    "--gpu-mem": MEMORY, "--cpu-mem": MEMORY, "--gpu-util": UTIL, "--cpu-util": UTIL,
    "--prompt-len": NUMBER_TEXT, "--max-prompt-len": NUMBER_TEXT, "--gen-len": SMALL_OR_ODD,
    "--workload": st.sampled_from(["mtbench", "summarization", "nope", ""]),
    "--engine": st.sampled_from(["ideal", "flexgen", "moe-lightning", "deepspeed-zero", "warp", "", "x.yaml"]),
    "--schedule": st.sampled_from(["cgopipe", "flexgen", "sequential", "warp"]),
    "--padding": None, "--weight-dtype": st.sampled_from(["fp16", "int4", "fp8"]),
}


@examples(40)
@given(data=st.data())
def test_any_estimate_flags(data):
    flags = {**COMMON, "--explain": None, "--json": None}
    args = flag_set(data.draw, flags)
    outcome(["estimate", "--engine", "ideal", "--hw", data.draw(st.sampled_from(["l4", "cpu-only", "2xt4"])), "--model", "tiny-mixtral",
             "--policy", data.draw(st.one_of(valid_policy(), POLICY_TEXT)), *args])


@examples(25)
@given(data=st.data())
def test_any_search_flags(data):
    flags = {**COMMON, "--prompt-len": SMALL_OR_ODD, "--max-prompt-len": SMALL_OR_ODD,
             "--max-batch": st.one_of(st.sampled_from(["0", "-1", "nan", "1e9", "70000", "x"]), st.integers(1, 2048).map(str)),
             "--top": st.sampled_from(["-1", "0", "3", "1001", "x"]),
             "--objective": st.sampled_from(["generation", "decode", "latency"]),
             "--solver": st.sampled_from(["auto", "cbc", "nope"]), "--json": None}
    args = flag_set(data.draw, flags)
    fix = data.draw(st.lists(ITEM, max_size=3))
    if fix:
        args += ["--fix", *fix]
    outcome(["search", "--hw", data.draw(st.sampled_from(["l4", "cpu-only", "2xt4"])),
             "--model", data.draw(st.sampled_from(["tiny-mixtral", "small-mixtral"])), *args])


@examples(40)
@given(data=st.data())
def test_any_ops_flags(data):
    args = flag_set(data.draw, {"--mu": NUMBER_TEXT, "--context": NUMBER_TEXT, "--prompt-len": NUMBER_TEXT,
                                "--json": None})
    outcome(["ops", "--model", data.draw(st.sampled_from(["tiny-mixtral", "small-mixtral", "mixtral", "nope"])),
             *args])


@examples(15)
@given(data=st.data())
def test_any_plot_timeline_flags(data):
    flags = {"--context": NUMBER_TEXT, "--gen-len": SMALL_OR_ODD, "--prompt-len": SMALL_OR_ODD,
             "--schedule": COMMON["--schedule"], "--engine": COMMON["--engine"],
             "--dpi": st.sampled_from(["0", "-5", "50", "100000", "nan", "x"]), "--gpu-mem": MEMORY,
             "--trace-step": NUMBER_TEXT}
    args = flag_set(data.draw, flags)
    out = WORK / "timeline.png"
    outcome(["plot", "timeline", "--hw", data.draw(st.sampled_from(["l4", "cpu-only"])), "--model", "tiny-mixtral",
             "--policy", data.draw(st.one_of(valid_policy(), POLICY_TEXT)), "--out", out, *args])


# --- 4. plans ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plan_dict():
    from hrm.estimate import estimate
    from hrm.machine.hardware import load_hardware
    from hrm.model.spec import load_model
    from hrm.placement import policy_placement
    from hrm.plan import Estimate, Plan, SolverInfo, SpecRef
    from hrm.policy import parse_policy
    from hrm.workload import Workload

    hw, spec = load_hardware("cpu-only"), load_model("tiny-mixtral")
    workload = Workload(prompt_len=8, max_prompt_len=12, gen_len=3)
    policy = parse_policy("N=8,mu=4,attn=cpu,rw=0.5")
    plan = Plan(hardware=SpecRef(name="cpu-only", sha256=hw.sha256()),
                model=SpecRef(name="tiny-mixtral", sha256=spec.sha256()), workload=workload, policy=policy,
                schedule="cgopipe", estimate=Estimate(**estimate(hw, spec, workload, policy, engine="ideal").to_plan_estimate()),
                placement=policy_placement(spec, policy),
                solver=SolverInfo(name="test", seconds=0.0, optimal=True, candidates_evaluated=1), created_by="test")
    return json.loads(plan.model_dump_json())


@examples(80)
@given(data=st.data())
def test_any_plan(plan_dict, data):
    plan = perturb(plan_dict, data.draw)
    path = WORK / "plan.json"
    path.write_text(json.dumps(plan))
    code = outcome(["show", path, *data.draw(st.sampled_from([[], ["--json"]]))])
    if code == 0:  # what is accepted is consistent: finite numbers, weight_pages = n
        from hrm.plan import load_plan

        loaded = load_plan(path)
        assert loaded.placement.weight_pages == loaded.policy.num_micro_batches
        assert all(math.isfinite(v) for v in loaded.estimate.model_dump().values() if isinstance(v, float))


@examples(10)
@given(text=st.text(max_size=300))
def test_any_plan_text(text):
    path = WORK / "text.json"
    path.write_text(text)
    outcome(["show", path])
