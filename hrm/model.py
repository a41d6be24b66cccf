"""Model spec (SPEC §3): from a Hugging Face ``config.json`` path or a catalog name.

The catalog (``hrm/data/models/*.json``) holds real config.json files, so catalog names and
user paths go through the same key-zoo normaliser (:func:`normalize_hf_config`).
"""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import HRMError, pydantic_message
from .units import FLOAT_DTYPES

CATALOG_DIR = Path(__file__).resolve().parent / "data" / "models"
ALIASES = {
    "mixtral": "mixtral-8x7b",
    "mixtral-8x7b-v0.1": "mixtral-8x7b",
    "mixtral-8x22b-v0.1": "mixtral-8x22b",
    "dbrx-instruct": "dbrx",
    "dbrx-base": "dbrx",
    "qwen-moe": "qwen1.5-moe-a2.7b",
    "qwen2-moe": "qwen2-57b-a14b",
    "deepseek-moe": "deepseek-moe-16b",
    "deepseek-v2": "deepseek-v2-lite",
    "olmoe": "olmoe-1b-7b",
    "mistral": "mistral-7b",
}

Dtype = Literal["fp32", "fp16", "bf16", "int8", "int4"]


class ModelSpec(BaseModel):
    """A decoder-only (MoE) transformer. Paper notation: h1 = hidden_size,
    h2 = expert_intermediate_size, nq/nkv = heads, ne = num_experts, k = top_k.

    A dense model is a one-expert MoE (num_experts = top_k = 1) so that its MLP weights are
    offloadable like experts. ``first_dense_layers`` (DeepSeek's first_k_dense_replace)
    have a dense MLP of ``dense_intermediate_size`` kept with the non-expert weights.
    MLA (DeepSeek-V2) is on when ``kv_lora_rank`` is set: the KV cache holds the latent
    (kv_lora_rank + qk_rope_head_dim) per token and layer.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    hidden_size: int = Field(gt=0)
    num_layers: int = Field(gt=0)
    num_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    num_experts: int = Field(default=1, gt=0)
    top_k: int = Field(default=1, gt=0)
    expert_intermediate_size: int = Field(gt=0)
    shared_intermediate_size: int = Field(default=0, ge=0)
    shared_expert_gate: bool = False
    first_dense_layers: int = Field(default=0, ge=0)
    dense_intermediate_size: int = Field(default=0, ge=0)
    tie_embeddings: bool = False
    kv_lora_rank: Optional[int] = Field(default=None, gt=0)
    q_lora_rank: Optional[int] = Field(default=None, gt=0)
    qk_rope_head_dim: int = Field(default=0, ge=0)
    qk_nope_head_dim: int = Field(default=0, ge=0)
    v_head_dim: int = Field(default=0, ge=0)
    rope_theta: float = Field(default=10000.0, gt=0)
    rms_norm_eps: float = Field(default=1e-5, gt=0)
    weight_dtype: Dtype = "fp16"
    kv_dtype: Dtype = "fp16"
    activation_dtype: Dtype = "fp16"

    @model_validator(mode="after")
    def _consistent(self):
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds num_experts ({self.num_experts})")
        if self.kv_lora_rank is None and self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) not a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.first_dense_layers >= self.num_layers and self.num_experts > 1:
            raise ValueError("first_dense_layers must leave at least one MoE layer")
        if self.first_dense_layers and not self.dense_intermediate_size:
            raise ValueError("first_dense_layers needs dense_intermediate_size")
        if self.kv_lora_rank is not None and not (self.qk_rope_head_dim and self.qk_nope_head_dim and self.v_head_dim):
            raise ValueError("MLA (kv_lora_rank) needs qk_rope_head_dim, qk_nope_head_dim and v_head_dim")
        return self

    # --- derived --------------------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers

    @property
    def q_dim(self) -> int:
        """Width of the query projection output (nq × head dim)."""
        if self.is_mla:
            return self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return self.num_heads * self.head_dim

    @property
    def attn_out_dim(self) -> int:
        """Width of the attention output entering o_proj."""
        return self.num_heads * (self.v_head_dim if self.is_mla else self.head_dim)

    @property
    def kv_dim(self) -> int:
        """Width of K (= width of V) per token for GQA (nkv × head dim)."""
        return self.num_kv_heads * self.head_dim

    @property
    def kv_elements_per_token(self) -> int:
        """KV-cache elements per token per layer: 2·nkv·d (GQA) or kv_lora_rank + rope (MLA)."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_dim

    def sha256(self) -> str:
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    def with_dtypes(self, weight_dtype: Optional[str] = None, kv_dtype: Optional[str] = None) -> "ModelSpec":
        """The spec with other weight/KV dtypes. Float weights also set the activation dtype
        (kernels compute in the weights' type); quantised weights keep the activations."""
        update = {k: v for k, v in (("weight_dtype", weight_dtype), ("kv_dtype", kv_dtype)) if v}
        if weight_dtype in FLOAT_DTYPES:
            update["activation_dtype"] = weight_dtype
        return self.model_copy(update=update) if update else self


# --- Hugging Face key zoo -------------------------------------------------------------

def _first(cfg: dict, *paths: str):
    """First present key among dotted ``paths`` (``ffn_config.moe_top_k``)."""
    for path in paths:
        node = cfg
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node or node[part] is None:
                node = None
                break
            node = node[part]
        if node is not None:
            return node
    return None


REQUIRED_KEYS = {
    "hidden_size": ("hidden_size", "d_model", "n_embd"),
    "num_layers": ("num_hidden_layers", "n_layers", "num_layers", "n_layer"),
    "num_heads": ("num_attention_heads", "n_heads", "n_head"),
    "vocab_size": ("vocab_size",),
}


def normalize_hf_config(cfg: dict, name: str) -> dict:
    """Map a config.json (Mixtral, DBRX, Qwen-MoE, DeepSeek, OLMoE, Llama/Mistral) to ModelSpec fields."""
    out: dict = {"name": name}
    for field, keys in REQUIRED_KEYS.items():
        value = _first(cfg, *keys)
        if value is None:
            raise HRMError(f"{name}: config lacks required key {' / '.join(keys)}")
        out[field] = value
    hidden, heads = out["hidden_size"], out["num_heads"]
    out["num_kv_heads"] = _first(cfg, "num_key_value_heads", "attn_config.kv_n_heads", "num_kv_heads") or heads
    out["head_dim"] = _first(cfg, "head_dim") or hidden // heads
    experts = _first(cfg, "num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts", "ffn_config.moe_num_experts")
    out["num_experts"] = experts or 1
    out["top_k"] = (_first(cfg, "num_experts_per_tok", "moe_top_k", "ffn_config.moe_top_k") or 1) if experts else 1
    dense_width = _first(cfg, "intermediate_size", "ffn_config.ffn_hidden_size", "n_inner")
    expert_width = _first(cfg, "moe_intermediate_size", "ffn_config.ffn_hidden_size") if experts else None
    expert_width = expert_width or dense_width
    if expert_width is None:
        raise HRMError(f"{name}: config lacks required key intermediate_size / moe_intermediate_size / ffn_config.ffn_hidden_size")
    out["expert_intermediate_size"] = expert_width
    shared = _first(cfg, "shared_expert_intermediate_size")
    if shared is None and _first(cfg, "n_shared_experts"):
        shared = _first(cfg, "n_shared_experts") * expert_width
    out["shared_intermediate_size"] = shared or 0
    out["shared_expert_gate"] = _first(cfg, "shared_expert_intermediate_size") is not None
    first_dense = _first(cfg, "first_k_dense_replace") or 0
    if experts and first_dense:
        out["first_dense_layers"] = first_dense
        out["dense_intermediate_size"] = dense_width
    out["tie_embeddings"] = bool(_first(cfg, "tie_word_embeddings"))
    for key in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
        if _first(cfg, key) is not None:
            out[key] = _first(cfg, key)
    if out.get("kv_lora_rank"):
        out["num_kv_heads"] = heads
    theta = _first(cfg, "rope_theta", "attn_config.rope_theta")
    if theta:
        out["rope_theta"] = theta
    eps = _first(cfg, "rms_norm_eps")
    if eps:
        out["rms_norm_eps"] = eps
    return out


def list_catalog() -> list[str]:
    return sorted(p.stem for p in CATALOG_DIR.glob("*.json"))


def catalog_config_path(name: str) -> Path:
    """Catalog file for a name or alias; HRMError with close matches otherwise."""
    key = name.lower()
    key = ALIASES.get(key, key)
    path = CATALOG_DIR / f"{key}.json"
    if path.exists():
        return path
    choices = list_catalog() + list(ALIASES)
    close = difflib.get_close_matches(key, choices, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(list_catalog())}"
    raise HRMError(f"unknown model '{name}' (not a config.json path or catalog name){hint}")


def load_model(name_or_path: str, weight_dtype: Optional[str] = None, kv_dtype: Optional[str] = None) -> ModelSpec:
    """ModelSpec from a config.json path, a directory holding one, or a catalog name/alias."""
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if path.exists():
        name = path.parent.name if path.name == "config.json" else path.stem
    else:
        path = catalog_config_path(name_or_path)
        name = path.stem
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise HRMError(f"{path}: malformed JSON (line {exc.lineno}: {exc.msg})") from None
    except OSError as exc:
        raise HRMError(f"{path}: cannot read ({exc.strerror})") from None
    if not isinstance(cfg, dict):
        raise HRMError(f"{path}: expected a JSON object")
    fields = normalize_hf_config(cfg, cfg.get("_hrm_name", name))
    try:
        spec = ModelSpec.model_validate(fields)
    except ValidationError as exc:
        raise HRMError(pydantic_message(str(path), exc)) from None
    return spec.with_dtypes(weight_dtype, kv_dtype)
