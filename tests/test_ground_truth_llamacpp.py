"""The model against real llama.cpp runs this project measured on its own CPU machine
(docs/validation/runs/llamacpp-cpu.yaml; docs/validation/ground_truth.md). CI never runs llama.cpp:
it re-predicts every committed run from its exact command, the GGUF's tensor table and the
machine's profile, and fails when a prediction moves away from its measurement."""

from __future__ import annotations

import dataclasses

import statistics
from pathlib import Path

import numpy as np
import pytest

from hrm.errors import HRMError
from hrm.export.llama_tools import bench_runs, int_list
from hrm.cost.ggml_cpu import prefill_steps, seconds_per_element
from hrm.analysis.validation import compare_runs, load_runs_file, ratios, worst_factor

RUNS = Path(__file__).resolve().parent.parent / "docs" / "validation" / "runs" / "llamacpp-cpu.yaml"
#: the documented tolerance (docs/validation/ground_truth.md): every predicted prefill and decode
#: time within EVERY_RUN_FACTOR of its measured median, at most BEYOND_1_25 of them beyond 1.25x
#: (the issue's bar, not yet met by every run: the table names the mechanisms left), and the
#: median ratio within MEDIAN_BAND
EVERY_RUN_FACTOR = 1.40
BEYOND_1_25 = 6
MEDIAN_BAND = (0.9, 1.1)


@pytest.fixture(scope="module")
def comparisons():
    return compare_runs(load_runs_file(RUNS))


def test_the_committed_runs_cover_the_must_show(comparisons):
    runs = load_runs_file(RUNS).runs
    assert len(runs) >= 40
    assert len({r["model"] for r in runs}) >= 3
    assert len({r["gguf"].rsplit("-", 1)[1] for r in runs}) >= 3  # f16, q8_0, q4_k_m
    threads = {t.threads for r in runs for t in bench_runs(r["command"], 2)[0]}
    batches = {t.sequences for r in runs for t in bench_runs(r["command"], 2)[0]}
    assert threads == {1, 2} and min(batches) == 1 and max(batches) >= 64


def test_every_prediction_within_the_documented_factor(comparisons):
    worst = sorted(((max(c.ratio(q), 1 / c.ratio(q)), c.name, q) for c in comparisons for q in c.measured),
                   reverse=True)
    assert worst[0][0] <= EVERY_RUN_FACTOR, worst[:5]
    assert sum(1 for w in worst if w[0] > 1.25) <= BEYOND_1_25, worst[:BEYOND_1_25 + 1]


def test_median_ratio_is_unbiased(comparisons):
    med = statistics.median(ratios(comparisons))
    assert MEDIAN_BAND[0] <= med <= MEDIAN_BAND[1], med


def test_bench_lists_are_sweeps_as_llama_bench_expands_them():
    runs, _ = bench_runs("llama-bench -m x.gguf -p 64 -n 16 -t 1,2 -d 0,1024", 2)
    # threads x depths (0, 1024), each a pp test then a tg test (llama-bench.cpp's order)
    assert [(r.threads, r.depth, r.prompt_len, r.gen_len) for r in runs] == [
        (1, 0, 64, 0), (1, 0, 0, 16), (1, 1024, 64, 0), (1, 1024, 0, 16),
        (2, 0, 64, 0), (2, 0, 0, 16), (2, 1024, 64, 0), (2, 1024, 0, 16)]
    assert int_list("-t", "2-8+2") == [2, 4, 6, 8]
    with pytest.raises(HRMError, match="-npp"):
        bench_runs("llama-batched-bench -m x.gguf -ntg 8 -npl 2", 2)
    with pytest.raises(HRMError, match="--frobnicate"):
        bench_runs("llama-bench -m x.gguf --frobnicate 3", 2)


def test_prefill_is_cut_into_micro_batches_by_hand():
    # 3 sequences x 300 tokens = 900 tokens in ubatches of 512: [512, 388]; the first holds all of
    # sequence 0 (its output) and tokens 0..211 of sequence 1; the second the rest of 1, all of 2
    steps = prefill_steps(3, 300, 0, 2048, 512)
    assert [(n, outs) for n, outs, _ in steps] == [(512, 1), (388, 2)]
    assert steps[0][2] == [(300, 150.5), (212, 106.5)]
    assert steps[1][2] == [(88, (212 + 300 + 1) / 2), (300, 150.5)]


def test_kernel_curve_interpolates_and_extrapolates_linearly():
    from hrm.machine.hardware import CurvePoint, GgmlCpu, GgmlKernel

    k = GgmlKernel(type="q4_K", op="mm", threads=1,
                   s_per_elem_vs_rows=[CurvePoint(x=1, y=1e-10), CurvePoint(x=64, y=8e-10), CurvePoint(x=512, y=6e-9)])
    sec = GgmlCpu(llama_cpp="t", pool_mib=1024, node_s_vs_threads=[CurvePoint(x=1, y=1e-7)], kernels=(k,))
    assert seconds_per_element(sec, "Q4_K", "mm", 1, 32.5) == pytest.approx(4.5e-10)
    slope = (6e-9 - 8e-10) / (512 - 64)
    assert seconds_per_element(sec, "Q4_K", "mm", 1, 1024) == pytest.approx(6e-9 + slope * 512)
    with pytest.raises(HRMError, match="at 2 threads"):
        seconds_per_element(sec, "Q4_K", "mm", 2, 1)


def test_calibrating_three_runs_fits_them_within_the_scale_range():
    from hrm.analysis.validation import GGML_SCALE_RANGE, fit_ggml_scales

    three = load_runs_file(RUNS.with_name("llamacpp-cpu-3runs.yaml"))
    cal = fit_ggml_scales(three, (0, 1, 2))
    assert cal.rms_log_after < cal.rms_log_before
    for v in (cal.stream_scale, cal.compute_scale):
        assert GGML_SCALE_RANGE[0] <= v <= GGML_SCALE_RANGE[1]


def test_calibration_factor_blends_the_two_scales_by_rows():
    from hrm.cost.ggml_cpu import calibration_factor
    from hrm.machine.hardware import CurvePoint, GgmlCpu

    sec = GgmlCpu(llama_cpp="t", pool_mib=1024, node_s_vs_threads=[CurvePoint(x=1, y=1e-7)], kernels=(),
                  stream_scale=0.5, compute_scale=2.0)
    assert calibration_factor(sec, 1) == pytest.approx(0.5)
    assert calibration_factor(sec, 4) == pytest.approx(1.0)  # halfway in log rows: sqrt(0.5 * 2)
    assert calibration_factor(sec, 64) == pytest.approx(2.0)


def test_import_predicts_a_llama_bench_sweep(tmp_path):
    import json
    import subprocess
    import sys

    root = RUNS.parent
    # no --model: the command is predicted from the GGUF's own tensors
    cmd = [sys.executable, "-m", "hrm_cli", "import", "--from", "llama.cpp", "--hw", str(root / "this-host-llamacpp.yaml"),
           "--gguf", str(root / "gguf" / "gt-mixtral-q4_k_m.tensors.json"), "--json",
           "llama-bench -m gt-mixtral-q4_k_m.gguf -p 128 -n 32 -t 1,2"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    tests = json.loads(out.stdout)["tests"]
    assert [(t["test"], t["threads"]) for t in tests] == [("pp128", 1), ("tg32", 1), ("pp128", 2), ("tg32", 2)]
    # two threads are faster than one, and each test predicts only its own phase
    assert tests[2]["prefill_s"] < tests[0]["prefill_s"] and tests[3]["decode_s"] < tests[1]["decode_s"]
    assert tests[0]["decode_s"] == 0 and tests[1]["prefill_s"] == 0


def test_import_of_a_server_command_still_needs_a_model():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "hrm_cli", "import", "--from", "llama.cpp", "--hw", "l4", "-np 4"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--model" in out.stderr and "Traceback" not in out.stderr


WINDOW = RUNS.with_name("llamacpp-cpu-window.yaml")
#: the one-user decodes whose weights a step re-reads from the cache (Q4_K_M and the 32-expert
#: Q8_0 at depth 0: 20-70 MB a step, docs/validation/ground_truth.md "Reuse distance")
CACHE_ROWS = ("gt-mixtral q4_k_m t2 d0 (llama-bench)", "gt-qwen3moe q4_k_m t2 d0 (llama-bench)",
              "gt-deepseekv2 q4_k_m t2 d0 (llama-bench)", "gt-qwen3moe q8_0 t2 d0 (llama-bench)")


def test_reuse_distance_moves_the_cached_decodes_onto_their_runs():
    """Runs and probe from one quiet window (one_window.py). The same profile without its small
    pools (every weight read cold) is the control: the reuse-distance curve takes each of these
    decodes to within 1.10x, from up to 1.30x, and moves an f16 decode (130-250 MiB a step) by under 5%."""
    from hrm.analysis.validation import compare_runs

    window = load_runs_file(WINDOW)
    sec = window.hardware.ggml_cpu
    cold_sec = sec.model_copy(update={"kernels": tuple(k for k in sec.kernels if (k.pool_mib or sec.pool_mib) >= 256)})
    cold = load_runs_file(WINDOW, window.hardware.model_copy(update={"ggml_cpu": cold_sec}))
    warm_by = {c.name: c for c in compare_runs(window)}
    cold_by = {c.name: c for c in compare_runs(cold)}
    for name in CACHE_ROWS:
        warm, before = warm_by[name].ratio("decode_s"), cold_by[name].ratio("decode_s")
        assert max(warm, 1 / warm) <= 1.10, (name, warm)
        assert abs(np.log(warm)) < abs(np.log(before)), (name, warm, before)
    assert max(cold_by[n].ratio("decode_s") for n in CACHE_ROWS) > 1.25  # the control misses
    for name, c in warm_by.items():
        if " f16 " in name and "d0" in name:
            assert c.ratio("decode_s") == pytest.approx(cold_by[name].ratio("decode_s"), rel=0.05), name


def test_the_99_runs_remeasured_with_the_engine_layout_probe():
    """The 99 commands measured again, then the profile with the engine-layout attention probe,
    back to back (docs/validation/ground_truth.md §1.5): median within MEDIAN_BAND; the misses
    left were many-sequence prefills (batched-bench, up to 1.49x too fast) until the elementwise
    nodes were priced (§1.6): now every time within 1.4x and at most 2 beyond 1.25x."""
    from hrm.analysis.validation import summary

    runs = compare_runs(load_runs_file(RUNS.with_name("llamacpp-cpu-tm.yaml")))
    stats = summary(runs)
    assert len(runs) == 99 and MEDIAN_BAND[0] <= stats["median_ratio"] <= MEDIAN_BAND[1], stats
    assert stats["worst_factor"] <= 1.4 and stats["beyond_1_25x"] <= 2, stats
    decode = [c.ratio("decode_s") for c in runs if " d1024 " in c.name]
    assert decode and min(decode) >= 0.85, decode  # the depth-1024 decodes: 0.88-1.06 measured


def test_the_99_runs_a_third_time_with_every_probe():
    """The 99 commands measured a third time (2 repetitions), then `hrm profile --llama-cpp`
    with every probe of this stop, back to back (docs/validation/ground_truth.md §1.7): median
    within MEDIAN_BAND, and every time beyond 1.25x is a one-user Q4_K_M decode predicted too
    slow (weights the cache holds, at a cache share that moved between runs and probe)."""
    from hrm.analysis.validation import summary

    runs = compare_runs(load_runs_file(RUNS.with_name("llamacpp-cpu-m3.yaml")))
    stats = summary(runs)
    assert len(runs) == 99 and MEDIAN_BAND[0] <= stats["median_ratio"] <= MEDIAN_BAND[1], stats
    assert stats["worst_factor"] <= 1.45 and stats["beyond_1_25x"] <= 5, stats
    misses = [(c, q) for c in runs for q in c.measured if max(c.ratio(q), 1 / c.ratio(q)) > 1.25]
    for c, q in misses:  # one user: a batched-bench x1 or a llama-bench tg
        assert q == "decode_s" and " q4_k_m " in c.name and c.ratio(q) > 1, (c.name, q, c.ratio(q))
        assert " x1 " in c.name or "(llama-bench)" in c.name, c.name


def test_the_99_runs_in_one_window_with_the_probe_between_their_passes():
    """All 99 commands, twice, with every probe between the passes, inside one quiet window
    (docs/validation/ground_truth.md §1.9), MLA's per-head matmuls at their own shapes: the issue's
    bar, median within MEDIAN_BAND and every time within 1.25x; and the one-user Q4_K_M decodes that
    every back-to-back measurement put 1.3-1.45x too slow are within 1.2x once runs and probe share
    the window."""
    from hrm.analysis.validation import summary

    runs = compare_runs(load_runs_file(RUNS.with_name("llamacpp-cpu-window99.yaml")))
    stats = summary(runs)
    assert len(runs) == 99 and MEDIAN_BAND[0] <= stats["median_ratio"] <= MEDIAN_BAND[1], stats
    assert stats["worst_factor"] <= 1.25 and stats["beyond_1_25x"] == 0, stats
    one_user_q4 = [c.ratio("decode_s") for c in runs if " q4_k_m " in c.name
                   and (" x1 " in c.name or " d0 (llama-bench)" in c.name)]
    assert len(one_user_q4) == 12 and max(one_user_q4) <= 1.2 and min(one_user_q4) >= 1 / 1.2, one_user_q4


def test_mla_per_head_matmuls_cost_more_than_the_dense_curve_and_move_the_deepseek_prefills():
    """gt-deepseekv2's attn_k_b / attn_v_b, measured at their own [K, N, heads] shapes over permuted
    activations (op mmh, §1.9), cost more per element than the [1024 x 1024] curve from 16 rows
    (1.15-4x); without them (the dense curve standing in) its batched Q4_K_M prefills fall
    past 1.25x too fast."""
    from hrm.analysis.validation import summary

    runs_file = load_runs_file(RUNS.with_name("llamacpp-cpu-window99.yaml"))
    section = runs_file.hardware.ggml_cpu
    for kernel in (k for k in section.kernels if k.op == "mmh"):
        dense = next(k for k in section.kernels_of(kernel.type, "mm", kernel.threads) if k.pool_mib is None)
        for rows in (16, 32, 128, 512):
            assert kernel.value(rows) > dense.value(rows), (kernel.type, kernel.shape, kernel.threads, rows)
    without = dataclasses.replace(runs_file, hardware=runs_file.hardware.model_copy(update={
        "ggml_cpu": section.model_copy(update={"kernels": tuple(k for k in section.kernels if k.op != "mmh")})}))
    assert summary(compare_runs(without))["beyond_1_25x"] >= 1


def test_repack_off_prefills_faster_and_the_plain_buffers_kernels_predict_it():
    """llama-bench --repack 1,0 on the three Q4_K_M files, two passes around the kernel probe of both
    buffers (docs/validation/ground_truth.md §1.8): without repacking, the prompt runs 1.18-1.70x
    faster (the repacked MUL_MAT_ID takes a prompt's rows one at a time) and the model, reading the
    plain buffer's kernels for --repack 0, predicts each prefill within 1.20x and the gain's
    direction; the decodes stay the one-user Q4_K_M decodes the cache makes faster than predicted."""
    runs = {c.name: c for c in compare_runs(load_runs_file(RUNS.with_name("llamacpp-cpu-repack.yaml")))}
    assert len(runs) == 6
    for model in ("gt-mixtral", "gt-qwen3moe", "gt-deepseekv2"):
        on, off = (runs[f"{model} q4_k_m t2 d0 repack{r} (llama-bench)"] for r in (1, 0))
        assert off.measured["prefill_s"] < on.measured["prefill_s"] / 1.15  # measured: repack off is faster
        assert off.predicted["prefill_s"] < on.predicted["prefill_s"] / 1.15  # and predicted so
        for c in (on, off):
            assert 1 / 1.2 <= c.ratio("prefill_s") <= 1.2, (c.name, c.ratio("prefill_s"))
            assert 1.0 < c.ratio("decode_s") <= 1.5, (c.name, c.ratio("decode_s"))  # too slow, as §1.7's


def test_the_routing_traces_are_what_the_models_route():
    """routing_traces.py's traces (docs/validation/ground_truth.md §1.7) load with hrm's own
    reader and match each GGUF's experts and top-k; one sequence's decode steps repeat their
    experts far more than independent steps would (the finding the section reports)."""
    import json

    from hrm.model.gguf import read_inventory
    from hrm.model.routing import load_trace

    base = RUNS.parent / "gguf"
    for model in ("gt-mixtral", "gt-qwen3moe", "gt-deepseekv2"):
        inventory = read_inventory(base / f"{model}-q4_k_m.tensors.json")
        routing = load_trace(base / f"{model}.routing.json")
        assert (routing.num_experts, routing.top_k) == (inventory.num_experts, inventory.top_k)
        layers = json.loads((base / f"{model}.routing.json").read_text())["layers"]
        overlap = np.mean([layer["decode_next_step_overlap"] for layer in layers])
        assert overlap > 2 * inventory.top_k / inventory.num_experts, (model, overlap)


def test_llama_cpp_routes_the_ground_truth_models_as_the_traces_say():
    """routing_check.py (docs/validation/ground_truth.md §1.7): llama.cpp's own ffn_moe_topk
    (llama-eval-callback) repeats a token's experts at the next token as often as the
    transformers model does on the same ids, far above independent routing."""
    import json

    data = json.loads((RUNS.parent / "routing-check.json").read_text())["models"]
    assert set(data) == {"gt-mixtral", "gt-qwen3moe", "gt-deepseekv2"}
    for model, row in data.items():
        for fmt in ("f16", "q4_k_m"):
            assert abs(row[fmt]["next_token_overlap"] - row["hf_f32"]["next_token_overlap"]) < 0.05, (model, fmt)
            assert row[fmt]["next_token_overlap"] > 2 * row["independent"], (model, fmt)
        assert row["f16"]["same_experts_as_hf_f32"] > 0.95, model  # f16 = the f32 model's choices


def test_a_prompt_one_token_past_a_query_tile_costs_a_whole_tile_more():
    """ground_truth.md §1.13: llama-bench at 63, 64, 65, 127, 128, 129, 192 and 193 prompt tokens
    (the 3 models, f16 and Q4_K_M, 1 and 2 threads; the probe between the two passes). One token
    past a multiple of 64 adds a query tile that the kernel zero-pads to 64 rows: the engine's own
    prefill jumps (gt-deepseekv2, the heaviest attention: 6-19% for one token), and the predicted
    jump follows the measured one within 3% at every boundary — counting a tile's real rows, the
    model's jump was 0.5-1.5%. Every prefill within 1.10x, median within 0.95-1.05."""
    runs = compare_runs(load_runs_file(RUNS.parent / "llamacpp-cpu-tiles.yaml"))
    assert len(runs) == 96
    prefill = [c.ratio("prefill_s") for c in runs]
    assert worst_factor(prefill) <= 1.10 and 0.95 <= statistics.median(prefill) <= 1.05
    by: dict[tuple, dict] = {}
    for c in runs:
        model, fmt, threads, prompt = c.name.split()[:4]
        by.setdefault((model, fmt, threads), {})[int(prompt[1:])] = c
    assert len(by) == 12
    for key, sweep in by.items():
        for before, after in ((64, 65), (128, 129), (192, 193)):
            measured = sweep[after].measured["prefill_s"] / sweep[before].measured["prefill_s"]
            predicted = sweep[after].predicted["prefill_s"] / sweep[before].predicted["prefill_s"]
            assert abs(np.log(predicted / measured)) <= 0.03, (key, before, measured, predicted)
            if key[0] == "gt-deepseekv2":
                assert measured >= 1.05, (key, before, measured)


def test_a_unified_cache_decoding_64_sequences_computes_every_sequences_cells():
    """ground_truth.md §1.14: llama-batched-bench with and without -kvu (one KV stream for all
    sequences), 16 and 64 sequences, the 3 models in f16 and Q4_K_M, 2 threads. A decode step of 64
    sequences in one stream is 64 query rows, the tiled kernel, whose query tile sees a cell of every
    sequence in every KV tile: the engine's -kvu decode at 64 sequences is 1.2-2.9x its decode with a
    stream per sequence, and the model says so (each pair's slowdown within 13%; every decode within
    1.15x — priced as streams per sequence, -kvu's x64 decodes were 0.34-0.78). At 16 sequences
    (16 rows: the one-row kernel, masked cells skipped) -kvu costs nothing, as predicted."""
    runs = {c.name: c for c in compare_runs(load_runs_file(RUNS.parent / "llamacpp-cpu-kvu.yaml"))}
    assert len(runs) == 24
    decode = [c.ratio("decode_s") for c in runs.values()]
    assert worst_factor(decode) <= 1.15
    for name, unified in runs.items():
        if " kvu " not in name:
            continue
        streams = runs[name.replace(" kvu", "")]
        measured = unified.measured["decode_s"] / streams.measured["decode_s"]
        predicted = unified.predicted["decode_s"] / streams.predicted["decode_s"]
        assert abs(np.log(predicted / measured)) <= 0.13, (name, measured, predicted)
        if " x64 " in name:
            assert measured >= 1.15, (name, measured)
        else:
            assert 0.9 <= measured <= 1.1 and 0.9 <= predicted <= 1.1, (name, measured, predicted)


def test_a_smaller_ubatch_prefills_slower_as_its_passes_reread_the_weights():
    """ground_truth.md §1.15: llama-bench's 512-token prompt at -ub 32, 128 and 512 (16, 4 and 1
    graphs, each reading every weight again), the 3 models in f16 and Q4_K_M at 2 threads, the
    probe between the passes. The engine's -ub 32 prefill is 1.32-1.97x its -ub 512 one; the
    model's slowdown follows within 21% at every file (gt-qwen3moe's is the widest: 1.71 predicted,
    1.42 measured), -ub 128's within 7%; every prefill within 1.25x, median within 0.95-1.05."""
    runs = compare_runs(load_runs_file(RUNS.parent / "llamacpp-cpu-ubatch.yaml"))
    assert len(runs) == 18
    prefill = [c.ratio("prefill_s") for c in runs]
    assert worst_factor(prefill) <= 1.25 and 0.95 <= statistics.median(prefill) <= 1.05
    by: dict[tuple, dict] = {}
    for c in runs:
        model, fmt, _threads, _prompt, ub = c.name.split()[:5]
        by.setdefault((model, fmt), {})[int(ub[2:])] = c
    assert len(by) == 6
    for key, sweep in by.items():
        for ub, within in ((32, 0.21), (128, 0.07)):
            measured = sweep[ub].measured["prefill_s"] / sweep[512].measured["prefill_s"]
            predicted = sweep[ub].predicted["prefill_s"] / sweep[512].predicted["prefill_s"]
            assert abs(np.log(predicted / measured)) <= within, (key, ub, measured, predicted)
            if ub == 32:
                assert measured >= 1.3, (key, measured)


def test_each_part_of_a_prefill_against_the_engines_own_op_timing():
    """ground_truth.md §1.15: llama.cpp's scheduler timed every node of the same 512-token prompts
    (benchmarks/ground_truth/op_times.cpp: the context's eval callback), grouped as the step model
    prices them. Attention and the dense matmuls are within 1.15x at -ub 32 and 512, the routed
    experts within 1.10x at -ub 512; at -ub 32 the experts are where the model is over
    (1.09-1.39x, gt-qwen3moe the most): the probe's curve at ~4 rows an expert."""
    import sys

    sys.path.insert(0, str(RUNS.parents[3] / "benchmarks" / "ground_truth"))
    import json

    from op_times import measured_parts, predicted_parts

    lines = [json.loads(l) for l in (RUNS.parent / "op-times-ubatch.jsonl").read_text().splitlines() if l.strip()]
    assert len(lines) == 12
    over_at_32 = {}
    for line in lines:
        got, want = measured_parts(line), predicted_parts(line, str(RUNS.parent / "this-host-ubatch.yaml"))
        for part in ("attention", "dense"):
            assert abs(np.log(want[part] / got[part])) <= np.log(1.15), (line["model"], line["ubatch"], part)
        ratio = want["experts"] / got["experts"]
        if line["ubatch"] == 512:
            assert abs(np.log(ratio)) <= np.log(1.10), (line["model"], line["format"], ratio)
        else:
            over_at_32[(line["model"], line["format"])] = ratio
    assert all(1.0 < r < 1.45 for r in over_at_32.values())
    assert max(over_at_32, key=over_at_32.get)[0] == "gt-qwen3moe"
