"""The elementwise nodes of llama.cpp's CPU layer graphs (hrm.cost.ggml_elementwise), counted by
hand from the ground-truth models' GGUF tensor tables, and priced by hand."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hrm.cost.ggml_cpu import run_times
from hrm.cost.ggml_elementwise import ELEMENTWISE_KINDS, elementwise_by_kind_s, elementwise_s, layer_elementwise
from hrm.machine.hardware import CurvePoint, GgmlCpu, GgmlKernel, load_hardware
from hrm.model.gguf import read_inventory

GGUF = Path(__file__).resolve().parents[1] / "docs/validation/runs/gguf"
HOST = Path(__file__).resolve().parents[1] / "docs/validation/runs/this-host-llamacpp.yaml"


def _inventory(name: str):
    return read_inventory(GGUF / f"gt-{name}-q4_k_m.tensors.json")


def test_a_mixtral_layer_by_hand():
    # gt-mixtral: n_embd 1024, 16 query heads on 4 KV heads of 64, 8 experts top-2 of width 2048
    parts = layer_elementwise(_inventory("mixtral"), 3)
    assert dict(parts.attention) == {"norm": 1024, "rope": (16 + 4) * 64, "kv16": 4 * (64 + 64), "add": 1024}
    assert parts.ffn == (("norm", 1024), ("softmax", 8), ("glu", 2 * 2048), ("mulw", 2 * 1024),
                         ("add", 1024), ("add", 1024))  # one ADD sums the 2 experts, then the residual


def test_qwen3_norms_its_queries_and_keys_per_head():
    att = layer_elementwise(_inventory("qwen3moe"), 0).attention
    assert [n for k, n in att if k == "norm"] == [1024, 16 * 64, 4 * 64]
    ffn = layer_elementwise(_inventory("qwen3moe"), 0).ffn
    assert [k for k, _ in ffn].count("add") == 4  # 3 sum the 4 experts, 1 residual


def test_deepseek2_mla_concats_and_stores_the_latent_once():
    inv = _inventory("deepseekv2")  # kv_lora 256 + rope 32, 16 heads, 2 shared experts of 512
    att = dict(layer_elementwise(inv, 1).attention)
    assert att["concat"] == 17 * 288 and att["rope"] == 17 * 32 and att["kv16"] == 288
    assert [n for k, n in layer_elementwise(inv, 1).attention if k == "norm"] == [1024, 384, 256]
    dense = layer_elementwise(inv, 0).ffn  # leading dense block: one FFN of 2048, no router
    assert dense == (("norm", 1024), ("glu", 2048), ("add", 1024))
    moe = layer_elementwise(inv, 1).ffn
    assert ("glu", 1024) in moe and ("mulw", 4 * 1024) in moe


def _flat(rate_s: float, node_s: float = 1e-20, threads: int = 2) -> GgmlCpu:
    kernels = tuple(GgmlKernel(type="f32", op=k, threads=threads,
                               s_per_elem_vs_rows=[CurvePoint(x=1, y=rate_s), CurvePoint(x=512, y=rate_s)])
                    for k in ELEMENTWISE_KINDS)
    return GgmlCpu(llama_cpp="t", pool_mib=1024, node_s_vs_threads=[CurvePoint(x=threads, y=node_s)], kernels=kernels)


def test_a_step_costs_its_elements_and_the_last_layers_ffn_on_the_output_rows():
    inv = _inventory("mixtral")
    att = sum(n for _, n in layer_elementwise(inv, 0).attention)
    ffn = sum(n for _, n in layer_elementwise(inv, 0).ffn)
    assert (att, ffn) == (1024 + 1280 + 512 + 1024, 1024 + 8 + 4096 + 2048 + 2048)
    # 8 layers, 100 tokens, 4 with logits: 8 x att x 100 + 7 x ffn x 100 + ffn x 4 elements at 1 ns
    expected = (8 * att * 100 + 7 * ffn * 100 + ffn * 4) * 1e-9
    assert elementwise_s(inv, _flat(1e-9), 2, 100, 4) == pytest.approx(expected, rel=1e-9)


def test_a_nodes_own_cost_is_not_charged_twice():
    inv = _inventory("mixtral")
    nodes = 8 * (4 + 6)  # 4 attention and 6 FFN nodes a layer
    with_node = elementwise_s(inv, _flat(1e-9, node_s=1e-7), 2, 100, 100)
    assert with_node == pytest.approx(elementwise_s(inv, _flat(1e-9), 2, 100, 100) - nodes * 1e-7, rel=1e-9)
    # a node cheaper than its fixed cost costs nothing more
    assert elementwise_s(inv, _flat(1e-12, node_s=1e-3), 2, 1, 1) == 0.0


def test_a_profile_measured_before_the_probe_had_them_charges_none():
    inv = _inventory("mixtral")
    section = load_hardware(str(HOST)).ggml_cpu
    old = section.model_copy(update={"kernels": tuple(k for k in section.kernels if k.op not in ELEMENTWISE_KINDS)})
    assert elementwise_s(inv, old, 2, 512, 16) == 0.0
    assert elementwise_s(inv, section, 2, 512, 16) > 0.0


#: perf's symbols of the elementwise kinds (ggml-cpu at ggml-org/llama.cpp@0c1e5709). Not counted:
#: ggml_cpu_fp32_to_fp16, which converts the f16 matmuls' activations too (inside the matmul
#: probe's time), and the load's repack_* (before the timed steps)
PERF_SYMBOLS = {"ggml_compute_forward_mul": "mulw", "ggml_compute_forward_concat": "concat",
                "ggml_compute_forward_rms_norm_mul_fused": "norm", "ggml_vec_swiglu_f32": "glu",
                "ggml_compute_forward_add_non_quantized": "add", "ggml_compute_forward_rope_flt<float>": "rope",
                "ggml_compute_forward_soft_max_f32": "softmax"}
PERF = Path(__file__).resolve().parents[1] / "docs/validation/runs/perf"


def perf_share(path: Path) -> float:
    """The elementwise symbols' share of a committed perf report's samples, the load's excluded."""
    shares, load = 0.0, 0.0
    for line in path.read_text().splitlines():
        m = re.match(r"([\d.]+)% \d+ \[\.\] (.*?) - -$", line.strip())
        if m and m.group(2).startswith("repack_"):
            load += float(m.group(1))
        elif m and m.group(2) in PERF_SYMBOLS:
            shares += float(m.group(1))
    return shares / (100.0 - load)


@pytest.mark.parametrize("name,fmt,sequences", [("qwen3moe", "q4_k_m", 16), ("deepseekv2", "f16", 16),
                                                ("deepseekv2", "q4_k_m", 4)])
def test_this_hosts_prefill_share_is_what_perf_saw(name, fmt, sequences):
    """perf record of llama-batched-bench -npp 32 -ntg 1 on this host, committed under
    docs/validation/runs/perf/ (docs/validation/ground_truth.md §1.6): the model's share of the
    same kinds in that prefill is within 1.5x of the share of perf's samples."""
    section = load_hardware(str(HOST)).ggml_cpu
    inv = read_inventory(GGUF / f"gt-{name}-{fmt}.tensors.json")
    step = run_times(inv, section, 2, sequences, 32, 0).steps[0]
    kinds = elementwise_by_kind_s(inv, section, 2, step.tokens, sequences)
    share = sum(v for k, v in kinds.items() if k != "kv16") / step.total_s
    measured = perf_share(PERF / f"gt-{name}-{fmt}.txt")
    assert 0.02 < measured < 0.1
    assert measured / 1.5 < share < measured * 1.5, (share, measured)
