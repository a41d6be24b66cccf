"""GGUF as it is (issue 34 item 2): every ggml type's bits per weight from its block struct, a
header reader tested on GGUF files written here with gguf-py's GGUFWriter (tiny tensors of raw
bytes, one per type), and ``--model FILE.gguf`` read from the header alone."""

from __future__ import annotations

import numpy as np
import pytest

from hrm.cost import costs
from hrm.errors import HRMError
from hrm.model.quantized import GGML_BLOCK_SOURCES, GGML_BLOCKS, GGML_TYPE_IDS, WEIGHT_FORMATS, bits_per_weight

gguf = pytest.importorskip("gguf")

from hrm.model.gguf import read_gguf, read_inventory  # noqa: E402
from hrm.model.spec import load_model  # noqa: E402

#: bits per weight by hand from the block structs of ggml-common.h (llama.cpp@0c1e5709)
HAND_BITS = {
    "Q4_0": (2 + 16) * 8 / 32, "Q8_0": (2 + 32) * 8 / 32, "MXFP4": (1 + 16) * 8 / 32,  # 4.25
    "Q2_K": (4 + 16 + 64) * 8 / 256, "Q3_K": (2 + 64 + 32 + 12) * 8 / 256, "Q4_K": 4.5, "Q6_K": 6.5625,
    "IQ1_S": (2 + 32 + 16) * 8 / 256,  # 1.5625
    "IQ1_M": (32 + 16 + 8) * 8 / 256, "IQ2_XXS": (2 + 64) * 8 / 256, "IQ3_S": (2 + 104 + 4) * 8 / 256,
    "TQ1_0": (2 + 4 + 48) * 8 / 256, "TQ2_0": (2 + 64) * 8 / 256, "IQ4_XS": (2 + 2 + 4 + 128) * 8 / 256,
    "Q1_0": (2 + 16) * 8 / 128, "NVFP4": (4 + 32) * 8 / 64,
}


def test_every_ggml_type_has_a_block_and_a_source():
    assert set(GGML_TYPE_IDS.values()) == set(GGML_BLOCKS) == set(GGML_BLOCK_SOURCES)
    for name, bits in HAND_BITS.items():
        assert bits_per_weight(name.lower()) == bits, name
    # --weight-format names every quantized type
    quantized = {n.lower() for n in GGML_BLOCKS if GGML_BLOCKS[n][1] > 1}
    assert quantized <= set(WEIGHT_FORMATS)


def test_block_sizes_agree_with_gguf_py():
    """gguf-py's own table (constants.GGML_QUANT_SIZES) is a second copy of the structs: they agree
    on every type it knows but Q8_1, whose struct holds two fp16 (36 bytes at 0c1e5709) where
    gguf-py 0.19 still lists 40 (and Q8_1 is never stored in a file)."""
    for qtype, (block, size) in gguf.GGML_QUANT_SIZES.items():
        if qtype.name == "Q8_1":
            continue
        assert GGML_BLOCKS[qtype.name] == (size, block), qtype.name
        assert GGML_TYPE_IDS[int(qtype.value)] == qtype.name


def _write(path, tensors, arch="qwen3moe", meta=None):
    """A GGUF with ``tensors`` (name, ggml type name, (..., rows, weights per row)) of zero bytes."""
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in (meta or {}).items():
        if isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            writer.add_string(key, value)
    for name, kind, dims in tensors:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
        raw = np.zeros((*dims[:-1], dims[-1] // block * size), dtype=np.uint8)
        writer.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_header_reader_reads_every_type(tmp_path):
    """One 2 x 256 tensor of every type gguf-py can write: the reader returns each one's type and
    shape (ggml order: a row's length first), and the inventory's bytes are the block structs'."""
    kinds = [q.name for q in gguf.GGMLQuantizationType]
    path = tmp_path / "every.gguf"
    _write(path, [(f"t.{k}", k, (2, 256)) for k in kinds],
           meta={"qwen3moe.block_count": 1, "qwen3moe.attention.head_count": 4})
    arch, meta, tensors = read_gguf(path)
    assert arch == "qwen3moe" and meta["qwen3moe.block_count"] == 1
    assert [(t.name, t.ggml_type, t.shape) for t in tensors] == [(f"t.{k}", k, (256, 2)) for k in kinds]
    inventory = read_inventory(path)
    want = sum(512 * GGML_BLOCKS[k][0] / GGML_BLOCKS[k][1] for k in kinds)
    assert inventory.weight_bytes == pytest.approx(want)


def test_a_type_gguf_py_does_not_know_is_read_by_its_id(tmp_path):
    """ggml's Q2_0 (type 42) is newer than gguf-py 0.19: the header reader maps ids itself."""
    path = tmp_path / "q1.gguf"
    _write(path, [("t", "Q1_0", (1, 128))])
    data = bytearray(path.read_bytes())
    # the tensor info: name (u64 length, bytes), n_dims (u32), two dims (u64), then the type id (u32)
    at = data.index((1).to_bytes(8, "little") + b"t") + 8 + 1 + 4 + 2 * 8
    assert int.from_bytes(data[at:at + 4], "little") == 41
    data[at:at + 4] = (42).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    (tensor,) = read_gguf(path)[2]
    assert tensor.ggml_type == "Q2_0"
    data[at:at + 4] = (99).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(HRMError, match="unknown ggml type id 99"):
        read_gguf(path)


QWEN3MOE = {"qwen3moe.block_count": 2, "qwen3moe.embedding_length": 256, "qwen3moe.attention.head_count": 4,
            "qwen3moe.attention.head_count_kv": 2, "qwen3moe.attention.key_length": 64,
            "qwen3moe.attention.value_length": 64, "qwen3moe.expert_count": 8, "qwen3moe.expert_used_count": 2,
            "qwen3moe.expert_feed_forward_length": 256, "qwen3moe.context_length": 4096,
            "general.name": "tiny-qwen3moe"}


def _tiny_moe(path, down="Q6_K"):
    """A 2-layer qwen3moe with Unsloth-UD-like types: experts Q4_K but ffn_down_exps in ``down``."""
    tensors = [("token_embd.weight", "Q4_K", (512, 256)), ("output.weight", "Q6_K", (512, 256))]
    for i in range(2):  # hidden 256, 4 heads of 64 (2 KV heads), 8 experts of width 256
        tensors += [(f"blk.{i}.attn_q.weight", "Q8_0", (256, 256)), (f"blk.{i}.attn_k.weight", "Q8_0", (128, 256)),
                    (f"blk.{i}.attn_v.weight", "Q8_0", (128, 256)), (f"blk.{i}.attn_output.weight", "Q8_0", (256, 256)),
                    (f"blk.{i}.ffn_gate_inp.weight", "F32", (8, 256)),
                    (f"blk.{i}.ffn_gate_exps.weight", "Q4_K", (8, 256, 256)),
                    (f"blk.{i}.ffn_up_exps.weight", "Q4_K", (8, 256, 256)),
                    (f"blk.{i}.ffn_down_exps.weight", down, (8, 256, 256))]
    _write(path, tensors, meta=QWEN3MOE)


def test_model_from_a_gguf_header(tmp_path, capsys):
    path = tmp_path / "tiny-UD-Q2_K_XL.gguf"
    _tiny_moe(path)
    spec = load_model(str(path))
    assert (spec.name, spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim) == \
        ("tiny-qwen3moe", 256, 2, 4, 2, 64)
    assert (spec.num_experts, spec.top_k, spec.expert_intermediate_size, spec.vocab_size) == (8, 2, 256, 512)
    assert spec.max_context_len == 4096 and not spec.tie_embeddings
    assert spec.weight_dtype == "int4" and spec.weight_format.startswith("mix:")
    # the experts' bytes per the file's own types, by hand: gate and up Q4_K (4.5 bits), down Q6_K
    assert bits_per_weight(spec.weight_format) == pytest.approx((2 * 4.5 + 6.5625) / 3)
    assert costs.total_expert_bytes(spec) == pytest.approx(2 * 8 * 256 * 256 * (2 * 4.5 + 6.5625) / 8)
    assert capsys.readouterr().err == ""


def test_a_partial_gguf_is_enough(tmp_path):
    """The header alone (a download cut short) gives the same model: no tensor data is read."""
    path = tmp_path / "whole.gguf"
    _tiny_moe(path)
    whole = load_model(str(path))
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 50])
    assert load_model(str(cut)) == whole


@pytest.mark.parametrize("content", [b"", b"GGUF", b"not a gguf at all" * 10])
def test_bad_gguf_is_one_line(tmp_path, content):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(HRMError) as err:
        load_model(str(path))
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_missing_gguf_is_one_line(tmp_path):
    with pytest.raises(HRMError, match="no such file"):
        load_model(str(tmp_path / "absent.gguf"))


def test_gguf_static_weights_keep_their_own_types(tmp_path):
    path = tmp_path / "m.gguf"
    _tiny_moe(path, down="Q4_K")
    spec = load_model(str(path))
    assert spec.weight_format == "q4_k"  # every expert tensor in one type: its plain name
    assert spec.static_weight_format.startswith("mix:")
    static = 512 * 256 * 4.5 + 512 * 256 * 6.5625 + 2 * ((256 + 128 + 128 + 256) * 256 * 8.5 + 8 * 256 * 32)
    params = 512 * 256 * 2 + 2 * ((256 + 128 + 128 + 256) * 256 + 8 * 256)
    assert costs.static_bytes_per_param(spec) * 8 == pytest.approx(static / params)
