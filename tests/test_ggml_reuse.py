"""The llama.cpp CPU step model's reuse distances (hrm.cost.ggml_cpu, docs/model.md §4.10): each
weight's rate is read on the probe's pool curve at the bytes the steps read between two reads of
it. Every expected number here is worked by hand."""

from __future__ import annotations

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
