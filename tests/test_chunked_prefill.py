"""Chunked prefill (``prefill.max_tokens_per_pass``, issue 25: vLLM's batched-token limit).

vLLM runs at most --max-num-batched-tokens tokens per step (config/scheduler.py:48,134), so
the prompts of N sequences take ⌈N·s / budget⌉ forward passes, and every pass reads the
offloaded experts over UVA again inside its kernels (model_executor/offloader/uva.py:114-122).
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


def test_resident_experts_cost_nothing_per_pass(l4):
    """Every expert on the GPU (a 80 GiB card): nothing crosses the link, so the passes add
    no weight reads (only the activations per pass, which are smaller)."""
    hw = load_hardware("a100-80g")
    _, _, workload = l4
    model = load_model("deepseek-v2-lite")
    policy = parse_policy("N=64,mu=64,n=1,attn=gpu,ffn=gpu,rw=1,rc=1")
    base = estimate(hw, model, workload, policy, engine=vllm())
    chunked = estimate(hw, model, workload, policy, engine=vllm(512))
    assert chunked.prefill_latency_s == pytest.approx(base.prefill_latency_s, rel=1e-9)


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
    takes one. The difference is 9 passes of every offloaded expert."""
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
    assert delta == pytest.approx(extra_s, rel=1e-6)


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
