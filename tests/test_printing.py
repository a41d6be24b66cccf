"""What the commands print: a user's name, path or note reaches every rich table literally
(markup and emoji codes off); tables fit 80 columns without cutting a value; TPOT in ms and
TTFT in s in every view; --routing says what it did to the plan."""

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from hrm.engines.engine import load_engine
from hrm.estimate import estimate
from hrm.machine.hardware import PROFILES_DIR, load_hardware
from hrm.model.spec import load_model
from hrm.policy import Policy, parse_policy
from hrm.workload import make_workload

from conftest import call

#: markup tags, a link, an emoji code and a backslash: each would be a style, a MarkupError or
#: an emoji if a printer took the name as rich markup ('/' and '\' are refused in profile and
#: engine names, so those go into the plan's path and created_by)
HOSTILE = "[bold]x[red]y :smile: [link=http:e]z"
HOSTILE_FREE = r"[bold]me[/x] \ [link=http://e]z :smile:"
POLICY = "N=512,mu=64,attn=cpu,ffn=gpu,rw=0,rc=0"
TABLE_LEFT, TABLE_RIGHT = "┏┃┡│├└┗", "┓┃┩│┤┘┛"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A hardware profile and an engine file named HOSTILE, a plan at a path with markup in it
    whose created_by is HOSTILE_FREE."""
    folder = tmp_path_factory.mktemp("printing")
    hw = yaml.safe_load((Path(PROFILES_DIR) / "l4.yaml").read_text())
    hw["name"] = HOSTILE
    (folder / "hw.yaml").write_text(yaml.safe_dump(hw, sort_keys=False))
    engine = yaml.safe_load((Path(__file__).parents[1] / "hrm/data/engines/moe-lightning.yaml").read_text())
    engine["name"] = HOSTILE
    (folder / "engine.yaml").write_text(yaml.safe_dump(engine, sort_keys=False))
    plan_dir = folder / "[bold]p["  # the path .../[bold]p[/bold].json
    plan_dir.mkdir()
    return {"hw": str(folder / "hw.yaml"), "engine": str(folder / "engine.yaml"),
            "plan": str(plan_dir / "bold].json"), "folder": folder}


@pytest.fixture(scope="module")
def plan(files):
    """The plan file (hrm-search --out), its created_by rewritten to HOSTILE_FREE."""
    from hrm_cli import main

    assert main(["search", "--hw", files["hw"], "--model", "mixtral", "--engine", "ideal", "--out", files["plan"]]) == 0
    data = json.loads(Path(files["plan"]).read_text())
    data["created_by"] = HOSTILE_FREE
    Path(files["plan"]).write_text(json.dumps(data))
    return files["plan"]


def ok(capsys, *args) -> str:
    code, out, err = call(capsys, *args)
    assert code == 0 and "Traceback" not in out + err, (code, err)
    return out


def test_hostile_hardware_and_engine_names_print_literally(capsys, files):
    for args in (["search", "--hw", files["hw"], "--model", "mixtral", "--engine", files["engine"]],
                 ["search", "--hw", files["hw"], "--model", "mixtral", "--compare"],
                 ["estimate", "--engine", "ideal", "--hw", files["hw"], "--model", "mixtral", "--policy", POLICY],
                 ["estimate", "--hw", files["hw"], "--model", "mixtral", "--policy", POLICY, "--engine",
                  files["engine"], "--explain"],
                 ["import", "--from", "llama.cpp", "-ngl 99 -np 64 -c 40960 -ub 64 --n-cpu-moe 28", "--hw", files["hw"],
                  "--model", "mixtral"]):
        out = " ".join(ok(capsys, *args).split())  # a long name may wrap inside a cell
        assert HOSTILE in out, args


def test_explain_prints_the_engine_name_literally(capsys, files):
    out = ok(capsys, "estimate", "--hw", "l4", "--model", "mixtral", "--policy", POLICY, "--engine", files["engine"],
             "--explain")
    assert f"{HOSTILE}: " in " ".join(out.split())  # the mechanisms table's title


def test_plan_path_and_created_by_print_literally(capsys, plan):
    out = " ".join(ok(capsys, "show", plan).split())
    assert f"plan {plan}" in out and HOSTILE_FREE in out
    assert ok(capsys, "export", plan, "--to", "llama.cpp").strip()


def test_ops_prints_a_model_path_literally(capsys, files):
    folder = files["folder"] / "[bold]m[red]"
    folder.mkdir(exist_ok=True)
    config = folder / "config.json"
    shutil.copy(Path(__file__).parents[1] / "hrm/data/models/tiny-mixtral.json", config)
    assert str(config) in "".join(ok(capsys, "ops", "--model", config).split())  # a long path may wrap anywhere


def test_profile_comparison_prints_names_literally(capsys, files):
    from hrm_cli.common import console
    from profiler.compare import comparison_table

    console().print(comparison_table(load_hardware(files["hw"]), load_hardware("l4")))
    out = " ".join(capsys.readouterr().out.split())
    assert f"measured ({HOSTILE}) vs reference (l4)" in out


@pytest.mark.parametrize("progress", [[], ["--no-progress"]])
def test_profile_compare_prints_the_names_literally(capsys, monkeypatch, files, progress):
    """``hrm profile --compare`` (the tiny measurement of tests/test_profiler.py) against a
    profile named HOSTILE, the measured one named HOSTILE too; the progress bar's own console."""
    from hrm_cli import profile as profile_cli
    from test_profiler import TINY

    monkeypatch.setattr(profile_cli, "quick_config", lambda: TINY)
    out_file = files["folder"] / "measured.yaml"
    out = " ".join(ok(capsys, "profile", "--quick", "--device", "cpu", "--out", out_file, "--compare", files["hw"],
                      "--disk-dir", files["folder"], "--name", HOSTILE, *progress).split())
    assert f"measured ({HOSTILE}) vs reference ({HOSTILE})" in out


def test_run_report_prints_its_title_and_note_literally(capsys):
    from runtime.report import render_comparison

    rows = [{"quantity": "prefill time", "unit": "s", "predicted": 1.0, "measured": 2.0, "error": -0.5}]
    render_comparison(rows, HOSTILE_FREE, note=HOSTILE_FREE)
    out = " ".join(capsys.readouterr().out.split())
    assert HOSTILE_FREE in out and f"note: {HOSTILE_FREE}" in out


def test_calibrate_prints_the_runs_path_literally(capsys, files):
    folder = files["folder"] / "[bold]r[red]"
    folder.mkdir(exist_ok=True)
    runs = folder / "runs.yaml"
    run = {"engine": "moe-lightning", "workload": {"prompt_len": 77, "max_prompt_len": 418, "gen_len": 128},
           "policy": "mu=120,n=10,attn=cpu,ffn=gpu,rw=0,rc=0", "measured": {"generation_throughput_tok_s": 300.0,
                                                                          "tpot_s": 2.5}}
    runs.write_text(yaml.safe_dump({"hardware": "l4", "model": "mixtral", "runs": [run]}, sort_keys=False))
    out = ok(capsys, "calibrate", runs, "--fields", "link.h2d_gbps")
    assert f"runsof{runs}" in "".join(out.split())  # a long path may wrap anywhere
    out = " ".join(out.split())
    # the runs file's TPOT (s) is printed in ms like every other view
    assert re.search(r"TPOT ms 2,?500 ", out) and "TPOT s" not in out


def test_styled_cells_are_styles_not_markup_text(capsys):
    """The red 'NO' of a policy that does not fit is a style: no markup tag in the output."""
    code, out, err = call(capsys, "estimate", "--engine", "ideal", "--hw", "l4", "--model", "mixtral", "--policy",
                          "N=4096,mu=4096,attn=gpu,ffn=gpu,rw=1,rc=1")
    assert code == 3 and "Traceback" not in err
    assert "NO: exceeds physical memory" in " ".join(out.split()) and "[red]" not in out and "[/red]" not in out


# --- 80 columns -------------------------------------------------------------------------------
def assert_fits_80(out: str) -> None:
    """No line past 80 columns, no value cut with '…', no table cropped (each line that starts
    with a table border ends with one)."""
    for line in out.splitlines():
        assert len(line) <= 80 and "…" not in line, line
        if line[:1] in TABLE_LEFT:
            assert line.rstrip()[-1:] in TABLE_RIGHT, line


@pytest.mark.parametrize("args", [
    ["search", "--hw", "l4", "--model", "mixtral", "--compare"],
    ["search", "--hw", "l4", "--model", "mixtral", "--engine", "ideal"],  # with the alternatives table
    ["ops", "--model", "mixtral"],
    ["estimate", "--hw", "l4", "--model", "mixtral", "--policy", POLICY, "--engine", "moe-lightning", "--explain"],
])
def test_tables_fit_80_columns(capsys, monkeypatch, args):
    monkeypatch.setenv("COLUMNS", "80")
    out = ok(capsys, *args)
    assert_fits_80(out)
    if "--engine" in args and "ideal" in args:
        assert "alternatives" in out


def first_cells(text: str) -> str:
    """The first column of a boxed table, its wrapped lines joined."""
    return " ".join(line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│"))


def test_compare_keeps_every_policy_whole_at_80_columns(capsys, monkeypatch):
    """Each engine's policy, read back from the wrapped cells, is the policy its search found."""
    monkeypatch.setenv("COLUMNS", "80")
    out = ok(capsys, "search", "--hw", "l4", "--model", "mixtral", "--compare")
    monkeypatch.setenv("COLUMNS", "250")
    wide = ok(capsys, "search", "--hw", "l4", "--model", "mixtral", "--compare")
    policies = re.findall(r"N=\d+, mu=\d+, n=\d+, attn=\w+, ffn=\w+, rw=[\d.e-]+, rc=[\d.e-]+", first_cells(wide))
    assert len(policies) >= 10 and all(p in first_cells(out) for p in policies)


# --- one unit per quantity ----------------------------------------------------------------------
def test_tpot_in_ms_and_ttft_in_s_in_estimate_and_search(capsys, l4):
    model, workload = load_model("mixtral"), make_workload("mtbench")
    expected = estimate(l4, model, workload, parse_policy(POLICY), engine=load_engine("ideal"))
    out = ok(capsys, "estimate", "--engine", "ideal", "--hw", "l4", "--model", "mixtral", "--policy", POLICY)
    tpot = re.search(r"TPOT \(per sequence\)\s*│\s*([\d,.]+) ms", out)
    assert tpot and float(tpot.group(1).replace(",", "")) == pytest.approx(expected.per_token_latency_s * 1e3, rel=1e-3)
    ttft = re.search(r"TTFT \(prefill\)\s*│\s*([\d.]+) s", out)
    assert ttft and float(ttft.group(1)) == pytest.approx(expected.prefill_latency_s, abs=1e-3)
    search_out = ok(capsys, "search", "--hw", "l4", "--model", "mixtral")
    for text in (out, search_out):
        assert not re.search(r"TPOT \(per sequence\)\s*│\s*[\d.]+ s", text)
        assert re.search(r"TPOT \(per sequence\)\s*│\s*[\d,.]+ ms", text)
        # beside it, the batch it is one decode step of (N of the policy shown)
        batch = re.search(r"N=(\d+)", text).group(1)
        assert f"each of its {int(batch):,} sequences one token" in " ".join(re.sub(r"[│┃]", " ", text).split())


# --- --routing ----------------------------------------------------------------------------------
def routing_line(out: str) -> str:
    cells = [line.split("│")[2].strip() for line in out.splitlines() if line.startswith("│")]
    keys = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")]
    start = keys.index("routing")
    end = next(i for i in range(start + 1, len(keys)) if keys[i])
    return " ".join(cells[start:end])


def test_routing_that_changes_the_estimate(capsys, monkeypatch, l4):
    """fiddler's experts on the CPU: a skewed routing changes which experts run where."""
    monkeypatch.setenv("COLUMNS", "250")
    out = ok(capsys, "search", "--hw", "l4", "--model", "mixtral", "--engine", "fiddler", "--routing", "zipf:1.2")
    line = routing_line(out)
    found = re.fullmatch(r"zipf:1.2: ([\d,.]+) tok/s vs ([\d,.]+) tok/s with uniform routing on the same policy", line)
    assert found, line
    plan = json.loads(ok(capsys, "search", "--hw", "l4", "--model", "mixtral", "--engine", "fiddler", "--routing",
                         "zipf:1.2", "--json"))
    uniform = estimate(l4, load_model("mixtral"), make_workload("mtbench"), Policy.model_validate(plan["policy"]),
                       engine=load_engine("fiddler"))
    assert float(found.group(2).replace(",", "")) == pytest.approx(uniform.generation_throughput_tok_s, abs=0.051)
    assert found.group(1) != found.group(2)


def test_routing_that_leaves_the_estimate_says_why(capsys, monkeypatch):
    """moe-lightning at mu=891: 891 tokens x top-2 of 8 experts touch every expert of a layer
    (uniform: 8·(1 − (6/8)^891) = 8 to 1e-100), whatever the routing."""
    monkeypatch.setenv("COLUMNS", "250")
    out = ok(capsys, "search", "--hw", "l4", "--model", "mixtral", "--routing", "zipf:1.2")
    line = routing_line(out)
    found = re.match(r"zipf:1.2: ([\d,.]+) tok/s vs ([\d,.]+) tok/s with uniform routing on the same policy "
                     r"\(unchanged: (.*)\)$", line)
    assert found and found.group(1) == found.group(2), line
    assert "all 8 experts of a layer are active" in found.group(3)


def test_no_routing_line_without_routing(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    out = ok(capsys, "search", "--hw", "l4", "--model", "mixtral")
    assert not any(line.split("│")[1].strip() == "routing" for line in out.splitlines() if line.startswith("│"))
