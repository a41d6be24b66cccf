"""Model spec (docs/model.md §3.2): from a Hugging Face ``config.json`` path or a catalog name.

The catalog (``hrm/data/models/*.json``) holds real config.json files, so catalog names and
user paths go through the same key-zoo normaliser (:func:`hrm.model.hf_config.normalize_hf_config`).
It is strict (issue 11): explicit values are validated, never rewritten; a bad file, value or
combination is one HRMError line naming the file and the key; keys it neither reads nor
knows to be irrelevant are listed in one warning line on stderr.
"""

from __future__ import annotations

import difflib
import errno
import hashlib
import json
import os
import stat
import sys
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .. import bounds
from ..errors import HRMError, file_kind, pydantic_message, read_json_object, shown_value, value_kind
from .hf_config import ignored_keys, normalize_hf_config
from .routing import Routing
from ..units import FLOAT_DTYPES

CATALOG_DIR = Path(__file__).resolve().parents[1] / "data" / "models"
MAX_CONFIG_BYTES = 16 << 20  # real config.json files are under 100 KB
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


class RoutingMismatch(HRMError, ValueError):
    """A routing distribution that is not the model's (other experts, top-k or MoE layers): bad
    input (exit 2), and a ValueError as pydantic's refusal was before it (callers catch that)."""


class ModelSpec(BaseModel):
    """A decoder-only (MoE) transformer. Paper notation: h1 = hidden_size,
    h2 = expert_intermediate_size, nq/nkv = heads, ne = num_experts, k = top_k.

    A dense model is a one-expert MoE (num_experts = top_k = 1) so that its MLP weights are
    offloadable like experts. ``first_dense_layers`` (DeepSeek's first_k_dense_replace)
    have a dense MLP of ``dense_intermediate_size`` kept with the non-expert weights; it
    counts every dense layer of a MoE model (also DeepSeek's moe_layer_freq and Qwen-MoE's
    decoder_sparse_step / mlp_only_layers), placed first: the cost model depends on how many
    layers are dense, not on where they sit.
    MLA (DeepSeek-V2) is on when ``kv_lora_rank`` is set: the KV cache holds the latent
    (kv_lora_rank + qk_rope_head_dim) per token and layer.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: printed in tables and recorded in plans: one printable line (hrm.bounds.Label)
    name: bounds.Label
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
    #: the context window (config.json max_position_embeddings or its aliases); None: not stated
    max_context_len: Optional[int] = Field(default=None, gt=0)
    rope_theta: float = Field(default=10000.0, gt=0)
    rms_norm_eps: float = Field(default=1e-5, gt=0)
    weight_dtype: Dtype = "fp16"
    kv_dtype: Dtype = "fp16"
    activation_dtype: Dtype = "fp16"
    #: how quantized weights are stored (a name in :data:`hrm.model.quantized.WEIGHT_FORMATS`: a GGUF
    #: type such as q4_k_m, or int4-g128), its bits per weight with scales; None: the weight
    #: dtype's packed payload only (docs/model.md §4.8)
    weight_format: Optional[str] = None
    #: how the weights that are not routed experts (attention, router, shared experts, dense
    #: layers, embeddings) are stored when it differs from the experts: a float dtype (fp16,
    #: bf16, fp32) where a checkpoint quantizes only its experts (gpt-oss: quantization_config
    #: modules_to_not_convert), or a weight format name; None: as the experts
    static_weight_format: Optional[str] = None
    #: local attention: ``sliding_window_layers`` of the layers attend over at most
    #: ``sliding_window`` tokens and cache no more (config.json layer_types + sliding_window; Llama 4:
    #: attention_chunk_size). How they do is ``local_attention``: "sliding", over the last
    #: ``sliding_window`` tokens; "chunked", within the aligned chunk of ``sliding_window`` tokens
    #: the query is in (docs/model.md §3.2, :func:`hrm.cost.costs.attended_context`)
    sliding_window: Optional[int] = Field(default=None, gt=0)
    sliding_window_layers: int = Field(default=0, ge=0)
    local_attention: Literal["sliding", "chunked"] = "sliding"
    #: a learned per-head sink logit in every layer's softmax (gpt-oss): num_heads parameters a layer
    attention_sinks: bool = False
    #: which experts tokens choose (hrm.model.routing); None: uniform and independent (docs/model.md §4.1)
    routing: Optional[Routing] = None

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
        if self.routing is not None and (self.routing.num_experts, self.routing.top_k) != (self.num_experts, self.top_k):
            raise ValueError(f"routing: a distribution over {self.routing.num_experts} experts, top-{self.routing.top_k}; "
                             f"the model has {self.num_experts}, top-{self.top_k}")
        if self.sliding_window_layers > self.num_layers:
            raise ValueError(f"sliding_window_layers ({self.sliding_window_layers}) exceeds num_layers ({self.num_layers})")
        if self.sliding_window_layers and self.sliding_window is None:
            raise ValueError("sliding_window_layers needs sliding_window")
        if self.local_attention != "sliding" and not self.sliding_window_layers:
            raise ValueError(f"local_attention {self.local_attention!r} needs sliding_window_layers (the layers that "
                             f"attend locally)")
        if self.static_weight_format is not None and self.static_weight_format not in FLOAT_DTYPES:
            from .quantized import is_weight_format

            if not is_weight_format(self.static_weight_format):
                raise ValueError(f"static_weight_format: unknown {self.static_weight_format!r} (a float dtype or a "
                                 f"weight format)")
        if self.weight_format is not None:
            from .quantized import WEIGHT_FORMATS, is_weight_format

            if not is_weight_format(self.weight_format):
                raise ValueError(f"weight_format: unknown {self.weight_format!r} (one of {', '.join(WEIGHT_FORMATS)}, "
                                 f"or mix:TYPE*WEIGHTS,...)")
            if self.weight_dtype in FLOAT_DTYPES:
                raise ValueError(f"weight_format {self.weight_format} needs quantized weights (weight_dtype int4 or "
                                 f"int8), not {self.weight_dtype}")
        rows = len(self.routing.probabilities) if self.routing is not None else 1
        if self.routing is not None and self.routing.kind == "trace" and rows != self.num_moe_layers:
            # a trace has one row per MoE layer (hrm run --routing-trace): another count is another model's
            raise ValueError(f"routing: the trace has {rows} MoE layers; {self.name} has {self.num_moe_layers}")
        return self

    # --- derived --------------------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers

    @property
    def moe_layer_indices(self) -> list[int]:
        """Absolute indices of the layers with routed experts (dense first layers excluded)."""
        return list(range(self.first_dense_layers, self.num_layers))

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
        """Hash of the fields the cost model reads (the context window only bounds the
        workload, so plans made before it was read keep their hash; so do uniform routing,
        an absent stored weight format and the later fields at their defaults)."""
        defaults = {"routing": None, "weight_format": None, "static_weight_format": None, "sliding_window": None,
                    "sliding_window_layers": 0, "local_attention": "sliding", "attention_sinks": False}
        exclude = {"max_context_len"} | {k for k, v in defaults.items() if getattr(self, k) == v}
        blob = json.dumps(self.model_dump(mode="json", exclude=exclude), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    def with_routing(self, routing: Optional[Routing]) -> "ModelSpec":
        """The spec with another routing distribution (None or uniform: the uniform routing of docs/model.md §4.1);
        :class:`RoutingMismatch` (one line naming the routing) when it is not one of this model's."""
        routing = None if routing is None or routing.kind == "uniform" else routing
        if routing == self.routing:
            return self
        try:
            return ModelSpec.model_validate({**self.model_dump(), "routing": routing})
        except ValidationError as exc:
            raise RoutingMismatch(pydantic_message(f"--routing {routing.label()}", exc)) from None

    def with_dtypes(self, weight_dtype: Optional[str] = None, kv_dtype: Optional[str] = None) -> "ModelSpec":
        """The spec with other weight/KV dtypes. Float weights also set the activation dtype
        (kernels compute in the weights' type); quantised weights keep the activations."""
        update = {k: v for k, v in (("weight_dtype", weight_dtype), ("kv_dtype", kv_dtype)) if v}
        if weight_dtype in FLOAT_DTYPES:
            update["activation_dtype"] = weight_dtype
        if weight_dtype and weight_dtype != self.weight_dtype:
            update["weight_format"] = None  # another dtype: the format named for the old one no longer holds
        return self.model_copy(update=update) if update else self

    def with_stored_format(self, weight_format: str) -> "ModelSpec":
        """The spec with its weights stored as ``weight_format`` and the quantized dtype its bits
        imply (:func:`hrm.model.quantized.quantized_dtype`): what a GGUF type alone says, whether a
        file's name or ``--weight-format`` names it; HRMError (one line) for an unknown format."""
        from .quantized import is_weight_format, quantized_dtype

        if not is_weight_format(weight_format):
            return self.with_weight_format(weight_format)  # its one-line refusal
        return self.with_dtypes(quantized_dtype(weight_format)).with_weight_format(weight_format)

    def with_weight_format(self, weight_format: Optional[str]) -> "ModelSpec":
        """The spec with its quantized weights stored as ``weight_format`` (a name in
        :data:`hrm.model.quantized.WEIGHT_FORMATS`; None: the dtype's payload only); HRMError (one
        line) for an unknown format or float weights."""
        if weight_format == self.weight_format:
            return self
        try:
            return ModelSpec.model_validate({**self.model_dump(), "weight_format": weight_format})
        except ValidationError as exc:
            raise HRMError(pydantic_message("--weight-format", exc)) from None


def list_catalog() -> list[str]:
    return sorted(p.stem for p in CATALOG_DIR.glob("*.json"))


def catalog_config_path(name: str) -> Path:
    """Catalog file for a name or alias; HRMError with close matches otherwise."""
    key = name.lower()
    key = ALIASES.get(key, key)
    if key in list_catalog():
        return CATALOG_DIR / f"{key}.json"
    choices = list_catalog() + list(ALIASES)
    close = difflib.get_close_matches(key, choices, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(list_catalog())}"
    raise HRMError(f"unknown model {shown_value(name)} (not a config.json path or catalog name){hint}")


def _looks_like_path(text: str) -> bool:
    return "/" in text or os.sep in text or text.lower().endswith(".json")


def _stat(path: Path):
    """os.stat of ``path``, or None where there is nothing (or no valid path name) there."""
    try:
        return path.stat()
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None
    except OSError as exc:
        if exc.errno in (errno.ENAMETOOLONG, errno.ELOOP):
            return None
        raise HRMError(f"{path}: cannot access ({exc.strerror or exc})") from None


def resolve_config_path(name_or_path: str) -> tuple[Path, str]:
    """(config.json path, model name) for a path, a directory holding config.json, or a
    catalog name/alias; refuses directories without one and anything not a regular file."""
    text = str(name_or_path)
    path = Path(text)
    info = _stat(path) if text else None
    if info is not None and stat.S_ISDIR(info.st_mode):
        path = path / "config.json"
        info = _stat(path)
        if info is None:
            raise HRMError(f"{text}: a directory without a config.json")
    if info is None:
        if _looks_like_path(text):
            raise HRMError(f"{text}: no such file (and not a catalog model name)")
        path = catalog_config_path(text)
        info = _stat(path)
        if info is None:
            raise HRMError(f"{path}: cannot read the catalog file")
        return path, path.stem
    if not stat.S_ISREG(info.st_mode):
        raise HRMError(f"{path}: {file_kind(info.st_mode)}, not a regular file; expected a config.json")
    # a config.json is named after its folder (resolved: `config.json` in the current folder has no parent name)
    return path, path.resolve().parent.name if path.name == "config.json" else path.stem


def read_config_json(path: Path) -> dict:
    """The JSON object in ``path`` (UTF-8, at most MAX_CONFIG_BYTES, no duplicate keys).
    Read by :func:`hrm.errors.read_json_object` (regular files only, so a FIFO cannot hang it)."""
    return read_json_object(path, "a config.json (at most MAX_CONFIG_BYTES)", MAX_CONFIG_BYTES)


def model_from_config(cfg: dict, name: str, source: str) -> tuple[ModelSpec, list[str]]:
    """(ModelSpec, ignored keys) from a parsed config.json; HRMError naming the key if refused."""
    if not isinstance(cfg, dict):
        raise HRMError(f"{source}: expected a JSON object at the top level, got {value_kind(cfg)}")
    label = cfg.get("_hrm_name")
    if label is None:
        label = name
    elif not isinstance(label, str) or not label.strip() or not label.isprintable():
        raise HRMError(f"{source}: _hrm_name: must be a non-empty printable string, got {value_kind(label)}")
    fields = normalize_hf_config(cfg, label, source)
    try:
        spec = ModelSpec.model_validate(fields)
    except ValidationError as exc:
        raise HRMError(pydantic_message(source, exc)) from None
    text = cfg.get("text_config")
    return spec, ignored_keys(cfg, text if isinstance(text, dict) else None)


def load_model(name_or_path: str, weight_dtype: Optional[str] = None, kv_dtype: Optional[str] = None) -> ModelSpec:
    """ModelSpec from a config.json path, a directory holding one, or a catalog name/alias.
    Keys neither read nor known to be irrelevant are listed in one warning line on stderr."""
    if str(name_or_path).lower().endswith(".gguf"):  # a GGUF: sizes and tensor types from its header
        from .gguf import model_fields_from_gguf

        if _stat(Path(name_or_path)) is None:
            raise HRMError(f"{name_or_path}: no such file")
        try:  # hrm.model.gguf reads the header into fields; the spec is built here (no import cycle)
            spec = ModelSpec.model_validate(model_fields_from_gguf(name_or_path))
        except ValidationError as exc:
            raise HRMError(pydantic_message(str(name_or_path), exc)) from None
        return spec.with_dtypes(weight_dtype, kv_dtype)
    path, name = resolve_config_path(name_or_path)
    spec, ignored = model_from_config(read_config_json(path), name, str(path))
    if ignored:
        print(f"warning: {path}: ignored keys: {', '.join(ignored)}", file=sys.stderr)
    return spec.with_dtypes(weight_dtype, kv_dtype)
