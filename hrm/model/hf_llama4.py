"""Llama 4's text model (``model_type: llama4_text``, under a ``llama4`` wrapper's ``text_config``):
the fields its config.json leaves implicit, as :class:`hrm.model.spec.ModelSpec` fields.

What the file does not say and the engines do (ikawrakow/ik_llama.cpp@8337e4cd3861406fc04e0854b1409cd1b027fbc9):
- layer i has routed experts iff (i + 1) % interleave_moe_layer_step == 0 (src/llama-load-tensors.cpp:721),
  which :func:`hrm.model.hf_config` counts as it counts Qwen-MoE's decoder_sparse_step; every MoE layer
  also has one always-on shared expert as wide as a routed one (n_ff_shexp = n_ff_exp,
  src/llama-load-tensors.cpp:742-746); the other layers have a dense MLP of intermediate_size_mlp;
- three of every four layers attend in chunks of attention_chunk_size tokens, every fourth globally
  (n_swa_pattern 4, n_attn_chunk 8192: src/llama-hparams.cpp:293-294; Transformers' default
  no_rope_layers is the same pattern, no_rope_layer_interval 4). They are ModelSpec's
  ``local_attention: chunked`` layers, ``sliding_window`` = attention_chunk_size: a token at offset j
  of its chunk reads j + 1 tokens, and a layer keeps one whole chunk at worst (llama.cpp's llama4 is
  LLAMA_SWA_TYPE_CHUNKED: ggml-org/llama.cpp@0c1e57098bba43ac29e6e3b677cdceebdd22334f
  src/models/llama4.cpp:13; the equations: docs/model.md §3.2).
"""

from __future__ import annotations

from ..errors import value_kind
from .hf_fields import MAX_CONTEXT_WINDOW, MAX_INTERMEDIATE_SIZE, int_check

#: Transformers' Llama4TextConfig defaults for absent keys (the same values ik_llama.cpp hard-codes)
DEFAULT_CHUNK_TOKENS = 8192
DEFAULT_NO_ROPE_INTERVAL = 4


def _chunked_layers(model, num_layers: int) -> int:
    """Layers that attend within chunks: those no_rope_layers marks 1 (they use RoPE), else all
    but every no_rope_layer_interval-th."""
    listed = model.raw("no_rope_layers")
    if listed:  # [] means "not set" to Transformers (no model has zero layers)
        if not isinstance(listed, list) or len(listed) != num_layers or any(v not in (0, 1) for v in listed):
            model.refuse("no_rope_layers", f"must list 0 or 1 for each of the {num_layers} layers, got {value_kind(listed)}")
        return sum(listed)
    step = model.pick(("no_rope_layer_interval",), int_check(1, num_layers, " (num_hidden_layers)"))
    step = step[1] if step else DEFAULT_NO_ROPE_INTERVAL
    return sum(1 for i in range(num_layers) if (i + 1) % step)


def _check_moe_layers(model, fields: dict) -> None:
    """An explicit moe_layers list must name as many layers as interleave_moe_layer_step gives."""
    listed = model.raw("moe_layers")
    if listed is None:
        return
    moe = fields["num_layers"] - fields.get("first_dense_layers", 0)
    if not isinstance(listed, list) or len(set(map(str, listed))) != len(listed) or len(listed) != moe:
        model.refuse("moe_layers", f"lists {len(listed) if isinstance(listed, list) else value_kind(listed)} "
                                   f"MoE layers; interleave_moe_layer_step gives {moe}")


def llama4_text_fields(model, fields: dict) -> dict:
    """The shared expert, the dense layers' width and the chunked layers of a llama4_text config
    whose generic fields (``fields``) are already read."""
    _check_moe_layers(model, fields)
    out = {"shared_intermediate_size": fields["expert_intermediate_size"], "shared_expert_gate": False}
    if fields.get("first_dense_layers"):
        mlp = model.pick(("intermediate_size_mlp",), int_check(1, MAX_INTERMEDIATE_SIZE, " (MAX_INTERMEDIATE_SIZE)"))
        if mlp is None:
            model.refuse("intermediate_size_mlp", f"missing (width of the {fields['first_dense_layers']} dense layers)")
        out["dense_intermediate_size"] = mlp[1]
    chunk = model.pick(("attention_chunk_size",), int_check(1, MAX_CONTEXT_WINDOW, " (MAX_CONTEXT_TOKENS)"))
    chunked = _chunked_layers(model, fields["num_layers"])
    if chunked:
        out |= {"sliding_window": chunk[1] if chunk else DEFAULT_CHUNK_TOKENS, "sliding_window_layers": chunked,
                "local_attention": "chunked"}
    return out
