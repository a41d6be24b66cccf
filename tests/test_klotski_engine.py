"""Engine ``klotski`` (issue 13, item 2): Klotski as an engine the search plans. Its layer
time is the list-scheduled period of the expert-level pipeline, its search a branch and
bound over every (μ, n, resident layers) with the largest KV share memory allows."""

from __future__ import annotations

import re

import numpy as np
import pytest

import hrm.pipelines.expert_level_tasks as klotski
import hrm.pipelines.expert_level as expert_level
from hrm.cost import costs
from hrm.cost.latency.transfers import link_bytes_s
from hrm.engines.engine import load_engine
from hrm.errors import HRMError
from hrm.estimate import estimate
from hrm.machine.hardware import load_hardware
from hrm.cost.memory import memory_limits
from hrm.model.spec import load_model
from hrm.model.options import DEFAULT_OPTIONS
from hrm.problem import make_problem
from hrm.machine.rates import rates_from_profile
from hrm.model.routing import parse_routing
from hrm.units import dtype_bytes
from hrm.workload import make_workload
import solver.expert_level as solver_klotski
from solver.expert_level import candidates
from solver.search import SearchRequest, search
from solver.lanes.terms import LatencyLimits

ENGINE = load_engine("klotski")


def _setup(hw_name="rtx3090", model_name="mixtral", routing="uniform"):
    hw, model = load_hardware(hw_name), load_model(model_name)
    model = model.model_copy(update={"routing": parse_routing(routing, model.num_experts, model.top_k)})
    options = DEFAULT_OPTIONS.for_model(model)
    return hw, model, options, rates_from_profile(hw, options)


def test_host_kv_load_and_store_per_batch_from_the_profile():
    """A batch's host KV share moves over the pageable link (the engine's kv_cache), its
    μ·c cached tokens in, its μ new tokens out; the GPU share moves nothing."""
    hw, model, _, rates = _setup()
    layer = klotski.klotski_layer(model, rates, 16, 300.0, 4, engine=ENGINE, kv_gpu_ratio=0.25, dense_resident=True)
    kv_token = 2 * model.num_kv_heads * model.head_dim * dtype_bytes(model.kv_dtype)
    h2d = link_bytes_s(rates, ENGINE, "h2d", pageable=True)
    d2h = link_bytes_s(rates, ENGINE, "d2h", pageable=True)
    issue = 2 * rates.op_costs.gpu_op_s  # the K and V copies' launches (klotski.yaml launches; hrm.machine.launches)
    assert layer.kv_load_s == pytest.approx(0.75 * 16 * 300 * kv_token / h2d + issue, rel=1e-12)
    assert layer.kv_store_s == pytest.approx(0.75 * 16 * kv_token / d2h + issue, rel=1e-12)
    assert (layer.attention_load_s, layer.gate_load_s) == (0.0, 0.0)  # non-expert weights resident
    on_gpu = klotski.klotski_layer(model, rates, 16, 300.0, 4, engine=ENGINE, kv_gpu_ratio=1.0, dense_resident=True)
    assert (on_gpu.kv_load_s, on_gpu.kv_store_s) == (0.0, 0.0)
    resident = klotski.klotski_layer(model, rates, 16, 300.0, 4, engine=ENGINE, experts_resident=True)
    assert all(load == 0.0 for load, _ in resident.hot + resident.cold)


def test_memory_by_hand():
    """tiny-mixtral, μ = 2, N = 6, one of its layers' experts resident: GPU and CPU bytes
    from the component formulas, affine in r_c."""
    model = load_model("tiny-mixtral")
    workload = make_workload(None, prompt_len=10, gen_len=5)
    memory = expert_level.klotski_memory(model, workload, 2, 6, 1, engine=ENGINE)
    wb, ab = dtype_bytes(model.weight_dtype), dtype_bytes(model.activation_dtype)
    expert = 3 * model.hidden_size * model.expert_intermediate_size * wb
    layer = model.num_experts * expert
    kv_token = costs.kv_bytes_per_token(model)
    kv_seq = 15 * kv_token * model.num_layers  # max context: prompt 10 + gen 5
    from hrm.cost.memory import gpu_workspace_bytes

    q_max = model.top_k / model.num_experts  # uniform
    call = 2 * 10 * q_max * (2 * model.hidden_size + 3 * model.expert_intermediate_size) * ab  # one batch's call
    gpu0 = (costs.static_weight_bytes(model) + layer + layer * (model.num_moe_layers > 1) + 2 * 2 * 15 * kv_token
            + 6 * 2 * model.hidden_size * ab + float(gpu_workspace_bytes(model, workload, 2, True)) + call)
    assert float(memory.gpu_bytes(0.0)) == pytest.approx(gpu0, rel=1e-12)
    assert float(memory.gpu_bytes(1.0)) == pytest.approx(gpu0 + 6 * kv_seq - 2 * 2 * 15 * kv_token, rel=1e-12)
    assert float(memory.cpu_bytes(0.0)) == pytest.approx((model.num_moe_layers - 1) * layer + 6 * kv_seq, rel=1e-12)
    assert float(memory.cpu_bytes(1.0)) == pytest.approx((model.num_moe_layers - 1) * layer, rel=1e-12)


def test_chunked_schedule_is_close_to_batch_by_batch():
    """A group of 256 batches scheduled as 64 chunks against batch by batch: within 1.5%
    with a host KV cache (link-bound) and with the cache on the GPU."""
    hw, model, _, rates = _setup()
    for ratio in (0.0, 1.0):
        layer = klotski.klotski_layer(model, rates, 8, 300.0, 256, engine=ENGINE, kv_gpu_ratio=ratio,
                                      dense_resident=True)
        fine = klotski.chunked(layer, 256)
        exact = klotski.expert_schedule(fine.num_batches, fine.attention_s, fine.gate_s, fine.hot, fine.cold,
                                        kv_load_s=fine.kv_load_s, kv_store_s=fine.kv_store_s, layers=4)
        assert klotski.schedule_layer(layer).period_s == pytest.approx(exact.period_s, rel=0.015)


@pytest.mark.slow
@pytest.mark.parametrize("hw_name,model_name,routing", [
    ("rtx3090", "mixtral", "uniform"), ("a100-80g", "mixtral", "zipf:1.2"), ("t4", "tiny-deepseek", "uniform"),
    ("h100", "qwen1.5-moe-a2.7b", "zipf:1.0"),
])
def test_bounds_never_exceed_the_scheduled_times(hw_name, model_name, routing):
    """The search's per-candidate bounds (lane busy times plus the link's forced idle) are
    at most the scheduled decode step and prefill, on seeded random candidates."""
    hw, model, options, rates = _setup(hw_name, model_name, routing)
    workload = make_workload("mtbench")
    request = SearchRequest(problem=make_problem(hw, model, workload, ENGINE, options, memory_limits(hw, options)),
                            objective="generation", solve_for="generation", fixed={}, notes=[], max_batch=2048, top=0,
                            solver="auto", verify=False, hw_name=None, model_name=None, latency_limits=LatencyLimits(),
                            start=0.0)
    cands = candidates(request, rates)
    rng = np.random.default_rng(13)
    for i in rng.choice(len(cands), size=12, replace=False):
        times = expert_level.klotski_times(model, rates, workload, cands.policy(i, model.num_moe_layers), ENGINE)
        assert times.decode_step_s >= cands.step_lb_s[i] * (1 - 1e-9)
        assert times.prefill_s >= cands.prefill_lb_s[i] * (1 - 1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("hw_name,model_name,routing,extra", [
    ("rtx3090", "mixtral", "uniform", dict(fixed={"micro_batch_size": 32}, max_batch=1024)),
    ("a100-80g", "mixtral", "zipf:1.2", dict(fixed={"num_micro_batches": 4}, max_batch=512, objective="decode")),
    ("t4", "tiny-deepseek", "uniform", dict(max_batch=48)),
    ("rtx3090", "mixtral", "uniform", dict(fixed={"batch_size": 64}, objective="latency")),
])
def test_branch_and_bound_equals_scheduling_every_candidate(hw_name, model_name, routing, extra):
    """--verify schedules every feasible candidate; the bounded search finds the same optimum."""
    hw, model, _, _ = _setup(hw_name, model_name, routing)
    result = search(hw, model, make_workload("mtbench"), engine=ENGINE, verify=True, **extra)
    assert result.verified, (result.stats.objective_value, result.verify_objective)
    assert result.stats.candidates_evaluated < result.stats.modes_total


def test_plan_estimate_and_klotskis_own_n():
    """The plan's numbers are estimate()'s for its policy, it keeps the KV share memory
    allows (GPU memory binds, or all of it on the GPU), and Klotski's own n (its
    inequalities at the chosen μ) is reported beside ours."""
    hw, model, options, rates = _setup()
    workload = make_workload("mtbench")
    result = search(hw, model, workload, engine=ENGINE)
    policy = result.best.policy
    again = estimate(hw, model, workload, policy, engine=ENGINE)
    assert again.generation_throughput_tok_s == pytest.approx(result.plan.estimate.generation_throughput_tok_s, rel=1e-12)
    assert policy.attn_on_gpu and policy.ffn_on_gpu
    assert policy.kv_gpu_ratio == 1.0 or again.gpu_peak_bytes == pytest.approx(again.gpu_limit_bytes, rel=1e-9)
    own = expert_level.klotski_own_batches(model, rates, workload, policy, ENGINE)
    assert any(f"Klotski's own planner (inequalities 4-7) at mu={policy.micro_batch_size}: n={own}" in note
               for note in again.notes)
    assert result.stats.klotski_own_num_micro_batches == own


def test_more_host_kv_is_never_faster():
    """Loading more of the cache per batch only adds link time."""
    hw, model, _, rates = _setup()
    workload = make_workload("mtbench")
    from hrm.policy import parse_policy

    steps = [expert_level.klotski_times(model, rates, workload, parse_policy(f"N=256,mu=16,attn=gpu,rc={rc}"),
                                   ENGINE).decode_step_s for rc in (1.0, 0.5, 0.0)]
    assert steps == sorted(steps) and steps[-1] > steps[0]


def test_a_cpu_only_host_is_refused():
    hw, model, _, _ = _setup("cpu-only", "tiny-mixtral")
    with pytest.raises(HRMError, match="no GPU"):
        search(hw, model, make_workload("mtbench"), engine=ENGINE, max_batch=8)


def test_time_limit_returns_the_best_so_far_with_its_gap():
    """Issue 24: Klotski's branch and bound on a many-expert model schedules for minutes; a
    time limit returns the best scheduled candidate, marked not proven optimal, and the best
    bound left is a true bound: the optimum lies between the result and it."""
    # a case whose first scheduled candidate does not prove the optimum (7 of its 36 are
    # scheduled): Mixtral's first one does since the host-KV chain (issue 35)
    hw, model, workload = load_hardware("l4"), load_model("qwen2-57b-a14b"), make_workload()
    pins = dict(limits=memory_limits(hw, DEFAULT_OPTIONS, cpu_mem_gib=512), fixed={"micro_batch_size": 55})
    full = search(hw, model, workload, engine="klotski", top=0, **pins)
    assert full.plan.solver.optimal and full.stats.candidates_evaluated > 1
    cut = search(hw, model, workload, engine="klotski", top=0, time_limit_s=1e-9, **pins)
    assert not cut.plan.solver.optimal and any("search stopped" in n for n in cut.stats.notes)
    best, found = full.best.estimate.generation_throughput_tok_s, cut.best.estimate.generation_throughput_tok_s
    assert found <= best * (1 + 1e-9)
    gap = float(re.search(r"at most ([\d.]+)% better", " ".join(cut.stats.notes)).group(1)) / 100
    assert best <= found * (1 + gap) * (1 + 1e-3)


def test_ctrl_c_returns_the_best_so_far_marked_interrupted(monkeypatch):
    """Issue 24: a long branch and bound can be interrupted cleanly: Ctrl-C after the first
    schedules returns the best scheduled candidate, not proven optimal, with the reason."""
    from conftest import interrupt_klotski_schedule

    # 7 of this space's 36 candidates are scheduled before its optimum is proven (Mixtral's first
    # one proves it since the host-KV chain bound)
    hw, model, workload = load_hardware("l4"), load_model("qwen2-57b-a14b"), make_workload()
    pins = dict(limits=memory_limits(hw, DEFAULT_OPTIONS, cpu_mem_gib=512), fixed={"micro_batch_size": 55})
    full = search(hw, model, workload, engine="klotski", top=0, **pins)
    interrupt_klotski_schedule(monkeypatch, 3)
    assert full.plan.solver.candidates_evaluated >= 3
    cut = search(hw, model, workload, engine="klotski", top=0, **pins)
    assert not cut.plan.solver.optimal
    assert any("stopped on Ctrl-C" in n for n in cut.stats.notes)
    assert cut.best.estimate.generation_throughput_tok_s <= full.best.estimate.generation_throughput_tok_s * (1 + 1e-9)


def test_ctrl_c_before_any_schedule_is_an_interrupt(monkeypatch):
    """With nothing scheduled there is no answer: Ctrl-C stays an interrupt (exit 130)."""
    import solver.expert_level as klotski_search

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(klotski_search, "klotski_times", interrupted)
    with pytest.raises(KeyboardInterrupt):
        search(load_hardware("l4"), load_model("mixtral"), make_workload(), engine="klotski", top=0)


def test_progress_reports_on_stderr_only_when_asked(monkeypatch):
    """Progress: nothing in the first moment or when disabled; then lines with the count."""
    import io

    from hrm import progress as progress_module

    quiet = io.StringIO()
    with progress_module.Progress("step", total=5, stream=quiet, enabled=False) as step:
        step(1)
    assert quiet.getvalue() == ""
    monkeypatch.setattr(progress_module, "PROGRESS_DELAY_S", 0.0)
    monkeypatch.setattr(progress_module, "PROGRESS_EVERY_S", 0.0)
    shown = io.StringIO()
    with progress_module.Progress("step", total=5, stream=shown, enabled=True) as step:
        step(2, "best 3.0 tok/s")
    assert shown.getvalue().startswith("step: 2/5 ") and "best 3.0 tok/s" in shown.getvalue()
    monkeypatch.setenv(progress_module.PROGRESS_ENV, "0")
    assert not progress_module.progress_enabled(io.StringIO())
    monkeypatch.setenv(progress_module.PROGRESS_ENV, "1")
    assert progress_module.progress_enabled(io.StringIO())


@pytest.mark.slow
@pytest.mark.parametrize("hw_name,model_name,mu,max_batch", [
    ("l4", "mixtral", 512, 8192), ("rtx3090", "qwen1.5-moe-a2.7b", 96, 384),
])
def test_host_kv_chain_is_a_bound_on_every_candidate(monkeypatch, hw_name, model_name, mu, max_batch):
    """Issue 35: the tightened bound (the host-KV chain, docs/model.md §5) is a true bound. On
    a space enumerated whole (μ pinned; every n and number of resident layers; ample host
    memory, so most of the KV cache is on the host), every candidate's scheduled decode step
    and prefill are at least its bounds; the chain raises the bound of some candidates above
    the lane bounds alone; and the branch and bound's optimum is the one of scheduling every
    candidate (``verify``), i.e. no bound falls below the optimum it prunes."""
    hw, model, options, _ = _setup(hw_name, model_name)
    rates = rates_from_profile(hw, options, ENGINE.name)
    workload = make_workload("mtbench")
    limits = memory_limits(hw, options, cpu_mem_gib=512)
    request = SearchRequest(problem=make_problem(hw, model, workload, ENGINE, options, limits),
                            objective="generation", solve_for="generation", fixed={"micro_batch_size": mu}, notes=[],
                            max_batch=max_batch, top=0, solver="auto", verify=False, hw_name=None, model_name=None,
                            latency_limits=LatencyLimits(), start=0.0)
    cands = candidates(request, rates)
    assert np.any(cands.kv_ratio < 1) and np.any(cands.n >= 2)
    for i in range(len(cands)):
        times = expert_level.klotski_times(model, rates, workload, cands.policy(i, model.num_moe_layers), ENGINE,
                                           disk_read_s=float(cands.disk_read_s[i]))
        assert times.decode_step_s >= cands.step_lb_s[i] * (1 - 1e-9), cands.policy(i, model.num_moe_layers).short()
        assert times.prefill_s >= cands.prefill_lb_s[i] * (1 - 1e-9)
    monkeypatch.setattr(solver_klotski, "_kv_chain_s", lambda model, per_batch, n, *rest: np.zeros(np.shape(n)))
    lanes_only = candidates(request, rates)
    monkeypatch.undo()
    assert np.all(cands.step_lb_s >= lanes_only.step_lb_s) and np.any(cands.step_lb_s > lanes_only.step_lb_s * 1.01)
    result = search(hw, model, workload, engine=ENGINE, fixed={"micro_batch_size": mu}, max_batch=max_batch,
                    limits=limits, top=0, verify=True)
    assert result.verified, (result.stats.objective_value, result.verify_objective)
