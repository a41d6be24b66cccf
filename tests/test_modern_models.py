"""The models people run now (issue 34 item 1): the committed real config.json files load, and
their parameter counts, weight bytes and KV caches agree with published totals and hand counts.

Tolerances: published totals are rounded (gpt-oss's card to 0.01B, the others to 0.1B or 1B), and
hrm counts the matmul weights, norms, router and sinks but not biases (gpt-oss's q/k/v/o and expert
biases: 0.04B of 116.8B) or q/k norms (< 0.01%), so each check allows the rounding of the published
figure plus 0.1% of the total.
"""

from __future__ import annotations

import json

import pytest

from hrm.cost import costs
from hrm.model.spec import CATALOG_DIR, load_model
from hrm.model.quantized import bits_per_weight

#: (catalog name, total, active, active counts the embedding table, where the totals are published)
PUBLISHED = [
    # OpenAI gpt-oss model card, table 1: 116.83B total, 5.13B active (the unembedding counted as
    # active, the embedding table not): https://cdn.openai.com/pdf/419b6906-9da6-406c-a19d-1bb078ac7637/oai_gpt-oss_model_card.pdf
    ("gpt-oss-120b", 116.83e9, 5.13e9, False, 0.005e9),
    # Qwen3-30B-A3B model card: "Number of Parameters: 30.5B in total and 3.3B activated":
    # https://huggingface.co/Qwen/Qwen3-30B-A3B
    ("qwen3-30b-a3b", 30.5e9, 3.3e9, True, 0.05e9),
    # DeepSeek-V3 README_WEIGHTS.md: main model 671B total, 36.6B activated "including 0.9B for the
    # output Head" (the embedding table not): https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/README_WEIGHTS.md
    ("deepseek-v3", 671e9, 36.6e9, False, 0.5e9),
]


@pytest.mark.parametrize("name,total,active,table,rounding", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_parameter_counts_match_published_totals(name, total, active, table, rounding):
    spec = load_model(name)
    allowed = rounding + 1e-3 * total
    assert abs(costs.total_params(spec) - total) <= allowed, costs.total_params(spec)
    assert abs(costs.active_params(spec, embedding_table=table) - active) <= allowed, costs.active_params(spec, table)


@pytest.mark.parametrize("name", [p[0] for p in PUBLISHED])
def test_catalog_file_is_the_published_config_with_its_source(name, capsys):
    """Every key of the published file is kept (no _source key added; the source sits beside it)."""
    text = (CATALOG_DIR / f"{name}.json").read_text()
    cfg = json.loads(text)
    assert not any(k.startswith("_") for k in cfg)
    source = (CATALOG_DIR / f"{name}.source.txt").read_text()
    assert "huggingface.co/" in source and "commit" in source
    load_model(name)
    assert capsys.readouterr().err == ""  # every key is read or known to be irrelevant


def test_gpt_oss_120b_by_hand():
    """gpt-oss-120b: 36 layers of 128 experts (3 x 2880 x 2880) in MXFP4 (4.25 bits: 32 E2M1 + one
    E8M0 scale), everything else bf16 (modules_to_not_convert), sinks, 18 of 36 layers windowed."""
    spec = load_model("gpt-oss-120b")
    assert (spec.num_experts, spec.top_k, spec.expert_intermediate_size) == (128, 4, 2880)
    assert (spec.weight_format, spec.static_weight_format, spec.attention_sinks) == ("mxfp4", "fp16", True)
    assert (spec.sliding_window, spec.sliding_window_layers) == (128, 18)
    experts = 36 * 128 * 3 * 2880 * 2880
    assert costs.total_expert_bytes(spec) == pytest.approx(experts * 4.25 / 8)
    attention = 2880 * 64 * 64 * 2 + 2 * 2880 * 8 * 64 + 64  # q and o, k and v, the sinks
    static = 36 * (attention + 2 * 2880 + 2880 * 128) + 2 * 201088 * 2880 + 2880
    assert costs.static_weight_bytes(spec) == pytest.approx(static * 2)
    # 61.0 GB of experts + 4.3 GB of bf16: the ~65 GB the MXFP4 checkpoint is known for
    assert 65e9 < costs.total_expert_bytes(spec) + costs.static_weight_bytes(spec) < 65.5e9


def test_gpt_oss_sliding_layers_bound_the_kv_cache():
    """At 4096 tokens the 18 full layers attend to 4096, the 18 windowed ones to 128: the mean
    over layers is (18·4096 + 18·128) / 36; at 100 tokens the window does not bind."""
    spec = load_model("gpt-oss-120b")
    assert float(costs.attended_context(spec, 4096)) == (18 * 4096 + 18 * 128) / 36
    assert float(costs.attended_context(spec, 100)) == 100
    per_token = 2 * 8 * 64 * 2  # K and V of 8 heads of 64, fp16
    op = costs.decode_attention(spec, 1, 4096)
    assert float(op.kv_bytes) == pytest.approx(((18 * 4096 + 18 * 128) / 36 + 1) * per_token)
    assert float(op.flops) == pytest.approx(4 * 64 * 64 * (18 * 4096 + 18 * 128) / 36)
    # prefill of 1000 tokens: full layers 1000²/2 pairs, windowed 128·1000 − 128²/2
    pairs = (18 * 1000 * 1000 / 2 + 18 * (128 * 1000 - 128 * 128 / 2)) / 36
    assert float(costs.prefill_attention(spec, 1, 1000).flops) == pytest.approx(4 * 64 * 64 * pairs)


def test_deepseek_v3_by_hand():
    """DeepSeek-V3: MLA, 3 dense layers, 58 MoE layers of 256 experts + 1 shared, fp8 with one fp32
    scale per 128 x 128 block: 8 + 32 / 16384 bits a weight. The MTP layer is not counted."""
    spec = load_model("deepseek-v3")
    assert (spec.first_dense_layers, spec.num_moe_layers, spec.num_experts, spec.top_k) == (3, 58, 256, 8)
    assert (spec.kv_lora_rank, spec.q_lora_rank, spec.shared_intermediate_size) == (512, 1536, 2048)
    assert spec.weight_format == "fp8-block128" and spec.static_weight_format is None
    assert bits_per_weight("fp8-block128") == 8 + 32 / (128 * 128)
    assert costs.total_expert_bytes(spec) == pytest.approx(58 * 256 * 3 * 7168 * 2048 * (1 + 4 / 128 ** 2))
    assert spec.kv_elements_per_token == 512 + 64  # the latent and the rope key


def test_qwen3_30b_a3b_by_hand():
    spec = load_model("qwen3-30b-a3b")
    assert (spec.num_experts, spec.top_k, spec.expert_intermediate_size, spec.head_dim) == (128, 8, 768, 128)
    assert (spec.num_heads, spec.num_kv_heads, spec.first_dense_layers, spec.sliding_window_layers) == (32, 4, 0, 0)
    assert costs.total_expert_bytes(spec) == 48 * 128 * 3 * 2048 * 768 * 2
