"""A GGUF file's weights as llama.cpp will run them: every tensor's name, ggml type and shape,
and the attention and routing facts of its header (the GGUF format: ggml-org/ggml
docs/gguf.md). Read with the ``gguf`` package (gguf-py, llama.cpp's own reader), which maps the
file and reads only its header; or from a tensor table, the same facts as JSON
(:func:`tensor_table`: what hrm commits for a GGUF too large to ship).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import HRMError

#: a table's format marker
TABLE_FORMAT = "hrm-gguf-tensors/1"
def bits_per_element(ggml_type: str) -> float:
    """Bits per weight of a tensor's ggml type (hrm.quantized.GGML_BLOCKS, the block structs)."""
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


@dataclass(frozen=True)
class AttentionShape:
    """What a layer's attention reads per cached token: ``kv_heads`` heads of ``k_width`` +
    ``v_width`` elements, ``heads_per_kv`` query heads sharing each; over ``layers`` layers."""

    layers: int
    kv_heads: int
    heads_per_kv: int
    k_width: int
    v_width: int


@dataclass(frozen=True)
class TensorInventory:
    """A model's tensors with the header facts the CPU step model needs."""

    source: str
    architecture: str
    tensors: tuple[GgufTensor, ...]
    attention: AttentionShape
    num_experts: int
    top_k: int

    def matmul_tensors(self) -> list[GgufTensor]:
        """The weights a step multiplies by: every tensor of 2+ dimensions but the token
        embedding (a row lookup), which stands in for the output head when the model ties them
        (llama.cpp uses tok_embd as output when there is no output.weight: src/llama-model.cpp)."""
        mats = [t for t in self.tensors if len([d for d in t.shape if d > 1]) >= 2]
        has_output = any(t.is_output for t in mats)
        out = []
        for t in mats:
            if t.name.startswith("token_embd"):
                if not has_output:
                    out.append(GgufTensor("output.weight", t.ggml_type, t.shape))
                continue
            out.append(t)
        return out

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


def read_gguf(path: str | Path) -> tuple[str, dict, list[GgufTensor]]:
    """(architecture, header values of :data:`_META_KEYS`, tensors) of a GGUF file."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise HRMError(f"{path}: reading a GGUF file needs the gguf package (pip install gguf)") from None
    try:
        reader = GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        raise HRMError(f"{path}: not a readable GGUF file ({exc})") from None

    def value(key):
        field = reader.get_field(key)
        if field is None:
            return None
        return field.contents()

    arch = value("general.architecture")
    if not arch:
        raise HRMError(f"{path}: GGUF header has no general.architecture")
    meta = {f"{arch}.{k}": value(f"{arch}.{k}") for k in _META_KEYS}
    tensors = [GgufTensor(t.name, t.tensor_type.name, tuple(int(d) for d in t.shape)) for t in reader.tensors]
    return arch, {k: v for k, v in meta.items() if v is not None}, tensors


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
