"""``hrm run`` and ``hrm validate``: plans are hash-checked, outputs written, errors one line."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from hrm_cli import main as hrm_main  # noqa: E402
from hrm.estimate import estimate  # noqa: E402
from hrm.machine.hardware import load_hardware  # noqa: E402
from hrm.model.spec import load_model  # noqa: E402
from hrm.plan import Estimate, Plan, SolverInfo, SpecRef, save_plan  # noqa: E402
from hrm.policy import parse_policy  # noqa: E402
from hrm.workload import Workload  # noqa: E402
from hrm.placement import policy_placement as round_robin_placement  # noqa: E402


def make_plan(path, policy_text="N=8,mu=4,attn=cpu,rw=0.5", model_sha=None, hw_sha=None):
    hw = load_hardware("cpu-only")
    spec = load_model("tiny-mixtral", "bf16", "bf16")
    workload = Workload(prompt_len=8, max_prompt_len=12, gen_len=3)
    policy = parse_policy(policy_text)
    est = estimate(hw, spec, workload, policy, engine="ideal")
    plan = Plan(
        hardware=SpecRef(name="cpu-only", sha256=hw_sha or hw.sha256()),
        model=SpecRef(name="tiny-mixtral", sha256=model_sha or spec.sha256()),
        workload=workload, policy=policy, schedule="cgopipe", estimate=Estimate(**est.to_plan_estimate()),
        placement=round_robin_placement(spec, policy),
        solver=SolverInfo(name="test", seconds=0.0, optimal=True, candidates_evaluated=1), created_by="test",
    )
    save_plan(plan, path)
    return path


def test_run_prints_measured_vs_predicted_and_writes_trace(tmp_path, capsys):
    plan = make_plan(tmp_path / "plan.json")
    trace = tmp_path / "trace.json"
    rc = hrm_main(["run", "--plan", str(plan), "--device", "cpu", "--trace", str(trace), "--json", "--requests", "6"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["device"] == "emulated" and out["measured"]["sequences"] == 6
    quantities = {row["quantity"] for row in out["rows"]}
    assert {"decode layer latency", "generation throughput", "device-tier peak memory"} <= quantities
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["tid"] for e in events if e["ph"] == "X"} == {1, 2, 3, 4}


def test_run_table_output(tmp_path, capsys):
    plan = make_plan(tmp_path / "plan.json", "N=4,mu=4,attn=gpu,rw=1,rc=1")
    assert hrm_main(["run", "--plan", str(plan), "--device", "cpu", "--no-warmup"]) == 0
    assert "decode layer latency" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["model", "hw"])
def test_run_refuses_a_plan_whose_hash_does_not_match(tmp_path, capsys, kind):
    plan = make_plan(tmp_path / "plan.json", **{f"{kind}_sha" if kind == "model" else "hw_sha": "0" * 64})
    rc = hrm_main(["run", "--plan", str(plan), "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and "plan was made for" in err


def test_run_refuses_other_model_or_profile(tmp_path, capsys):
    plan = make_plan(tmp_path / "plan.json")
    assert hrm_main(["run", "--plan", str(plan), "--model", "tiny-deepseek"]) == 2
    assert hrm_main(["run", "--plan", str(plan), "--hw", "l4"]) == 2
    assert hrm_main(["run", "--plan", str(tmp_path / "missing.json")]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 3 and all(line.startswith("error:") for line in errors)


def test_validate_json_csv_png(tmp_path, capsys):
    rc = hrm_main(["validate", "--hw", "cpu-only", "--model", "tiny-mixtral", "--policies", "8", "--prompt-len", "6",
                   "--gen-len", "3", "--repeats", "1", "--device", "cpu", "--json", "--out", str(tmp_path)])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert isinstance(out["mape"], float) and isinstance(out["spearman"], float)
    assert len(out["policies"]) == 8
    tiers = {(p["attn"], p["ffn"]) for p in out["policies"]}
    assert ("gpu", "gpu") in tiers and ("cpu", "gpu") in tiers and ("cpu", "cpu") in tiers
    assert {p["n"] for p in out["policies"]} >= {1, 2, 4} and {p["rw"] for p in out["policies"]} >= {0.0, 0.5, 1.0}
    assert all(p["memory_ok"] for p in out["policies"])
    assert (tmp_path / "validation.csv").read_text().count("\n") == 9
    assert (tmp_path / "validation.png").read_bytes()[:4] == b"\x89PNG"


def test_validate_needs_eight_policies(capsys):
    assert hrm_main(["validate", "--hw", "cpu-only", "--policies", "5"]) == 2
    assert "at least 8" in capsys.readouterr().err
