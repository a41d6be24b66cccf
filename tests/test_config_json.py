"""config.json normalisation is strict (issue 11): explicit values are validated, never
rewritten; MoE-looking configs need an expert count; contradictions, non-integer counts,
non-finite or absurd numbers, unreadable files are refused with one HRMError line naming the
file and the key; unknown keys are listed in one warning line. Catalog specs are unchanged."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hrm.cost import costs
from hrm.model import spec as model_mod
from hrm.errors import HRMError
from hrm.model.hf_config import FILE_KEYS, KNOWN_IGNORED_KEYS, READ_KEYS
from hrm.model.hf_fields import MAX_HEAD_DIM, MAX_HEADS, MAX_HIDDEN_SIZE, MAX_INTERMEDIATE_SIZE, MAX_VOCAB
from hrm.model.routing import MAX_EXPERTS, MAX_LAYERS
from hrm.model.spec import ALIASES, ModelSpec, list_catalog, load_model, model_from_config
from hrm.units import DTYPES, dtype_bytes

DATA = Path(__file__).resolve().parent / "data" / "configs"
DEL = object()  # marks a key to delete in variant()

MIXTRAL = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 64,
           "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 256, "rms_norm_eps": 1e-05,
           "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
QWEN = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 64,
        "intermediate_size": 192, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 128,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4, "num_experts": 8,
        "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 256}
DEEPSEEK = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 64,
            "intermediate_size": 192, "moe_intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 4, "n_routed_experts": 8, "n_shared_experts": 2, "num_experts_per_tok": 2,
            "first_k_dense_replace": 1, "moe_layer_freq": 1, "kv_lora_rank": 32, "q_lora_rank": None,
            "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16, "vocab_size": 256}
DBRX = {"architectures": ["DbrxForCausalLM"], "model_type": "dbrx", "d_model": 64, "n_heads": 4, "n_layers": 2,
        "vocab_size": 256, "attn_config": {"kv_n_heads": 2, "clip_qkv": 8, "rope_theta": 500000},
        "ffn_config": {"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2}}
DENSE = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 64,
         "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 256, "torch_dtype": "bfloat16"}
BASES = {"mixtral": MIXTRAL, "qwen": QWEN, "deepseek": DEEPSEEK, "dbrx": DBRX, "dense": DENSE}


def variant(base: dict, changes: dict) -> dict:
    cfg = copy.deepcopy(base)
    for key, value in changes.items():
        if value is DEL:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    return cfg


def bad(case_id: str, base: dict, changes: dict, *needles: str):
    return pytest.param(variant(base, changes), needles, id=case_id)


WRAPPER = {"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"], "torch_dtype": "float16",
           "vision_config": {"hidden_size": 1024}, "text_config": copy.deepcopy(MIXTRAL)}
WRAPPER["text_config"].pop("torch_dtype")

BAD_CASES = [
    # explicit zeros and negatives: refused, never replaced by a default
    bad("experts-0", MIXTRAL, {"num_local_experts": 0}, "num_local_experts", "at least 1"),
    bad("experts-negative", MIXTRAL, {"num_local_experts": -8}, "num_local_experts"),
    bad("top-k-0", MIXTRAL, {"num_experts_per_tok": 0}, "num_experts_per_tok"),
    bad("kv-heads-0", MIXTRAL, {"num_key_value_heads": 0}, "num_key_value_heads"),
    bad("head-dim-0", MIXTRAL, {"head_dim": 0}, "head_dim"),
    bad("heads-0", MIXTRAL, {"num_attention_heads": 0}, "num_attention_heads"),
    bad("hidden-0", MIXTRAL, {"hidden_size": 0}, "hidden_size"),
    bad("layers-0", MIXTRAL, {"num_hidden_layers": 0}, "num_hidden_layers"),
    bad("vocab-0", MIXTRAL, {"vocab_size": 0}, "vocab_size"),
    bad("intermediate-0", MIXTRAL, {"intermediate_size": 0}, "intermediate_size"),
    bad("intermediate-negative", MIXTRAL, {"intermediate_size": -128}, "intermediate_size"),
    bad("moe-intermediate-0", QWEN, {"moe_intermediate_size": 0}, "moe_intermediate_size"),
    bad("shared-intermediate-0", QWEN, {"shared_expert_intermediate_size": 0}, "shared_expert_intermediate_size"),
    bad("shared-experts-0", DEEPSEEK, {"n_shared_experts": 0}, "n_shared_experts"),
    bad("kv-lora-rank-0", DEEPSEEK, {"kv_lora_rank": 0}, "kv_lora_rank"),
    bad("q-lora-rank-0", DEEPSEEK, {"q_lora_rank": 0}, "q_lora_rank"),
    bad("rope-head-dim-0", DEEPSEEK, {"qk_rope_head_dim": 0}, "qk_rope_head_dim"),
    bad("moe-layer-freq-0", DEEPSEEK, {"moe_layer_freq": 0}, "moe_layer_freq"),
    bad("sparse-step-0", QWEN, {"decoder_sparse_step": 0}, "decoder_sparse_step"),
    bad("first-dense-negative", DEEPSEEK, {"first_k_dense_replace": -1}, "first_k_dense_replace"),
    bad("rope-theta-0", MIXTRAL, {"rope_theta": 0}, "rope_theta"),
    bad("rms-eps-0", MIXTRAL, {"rms_norm_eps": 0}, "rms_norm_eps"),
    bad("rms-eps-negative", MIXTRAL, {"rms_norm_eps": -1e-5}, "rms_norm_eps"),
    bad("dbrx-top-k-0", DBRX, {"ffn_config": {"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 0}},
        "ffn_config.moe_top_k"),
    bad("dbrx-kv-heads-0", DBRX, {"attn_config": {"kv_n_heads": 0}}, "attn_config.kv_n_heads"),
    # a MoE-looking config without a recognised expert count
    bad("typo-num-local-expert", MIXTRAL, {"num_local_experts": DEL, "num_local_expert": 4},
        "num_local_experts", "num_local_expert: a typo"),
    bad("mixtral-no-experts", MIXTRAL, {"num_local_experts": DEL}, "num_local_experts", "num_experts_per_tok"),
    bad("mixtral-null-experts", MIXTRAL, {"num_local_experts": None}, "num_local_experts"),
    bad("qwen-no-experts", QWEN, {"num_experts": DEL}, "num_experts"),
    bad("deepseek-no-experts", DEEPSEEK, {"n_routed_experts": DEL}, "n_routed_experts"),
    bad("dbrx-no-experts", DBRX, {"ffn_config": {"ffn_hidden_size": 128, "moe_top_k": 2}}, "ffn_config.moe_num_experts"),
    bad("model-type-only", DENSE, {"model_type": "olmoe"}, "num_local_experts", "olmoe"),
    bad("architecture-only", DENSE, {"model_type": DEL, "architectures": ["MixtralForCausalLM"]},
        "num_local_experts", "MixtralForCausalLM"),
    bad("dense-with-moe-width", DENSE, {"moe_intermediate_size": 32}, "num_local_experts", "moe_intermediate_size"),
    bad("dense-with-router-key", DENSE, {"router_aux_loss_coef": 0.02}, "num_local_experts", "router_aux_loss_coef"),
    bad("experts-without-top-k", MIXTRAL, {"num_experts_per_tok": DEL}, "num_experts_per_tok"),
    bad("wrapper-moe-no-experts", WRAPPER, {"text_config": variant(MIXTRAL, {"num_local_experts": DEL})},
        "text_config.num_local_experts"),
    # contradictory fields
    bad("top-k-exceeds-experts", MIXTRAL, {"num_experts_per_tok": 5}, "num_experts_per_tok", "num_local_experts"),
    bad("kv-heads-not-dividing", MIXTRAL, {"num_key_value_heads": 3}, "num_key_value_heads", "num_attention_heads"),
    bad("kv-heads-exceed-heads", MIXTRAL, {"num_key_value_heads": 8}, "num_key_value_heads"),
    bad("hidden-not-multiple-of-heads", MIXTRAL, {"hidden_size": 66}, "hidden_size", "head_dim"),
    bad("mla-without-v-head-dim", DEEPSEEK, {"v_head_dim": DEL}, "v_head_dim", "kv_lora_rank"),
    bad("first-dense-covers-all", DEEPSEEK, {"first_k_dense_replace": 3}, "first_k_dense_replace"),
    bad("mlp-only-covers-all", QWEN, {"mlp_only_layers": [0, 1, 2, 3]}, "mlp_only_layers"),
    bad("mlp-only-out-of-range", QWEN, {"mlp_only_layers": [4]}, "mlp_only_layers[0]"),
    bad("mlp-only-negative", QWEN, {"mlp_only_layers": [-1]}, "mlp_only_layers[0]"),
    bad("mlp-only-duplicate", QWEN, {"mlp_only_layers": [1, 1]}, "mlp_only_layers[1]"),
    bad("mlp-only-not-list", QWEN, {"mlp_only_layers": "0,1"}, "mlp_only_layers"),
    bad("mlp-only-bool", QWEN, {"mlp_only_layers": [True]}, "mlp_only_layers[0]"),
    bad("sparse-step-beyond-layers", QWEN, {"decoder_sparse_step": 9}, "decoder_sparse_step"),
    bad("two-shared-sizes", QWEN, {"n_shared_experts": 2}, "n_shared_experts", "shared_expert_intermediate_size"),
    bad("alias-layers-disagree", MIXTRAL, {"n_layers": 3}, "n_layers", "num_hidden_layers"),
    bad("alias-experts-disagree", MIXTRAL, {"num_experts": 8}, "num_experts", "num_local_experts"),
    bad("dtype-keys-disagree", MIXTRAL, {"torch_dtype": "float16", "dtype": "float32"}, "dtype", "torch_dtype"),
    bad("wrapper-dtype-disagrees", WRAPPER, {"text_config": variant(MIXTRAL, {"torch_dtype": "float32"})},
        "text_config.torch_dtype"),
    bad("dense-layers-without-width", DEEPSEEK, {"intermediate_size": DEL}, "intermediate_size", "dense layer"),
    bad("bnb-4-and-8-bit", MIXTRAL, {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True,
                                                              "load_in_8bit": True}}, "quantization_config.load_in_8bit"),
    bad("bnb-no-bits", MIXTRAL, {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": False}},
        "quantization_config.load_in_4bit"),
    # non-integer counts (bool is an int subclass in Python: refused too)
    bad("hidden-string", MIXTRAL, {"hidden_size": "64"}, "hidden_size", "integer"),
    bad("hidden-fraction", MIXTRAL, {"hidden_size": 64.5}, "hidden_size", "integer"),
    bad("hidden-float", MIXTRAL, {"hidden_size": 64.0}, "hidden_size", "integer"),
    bad("layers-bool", MIXTRAL, {"num_hidden_layers": True}, "num_hidden_layers", "boolean"),
    bad("experts-bool", MIXTRAL, {"num_local_experts": False}, "num_local_experts", "boolean"),
    bad("top-k-list", MIXTRAL, {"num_experts_per_tok": [2]}, "num_experts_per_tok"),
    bad("vocab-object", MIXTRAL, {"vocab_size": {"n": 256}}, "vocab_size"),
    bad("kv-heads-string", MIXTRAL, {"num_key_value_heads": "2"}, "num_key_value_heads"),
    bad("rope-theta-string", MIXTRAL, {"rope_theta": "1e6"}, "rope_theta", "number"),
    bad("rope-theta-bool", MIXTRAL, {"rope_theta": True}, "rope_theta"),
    bad("tie-string", MIXTRAL, {"tie_word_embeddings": "false"}, "tie_word_embeddings"),
    bad("tie-int", MIXTRAL, {"tie_word_embeddings": 0}, "tie_word_embeddings"),
    bad("model-type-number", DENSE, {"model_type": 5}, "model_type"),
    bad("architectures-string", DENSE, {"architectures": "MistralForCausalLM"}, "architectures"),
    bad("first-dense-float", DEEPSEEK, {"first_k_dense_replace": 1.0}, "first_k_dense_replace"),
    # non-finite or absurd numbers
    bad("rope-theta-nan", MIXTRAL, {"rope_theta": math.nan}, "rope_theta", "finite"),
    bad("rope-theta-inf", MIXTRAL, {"rope_theta": math.inf}, "rope_theta", "finite"),
    bad("rms-eps-minus-inf", MIXTRAL, {"rms_norm_eps": -math.inf}, "rms_norm_eps"),
    bad("hidden-inf", MIXTRAL, {"hidden_size": math.inf}, "hidden_size"),
    bad("hidden-absurd", MIXTRAL, {"hidden_size": 10**9}, "hidden_size", "MAX_HIDDEN_SIZE"),
    bad("layers-absurd", MIXTRAL, {"num_hidden_layers": 100_000}, "num_hidden_layers", "MAX_LAYERS"),
    bad("experts-absurd", MIXTRAL, {"num_local_experts": 10**7}, "num_local_experts", "MAX_EXPERTS"),
    bad("vocab-absurd", MIXTRAL, {"vocab_size": 10**9}, "vocab_size", "MAX_VOCAB"),
    bad("intermediate-absurd", MIXTRAL, {"intermediate_size": 10**8}, "intermediate_size", "MAX_INTERMEDIATE_SIZE"),
    bad("heads-absurd", MIXTRAL, {"num_attention_heads": 4096}, "num_attention_heads", "MAX_HEADS"),
    bad("head-dim-absurd", MIXTRAL, {"head_dim": 100_000}, "head_dim", "MAX_HEAD_DIM"),
    bad("rope-theta-absurd", MIXTRAL, {"rope_theta": 1e20}, "rope_theta"),
    bad("rms-eps-absurd", MIXTRAL, {"rms_norm_eps": 2.0}, "rms_norm_eps"),
    bad("context-zero", MIXTRAL, {"max_position_embeddings": 0}, "max_position_embeddings"),
    bad("context-string", MIXTRAL, {"max_position_embeddings": "4096"}, "max_position_embeddings"),
    bad("context-absurd", MIXTRAL, {"max_position_embeddings": 10**9}, "max_position_embeddings", "MAX_CONTEXT_TOKENS"),
    bad("dbrx-context-fraction", DBRX, {"max_seq_len": 4096.5}, "max_seq_len"),
    bad("first-dense-absurd", DEEPSEEK, {"first_k_dense_replace": 10**6}, "first_k_dense_replace"),
    # torch_dtype and quantization_config
    bad("dtype-float64", MIXTRAL, {"torch_dtype": "float64"}, "torch_dtype", "float64"),
    bad("dtype-int8", MIXTRAL, {"torch_dtype": "int8"}, "torch_dtype", "quantization_config"),
    bad("dtype-fp8", MIXTRAL, {"torch_dtype": "float8_e4m3fn"}, "torch_dtype"),
    bad("dtype-number", MIXTRAL, {"torch_dtype": 16}, "torch_dtype"),
    bad("dtype-auto", MIXTRAL, {"torch_dtype": "auto"}, "torch_dtype"),
    bad("new-dtype-key-unknown", MIXTRAL, {"torch_dtype": DEL, "dtype": "complex64"}, "dtype"),
    bad("quant-string", MIXTRAL, {"quantization_config": "gptq"}, "quantization_config"),
    bad("quant-no-method", MIXTRAL, {"quantization_config": {"bits": 4}}, "quantization_config.quant_method"),
    # fp8 without a block shape (per-tensor scales): only DeepSeek's 128 x 128 blocks are modelled
    bad("quant-fp8", MIXTRAL, {"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}},
        "quantization_config.weight_block_size", "[128, 128]"),
    bad("quant-fp8-block-64", MIXTRAL, {"quantization_config": {"quant_method": "fp8",
                                                                "weight_block_size": [64, 64]}},
        "quantization_config.weight_block_size", "[64, 64]"),
    bad("quant-fp8-fmt", MIXTRAL, {"quantization_config": {"quant_method": "fp8", "fmt": "e3m4",
                                                           "weight_block_size": [128, 128]}},
        "quantization_config.fmt", "e3m4"),
    bad("layer-types-linear", MIXTRAL, {"layer_types": ["linear_attention", "full_attention"]},
        "layer_types[0]", "recurrent state"),
    bad("layer-types-count", MIXTRAL, {"layer_types": ["full_attention"] * 3}, "layer_types", "lists 3 layers"),
    bad("layer-types-no-window", MIXTRAL, {"layer_types": ["sliding_attention", "full_attention"]},
        "sliding_window", "missing"),
    bad("qwen3-next", MIXTRAL, {"model_type": "qwen3_next"}, "model_type", "Gated DeltaNet"),
    bad("top-k-twice", MIXTRAL, {"experts_per_token": 3}, "experts_per_token", "contradicts"),
    bad("quant-compressed-tensors", MIXTRAL, {"quantization_config": {"quant_method": "compressed-tensors"}},
        "quantization_config.quant_method"),
    bad("quant-method-number", MIXTRAL, {"quantization_config": {"quant_method": 4, "bits": 4}},
        "quantization_config.quant_method"),
    bad("gptq-3-bit", MIXTRAL, {"quantization_config": {"quant_method": "gptq", "bits": 3}},
        "quantization_config.bits", "3-bit"),
    bad("gptq-bits-string", MIXTRAL, {"quantization_config": {"quant_method": "gptq", "bits": "4"}},
        "quantization_config.bits"),
    bad("gptq-no-bits", MIXTRAL, {"quantization_config": {"quant_method": "gptq"}}, "quantization_config.bits"),
    bad("awq-2-bit", MIXTRAL, {"quantization_config": {"quant_method": "awq", "w_bit": 2}}, "quantization_config.w_bit"),
    bad("bnb-flag-string", MIXTRAL, {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": "yes"}},
        "quantization_config.load_in_4bit"),
    # text_config, nested objects, names, missing keys
    bad("text-config-list", MIXTRAL, {"text_config": [1]}, "text_config"),
    bad("text-config-string", MIXTRAL, {"text_config": "mixtral"}, "text_config"),
    bad("text-config-empty", WRAPPER, {"text_config": {}}, "text_config.hidden_size"),
    bad("text-config-zero", WRAPPER, {"text_config": variant(MIXTRAL, {"num_local_experts": 0})},
        "text_config.num_local_experts"),
    bad("ffn-config-number", DBRX, {"ffn_config": 3}, "ffn_config"),
    bad("attn-config-list", DBRX, {"attn_config": []}, "attn_config"),
    bad("rope-parameters-string", MIXTRAL, {"rope_theta": DEL, "rope_parameters": "yarn"}, "rope_parameters"),
    bad("hrm-name-number", MIXTRAL, {"_hrm_name": 5}, "_hrm_name"),
    bad("missing-hidden", MIXTRAL, {"hidden_size": DEL}, "hidden_size", "missing"),
    bad("missing-vocab", MIXTRAL, {"vocab_size": DEL}, "vocab_size", "missing"),
    bad("typo-layers", MIXTRAL, {"num_hidden_layers": DEL, "num_hidden_layer": 2}, "num_hidden_layers",
        "num_hidden_layer: a typo"),
    bad("dense-missing-width", DENSE, {"intermediate_size": DEL}, "intermediate_size", "missing"),
]


def test_at_least_sixty_bad_cases():
    assert len(BAD_CASES) >= 60
    assert len({case.id for case in BAD_CASES}) == len(BAD_CASES)


@pytest.mark.parametrize("cfg,needles", BAD_CASES)
def test_bad_config_refused(cfg, needles, tmp_path, capsys):
    """Refused through load_model on a written file: one line naming the file and the key;
    no warning line on top of the error."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg, allow_nan=True), encoding="utf-8")
    with pytest.raises(HRMError) as err:
        load_model(str(tmp_path))
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path}: "), message
    for needle in needles:
        assert needle in message, message
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("cfg,needles", BAD_CASES[::6])
def test_bad_config_cli_main(cfg, needles, tmp_path, capsys):
    """The same refusals through ``hrm ops``'s main(): exit code 2 and one stderr line."""
    from hrm_cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg, allow_nan=True), encoding="utf-8")
    assert main(["ops", "--model", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needles[0] in lines[0], lines


def test_huge_integer_named():
    cfg = variant(MIXTRAL, {"hidden_size": -10**5000})
    with pytest.raises(HRMError, match="hidden_size"):
        model_from_config(cfg, "x", "x.json")
    with pytest.raises(HRMError, match="rope_theta"):
        model_from_config(variant(MIXTRAL, {"rope_theta": 10**5000}), "x", "x.json")


# --- file-level robustness ----------------------------------------------------------------

def _write(data: bytes):
    def make(tmp_path: Path) -> Path:
        path = tmp_path / "config.json"
        path.write_bytes(data)
        return path
    return make


def _directory_without_config(tmp_path: Path) -> Path:
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


def _config_is_directory(tmp_path: Path) -> Path:
    (tmp_path / "m" / "config.json").mkdir(parents=True)
    return tmp_path / "m"


def _fifo(tmp_path: Path) -> Path:
    os.mkfifo(tmp_path / "config.json")
    return tmp_path / "config.json"


def _fifo_in_directory(tmp_path: Path) -> Path:
    os.mkfifo(tmp_path / "config.json")
    return tmp_path


def _symlink_to_fifo(tmp_path: Path) -> Path:
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "link.json").symlink_to(tmp_path / "pipe")
    return tmp_path / "link.json"


GOOD_TEXT = json.dumps(MIXTRAL)
FILE_CASES = [
    pytest.param(_write("{\"model_type\": \"caf\xe9\"}".encode("latin-1")), "not UTF-8", id="latin-1"),
    pytest.param(_write(GOOD_TEXT.encode("utf-16")), "UTF-16", id="utf-16-bom"),
    pytest.param(_write(GOOD_TEXT.encode("utf-16-le")), "NUL", id="utf-16-no-bom"),
    pytest.param(_write(GOOD_TEXT.encode("utf-32")), "UTF-16/UTF-32", id="utf-32"),
    pytest.param(_write(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"), "not UTF-8", id="binary-png"),
    pytest.param(_write(b"\xff\xd8\xff\xe0garbage"), "not UTF-8", id="binary-jpeg"),
    pytest.param(_write(b"{'hidden_size': 64}"), "malformed JSON", id="single-quotes"),
    pytest.param(_write(b'{"hidden_size": 64'), "malformed JSON", id="truncated"),
    pytest.param(_write(b'{"hidden_size": 64,}'), "malformed JSON", id="trailing-comma"),
    pytest.param(_write(b""), "malformed JSON", id="empty"),
    pytest.param(_write(b"[" * 200_000), "nested too deeply", id="deep-lists"),
    pytest.param(_write(b'{"a":' * 200_000), "nested too deeply", id="deep-objects"),
    pytest.param(_write(b"[1, 2]"), "JSON object", id="top-level-list"),
    pytest.param(_write(b'"mixtral"'), "JSON object", id="top-level-string"),
    pytest.param(_write(b"null"), "JSON object", id="top-level-null"),
    pytest.param(_write(b"42"), "JSON object", id="top-level-number"),
    pytest.param(_write(b'{"hidden_size": 64, "hidden_size": 128}'), "hidden_size: duplicate key", id="duplicate-key"),
    pytest.param(_write(b'{"vocab_size": ' + b"9" * 5000 + b"}"), "malformed JSON", id="integer-beyond-digit-limit"),
    pytest.param(_write(GOOD_TEXT.replace('"rope_theta": 10000.0', '"rope_theta": NaN').encode()), "rope_theta",
                 id="nan-literal"),
    pytest.param(_write(GOOD_TEXT.replace('"hidden_size": 64', '"hidden_size": 1e400').encode()), "hidden_size",
                 id="overflowing-float"),
    pytest.param(_directory_without_config, "without a config.json", id="directory-without-config"),
    pytest.param(_config_is_directory, "a directory, not a regular file", id="config-json-is-directory"),
    pytest.param(_fifo, "FIFO", id="fifo"),
    pytest.param(_fifo_in_directory, "FIFO", id="fifo-in-directory"),
    pytest.param(_symlink_to_fifo, "FIFO", id="symlink-to-fifo"),
    pytest.param(lambda tmp_path: tmp_path / "missing" / "config.json", "no such file", id="missing-path"),
    pytest.param(lambda tmp_path: tmp_path / "missing.json", "no such file", id="missing-json"),
    pytest.param(lambda tmp_path: Path("/dev/null"), "character device", id="dev-null"),
]


@pytest.mark.parametrize("make,needle", FILE_CASES)
def test_bad_file_refused(make, needle, tmp_path):
    path = make(tmp_path)
    with pytest.raises(HRMError) as err:
        load_model(str(path))
    message = str(err.value)
    assert "\n" not in message and str(path) in message and needle in message, message


def test_oversized_file_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(model_mod, "MAX_CONFIG_BYTES", 64)
    path = tmp_path / "config.json"
    path.write_text(GOOD_TEXT)
    with pytest.raises(HRMError, match="MAX_CONFIG_BYTES"):
        load_model(str(path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(GOOD_TEXT)
    path.chmod(0)
    with pytest.raises(HRMError, match="cannot read"):
        load_model(str(path))


def test_utf8_bom_is_utf8(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD_TEXT.encode())
    assert load_model(str(path)).num_experts == 4


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "hrm_cli", *args], capture_output=True, text=True, timeout=timeout)


def _one_line_error(out, needle):
    assert out.returncode == 2, (out.returncode, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr and needle in lines[0], out.stderr


def test_cli_fifo_does_not_block(tmp_path):
    os.mkfifo(tmp_path / "config.json")
    _one_line_error(_cli("ops", "--model", str(tmp_path), timeout=60), "FIFO")


@pytest.mark.parametrize("make,needle", [FILE_CASES[0], FILE_CASES[10], FILE_CASES[20]])
def test_cli_bad_file(make, needle, tmp_path):
    _one_line_error(_cli("estimate", "--engine", "ideal", "--hw", "l4", "--model", str(make(tmp_path)), "--policy",
                         "N=64,mu=16,attn=cpu,ffn=gpu,rw=0,rc=0"), needle)


def test_cli_typo_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(variant(MIXTRAL, {"num_local_experts": DEL, "num_local_expert": 4})))
    _one_line_error(_cli("ops", "--model", str(path)), "num_local_experts")


# --- unknown keys: one warning line -------------------------------------------------------

def test_unknown_keys_one_warning_line(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(variant(MIXTRAL, {"zeta_key": 1, "alpha_key": [1], "moe_layer_pattern": 2})))
    spec = load_model(str(path))
    assert spec.num_experts == 4
    assert capsys.readouterr().err == f"warning: {path}: ignored keys: zeta_key, alpha_key, moe_layer_pattern\n"


def test_cli_unknown_keys_warn_and_succeed(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(variant(MIXTRAL, {"my_key": 1, "other": 2})))
    out = _cli("ops", "--model", str(path), "--json")
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [f"warning: {path}: ignored keys: my_key, other"]


def test_wrapper_top_level_model_keys_are_ignored_with_warning(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(variant(WRAPPER, {"vocab_size": 999, "tie_word_embeddings": True})))
    spec = load_model(str(path))
    assert spec.vocab_size == 256 and not spec.tie_embeddings
    assert capsys.readouterr().err == f"warning: {path}: ignored keys: vocab_size, tie_word_embeddings\n"


@pytest.mark.parametrize("name", sorted(p.stem for p in (DATA / "real").glob("*.json")))
def test_real_configs_load_like_the_catalog_without_warnings(name, capsys):
    """Full Hugging Face config.json files (every key they ship) load silently to the same
    spec as the trimmed catalog entry."""
    spec = load_model(str(DATA / "real" / f"{name}.json"))
    assert capsys.readouterr().err == ""
    assert spec.model_copy(update={"name": name}) == load_model(name)


# --- the shipped catalog is unchanged -------------------------------------------------------

#: max_position_embeddings (DBRX: max_seq_len) of each catalog model's Hugging Face config.json;
#: the small test configs state none
CONTEXT_WINDOWS = {"dbrx": 32768, "deepseek-moe-16b": 4096, "deepseek-v2-lite": 163840, "mistral-7b": 32768,
                   "mixtral-8x22b": 65536, "mixtral-8x7b": 32768, "olmoe-1b-7b": 4096, "qwen1.5-moe-a2.7b": 8192,
                   "qwen2-57b-a14b": 131072}


#: catalog entries added by issue 34 (real config.json files with a sibling <name>.source.txt)
#: the catalog entries added with a published config.json and its source (tests/test_modern_models.py)
MODERN_MODELS = tuple(sorted(p.name.removesuffix(".source.txt") for p in model_mod.CATALOG_DIR.glob("*.source.txt")))


def test_catalog_specs_unchanged(capsys):
    """Every catalog model loads to the spec captured from the code before issue 11."""
    golden = json.loads((DATA / "catalog_specs.json").read_text())
    # the models added since (issue 34) are tested against their published totals (tests/test_modern_models.py)
    assert sorted(golden) == [name for name in list_catalog() if name not in MODERN_MODELS]
    for name, want in golden.items():
        spec = load_model(name)
        # the context window, the (default, uniform) routing, the (absent) stored weight format and
        # issue 34's fields (no non-expert format, no sliding window, no sinks) and the local
        # attention's kind (the default, sliding) were added after the capture
        later = {"static_weight_format": None, "sliding_window": None, "sliding_window_layers": 0,
                 "local_attention": "sliding", "attention_sinks": False}
        assert spec.routing is None and spec.weight_format is None
        assert {k: getattr(spec, k) for k in later} == later, name
        assert spec.model_dump(mode="json", exclude={"max_context_len", "routing", "weight_format", *later}) \
            == want["spec"], name
        assert spec.sha256() == want["sha256"], name  # neither is hashed: old plans still load
        assert spec.max_context_len == CONTEXT_WINDOWS.get(name), name
    for alias, name in ALIASES.items():
        assert load_model(alias) == load_model(name)
    assert capsys.readouterr().err == ""


# --- good cases: numbers by hand ------------------------------------------------------------

def test_text_config_wrapper():
    spec = load_model(str(DATA / "llava-mixtral-wrapper.json"))
    assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads) == (256, 6, 8, 2)
    assert spec.head_dim == 256 // 8 == 32
    assert (spec.num_experts, spec.top_k, spec.expert_intermediate_size, spec.vocab_size) == (8, 2, 512, 32064)
    assert spec.weight_dtype == "fp16" and spec.rope_theta == 1e6
    assert costs.expert_bytes(spec) == 3 * 256 * 512 * 2


def test_decoder_sparse_step():
    spec = load_model(str(DATA / "qwen-moe-sparse-step.json"))
    # layers i with (i + 1) % 2 == 0: 1, 3, 5, 7 → 4 MoE layers, 4 dense (width intermediate_size)
    assert (spec.num_moe_layers, spec.first_dense_layers, spec.dense_intermediate_size) == (4, 4, 384)
    assert (spec.expert_intermediate_size, spec.shared_intermediate_size, spec.shared_expert_gate) == (64, 256, True)
    assert costs.total_expert_bytes(spec) == 4 * 16 * (3 * 128 * 64) * 2


def test_mlp_only_layers():
    spec = load_model(str(DATA / "qwen-moe-mlp-only-layers.json"))
    # layers 0 and 5 of 6 are dense → 4 MoE layers
    assert (spec.num_moe_layers, spec.first_dense_layers, spec.dense_intermediate_size) == (4, 2, 384)
    assert spec.shared_intermediate_size == 0 and not spec.shared_expert_gate
    assert costs.total_expert_bytes(spec) == 4 * 8 * (3 * 128 * 64) * 2


def test_sparse_step_and_mlp_only_layers_combine():
    cfg = variant(QWEN, {"num_hidden_layers": 8, "decoder_sparse_step": 2, "mlp_only_layers": [1]})
    spec, _ = model_from_config(cfg, "q", "q.json")
    assert spec.num_moe_layers == 3  # layers 3, 5, 7


def test_deepseek_first_k_dense_and_moe_layer_freq():
    spec = load_model(str(DATA / "deepseek-moe-layer-freq.json"))
    # i ≥ 1 and i % 2 == 0 among 10 layers: 2, 4, 6, 8 → 4 MoE layers, 6 dense
    assert (spec.num_moe_layers, spec.first_dense_layers, spec.dense_intermediate_size) == (4, 6, 512)
    assert spec.shared_intermediate_size == 2 * 32 and not spec.shared_expert_gate
    assert costs.total_expert_bytes(spec) == 4 * 16 * (3 * 128 * 32) * 2


def test_torch_dtype_float32():
    spec = load_model(str(DATA / "mixtral-float32.json"))
    assert (spec.weight_dtype, spec.activation_dtype, spec.kv_dtype) == ("fp32", "fp32", "fp16")
    assert dtype_bytes(spec.weight_dtype) == 4
    assert costs.expert_bytes(spec) == 3 * 64 * 128 * 4
    assert load_model(str(DATA / "mixtral-float32.json"), weight_dtype="fp16").weight_dtype == "fp16"  # flag wins


def test_gptq_4bit():
    spec = load_model(str(DATA / "mixtral-gptq-4bit.json"))
    assert (spec.weight_dtype, spec.activation_dtype) == ("int4", "fp16")
    assert dtype_bytes(spec.weight_dtype) == 0.5
    assert costs.expert_bytes(spec) == 3 * 64 * 128 * 0.5


@pytest.mark.parametrize("quant,dtype,nbytes", [
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True}, "int4", 0.5),
    ({"quant_method": "awq", "w_bit": 4}, "int4", 0.5),
    ({"quant_method": "GPTQ", "bits": 8}, "int8", 1.0),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "int4", 0.5),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True, "load_in_4bit": False}, "int8", 1.0),
])
def test_quantization_methods(quant, dtype, nbytes):
    spec, _ = model_from_config(variant(MIXTRAL, {"quantization_config": quant}), "q", "q.json")
    assert spec.weight_dtype == dtype and dtype_bytes(spec.weight_dtype) == nbytes


@pytest.mark.parametrize("name,dtype", [("float16", "fp16"), ("bfloat16", "fp16"), ("torch.float32", "fp32"),
                                        ("half", "fp16"), ("float", "fp32")])
def test_torch_dtype_names(name, dtype):
    spec, _ = model_from_config(variant(MIXTRAL, {"torch_dtype": name}), "d", "d.json")
    assert spec.weight_dtype == spec.activation_dtype == dtype


def test_nulls_are_absent_and_documented_defaults_apply():
    cfg = variant(MIXTRAL, {"num_key_value_heads": None, "head_dim": None, "rope_theta": DEL, "rms_norm_eps": DEL,
                            "tie_word_embeddings": DEL, "torch_dtype": None})
    spec, _ = model_from_config(cfg, "n", "n.json")
    assert (spec.num_kv_heads, spec.head_dim, spec.rope_theta, spec.rms_norm_eps) == (4, 16, 10000.0, 1e-5)
    assert not spec.tie_embeddings and spec.weight_dtype == "fp16"


def test_explicit_head_dim_kept():
    spec, _ = model_from_config(variant(MIXTRAL, {"head_dim": 32}), "h", "h.json")
    assert spec.head_dim == 32 and spec.q_dim == 4 * 32


def test_dense_config():
    spec, ignored = model_from_config(DENSE, "d", "d.json")
    assert (spec.num_experts, spec.top_k, spec.expert_intermediate_size, spec.first_dense_layers) == (1, 1, 128, 0)
    assert ignored == []


# --- property: load succeeds with a plausible spec or raises HRMError, nothing else ------------

KEY_POOL = sorted(READ_KEYS | FILE_KEYS | {"_hrm_name", "num_local_expert", "sliding_window", "rope_scaling"})
LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 300), st.integers(-2**70, 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from(["float32", "bfloat16", "gptq", "bitsandbytes", "4096", "mixtral", "qwen2_moe"]),
)
JSON_VALUES = st.recursive(
    LEAVES, lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(KEY_POOL + ["bits", "quant_method", "load_in_4bit"]) | st.text(max_size=5),
                      children, max_size=4),
    max_leaves=10)


def assert_plausible(spec: ModelSpec):
    assert isinstance(spec, ModelSpec)
    assert 1 <= spec.hidden_size <= MAX_HIDDEN_SIZE and 1 <= spec.num_layers <= MAX_LAYERS
    assert 1 <= spec.num_heads <= MAX_HEADS and 1 <= spec.num_kv_heads <= spec.num_heads
    assert 1 <= spec.head_dim <= MAX_HEAD_DIM and 1 <= spec.vocab_size <= MAX_VOCAB
    assert 1 <= spec.top_k <= spec.num_experts <= MAX_EXPERTS
    assert 1 <= spec.expert_intermediate_size <= MAX_INTERMEDIATE_SIZE
    assert 0 <= spec.first_dense_layers < spec.num_layers and spec.num_moe_layers >= 1
    assert spec.weight_dtype in DTYPES and spec.activation_dtype in DTYPES
    assert math.isfinite(spec.rope_theta) and spec.rope_theta > 0 and 0 < spec.rms_norm_eps <= 1
    assert costs.total_params(spec) > 0


def load_or_refuse(cfg):
    try:
        spec, ignored = model_from_config(cfg, "p", "p.json")
    except HRMError as exc:
        assert "\n" not in str(exc)
        return None
    assert_plausible(spec)
    assert all(isinstance(key, str) and "\n" not in key for key in ignored)
    return spec


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(KEY_POOL) | st.text(max_size=6), JSON_VALUES, max_size=14))
def test_property_random_dicts(cfg):
    load_or_refuse(cfg)


@settings(max_examples=300, deadline=None)
@given(base=st.sampled_from(sorted(BASES)),
       changes=st.dictionaries(st.sampled_from(KEY_POOL), JSON_VALUES | st.integers(0, 64), max_size=3),
       dropped=st.sets(st.sampled_from(KEY_POOL), max_size=3),
       wrap=st.booleans())
def test_property_perturbed_configs(base, changes, dropped, wrap):
    """Near-valid configs (a valid base with a few keys changed or dropped, maybe wrapped
    under text_config) exercise the checks past the first missing key."""
    cfg = variant(BASES[base], {**changes, **{key: DEL for key in dropped}})
    if wrap:
        cfg = {"model_type": "llava", "torch_dtype": "float16", "text_config": cfg}
    load_or_refuse(cfg)


def test_property_bases_load():
    for cfg in BASES.values():
        assert load_or_refuse(cfg) is not None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300) | st.text(max_size=200).map(str.encode)
       | JSON_VALUES.map(lambda v: json.dumps(v, allow_nan=True).encode()))
def test_property_random_bytes(data):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_bytes(data)
        try:
            spec = load_model(str(path))
        except HRMError as exc:
            assert "\n" not in str(exc)
        else:
            assert_plausible(spec)


def test_known_ignored_keys_are_not_read():
    """The two key sets stay apart: a key the normaliser reads is never filed as irrelevant
    (except identity keys read only to recognise a MoE)."""
    assert READ_KEYS & KNOWN_IGNORED_KEYS <= {"model_type", "architectures"}
