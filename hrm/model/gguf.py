"""A GGUF file's weights as llama.cpp will run them: every tensor's name, ggml type and shape,
and the attention and routing facts of its header (the GGUF format: ggml-org/ggml
docs/gguf.md). Read with the ``gguf`` package (gguf-py, llama.cpp's own reader), which maps the
file and reads only its header; or from a tensor table, the same facts as JSON
(:func:`tensor_table`: what hrm commits for a GGUF too large to ship).
"""

from __future__ import annotations

import functools

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import HRMError

#: a table's format marker
TABLE_FORMAT = "hrm-gguf-tensors/1"
def bits_per_element(ggml_type: str) -> float:
    """Bits per weight of a tensor's ggml type (hrm.model.quantized.GGML_BLOCKS, the block structs)."""
    from .quantized import ggml_bits_per_weight

    try:
        return ggml_bits_per_weight(ggml_type)
    except KeyError:
        raise HRMError(f"GGUF: tensor type {ggml_type}: its bits per weight are not known here") from None


@dataclass(frozen=True)
class GgufTensor:
    """One tensor: ``shape`` is ggml's ne (ne[0] = a row's length, then rows, then experts)."""

    name: str
    ggml_type: str
    shape: tuple[int, ...]

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n

    @property
    def is_expert(self) -> bool:
        """A layer's routed experts in one 3-D tensor (``blk.N.ffn_up_exps``; MUL_MAT_ID)."""
        return "_exps." in self.name or self.name.endswith("_exps")

    @property
    def is_output(self) -> bool:
        return self.name in ("output.weight", "output")

    @property
    def per_head_shape(self) -> str | None:
        """A dense weight of one [K x N] matrix per head (MLA's absorbed ``attn_k_b`` / ``attn_v_b``:
        ``[K, N, heads]``, multiplied per head, src/models/deepseek2.cpp:556-560) as "K:N:HEADS"; None
        for a 2-D weight or the routed experts."""
        if self.is_expert or len(self.shape) != 3 or int(self.shape[2]) <= 1:
            return None
        return ":".join(str(int(d)) for d in self.shape)

    @property
    def is_per_stream(self) -> bool:
        """MLA's value decompression (``blk.N.attn_v_b``, one [kv_lora_rank x d_v] matrix per head):
        applied inside the attention, after the batch is split into the KV cache's streams, as a
        matmul broadcast over heads and streams, so each product takes one stream's tokens
        (src/llama-graph.cpp:2629-2635 the split, :2669-2681 ``ggml_mul_mat(v_mla, cur)``)."""
        return ".attn_v_b." in self.name or self.name.endswith(".attn_v_b")


@dataclass(frozen=True)
class AttentionShape:
    """What a layer's attention reads per cached token: ``kv_heads`` heads of ``k_width`` +
    ``v_width`` elements, ``heads_per_kv`` query heads sharing each; over ``layers`` layers."""

    layers: int
    kv_heads: int
    heads_per_kv: int
    k_width: int
    v_width: int

    @property
    def query_heads(self) -> int:
        return self.kv_heads * self.heads_per_kv


@dataclass(frozen=True)
class MatmulGroup:
    """Matmul weights a step prices alike, their elements summed: one ggml type and per-head
    shape, routed experts or not, one product per KV stream or not, and whether they run on the
    output rows only (the output head, and the last layer's FFN after the graph keeps those rows)."""

    ggml_type: str
    per_head_shape: str | None
    is_expert: bool
    is_per_stream: bool
    output_rows: bool
    elements: int


@dataclass(frozen=True)
class TensorInventory:
    """A model's tensors with the header facts the CPU step model needs."""

    source: str
    architecture: str
    tensors: tuple[GgufTensor, ...]
    attention: AttentionShape
    num_experts: int
    top_k: int

    def matmul_tensors(self) -> tuple[GgufTensor, ...]:
        """The weights a step multiplies by: every tensor of 2+ dimensions but the token
        embedding (a row lookup), which stands in for the output head when the model ties them
        (llama.cpp uses tok_embd as output when there is no output.weight: src/llama-model.cpp)."""
        return self._matmuls

    @functools.cached_property  # every step of a run reads it; the inventory is frozen
    def matmul_groups(self) -> tuple[MatmulGroup, ...]:
        """:meth:`matmul_tensors` summed into :class:`MatmulGroup` s (in first-seen order); the
        last layer's FFN runs on the output rows only (src/models/llama.cpp:174-177,
        qwen3moe.cpp:123-126, deepseek2.cpp:636-639: get_rows of inp_out_ids after attention)."""
        last_ffn = f"blk.{self.attention.layers - 1}.ffn_"
        sums: dict[tuple, int] = {}
        for t in self.matmul_tensors():
            key = (t.ggml_type, t.per_head_shape, t.is_expert, t.is_per_stream,
                   t.is_output or t.name.startswith(last_ffn))
            sums[key] = sums.get(key, 0) + t.elements
        return tuple(MatmulGroup(*key, elements) for key, elements in sums.items())

    @functools.cached_property  # every step of a run reads it; the inventory is frozen
    def _matmuls(self) -> tuple[GgufTensor, ...]:
        mats = [t for t in self.tensors if len([d for d in t.shape if d > 1]) >= 2]
        has_output = any(t.is_output for t in mats)
        out = []
        for t in mats:
            if t.name.startswith("token_embd"):
                if not has_output:
                    out.append(GgufTensor("output.weight", t.ggml_type, t.shape))
                continue
            out.append(t)
        return tuple(out)

    @property
    def weight_bytes(self) -> float:
        """Bytes of every tensor at its type's bits per weight (the file's weight data)."""
        return sum(t.elements * bits_per_element(t.ggml_type) / 8 for t in self.tensors)


def _attention(meta: dict, arch: str) -> AttentionShape:
    def get(key, default=None):
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise HRMError(f"GGUF: no {arch}.{key} in the header")
        return int(value)

    layers = get("block_count")
    heads = get("attention.head_count")
    kv_lora = meta.get(f"{arch}.attention.kv_lora_rank")
    if kv_lora:
        # MLA (DeepSeek-V2/V3, Kimi): one latent per token, all heads attend over it; V is a
        # view of the same cache (src/llama-graph.cpp build_attn_mha with v_mla)
        rope = get("rope.dimension_count")
        return AttentionShape(layers, 1, heads, int(kv_lora) + rope, int(kv_lora))
    kv_heads = get("attention.head_count_kv", heads)
    k = get("attention.key_length", meta.get(f"{arch}.embedding_length", 0) // heads)
    v = get("attention.value_length", k)
    return AttentionShape(layers, kv_heads, heads // kv_heads, k, v)


#: header keys a table keeps (per architecture prefix)
_META_KEYS = ("block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
              "attention.key_length", "attention.value_length", "attention.kv_lora_rank", "rope.dimension_count",
              "expert_count", "expert_used_count", "expert_shared_count", "leading_dense_block_count")


def _inventory(source: str, arch: str, meta: dict, tensors: list[GgufTensor]) -> TensorInventory:
    experts = int(meta.get(f"{arch}.expert_count") or 1)
    top_k = int(meta.get(f"{arch}.expert_used_count") or 1)
    return TensorInventory(source, arch, tuple(tensors), _attention(meta, arch), experts, top_k)


def _header_reader(path: str | Path):
    """gguf-py's reader of the file's header only: the tensor table (name, type id, shape)
    without mapping any tensor's data, so a partial download (the first MBs) or a file whose
    types gguf-py does not know (ggml's newer ones: hrm.model.quantized.GGML_TYPE_IDS) is enough."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise HRMError(f"{path}: reading a GGUF file needs the gguf package (pip install 'hrm[gguf]')") from None

    class HeaderReader(GGUFReader):
        def _build_tensors(self, start_offs, fields):
            from .quantized import GGML_TYPE_IDS

            infos = []
            for field in fields:
                _, name, _, dims, raw_type, _ = field.parts
                type_id = int(raw_type[0])
                if type_id not in GGML_TYPE_IDS:
                    raise ValueError(f"tensor {bytes(name).decode(errors='replace')}: unknown ggml type id {type_id}")
                infos.append(GgufTensor(bytes(name).decode("utf-8"), GGML_TYPE_IDS[type_id],
                                        tuple(int(d) for d in dims)))
            self.tensors = []
            self.header_tensors = infos

    try:
        return HeaderReader(str(path))
    except (OSError, ValueError, KeyError, IndexError, UnicodeDecodeError) as exc:
        raise HRMError(f"{path}: not a readable GGUF file ({str(exc).splitlines()[0][:120] if str(exc) else exc})") \
            from None


def read_gguf(path: str | Path) -> tuple[str, dict, list[GgufTensor]]:
    """(architecture, header values of :data:`_META_KEYS`, tensors) of a GGUF file (its header only)."""
    reader = _header_reader(path)

    def value(key):
        field = reader.get_field(key)
        if field is None:
            return None
        return field.contents()

    arch = value("general.architecture")
    if not arch:
        raise HRMError(f"{path}: GGUF header has no general.architecture")
    meta = {f"{arch}.{k}": value(f"{arch}.{k}") for k in _META_KEYS}
    for key in ("general.name", f"{arch}.feed_forward_length", f"{arch}.expert_feed_forward_length",
                f"{arch}.context_length", f"{arch}.attention.q_lora_rank", f"{arch}.attention.sliding_window",
                f"{arch}.attention.key_length_mla", f"{arch}.attention.value_length_mla"):
        meta[key] = value(key)
    return arch, {k: v for k, v in meta.items() if v is not None}, list(reader.header_tensors)


def tensor_table(path: str | Path) -> dict:
    """A GGUF's header facts and tensor list as JSON-ready data (commit it beside runs)."""
    arch, meta, tensors = read_gguf(path)
    return {"format": TABLE_FORMAT, "source": Path(path).name, "architecture": arch, "metadata": meta,
            "tensors": [[t.name, t.ggml_type, list(t.shape)] for t in tensors]}


def read_inventory(path: str | Path) -> TensorInventory:
    """A ``.gguf`` file, or a tensor table (``.json``) written by :func:`tensor_table`."""
    p = Path(path)
    if p.suffix == ".gguf":
        arch, meta, tensors = read_gguf(p)
        return _inventory(p.name, arch, meta, tensors)
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise HRMError(f"{path}: not a readable tensor table ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != TABLE_FORMAT:
        raise HRMError(f"{path}: format: not {TABLE_FORMAT}")
    try:
        tensors = [GgufTensor(str(n), str(t), tuple(int(d) for d in s)) for n, t, s in data["tensors"]]
        return _inventory(str(data["source"]), str(data["architecture"]), dict(data["metadata"]), tensors)
    except (KeyError, TypeError, ValueError) as exc:
        raise HRMError(f"{path}: tensors: malformed ({exc})") from None


# --- a GGUF as the model being planned (``--model FILE.gguf``) --------------------------------


def _first(meta: dict, key: str, path) -> int:
    """An integer header value (the first of a per-layer list: llama.cpp writes some per layer)."""
    value = meta.get(key)
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    if value is None:
        raise HRMError(f"{path}: GGUF header has no {key}")
    return int(value)


def _format_of(tensors: list[GgufTensor]) -> str | None:
    """The weight format of ``tensors``: one ggml type's name, a mix: of several, None if empty."""
    from .quantized import mix_format_name

    by_type: dict[str, int] = {}
    for t in tensors:
        by_type[t.ggml_type] = by_type.get(t.ggml_type, 0) + t.elements
    if not by_type:
        return None
    if len(by_type) == 1:
        return next(iter(by_type)).lower()
    return mix_format_name(by_type)


def _dtypes(expert_format: str | None, static_format: str | None) -> dict:
    """ModelSpec dtype fields for the experts' and the other weights' ggml formats."""
    from .quantized import quantized_dtype

    floats = {"f16": "fp16", "bf16": "fp16", "f32": "fp32"}
    out: dict = {"activation_dtype": "fp16"}
    if expert_format in floats:
        out["weight_dtype"] = floats[expert_format]
    else:
        out["weight_dtype"] = quantized_dtype(expert_format)
        out["weight_format"] = expert_format
    if static_format is not None and static_format != expert_format:
        out["static_weight_format"] = floats.get(static_format, static_format)
    return out


def model_fields_from_gguf(path: str | Path) -> dict:
    """ModelSpec fields of a GGUF: sizes from its header (llama.cpp's ``{arch}.*`` keys) and
    tensor shapes, the experts' and the other weights' ggml types from its tensor table (a
    per-tensor mix, such as Unsloth's UD files, becomes a ``mix:`` format, exact by weight count)."""
    arch, meta, tensors = read_gguf(path)
    inv = _inventory(Path(path).name, arch, meta, tensors)
    hidden = _first(meta, f"{arch}.embedding_length", path)
    layers = _first(meta, f"{arch}.block_count", path)
    heads = _first(meta, f"{arch}.attention.head_count", path)
    embd = next((t for t in tensors if t.name == "token_embd.weight"), None)
    if embd is None or len(embd.shape) != 2:
        raise HRMError(f"{path}: GGUF has no 2-D token_embd.weight (the vocabulary size)")
    experts = [t for t in tensors if t.is_expert]
    mats = [t for t in tensors if len([d for d in t.shape if d > 1]) >= 2 and not t.is_expert]
    out = {"name": str(meta.get("general.name") or Path(path).stem), "hidden_size": hidden, "num_layers": layers,
           "num_heads": heads, "vocab_size": int(embd.shape[1]),
           "tie_embeddings": not any(t.name == "output.weight" for t in tensors)}
    if inv.attention.kv_heads == 1 and meta.get(f"{arch}.attention.kv_lora_rank"):
        # llama.cpp writes the per-head widths as key/value_length_mla since it stores the absorbed
        # form (key_length = kv_lora_rank + rope); older files have them as key/value_length
        mla = f"{arch}.attention.key_length_mla" in meta
        suffix = "_mla" if mla else ""
        rope = _first(meta, f"{arch}.rope.dimension_count", path)
        key = _first(meta, f"{arch}.attention.key_length{suffix}", path)
        out |= {"num_kv_heads": heads, "head_dim": key, "kv_lora_rank": int(meta[f"{arch}.attention.kv_lora_rank"]),
                "qk_rope_head_dim": rope, "qk_nope_head_dim": key - rope,
                "v_head_dim": _first(meta, f"{arch}.attention.value_length{suffix}", path)}
        if meta.get(f"{arch}.attention.q_lora_rank"):
            out["q_lora_rank"] = int(meta[f"{arch}.attention.q_lora_rank"])
    else:
        out |= {"num_kv_heads": inv.attention.kv_heads, "head_dim": inv.attention.k_width}
    if experts:
        up = next((t for t in experts if "ffn_up_exps" in t.name or "ffn_gate_exps" in t.name), experts[0])
        out |= {"num_experts": inv.num_experts, "top_k": inv.top_k, "expert_intermediate_size": int(up.shape[1])}
        shared = next((t for t in tensors if "ffn_up_shexp" in t.name), None)
        if shared is not None:
            out["shared_intermediate_size"] = int(shared.shape[1])
        dense = int(meta.get(f"{arch}.leading_dense_block_count") or 0)
        if dense:
            out |= {"first_dense_layers": dense,
                    "dense_intermediate_size": _first(meta, f"{arch}.feed_forward_length", path)}
    else:
        out |= {"expert_intermediate_size": _first(meta, f"{arch}.feed_forward_length", path)}
    window = meta.get(f"{arch}.attention.sliding_window")
    if window and arch == "gpt-oss":  # llama.cpp's gpt-oss: every other layer windowed (src/llama-model.cpp)
        out |= {"sliding_window": int(window), "sliding_window_layers": layers // 2, "attention_sinks": True}
    if meta.get(f"{arch}.context_length"):
        out["max_context_len"] = int(meta[f"{arch}.context_length"])
    expert_format = _format_of(experts) if experts else _format_of([t for t in mats if ".ffn_" in t.name])
    return out | _dtypes(expert_format or _format_of(mats), _format_of(mats))
