"""Operator costs (docs/model.md §4.1): FLOPs and bytes of every operator of a layer.

Each operator reports its FLOPs and the bytes it touches, split by *what* they are
(weights, KV cache, activations) rather than by level: the policy decides where each kind
lives, and :mod:`hrm.cost.latency` turns them into bytes per memory level (paper Def. 3.1, the
general operational intensity I_x^i). All functions are vectorised: ``tokens`` and
``context`` may be numpy arrays and broadcast.

Counting conventions (what a hand computation must reproduce):
- a matmul of (m × k) by (k × n) costs 2·m·k·n FLOPs; RMSNorm costs 4 FLOPs per element;
  softmax, RoPE, SiLU and residual adds are not counted (elementwise, < 1% of a layer);
- weights bytes = parameters × weight dtype (a quantized model with a stored format: × its
  bits per weight / 8, scales included, :func:`weight_bytes_per_param`); activation bytes =
  elements read + written × activation dtype; KV bytes = cache elements read (+ the new
  token's elements written) × KV dtype;
- decode attention over a context of c tokens: QK^T and PV cost 2·c·d each per query head
  (MLA: scores over the latent+rope width, values over the latent width);
- prefill attention over s tokens is causal: half of the s² score matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model.spec import ModelSpec
from ..model.routing import expected_distinct_experts as expected_distinct_given, uniform_distinct_experts
from ..model.quantized import bits_per_weight
from ..units import FLOAT_DTYPES, dtype_bytes


@dataclass(frozen=True)
class OpCost:
    """FLOPs and bytes of one operator (arrays broadcast over tokens/context)."""

    name: str
    flops: np.ndarray | float
    weight_bytes: np.ndarray | float = 0.0
    kv_bytes: np.ndarray | float = 0.0
    act_bytes: np.ndarray | float = 0.0
    #: its weights are quantized (int8/int4): a GEMM in the engine's dequantizing kernel
    #: family where it names one (:func:`hrm.cost.latency.ops.gpu_time_s`, :mod:`hrm.model.quantized`)
    quantized: bool = False

    @property
    def bytes(self):
        """All bytes the operator touches in the memory of the tier that runs it."""
        return self.weight_bytes + self.kv_bytes + self.act_bytes

    def intensity(self):
        """Operational intensity FLOP/byte over all bytes (paper Def. 3.1, single level)."""
        return self.flops / np.maximum(self.bytes, 1e-30)


def weight_bytes_per_param(model: ModelSpec) -> float:
    """Bytes per weight of ``model``: its stored format's, scales and mins included
    (:data:`hrm.model.quantized.WEIGHT_FORMATS`), or without one its dtype's packed payload
    (today's count: unchanged for every float model)."""
    if model.weight_format is None:
        return dtype_bytes(model.weight_dtype)
    return bits_per_weight(model.weight_format) / 8.0


def quantized_weights(model: ModelSpec) -> bool:
    """Whether ``model``'s GEMM weights are quantized (int8/int4): their GEMMs dequantize."""
    return model.weight_dtype not in FLOAT_DTYPES


def static_bytes_per_param(model: ModelSpec) -> float:
    """Bytes per weight of everything but the routed experts (attention, router, shared
    experts, dense layers, embeddings): the model's ``static_weight_format`` (a float dtype or
    a weight format) where it has one, else the experts' (:func:`weight_bytes_per_param`)."""
    fmt = model.static_weight_format
    if fmt is None:
        return weight_bytes_per_param(model)
    if fmt in FLOAT_DTYPES:
        return dtype_bytes(fmt)
    return bits_per_weight(fmt) / 8.0


def static_quantized(model: ModelSpec) -> bool:
    """Whether the weights other than the routed experts are quantized (their GEMMs dequantize)."""
    fmt = model.static_weight_format
    return quantized_weights(model) if fmt is None else fmt not in FLOAT_DTYPES


def _layer_mean(model: ModelSpec, full, local):
    """A per-layer quantity averaged over the layers: ``full`` in the full-attention layers,
    ``local`` in the ``sliding_window_layers`` local ones."""
    local_layers = model.sliding_window_layers
    return ((model.num_layers - local_layers) * full + local_layers * local) / model.num_layers


def chunk_position_tokens(context, chunk):
    """Tokens of its aligned chunk of ``chunk`` tokens that the query at position ``context`` − 1
    sees, itself included: ((c − 1) mod C) + 1 for c ≥ 1 (C at a chunk's last position, 1 at the
    next one), 0 for an empty context; written c − C·(⌈c/C⌉ − 1) so a fractional mean context
    stays in (0, C]."""
    context = np.asarray(context, dtype=float)
    return context - chunk * np.maximum(np.ceil(context / chunk) - 1, 0.0)


def attended_context(model: ModelSpec, context):
    """Tokens one new token's attention reads at context ``context``, averaged over the layers
    (docs/model.md §3.2): a full layer reads c; a sliding layer min(c, w); a chunked layer the
    tokens of its chunk so far, ((c − 1) mod C) + 1 (:func:`chunk_position_tokens`). Every kind
    counts c as llama.cpp's mask (is_masked_swa, standard and chunked: src/llama-hparams.h:482-495 at
    ggml-org/llama.cpp@0c1e57098bba43ac29e6e3b677cdceebdd22334f) does for a query at position c − 1,
    itself included. Decode passes the tokens cached before the step, so every kind is one short
    of the exact count alike (the new token's own key, whose bytes :func:`decode_attention`
    counts as the write).
    Equal to ``context`` for a model without local layers."""
    context = np.asarray(context, dtype=float)
    if not model.sliding_window_layers:
        return context
    w = float(model.sliding_window)
    local = chunk_position_tokens(context, w) if model.local_attention == "chunked" else np.minimum(context, w)
    return _layer_mean(model, context, local)


def read_breakpoints(model: ModelSpec, first: int, last: int) -> np.ndarray:
    """Contexts in [``first``, ``last``] where :func:`attended_context` stops being affine in the
    context, such that it is affine from each to the next: a sliding window's w (the reads stop
    growing), each chunk's last and first context k·C and k·C + 1 (the reads fall from C to 1).
    A step sum that needs every decode coefficient convex in the context (the search's pieces and
    bounds, :mod:`solver.lanes.terms`) splits there: between them it is as without local layers."""
    if not model.sliding_window_layers:
        return np.zeros(0)
    w = int(model.sliding_window)
    if model.local_attention == "chunked":
        ends = np.arange(max(first // w, 1), last // w + 1) * w
        points = np.concatenate([ends, ends + 1])
    else:
        points = np.array([w])
    points = np.unique(points)
    return points[(points >= first) & (points <= last)].astype(float)


def kept_context(model: ModelSpec, context):
    """Tokens of KV cache one sequence of ``context`` tokens keeps, averaged over the layers: a
    full layer all c, a local layer (sliding or chunked) at most its window, min(c, w): the
    worst position over the sequence, not the current one. At ggml-org/llama.cpp@0c1e57098bba43ac29e6e3b677cdceebdd22334f
    a cell is reused once masked for the sequence's next position (src/llama-kv-cache.cpp:1057),
    so a chunked layer holds a whole chunk at each chunk's last position, and both kinds' cache is
    sized alike, n_swa · n_seq_max + n_ubatch cells padded to 256 (src/llama-kv-cache-iswa.cpp:73;
    the n_ubatch slack is not counted)."""
    context = np.asarray(context, dtype=float)
    if not model.sliding_window_layers:
        return context
    return _layer_mean(model, context, np.minimum(context, float(model.sliding_window)))


def attended_pairs(model: ModelSpec, prompt_len):
    """(query, key) pairs of causal attention over a prompt of ``prompt_len`` tokens from an empty
    cache, averaged over the layers, each the integral over the query positions of the keys
    :func:`attended_context` counts there: s²/2 in a full layer; with a sliding window w < s,
    w·s − w²/2 (each token sees at most w); in chunks of C, q·C²/2 + r²/2 for s = q·C + r."""
    s = np.asarray(prompt_len, dtype=float)
    full = s * s / 2
    if not model.sliding_window_layers:
        return full
    w = float(model.sliding_window)
    if model.local_attention == "chunked":
        whole = np.floor(s / w)
        local = whole * w * w / 2 + (s - whole * w) ** 2 / 2
    else:
        local = np.where(s <= w, full, w * s - w * w / 2)
    return _layer_mean(model, full, local)


def expected_distinct_experts(model: ModelSpec, tokens):
    """Expected number of distinct experts touched by ``tokens`` tokens: under uniform
    top-k routing ne·(1 − (1 − k/ne)^tokens) (docs/model.md §4.1; k for one token); under the
    model's routing distribution Σ_e 1 − (1 − q_e)^tokens averaged over layers
    (:mod:`hrm.model.routing`)."""
    if model.routing is not None:
        return expected_distinct_given(model.routing, tokens)
    return uniform_distinct_experts(model.num_experts, model.top_k, tokens)


# --- parameter counts -------------------------------------------------------------------

def attention_params(model: ModelSpec) -> int:
    """Projection parameters of one attention block (q, k, v, o; MLA: q, kv_a, kv_b, o)."""
    h = model.hidden_size
    if model.is_mla:
        q = h * model.q_dim if model.q_lora_rank is None else h * model.q_lora_rank + model.q_lora_rank * model.q_dim
        kv_a = h * (model.kv_lora_rank + model.qk_rope_head_dim)
        kv_b = model.kv_lora_rank * model.num_heads * (model.qk_nope_head_dim + model.v_head_dim)
        return q + kv_a + kv_b + model.attn_out_dim * h + sink_params(model)
    return h * model.q_dim + 2 * h * model.kv_dim + model.attn_out_dim * h + sink_params(model)


def sink_params(model: ModelSpec) -> int:
    """Attention sinks (gpt-oss): one learned logit per query head and layer."""
    return model.num_heads if model.attention_sinks else 0


def expert_params(model: ModelSpec) -> int:
    """One routed expert: SwiGLU gate, up and down matrices (3·h1·h2)."""
    return 3 * model.hidden_size * model.expert_intermediate_size


def shared_params(model: ModelSpec) -> int:
    gate = model.hidden_size if model.shared_expert_gate and model.shared_intermediate_size else 0
    return 3 * model.hidden_size * model.shared_intermediate_size + gate


def norm_params(model: ModelSpec) -> int:
    extra = model.kv_lora_rank if model.is_mla else 0
    return 2 * model.hidden_size + extra


def router_params(model: ModelSpec) -> int:
    """The gate's h × ne matrix (none for a one-expert model)."""
    return model.hidden_size * model.num_experts if model.num_experts > 1 else 0


def moe_layer_static_params(model: ModelSpec) -> int:
    """Parameters of an MoE layer that always stay on the GPU (non-expert): attention,
    norms, router, shared experts."""
    return attention_params(model) + norm_params(model) + router_params(model) + shared_params(model)


def dense_layer_params(model: ModelSpec) -> int:
    """A dense first layer (DeepSeek first_k_dense_replace): attention + dense MLP."""
    return attention_params(model) + norm_params(model) + 3 * model.hidden_size * model.dense_intermediate_size


def embedding_params(model: ModelSpec) -> int:
    """Token embedding, final norm and lm_head (once if tied)."""
    table = model.vocab_size * model.hidden_size
    return table * (1 if model.tie_embeddings else 2) + model.hidden_size


def total_params(model: ModelSpec) -> int:
    moe = model.num_moe_layers * (moe_layer_static_params(model) + model.num_experts * expert_params(model))
    return moe + model.first_dense_layers * dense_layer_params(model) + embedding_params(model)


def active_params(model: ModelSpec, embedding_table: bool = True) -> int:
    """Parameters one token uses: every layer's non-expert weights, top-k routed experts, the
    final norm and lm_head, and (``embedding_table``) the token-embedding table. Publishers
    differ on the table (a row lookup, not a matmul): Qwen counts it, OpenAI's gpt-oss card
    and DeepSeek-V3's README_WEIGHTS.md do not."""
    moe = model.num_moe_layers * (moe_layer_static_params(model) + model.top_k * expert_params(model))
    table = model.vocab_size * model.hidden_size
    head = embedding_params(model) - (0 if model.tie_embeddings else table)
    return moe + model.first_dense_layers * dense_layer_params(model) + head + (table if embedding_table else 0)


def expert_bytes(model: ModelSpec) -> float:
    return expert_params(model) * weight_bytes_per_param(model)


def layer_expert_bytes(model: ModelSpec) -> float:
    """All routed-expert weights of one MoE layer (the offloadable part, W_L at r_w = 0)."""
    return model.num_experts * expert_bytes(model)


def total_expert_bytes(model: ModelSpec) -> float:
    return model.num_moe_layers * layer_expert_bytes(model)


def static_weight_bytes(model: ModelSpec) -> float:
    """Weights that always stay on the GPU: non-expert weights of every layer + embeddings."""
    params = (
        model.num_moe_layers * moe_layer_static_params(model)
        + model.first_dense_layers * dense_layer_params(model)
        + embedding_params(model)
    )
    return params * static_bytes_per_param(model)


def kv_bytes_per_token(model: ModelSpec) -> float:
    """KV-cache bytes of one token in one layer."""
    return model.kv_elements_per_token * dtype_bytes(model.kv_dtype)


# --- per-layer operators ----------------------------------------------------------------

def pre_attention(model: ModelSpec, tokens) -> OpCost:
    """Input RMSNorm + QKV projection for ``tokens`` tokens (MLA: q, kv_a, kv_a norm)."""
    h, wb, ab = model.hidden_size, static_bytes_per_param(model), dtype_bytes(model.activation_dtype)
    tokens = np.asarray(tokens, dtype=float)
    if model.is_mla:
        proj_params = attention_params(model) - model.attn_out_dim * h - model.kv_lora_rank * model.num_heads * (
            model.qk_nope_head_dim + model.v_head_dim
        ) - sink_params(model)
        out_width = model.q_dim + model.kv_lora_rank + model.qk_rope_head_dim
        norm_flops = 4 * tokens * (h + model.kv_lora_rank)
        norm_weights = h + model.kv_lora_rank
    else:
        proj_params = h * (model.q_dim + 2 * model.kv_dim)
        out_width = model.q_dim + 2 * model.kv_dim
        norm_flops = 4 * tokens * h
        norm_weights = h
    return OpCost(
        "pre_attn",
        flops=norm_flops + 2 * tokens * proj_params,
        weight_bytes=(proj_params + norm_weights) * wb,
        act_bytes=tokens * (h + out_width) * ab,
        quantized=static_quantized(model),
    )


def qkv_width(model: ModelSpec) -> int:
    """Elements per token leaving pre-attention (the QKV the paper's D1 moves to the CPU)."""
    if model.is_mla:
        return model.q_dim + model.kv_lora_rank + model.qk_rope_head_dim
    return model.q_dim + 2 * model.kv_dim


def decode_attention(model: ModelSpec, tokens, context) -> OpCost:
    """Attention core for ``tokens`` sequences each attending to ``context`` cached tokens
    (paper Fig. 4: excludes QKVO projections). Reads the cache, writes one new token."""
    tokens = np.asarray(tokens, dtype=float)
    context = attended_context(model, context)  # local layers read at most their window or chunk
    kvb, ab = dtype_bytes(model.kv_dtype), dtype_bytes(model.activation_dtype)
    nq = model.num_heads
    if model.is_mla:
        r, rope = model.kv_lora_rank, model.qk_rope_head_dim
        # absorbed MLA: q_nope·W_UK and out·W_UV (kv_b weights) + scores/values over the latent
        absorb = 2 * tokens * nq * r * (model.qk_nope_head_dim + model.v_head_dim)
        core = 2 * tokens * nq * context * (r + rope) + 2 * tokens * nq * context * r
        flops = absorb + core
        weights = r * nq * (model.qk_nope_head_dim + model.v_head_dim) * static_bytes_per_param(model)
    else:
        flops = 4 * tokens * nq * model.head_dim * context
        weights = 0.0
    kv = tokens * (context + 1) * model.kv_elements_per_token * kvb
    act = tokens * (qkv_width(model) + model.attn_out_dim) * ab
    return OpCost("attention", flops=flops, weight_bytes=weights, kv_bytes=kv, act_bytes=act)


def prefill_attention(model: ModelSpec, sequences, prompt_len) -> OpCost:
    """Causal attention over ``prompt_len`` tokens for ``sequences`` sequences; writes the
    prompt's KV cache (MLA: non-absorbed, kv_b expands the latent for every token)."""
    seqs = np.asarray(sequences, dtype=float)
    s = np.asarray(prompt_len, dtype=float)
    kvb, ab = dtype_bytes(model.kv_dtype), dtype_bytes(model.activation_dtype)
    nq = model.num_heads
    if model.is_mla:
        expand = 2 * seqs * s * model.kv_lora_rank * nq * (model.qk_nope_head_dim + model.v_head_dim)
        qk_dim, v_dim = model.qk_nope_head_dim + model.qk_rope_head_dim, model.v_head_dim
        flops = expand + 2 * seqs * attended_pairs(model, s) * nq * (qk_dim + v_dim)
        weights = model.kv_lora_rank * nq * (model.qk_nope_head_dim + model.v_head_dim) * static_bytes_per_param(model)
    else:
        flops = 4 * seqs * nq * model.head_dim * attended_pairs(model, s)  # QK^T and PV over the causal pairs
        weights = 0.0
    kv = seqs * s * model.kv_elements_per_token * kvb
    act = seqs * s * (qkv_width(model) + model.attn_out_dim) * ab
    return OpCost("attention", flops=flops, weight_bytes=weights, kv_bytes=kv, act_bytes=act)


def post_attention(model: ModelSpec, tokens) -> OpCost:
    """O projection, post-attention RMSNorm, router and shared experts (GPU-static part)."""
    tokens = np.asarray(tokens, dtype=float)
    h, wb, ab = model.hidden_size, static_bytes_per_param(model), dtype_bytes(model.activation_dtype)
    o_params = model.attn_out_dim * h
    router = router_params(model)
    shared = shared_params(model)
    flops = 2 * tokens * (o_params + router + shared) + 4 * tokens * h
    act = tokens * (model.attn_out_dim + 2 * h + model.num_experts + (2 * model.shared_intermediate_size)) * ab
    return OpCost("post_attn", flops=flops, weight_bytes=(o_params + router + shared + h) * wb, act_bytes=act,
                  quantized=static_quantized(model))


def routed_experts(model: ModelSpec, tokens) -> OpCost:
    """Routed experts for ``tokens`` tokens: FLOPs use top-k; weight bytes use the expected
    number of distinct experts the tokens touch (docs/model.md §4.1)."""
    tokens = np.asarray(tokens, dtype=float)
    h, h2 = model.hidden_size, model.expert_intermediate_size
    ab = dtype_bytes(model.activation_dtype)
    flops = 2 * tokens * model.top_k * expert_params(model)
    weights = expected_distinct_experts(model, tokens) * expert_bytes(model)
    act = tokens * model.top_k * (2 * h + 3 * h2) * ab
    return OpCost("experts", flops=flops, weight_bytes=weights, act_bytes=act, quantized=quantized_weights(model))


def router(model: ModelSpec, tokens) -> OpCost:
    """The gate alone (its part of :func:`post_attention`): 2·h·ne FLOPs per token, its
    weights once, the hidden states in and the logits out."""
    tokens = np.asarray(tokens, dtype=float)
    ab = dtype_bytes(model.activation_dtype)
    return OpCost("router", flops=2 * tokens * router_params(model),
                  weight_bytes=router_params(model) * static_bytes_per_param(model) + 0 * tokens,
                  act_bytes=tokens * (model.hidden_size + model.num_experts) * ab)


def single_expert(model: ModelSpec, tokens) -> OpCost:
    """One routed expert's SwiGLU on ``tokens`` tokens (expected, may be fractional): its
    weights read once, 2·3·h·h2 FLOPs per token."""
    tokens = np.asarray(tokens, dtype=float)
    act = tokens * (2 * model.hidden_size + 3 * model.expert_intermediate_size) * dtype_bytes(model.activation_dtype)
    return OpCost("expert", flops=2 * tokens * expert_params(model), weight_bytes=expert_bytes(model) + 0 * tokens,
                  act_bytes=act, quantized=quantized_weights(model))


def dense_mlp(model: ModelSpec, tokens) -> OpCost:
    """Dense MLP of a first dense layer (static on GPU)."""
    tokens = np.asarray(tokens, dtype=float)
    h, hd = model.hidden_size, model.dense_intermediate_size
    params = 3 * h * hd
    ab = dtype_bytes(model.activation_dtype)
    return OpCost(
        "dense_mlp", flops=2 * tokens * params, weight_bytes=params * static_bytes_per_param(model),
        act_bytes=tokens * (2 * h + 3 * hd) * ab, quantized=static_quantized(model),
    )


def lm_head(model: ModelSpec, tokens) -> OpCost:
    """Embedding lookup + final norm + lm_head for ``tokens`` tokens (model level)."""
    tokens = np.asarray(tokens, dtype=float)
    h, v = model.hidden_size, model.vocab_size
    wb, ab = static_bytes_per_param(model), dtype_bytes(model.activation_dtype)
    flops = 2 * tokens * h * v + 4 * tokens * h
    weights = (h * v + h) * wb + tokens * h * wb  # lm_head + norm + the embedding rows looked up
    act = tokens * (2 * h + v) * ab
    return OpCost("lm_head", flops=flops, weight_bytes=weights, act_bytes=act)


@dataclass(frozen=True)
class LayerOps:
    """The operators of one layer for a micro-batch, grouped the way schedules place them."""

    pre_attn: OpCost
    attention: OpCost
    post_attn: OpCost
    ffn: OpCost  # routed experts (MoE layer) or dense MLP (dense layer)
    moe: bool = True

    def all(self) -> list[OpCost]:
        return [self.pre_attn, self.attention, self.post_attn, self.ffn]


def decode_layer_ops(model: ModelSpec, micro_batch, context, moe: bool = True) -> LayerOps:
    """One decode step of one layer for a micro-batch of ``micro_batch`` sequences."""
    ffn = routed_experts(model, micro_batch) if moe else dense_mlp(model, micro_batch)
    return LayerOps(pre_attention(model, micro_batch), decode_attention(model, micro_batch, context),
                    post_attention(model, micro_batch), ffn, moe)


def prefill_layer_ops(model: ModelSpec, sequences, prompt_len, moe: bool = True) -> LayerOps:
    """Prefill of one layer for ``sequences`` prompts of ``prompt_len`` tokens."""
    tokens = np.asarray(sequences, dtype=float) * prompt_len
    ffn = routed_experts(model, tokens) if moe else dense_mlp(model, tokens)
    return LayerOps(pre_attention(model, tokens), prefill_attention(model, sequences, prompt_len),
                    post_attention(model, tokens), ffn, moe)


def operator_table(model: ModelSpec, micro_batch: int, context: int, prompt_len: int):
    """A pandas DataFrame of every operator (decode and prefill): FLOPs, bytes, intensity."""
    import pandas as pd

    rows = []
    for phase, ops in (
        ("decode", decode_layer_ops(model, micro_batch, context)),
        ("prefill", prefill_layer_ops(model, micro_batch, prompt_len)),
    ):
        for op in ops.all():
            rows.append({"phase": phase, "operator": op.name, "flops": float(op.flops),
                         "weight_bytes": float(op.weight_bytes), "kv_bytes": float(op.kv_bytes),
                         "act_bytes": float(op.act_bytes), "intensity_flop_per_byte": float(op.intensity())})
    head = lm_head(model, micro_batch)
    rows.append({"phase": "decode", "operator": "lm_head", "flops": float(head.flops),
                 "weight_bytes": float(head.weight_bytes), "kv_bytes": 0.0, "act_bytes": float(head.act_bytes),
                 "intensity_flop_per_byte": float(head.intensity())})
    return pd.DataFrame(rows)
