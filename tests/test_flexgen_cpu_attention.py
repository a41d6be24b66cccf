"""FlexGen's CPU attention (``--cpu-cache-compute``) as its source runs it in each (layer,
micro-batch) slot (hrm.cost.latency.workspace_attention; docs/engines/flexgen.md §11), and the
three committed ``--cpu-cache-compute`` runs on the lent H100 (docs/validation/runs/flexgen-h100.yaml).
Every expected byte count is written out from the shapes the fork allocates and copies
(lynnliu030/FlexGen@a80c8d15), not from the module's formulas."""

from __future__ import annotations

from pathlib import Path

import pytest

from hrm.analysis.calibrate import predict_run
from hrm.analysis.calibration_runs import load_runs, run_as_commanded
from hrm.cost import costs
from hrm.cost.latency.decode import decode_tasks
from hrm.cost.latency.ops import attention_rows, cpu_time_s
from hrm.cost.latency.transfers import dram_bytes_s
from hrm.cost.latency.workspace_attention import workspace_attention_s, workspace_passes
from hrm.engines.engine import load_engine
from hrm.engines.mechanisms import with_fields, without
from hrm.machine.hardware import load_hardware
from hrm.machine.rates import rates_from_profile
from hrm.model.options import DEFAULT_OPTIONS
from hrm.model.spec import load_model

RUNS_DIR = Path(__file__).resolve().parents[1] / "docs" / "validation" / "runs"
RUNS = RUNS_DIR / "flexgen-h100.yaml"
#: the per-run bar of the project's ground-truth comparisons (docs/validation/ground_truth.md,
#: tests/test_ground_truth_llamacpp.py: the issue's 1.25x). The runs' own step-to-step spread
#: (generate_costs_s) is 1.16-1.35 s and 1.41-1.70 s per step, about ±10 %, and the fresh-page
#: rate is an assumption (docs/engines/flexgen.md §11): a tighter band would claim more than
#: the measurement and the model hold.
TPOT_FACTOR = 1.25
CPU_ATTENTION_RUNS = ("kvcpu_cpuattn_pin_b64x8_g8", "kvcpu_cpuattn_pin_b256x2_g8", "kvcpu_cpuattn_page_b64x8_g8")


@pytest.fixture(scope="module")
def box():
    hw = load_hardware(str(RUNS_DIR / "h100-flexgen-box.yaml"))
    model = load_model(str(RUNS_DIR / "mixtral-8x7b-4l.json"))
    return hw, model, rates_from_profile(hw, DEFAULT_OPTIONS.for_model(model))


def test_passes_by_hand_from_the_sources_shapes(box):
    _, model, _ = box
    # Mixtral: 32 query heads, 8 KV heads of 128; a micro-batch of 2 sequences, 3 tokens cached
    passes = workspace_passes(model, 2, 3)
    # load_cache path 1 (flex_moe.py:407-412): k_buf[0:3, 0:16] = k_home[0:3, 0:16], (3, 2*8, 128),
    # fp16 home (moe_pytorch_backend.py:321) -> fp32 workspace (:250); K and V
    assert passes.widen_read_bytes == pytest.approx(2 * 3 * 16 * 128 * 2)      # 24,576
    assert passes.widen_written_bytes == pytest.approx(2 * 3 * 16 * 128 * 4)   # 49,152
    # expand + reshape (:449-453): (4, 16, 128) fp32 -> (4, 2*32, 128) fp32, src_s = 3 + 1; K and V
    assert passes.expand_read_bytes == pytest.approx(2 * 4 * 16 * 128 * 4)     # 65,536
    assert passes.expand_written_bytes == pytest.approx(2 * 4 * 64 * 128 * 4)  # 262,144
    # bmm (64, 1, 128) @ (64, 128, 4) and (64, 1, 4) @ (64, 4, 128) (:515, :529): each operand read once
    assert passes.matmul_read_bytes == pytest.approx(2 * 64 * 128 * 4 * 4)     # 262,144
    assert passes.matmul_flops == pytest.approx(2 * (2 * 64 * 1 * 128 * 4))   # 131,072
    # the expanded K and V are new tensors: their pages are fresh
    assert passes.fresh_bytes == pytest.approx(262_144)
    assert passes.dram_bytes == pytest.approx(24_576 + 49_152 + 65_536 + 262_144 + 262_144)


def test_seconds_by_hand_at_the_box_rates(box):
    _, model, rates = box
    # h100-flexgen-box.yaml: memcpy all threads 45.31 GB/s (bytes copied: read + write = 90.62 GB/s),
    # one thread 10.76 GB/s, CPU fp32 matmul at M = 1: 0.07311 TFLOP/s
    copies = (24_576 + 49_152 + 65_536 + 262_144) / 90.62e9
    products = max(131_072 / 0.07311e12, 262_144 / 90.62e9)  # the reads bind: 2.89 us against 1.79 us
    fresh = 262_144 / 10.76e9
    assert workspace_attention_s(model, rates, 2, 3) == pytest.approx(copies + products + fresh, rel=1e-9)


def test_at_a_run_slot_the_fresh_pages_dominate(box):
    _, model, rates = box
    # the b64x8 runs' slot at c = 132: an expanded K is 4 * 133 * 64 * 8 * 128 * 4 B = 139.5 MB,
    # above glibc's 32 MiB mmap threshold; fresh K and V 279 MB at 10.76 GB/s = 25.9 ms
    expanded = 4 * 133 * 64 * 8 * 128 * 4
    assert expanded > 32 * 2**20
    assert workspace_passes(model, 64, 132).fresh_bytes == pytest.approx(2 * expanded)
    seconds = workspace_attention_s(model, rates, 64, 132)
    assert 2 * expanded / 10.76e9 == pytest.approx(0.0259, abs=1e-4)
    assert 0.033 < seconds < 0.035


def test_the_engine_charges_the_passes_and_switching_it_off_restores_the_roofline(box):
    _, model, rates = box
    engine = with_fields(load_engine("flexgen-cpu-attn"), {"decode.weight_path": "pinned"})
    assert engine.cpu_attention == "fp32-workspace" and load_engine("flexgen").cpu_attention == "roofline"

    def task(eng, name):
        return {t.name: t.lane for t in decode_tasks(model, rates, 64, 132, 0.0, 1.0, True, eng)}[name]

    assert float(task(engine, "CPUAttn").per_micro_batch_s) == pytest.approx(
        workspace_attention_s(model, rates, 64, 132))
    plain = without(engine, "cpu_attention")
    roofline = cpu_time_s(costs.decode_layer_ops(model, 64, 132).attention, rates, attention_rows(model), plain)
    assert float(task(plain, "CPUAttn").per_micro_batch_s) == pytest.approx(float(roofline))
    # the host-DRAM lane carries every pass's traffic instead of one read of the fp16 cache
    extra = workspace_passes(model, 64, 132).dram_bytes - costs.decode_layer_ops(model, 64, 132).attention.bytes
    dram = float(task(engine, "HostDRAM").per_micro_batch_s) - float(task(plain, "HostDRAM").per_micro_batch_s)
    assert dram == pytest.approx(float(extra) / dram_bytes_s(rates))


def test_the_three_cpu_attention_runs_decode_within_the_bar():
    runs = load_runs(RUNS)
    hw, model = load_hardware(runs.hardware), load_model(runs.model)
    chosen = [r for r in runs.runs if r.label in CPU_ATTENTION_RUNS]
    assert len(chosen) == 3
    for run in chosen:
        commanded = run_as_commanded(run, hw, model)
        assert commanded.engine.cpu_attention == "fp32-workspace"
        at = [m.quantity for m in run.measured].index("tpot_s")
        ratio = predict_run(hw, model, commanded)[at] / run.measured[at].value
        assert 1 / TPOT_FACTOR <= ratio <= TPOT_FACTOR, (run.label, ratio)
        # the roofline this replaces was 2-5x fast on every one of them
        roofline = run.model_copy(update={"engine": without(commanded.engine, "cpu_attention")})
        assert predict_run(hw, model, roofline)[at] / run.measured[at].value < 0.65, run.label
