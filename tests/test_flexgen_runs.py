"""benchmarks/ground_truth/flexgen_runs.py: the GPU harness's FlexGen results JSONL as a runs
file that ``hrm calibrate`` reads (docs/validation/flexgen_gpu_plan.md), and the runs format's
provenance keys (command, from, engine_version, spread) and engine-timer quantities
(prefill_s, decode_s, total_s) in hrm.analysis.calibration_runs.

The fixture tests/data/flexgen_results_sample.jsonl has the record shape of the harness's
flexgen_bench.py (label, policy_flags, args, num_prompts, cmd, rc, metrics from FlexGen's
--log-file, stdout_metrics, ok, error/skipped). Every expected number below is derived by hand
from the fixture's FlexGen log values, never copied from the converter's output."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from conftest import benchmark_module
import yaml

from hrm.analysis.calibrate import predict_run
from hrm.analysis.calibration_runs import load_runs
from hrm.errors import HRMError
from hrm.export import FLEXGEN_VERSION, read_command
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.workload import make_workload

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests/data/flexgen_results_sample.jsonl"
MODEL = ROOT / "docs/validation/runs/mixtral-8x7b-4l.json"


def converter():
    return benchmark_module("benchmarks/ground_truth/flexgen_runs.py")


@pytest.fixture
def written(tmp_path):
    out = tmp_path / "runs" / "flexgen-h100.yaml"
    code = converter().main([str(FIXTURE), "--out", str(out), "--hardware", "h100", "--model", str(MODEL)])
    assert code == 0
    return out


def by_name(path):
    return {run["name"]: run for run in yaml.safe_load(path.read_text())["runs"]}


def test_runs_are_the_finished_policies_repeats_merged(written):
    runs = by_name(written)
    # 6 records: two repeats of one policy, one other finished run, an OOM, a timeout, a skip
    assert list(runs) == ["pin_b32x4_g16", "kvcpu_cpuattn_pin_b64x8_g8"]
    text = written.read_text()
    for label, why in (("gpu100_b8x1_g16", "failed rc=1: OOM"), ("page_b32x4_g8", "failed rc=124"),
                       ("kvcpu_cpuattn_page_b64x8_g8", "skipped (budget: 31s left)")):
        assert f"# left out: {label}: {why}" in text


def test_measured_numbers_by_hand(written):
    runs = by_name(written)
    pin = runs["pin_b32x4_g16"]
    # repeats: prefill 1.25 and 1.15 s, decode 3.3 and 3.0 s, gen 16, N = 32*4 = 128
    assert pin["measured"]["prefill_s"] == pytest.approx((1.25 + 1.15) / 2)
    assert pin["measured"]["ttft_s"] == pytest.approx(1.2)
    assert pin["measured"]["decode_s"] == pytest.approx((3.3 + 3.0) / 2)
    assert pin["measured"]["total_s"] == pytest.approx((4.55 + 4.15) / 2)
    assert pin["measured"]["tpot_s"] == pytest.approx((3.3 / 15 + 3.0 / 15) / 2)  # decode / (gen - 1)
    # FlexGen's logged throughputs 128*16/4.55 = 450.110 and 128*16/4.15 = 493.494; their median
    assert pin["measured"]["generation_throughput_tok_s"] == pytest.approx((450.110 + 493.494) / 2, abs=1e-3)
    assert pin["spread"]["n"] == 2
    assert pin["spread"]["prefill_s"] == pytest.approx([1.15, 1.25])
    assert pin["spread"]["tpot_s"] == pytest.approx([0.2, 0.22])
    assert pin["spread"]["generation_throughput_tok_s"] == pytest.approx([450.11, 493.494], abs=1e-3)
    cpu = runs["kvcpu_cpuattn_pin_b64x8_g8"]
    # one run: prefill 2 s, decode 7 s over gen 8 (7 steps), N = 64*8 = 512
    assert cpu["measured"] == pytest.approx({"prefill_s": 2.0, "decode_s": 7.0, "total_s": 9.0, "ttft_s": 2.0,
                                             "tpot_s": 1.0, "generation_throughput_tok_s": 512 * 8 / 9}, abs=1e-3)
    assert "spread" not in cpu


def test_policy_engine_workload_as_flexgen_runs_them(written):
    runs = by_name(written)
    pin, cpu = runs["pin_b32x4_g16"], runs["kvcpu_cpuattn_pin_b64x8_g8"]
    # --percent 0 100 100 0: no weight on the GPU, all KV on it; 4 micro-batches of 32; GPU attention
    assert pin["policy"] == "N=128,mu=32,n=4,attn=gpu,ffn=gpu,rw=0,rc=1"
    assert pin["engine"] == "flexgen"
    # --percent 0 100 0 100 --cpu-cache-compute: KV on the CPU, attention there; 8 of 64
    assert cpu["policy"] == "N=512,mu=64,n=8,attn=cpu,ffn=gpu,rw=0,rc=0"
    assert cpu["engine"] == "flexgen-cpu-attn"
    # every prompt padded to --prompt-len 128 (flex_moe.py:1207-1211)
    assert pin["workload"]["max_prompt_len"] == 128 and pin["workload"]["padding"] is True
    assert pin["workload"]["gen_len"] == 16 and cpu["workload"]["gen_len"] == 8
    for run in (pin, cpu):
        assert run["from"] == "flexgen" and run["engine_version"] == FLEXGEN_VERSION == "lynnliu030/FlexGen@a80c8d15"


def test_command_is_flex_moe_with_the_flags_as_run_and_reads_back(written):
    runs = by_name(written)
    pin = runs["pin_b32x4_g16"]
    words = shlex.split(pin["command"])
    assert words[:3] == ["python3", "-m", "flexgen.flex_moe"]
    assert words[3:5] == ["--model", "/tmp/flexgen_run.Ab12Cd/mixtral-8x7b-4l"]  # the harness's first record
    assert "--pin-weight" in words and words[-2:] == ["--log-file", "/tmp/flexgen_run.Ab12Cd/logs/00_pin_b32x4_g16.log"]
    hw, model = load_hardware("h100"), load_model(str(MODEL))
    imported = read_command("flexgen", pin["command"], model, make_workload(), hw)
    assert imported.policy.short() == pin["policy"]
    assert imported.workload.model_dump() == pin["workload"]


def test_calibrate_reads_it_and_predicts_the_new_quantities(written):
    runs = load_runs(written)
    assert runs.model.endswith("mixtral-8x7b-4l.json") and runs.hardware == "h100"
    pin = runs.runs[0]
    assert pin.command.startswith("python3 -m flexgen.flex_moe") and pin.source == "flexgen"
    assert pin.engine_version == FLEXGEN_VERSION and pin.spread_n == 2
    assert dict((q, (lo, hi)) for q, lo, hi in pin.spread)["decode_s"] == pytest.approx((3.0, 3.3))
    hw, model = load_hardware("h100"), load_model(runs.model)
    predicted = dict(zip((m.quantity for m in pin.measured), predict_run(hw, model, pin)))
    assert predicted["prefill_s"] == predicted["ttft_s"]
    assert predicted["total_s"] == pytest.approx(predicted["prefill_s"] + predicted["decode_s"])
    assert predicted["tpot_s"] == pytest.approx(predicted["decode_s"] / 15)
    assert predicted["generation_throughput_tok_s"] == pytest.approx(128 * 16 / predicted["total_s"])


def test_no_finished_record_is_an_error(tmp_path, capsys):
    bad = tmp_path / "r.jsonl"
    bad.write_text("\n".join(line for line in FIXTURE.read_text().splitlines() if '"ok": true' not in line) + "\n")
    assert converter().main([str(bad), "--out", str(tmp_path / "x.yaml"), "--hardware", "h100",
                             "--model", str(MODEL)]) == 2
    assert "nothing to write" in capsys.readouterr().err
    assert not (tmp_path / "x.yaml").exists()


BASE_RUN = {"engine": "flexgen", "workload": {"prompt_len": 128, "max_prompt_len": 128, "gen_len": 16, "padding": True},
            "policy": "N=128,mu=32,n=4,attn=gpu,ffn=gpu,rw=0,rc=1", "measured": {"ttft_s": 1.2, "total_s": 4.35}}


@pytest.mark.parametrize("extra, message", [
    ({"from": "flexgen"}, "'from' names the target that reads 'command'"),
    ({"from": "deepspeed", "command": "x"}, "from: unknown import target 'deepspeed'"),
    ({"command": ""}, "command: expected a non-empty string"),
    ({"spread": {"n": 1, "ttft_s": [1.1, 1.3]}}, "spread.n: expected the number of repeats"),
    ({"spread": {"n": 2, "ttft_s": [1.3, 1.4]}}, "spread.ttft_s: measured 1.2 lies outside [1.3, 1.4]"),
    ({"spread": {"n": 2, "tpot_s": [0.2, 0.3]}}, "'tpot_s' is not one of the run's measured quantities"),
    ({"spread": {"n": 2, "ttft_s": 1.2}}, "spread.ttft_s: expected [min, max]"),
])
def test_provenance_keys_are_checked(tmp_path, extra, message):
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({"hardware": "h100", "model": "mixtral", "runs": [{**BASE_RUN, **extra}]}))
    with pytest.raises(HRMError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        load_runs(path)


def test_a_runs_file_without_provenance_reads_as_before(tmp_path):
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({"hardware": "h100", "model": "mixtral", "runs": [BASE_RUN]}))
    run = load_runs(path).runs[0]
    assert (run.command, run.source, run.engine_version, run.spread_n, run.spread) == (None, None, None, None, ())


def test_a_record_whose_numbers_disagree_is_left_out_not_fatal(tmp_path):
    import json

    records = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    cpu = next(r for r in records if r["label"] == "kvcpu_cpuattn_pin_b64x8_g8")
    cpu["metrics"]["total_throughput_tok_s"] = 500.0  # not 512*8/9 = 455.111
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "x.yaml"
    assert converter().main([str(path), "--out", str(out), "--hardware", "h100", "--model", str(MODEL)]) == 0
    assert list(by_name(out)) == ["pin_b32x4_g16"]
    assert "# left out: kvcpu_cpuattn_pin_b64x8_g8: total throughput 500.0" in out.read_text()
