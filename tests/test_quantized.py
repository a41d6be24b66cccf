"""Quantized weights (docs/model.md §4.8): bits per weight of GGUF types from ggml's block
structs, the bytes of a quantized expert with its scales, the dequantizing kernel's roofline
(hrm.model.quantized) by hand, and its wiring into gpu_time_s, the estimate and the search."""

from __future__ import annotations

import numpy as np
import pytest

from hrm.cost import costs
from hrm.cost.latency.ops import cpu_time_s, gpu_rate_factors, gpu_time_s
from hrm.model import quantized
from hrm.engines.engine import IDEAL, load_engine
from hrm.engines.mechanisms import with_fields
from hrm.errors import HRMError
from hrm.estimate import estimate
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.policy import parse_policy
from hrm.machine.rates import rates_from_profile
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
    # alone, the format sets the dtype its bits imply (4.84 bits: int4), the same model as both flags
    _, alone = machine_from_args(Namespace(**{**vars(args), "weight_dtype": None}))
    assert alone == model and alone.weight_dtype == "int4"
    with pytest.raises(HRMError, match="^--weight-format: .*needs quantized weights"):
        machine_from_args(Namespace(**{**vars(args), "weight_dtype": "fp16"}))


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
    check_expert_by_hand("a100-80g", int4_mixtral(), MARLIN, EXPERT_WEIGHT_BYTES, 90_832_896, A100_FLOPS,
                         A100_BYTES_S, MARLIN_C, MARLIN_B, tokens, expected_s, fp16_roofline_s)


def check_expert_by_hand(hw, model, engine, weight_bytes, weight_bytes_by_hand, flops_s, bytes_s, compute_fraction,
                         bandwidth_fraction, tokens, expected_s, fp16_roofline_s):
    """One expert's GEMM on quantized weights: the family's roofline computed by hand, and
    without a family today's fp16 roofline on the same bytes."""
    rates = rates_from_profile(load_hardware(hw))
    op = costs.single_expert(model, tokens)
    assert op.quantized
    assert float(op.weight_bytes) == weight_bytes == weight_bytes_by_hand
    total_bytes = weight_bytes + tokens * EXPERT_ACT_BYTES_PER_TOKEN
    flops = tokens * EXPERT_FLOPS_PER_TOKEN
    by_hand = max(flops / (flops_s * compute_fraction), total_bytes / (bytes_s * bandwidth_fraction))
    assert by_hand == pytest.approx(expected_s, rel=1e-4)
    assert float(gpu_time_s(op, rates, tokens, engine, kernel=True)) == pytest.approx(by_hand, rel=1e-12)
    today = float(gpu_time_s(op, rates, tokens, IDEAL, kernel=True))
    assert today == pytest.approx(max(flops / flops_s, total_bytes / bytes_s), rel=1e-12)
    assert today == pytest.approx(fp16_roofline_s, rel=1e-4)


def test_hopper_takes_its_own_bandwidth_fraction():
    rates = rates_from_profile(load_hardware("h100"))
    op = costs.single_expert(int4_mixtral(), 1)
    got = float(gpu_time_s(op, rates, 1, MARLIN, kernel=True))
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
        flops, bandwidth = gpu_rate_factors(rates, engine)
        t = np.asarray(gpu_time_s(op, rates, tokens, engine, kernel=True))
        assert np.all(t >= op.bytes / (rates.gpu_bandwidth_bytes_s * bandwidth) * (1 - 1e-12))
        assert np.all(t >= op.flops / (rates.gpu_flops(tokens) * flops) * (1 - 1e-12))
        today = np.asarray(gpu_time_s(op, rates, tokens, with_fields(engine, {"quant_kernel": None}),
                                              kernel=False))
        assert np.all(t >= today * (1 - 1e-12))


def test_float_models_and_the_cpu_only_host_are_unchanged():
    """The fp16 path does not see the kernel family; nor does the emulated tier."""
    rates = rates_from_profile(load_hardware("a100-80g"))
    op = costs.single_expert(load_model("mixtral"), 64)
    assert not op.quantized
    assert float(gpu_time_s(op, rates, 64, MARLIN, kernel=True)) == float(
        gpu_time_s(op, rates, 64, IDEAL, kernel=True))
    cpu = rates_from_profile(load_hardware("cpu-only"))
    op = costs.single_expert(load_model("tiny-mixtral", "int4"), 4)
    assert float(gpu_time_s(op, cpu, 4, MARLIN, kernel=True)) == float(
        gpu_time_s(op, cpu, 4, IDEAL, kernel=True))


def test_the_quant_kernel_replaces_the_moe_kernel_factor():
    """vLLM's untuned Triton factor is for fp16 MoE: a quantized expert pays Marlin's
    fractions instead, not both."""
    rates = rates_from_profile(load_hardware("a100-80g"))
    op = costs.single_expert(int4_mixtral(), 32)
    vllm = load_engine("vllm")
    as_marlin = float(gpu_time_s(op, rates, 32, vllm, kernel=True))
    flops, bandwidth = gpu_rate_factors(rates, vllm)
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


# --- llama.cpp: ggml-cuda's quantized matmul (MMVQ/MMQ) and its CPU experts ------------------

GGML = with_fields(IDEAL, {"quant_kernel": "ggml-cuda-mmq"})
#: RTX 3090 datasheet (hardware_profiles/rtx3090.yaml): 71 TFLOP/s fp16, 936 GB/s; its host
#: Xeon Gold 5318Y: 3.2 TFLOP/s fp32, 187.7 GB/s
RTX3090_FLOPS, RTX3090_BYTES_S = 71e12, 936e9
XEON_5318Y_FLOPS, XEON_5318Y_BYTES_S = 3.2e12, 187.7e9
#: ggml-cuda's quantized path at n=512 vs 16-bit BLAS (llama.cpp PR #17437, RDNA4: q3_K 68.80
#: vs bf16 91.95 TFLOP/s): the family's default; its bandwidth fraction 1 (no uncached n=1 row)
GGML_C, GGML_B = 68.80 / 91.95, 1.0
#: one Mixtral expert in Q4_K_M: 176,160,768 weights x 4.84375 bits (gate, up Q4_K; down Q6_K
#: on half the layers)
Q4_K_M_EXPERT_WEIGHT_BYTES = 176_160_768 * 4.84375 / 8  # 106,659,840


def q4_k_m_mixtral():
    return int4_mixtral("q4_k_m")


@pytest.mark.parametrize("tokens,expected_s,fp16_roofline_s", [
    # M=1: memory-bound. 106,762,240 B / (936e9 B/s x 1) = 114.06 us: b = 1, as today
    (1, 114.062e-6, 114.062e-6),
    # M=512: compute-bound. 1.80389e11 FLOP / (71e12 x 0.74823) = 3395.6 us (today: 2540.7 us)
    (512, 3395.58e-6, 2540.68e-6),
])
def test_one_q4_k_m_expert_in_ggml_cuda_on_rtx3090_by_hand(tokens, expected_s, fp16_roofline_s):
    check_expert_by_hand("rtx3090", q4_k_m_mixtral(), GGML, Q4_K_M_EXPERT_WEIGHT_BYTES, 106_659_840, RTX3090_FLOPS,
                         RTX3090_BYTES_S, GGML_C, GGML_B, tokens, expected_s, fp16_roofline_s)


def test_one_q4_k_m_expert_on_the_cpu_by_hand():
    """M=1 on the host CPU (llama.cpp's CPU experts): the family has no CPU measurement, so
    the CPU keeps its roofline on the format's bytes: 106,762,240 B / 187.7e9 B/s = 568.79 us."""
    rates = rates_from_profile(load_hardware("rtx3090"))
    op = costs.single_expert(q4_k_m_mixtral(), 1)
    by_hand = max(EXPERT_FLOPS_PER_TOKEN / XEON_5318Y_FLOPS,
                  (Q4_K_M_EXPERT_WEIGHT_BYTES + EXPERT_ACT_BYTES_PER_TOKEN) / XEON_5318Y_BYTES_S)
    assert by_hand == pytest.approx(568.792e-6, rel=1e-5)
    for engine in (GGML, load_engine("llama.cpp"), IDEAL):
        assert float(cpu_time_s(op, rates, 1, engine)) == pytest.approx(by_hand, rel=1e-12)


def test_a_family_with_cpu_numbers_prices_the_cpu_experts(monkeypatch):
    """The CPU side of a family (cpu_compute_fraction, cpu_bandwidth_fraction) applies to
    quantized ops on the CPU tier as the GPU pair does on the GPU: M=1 at b_cpu = 0.5 doubles
    the memory time (1137.58 us); M=512 at c_cpu = 0.5 doubles the compute time."""
    family = quantized.QuantKernel(bandwidth_fraction={"default": 1.0}, compute_fraction={"default": 1.0},
                                   source="test", cpu_bandwidth_fraction=0.5, cpu_compute_fraction=0.5,
                                   cpu_source="test")
    monkeypatch.setitem(quantized.QUANT_KERNELS, "test-cpu", family)
    engine = with_fields(IDEAL, {"quant_kernel": "test-cpu"})
    rates = rates_from_profile(load_hardware("rtx3090"))
    one = costs.single_expert(q4_k_m_mixtral(), 1)
    assert float(cpu_time_s(one, rates, 1, engine)) == pytest.approx(
        (Q4_K_M_EXPERT_WEIGHT_BYTES + EXPERT_ACT_BYTES_PER_TOKEN) / (XEON_5318Y_BYTES_S * 0.5), rel=1e-12)
    assert float(cpu_time_s(one, rates, 1, engine)) == pytest.approx(1137.58e-6, rel=1e-5)
    many = costs.single_expert(q4_k_m_mixtral(), 512)
    assert float(cpu_time_s(many, rates, 512, engine)) == pytest.approx(
        512 * EXPERT_FLOPS_PER_TOKEN / (XEON_5318Y_FLOPS * 0.5), rel=1e-12)
    # fp16 weights, and the emulated tier of a CPU-only host, do not see it
    fp16 = costs.single_expert(load_model("mixtral"), 1)
    assert float(cpu_time_s(fp16, rates, 1, engine)) == float(cpu_time_s(fp16, rates, 1))
    cpu_only = rates_from_profile(load_hardware("cpu-only"))
    tiny = costs.single_expert(load_model("tiny-mixtral", "int4"), 4)
    assert float(cpu_time_s(tiny, cpu_only, 4, engine)) == float(cpu_time_s(tiny, cpu_only, 4))


def test_cpu_fractions_come_together_and_within_one():
    with pytest.raises(ValueError, match="go together"):
        quantized.QuantKernel(bandwidth_fraction={"default": 1.0}, compute_fraction={"default": 1.0}, source="x",
                              cpu_bandwidth_fraction=0.5)
    with pytest.raises(ValueError, match=r"cpu fractions must lie in \(0, 1\]"):
        quantized.QuantKernel(bandwidth_fraction={"default": 1.0}, compute_fraction={"default": 1.0}, source="x",
                              cpu_bandwidth_fraction=1.5, cpu_compute_fraction=0.5, cpu_source="x")
    assert quantized.quant_kernel("ggml-cuda-mmq").cpu_fractions() is None


@pytest.mark.parametrize("hw", ["rtx3090", "l4", "h100", "t4"])
def test_ggml_cuda_never_faster_than_its_roofs(hw):
    """On the GPU (llama.cpp's achieved rates) and the CPU: never below the memory roof of the
    format's own bytes nor the compute roof, nor below the fp16 roofline on the same bytes."""
    rates = rates_from_profile(load_hardware(hw))
    tokens = np.array([1.0, 4.0, 16.0, 64.0, 256.0, 512.0, 2048.0])
    op = costs.single_expert(q4_k_m_mixtral(), tokens)
    for engine in (GGML, load_engine("llama.cpp"), load_engine("llama.cpp-nkvo")):
        flops, bandwidth = gpu_rate_factors(rates, engine)
        t = np.asarray(gpu_time_s(op, rates, tokens, engine, kernel=True))
        assert np.all(t >= op.bytes / (rates.gpu_bandwidth_bytes_s * bandwidth) * (1 - 1e-12))
        assert np.all(t >= op.flops / (rates.gpu_flops(tokens) * flops) * (1 - 1e-12))
        today = np.asarray(gpu_time_s(op, rates, tokens, with_fields(engine, {"quant_kernel": None}),
                                              kernel=False))
        assert np.all(t >= today * (1 - 1e-12))
        cpu = np.asarray(cpu_time_s(op, rates, tokens, engine))
        assert np.all(cpu >= np.maximum(op.bytes / rates.cpu_bandwidth_bytes_s,
                                        op.flops / rates.cpu_flops(tokens)) * (1 - 1e-12))


def test_the_llama_cpp_engines_name_the_ggml_family():
    for name in ("llama.cpp", "llama.cpp-nkvo"):
        assert load_engine(name).quant_kernel == "ggml-cuda-mmq"


def test_llama_cpp_fp16_unchanged_and_int4_search_slower():
    """fp16 Mixtral under llama.cpp: the family changes nothing (estimate and the search's
    plan). Q4_K_M Mixtral on an RTX 3090 under llama.cpp: the search predicts a lower
    throughput with ggml-cuda's fractions than with the fp16 roofline on the same bytes."""
    hw, wl = load_hardware("rtx3090"), make_workload("mtbench", gen_len=16)
    llama = load_engine("llama.cpp")
    bytes_only = with_fields(llama, {"quant_kernel": None})
    fp16 = load_model("mixtral")
    policy = parse_policy("N=1,mu=1,attn=gpu,rw=0.5,rc=1")
    assert estimate(hw, fp16, wl, policy, engine=llama).generation_throughput_tok_s == \
        estimate(hw, fp16, wl, policy, engine=bytes_only).generation_throughput_tok_s
    with_family, without = search(hw, fp16, wl, engine=llama, top=0), search(hw, fp16, wl, engine=bytes_only, top=0)
    assert with_family.best.policy == without.best.policy
    assert with_family.best.estimate.generation_throughput_tok_s == without.best.estimate.generation_throughput_tok_s
    model = q4_k_m_mixtral()
    slow, fast = search(hw, model, wl, engine=llama, top=0), search(hw, model, wl, engine=bytes_only, top=0)
    assert slow.best.estimate.generation_throughput_tok_s < fast.best.estimate.generation_throughput_tok_s
