"""Issue 35: what a newcomer meets at the edges of the command line: engine flags that start
with '-', a missing optional package, curves with a repeated x."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import call

ROOT = Path(__file__).resolve().parents[1]
L4 = ("--from", "llama.cpp", "--hw", "l4", "--model", "mixtral")


def _import_json(capsys, *flags) -> dict:
    code, out, err = call(capsys, "import", *L4, "--json", *flags)
    assert code in (0, 3), err
    return json.loads(out)["policy"]


@pytest.mark.parametrize("one, words", [
    ("-ngl 99 -c 40960 -np 64 -ub 64 --n-cpu-moe 28", ["--", "-ngl", "99", "-c", "40960", "-np", "64", "-ub", "64",
                                                      "--n-cpu-moe", "28"]),
    ("-nkvo", ["-nkvo"]),                      # one flag as the one string, no --
    ("--n-cpu-moe 20", ["--n-cpu-moe=20"]),    # the = form, no --
])
def test_engine_flags_that_start_with_a_dash_are_read(capsys, one, words):
    """The words after --, or a string argparse would take for an option, give the policy the
    same flags give as one quoted string."""
    assert _import_json(capsys, *words) == _import_json(capsys, one)


def test_import_without_flags_is_one_line(capsys):
    code, out, err = call(capsys, "import", *L4)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "flags are required" in err


def test_import_help_example_runs(capsys):
    """The example in ``hrm import --help`` is a command that runs (exit 0)."""
    code, text, _ = call(capsys, "import", "--help")
    example = text.split('e.g. "', 1)[1].split('"', 1)[0]
    code, out, err = call(capsys, "import", *L4, " ".join(example.split()))
    assert code == 0, err


BLOCK = """
import sys, importlib.abc
blocked = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
from hrm_cli import main
raise SystemExit(main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def tiny_plan(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "p.json"
    from hrm_cli import main

    assert main(["search", "--hw", "l4", "--model", "tiny-mixtral", "--gen-len", "8", "--out", str(path)]) == 0
    return path


@pytest.mark.parametrize("blocked, argv, extra", [
    ("torch,safetensors", ["run", "--plan", "PLAN"], "runtime"),
    ("torch,safetensors", ["validate", "--hw", "l4", "--model", "tiny-mixtral", "--out", "OUT"], "runtime"),
    ("fastapi,uvicorn,jinja2,starlette", ["serve", "--port", "18765"], "web"),
    ("ray", ["sweep", "GRID", "--out", "OUT.parquet", "--ray"], "ray"),
])
def test_a_missing_optional_package_is_one_line_naming_its_extra(tmp_path, tiny_plan, blocked, argv, extra):
    """With the package made unimportable, the command prints one line naming the extra to
    install and exits 2, never a traceback."""
    grid = tmp_path / "g.yaml"
    grid.write_text(yaml.safe_dump({"hardware": ["l4"], "models": ["tiny-mixtral"]}))
    names = {"PLAN": str(tiny_plan), "OUT": str(tmp_path / "v"), "GRID": str(grid),
             "OUT.parquet": str(tmp_path / "r.parquet")}
    argv = [names.get(a, a) for a in argv]
    done = subprocess.run([sys.executable, "-c", BLOCK, blocked, *argv], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in done.stderr and f"hrm-moe[{extra}]" in lines[0], done.stderr


def test_a_repeated_x_in_any_curve_is_refused(tmp_path, capsys):
    """Curves nothing reads any more (kept for old profiles' hashes) are checked too."""
    base = {"name": "rep", "cpu": {"name": "x", "cores": 4, "memory_gib": 16, "memory_bandwidth_gbps": 20,
                                   "tflops": {"fp32": 0.2}}}
    for field, curve in (("cpu_copy_gbps_vs_bytes", [{"x": 1048576, "y": 16.7}, {"x": 1048576.0, "y": 36.2}]),
                         ("cpu_matmul_tflops_vs_m", {"fp32": [{"x": 1, "y": 0.02}, {"x": 1.0, "y": 0.1}]})):
        path = tmp_path / f"{field}.yaml"
        path.write_text(yaml.safe_dump({**base, "efficiency": {field: curve}}))
        code, out, err = call(capsys, "search", "--hw", path, "--model", "tiny-mixtral")
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"efficiency.{field}" in err and "appears twice" in err


@pytest.mark.parametrize("hw", ["l4"])  # l4 showed all#0 and all#3 (a100-80g, t4, h100 the same lanes)
def test_compare_bottlenecks_are_words(hw):
    """The lanes cut into pieces for the search (all#0, all#3) are named as their lane."""
    from hrm.machine.hardware import load_hardware
    from hrm.model.spec import load_model
    from hrm.pipelines.base import RESOURCE_LABELS
    from hrm.workload import make_workload
    from solver.analyses import compare_engines

    rows = compare_engines(load_hardware(hw), load_model("mixtral"), make_workload("mtbench"))
    named = [row.result.best.estimate.bottleneck for row in rows if row.result is not None]
    assert named and not any("#" in b for b in named), named
    # each starts with a lane's words
    assert all(any(b.startswith(label) for label in RESOURCE_LABELS.values()) for b in named), named
    assert any(b.startswith("one unit (no overlap) (largest: ") for b in named)  # where all#j was shown


@pytest.mark.parametrize("argv, reason", [
    (["--engine", "moe-lightning"], "engine moe-lightning runs one placement only (attn=cpu ffn=gpu)"),
    (["--engine", "ideal", "--fix", "attn=cpu", "ffn=gpu"], "--fix pins the placement"),
    (["--engine", "ideal", "--top", "0"], None),
])
def test_missing_alternatives_say_why(capsys, argv, reason):
    code, out, err = call(capsys, "search", "--hw", "l4", "--model", "mixtral", *argv)
    text = " ".join(out.split())
    assert code == 0, err
    if reason is None:  # asked for none
        assert "alternatives" not in text
    else:
        assert f"alternatives: none: {reason}" in text


def test_ideal_shows_alternatives_without_a_reason(capsys):
    code, out, _ = call(capsys, "search", "--hw", "l4", "--model", "mixtral", "--engine", "ideal")
    assert code == 0 and "alternatives (the best policy of every other placement)" in out
    assert "alternatives: none" not in out
