"""The model of the machine the runtime executes on: dispatch overhead (the α of the α-β
model) and the emulated device tier of a CPU-only host. Datasheet profiles (neither set)
must predict exactly what they predicted before; measured ones add hand-countable terms."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from hrm.cost.latency.decode import decode_resources
from hrm.cost.latency.dispatch import experts_call_dispatch_s
from hrm.cost.latency.ops import lm_head_time_s
from hrm.cost.latency.prefill import prefill_resources
from hrm.engines.engine import as_engine
from hrm.estimate import estimate
from hrm.machine.hardware import Dispatch, Emulation, load_hardware, parse_hardware
from hrm.cost.memory import memory_limits
from hrm.model.spec import load_model
from hrm.model.options import ModelOptions
from hrm.policy import Policy
from hrm.problem import make_problem
from hrm.machine.rates import rates_from_profile
from hrm.workload import make_workload
from solver.lanes import milp
from solver.search import choice_to_policy
from solver.lanes.terms import build_terms, enumerate_modes
from solver.lanes.verify import exhaustive

US = 1e-6
# distinct α per field so that every count shows up in the sums
ALPHA = Dispatch(task_s=1 * US, pre_attn_s=2 * US, attention_s=3 * US, post_attn_s=5 * US, experts_call_s=7 * US,
                 expert_s=11 * US, head_s=13 * US, copy_s=17 * US)
EMU = Emulation(threads=1, tflops={"fp32": 0.05}, memory_bandwidth_gbps=30.0, copy_gbps=15.0,
                matmul_tflops_vs_m={"fp32": [{"x": 1, "y": 0.005}, {"x": 64, "y": 0.05}]})
FP32 = ModelOptions(gpu_compute_dtype="fp32", cpu_compute_dtype="fp32")


def cpu_only(dispatch=None, emulation=None):
    data = load_hardware("cpu-only").model_dump(mode="json", exclude_none=True)
    if dispatch is not None:
        data["cpu"]["dispatch"] = dispatch.model_dump()
    if emulation is not None:
        data["emulation"] = emulation.model_dump(mode="json")
    return parse_hardware(data)


def tiny():
    spec = load_model("tiny-mixtral")  # 4 experts, top-2
    return spec.model_copy(update={"weight_dtype": "fp32", "kv_dtype": "fp32", "activation_dtype": "fp32"})


def legacy_sha256(profile) -> str:
    """The hash as plans recorded it before the optional sections existed."""
    data = profile.model_dump(mode="json")
    for section in ("cpu", "gpu"):
        if isinstance(data.get(section), dict):
            data[section].pop("dispatch", None)
    data.pop("emulation", None)
    data.pop("ggml_cpu", None)  # hrm profile --llama-cpp's section, did not exist then
    if data["source"].get("runs_sha256") is None:  # hrm calibrate's field, did not exist then
        data["source"].pop("runs_sha256", None)
    from hrm.machine.hardware import ACHIEVED_FIELDS

    for section, keys in ACHIEVED_FIELDS.items():  # fields that did not exist then
        for key in keys:
            if isinstance(data.get(section), dict) and data[section].get(key) is None:
                data[section].pop(key)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("name", ["l4", "cpu-only", "2xt4", "h100"])
def test_profiles_without_the_new_sections_keep_hash_and_rates(name):
    hw = load_hardware(name)
    assert hw.sha256() == legacy_sha256(hw)
    rates = rates_from_profile(hw)
    assert rates.gpu_dispatch is None and rates.cpu_dispatch is None
    # the same profile with every α = 0 predicts the same, so no α means the plain roofline
    data = hw.model_dump(mode="json", exclude_none=True)
    for section in ("cpu", "gpu"):
        if section in data:
            data[section]["dispatch"] = Dispatch().model_dump()
    zero = parse_hardware(data)
    assert zero.sha256() != hw.sha256()
    wl = make_workload("mtbench", gen_len=8)
    policy = Policy(batch_size=64, micro_batch_size=32, num_micro_batches=2, weights_gpu_ratio=0.0)
    model = load_model("tiny-mixtral") if name == "cpu-only" else load_model("mixtral")
    a, b = estimate(hw, model, wl, policy, engine="ideal"), estimate(zero, model, wl, policy, engine="ideal")
    assert a.decode_layer_latency_s == b.decode_layer_latency_s
    assert a.generation_throughput_tok_s == b.generation_throughput_tok_s


@pytest.mark.parametrize("attn,ffn,expected_us", [
    # gpu: PreAttn + PostAttn tasks (2 x 1) + pre 2 + post 5 + expert call 7 + 2 experts x 11
    # cpu: CPUAttn task 1 + attention 3; d2h: QKV task + copy; h2d: LoadH and one page
    (0.0, 1.0, {"gpu": 38, "cpu": 4, "d2h": 18, "h2d": 36, "d2h_kv": 0, "h2d_kv": 0}),
    # one fused device task: 1 + 2 + 3 + 5 + 7 + 22; StoreKV/LoadKV tasks, K and V copies x (1 - rc)
    (1.0, 1.0, {"gpu": 40, "cpu": 0, "d2h": 1, "h2d": 19, "d2h_kv": 34, "h2d_kv": 34}),
    # experts on the CPU: gpu PreAttn, PostAttn, Merge tasks + pre + post; cpu attention task and
    # expert task (1 + 3 + 1 + 7 + 22); d2h QKV (18) + router outputs (1 + 3 x 17); h2d LoadH + FFN out
    (0.0, 0.0, {"gpu": 10, "cpu": 34, "d2h": 70, "h2d": 36, "d2h_kv": 0, "h2d_kv": 0}),
])
def test_decode_dispatch_counts_the_runtime_tasks(attn, ffn, expected_us):
    """μ = 1 token touches exactly k = 2 experts; hand-counted α per lane per micro-batch."""
    spec = tiny()
    plain = decode_resources(spec, rates_from_profile(cpu_only(), FP32), 1, 40, attn, ffn)
    with_alpha = decode_resources(spec, rates_from_profile(cpu_only(ALPHA), FP32), 1, 40, attn, ffn)
    for lane in ("gpu", "cpu", "h2d", "d2h"):
        extra = float(with_alpha[lane].per_micro_batch_s - plain[lane].per_micro_batch_s)
        assert extra == pytest.approx(expected_us[lane] * US, abs=1e-12), lane
        kv = float(with_alpha[lane].per_micro_batch_kv_cpu_s - plain[lane].per_micro_batch_kv_cpu_s)
        assert kv == pytest.approx(expected_us.get(f"{lane}_kv", 0) * US, abs=1e-12), lane
        weights = with_alpha[lane].per_layer_offloaded_weights_s - plain[lane].per_layer_offloaded_weights_s
        assert float(weights) == 0.0


def test_expert_dispatch_follows_expected_distinct_experts():
    """μ = 8 tokens, 4 experts, top-2: E = 4·(1 − (1/2)^8) distinct experts."""
    spec = tiny()
    distinct = 4 * (1 - 0.5 ** 8)
    assert experts_call_dispatch_s(spec, ALPHA, 8) == pytest.approx((7 + 11 * distinct) * US)
    assert experts_call_dispatch_s(spec, None, 8) == 0.0


def test_prefill_and_head_dispatch():
    spec = tiny()
    rates = rates_from_profile(cpu_only(ALPHA), FP32)
    plain = rates_from_profile(cpu_only(), FP32)
    # μ = 2 prompts of 3 tokens: 6 tokens touch 4·(1 − 2^-6) experts; attention once per prompt
    a = prefill_resources(spec, rates, 2, 3)
    b = prefill_resources(spec, plain, 2, 3)
    distinct = 4 * (1 - 0.5 ** 6)
    assert float(a["gpu"].per_micro_batch_s - b["gpu"].per_micro_batch_s) == pytest.approx(
        (1 + 2 + 2 * 3 + 5 + 7 + 11 * distinct) * US)
    assert float(a["h2d"].per_micro_batch_s) == pytest.approx((1 + 17 + 1 + 17) * US)  # LoadH + a page
    assert float(a["d2h"].per_micro_batch_s) == pytest.approx((2 * 1 + 17 + 2 * 2 * 17) * US)  # OffloadH + StoreKV
    # head: task + head; on the shared unit also the token copy to the host (task + copy)
    head = lm_head_time_s(spec, rates, 4) - lm_head_time_s(spec, plain, 4)
    assert float(head) == pytest.approx((1 + 13 + 1 + 17) * US)


def test_emulation_section_is_the_device_tier_of_a_cpu_only_host():
    hw = cpu_only(emulation=EMU)
    rates = rates_from_profile(hw, FP32)
    assert rates.shared_unit
    assert rates.gpu_peak_flops == rates.cpu_peak_flops == pytest.approx(0.05e12)
    assert rates.gpu_bandwidth_bytes_s == rates.cpu_bandwidth_bytes_s == pytest.approx(30e9)
    assert rates.h2d_bytes_s == rates.d2h_bytes_s == pytest.approx(15e9)
    # log-x interpolation of the curve: M = 8 is half-way between 1 and 64
    assert float(rates.gpu_flops(8)) == pytest.approx(0.0275e12)
    off = rates_from_profile(hw, FP32.model_copy(update={"use_emulation": False}))
    assert off.gpu_peak_flops == pytest.approx(0.1e12) and off.h2d_bytes_s == pytest.approx(5e9)
    assert hw.sha256() != cpu_only().sha256()


@pytest.mark.slow
def test_milp_carries_the_dispatch_terms():
    """The solver takes its coefficients from the same lanes: optimum = exhaustive optimum, and
    the estimate of the returned policy (with α) reports the MILP's objective."""
    hw = cpu_only(ALPHA, EMU)
    model, wl = tiny(), make_workload("mtbench", gen_len=8)
    limits = memory_limits(hw, FP32)
    terms = build_terms(make_problem(hw, model, wl, as_engine("cgopipe"), FP32, limits),
                        enumerate_modes("cgopipe", (1, 2, 4, 8, 16, 32, 64, 128)))
    result = milp.solve_dinkelbach(terms, 256, "generation", solver="cbc")
    check = exhaustive(terms, 256, "generation")
    assert result.objective == pytest.approx(check.objective, rel=1e-3)
    est = estimate(hw, model, wl, choice_to_policy(terms, result.choice), "cgopipe", FP32, limits)
    assert est.generation_throughput_tok_s == pytest.approx(result.objective, rel=1e-6)
    plain = build_terms(make_problem(cpu_only(emulation=EMU), model, wl, as_engine("cgopipe"), FP32, limits),
                        enumerate_modes("cgopipe", (1, 2, 4, 8, 16, 32, 64, 128)))
    assert np.all(terms.per_micro_batch_s > plain.per_micro_batch_s)


def test_device_attention_and_kv_indexing_alpha():
    """Attention on the device: its own α (not the CPU path's) and the host-cache indexing
    beyond the K/V copies, the latter × (1 − r_c) like the copies."""
    spec = tiny()
    alpha = ALPHA.model_copy(update={"device_attention_s": 19 * US, "kv_load_s": 23 * US, "kv_store_s": 29 * US})
    plain = decode_resources(spec, rates_from_profile(cpu_only(), FP32), 1, 40, 1.0, 1.0)
    lanes = decode_resources(spec, rates_from_profile(cpu_only(alpha), FP32), 1, 40, 1.0, 1.0)
    assert float(lanes["gpu"].per_micro_batch_s - plain["gpu"].per_micro_batch_s) == pytest.approx(
        (1 + 2 + 19 + 5 + 7 + 22) * US)
    assert float(lanes["h2d"].per_micro_batch_kv_cpu_s - plain["h2d"].per_micro_batch_kv_cpu_s) == pytest.approx(57 * US)
    assert float(lanes["d2h"].per_micro_batch_kv_cpu_s - plain["d2h"].per_micro_batch_kv_cpu_s) == pytest.approx(63 * US)
    assert ALPHA.device_attention() == ALPHA.attention_s  # unset: the CPU path's α
