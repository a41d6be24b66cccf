"""Latency and memory model properties (docs/model.md §4.3-4.6)."""

import itertools

import pytest

from hrm.estimate import estimate
from hrm.machine.hardware import load_hardware
from hrm.cost.memory import memory_limits
from hrm.model.spec import load_model
from hrm.policy import Policy
from hrm.workload import make_workload


def pol(batch_size=512, mu=64, attn=False, ffn=True, rw=0.0, rc=0.0):
    return Policy(batch_size=batch_size, micro_batch_size=mu, num_micro_batches=batch_size // mu, attn_on_gpu=attn,
                  ffn_on_gpu=ffn, weights_gpu_ratio=rw, kv_gpu_ratio=rc)


@pytest.mark.parametrize("hw_name,attn,ffn,rw,rc", [
    (h, a, f, rw, rc) for h, (a, f), rw, rc in itertools.product(
        ["l4", "t4", "4xt4", "cpu-only"], [(False, True), (True, True), (False, False)], [0.0, 0.3], [0.0, 0.5])
    if not (rc and not a) and not (rw and not f)])
def test_cgopipe_never_slower_than_sequential(hw_name, attn, ffn, rw, rc):
    hw, model, wl = load_hardware(hw_name), load_model("mixtral"), make_workload("mtbench", gen_len=16)
    p = pol(attn=attn, ffn=ffn, rw=rw, rc=rc)
    fast = estimate(hw, model, wl, p, "cgopipe")
    slow = estimate(hw, model, wl, p, "sequential")
    assert fast.total_time_s <= slow.total_time_s * (1 + 1e-12)
    if not hw.cpu_only:
        assert fast.total_time_s < slow.total_time_s


def test_gpu_peak_rises_with_mu_and_rw(l4):
    model, wl = load_model("mixtral"), make_workload("mtbench")
    by_mu = [estimate(l4, model, wl, pol(batch_size=512, mu=mu), engine="ideal").gpu_peak_bytes for mu in (8, 32, 128)]
    assert by_mu[0] < by_mu[1] < by_mu[2]
    by_rw = [estimate(l4, model, wl, pol(rw=rw), engine="ideal").gpu_peak_bytes for rw in (0.0, 0.2, 0.5)]
    assert by_rw[0] < by_rw[1] < by_rw[2]


def test_cpu_peak_rises_with_batch(l4):
    model, wl = load_model("mixtral"), make_workload("mtbench")
    peaks = [estimate(l4, model, wl, pol(batch_size=batch_size, mu=64), engine="ideal").cpu_peak_bytes for batch_size in (64, 256, 1024)]
    assert peaks[0] < peaks[1] < peaks[2]


def test_prefill_grows_with_prompt(l4):
    model = load_model("mixtral")
    times = [estimate(l4, model, make_workload(None, prompt_len=s, gen_len=8), pol(), engine="ideal").prefill_latency_s
             for s in (64, 512, 2048)]
    assert times[0] < times[1] < times[2]


def test_decode_step_grows_with_context(l4):
    model = load_model("mixtral")
    short = estimate(l4, model, make_workload(None, prompt_len=64, gen_len=64), pol(), engine="ideal")
    long = estimate(l4, model, make_workload(None, prompt_len=4096, gen_len=64), pol(), engine="ideal")
    assert long.resource_layer_s["cpu"] > short.resource_layer_s["cpu"]


def test_tensor_parallel_memory_capacity_scales():
    two, four = memory_limits(load_hardware("2xt4")), memory_limits(load_hardware("4xt4"))
    assert four.gpu_bytes == pytest.approx(2 * two.gpu_bytes)


def test_throughput_definition(l4):
    model, wl = load_model("mixtral"), make_workload("mtbench", gen_len=32)
    est = estimate(l4, model, wl, pol(), engine="ideal")
    assert est.generation_throughput_tok_s == pytest.approx(512 * 32 / (est.prefill_latency_s + est.decode_time_s))
    assert est.decode_throughput_tok_s == pytest.approx(512 * 31 / est.decode_time_s)


def test_cpu_only_host_adds_compute(tiny):
    hw, wl = load_hardware("cpu-only"), make_workload("mtbench", gen_len=8)
    est = estimate(hw, tiny, wl, pol(batch_size=8, mu=4), engine="ideal")
    assert est.decode_layer_latency_s == pytest.approx(sum(est.resource_layer_s.values()), rel=1e-9)


def test_float_weights_set_activations_and_compute_dtype():
    """Kernels compute in the weights' float type; quantised weights dequantise to fp16."""
    from hrm.model.options import ModelOptions
    from hrm.machine.rates import rates_from_profile

    base = load_model("mixtral")
    fp32 = base.with_dtypes("fp32")
    assert (fp32.weight_dtype, fp32.activation_dtype) == ("fp32", "fp32")
    int4 = base.with_dtypes("int4")
    assert (int4.weight_dtype, int4.activation_dtype) == ("int4", base.activation_dtype)
    options = ModelOptions()
    assert options.for_model(fp32).gpu_compute_dtype == "fp32"
    assert options.for_model(int4).gpu_compute_dtype == "fp16"
    assert ModelOptions(gpu_compute_dtype="bf16").for_model(fp32).gpu_compute_dtype == "bf16"
    l4 = load_hardware("l4")
    # L4 datasheet: 30.3 TFLOP/s fp32, 121 TFLOP/s fp16 (hardware_profiles/l4.yaml)
    assert rates_from_profile(l4, options.for_model(fp32)).gpu_peak_flops == pytest.approx(30.3e12)
    assert rates_from_profile(l4, options.for_model(base)).gpu_peak_flops == pytest.approx(121e12)
