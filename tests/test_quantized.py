"""Quantized weights (docs/model.md §4.8): bits per weight of GGUF types from ggml's block
structs, the bytes of a quantized expert with its scales, the dequantizing kernel's roofline
(hrm.quantized) by hand, and its wiring into gpu_time_s, the estimate and the search."""

from __future__ import annotations

import numpy as np
import pytest

from hrm import costs, latency, quantized
from hrm.engine import IDEAL, load_engine, with_fields
from hrm.errors import HRMError
from hrm.estimate import estimate
from hrm.hardware import load_hardware
from hrm.model import load_model
from hrm.policy import parse_policy
from hrm.rates import rates_from_profile
from hrm.workload import make_workload
from solver.search import search

MARLIN = with_fields(IDEAL, {"quant_kernel": "marlin"})


def int4_mixtral(weight_format: str | None = "int4-g128"):
    return load_model("mixtral", "int4").with_weight_format(weight_format)


# --- bits per weight ------------------------------------------------------------------------

@pytest.mark.parametrize("name,bits", [
    ("q4_0", 8 * 18 / 32),            # block_q4_0: ggml_half d + 16 bytes of nibbles per 32 weights
    ("q8_0", 8 * 34 / 32),            # block_q8_0: ggml_half d + 32 int8 per 32 weights = 8.5
    ("q4_k", 8 * 144 / 256),          # block_q4_K: d, dmin, 12 scale bytes, 128 quant bytes = 4.5
    ("q5_k", 8 * 176 / 256),          # block_q5_K: + 32 bytes of high bits = 5.5
    ("q6_k", 8 * 210 / 256),          # block_q6_K: 128 + 64 + 16 + 2 bytes = 6.5625
    # Q4_K_M on a SwiGLU expert: gate, up Q4_K; down Q6_K on half the layers, Q4_K on the rest
    ("q4_k_m", (4.5 + 4.5 + 0.5 * 6.5625 + 0.5 * 4.5) / 3),
    ("int4-g128", 4 + 16 / 128),      # Marlin README: 0.125 bits of fp16 group scales
])
def test_bits_per_weight_from_the_block_structs(name, bits):
    assert quantized.bits_per_weight(name) == pytest.approx(bits, rel=1e-12)


def test_q4_k_m_is_about_4_85_bits():
    assert quantized.bits_per_weight("q4_k_m") == pytest.approx(4.84375)


def test_expert_bytes_count_the_scales_and_float_models_are_unchanged():
    plain = load_model("mixtral", "int4")
    g128 = int4_mixtral()
    params = 3 * 4096 * 14336
    assert costs.expert_bytes(plain) == params * 0.5  # no format: the packed payload, as before
    assert costs.expert_bytes(g128) == params * 4.125 / 8
    fp16 = load_model("mixtral")
    assert fp16.weight_format is None and costs.expert_bytes(fp16) == params * 2
    assert fp16.sha256() == load_model("mixtral").sha256()  # no format: the hash does not move
    assert plain.sha256() != g128.sha256()


def test_bad_formats_are_one_line_refusals():
    with pytest.raises(HRMError, match="weight_format: unknown 'q9_z'"):
        load_model("mixtral", "int4").with_weight_format("q9_z")
    with pytest.raises(HRMError, match="needs quantized weights"):
        load_model("mixtral").with_weight_format("q4_k_m")
    with pytest.raises(ValueError, match="quant_kernel: unknown 'nope'"):
        with_fields(IDEAL, {"quant_kernel": "nope"})


def test_the_weight_format_flag():
    from argparse import Namespace

    from hrm_cli.common import machine_from_args

    args = Namespace(hw="a100-80g", model="mixtral", weight_dtype="int4", kv_dtype=None, weight_format="q4_k_m",
                     routing=None)
    _, model = machine_from_args(args)
    assert model.weight_format == "q4_k_m"
    assert costs.expert_bytes(model) == 3 * 4096 * 14336 * 4.84375 / 8
    with pytest.raises(HRMError, match="^--weight-format: .*needs quantized weights"):
        machine_from_args(Namespace(**{**vars(args), "weight_dtype": None}))


def test_another_dtype_drops_the_format():
    assert int4_mixtral().with_dtypes("fp16").weight_format is None


# --- the kernel's roofline by hand --------------------------------------------------------------

#: A100 80GB datasheet (hardware_profiles/a100-80g.yaml): 312 TFLOP/s fp16, 2039 GB/s
A100_FLOPS, A100_BYTES_S = 312e12, 2039e9
#: Marlin on Ampere: 3.12x at M=1 against an ideal 3.87x; 0.60x at M=2048 (vLLM PR #2497)
MARLIN_B, MARLIN_C = 3.12 / 3.87, 0.60
#: one Mixtral expert (h 4096, h2 14336) in int4-g128: 176,160,768 weights x 4.125 bits
EXPERT_WEIGHT_BYTES = 176_160_768 * 4.125 / 8  # 90,832,896
EXPERT_ACT_BYTES_PER_TOKEN = (2 * 4096 + 3 * 14336) * 2  # 102,400
EXPERT_FLOPS_PER_TOKEN = 2 * 176_160_768  # 352,321,536


@pytest.mark.parametrize("tokens,expected_s,fp16_roofline_s", [
    # M=1: memory-bound. 90,935,296 B / (2039e9 B/s x 0.80620) = 55.32 us (today: 44.60 us)
    (1, 55.318e-6, 44.598e-6),
    # M=512: compute-bound. 1.8039e11 FLOP / (312e12 x 0.60) = 963.6 us (today: 578.2 us)
    (512, 963.61e-6, 578.17e-6),
])
def test_one_int4_expert_on_a100_by_hand(tokens, expected_s, fp16_roofline_s):
    rates = rates_from_profile(load_hardware("a100-80g"))
    op = costs.single_expert(int4_mixtral(), tokens)
    assert op.quantized
    assert float(op.weight_bytes) == EXPERT_WEIGHT_BYTES == 90_832_896
    total_bytes = EXPERT_WEIGHT_BYTES + tokens * EXPERT_ACT_BYTES_PER_TOKEN
    flops = tokens * EXPERT_FLOPS_PER_TOKEN
    by_hand = max(flops / (A100_FLOPS * MARLIN_C), total_bytes / (A100_BYTES_S * MARLIN_B))
    assert by_hand == pytest.approx(expected_s, rel=1e-4)
    got = float(latency.gpu_time_s(op, rates, tokens, MARLIN, kernel=True))
    assert got == pytest.approx(by_hand, rel=1e-12)
    # without a kernel family: today's fp16 roofline on the quantized bytes
    today = float(latency.gpu_time_s(op, rates, tokens, IDEAL, kernel=True))
    assert today == pytest.approx(max(flops / A100_FLOPS, total_bytes / A100_BYTES_S), rel=1e-12)
    assert today == pytest.approx(fp16_roofline_s, rel=1e-4)


def test_hopper_takes_its_own_bandwidth_fraction():
    rates = rates_from_profile(load_hardware("h100"))
    op = costs.single_expert(int4_mixtral(), 1)
    got = float(latency.gpu_time_s(op, rates, 1, MARLIN, kernel=True))
    expected = float(op.bytes) / (rates.gpu_bandwidth_bytes_s * (4.98 / 2.30) / 4.0)  # humming PR #2
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("hw", ["l4", "a100-80g", "h100", "t4"])
def test_never_faster_than_its_roofs(hw):
    """Quantized time >= its memory roof (its own bytes at the fp16 memory rate), and >= the
    fp16 compute roof; at large M it is slower than the fp16 roofline on the same bytes."""
    rates = rates_from_profile(load_hardware(hw))
    model = int4_mixtral()
    tokens = np.array([1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0])
    for engine in (MARLIN, with_fields(load_engine("vllm"), {"quant_kernel": "gguf-dequant-blas"}), load_engine("vllm")):
        op = costs.single_expert(model, tokens)
        flops, bandwidth = latency.gpu_rate_factors(rates, engine)
        t = np.asarray(latency.gpu_time_s(op, rates, tokens, engine, kernel=True))
        assert np.all(t >= op.bytes / (rates.gpu_bandwidth_bytes_s * bandwidth) * (1 - 1e-12))
        assert np.all(t >= op.flops / (rates.gpu_flops(tokens) * flops) * (1 - 1e-12))
        today = np.asarray(latency.gpu_time_s(op, rates, tokens, with_fields(engine, {"quant_kernel": None}),
                                              kernel=False))
        assert np.all(t >= today * (1 - 1e-12))


def test_float_models_and_the_cpu_only_host_are_unchanged():
    """The fp16 path does not see the kernel family; nor does the emulated tier."""
    rates = rates_from_profile(load_hardware("a100-80g"))
    op = costs.single_expert(load_model("mixtral"), 64)
    assert not op.quantized
    assert float(latency.gpu_time_s(op, rates, 64, MARLIN, kernel=True)) == float(
        latency.gpu_time_s(op, rates, 64, IDEAL, kernel=True))
    cpu = rates_from_profile(load_hardware("cpu-only"))
    op = costs.single_expert(load_model("tiny-mixtral", "int4"), 4)
    assert float(latency.gpu_time_s(op, cpu, 4, MARLIN, kernel=True)) == float(
        latency.gpu_time_s(op, cpu, 4, IDEAL, kernel=True))


def test_the_quant_kernel_replaces_the_moe_kernel_factor():
    """vLLM's untuned Triton factor is for fp16 MoE: a quantized expert pays Marlin's
    fractions instead, not both."""
    rates = rates_from_profile(load_hardware("a100-80g"))
    op = costs.single_expert(int4_mixtral(), 32)
    vllm = load_engine("vllm")
    as_marlin = float(latency.gpu_time_s(op, rates, 32, vllm, kernel=True))
    flops, bandwidth = latency.gpu_rate_factors(rates, vllm)
    expected = max(float(op.flops) / (rates.gpu_flops(32) * flops * MARLIN_C),
                   float(op.bytes) / (rates.gpu_bandwidth_bytes_s * bandwidth * MARLIN_B))
    assert as_marlin == pytest.approx(expected, rel=1e-12)


# --- the estimate and the search ------------------------------------------------------------------

def test_estimate_and_search_move_the_expected_way():
    """An int4 Mixtral on an A100 under vLLM: with the Marlin family the prediction is slower
    than the fp16 roofline on the same bytes (never faster), and the search's optimum too."""
    hw, model, wl = load_hardware("a100-80g"), int4_mixtral(), make_workload("mtbench", gen_len=16)
    vllm = load_engine("vllm")
    bytes_only = with_fields(vllm, {"quant_kernel": None})
    policy = parse_policy("N=64,mu=64,attn=gpu,rw=1,rc=1")
    slow = estimate(hw, model, wl, policy, engine=vllm)
    fast = estimate(hw, model, wl, policy, engine=bytes_only)
    assert slow.generation_throughput_tok_s < fast.generation_throughput_tok_s
    best = search(hw, model, wl, engine=vllm, top=0)
    upper = search(hw, model, wl, engine=bytes_only, top=0)
    assert best.best.estimate.generation_throughput_tok_s < upper.best.estimate.generation_throughput_tok_s
    # the plan records the format: its model resolves to the same spec
    from hrm.plan import resolve_plan_model

    assert resolve_plan_model(best.plan) == model
    # fp16 Mixtral: the family changes nothing
    fp16 = load_model("mixtral")
    assert estimate(hw, fp16, wl, policy, engine=vllm).generation_throughput_tok_s == \
        estimate(hw, fp16, wl, policy, engine=with_fields(vllm, {"quant_kernel": None})).generation_throughput_tok_s
