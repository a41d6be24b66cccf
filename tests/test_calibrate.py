"""``hrm calibrate`` (hrm.analysis.calibrate): fit a profile's achieved rates to the user's own runs.

Synthetic runs are predictions of a "true" machine (the shipped l4 with a slower link and a
lower GEMM efficiency); calibrating the shipped l4 to them must recover the true fields,
leave what no run depends on alone, refuse what cannot be fitted, and write a profile that
loads and predicts the runs (and a run of another engine).
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import call
from hrm.analysis.calibrate import calibrated_profile, fit, identify, predict_run
from hrm.analysis.calibration_fields import FIELDS, with_values
from hrm.analysis.calibration_runs import load_runs, parse_run
from hrm.errors import HRMError
from hrm.machine.hardware import PROFILES_DIR, load_hardware
from hrm.model.spec import load_model

#: the true machine: the shipped l4 with its pinned link at 0.7x and GEMMs at 0.6 of peak
TRUE_H2D_GBPS = 17.18 * 0.7
TRUE_GEMM_EFFICIENCY = 0.6
MTBENCH = {"prompt_len": 77, "max_prompt_len": 418, "gen_len": 128}
MOE_LIGHTNING = [
    ("moe-lightning", "mu=120,n=10,attn=cpu,ffn=gpu,rw=0,rc=0", MTBENCH),
    ("moe-lightning", "mu=32,n=4,attn=cpu,ffn=gpu,rw=0,rc=0", {"prompt_len": 512, "max_prompt_len": 512, "gen_len": 32}),
]
OTHERS = [
    ("flexgen", "N=64,mu=8,attn=gpu,ffn=gpu,rw=0,rc=0", {**MTBENCH, "padding": True}),
    ("flexgen-cpu-attn", "N=256,mu=32,attn=cpu,ffn=gpu,rw=0,rc=0", {**MTBENCH, "padding": True}),
    ("moe-infinity", "N=4,mu=4,attn=gpu,ffn=gpu,rc=1", MTBENCH),
    ("hrm-runtime", "N=64,mu=16,attn=cpu,ffn=gpu", MTBENCH),
]
#: the fields test (1) fits: the two that differ and two that do not
RECOVERED = ["link.h2d_gbps", "gpu.gemm_efficiency", "gpu.memory_stream_efficiency", "link.h2d_pageable_gbps"]
QUANTITIES = ("generation_throughput_tok_s", "ttft_s")


@pytest.fixture(scope="module")
def l4():
    return load_hardware("l4")


@pytest.fixture(scope="module")
def mixtral():
    return load_model("mixtral")


@pytest.fixture(scope="module")
def truth(l4):
    return with_values(l4, {"link.h2d_gbps": TRUE_H2D_GBPS, "gpu.gemm_efficiency": TRUE_GEMM_EFFICIENCY})


def run_entry(engine: str, policy: str, workload: dict, measured: dict) -> dict:
    return {"engine": engine, "workload": dict(workload), "policy": policy, "measured": measured}


def measured_on(hw, model, engine, policy, workload, quantities=QUANTITIES) -> dict:
    """What ``hw`` predicts for the run: the synthetic measurement."""
    run = parse_run(run_entry(engine, policy, workload, {q: 1.0 for q in quantities}), 0, Path("."), "synthetic")
    return {q: float(v) for q, v in zip(quantities, predict_run(hw, model, run))}


def write_runs(path: Path, hw, model, specs, quantities=QUANTITIES) -> Path:
    runs = [run_entry(e, p, w, measured_on(hw, model, e, p, w, quantities)) for e, p, w in specs]
    path.write_text(yaml.safe_dump({"hardware": "l4", "model": "mixtral", "runs": runs}, sort_keys=False))
    return path


def one_line(code: int, err: str, needle: str = "") -> str:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
    return lines[0]


# --- (1) recovery, (4) the written profile ----------------------------------------------------

def test_recovers_the_true_fields(tmp_path, l4, mixtral, truth):
    runs = load_runs(write_runs(tmp_path / "runs.yaml", truth, mixtral, MOE_LIGHTNING + OTHERS))
    calibration = fit(l4, mixtral, runs, RECOVERED)
    fitted = calibration.fitted
    assert set(fitted) == set(RECOVERED)
    for name in RECOVERED:
        want = float(np.clip(_effective(truth, name), *FIELDS[name].range_of(l4)))
        assert fitted[name] == pytest.approx(want, rel=0.02), name
    assert calibration.rms_log_error("before") > 0.1
    assert calibration.rms_log_error("after") < 0.01
    assert calibration.rms_log_error("loo") < 0.02  # every run is predicted by the others


def _effective(hw, name):
    from hrm.analysis.calibration_fields import effective_value

    return effective_value(hw, name)


def test_written_profile_loads_and_predicts_the_runs(tmp_path, capsys, l4, mixtral, truth):
    shipped = (PROFILES_DIR / "l4.yaml").read_bytes()
    path = write_runs(tmp_path / "runs.yaml", truth, mixtral, MOE_LIGHTNING)
    out = tmp_path / "calibrated.yaml"
    code, stdout, err = call(capsys, "calibrate", path, "--out", out, "--fields", "link.h2d_gbps,gpu.gemm_efficiency")
    assert code == 0, err
    assert "link.h2d_gbps" in stdout and "leave-one-out" in stdout
    assert max(len(line) for line in stdout.splitlines()) <= 80
    profile = load_hardware(str(out))
    assert profile.name == "l4@calibrated" and profile.source.kind == "calibrated"
    assert profile.source.runs_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert set(profile.source.methods) >= {"link.h2d_gbps", "gpu.gemm_efficiency"}
    assert profile.link.h2d_gbps == pytest.approx(TRUE_H2D_GBPS, rel=0.02)
    for entry in yaml.safe_load(path.read_text())["runs"]:
        predicted = measured_on(profile, mixtral, entry["engine"], entry["policy"], entry["workload"])
        for quantity, value in entry["measured"].items():
            assert predicted[quantity] == pytest.approx(value, rel=0.02), quantity
    assert (PROFILES_DIR / "l4.yaml").read_bytes() == shipped  # shipped profiles never change


def test_calibrated_profile_keeps_what_was_not_fitted(tmp_path, l4, mixtral, truth):
    runs = load_runs(write_runs(tmp_path / "runs.yaml", truth, mixtral, MOE_LIGHTNING))
    calibration = fit(l4, mixtral, runs, ["link.h2d_gbps", "gpu.gemm_efficiency"], with_loo=False)
    profile = calibrated_profile(l4, calibration, name="my-l4")
    assert profile.name == "my-l4"
    assert profile.link.d2h_gbps == l4.link.d2h_gbps and profile.cpu == l4.cpu
    assert profile.gpu.memory_stream_efficiency is None  # still the hrm.machine.achieved default
    with pytest.raises(HRMError, match="another profile"):
        calibrated_profile(load_hardware("t4"), calibration)


def test_measured_base_keeps_its_implicit_efficiencies(tmp_path, l4, mixtral):
    """A measured profile's unset GPU efficiencies are 1 (its peaks are achieved rates); the
    calibrated profile (kind calibrated) states them, so that it runs as its base did."""
    data = l4.model_dump(exclude_none=True)
    data["source"] = {"kind": "measured"}
    measured = type(l4).model_validate(data)
    truth = with_values(measured, {"link.h2d_gbps": TRUE_H2D_GBPS})
    runs = load_runs(write_runs(tmp_path / "runs.yaml", truth, mixtral, MOE_LIGHTNING[:1],
                                ("generation_throughput_tok_s",)))
    profile = calibrated_profile(measured, fit(measured, mixtral, runs, ["link.h2d_gbps"], with_loo=False))
    assert profile.gpu.memory_stream_efficiency == 1.0 and profile.gpu.gemm_efficiency == 1.0
    assert profile.link.h2d_gbps == pytest.approx(TRUE_H2D_GBPS, rel=0.02)


# --- (2) identification ----------------------------------------------------------------------------

def test_unidentifiable_field_is_reported_and_left(tmp_path, capsys, l4, mixtral, truth):
    # (not cpu.memcpy_one_thread_gbps: since issue 32 l4's pageable copies, which the runs use,
    # follow it, 1 / (1/pinned + 1/memcpy_one_thread); no MoE-Lightning run here uses the team's rate)
    path = write_runs(tmp_path / "runs.yaml", truth, mixtral, MOE_LIGHTNING, ("generation_throughput_tok_s",))
    calibration = fit(l4, mixtral, load_runs(path), ["link.h2d_gbps", "cpu.memcpy_all_threads_gbps"], with_loo=False)
    left = {f.name: f for f in calibration.left}
    assert set(left) == {"cpu.memcpy_all_threads_gbps"} and "no run" in left["cpu.memcpy_all_threads_gbps"].reason
    assert calibrated_profile(l4, calibration).cpu.memcpy_all_threads_gbps is None  # the default still applies
    out = tmp_path / "cal.yaml"
    code, stdout, err = call(capsys, "calibrate", path, "--out", out, "--fields",
                             "link.h2d_gbps,cpu.memcpy_all_threads_gbps")
    assert code == 0, err
    assert "left at the profile's value: cpu.memcpy_all_threads_gbps" in " ".join(stdout.split())


def test_identify_zero_and_collinear_columns():
    jacobian = np.array([[1.0, 0.0, 2.0, 0.3], [0.5, 1e-5, 1.0, -0.2], [0.2, 0.0, 0.4, 0.1]])
    kept, why = identify(jacobian, (0, 1, 2, 3))
    assert kept in ((0, 3), (2, 3))  # columns 0 and 2 are parallel: one of them stays
    assert "no run" in why[1] and "collinear" in why[({0, 2} - set(kept)).pop()]


# --- (3) refusals -------------------------------------------------------------------------------

def test_fewer_runs_than_fields_is_refused(tmp_path, capsys, mixtral, truth):
    path = write_runs(tmp_path / "runs.yaml", truth, mixtral, MOE_LIGHTNING[:1])
    out = tmp_path / "cal.yaml"
    code, _, err = call(capsys, "calibrate", path, "--out", out, "--fields", "link.h2d_gbps,gpu.gemm_efficiency")
    one_line(code, err, "1 run(s) cannot determine 2 fields")
    assert not out.exists()


def test_nothing_identifiable_is_refused(tmp_path, capsys, mixtral, truth):
    path = write_runs(tmp_path / "runs.yaml", truth, mixtral, MOE_LIGHTNING[:1])
    code, _, err = call(capsys, "calibrate", path, "--fields", "cpu.memcpy_all_threads_gbps")
    one_line(code, err, "no field can be identified")


GOOD_RUN = {"engine": "moe-lightning", "workload": MTBENCH, "policy": "mu=120,n=10,attn=cpu,ffn=gpu,rw=0,rc=0",
            "measured": {"generation_throughput_tok_s": 150.0}}


@pytest.mark.parametrize("change, needle", [
    ({"runs": None}, "runs"),
    ({"runs": []}, "runs"),
    ({"hardware": None}, "missing key 'hardware'"),
    ({"hardware": "no-such-machine"}, "no-such-machine"),
    ({"extra": 1}, "unknown key 'extra'"),
    ({"run": {"engine": None}}, "runs[0]: missing key 'engine'"),
    ({"run": {"engine": "warp-drive"}}, "runs[0].engine: unknown engine 'warp-drive'"),
    ({"run": {"policy": "mu=120,zz=3"}}, "runs[0].policy: unknown key 'zz'"),
    ({"run": {"policy": "mu=120,n=10,attn=gpu,ffn=gpu,rw=0,rc=0"}}, "runs[0]: engine moe-lightning"),
    ({"run": {"workload": {"prompt_len": 77, "gen_len": "many"}}}, "runs[0].workload.gen_len"),
    ({"run": {"measured": {"generation_throughput_tok_s": float("nan")}}}, "measured.generation_throughput_tok_s"),
    ({"run": {"measured": {"tpot_s": -1.0}}}, "measured.tpot_s: expected a finite positive number"),
    ({"run": {"measured": {"tpot_s": "fast"}}}, "measured.tpot_s"),
    ({"run": {"measured": {"latency": 1.0}}}, "unknown quantity 'latency'"),
    ({"run": {"measured": {}}}, "runs[0].measured"),
    ({"run": {"cpu_mem_gib": 0}}, "runs[0].cpu_mem_gib"),
    ({"run": {"cpu_mem_gib": 1e9}}, "runs[0]: --cpu-mem"),
])
def test_bad_runs_file(tmp_path, capsys, change, needle):
    data = {"hardware": "l4", "model": "mixtral", "runs": [dict(GOOD_RUN)]}
    for key, value in change.items():
        if key == "run":
            data["runs"][0].update(value)
            data["runs"][0] = {k: v for k, v in data["runs"][0].items() if v is not None}
        elif value is None:
            data.pop(key)
        else:
            data[key] = value
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "cal.yaml"
    code, _, err = call(capsys, "calibrate", path, "--out", out, "--fields", "link.h2d_gbps")
    line = one_line(code, err, needle)
    assert str(path) in line
    assert not out.exists()


@pytest.mark.parametrize("args, needle", [
    (["--fields", "link.h2d_gbps,warp_factor"], "--fields: unknown field 'warp_factor'"),
    (["--fields", " , "], "--fields"),
    (["--out", str(PROFILES_DIR / "l4.yaml")], "shipped profiles never change"),
    (["--out", "RUNS"], "is the runs file"),
    (["--out", "/no/such/folder/x.yaml"], "does not exist"),
])
def test_bad_flags(tmp_path, capsys, args, needle):
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({"hardware": "l4", "model": "mixtral", "runs": [GOOD_RUN]}))
    before = path.read_bytes()
    code, _, err = call(capsys, "calibrate", path, *[str(path) if a == "RUNS" else a for a in args])
    one_line(code, err, needle)
    assert path.read_bytes() == before


def test_not_yaml_and_missing_file(tmp_path, capsys):
    path = tmp_path / "runs.yaml"
    path.write_text("runs: [unclosed\n")
    one_line(*call(capsys, "calibrate", path)[::2], "malformed YAML")
    one_line(*call(capsys, "calibrate", tmp_path / "nope.yaml")[::2], "nope.yaml")


# --- (5) transfer across engines -----------------------------------------------------------------

def test_fit_on_one_engine_transfers_to_another(tmp_path, l4, mixtral, truth):
    runs = load_runs(write_runs(tmp_path / "runs.yaml", truth, mixtral, MOE_LIGHTNING))
    profile = calibrated_profile(l4, fit(l4, mixtral, runs, ["link.h2d_gbps", "gpu.gemm_efficiency"],
                                         with_loo=False))
    for engine, policy, workload in (OTHERS[2], OTHERS[3]):  # moe-infinity, hrm-runtime: held out
        true = measured_on(truth, mixtral, engine, policy, workload)
        default = measured_on(l4, mixtral, engine, policy, workload)
        fitted = measured_on(profile, mixtral, engine, policy, workload)
        for quantity in QUANTITIES:
            error_default = abs(math.log(default[quantity] / true[quantity]))
            error_fitted = abs(math.log(fitted[quantity] / true[quantity]))
            assert error_fitted < error_default / 5, (engine, quantity, error_fitted, error_default)
