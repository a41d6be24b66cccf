"""Operator FLOPs/bytes against hand computation (tiny-mixtral: h=64, nq=4, nkv=2, d=16,
ne=4, k=2, h2=128, vocab 256, fp16 everywhere), parameter counts against published sizes."""

import pytest

from hrm.cost import costs
from hrm.model.spec import load_model


def test_pre_attention_by_hand(tiny):
    op = costs.pre_attention(tiny, 3)
    # norm 4·3·64 = 768; QKV 2·3·64·(64+32+32) = 49152
    assert op.flops == 49920
    assert op.weight_bytes == (64 * 128 + 64) * 2
    assert op.act_bytes == 3 * (64 + 128) * 2


def test_decode_attention_by_hand(tiny):
    op = costs.decode_attention(tiny, 3, 10)
    assert op.flops == 4 * 3 * 4 * 16 * 10  # QK^T + PV, 2·c·d each per head
    assert op.kv_bytes == 3 * 11 * (2 * 2 * 16) * 2  # 10 cached + 1 new token, K and V
    assert op.act_bytes == 3 * (128 + 64) * 2


def test_post_attention_and_experts_by_hand(tiny):
    post = costs.post_attention(tiny, 3)
    assert post.flops == 2 * 3 * (64 * 64 + 64 * 4) + 4 * 3 * 64
    assert post.weight_bytes == (64 * 64 + 64 * 4 + 64) * 2
    experts = costs.routed_experts(tiny, 3)
    assert experts.flops == 2 * 3 * 2 * (3 * 64 * 128)
    distinct = 4 * (1 - 0.5**3)  # 3.5 experts expected for 3 tokens, top-2 of 4
    assert experts.weight_bytes == pytest.approx(distinct * 3 * 64 * 128 * 2)


def test_prefill_attention_is_causal(tiny):
    op = costs.prefill_attention(tiny, 2, 8)
    assert op.flops == 2 * 2 * 4 * 16 * 8 * 8  # half of 2·(2·s²·d) per head
    assert op.kv_bytes == 2 * 8 * 64 * 2


def test_lm_head_by_hand(tiny):
    op = costs.lm_head(tiny, 5)
    assert op.flops == 2 * 5 * 64 * 256 + 4 * 5 * 64


def test_expert_bytes_top_k_then_all(tiny):
    one = costs.routed_experts(tiny, 1).weight_bytes
    assert one == pytest.approx(tiny.top_k * costs.expert_bytes(tiny))
    many = costs.routed_experts(tiny, 512).weight_bytes
    assert many == pytest.approx(costs.layer_expert_bytes(tiny), rel=1e-9)
    values = [costs.routed_experts(tiny, t).weight_bytes for t in (1, 2, 4, 8, 16)]
    assert all(a < b for a, b in zip(values, values[1:]))


@pytest.mark.parametrize("name,billions", [("mixtral", 46.7), ("dbrx", 132), ("mixtral-8x22b", 141)])
def test_parameter_counts(name, billions):
    assert costs.total_params(load_model(name)) / 1e9 == pytest.approx(billions, rel=0.01)


def test_dtypes_change_bytes():
    fp16 = load_model("mixtral")
    int4 = load_model("mixtral", weight_dtype="int4", kv_dtype="int8")
    assert costs.expert_bytes(int4) == costs.expert_bytes(fp16) / 4
    assert costs.kv_bytes_per_token(int4) == costs.kv_bytes_per_token(fp16) / 2


def test_mla_kv_is_latent():
    spec = load_model("deepseek-v2-lite")
    assert spec.kv_elements_per_token == 512 + 64
    assert costs.kv_bytes_per_token(spec) == (512 + 64) * 2


def test_shared_experts_and_dense_first_layer():
    spec = load_model("tiny-deepseek")
    assert spec.first_dense_layers == 1 and spec.dense_intermediate_size == 192
    assert spec.shared_intermediate_size == 2 * 32
    post = costs.post_attention(spec, 1)
    assert post.weight_bytes == (64 * 64 + 64 * 8 + 3 * 64 * 64 + 64) * 2
    ops = costs.decode_layer_ops(spec, 1, 4, moe=False)
    assert ops.ffn.flops == 2 * 3 * 64 * 192
