"""Chunked prefill (``prefill.max_tokens_per_pass``, issue 25: vLLM's batched-token limit).

vLLM runs at most --max-num-batched-tokens tokens per step (config/scheduler.py:48,134), so
the prompts of N sequences take ⌈N·s / budget⌉ forward passes, and every pass reads the
offloaded experts over UVA again inside its kernels (model_executor/offloader/uva.py:114-122),
and the resident weights from GPU memory again.
Hand-computed below from Mixtral's shapes and the L4 profile's link rate."""

from __future__ import annotations

import json
import math

import pytest

import hrm_cli
from hrm.engines.engine import load_engine
from hrm.engines.mechanisms import with_fields
from hrm.errors import HRMError
from hrm.estimate import estimate
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.policy import parse_policy
from hrm.workload import make_workload

# Mixtral-8x7B (hrm/data/models/mixtral-8x7b.json): 32 MoE layers of 8 experts of three
# 4096 x 14336 fp16 matrices
LAYERS, EXPERTS, H, H2, FP16 = 32, 8, 4096, 14336, 2
EXPERT_BYTES_PER_LAYER = EXPERTS * 3 * H * H2 * FP16
FIELD = "prefill.max_tokens_per_pass"


@pytest.fixture(scope="module")
def l4():
    return load_hardware("l4"), load_model("mixtral"), make_workload()


def vllm(budget=None):
    engine = load_engine("vllm")
    return engine if budget is None else with_fields(engine, {FIELD: budget})


def test_each_extra_pass_reads_every_offloaded_expert_again(l4):
    """N=100 prompts of 77 tokens = 7,700 tokens: a budget of 7,700 is one pass (no change),
    3,850 two, 2,567 three. vLLM's schedule is serial (a layer's UVA reads in its kernels), so
    each extra pass adds 32 layers x 2.818 GB / 17.18 GB/s (l4.yaml link.h2d_gbps) = 5.25 s."""
    hw, model, workload = l4
    policy = parse_policy("N=100,mu=100,n=1,attn=gpu,ffn=gpu,rw=0,rc=1")
    one_pass_s = LAYERS * EXPERT_BYTES_PER_LAYER / (hw.link.h2d_gbps * 1e9)
    base = estimate(hw, model, workload, policy, engine=vllm()).prefill_latency_s
    for budget, passes in ((7700, 1), (3850, 2), (2567, 3)):
        assert math.ceil(100 * 77 / budget) == passes
        got = estimate(hw, model, workload, policy, engine=vllm(budget)).prefill_latency_s
        assert got - base == pytest.approx((passes - 1) * one_pass_s, rel=1e-9)


def test_resident_weights_are_read_from_gpu_memory_every_pass():
    """Every weight on the GPU: nothing crosses the link, but each pass is a graph of its own
    that reads the layer's weights from HBM again (llama.cpp: one graph per ubatch,
    src/llama-context.cpp:1870-2054). One 4,096-token Mixtral prompt on the H100 at -ub 32 is
    128 passes; each touches 8·(1 − (6/8)^32) = 7.9992 of the 8 experts with 32·2/8 = 8 rows
    each, far below the ridge, so it streams those experts' 3 x 4096 x 14336 fp16 matrices at
    the H100's 3.35 TB/s x 0.8 streaming efficiency (hardware_profiles/h100.yaml): 128 x 1.054
    ms = 0.135 s a layer, where one pass of all 4,096 tokens is compute-bound at 2.886 TFLOP /
    (989 TFLOP/s x 0.8) = 3.65 ms."""
    from hrm.cost.latency.prefill import prefill_layer_terms
    from hrm.machine.rates import rates_from_profile
    from hrm.model.options import DEFAULT_OPTIONS

    hw, model = load_hardware("h100"), load_model("mixtral")
    rates = rates_from_profile(hw, DEFAULT_OPTIONS.for_model(model), engine="llama.cpp")
    bandwidth, tflops = 3.35e12 * 0.8, 989e12 * 0.8
    touched = EXPERTS * (1 - (1 - 2 / EXPERTS) ** 32)
    per_pass_s = touched * 3 * H * H2 * FP16 / bandwidth
    chunked = prefill_layer_terms(model, rates, 1, 4096, True, with_fields(load_engine("llama.cpp"), {FIELD: 32}))
    assert chunked.passes == 128
    assert chunked.moe_s == pytest.approx(128 * per_pass_s, rel=5e-3)  # + the tokens' activations
    whole = prefill_layer_terms(model, rates, 1, 4096, True, load_engine("llama.cpp"))
    assert whole.moe_s == pytest.approx(2 * 4096 * 2 * 3 * H * H2 / tflops, rel=1e-3)
    # at the estimate: vLLM's chunked prefill of resident experts is slower, never faster
    a100, lite = load_hardware("a100-80g"), load_model("deepseek-v2-lite")
    policy = parse_policy("N=64,mu=64,n=1,attn=gpu,ffn=gpu,rw=1,rc=1")
    base = estimate(a100, lite, make_workload(), policy, engine=vllm())
    assert estimate(a100, lite, make_workload(), policy, engine=vllm(512)).prefill_latency_s > base.prefill_latency_s


def test_a_pass_holds_only_its_tokens_activations(l4):
    """The prefill workspace is one pass's tokens: a budget below the batch's prompt tokens
    lowers the GPU peak, never raises it."""
    hw, model, workload = l4
    policy = parse_policy("N=450,mu=450,n=1,attn=gpu,ffn=gpu,rw=0,rc=1")
    whole = estimate(hw, model, workload, policy, engine=vllm()).gpu_peak_bytes
    assert estimate(hw, model, workload, policy, engine=vllm(2048)).gpu_peak_bytes < whole
    assert estimate(hw, model, workload, policy, engine=vllm(450 * 77)).gpu_peak_bytes == pytest.approx(whole)


def test_engines_that_cannot_model_it_refuse_it():
    """Passes are per micro-batch: the field needs one micro-batch; the expert-level
    (Klotski) pipeline does not model it."""
    with pytest.raises(Exception, match="max_tokens_per_pass needs policy.fixed.num_micro_batches: 1"):
        with_fields(load_engine("ideal"), {FIELD: 2048})
    with pytest.raises(Exception, match="max_tokens_per_pass"):
        with_fields(load_engine("klotski"), {FIELD: 2048, "policy.fixed": {"num_micro_batches": 1}})


def test_import_estimates_the_commands_budget(capsys):
    """A vLLM command without --max-num-batched-tokens runs vLLM's default budget for an L4
    (2048: arg_utils.py get_batch_defaults, docs/engines/vllm.md §4): 256 x 77 prompt tokens
    take ceil(19712 / 2048) = 10 passes; the same command with a budget of the whole prefill
    takes one. The difference is 9 passes of every offloaded expert, and the smaller passes'
    own GPU work."""
    hw = load_hardware("l4")
    command = "vllm serve mistralai/Mixtral-8x7B-v0.1 --cpu-offload-gb 84 --cpu-offload-params experts --max-num-seqs 256"
    runs = {}
    for extra in ("", " --max-num-batched-tokens 19712"):
        assert hrm_cli.main(["import", "--from", "vllm", command + extra, "--hw", "l4", "--model", "mixtral",
                             "--json"]) == 0
        runs[extra] = json.loads(capsys.readouterr().out)
    assert all(doc["policy"]["weights_gpu_ratio"] == 0 for doc in runs.values())
    passes = math.ceil(256 * 77 / 2048)
    extra_s = (passes - 1) * LAYERS * EXPERT_BYTES_PER_LAYER / (hw.link.h2d_gbps * 1e9)
    delta = runs[""]["estimate"]["prefill_latency_s"] - runs[" --max-num-batched-tokens 19712"]["estimate"]["prefill_latency_s"]
    # plus what the GPU's own work loses at 1,971 tokens a pass instead of 19,712 (the L4's
    # measured FLOP/s-vs-M curve): ~4 ms of 47 s
    assert extra_s <= delta <= extra_s * (1 + 1e-3)


def test_explain_names_chunked_prefill(l4):
    from hrm.analysis.explain import explain
    from hrm.cost.memory import memory_limits
    from hrm.model.options import DEFAULT_OPTIONS

    hw, model, workload = l4
    policy = parse_policy("N=256,mu=256,n=1,attn=gpu,ffn=gpu,rw=0,rc=1")
    report = explain(hw, model, workload, policy, vllm(2048), DEFAULT_OPTIONS, memory_limits(hw))
    labels = {c.mechanism: c for c in report.costs}
    assert labels[FIELD].prefill_s > 0


def test_bad_budget_is_refused():
    with pytest.raises((HRMError, ValueError)):
        with_fields(load_engine("vllm"), {FIELD: 0})
