"""hrm fit's vLLM and SGLang + kTransformers answers (hrm.analysis.fit_vllm, fit_sglang): the
command each prints reads back (hrm import) as the policy it was picked as, its rates are
hrm.estimate's for that policy under the engine, the pick is the optimum of an independent
enumeration of the engine's granularity, and where an engine cannot run the model the answer
is one line saying why."""

from __future__ import annotations

import pytest

from hrm.analysis.fit_sglang import sglang_answer
from hrm.analysis.fit_vllm import GGUF_SOURCE, vllm_answer
from hrm.engines.engine import load_engine
from hrm.engines.mechanisms import with_fields
from hrm.estimate import estimate
from hrm.export.importing import read_command
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.policy import Policy
from hrm.workload import make_workload

#: (profile, catalog model, context, users): a model the GPU holds whole, and two it does not
PAIRS = [("l4", "small-mixtral", 512, 1), ("l4", "deepseek-v2-lite", 2048, 1), ("t4", "mixtral", 1024, 2)]
GEN = 64


@pytest.fixture(scope="module", params=PAIRS, ids=lambda p: f"{p[0]}-{p[1]}-u{p[3]}")
def case(request):
    hw_name, model_name, context, users = request.param
    hw, model = load_hardware(hw_name), load_model(model_name)
    workload = make_workload(None, prompt_len=context - GEN, gen_len=GEN)
    return hw, model, workload, users


def _by_hand(hw, model, workload, users: int, engine, gpu_share: float):
    """The estimate of ``gpu_share`` of the experts on the GPU, one batch of ``users``, attention
    and the KV cache on the GPU (both engines' policy space, hrm/data/engines/*.yaml)."""
    policy = Policy(batch_size=users, micro_batch_size=users, num_micro_batches=1, attn_on_gpu=True, ffn_on_gpu=True,
                    weights_gpu_ratio=gpu_share, kv_gpu_ratio=1.0)
    return policy, estimate(hw, model, workload, policy, engine=engine)


def _best(hw, model, workload, users, engine, units: int):
    """(units on the GPU, policy, estimate) of the fitting share that finishes the requests first."""
    rows = [(k, *_by_hand(hw, model, workload, users, engine, k / units)) for k in range(units + 1)]
    return min((r for r in rows if r[2].feasible), key=lambda r: (r[2].total_time_s, -r[0]))


def _check_rates(got, users, workload, want) -> None:
    assert got.decode_tok_s == pytest.approx(want.decode_throughput_tok_s, rel=1e-12)
    assert got.prefill_tok_s == pytest.approx(users * workload.prompt_len / want.prefill_latency_s, rel=1e-12)
    assert got.total_s == pytest.approx(want.total_time_s, rel=1e-12)
    assert got.memory_bytes == {"gpu": want.gpu_peak_bytes, "cpu": want.cpu_peak_bytes}


def _same_policy(a: Policy, b: Policy) -> None:
    assert a.model_dump(exclude={"weights_gpu_ratio"}) == b.model_dump(exclude={"weights_gpu_ratio"})
    assert a.weights_gpu_ratio == pytest.approx(b.weights_gpu_ratio, abs=1e-9)


def test_vllm_pick_reads_back_and_is_estimated_as_hrm_estimate(case):
    hw, model, workload, users = case
    got = vllm_answer(hw, model, workload, users)
    # vLLM offloads whole layers' experts (uva.py:84-94); its --max-num-batched-tokens is the
    # prefill pass: every prompt of the batch in one step (hrm.export.vllm.batched_tokens)
    engine = with_fields(load_engine("vllm"), {"prefill.max_tokens_per_pass": users * workload.prompt_len})
    layers = int(model.num_moe_layers)
    k, policy, want = _best(hw, model, workload, users, engine, layers)
    _same_policy(got.policy, policy)
    _check_rates(got, users, workload, want)
    assert got.searched == layers + 1
    assert ("--cpu-offload-params experts" in got.command) == (k < layers)
    back = read_command("vllm", got.command, model, workload, hw)
    _same_policy(back.policy, got.policy)
    assert back.engine_fields == {"prefill.max_tokens_per_pass": users * workload.prompt_len}


def test_sglang_pick_reads_back_and_is_estimated_as_hrm_estimate(case):
    hw, model, workload, users = case
    got = sglang_answer(hw, model, workload, users)
    experts = int(model.num_experts)  # --kt-num-gpu-experts k of every layer (kt_ep_wrapper.py:1935-1941)
    k, policy, want = _best(hw, model, workload, users, load_engine("sglang"), experts)
    _same_policy(got.policy, policy)
    _check_rates(got, users, workload, want)
    if k < experts:  # the model's fp16 experts are kt-kernel's BF16 method, read from the checkpoint
        assert f"--kt-method BF16 --kt-num-gpu-experts {k} " in got.command
    else:
        assert "--kt-" not in got.command and "kTransformers off" in got.line
    back = read_command("sglang", got.command, model, workload, hw)
    _same_policy(back.policy, got.policy)
    assert back.model is None  # the command stores the model as it is


def test_gguf_weights_are_refused_by_vllm_in_one_line():
    hw = load_hardware("l4")
    model = load_model("mixtral", weight_dtype="int4").with_weight_format("q4_k_m")
    got = vllm_answer(hw, model, make_workload(None, prompt_len=960, gen_len=GEN))
    assert got.command is None and got.lines() == (f"vllm: {got.line}",)
    assert "GGUF (q4_k_m)" in got.line and GGUF_SOURCE in got.line and "\n" not in got.line


def test_sglang_without_a_kt_method_runs_only_all_on_the_gpu():
    workload = make_workload(None, prompt_len=960, gen_len=GEN)
    model = load_model("mixtral", weight_dtype="int4").with_weight_format("q4_k_m")
    got = sglang_answer(load_hardware("l4"), model, workload)  # ~26 GiB of experts: only k = E searched, over
    assert got.command is None and got.searched == 1 and got.infeasible == 1
    assert "q4_k_m experts" in got.line and "KT_FORMATS" in got.line and "\n" not in got.line
    small = load_model("small-mixtral", weight_dtype="int4").with_weight_format("q4_k_m")
    fits = sglang_answer(load_hardware("l4"), small, workload)
    assert fits.command is not None and fits.policy.weights_gpu_ratio == 1.0 and "--kt-" not in fits.command


def test_no_gpu_is_one_line_each():
    hw = load_hardware("cpu-only")
    for got in (vllm_answer(hw, None, None), sglang_answer(hw, None, None)):
        assert got.command is None and "has no GPU" in got.line and "\n" not in got.line


def test_nothing_fits_vllm_is_one_line():
    # 8 users x 32k tokens of Mixtral's fp16 KV cache (32 layers x 8 heads x 128 x 2 x 2 bytes a
    # token: 32 GiB) exceed a T4's 16 GB whatever vLLM offloads: it keeps the KV cache on the GPU
    hw, model = load_hardware("t4"), load_model("mixtral")
    workload = make_workload(None, prompt_len=32768 - GEN, gen_len=GEN)
    assert 8 * 32768 * 32 * 8 * 128 * 2 * 2 > hw.gpu.memory_bytes
    got = vllm_answer(hw, model, workload, users=8)
    assert got.command is None and got.infeasible == got.searched == 33
    assert "still exceed --gpu-memory-utilization" in got.line


def test_fit_report_and_json_carry_both_answers():
    from hrm.analysis.fit import fit_gpu, fit_json, fit_report

    hw, model = load_hardware("l4"), load_model("small-mixtral")
    result = fit_gpu(hw, model, 512, GEN)
    workload = make_workload(None, prompt_len=512 - GEN, gen_len=GEN)
    want = [vllm_answer(hw, model, workload), sglang_answer(hw, model, workload)]
    assert list(result.servers) == want
    lines = fit_report(result, hw.name).lines()
    for answer in want:
        start = lines.index(f"{answer.engine}: {answer.line}")
        assert lines[start + 1] == f"  {answer.command}"
    assert fit_json(result, hw.name)["servers"] == [a.to_json() for a in want]
