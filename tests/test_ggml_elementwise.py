"""The elementwise nodes of llama.cpp's CPU layer graphs (hrm.cost.ggml_elementwise), counted by
hand from the ground-truth models' GGUF tensor tables, and priced by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from hrm.cost.ggml_cpu import run_times
from hrm.cost.ggml_elementwise import ELEMENTWISE_KINDS, elementwise_s, layer_elementwise
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


def test_this_hosts_prefill_share_is_what_perf_saw():
    """perf record of llama-batched-bench on this host (docs/validation/ground_truth.md §1.6): the
    elementwise ops' own samples were 6.4-7% of a 512-token Q4_K_M prefill of gt-qwen3moe and
    4.9% of gt-deepseekv2 f16's; the probe's rates give shares within a third of those."""
    section = load_hardware(str(HOST)).ggml_cpu
    for name, fmt, perf_share in (("qwen3moe", "q4_k_m", 0.067), ("deepseekv2", "f16", 0.049)):
        inv = read_inventory(GGUF / f"gt-{name}-{fmt}.tensors.json")
        step = run_times(inv, section, 2, 16, 32, 0).steps[0]
        share = step.elementwise_s / step.total_s
        assert perf_share / 1.5 < share < perf_share * 1.5, (name, share)
