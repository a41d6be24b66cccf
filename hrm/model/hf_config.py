"""Hugging Face ``config.json`` normalisation: from a config dict, per model_type and key
alias, to the fields :class:`hrm.model.spec.ModelSpec` needs (:func:`normalize_hf_config`).

Strict (issue 11): an explicit value is validated, never rewritten (no ``value or default``);
only an absent key (or JSON null, which HF writes for "not set") takes the documented
default. Every refusal is an HRMError naming the file and the key; keys the normaliser
neither reads nor knows to be irrelevant are listed by :func:`ignored_keys`.
"""

from __future__ import annotations

import difflib
from typing import Optional

from ..errors import shown_key, shown_value, value_kind
from .hf_fields import (MAX_CONTEXT_WINDOW, MAX_HEADS, MAX_HEAD_DIM, MAX_HIDDEN_SIZE, MAX_INTERMEDIATE_SIZE,
                        MAX_LORA_RANK, MAX_NORM_EPS, MAX_ROPE_THETA, MAX_VOCAB, ConfigView, bool_check, int_check,
                        number_check, string_check, strings_check)
from .routing import MAX_EXPERTS, MAX_LAYERS


EXPERT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts", "ffn_config.moe_num_experts")
#: gpt-oss states its top-k twice (num_experts_per_tok and experts_per_token): both are read and must agree
TOP_K_KEYS = ("num_experts_per_tok", "moe_top_k", "ffn_config.moe_top_k", "experts_per_token")
DENSE_WIDTH_KEYS = ("intermediate_size", "ffn_config.ffn_hidden_size", "n_inner")
EXPERT_WIDTH_KEYS = ("moe_intermediate_size", "ffn_config.ffn_hidden_size")
KV_HEADS_KEYS = ("num_key_value_heads", "attn_config.kv_n_heads", "num_kv_heads")
ROPE_THETA_KEYS = ("rope_theta", "attn_config.rope_theta", "rope_parameters.rope_theta")
MLA_DIM_KEYS = ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
#: what Llama 4's text config adds (hrm.model.hf_llama4); its MoE layers step like Qwen-MoE's decoder_sparse_step
LLAMA4_KEYS = ("interleave_moe_layer_step", "intermediate_size_mlp", "moe_layers", "no_rope_layers",
               "no_rope_layer_interval", "attention_chunk_size")
#: the context window: Llama/Mixtral/Qwen/DeepSeek/OLMoE, DBRX, others, GPT-2 style
CONTEXT_KEYS = ("max_position_embeddings", "max_seq_len", "max_sequence_length", "seq_length", "n_positions", "n_ctx")

REQUIRED_KEYS = {  # ModelSpec field: (config keys, plausible maximum, its name)
    "hidden_size": (("hidden_size", "d_model", "n_embd"), MAX_HIDDEN_SIZE, "MAX_HIDDEN_SIZE"),
    "num_layers": (("num_hidden_layers", "n_layers", "num_layers", "n_layer"), MAX_LAYERS, "MAX_LAYERS"),
    "num_heads": (("num_attention_heads", "n_heads", "n_head"), MAX_HEADS, "MAX_HEADS"),
    "vocab_size": (("vocab_size",), MAX_VOCAB, "MAX_VOCAB"),
}

#: keys that only a mixture-of-experts config has (a config with one needs an expert count)
MOE_SIGNAL_KEYS = (
    *TOP_K_KEYS, "moe_intermediate_size", "n_shared_experts", "shared_expert_intermediate_size",
    "first_k_dense_replace", "moe_layer_freq", "decoder_sparse_step", "mlp_only_layers",
    "router_aux_loss_coef", "output_router_logits", "router_jitter_noise", "router_z_loss_coef",
    "norm_topk_prob", "topk_method", "n_group", "topk_group", "routed_scaling_factor", "scoring_func",
    "aux_loss_alpha", "seq_aux",
)
MOE_MODEL_TYPES = frozenset({
    "mixtral", "qwen2_moe", "qwen3_moe", "deepseek", "deepseek_v2", "deepseek_v3", "dbrx", "olmoe",
    "granitemoe", "granitemoeshared", "phimoe", "jetmoe", "jamba", "gpt_oss", "llama4_text", "glm4_moe",
    "qwen3_next", "kimi_k2",
})
MOE_ARCH_MARKERS = ("moe", "mixtral", "dbrx", "deepseek")  # in lower-cased ``architectures`` names

#: top-level keys of the model config that the normaliser reads
READ_KEYS = frozenset({
    *(k for keys, _, _ in REQUIRED_KEYS.values() for k in keys), *EXPERT_KEYS, *TOP_K_KEYS,
    *DENSE_WIDTH_KEYS, *EXPERT_WIDTH_KEYS, *KV_HEADS_KEYS, *ROPE_THETA_KEYS, *MLA_DIM_KEYS, *CONTEXT_KEYS,
    "head_dim", "shared_expert_intermediate_size", "n_shared_experts", "first_k_dense_replace",
    "moe_layer_freq", "decoder_sparse_step", "mlp_only_layers", "tie_word_embeddings", "kv_lora_rank",
    "q_lora_rank", "rms_norm_eps", "model_type", "architectures", "layer_types", "sliding_window",
    *LLAMA4_KEYS,
})
READ_KEYS = frozenset(k.split(".")[0] for k in READ_KEYS)
#: top-level keys read from the file itself, also when the model sits under ``text_config``
FILE_KEYS = frozenset({"torch_dtype", "dtype", "quantization_config", "text_config", "model_type", "architectures"})

#: Hugging Face keys that exist in real configs but do not change the cost model (no warning)
KNOWN_IGNORED_KEYS = frozenset({
    # identity, tokens, tooling
    "architectures", "model_type", "transformers_version", "auto_map", "tokenizer_class", "name_or_path",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "forced_bos_token_id", "forced_eos_token_id", "id2label", "label2id", "finetuning_task", "problem_type",
    "prefix", "task_specific_params", "return_dict", "output_attentions", "output_hidden_states",
    "torchscript", "use_bfloat16", "tf_legacy_loss", "pruned_heads", "chunk_size_feed_forward",
    "is_encoder_decoder", "is_decoder", "add_cross_attention", "cross_attention_hidden_size",
    "tie_encoder_decoder", "use_cache", "cache_implementation", "initializer_range", "init_std",
    "pretraining_tp", "ep_size", "use_return_dict",
    # generation defaults that old nested configs carry
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    # context length, positions, rope variants
    "rope_scaling", "rope_type", "rope_interleave", "partial_rotary_factor", "rotary_dim", "rotary_pct",
    "rotary_emb_base", "use_sliding_window", "max_window_layers",
    "sliding_window_pattern", "initial_context_length",
    # activations, norms, dropouts, biases, soft caps, scalings
    "hidden_act", "hidden_activation", "activation_function", "layer_norm_eps", "layer_norm_epsilon",
    "norm_eps", "norm_epsilon", "attention_dropout", "attention_probs_dropout_prob", "hidden_dropout",
    "hidden_dropout_prob", "resid_pdrop", "embd_pdrop", "emb_pdrop", "attn_pdrop", "dropout",
    "attention_bias", "mlp_bias", "qkv_bias", "use_bias", "bias", "clip_qkv", "qk_layernorm", "use_qk_norm",
    "attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar", "embedding_multiplier",
    "logits_scaling", "residual_multiplier", "attention_multiplier", "swiglu_limit",
    # router/training details of MoE configs (the expert count, top-k and widths are read)
    "router_aux_loss_coef", "output_router_logits", "router_jitter_noise", "router_z_loss_coef",
    "norm_topk_prob", "topk_method", "n_group", "topk_group", "routed_scaling_factor", "scoring_func",
    "aux_loss_alpha", "seq_aux", "num_nextn_predict_layers",
    # multimodal wrappers (the text model under text_config is what is modelled)
    "vision_config", "audio_config", "image_token_index", "image_token_id", "video_token_id",
    "vision_start_token_id", "vision_end_token_id", "vision_token_id", "audio_token_id",
    "boi_token_index", "eoi_token_index", "mm_tokens_per_image", "image_seq_length", "ignore_index",
    "projector_hidden_act", "multimodal_projector_bias", "vision_feature_layer",
    "vision_feature_select_strategy", "spatial_merge_size",
})

#: torch_dtype / dtype values → the ModelSpec float dtype. 16-bit checkpoints (float16 and
#: bfloat16: the same 2 bytes per weight) are modelled as fp16, the spec's default, so that
#: every GPU profile has a rate for them (T4-class profiles list no bf16 rate); pass
#: ``--weight-dtype bf16`` to model bf16 kernels.
TORCH_DTYPES = {
    "float32": "fp32", "float": "fp32", "fp32": "fp32",
    "float16": "fp16", "half": "fp16", "fp16": "fp16",
    "bfloat16": "fp16", "bf16": "fp16",
}
QUANT_METHODS = ("awq", "bitsandbytes", "gptq", "fp8", "mxfp4")
QUANT_BITS = {4: "int4", 8: "int8"}


def ignored_keys(cfg: dict, text: Optional[dict]) -> list[str]:
    """Keys the normaliser neither reads nor knows to be irrelevant (``_private`` keys aside)."""
    def unknown(data: dict, read: frozenset, prefix: str):
        return [prefix + shown_key(k) for k in data
                if not (isinstance(k, str) and k.startswith("_")) and k not in read and k not in KNOWN_IGNORED_KEYS]

    if text is None:
        return unknown(cfg, READ_KEYS | FILE_KEYS, "")
    return unknown(cfg, FILE_KEYS, "") + unknown(text, READ_KEYS | FILE_KEYS, "text_config.")


def _moe_reason(cfg: ConfigView, top: ConfigView) -> Optional[str]:
    """Why the config looks like a mixture of experts (None if it does not)."""
    present = [k for k in MOE_SIGNAL_KEYS if cfg.raw(k) is not None]
    if present:
        return f"it has {cfg.prefix}{present[0]}"
    for conf in (cfg, top) if cfg is not top else (cfg,):
        model_type = conf.pick(("model_type",), string_check)
        if model_type and (model_type[1] in MOE_MODEL_TYPES or "moe" in model_type[1].lower()):
            return f"{conf.prefix}model_type is {shown_value(model_type[1])}"
        archs = conf.pick(("architectures",), strings_check)
        for arch in archs[1] if archs else ():
            if any(marker in arch.lower() for marker in MOE_ARCH_MARKERS):
                return f"{conf.prefix}architectures has {shown_value(arch)}"
    return None


def _float_dtype(cfg: ConfigView, top: ConfigView) -> str:
    """The checkpoint's float dtype from torch_dtype / dtype (the file's, else text_config's)."""
    def check(conf: ConfigView, key: str, value) -> str:
        if not isinstance(value, str):
            conf.refuse(key, f"must be a dtype name, got {value_kind(value)}")
        name = value.lower().removeprefix("torch.")
        if name not in TORCH_DTYPES:
            hint = "; quantised weights are read from quantization_config" if "int" in name or "8" in name else ""
            conf.refuse(key, f"unsupported dtype {shown_value(value)} (known: {', '.join(sorted(TORCH_DTYPES))}){hint}")
        return TORCH_DTYPES[name]

    hit = top.pick(("torch_dtype", "dtype"), check)
    if cfg is not top:
        inner = cfg.pick(("torch_dtype", "dtype"), check)
        if hit and inner and inner[1] != hit[1]:
            shown, outer = shown_value(cfg.raw(inner[0])), shown_value(top.raw(hit[0]))
            cfg.refuse(inner[0], f"{shown} contradicts {hit[0]} = {outer}")
        hit = hit or inner
    return hit[1] if hit else "fp16"  # absent: the spec's default 16-bit weights


#: fp8 element encodings a ``quant_method: fp8`` config names (fmt): both one byte a weight
FP8_FORMATS = ("e4m3", "e5m2")


def _fp8_fields(conf: ConfigView) -> dict:
    """fp8 block-quantized weights (DeepSeek-V3, Kimi-K2): one byte a weight and one fp32 scale
    per 128 x 128 block (hrm.model.quantized FP8_BLOCK128); other block shapes are refused."""
    from .quantized import FP8_BLOCK

    fmt = conf.pick(("quantization_config.fmt",), string_check)
    if fmt is not None and fmt[1].lower() not in FP8_FORMATS:
        conf.refuse(fmt[0], f"unsupported fp8 format {shown_value(fmt[1])} (known: {', '.join(FP8_FORMATS)})")
    block = conf.raw("quantization_config.weight_block_size")
    if block != [FP8_BLOCK, FP8_BLOCK]:
        conf.refuse("quantization_config.weight_block_size",
                    f"{shown_value(block)}: only [{FP8_BLOCK}, {FP8_BLOCK}] blocks are modelled (fp8-block128)")
    return {"weight_dtype": "int8", "weight_format": "fp8-block128"}


def _mxfp4_fields(conf: ConfigView, float_dtype: str) -> dict:
    """MXFP4 experts (gpt-oss): 4.25 bits a weight (hrm.model.quantized MXFP4_BLOCK). The modules the
    config keeps out of the conversion (modules_to_not_convert: gpt-oss lists self_attn, the
    router, embed_tokens and lm_head, i.e. every weight but the experts) stay in the
    checkpoint's float dtype."""
    out = {"weight_dtype": "int4", "weight_format": "mxfp4"}
    kept = conf.raw("quantization_config.modules_to_not_convert")
    if kept is not None:
        kept = strings_check(conf, "quantization_config.modules_to_not_convert", kept)
        if any("attn" in module for module in kept):
            out["static_weight_format"] = float_dtype
    return out


def _quant_fields(cfg: ConfigView, top: ConfigView, float_dtype: str) -> dict:
    """The weight dtype, stored format and non-expert format a ``quantization_config`` implies
    (empty when there is none)."""
    conf = top if top.raw("quantization_config") is not None or cfg is top else cfg
    q = conf.raw("quantization_config")
    if q is None:
        return {}
    if not isinstance(q, dict):
        conf.refuse("quantization_config", f"must be an object, got {value_kind(q)}")
    method = conf.pick(("quantization_config.quant_method",), string_check)
    if method is not None and method[1].lower() == "fp8":
        return _fp8_fields(conf)
    if method is not None and method[1].lower() == "mxfp4":
        return _mxfp4_fields(conf, float_dtype)
    return {"weight_dtype": _quant_dtype(conf, q)}


def _quant_dtype(conf: ConfigView, q: dict) -> str:
    """The weight dtype of the integer-quantized weights the ``quantization_config`` ``q`` of
    ``conf`` describes (awq, bitsandbytes, gptq)."""
    method = conf.pick(("quantization_config.quant_method",), string_check)
    if method is None:
        conf.refuse("quantization_config.quant_method", f"missing (one of {', '.join(QUANT_METHODS)})")
    method = method[1].lower()
    if method not in QUANT_METHODS:
        conf.refuse("quantization_config.quant_method",
                    f"unsupported method {shown_value(q['quant_method'])} (supported: {', '.join(QUANT_METHODS)})")
    if method == "bitsandbytes":
        four = conf.pick(("quantization_config.load_in_4bit",), bool_check)
        eight = conf.pick(("quantization_config.load_in_8bit",), bool_check)
        four, eight = bool(four and four[1]), bool(eight and eight[1])
        if four and eight:
            conf.refuse("quantization_config.load_in_8bit", "contradicts load_in_4bit (both true)")
        if not (four or eight):
            conf.refuse("quantization_config.load_in_4bit", "bitsandbytes needs load_in_4bit or load_in_8bit true")
        return "int4" if four else "int8"

    def bits_check(c: ConfigView, key: str, value) -> int:
        bits = int_check(1, 64)(c, key, value)
        if bits not in QUANT_BITS:
            c.refuse(key, f"unsupported {bits}-bit weights (supported: {', '.join(map(str, QUANT_BITS))})")
        return bits

    bits = conf.pick(("quantization_config.bits", "quantization_config.w_bit"), bits_check)
    if bits is None:
        conf.refuse("quantization_config.bits", f"missing ({method} needs the weight bit width: 4 or 8)")
    return QUANT_BITS[bits[1]]


def _moe_layers(cfg: ConfigView, num_layers: int) -> tuple[int, list[str]]:
    """Number of MoE layers among ``num_layers`` and the pattern keys that make layers dense.

    DeepSeek: layer i is MoE iff i ≥ first_k_dense_replace and i % moe_layer_freq == 0;
    Qwen-MoE: iff (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers; Llama 4 the
    same with interleave_moe_layer_step (hrm.model.hf_llama4)."""
    first = cfg.pick(("first_k_dense_replace",), int_check(0, MAX_LAYERS, " (MAX_LAYERS)"))
    freq = cfg.pick(("moe_layer_freq",), int_check(1, MAX_LAYERS, " (MAX_LAYERS)"))
    step = cfg.pick(("decoder_sparse_step", "interleave_moe_layer_step"), int_check(1, MAX_LAYERS, " (MAX_LAYERS)"))
    only = cfg.raw("mlp_only_layers")
    dense_set: set[int] = set()
    if only is not None:
        if not isinstance(only, list):
            cfg.refuse("mlp_only_layers", f"must be a list of layer indices, got {value_kind(only)}")
        index = int_check(0, num_layers - 1, f" (num_layers - 1; the model has {num_layers} layers)")
        for i, value in enumerate(only):
            layer = index(cfg, f"mlp_only_layers[{i}]", value)
            if layer in dense_set:
                cfg.refuse(f"mlp_only_layers[{i}]", f"layer {layer} is listed twice")
            dense_set.add(layer)
    k, f, s = (first[1] if first else 0), (freq[1] if freq else 1), (step[1] if step else 1)
    moe = sum(1 for i in range(num_layers) if i >= k and i % f == 0 and (i + 1) % s == 0 and i not in dense_set)
    used = [key for key, restricts in (("first_k_dense_replace", k > 0), ("moe_layer_freq", f > 1),
                                       (step[0] if step else "", s > 1), ("mlp_only_layers", bool(dense_set)))
            if restricts]
    return moe, used


def _config_views(cfg: dict, source: str) -> tuple[ConfigView, ConfigView]:
    """The file's config and the text model's (its ``text_config``, else the file's own)."""
    top = ConfigView(cfg, source)
    text = cfg.get("text_config")
    if text is not None and not isinstance(text, dict):
        top.refuse("text_config", f"must be an object (the text model's config), got {value_kind(text)}")
    return top, (ConfigView(text, source, "text_config.") if text is not None else top)


def _typo_hint(ignored: list[str], keys) -> str:
    """A hint naming the ignored keys close to one of ``keys`` (empty when none is)."""
    close = [k for k in ignored if difflib.get_close_matches(k.split(".")[-1], keys, n=1, cutoff=0.75)]
    return f"; unrecognised key {', '.join(close)}: a typo?" if close else ""


def _required_fields(model: ConfigView, ignored: list[str]) -> tuple[dict, dict[str, str]]:
    """The required ModelSpec fields (hidden size, layers, heads, vocabulary) and the config
    key each was read from."""
    out: dict = {}
    used: dict[str, str] = {}
    for field, (keys, hi, hi_name) in REQUIRED_KEYS.items():
        hit = model.pick(keys, int_check(1, hi, f" ({hi_name})"))
        if hit is None:
            model.refuse(" / ".join(keys), f"missing (required){_typo_hint(ignored, keys)}")
        used[field], out[field] = hit
    return out, used


def _attention_fields(model: ConfigView, required: dict, used: dict[str, str]) -> dict:
    """head_dim, num_kv_heads and the MLA widths (kv_lora_rank, q_lora_rank, head dims)."""
    hidden, heads = required["hidden_size"], required["num_heads"]
    kv = model.pick(KV_HEADS_KEYS, int_check(1, MAX_HEADS, " (MAX_HEADS)"))
    head_dim = model.pick(("head_dim",), int_check(1, MAX_HEAD_DIM, " (MAX_HEAD_DIM)"))
    lora = model.pick(("kv_lora_rank",), int_check(1, MAX_LORA_RANK, " (MAX_LORA_RANK)"))
    q_lora = model.pick(("q_lora_rank",), int_check(1, MAX_LORA_RANK, " (MAX_LORA_RANK)"))
    mla_dims = {key: model.pick((key,), int_check(1, MAX_HEAD_DIM, " (MAX_HEAD_DIM)")) for key in MLA_DIM_KEYS}
    if head_dim is None and hidden % heads:
        model.refuse(used["hidden_size"],
                     f"{hidden} is not a multiple of {used['num_heads']} ({heads}) and head_dim is absent")
    out = {"head_dim": head_dim[1] if head_dim else hidden // heads, "num_kv_heads": kv[1] if kv else heads}
    if lora is not None:
        missing = [key for key, hit in mla_dims.items() if hit is None]
        if missing:
            model.refuse(missing[0],
                         "missing (MLA: kv_lora_rank needs qk_rope_head_dim, qk_nope_head_dim and v_head_dim)")
        out["num_kv_heads"] = heads  # MLA: every head reads the shared latent
    elif kv is not None and heads % kv[1]:
        model.refuse(kv[0], f"{kv[1]} does not divide {used['num_heads']} ({heads})")
    for key, hit in (("kv_lora_rank", lora), ("q_lora_rank", q_lora), *mla_dims.items()):
        if hit is not None:
            out[key] = hit[1]
    return out


#: layer_types values (transformers' configs: gpt-oss, Gemma, Qwen3-Next) and what they are
LAYER_TYPES = ("full_attention", "sliding_attention")
#: model types whose attention is not a KV cache over tokens: refused, one line each
HYBRID_ATTENTION = {
    "qwen3_next": "Qwen3-Next's hybrid attention (Gated DeltaNet linear attention in 3 of every 4 layers, "
                  "full_attention_interval) keeps a fixed-size recurrent state per sequence instead of a KV cache "
                  "per token; the cost model has no operator for it, so it is refused rather than priced as full "
                  "attention",
}


def _attention_pattern_fields(model: ConfigView, top: ConfigView, num_layers: int, heads: int) -> dict:
    """Sliding-window layers (layer_types + sliding_window) and attention sinks (gpt-oss: a
    learned logit per head, transformers modeling_gpt_oss.py GptOssAttention ``self.sinks =
    nn.Parameter(torch.empty(config.num_attention_heads))``). A ``sliding_window`` without
    ``layer_types`` is not read: such configs do not say which layers use it."""
    for conf in (model, top) if model is not top else (model,):
        kind = conf.pick(("model_type",), string_check)
        if kind and kind[1] in HYBRID_ATTENTION:
            conf.refuse("model_type", f"{kind[1]}: {HYBRID_ATTENTION[kind[1]]}")
    out: dict = {}
    kind = model.pick(("model_type",), string_check)
    if kind and kind[1] == "gpt_oss":
        out["attention_sinks"] = True
    types = model.pick(("layer_types",), strings_check)
    if types is None:
        return out
    if len(types[1]) != num_layers:
        model.refuse("layer_types", f"lists {len(types[1])} layers; the model has {num_layers} (num_hidden_layers)")
    for i, value in enumerate(types[1]):
        if value == "linear_attention":
            model.refuse(f"layer_types[{i}]", "linear_attention keeps a recurrent state, not a KV cache per token; "
                                              "the cost model has no operator for it (refused)")
        if value not in LAYER_TYPES:
            model.refuse(f"layer_types[{i}]", f"unknown {shown_value(value)} (known: {', '.join(LAYER_TYPES)})")
    sliding = types[1].count("sliding_attention")
    if sliding:
        window = model.pick(("sliding_window",), int_check(1, MAX_CONTEXT_WINDOW, " (MAX_CONTEXT_TOKENS)"))
        if window is None:
            model.refuse("sliding_window", f"missing (layer_types has {sliding} sliding_attention layers)")
        out |= {"sliding_window": window[1], "sliding_window_layers": sliding}
    return out


def _dense_ffn_fields(model: ConfigView, top: ConfigView, dense_width, ignored: list[str]) -> dict:
    """The FFN fields of a dense model (one expert, top-1, the MLP's width); refused when
    the config looks like a mixture of experts without an expert count."""
    reason = _moe_reason(model, top)
    if reason:
        model.refuse(" / ".join(EXPERT_KEYS), f"missing, but the config looks like a mixture of experts "
                                              f"({reason}){_typo_hint(ignored, EXPERT_KEYS)}")
    if dense_width is None:
        model.refuse(" / ".join(DENSE_WIDTH_KEYS), f"missing (required){_typo_hint(ignored, DENSE_WIDTH_KEYS)}")
    return {"num_experts": 1, "top_k": 1, "expert_intermediate_size": dense_width[1]}


def _shared_intermediate_size(model: ConfigView, shared_width, shared_count, routed_width: int) -> int:
    """Width of the shared expert(s): the config's size, else n_shared_experts routed widths, else 0."""
    if shared_width and shared_count:
        model.refuse("n_shared_experts", "contradicts shared_expert_intermediate_size (give one shared-expert size)")
    if shared_width:
        return shared_width[1]
    if shared_count:
        return shared_count[1] * routed_width  # DeepSeek: n shared experts
    return 0


def _dense_layer_fields(model: ConfigView, num_layers: int, dense_width) -> dict:
    """first_dense_layers and dense_intermediate_size of a MoE model with dense layers (empty if none)."""
    moe_layers, pattern = _moe_layers(model, num_layers)
    if moe_layers == 0:
        keys = f" and {model.prefix}".join(pattern)
        model.refuse(keys, f"leave{'s' if len(pattern) == 1 else ''} no MoE layer among the {num_layers} layers")
    if moe_layers == num_layers:
        return {}
    if dense_width is None:
        dense = num_layers - moe_layers
        model.refuse(" / ".join(DENSE_WIDTH_KEYS),
                     f"missing (width of the {dense} dense layer{'s' if dense > 1 else ''})")
    return {"first_dense_layers": num_layers - moe_layers, "dense_intermediate_size": dense_width[1]}


def _moe_ffn_fields(model: ConfigView, widths: dict, num_layers: int, ignored: list[str]) -> dict:
    """The FFN fields of a mixture of experts: expert count, top-k, routed and shared widths,
    the dense layers."""
    experts, top_k, dense_width = widths["experts"], widths["top_k"], widths["dense"]
    out = {"num_experts": experts[1]}
    if top_k is None and experts[1] > 1:
        model.refuse(" / ".join(TOP_K_KEYS),
                     f"missing (experts per token; the config has {experts[1]} experts)"
                     f"{_typo_hint(ignored, TOP_K_KEYS)}")
    out["top_k"] = top_k[1] if top_k else 1
    if out["top_k"] > experts[1]:
        model.refuse(top_k[0], f"{top_k[1]} exceeds {experts[0]} ({experts[1]})")
    routed = widths["expert"] or dense_width
    if routed is None:
        model.refuse("intermediate_size / moe_intermediate_size / ffn_config.ffn_hidden_size",
                     f"missing (expert width){_typo_hint(ignored, EXPERT_WIDTH_KEYS + DENSE_WIDTH_KEYS)}")
    out["expert_intermediate_size"] = routed[1]
    out["shared_intermediate_size"] = _shared_intermediate_size(model, widths["shared"], widths["shared_count"],
                                                                routed[1])
    out["shared_expert_gate"] = widths["shared"] is not None
    return out | _dense_layer_fields(model, num_layers, dense_width)


def _ffn_fields(model: ConfigView, top: ConfigView, num_layers: int, ignored: list[str]) -> dict:
    """The expert and FFN fields, dense or mixture of experts."""
    width = int_check(1, MAX_INTERMEDIATE_SIZE, " (MAX_INTERMEDIATE_SIZE)")
    widths = {
        "experts": model.pick(EXPERT_KEYS, int_check(1, MAX_EXPERTS, " (MAX_EXPERTS)")),
        "top_k": model.pick(TOP_K_KEYS, int_check(1, MAX_EXPERTS, " (MAX_EXPERTS)")),
        "dense": model.pick(DENSE_WIDTH_KEYS, width),
        "expert": model.pick(EXPERT_WIDTH_KEYS, width),
        "shared": model.pick(("shared_expert_intermediate_size",), width),
        "shared_count": model.pick(("n_shared_experts",), int_check(1, MAX_EXPERTS, " (MAX_EXPERTS)")),
    }
    if widths["experts"] is None:
        return _dense_ffn_fields(model, top, widths["dense"], ignored)
    return _moe_ffn_fields(model, widths, num_layers, ignored)


def _optional_fields(model: ConfigView) -> dict:
    """tie_embeddings (default false) and, when given, rope_theta, rms_norm_eps, max_context_len."""
    tie = model.pick(("tie_word_embeddings",), bool_check)
    out = {"tie_embeddings": tie[1] if tie else False}
    theta = model.pick(ROPE_THETA_KEYS, number_check(MAX_ROPE_THETA))
    if theta is not None:
        out["rope_theta"] = theta[1]
    eps = model.pick(("rms_norm_eps",), number_check(MAX_NORM_EPS))
    if eps is not None:
        out["rms_norm_eps"] = eps[1]
    window = model.pick(CONTEXT_KEYS, int_check(1, MAX_CONTEXT_WINDOW, " (MAX_CONTEXT_TOKENS)"))
    if window is not None:
        out["max_context_len"] = window[1]
    return out


def _dtype_fields(model: ConfigView, top: ConfigView) -> dict:
    """weight_dtype (the quantised type, else the checkpoint's float type) and activation_dtype."""
    float_dtype = _float_dtype(model, top)
    # kernels compute in the checkpoint's float type
    return {"weight_dtype": float_dtype, "activation_dtype": float_dtype} | _quant_fields(model, top, float_dtype)


def normalize_hf_config(cfg: dict, name: str, source: Optional[str] = None) -> dict:
    """Map a config.json (Mixtral, DBRX, Qwen-MoE, DeepSeek, OLMoE, Llama/Mistral, a multimodal
    wrapper's ``text_config``) to ModelSpec fields, refusing (HRMError naming the key) any
    explicit value that is not a plausible integer/number, and contradictory fields.

    Defaults for absent keys: num_key_value_heads = num_attention_heads (no GQA); head_dim =
    hidden_size / num_attention_heads; no experts (dense) unless the config looks like a MoE,
    which then needs an expert count and a top-k; rope_theta 10000; rms_norm_eps 1e-5;
    tie_word_embeddings false; torch_dtype 16-bit. Dense layers of a MoE model
    (first_k_dense_replace, moe_layer_freq, decoder_sparse_step, mlp_only_layers) are counted
    into ``first_dense_layers``: the cost model depends on how many there are, not where.
    """
    top, model = _config_views(cfg, source or name)
    ignored = ignored_keys(cfg, cfg.get("text_config"))
    required, used = _required_fields(model, ignored)
    out = {"name": name, **required}
    out |= _attention_fields(model, required, used)
    out |= _attention_pattern_fields(model, top, required["num_layers"], required["num_heads"])
    out |= _ffn_fields(model, top, required["num_layers"], ignored)
    if (kind := model.pick(("model_type",), string_check)) and kind[1] == "llama4_text":
        from .hf_llama4 import llama4_text_fields

        out |= llama4_text_fields(model, out)
    out |= _optional_fields(model)
    out |= _dtype_fields(model, top)
    return out

