"""``hrm fit --rate-per-s R --requests N`` on a CPU-only machine: the llama-server command that
serves a Poisson load best, searched over -np, -kvu and -t through llama-server's loop
(hrm.analysis.fit_load), against llama.cpp's default server."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hrm.analysis.fit_load import AUTO_SLOTS, SLOTS, fit_cpu_load
from hrm.cost.ggml_server import ServerSetup, poisson, serve
from hrm.machine.hardware import load_hardware
from hrm.model.gguf import read_inventory

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "docs/validation/runs"
HW = RUNS / "this-host-load-poisson.yaml"
TABLE = RUNS / "gguf/gt-qwen3moe-q4_k_m.tensors.json"


def test_the_pick_is_the_best_p90_of_every_server_command():
    hw, inv = load_hardware(str(HW)), read_inventory(TABLE)
    requests = poisson(3.0, 12, 97, 32, seed=0)
    fit = fit_cpu_load(hw, inv, requests)
    threads = sorted({k.threads for k in hw.ggml_cpu.kernels})
    p90 = {}
    for slots in SLOTS:  # every command, served again here
        for unified in ((True, False) if slots > 1 else (True,)):
            for t in threads:
                setup = ServerSetup(slots, unified, 2048, 512, t, t, 256 * slots)
                p90[(slots, unified, t)] = serve(requests, setup, inv, hw.ggml_cpu).percentile("latency_s", 90)
    best = min(p90, key=p90.get)
    assert fit.best.load.percentile("latency_s", 90) == pytest.approx(p90[best])
    assert (fit.default.slots, fit.default.kv_unified) == (AUTO_SLOTS, True)
    assert fit.gain == pytest.approx(p90[(AUTO_SLOTS, True, fit.default.threads)] / p90[best])
    assert fit.default.args(default=True) == "-c 1024" and "-np" in fit.best.args()


def _fit(*extra, hw=HW):
    return subprocess.run([sys.executable, "-m", "hrm_cli", "fit", "--hw", str(hw), "--gguf", str(TABLE), "--context",
                           "129", "--gen", "32", *extra], capture_output=True, text=True, cwd=ROOT)


def test_hrm_fit_prints_the_load_answer():
    out = _fit("--rate-per-s", "3", "--requests", "12", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["requests"] == 12 and got["objective"] == "p90" and got["gain"] >= 1.0
    assert got["best"]["latency_p90_s"] <= got["llama_cpp_default"]["latency_p90_s"]
    text = _fit("--rate-per-s", "3", "--requests", "12")
    assert text.returncode == 0 and "gain over the default" in text.stdout


@pytest.mark.parametrize("extra, says", [
    (("--rate-per-s", "3"), "--rate-per-s and --requests go together"),
    (("--rate-per-s", "3", "--requests", "4", "--load-objective", "p99"), "invalid choice"),
])
def test_bad_load_fit_flags_exit_2(extra, says):
    out = _fit(*extra)
    assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr


def test_a_load_fit_needs_a_cpu_only_machine():
    out = _fit("--rate-per-s", "3", "--requests", "4", hw="l4")
    assert out.returncode == 2 and "a load is fitted on a CPU-only machine" in out.stderr


#: two commands whose predicted p90 latencies differ by less than this are a tie (the loads' p90 ratios spread
#: 0.85-1.08 across passes: ground_truth.md §1.12)
TIE = 0.01


def test_hrm_fits_server_against_llama_cpps_default_as_measured():
    """docs/validation/runs/fit-load.yaml: for five GGUFs under a Poisson load (the draw hrm fit
    predicts, seed 0), the real llama-server ran hrm fit's pick and llama.cpp's default command
    alternately, twice each. hrm fit still picks those commands on that profile and the gain it
    predicts is within 15% of the measured one (medians of the runs). Where it predicts 1.2x or
    more (three files: 1.37x, 1.22x, 1.21x), every run of its pick had a lower p90 latency than
    every run of the default (measured 1.48x, 1.14x, 1.09x); where it predicts 1.05-1.10x, the
    measured gain is 0.99-1.05x: a gain under ~10% is inside the model's error. Since the padded
    query tiles (ground_truth.md §1.13) gt-deepseekv2 Q4_K_M's -np 2 scores 0.4% better than the
    measured -np 1: a tie (TIE), so the measured command must be the pick or tie with it."""
    import numpy as np
    import yaml

    doc = yaml.safe_load((RUNS / "fit-load.yaml").read_text())
    hw = load_hardware(str(RUNS / doc["hardware"]))
    assert len(doc["points"]) == 5
    for point in doc["points"]:
        inv = read_inventory(RUNS / point["gguf"])
        requests = poisson(point["rate_per_s"], doc["requests"], doc["context"] - doc["gen"], doc["gen"], seed=0)
        fit = fit_cpu_load(hw, inv, requests)
        measured_pick = next(c for c in fit.ranked if c.args() == point["commands"]["hrm fit"])
        assert measured_pick.score("p90") <= fit.best.score("p90") * (1 + TIE), point["gguf"]
        assert fit.default.args(default=True) == point["commands"]["llama.cpp default"]
        ours = [r["latency_p90_s"] for r in point["runs"]["hrm fit"]]
        theirs = [r["latency_p90_s"] for r in point["runs"]["llama.cpp default"]]
        measured_gain = np.median(theirs) / np.median(ours)
        gain = fit.default.score("p90") / measured_pick.score("p90")
        assert gain == pytest.approx(measured_gain, rel=0.15), point["gguf"]
        if gain >= 1.2:
            assert max(ours) < min(theirs), point["gguf"]
