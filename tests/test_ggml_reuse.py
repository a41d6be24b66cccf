"""The llama.cpp CPU step model's reuse distances (hrm.cost.ggml_cpu, docs/model.md §4.10): each
weight's rate is read on the probe's pool curve at the bytes the steps read between two reads of
it. Every expected number here is worked by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hrm.cost.ggml_cpu import (
    REUSE_STEPS,
    StepTraffic,
    kv_bytes_per_token,
    pool_weights,
    reuse_distances_mib,
    seconds_per_element,
    step_traffic,
)
from hrm.model.gguf import AttentionShape, GgufTensor, TensorInventory
from hrm.machine.hardware import CurvePoint, GgmlCpu, GgmlKernel

MIB = 2**20


def test_a_dense_weight_is_reread_after_one_step_of_bytes():
    t = StepTraffic(dense_bytes=10 * MIB, expert_bytes=80 * MIB, touched=0.25, kv_bytes=2 * MIB)
    mib, prob = reuse_distances_mib(t, expert=False)
    assert mib.tolist() == [10 + 2 + 80 * 0.25]
    assert prob.tolist() == [1.0]


def test_an_expert_is_reread_after_a_geometric_number_of_steps():
    t = StepTraffic(dense_bytes=10 * MIB, expert_bytes=80 * MIB, touched=0.25, kv_bytes=2 * MIB)
    mib, prob = reuse_distances_mib(t, expert=True)
    assert len(mib) == REUSE_STEPS
    # next read one step later (chance 1/4): one step's bytes; two steps later (3/4 * 1/4): the
    # dense and KV once and 1 - (3/4)^2 = 7/16 of the experts
    assert mib[0] == pytest.approx(12 + 20)
    assert mib[1] == pytest.approx(12 + 80 * 7 / 16)
    assert prob[0] == pytest.approx(0.25) and prob[1] == pytest.approx(0.1875)
    assert prob.sum() == pytest.approx(1.0)
    assert mib[-1] == pytest.approx(92, rel=1e-6)  # all experts read by then


def test_every_expert_read_each_step_is_a_dense_weight():
    t = StepTraffic(dense_bytes=10 * MIB, expert_bytes=80 * MIB, touched=1.0, kv_bytes=0.0)
    assert reuse_distances_mib(t, expert=True)[0].tolist() == [90.0]


def test_pool_weights_split_in_log_size_and_clamp():
    pools = [16.0, 64.0]
    assert pool_weights(pools, np.array([32.0]), np.array([1.0])).tolist() == pytest.approx([0.5, 0.5])
    assert pool_weights(pools, np.array([8.0]), np.array([1.0])).tolist() == [1.0, 0.0]
    assert pool_weights(pools, np.array([128.0]), np.array([1.0])).tolist() == [0.0, 1.0]
    w = pool_weights([16.0, 32.0, 64.0], np.array([16.0, 64.0, 45.254834]), np.array([0.5, 0.25, 0.25]))
    assert w.tolist() == pytest.approx([0.5, 0.125, 0.375])  # 45.25 MiB = 2^5.5: halfway 32..64


def _flat(pool, y, rows=(1, 16)):
    return GgmlKernel(type="q4_K", op="mm", threads=1, pool_mib=pool,
                      s_per_elem_vs_rows=[CurvePoint(x=r, y=y) for r in rows])


def test_rate_is_the_pool_curve_at_the_reuse_distance():
    sec = GgmlCpu(llama_cpp="t", pool_mib=1024, node_s_vs_threads=[CurvePoint(x=1, y=1e-7)],
                  kernels=(_flat(16.0, 1e-11), _flat(64.0, 3e-11), _flat(None, 5e-11, rows=(1, 16, 512))))
    # 32 MiB: halfway between the 16 and 64 MiB pools in log size
    assert seconds_per_element(sec, "Q4_K", "mm", 1, 1, 32.0) == pytest.approx(2e-11)
    # 256 MiB: halfway between 64 and the 1024 MiB default pool
    assert seconds_per_element(sec, "Q4_K", "mm", 1, 1, 256.0) == pytest.approx(4e-11)
    # a distribution: a quarter at 16 MiB, the rest past the largest pool
    both = (np.array([16.0, 4096.0]), np.array([0.25, 0.75]))
    assert seconds_per_element(sec, "Q4_K", "mm", 1, 1, both) == pytest.approx(0.25e-11 + 3.75e-11)
    # past the small pools' rows only the large pool's curve is measured
    assert seconds_per_element(sec, "Q4_K", "mm", 1, 64, 16.0) == pytest.approx(5e-11)
    assert seconds_per_element(sec, "Q4_K", "mm", 1, 1) == pytest.approx(5e-11)  # no distance: the largest


def _inventory(kv_heads: int, k_width: int, v_width: int) -> TensorInventory:
    tensors = (GgufTensor("blk.0.attn_q.weight", "F16", (256, 256)),
               GgufTensor("blk.0.ffn_up_exps.weight", "Q8_0", (256, 512, 8)),
               GgufTensor("token_embd.weight", "F16", (256, 1000)))
    return TensorInventory("t", "llama", tensors, AttentionShape(2, kv_heads, 4, k_width, v_width), 8, 2)


def test_kv_bytes_per_token_count_mla_latent_once():
    # 2 layers x 4 KV heads x (64 + 64) f16 elements x 2 bytes
    assert kv_bytes_per_token(_inventory(4, 64, 64)) == 2 * 4 * 128 * 2
    # MLA: one head of the 576-wide latent, V a view of it
    assert kv_bytes_per_token(_inventory(1, 576, 512)) == 2 * 576 * 2


def test_step_traffic_by_hand():
    inv = _inventory(4, 64, 64)
    t = step_traffic(inv, tokens=1, sequences=[(1, 100.0)])
    # q: 256*256 f16; the tied output head: 256*1000 f16; experts: 256*512*8 q8_0 (34 bytes / 32)
    assert t.dense_bytes == 2 * (256 * 256 + 256 * 1000)
    assert t.expert_bytes == pytest.approx(256 * 512 * 8 * 34 / 32)
    assert t.touched == pytest.approx(2 / 8)
    assert t.kv_bytes == 100 * 2 * 4 * 128 * 2


def test_ggml_type_of_new_formats():
    from types import SimpleNamespace

    from hrm.cost.ggml_cpu import ggml_type_of

    def spec(fmt, dtype="int4"):
        return SimpleNamespace(weight_format=fmt, weight_dtype=dtype)
    assert ggml_type_of(spec("q4_k_m")) == "q4_K"
    assert ggml_type_of(spec("mix:q4_k*1000,q6_k*300,f32*10")) == "q4_K"  # the most weights
    assert ggml_type_of(spec("mix:q4_k*100,iq2_xxs*900")) == "iq2_xxs"
    assert ggml_type_of(spec("mxfp4")) == "mxfp4"
    assert ggml_type_of(spec(None, "fp16")) == "f16"


# --- attention over the padded cache (docs/model.md §4.10) ----------------------------------

def test_cells_are_the_used_ones_padded_to_256():
    from hrm.cost.ggml_cpu import kv_cells
    assert [kv_cells(n) for n in (1, 32, 256, 257, 1040, 1280)] == [256, 256, 256, 512, 1280, 1280]


def test_split_kv_waits_for_the_thread_with_the_most_used_cells():
    from hrm.cost.ggml_cpu import split_kv_cells
    # 1,040 used of 1,280 cells on 2 threads: chunks of 640, the first all used -> 2 x 640
    assert split_kv_cells(2, 1040) == 1280
    # 4 threads: chunks of 320; the thread with the most used cells has a whole chunk
    assert split_kv_cells(4, 1040) == 1280
    # 1,300 used of 1,536 cells on 2 threads: chunks of 768 -> 1,536
    assert split_kv_cells(2, 1300) == 1536
    # one thread, or a cache under 512 cells (the heads are split instead): the used cells
    assert split_kv_cells(1, 1040) == 1040 and split_kv_cells(2, 200) == 200


def test_a_causal_tile_computes_every_kv_tile_its_last_query_sees():
    from hrm.cost.ggml_cpu import prefill_steps, tiled_cells
    # a 128-token prompt at depth 0: the first 64 queries see <= 64 tokens (one KV tile), the
    # next 64 see <= 128 (two tiles): (64 x 64 + 64 x 128) / 128 = 96 cells a query
    (_, _, [(q, kv)]), = prefill_steps(1, 128, 0, 2048, 512)
    assert (q, kv) == (128, 64.5) and tiled_cells(q, kv) == 96
    # at depth 1024: (64 x 1088 + 64 x 1152) / 128 = 1120
    (_, _, [(q, kv)]), = prefill_steps(1, 128, 1024, 2048, 512)
    assert tiled_cells(q, kv) == 1120
    # a partial last tile costs a whole one (its Q tile zero padded): 100 queries at depth 0 ->
    # (64 x 64 + 64 x 128) / 100, not (64 x 64 + 36 x 128) / 100
    (_, _, [(q, kv)]), = prefill_steps(1, 100, 0, 2048, 512)
    assert tiled_cells(q, kv) == pytest.approx((64 * 64 + 64 * 128) / 100)


def test_query_tiles_follow_the_kernels_chunks_per_thread():
    """ops.cpp flash_attn_ext_f16: rows x heads cut into 4 chunks a thread, tiles end at a chunk's or
    a head's end; hand-cut."""
    from hrm.cost.ggml_cells import causal_tiled_pairs, query_tiles
    # 97 rows x 16 heads on 2 threads: 8 chunks of 194 = two heads each -> a 64- and a 33-row tile a head
    assert query_tiles(97, 16, 2) == {(0, 0, 64): 16, (0, 64, 33): 16}
    # one head of 100 rows on 2 threads: 8 chunks of 13 rows (the last 9), each its own padded tile
    assert query_tiles(100, 1, 2) == {(0, s, 13): 1 for s in range(0, 91, 13)} | {(0, 91, 9): 1}
    # ... so the causal prompt at depth 0 (first query sees 1 token) computes 4 tiles over one KV tile
    # and 4 over two, 64 rows each
    assert causal_tiled_pairs(100, [1], 1, 2) == 64 * 64 * (4 * 1 + 4 * 2)
    # one thread: one chunk; two streams of 64 rows, 2 heads: every (stream, head) one tile
    assert query_tiles(64, 2, 1, streams=2) == {(0, 0, 64): 2, (1, 0, 64): 2}
    # stream 1's queries come after 64 cached tokens: two KV tiles, per head
    assert causal_tiled_pairs(64, [1, 65], 2, 1) == 64 * 64 * (1 + 2)


def test_padded_cache_attention_brings_the_depth_decodes_onto_their_window_runs():
    """The one-window runs (docs/validation/ground_truth.md §1.1): the depth-1024 decodes at 2
    threads, too fast at 0.75-0.91 with attention over the used cells only, come to 0.81-0.97
    with the split-KV wait, and no time of the window is beyond 1.25x."""
    from hrm.analysis.validation import compare_runs, load_runs_file, summary

    window = compare_runs(load_runs_file(Path(__file__).parents[1] / "docs/validation/runs/llamacpp-cpu-window.yaml"))
    depth = [c.ratio("decode_s") for c in window if " d1024 " in c.name]
    assert len(depth) == 9 and 0.80 <= min(depth) and max(depth) <= 1.0
    assert summary(window)["beyond_1_25x"] == 0


@pytest.mark.parametrize("runs, threads", [("llamacpp-cpu-window-tm.yaml", 2), ("llamacpp-cpu-window-tm-t1.yaml", 1)])
def test_the_engine_layout_probe_holds_its_window_runs(runs, threads):
    """Two one-window measurements (docs/validation/ground_truth.md §1.4) whose probe attends
    through llama.cpp's own cache views (a cell's KV heads in one row): every one of the 36
    prefill and decode times within 1.25x, the median within 0.9-1.1, and the depth-1024 decodes,
    too fast at 0.75-0.97 with the contiguous probe (and up to 1.8x at 1 thread), within 0.88-1.05."""
    from hrm.analysis.validation import compare_runs, load_runs_file, summary

    window = compare_runs(load_runs_file(Path(__file__).parents[1] / "docs/validation/runs" / runs))
    assert len(window) == 18 and all(f" t{threads} " in c.name for c in window)
    stats = summary(window)
    assert stats["beyond_1_25x"] == 0 and 0.9 <= stats["median_ratio"] <= 1.1, stats
    depth = [c.ratio("decode_s") for c in window if " d1024 " in c.name]
    assert len(depth) == 9 and 0.88 <= min(depth) and max(depth) <= 1.05, depth


def test_mla_value_decompression_multiplies_each_streams_rows_apart():
    """attn_v_b runs after the batch is split into the KV cache's streams (src/llama-graph.cpp:2629-2681):
    with a stream per sequence (llama.cpp's default), 16 sequences of 32 tokens cost 16 products of 32 rows;
    with one unified stream, one product of 512 rows. Every other weight takes the step's 512 rows."""
    from hrm.cost.ggml_cpu import step_time

    rate = {1: 1e-11, 32: 2e-10, 512: 2e-9}  # seconds per weight element at those rows (not linear in rows)
    curve = [CurvePoint(x=r, y=y) for r, y in rate.items()]
    sec = GgmlCpu(llama_cpp="t", pool_mib=1024, node_s_vs_threads=[CurvePoint(x=1, y=1e-7)],
                  kernels=(GgmlKernel(type="q4_K", op="mm", threads=1, s_per_elem_vs_rows=curve),
                           GgmlKernel(type="f16", op="fa1", threads=1, s_per_elem_vs_rows=[CurvePoint(x=1, y=1e-12),
                                                                                          CurvePoint(x=1e6, y=1e-12)])))
    v_b = GgufTensor("blk.0.attn_v_b.weight", "Q4_K", (256, 64, 16))
    q_a = GgufTensor("blk.0.attn_q_a.weight", "Q4_K", (1024, 384))
    inv = TensorInventory("t", "deepseek2", (v_b, q_a), AttentionShape(1, 1, 16, 288, 256), 0, 0)
    seqs = [(32, 16.5)] * 16
    apart = step_time(inv, sec, 1, 512, 16, seqs).dense_s
    unified = step_time(inv, sec, 1, 512, 16, seqs, kv_unified=True).dense_s
    assert apart == pytest.approx(16 * v_b.elements * rate[32] + q_a.elements * rate[512])
    assert unified == pytest.approx((v_b.elements + q_a.elements) * rate[512])


def test_a_per_head_weight_reads_the_per_head_curve_nearest_its_shape():
    """MLA's [K, N, heads] weights take the probe's per-head matmul (op mmh) measured nearest their
    shape, not the [1024 x 1024] curve; a 2-D weight keeps the dense curve."""
    from hrm.cost.ggml_cpu import per_head_kernel, step_time

    def kernel(op, y, shape=None):
        return GgmlKernel(type="q4_K", op=op, threads=1, shape=shape,
                          s_per_elem_vs_rows=[CurvePoint(x=1, y=y), CurvePoint(x=512, y=512 * y)])
    near, far = kernel("mmh", 3e-12, "256:64:16"), kernel("mmh", 7e-12, "512:128:128")
    sec = GgmlCpu(llama_cpp="t", pool_mib=1024, node_s_vs_threads=[CurvePoint(x=1, y=1e-7)],
                  kernels=(kernel("mm", 1e-12), near, far,
                           GgmlKernel(type="f16", op="fa1", threads=1, s_per_elem_vs_rows=[CurvePoint(x=1, y=1e-12)])))
    assert per_head_kernel(sec, "Q4_K", 1, "256:64:16") is near
    assert per_head_kernel(sec, "Q4_K", 1, "128:512:128") is far
    assert per_head_kernel(sec, "Q8_0", 1, "256:64:16") is None
    v_b = GgufTensor("blk.0.attn_v_b.weight", "Q4_K", (256, 64, 16))
    q_a = GgufTensor("blk.0.attn_q_a.weight", "Q4_K", (1024, 384))
    inv = TensorInventory("t", "deepseek2", (v_b, q_a), AttentionShape(1, 1, 16, 288, 256), 0, 0)
    got = step_time(inv, sec, 1, 64, 2, [(32, 16.5)] * 2).dense_s
    rate_32 = 3e-12 + (32 - 1) * (512 * 3e-12 - 3e-12) / 511  # the near curve at a stream's 32 rows
    rate_64 = 1e-12 + (64 - 1) * (512e-12 - 1e-12) / 511  # the dense curve at the step's 64 rows
    assert got == pytest.approx(2 * v_b.elements * rate_32 + q_a.elements * rate_64)


def test_per_head_shapes_are_the_3d_dense_weights_of_the_files():
    """What `hrm profile --llama-cpp DIR --gguf FILE` measures: MLA's attn_k_b / attn_v_b at their own
    [K, N, heads] and type; a model without MLA has none."""
    from profiler.ggml_cpu import per_head_shapes

    tables = Path(__file__).resolve().parents[1] / "docs/validation/runs/gguf"
    assert per_head_shapes([tables / "gt-deepseekv2-q4_k_m.tensors.json"]) == [("q4_K", "256:64:16"), ("q5_0", "64:256:16")]
    assert per_head_shapes([tables / "gt-mixtral-q4_k_m.tensors.json", tables / "gt-qwen3moe-f16.tensors.json"]) == []
