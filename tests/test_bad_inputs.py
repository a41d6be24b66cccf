"""Bad-input corpus (issue 11): every case is refused with exit 2 (bad input) or 3
(infeasible) and exactly one line on stderr starting with ``error:``, never a traceback.

Families: hardware YAML files, CLI flags, policy strings, plan files, output targets, and
a few config.json files end to end. Commands run in-process through :func:`hrm_cli.main`
(fast); only what needs a real process runs in a subprocess: a closed pipe, /dev/full as
stdout, FIFOs (a regression there would block, so those have a timeout).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import call
import yaml

from hrm.machine.hardware import CHECKOUT_PROFILES_DIR

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model", "tiny-mixtral"]
POLICY = "N=8,mu=4"
HAS_TORCH = True
try:  # hrm run / hrm validate need the runtime extra
    import torch  # noqa: F401
except ImportError:  # pragma: no cover
    HAS_TORCH = False


# --- helpers ---------------------------------------------------------------------------
def refused(capsys, *args, code=2, needle=""):
    rc, _, err = call(capsys, *args)
    lines = err.strip().splitlines()
    assert "Traceback" not in err, err
    assert rc == code, (rc, err)
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert needle in lines[0], (needle, lines[0])
    return lines[0]


def one_line(proc, code=2, needle=""):
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert needle in lines[0], (needle, lines[0])


def hrm(*args, timeout=60, **kw):
    return subprocess.run([sys.executable, "-m", "hrm_cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, **kw)


def set_path(data: dict, dotted: str, value):
    """``data`` with the field at ``a.b.c`` set (``value is DELETE``: removed)."""
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {}) if isinstance(node, dict) else node[int(key)]
    if isinstance(node, list):
        node[int(keys[-1])] = value
    elif value is DELETE:
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value
    return data


class _Delete:
    """The value that deletes a field; its repr is stable, so test ids match across xdist workers."""

    def __repr__(self) -> str:
        return "DELETE"


DELETE = _Delete()
L4 = yaml.safe_load((CHECKOUT_PROFILES_DIR / "l4.yaml").read_text())
CPU_ONLY = yaml.safe_load((CHECKOUT_PROFILES_DIR / "cpu-only.yaml").read_text())
EMULATION = {"threads": 2, "tflops": {"fp32": 0.05}, "memory_bandwidth_gbps": 10, "copy_gbps": 5}


def profile_file(tmp_path, base: dict, dotted: str | None = None, value=None) -> str:
    data = copy.deepcopy(base)
    if dotted:
        set_path(data, dotted, value)
    path = tmp_path / "hw.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


# --- 1. hardware YAML fields (a shipped l4 profile with one field perturbed) -------------
HW_FIELDS = [
    ("gpu.memory_gib", float("inf")), ("gpu.memory_gib", float("nan")), ("gpu.memory_gib", -1), ("gpu.memory_gib", 0),
    ("gpu.memory_gib", 1e308), ("gpu.memory_gib", 22350), ("gpu.memory_gib", True), ("gpu.memory_gib", "22"),
    ("gpu.memory_gib", None), ("gpu.memory_gib", [22]), ("gpu.memory_gib", 1e-300),
    ("gpu.memory_bandwidth_gbps", 1e-300), ("gpu.memory_bandwidth_gbps", 0), ("gpu.memory_bandwidth_gbps", 300000),
    ("gpu.memory_bandwidth_gbps", -5), ("gpu.memory_bandwidth_gbps", float("nan")),
    ("gpu.count", 1000000), ("gpu.count", 0), ("gpu.count", True), ("gpu.count", 1.5), ("gpu.count", -2),
    ("gpu.tflops.fp32", 0), ("gpu.tflops.fp32", float("inf")), ("gpu.tflops.fp16", 121000), ("gpu.tflops.fp16", True),
    ("gpu.tflops.int8", -242), ("gpu.tflops", {}), ("gpu.tflops", 30),
    ("gpu.gemm_efficiency", 1.5), ("gpu.gemm_efficiency", 0), ("gpu.memory_stream_efficiency", float("nan")),
    ("gpu.architecture", "warp"), ("gpu.gpu_to_gpu_gbps", -1), ("gpu.dispatch", {"task_s": -1e-6}),
    ("gpu.dispatch", {"task_s": 5.0}), ("gpu.dispatch", {"expert_s": float("inf")}),
    ("cpu.cores", True), ("cpu.cores", 0), ("cpu.cores", 5000), ("cpu.cores", 2.5), ("cpu.cores", "24"),
    ("cpu.cores", -1), ("cpu.memory_gib", float("inf")), ("cpu.memory_gib", 1e9), ("cpu.memory_gib", 0),
    ("cpu.memory_bandwidth_gbps", 1e-300), ("cpu.tflops.fp32", 1e-300), ("cpu.numa_nodes", 0),
    ("cpu.memcpy_one_thread_gbps", -3), ("cpu.name", None), ("cpu.name", 42),
    ("link.h2d_gbps", 1e-300), ("link.h2d_gbps", float("inf")), ("link.d2h_gbps", 0), ("link.h2d_pageable_gbps", -7.6),
    ("link.p2p", "yes"), ("link.gpus_per_pcie_switch", 0),
    ("disk", {"read_gbps": float("nan")}), ("efficiency", {"gpu_matmul_tflops_vs_m": {"fp16": [{"x": 0, "y": 1}]}}),
    ("efficiency", {"gpu_matmul_tflops_vs_m": {"fp16": [{"x": 1, "y": float("inf")}]}}),
    ("name", None), ("bogus_key", 1), ("cpu", DELETE), ("link", DELETE), ("gpu.bogus", 1),
    ("source.kind", "guessed"),
]


@pytest.mark.parametrize("dotted,value", HW_FIELDS, ids=[f"{p}={v!r}"[:60] for p, v in HW_FIELDS])
def test_hardware_field_refused(tmp_path, capsys, dotted, value):
    path = profile_file(tmp_path, L4, dotted, value)
    line = refused(capsys, "estimate", "--engine", "ideal", "--hw", path, *TINY, "--policy", POLICY)
    assert path in line  # names the file ...
    field = dotted.split(".")[0] if value is DELETE or dotted == "bogus_key" else dotted.split(".")[-1]
    if dotted not in ("gpu.tflops", "disk", "efficiency", "gpu.dispatch"):
        assert field in line  # ... and the field


@pytest.mark.parametrize("dotted,value", [
    ("emulation", {**EMULATION, "threads": 0}), ("emulation", {**EMULATION, "threads": True}),
    ("emulation", {**EMULATION, "copy_gbps": float("inf")}), ("emulation", {**EMULATION, "tflops": {"fp32": -1}}),
    ("cpu.dispatch", {"attention_s": 3600}),
])
def test_cpu_only_profile_field_refused(tmp_path, capsys, dotted, value):
    path = profile_file(tmp_path, CPU_ONLY, dotted, value)
    refused(capsys, "estimate", "--engine", "ideal", "--hw", path, *TINY, "--policy", POLICY, needle=dotted.split(".")[0])


@pytest.mark.parametrize("content,needle", [
    (b"name: x\ncpu: [unclosed\n", "malformed YAML"),
    (b"", "expected a mapping"),
    (b"- 1\n- 2\n", "expected a mapping"),
    (b"just a string\n", "expected a mapping"),
    (b"name: l4\xff\xfe\ncpu: {}\n", "not UTF-8"),
    (b"name: x\0\n", "NUL"),
    (b"\xff\xfen\x00a\x00m\x00e\x00", "UTF-16"),
    (b"name: x\nsource: {date: 2024-02-30}\n", "malformed YAML"),
    (b"[" * 5000 + b"]" * 5000, "YAML"),
    (b"name: x\ncpu: {name: c, cores: 2, memory_gib: 8, memory_bandwidth_gbps: 1e3, tflops: {fp32: 1}}\n", "1.0e3"),
    (b"name: x\ncpu: {name: c, cores: 2, memory_gib: .inf, memory_bandwidth_gbps: 10, tflops: {fp32: 1}}\n",
     "memory_gib"),
    (b"name: x\ncpu: {name: c, cores: 2, memory_gib: 1e308, memory_bandwidth_gbps: 10, tflops: {fp32: 1}}\n",
     "memory_gib"),
    (b"name: x\ngpu: {name: g, memory_gib: 16, memory_bandwidth_gbps: 100, tflops: {fp32: 1}}\n"
     b"cpu: {name: c, cores: 2, memory_gib: 8, memory_bandwidth_gbps: 10, tflops: {fp32: 1}}\n", "link"),
    (b"name: x\ngpu: {name: g, count: 2, memory_gib: 16, memory_bandwidth_gbps: 100, tflops: {fp32: 1}}\n"
     b"cpu: {name: c, cores: 2, memory_gib: 8, memory_bandwidth_gbps: 10, tflops: {fp32: 1}}\n"
     b"link: {h2d_gbps: 10, d2h_gbps: 10}\n", "gpu_to_gpu_gbps"),
])
def test_hardware_file_refused(tmp_path, capsys, content, needle):
    path = tmp_path / "hw.yaml"
    path.write_bytes(content)
    refused(capsys, "estimate", "--engine", "ideal", "--hw", path, *TINY, "--policy", POLICY, needle=needle)


@pytest.mark.parametrize("hw,needle", [
    ("/nonexistent/dir/l4.yaml", "no such file"),
    ("./no-such-profile.yaml", "no such file"),
    ("l5", "not found"),
    ("", "empty"),
    ("   ", "empty"),
    ("hardware_profiles", "directory"),
    ("/dev/null", "character device"),
])
def test_hardware_path_refused(capsys, hw, needle):
    refused(capsys, "estimate", "--engine", "ideal", "--hw", hw, *TINY, "--policy", POLICY, needle=needle)


def test_hardware_directory_given_as_file(tmp_path, capsys):
    refused(capsys, "estimate", "--engine", "ideal", "--hw", tmp_path, *TINY, "--policy", POLICY, needle="a directory")


# the issue's own examples, as files (tests/data/bad/EXPECT: file and the needle of its error line)
BAD_DIR = ROOT / "tests" / "data" / "bad"
FIXTURES = [line.split(None, 1) for line in (BAD_DIR / "EXPECT").read_text().splitlines()
            if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("name,needle", FIXTURES, ids=[name for name, _ in FIXTURES])
def test_fixture_refused(capsys, name, needle):
    path = BAD_DIR / name
    if name.endswith(".yaml"):
        line = refused(capsys, "search", "--hw", path, *TINY, "--gen-len", "8", needle=needle)
    else:
        line = refused(capsys, "show", path, needle=needle)
    assert str(path) in line


# --- 2. flags -----------------------------------------------------------------------------
EST = ["estimate", "--engine", "ideal", "--hw", "l4", *TINY, "--policy", POLICY]
SEARCH = ["search", "--hw", "l4", *TINY, "--gen-len", "8"]
FLAG_CASES = [
    (EST + ["--gpu-mem", "inf"], "--gpu-mem"), (EST + ["--gpu-mem", "nan"], "--gpu-mem"),
    (EST + ["--gpu-mem", "-1"], "--gpu-mem"), (EST + ["--gpu-mem", "0"], "--gpu-mem"),
    (EST + ["--gpu-mem", "1e308"], "--gpu-mem"), (EST + ["--gpu-mem", "22350"], "--gpu-mem"),
    (EST + ["--gpu-mem", "lots"], "--gpu-mem"), (EST + ["--cpu-mem", "inf"], "--cpu-mem"),
    (EST + ["--cpu-mem", "nan"], "--cpu-mem"), (EST + ["--cpu-mem", "-5"], "--cpu-mem"),
    (EST + ["--cpu-mem", "1e9"], "--cpu-mem"), (EST + ["--gpu-util", "0"], "--gpu-util"),
    (EST + ["--gpu-util", "1.5"], "--gpu-util"), (EST + ["--gpu-util", "nan"], "--gpu-util"),
    (EST + ["--cpu-util", "-0.1"], "--cpu-util"), (EST + ["--cpu-util", "inf"], "--cpu-util"),
    (EST + ["--prompt-len", "0"], "--prompt-len"), (EST + ["--prompt-len", "-5"], "--prompt-len"),
    (EST + ["--prompt-len", "abc"], "--prompt-len"), (EST + ["--prompt-len", "1e9"], "--prompt-len"),
    (EST + ["--gen-len", "0"], "--gen-len"), (EST + ["--gen-len", "1000000000"], "--gen-len"),
    (EST + ["--gen-len", "1e9"], "--gen-len"), (EST + ["--gen-len", "12.5"], "--gen-len"),
    (EST + ["--max-prompt-len", "-1"], "--max-prompt-len"),
    (EST + ["--prompt-len", "500", "--max-prompt-len", "400"], "max_prompt_len"),
    (EST + ["--prompt-len", "16777000", "--gen-len", "1000"], "max_prompt_len + gen_len"),
    # past the model's own context window (config.json max_position_embeddings)
    (["search", "--hw", "l4", "--model", "mixtral", "--gen-len", "32351"], "context window of model mixtral-8x7b"),
    (["search", "--hw", "l4", "--model", "olmoe", "--workload", "summarization", "--gen-len", "2113"],
     "at most --gen-len 2112"),
    (["estimate", "--engine", "ideal", "--hw", "l4", "--model", "deepseek-moe-16b", "--policy", POLICY, "--prompt-len", "4000",
      "--gen-len", "97"], "--max-prompt-len + --gen-len"),
    (EST + ["--workload", "nope"], "--workload"), (EST + ["--engine", "warp-drive"], "warp-drive"),
    (EST + ["--engine", ""], "engine"), (EST + ["--schedule", "warp-drive"], "--schedule"),
    (EST + ["--engine", "flexgen", "--schedule", "sequential"], "--schedule"),
    (EST + ["--weight-dtype", "fp8"], "--weight-dtype"),
    (["estimate", "--engine", "ideal", "--hw", "cpu-only", *TINY, "--policy", POLICY, "--gpu-mem", "8"], "no GPU"),
    (["estimate", "--engine", "ideal", "--hw", "l4", "--model", "", "--policy", POLICY], "model"),
    (SEARCH + ["--top", "-1"], "--top"), (SEARCH + ["--top", "1e9"], "--top"),
    (SEARCH + ["--max-batch", "0"], "--max-batch"), (SEARCH + ["--max-batch", "-1"], "--max-batch"),
    (SEARCH + ["--max-batch", "1000000000000"], "--max-batch"),
    (SEARCH + ["--fix", "mu=36", "mu=48"], "twice"), (SEARCH + ["--fix", "mu=4", "μ=8"], "twice"),
    (SEARCH + ["--fix", "N=0"], "N"), (SEARCH + ["--fix", "rw=2"], "rw"), (SEARCH + ["--fix", "rw=nan"], "rw"),
    (SEARCH + ["--fix", "rc=0.5", "attn=cpu"], "attn=gpu"), (SEARCH + ["--fix", "rw=0.5", "ffn=cpu"], "ffn=gpu"),
    (SEARCH + ["--fix", "N=100", "mu=7"], "multiple"), (SEARCH + ["--fix", "N=64", "mu=8", "n=4"], "!="),
    (SEARCH + ["--fix", "foo=1"], "unknown key"), (SEARCH + ["--fix", "mu"], "KEY=VALUE"),
    (SEARCH + ["--solver", "gurobi"], "--solver"), (SEARCH + ["--objective", "latency"], "--objective"),
    (["ops", *TINY, "--mu", "-8"], "--mu"), (["ops", *TINY, "--mu", "0"], "--mu"),
    (["ops", *TINY, "--context", "0"], "--context"), (["ops", *TINY, "--context", "nan"], "--context"),
    (["ops", *TINY, "--prompt-len", "-1"], "--prompt-len"), (["ops", "--model", "nope-model"], "unknown model"),
    (["plot", "timeline", "--hw", "l4", *TINY, "--context", "nan", "--out", "x.png"], "--context"),
    (["plot", "timeline", "--hw", "l4", *TINY, "--context", "inf", "--out", "x.png"], "--context"),
    (["plot", "timeline", "--hw", "l4", *TINY, "--context", "-1", "--out", "x.png"], "--context"),
    (["plot", "timeline", "--hw", "l4", *TINY, "--context", "0", "--out", "x.png"], "--context"),
    (["plot", "timeline", "--hw", "l4", *TINY, "--trace-step", "-1", "--out", "x.png"], "--trace-step"),
    (["plot", "timeline", "--hw", "l4", *TINY, "--trace", "/nonexistent/t.json", "--out", "x.png"], "--trace"),
    (["plot", "timeline", "--hw", "l4", *TINY, "--policy", "N=8,mu=3", "--out", "x.png"], "multiple"),
    (["plot", "roofline", "--hw", "l4", *TINY, "--dpi", "0", "--out", "x.png"], "--dpi"),
    (["plot", "roofline", "--hw", "l4", *TINY, "--dpi", "100000", "--out", "x.png"], "--dpi"),
    (["plot", "roofline", "--hw", "l4", *TINY, "--kv-dtypes", "fp99", "--out", "x.png"], "--kv-dtypes"),
    (["plot", "roofline", "--hw", "l4", *TINY, "--batch-sizes", "0,16", "--out", "x.png"], "--batch-sizes"),
    (["plot", "roofline", "--hw", "l4", *TINY, "--batch-sizes", "1.5", "--out", "x.png"], "--batch-sizes"),
    (["plot", "roofline", "--hw", "l4", *TINY, "--micro-batch", "0", "--out", "x.png"], "--micro-batch"),
    (["plot", "roofline", "--hw", "l4", *TINY, "--context", "-4", "--out", "x.png"], "--context"),
    (["plot", "policy-map", *TINY, "--bandwidths", "1e-300", "--out", "x.png"], "--bandwidths"),
    (["plot", "policy-map", *TINY, "--bandwidths", "nan", "--out", "x.png"], "--bandwidths"),
    (["plot", "policy-map", *TINY, "--bandwidths", "a,b", "--out", "x.png"], "--bandwidths"),
    (["plot", "policy-map", *TINY, "--bandwidths", ",", "--out", "x.png"], "--bandwidths"),
    (["plot", "policy-map", *TINY, "--cpu-scales", "0", "--out", "x.png"], "--cpu-scales"),
    (["plot", "policy-map", *TINY, "--cpu-scales", "1e9", "--out", "x.png"], "--cpu-scales"),
    (["plot", "policy-map", *TINY, "--cpu-scales", "1,1", "--out", "x.png"], "twice"),
    (["plot", "policy-map", *TINY, "--cpu-scales", "1000", "--out", "x.png"], "cpu.memory_gib"),
    (["plot", "policy-map", "--hw", "cpu-only", *TINY, "--out", "x.png"], "no GPU"),
    (["plot", "cpu-memory", "--hw", "l4", *TINY, "--cpu-mems", "-1", "--out", "x.png"], "--cpu-mems"),
    (["plot", "cpu-memory", "--hw", "l4", *TINY, "--cpu-mems", "inf", "--out", "x.png"], "--cpu-mems"),
    (["plot", "cpu-memory", "--hw", "l4", *TINY, "--schedules", "warp", "--out", "x.png"], "--schedules"),
    (["plot", "warp", "--out", "x.png"], "plot"),
    (["show"], "plan"), (["estimat"], "did you mean 'estimate'"),
    (["profile", "--budget", "0"], "--budget"), (["profile", "--budget", "nan"], "--budget"),
    (["profile", "--budget", "-3"], "--budget"), (["profile", "--budget", "1e9"], "--budget"),
    (["profile", "--name", "", "--out", "p.yaml"], "--name"),
    (["profile", "--gguf", "model.gguf"], "--gguf: needs --llama-cpp"),
]


@pytest.mark.parametrize("args,needle", FLAG_CASES, ids=[" ".join(a[:1] + a[-2:])[:60] for a, _ in FLAG_CASES])
def test_flag_refused(tmp_path, monkeypatch, capsys, args, needle):
    monkeypatch.chdir(tmp_path)  # plot --out x.png, profile --out p.yaml land here (never written)
    refused(capsys, *args, needle=needle)
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "p.yaml").exists()


@pytest.mark.skipif(not HAS_TORCH, reason="hrm run / validate need torch")
@pytest.mark.parametrize("args,needle", [
    (["validate", "--hw", "cpu-only", "--repeats", "0"], "--repeats"),
    (["validate", "--hw", "cpu-only", "--policies", "0"], "--policies"),
    (["validate", "--hw", "cpu-only", "--policies", "3"], "at least 8"),
    (["validate", "--hw", "cpu-only", "--gen-len", "-1"], "--gen-len"),
    (["validate", "--hw", "cpu-only", "--prompt-len", "1000000"], "--prompt-len"),
    (["validate", "--hw", "cpu-only", "--repeats", "1000000"], "--repeats"),
    (["validate", "--hw", "cpu-only", "--seed", "-1"], "--seed"),
    (["validate", "--hw", "cpu-only", "--out", "/dev/null/dir"], "--out"),
    (["validate", "--hw", "cpu-only", "--out", ""], "--out"),
    (["validate", "--hw", "cpu-only", "--model", "deepseek-v2-lite"], "MLA"),
    (["run", "--plan", "/nonexistent/plan.json"], "cannot read"),
])
def test_runtime_flag_refused(capsys, args, needle):
    refused(capsys, *args, needle=needle)


@pytest.mark.parametrize("args", [
    ["search", "--hw", "cpu-only", "--model", "dbrx", "--gen-len", "8"],
    ["search", "--hw", "l4", "--model", "mixtral", "--gen-len", "8", "--gpu-mem", "0.5", "--cpu-mem", "4"],
    ["search", "--hw", "t4", "--model", "small-mixtral", "--prompt-len", "2000000", "--gen-len", "4"],
])
def test_infeasible_exit_3(capsys, args):
    refused(capsys, *args, code=3, needle="memory")


# --- 3. policy strings --------------------------------------------------------------------
POLICIES = [
    ("N=8,mu=4,rc=0.5", "attn=gpu"), ("N=8,mu=4,ffn=cpu,rw=0.5", "ffn=gpu"), ("N=0,mu=4", "N"),
    ("N=8,mu=-1", "mu"), ("N=8,mu=4,rw=nan", "rw"), ("N=8,mu=4,rw=inf", "rw"), ("N=8,mu=4,attn=gpu,rc=-0.1", "rc"),
    ("N=1073741824,mu=1", "N"), ("mu=8,n=8,N=65", "!="), ("N=8,mu=4,mu=4", "twice"), ("N=64.5,mu=8", "integer"),
    ("N=8,mu=4,attn=maybe", "attn"), ("", "two of N"), ("N=64", "two of N"), ("=5", "unknown key"),
    ("N=,mu=4", "integer"), ("N=8,mu=1e3", "integer"), ("N=8 mu=4 foo=1", "unknown key"), ("N=8,mu=3", "multiple"),
    ("mu=1048576,n=1048576", "N"), ("N=8,n=3", "multiple"), ("N=8,mu=4,rw=1.0001", "rw"), ("N=8,mu=4,ffn=", "ffn"),
    ("N=true,mu=4", "integer"), ("N=8;mu=4", "integer"),
]


@pytest.mark.parametrize("policy,needle", POLICIES, ids=[p or "(empty)" for p, _ in POLICIES])
def test_policy_refused(capsys, policy, needle):
    line = refused(capsys, *EST[:-1], policy, needle=needle)
    assert line.startswith("error: policy:")


def test_policy_outside_the_engine(capsys):
    # FlexGen computes every expert on the GPU (fused_moe, moe_pytorch_backend.py:611-625); its
    # CPU attention is no longer outside it (engine flexgen-cpu-attn: policy.attention_engines)
    refused(capsys, "estimate", "--hw", "l4", *TINY, "--policy", "N=8,mu=4,attn=gpu,ffn=cpu", "--engine", "flexgen",
            needle="flexgen")
    refused(capsys, "estimate", "--hw", "l4", *TINY, "--policy", "N=8,mu=4,attn=gpu", "--engine", "flexgen-cpu-attn",
            needle="flexgen-cpu-attn")


# --- 4. plan files ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plan_dict():
    """A valid plan: cpu-only, tiny-mixtral, N=8 mu=4 attn=cpu rw=0.5 (4 of 8 experts on the GPU)."""
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


def plan_file(tmp_path, data) -> Path:
    path = tmp_path / "plan.json"
    if isinstance(data, bytes):
        path.write_bytes(data)
    elif isinstance(data, str):
        path.write_text(data)
    else:
        path.write_text(json.dumps(data))
    return path


def test_the_base_plan_is_accepted(tmp_path, capsys, plan_dict):
    rc, out, err = call(capsys, "show", plan_file(tmp_path, plan_dict))
    assert rc == 0 and err == "", err


PLAN_EDITS = [
    ("schema_version", "99", "schema version"), ("schema_version", 1.0, "schema_version"),
    ("schedule", "warp-drive", "warp-drive"), ("schedule", "flexgen", "schedule"), ("engine", "warp", "unknown engine"),
    ("engine", "flexgen", "schedule"), ("engine", "", "engine"),
    ("placement.layers.0.gpu_experts", [0, 0], "listed twice"), ("placement.layers.0.gpu_experts", [], "placement"),
    ("placement.layers.0.gpu_experts", [-1], "gpu_experts"), ("placement.layers.0.gpu_experts", [99], "expert 99"),
    ("placement.layers.0.gpu_experts", [True], "gpu_experts"), ("placement.layers.0.layer", 99, "layer 99"),
    ("placement.layers.1.layer", 0, "layer 0 listed twice"), ("placement.layers", [], "placement"),
    ("placement.weight_pages", -3, "weight_pages"), ("placement.weight_pages", 0, "weight_pages"),
    ("placement.weight_pages", 5, "weight_pages"), ("placement.weights_gpu_ratio_realised", 5, "realised"),
    ("placement.weights_gpu_ratio_realised", -0.5, "realised"),
    ("placement.weights_gpu_ratio_realised", float("nan"), "realised"),
    ("placement.weights_gpu_ratio_realised", 0.25, "realised"),
    ("policy.batch_size", 16, "N=16 != mu=4"), ("policy.kv_gpu_ratio", 0.5, "attn=gpu"),
    ("policy.weights_gpu_ratio", 0.75, "rw="), ("policy.attn_on_gpu", "yes", "attn_on_gpu"),
    ("policy.micro_batch_size", 0, "micro_batch_size"), ("policy.ffn_on_gpu", False, "ffn"),
    ("estimate.generation_throughput_tok_s", 1e9, "stale"), ("estimate.gpu_peak_bytes", 1.0, "stale"),
    ("estimate.prefill_latency_s", -1.0, "prefill_latency_s"), ("estimate.decode_layer_latency_s", float("nan"), "finite"),
    ("estimate.breakdown.resource_layer_s.cpu", float("nan"), "breakdown.resource_layer_s.cpu"),
    ("estimate.bottleneck", "the flux capacitor", "bottleneck"), ("estimate.bottleneck", "", "bottleneck"),
    ("workload.gen_len", 0, "gen_len"), ("workload.gen_len", 4, "stale"), ("workload.max_prompt_len", 4, "max_prompt_len"),
    ("workload.padding", "yes", "padding"), ("hardware.sha256", "abc", "sha256"), ("model.sha256", "Z" * 64, "sha256"),
    ("hardware.name", "", "name"), ("solver.seconds", -1, "seconds"), ("solver.seconds", float("inf"), "seconds"),
    ("solver.candidates_evaluated", -5, "candidates_evaluated"), ("solver.optimal", "yes", "optimal"),
    ("created_by", "", "created_by"), ("created_by", "a\nb", "created_by"), ("bogus", 1, "bogus"),
    ("estimate", DELETE, "estimate"), ("policy", [], "policy"),
]


@pytest.mark.parametrize("dotted,value,needle", PLAN_EDITS, ids=[f"{p}={v!r}"[:50] for p, v, _ in PLAN_EDITS])
def test_plan_edit_refused(tmp_path, capsys, plan_dict, dotted, value, needle):
    data = set_path(copy.deepcopy(plan_dict), dotted, value)
    path = plan_file(tmp_path, data)
    line = refused(capsys, "show", path, needle=needle)
    assert str(path) in line


@pytest.mark.parametrize("content,needle", [
    (b"", "malformed JSON"), (b"{", "malformed JSON"), (b"[1, 2]", "expected a JSON object"), (b"null", "JSON object"),
    (b'{"a": 1, "a": 2}', "duplicate key"), (b"\xff\xfe{}", "UTF"), (b'{"x": "\xe9"}', "not UTF-8"),
    (b"{\0}", "NUL"), (b"[" * 100000 + b"]" * 100000, "malformed JSON"), (b"1" * 5000, "malformed JSON"),
])
def test_plan_file_refused(tmp_path, capsys, content, needle):
    refused(capsys, "show", plan_file(tmp_path, content), needle=needle)


def test_plan_with_infinity_literal(tmp_path, capsys, plan_dict):
    text = json.dumps(plan_dict).replace('"prefill_latency_s": ', '"prefill_latency_s": Infinity, "x": ', 1)
    refused(capsys, "show", plan_file(tmp_path, text))


@pytest.mark.parametrize("content,needle", [
    ("{", "malformed JSON"), ('{"events": []}', "traceEvents"), ('{"traceEvents": [5]}', "traceEvents[0]"),
    ('{"traceEvents": [{"ph": "X", "name": "t", "ts": NaN, "dur": 1}]}', "ts"),
    ('{"traceEvents": [{"ph": "X", "name": "t", "ts": 0, "dur": -1}]}', "dur"),
    ('{"traceEvents": [{"ph": "X", "name": "t", "ts": 0, "dur": 1, "args": {"step": -1}}]}', "step"),
    ('{"traceEvents": [{"ph": "X", "name": "t", "ts": 0, "dur": 1, "args": {"phase": "decode", "step": 1}}]}',
     "layer"),
    ('{"traceEvents": [{"ph": "X", "ts": 0, "dur": 1}]}', "name"),
    ('{"traceEvents": [], "metadata": {"policy": 5}}', "metadata.policy"),
    ('{"traceEvents": [{"ph": "M", "name": "thread_name", "args": {}}]}', "args.name"),
])
def test_trace_refused(tmp_path, capsys, content, needle):
    trace = tmp_path / "trace.json"
    trace.write_text(content)
    refused(capsys, "plot", "timeline", "--hw", "l4", *TINY, "--policy", POLICY, "--trace", trace,
            "--out", tmp_path / "t.png", needle=needle)
    assert not (tmp_path / "t.png").exists()


def test_plan_directory_refused(tmp_path, capsys):
    refused(capsys, "show", tmp_path, needle="a directory")


def test_plan_refused_by_plot_timeline(tmp_path, capsys, plan_dict):
    path = plan_file(tmp_path, set_path(copy.deepcopy(plan_dict), "schedule", "warp-drive"))
    refused(capsys, "plot", "timeline", "--hw", "cpu-only", *TINY, "--plan", path, "--out", tmp_path / "t.png",
            needle="warp-drive")
    assert not (tmp_path / "t.png").exists()


@pytest.mark.skipif(not HAS_TORCH, reason="hrm run needs torch")
@pytest.mark.parametrize("dotted,value,needle", [
    ("policy.batch_size", 16, "N=16"), ("placement.layers.0.gpu_experts", [0, 0], "listed twice"),
    ("estimate.cpu_peak_bytes", 1.0, "stale"), ("schema_version", "99", "schema version"),
])
def test_run_refuses_what_it_cannot_execute(tmp_path, capsys, plan_dict, dotted, value, needle):
    path = plan_file(tmp_path, set_path(copy.deepcopy(plan_dict), dotted, value))
    refused(capsys, "run", "--plan", path, "--device", "cpu", needle=needle)


@pytest.mark.skipif(not HAS_TORCH, reason="hrm run needs torch")
def test_run_refuses_bad_flags_before_running(tmp_path, capsys, plan_dict):
    path = plan_file(tmp_path, plan_dict)
    refused(capsys, "run", "--plan", path, "--requests", "0", needle="--requests")
    refused(capsys, "run", "--plan", path, "--seed", "-1", needle="--seed")
    refused(capsys, "run", "--plan", path, "--trace", "/proc/trace.json", needle="--trace")
    refused(capsys, "run", "--plan", path, "--trace", tmp_path, needle="directory")
    refused(capsys, "run", "--plan", path, "--checkpoint", "/nonexistent/ckpt", needle="--checkpoint")


# --- 5. output targets --------------------------------------------------------------------
@pytest.mark.parametrize("out,needle", [
    ("", "empty"), ("/proc/plan.json", "cannot write"), ("/nonexistent/dir/p.json", "does not exist"),
    ("/dev/full", "character device"), ("/etc/hostname/p.json", "Not a directory"), ("TMP", "directory"),
    ("TMP/" + "x" * 300 + ".json", "name too long"),
])
def test_search_out_refused_before_the_search(tmp_path, capsys, out, needle):
    out = out.replace("TMP", str(tmp_path))
    refused(capsys, *SEARCH, "--out", out, needle=needle)


def test_plot_csv_and_png_all_or_nothing(tmp_path, monkeypatch, capsys):
    csv = tmp_path / "ok.csv"
    cpu_mem = ["plot", "cpu-memory", "--hw", "l4", *TINY, "--gen-len", "8", "--cpu-mems", "10,20"]
    refused(capsys, *cpu_mem, "--csv", csv, "--out", "/proc/x.png", needle="--out")
    refused(capsys, *cpu_mem, "--csv", "/proc/x.csv", "--out", tmp_path / "x.png", needle="--csv")
    refused(capsys, *cpu_mem, "--csv", tmp_path / "same", "--out", tmp_path / "same", needle="same file")
    # a failure while writing (here: the PNG's folder vanishes after the check) leaves neither file
    import hrm_cli.plot as plot

    sub = tmp_path / "sub"
    sub.mkdir()
    real = plot.png_bytes

    def png_then_remove_folder(fig, dpi):
        data = real(fig, dpi)
        sub.rmdir()
        return data

    monkeypatch.setattr(plot, "png_bytes", png_then_remove_folder)
    refused(capsys, *cpu_mem, "--csv", csv, "--out", sub / "x.png")
    assert not csv.exists() and list(tmp_path.iterdir()) == []


def test_write_files_atomic_all_or_nothing(tmp_path):
    from hrm.errors import HRMError
    from hrm.plan import write_files_atomic

    (tmp_path / "d").mkdir()
    with pytest.raises(HRMError, match="cannot write"):
        write_files_atomic([(tmp_path / "a.csv", "a"), (tmp_path / "d", "b")])  # a directory as the second target
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"] and list((tmp_path / "d").iterdir()) == []
    with pytest.raises(HRMError, match="does not exist"):
        write_files_atomic([(tmp_path / "a.csv", "a"), (tmp_path / "missing" / "b.png", b"b")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


@pytest.mark.skipif(not HAS_TORCH, reason="hrm validate needs torch")
def test_validate_out_checked_before_the_runs(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("")
    refused(capsys, "validate", "--hw", "cpu-only", "--out", target, needle="not a folder")
    refused(capsys, "validate", "--hw", "cpu-only", "--out", "/proc", needle="cannot write")


def test_profile_out_refused_before_measuring(tmp_path, capsys):
    refused(capsys, "profile", "--out", tmp_path, needle="directory")
    refused(capsys, "profile", "--out", "/proc/p.yaml", needle="cannot write")
    refused(capsys, "profile", "--out", "", needle="empty")


# --- 6. config.json end to end (the model loader's own corpus: tests/test_config_json.py) -----
@pytest.mark.parametrize("edit,needle", [
    ({"hidden_size": float("nan")}, "hidden_size"), ({"num_hidden_layers": -2}, "num_hidden_layers"),
    ({"num_local_experts": True}, "num_local_experts"),
])
def test_config_json_end_to_end(tmp_path, capsys, edit, needle):
    cfg = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": 100, "intermediate_size": 128, "num_local_experts": 4, "num_experts_per_tok": 2, **edit}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    refused(capsys, "estimate", "--engine", "ideal", "--hw", "l4", "--model", tmp_path / "config.json", "--policy", POLICY, needle=needle)


# --- 7. what needs a real process: pipes, /dev/full, FIFOs ------------------------------------
@pytest.fixture(scope="module")
def plan_path(tmp_path_factory, plan_dict):
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    path.write_text(json.dumps(plan_dict))
    return path


@pytest.mark.parametrize("args", [["show", "PLAN", "--json"], ["ops", *TINY, "--json"], ["--help"]])
def test_closed_pipe_ends_quietly(plan_path, args):
    """``| head -0``: the reader is gone before the output; no traceback, no message, exit 0."""
    args = [str(plan_path) if a == "PLAN" else a for a in args]
    proc = subprocess.Popen([sys.executable, "-m", "hrm_cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=ROOT)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == "", err


def test_search_json_into_a_closed_pipe():
    proc = subprocess.run(f"{sys.executable} -m hrm_cli search --hw l4 --model tiny-mixtral --gen-len 8 --json | head -0",
                          shell=True, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          executable="/bin/bash" if Path("/bin/bash").exists() else None)
    assert "Traceback" not in proc.stderr and proc.stderr == "", proc.stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("args", [["show", "PLAN", "--json"], ["search", "--hw", "l4", *TINY, "--gen-len", "8", "--json"]])
def test_full_disk_as_stdout(plan_path, args):
    args = [str(plan_path) if a == "PLAN" else a for a in args]
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "hrm_cli", *args], stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=120, cwd=ROOT)
    one_line(proc, needle="No space left")


@pytest.fixture
def fifo(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    path = tmp_path / "pipe.yaml"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("args,needle", [
    (["estimate", "--engine", "ideal", "--hw", "FIFO", *TINY, "--policy", POLICY], "FIFO"),
    (["show", "FIFO"], "FIFO"),
    (["estimate", "--engine", "ideal", "--hw", "l4", "--model", "FIFO", "--policy", POLICY], "FIFO"),
    (["plot", "timeline", "--hw", "l4", *TINY, "--policy", POLICY, "--trace", "FIFO", "--out", "x.png"], "FIFO"),
    (["search", "--hw", "l4", *TINY, "--out", "FIFO"], "FIFO"),
])
def test_fifo_never_opened(fifo, tmp_path, args, needle):
    args = [str(fifo) if a == "FIFO" else str(tmp_path / a) if a == "x.png" else a for a in args]
    one_line(hrm(*args, timeout=60), needle=needle)


def test_generation_up_to_the_context_window(capsys):
    """--gen-len right at the model's window is planned (the decode steps are summed in
    closed form, so this is a second's work), one token more is refused."""
    code, out, _ = call(capsys, "search", "--hw", "l4", "--model", "mixtral", "--gen-len", "32350", "--json")
    assert code == 0 and json.loads(out)["workload"]["gen_len"] == 32350
    refused(capsys, "search", "--hw", "l4", "--model", "mixtral", "--gen-len", "32351", needle="at most --gen-len 32350")


def test_bare_hrm_is_a_one_line_error_after_the_usage(capsys):
    code, out, err = call(capsys)
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1].startswith("error: a subcommand is required")
    code, out, err = call(capsys, "--help")
    assert code == 0 and out.startswith("usage: hrm") and err == ""
