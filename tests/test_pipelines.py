"""Pipelines as first-class objects (issue 22): one protocol (times, memory, timeline, the
engine fields modelled), a registry, every engine field modelled or refused, and the
expert-level pipeline on the lanes' mechanism functions (weight path, KV path, host DRAM,
per-step sync, expert buffers)."""

from __future__ import annotations

import pytest

import hrm.pipelines.expert_level_tasks as klotski
import hrm.pipelines.expert_level as expert_level
from hrm.cost import costs
from hrm.cost.latency.transfers import weight_transfer_s
from hrm.engines.engine import (IDENTITY_FIELDS, IDEAL, LIMIT_FIELDS, Engine, _leaf_fields, ideal_field_values,
                               list_engines, load_engine)
from hrm.engines.mechanisms import MECHANISMS
from hrm.errors import HRMError
from hrm.estimate import estimate, estimate_problem
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.model.options import DEFAULT_OPTIONS
from hrm.pipelines import PIPELINES, decode_timeline, pipeline_of
from hrm.policy import parse_policy
from hrm.problem import make_problem
from hrm.machine.rates import rates_from_profile
from hrm.engines.schedules import PIPELINE_FIELDS, SCHEDULES
from hrm.cost.throughput import throughput_tok_s
from hrm.units import dtype_bytes
from hrm.workload import make_workload, mean_decode_context

from conftest import call

KLOTSKI = load_engine("klotski")
POLICY = "N=64,mu=16,n=4,attn=gpu,ffn=gpu,rw=0,rc=0.5"


def _klotski(**change) -> Engine:
    return Engine.model_validate({**KLOTSKI.model_dump(), **change})


def _host(dram_gbps: float | None = None):
    """rtx3090's profile, its host DRAM at ``dram_gbps`` when given (a host whose DRAM binds)."""
    hw = load_hardware("rtx3090")
    if dram_gbps is None:
        return hw
    return hw.model_copy(update={"cpu": hw.cpu.model_copy(update={"memory_bandwidth_gbps": dram_gbps})})


def _case(engine: Engine, hw=None, policy: str = POLICY):
    return estimate(hw or _host(), load_model("mixtral"), make_workload("mtbench"), parse_policy(policy), engine=engine)


def test_registry_has_a_pipeline_for_every_schedule_and_the_fields_it_models():
    assert set(PIPELINES) == {s.pipeline for s in SCHEDULES.values()} == set(PIPELINE_FIELDS)
    for name, pipeline in PIPELINES.items():
        assert pipeline.name == name and pipeline.fields is PIPELINE_FIELDS[name]


def test_every_shipped_engine_is_modelled_by_its_pipeline():
    for name in list_engines():
        engine = load_engine(name)
        fields = pipeline_of(engine).fields
        defaults = ideal_field_values()
        for field, value in _leaf_fields(engine):
            if field.split(".")[0] not in IDENTITY_FIELDS and field not in LIMIT_FIELDS and value != defaults[field]:
                assert fields.refusal(field, value) is None, (name, field)


def test_explain_covers_every_mechanism_field():
    """Every engine field that is not identity or policy space is a mechanism --explain can
    switch off."""
    fields = {f for f, _ in _leaf_fields(IDEAL) if f.split(".")[0] not in IDENTITY_FIELDS and f not in LIMIT_FIELDS}
    assert fields == set(MECHANISMS)


@pytest.mark.parametrize("change,field", [
    ({"moe_reads_all_experts": True}, "moe_reads_all_experts"),
    ({"sync": "per-micro-batch"}, "sync"),
    ({"offloaded_weights": "all"}, "offloaded_weights"),
    ({"static_experts": "whole-experts-per-layer"}, "static_experts"),
    ({"memory": {"gpu_weight_buffer_layers": 0.5}}, "memory.gpu_weight_buffer_layers"),
    ({"tensor_parallel": {"allreduce": "nccl"}}, "tensor_parallel.allreduce"),
])
def test_an_unmodelled_field_on_the_expert_level_pipeline_is_refused(tmp_path, capsys, change, field):
    """An engine file on the klotski schedule that sets a field its pipeline ignores: one
    line naming the file and the field, exit 2."""
    import yaml

    data = {**KLOTSKI.model_dump(), **change}
    if "memory" in change:
        data["memory"] = {**KLOTSKI.memory.model_dump(), **change["memory"]}
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({**data, "name": "mine"}))
    with pytest.raises(HRMError, match=field.replace(".", r"\.")):
        load_engine(str(path))
    code, out, err = call(capsys, "estimate", "--hw", "rtx3090.yaml", "--model", "mixtral", "--engine", path,
                          "--policy", POLICY)
    assert code == 2 and field in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("change,mechanism,dram_gbps", [
    # one copy thread (10 GB/s of memcpy on rtx3090) stages slower than the 26 GB/s link
    ({"decode": {"weight_path": "pageable-staged", "kv_cache": "pageable"}, "copy_threads": 1}, "copy_threads",
     None),
    ({"decode": {"weight_path": "pageable-driver", "kv_cache": "pageable"}}, "decode.weight_path", None),
    # host DRAM binds only on a host whose DRAM is slower than the traffic: 20 GB/s here
    ({"host_dram": True}, "host_dram", 20.0),
    ({"sync": "per-step"}, "sync", None),
])
def test_modelled_mechanisms_change_the_klotski_answer_and_explain_reports_them(change, mechanism, dram_gbps):
    """What the issue measured as ignored (the same 11.168 tok/s whatever the file said):
    each mechanism now costs time where its resource binds, and --explain charges it."""
    from hrm.analysis.explain import explain

    engine, hw = _klotski(**change), _host(dram_gbps)
    slower, base = _case(engine, hw), _case(KLOTSKI, hw)
    assert slower.generation_throughput_tok_s < base.generation_throughput_tok_s * (1 - 1e-6)
    model = load_model("mixtral")
    report = explain(hw, model, make_workload("mtbench"), parse_policy(POLICY), engine, DEFAULT_OPTIONS,
                     make_problem(hw, model, make_workload("mtbench")).limits)
    cost = {c.mechanism: c.total_s for c in report.costs}
    assert cost[mechanism] > 0


def test_staged_weight_path_is_the_lanes_weight_path():
    """An expert's load on the expert-level pipeline is the lanes' weight transfer of its bytes."""
    hw, model = load_hardware("rtx3090"), load_model("mixtral")
    rates = rates_from_profile(hw, DEFAULT_OPTIONS.for_model(model))
    for path in ("pinned", "pageable-staged", "pageable-driver"):
        engine = _klotski(decode={"weight_path": path, "kv_cache": "pageable"})
        expected = weight_transfer_s(rates, engine, path, costs.expert_bytes(model))["h2d"]
        expected += rates.op_costs.gpu_op_s  # one copy's launch (klotski.yaml launches; hrm.machine.launches)
        assert klotski.expert_load_s(model, rates, engine) == pytest.approx(expected, rel=1e-15)


def test_host_dram_is_a_capacity_bound_of_the_layer_by_hand():
    """host_dram on, experts streamed over the pinned path, KV on the GPU: the layer's DRAM
    seconds are the bytes it loads (gate, attention weights, its experts) read once, over
    the host's bandwidth; the period is at least that."""
    hw, model = load_hardware("rtx3090"), load_model("mixtral")
    rates = rates_from_profile(hw, DEFAULT_OPTIONS.for_model(model))
    engine = _klotski(host_dram=True)
    layer = klotski.klotski_layer(model, rates, 16, 300.0, 4, engine=engine, kv_gpu_ratio=1.0)
    wb = dtype_bytes(model.weight_dtype)
    used = len(layer.hot) + len(layer.cold)
    loaded = costs.moe_layer_static_params(model) * wb + used * costs.expert_bytes(model)
    assert dict(layer.capacity_s)["dram"] == pytest.approx(loaded / rates.cpu_bandwidth_bytes_s, rel=1e-12)
    scheduled = klotski.schedule_layer(layer)
    assert scheduled.period_s >= dict(layer.capacity_s)["dram"]
    assert scheduled.resource_busy_s["dram"] == dict(layer.capacity_s)["dram"]


def test_per_step_sync_adds_the_first_layers_fill_per_step():
    """sync: per-step: every decode step starts with an empty pipeline, so the step is longer
    by the first layer's makespan from empty less its steady-state period."""
    hw, model = load_hardware("rtx3090"), load_model("mixtral")
    rates = rates_from_profile(hw, DEFAULT_OPTIONS.for_model(model))
    workload, policy = make_workload("mtbench"), parse_policy(POLICY)
    synced = expert_level.klotski_times(model, rates, workload, policy, _klotski(sync="per-step"))
    free = expert_level.klotski_times(model, rates, workload, policy, KLOTSKI)
    layer = klotski.klotski_layer(model, rates, 16, mean_decode_context(workload), 4, engine=KLOTSKI,
                                  kv_gpu_ratio=0.5, dense_resident=True)
    fill = klotski.schedule_layer(layer, layers=1).period_s - klotski.schedule_layer(layer).period_s
    assert fill > 0
    assert synced.decode_step_s - free.decode_step_s == pytest.approx(fill, rel=1e-9)
    assert synced.prefill_s == free.prefill_s


def test_expert_level_memory_honours_the_engine_buffers_by_hand():
    """gpu_weight_buffer_layers, pinned_staging_layers and cpu_holds_all_experts: each adds
    its layers of experts to its tier, as the lanes' memory forms do."""
    model, workload = load_model("tiny-mixtral"), make_workload(None, prompt_len=10, gen_len=5)
    layer = costs.layer_expert_bytes(model)
    base = expert_level.klotski_memory(model, workload, 2, 6, 1, engine=KLOTSKI)
    engine = _klotski(memory={"gpu_weight_buffer_layers": 2, "pinned_staging_layers": 1, "cpu_holds_all_experts": True})
    other = expert_level.klotski_memory(model, workload, 2, 6, 1, engine=engine)
    assert float(other.gpu_bytes(0.3) - base.gpu_bytes(0.3)) == pytest.approx(layer, rel=1e-12)
    assert float(other.cpu_bytes(0.3) - base.cpu_bytes(0.3)) == pytest.approx(layer + 1 * layer, rel=1e-12)


def test_double_buffered_experts_schedule_no_slower():
    """Two expert buffers let the next layer's prefetch start before this layer's last
    expert: the period is never longer than with one."""
    hw, model = load_hardware("rtx3090"), load_model("mixtral")
    rates = rates_from_profile(hw, DEFAULT_OPTIONS.for_model(model))
    layer = klotski.klotski_layer(model, rates, 16, 300.0, 8, engine=KLOTSKI, kv_gpu_ratio=0.5, dense_resident=True)
    one = klotski.schedule_layer(layer, expert_buffers=1).period_s
    assert klotski.schedule_layer(layer, expert_buffers=2).period_s <= one + 1e-12


@pytest.mark.parametrize("engine_name,hw_name", [("ideal", "l4"), ("flexgen", "t4"), ("klotski", "rtx3090"),
                                                 ("llama.cpp", "l4")])
def test_estimate_is_the_pipelines_times_and_memory(engine_name, hw_name):
    """The estimate of every pipeline is its times and memory, throughput by hrm.cost.throughput."""
    hw, model, workload = load_hardware(hw_name), load_model("mixtral"), make_workload("mtbench")
    engine = load_engine(engine_name)
    policy = parse_policy("N=64,mu=16,n=4,attn=gpu,ffn=gpu,rw=0,rc=1")
    if engine.policy.fixed.get("num_micro_batches") == 1:
        policy = parse_policy("N=16,mu=16,n=1,attn=gpu,ffn=gpu,rw=0,rc=1")
    problem = make_problem(hw, model, workload, engine)
    result = estimate_problem(problem, policy)
    pipeline = pipeline_of(engine)
    times, memory = pipeline.times(problem, result.policy), pipeline.memory(problem, result.policy)
    assert result.generation_throughput_tok_s == throughput_tok_s(policy.batch_size, workload.gen_len,
                                                                   times.prefill_s, times.decode_s)
    assert result.decode_throughput_tok_s == pytest.approx(policy.batch_size * (workload.gen_len - 1) / times.decode_s)
    assert (result.gpu_peak_bytes, result.cpu_peak_bytes) == (memory.gpu_peak_bytes, memory.cpu_peak_bytes)
    timeline = decode_timeline(problem, result.policy, context=mean_decode_context(workload))
    assert timeline.layer_period_s > 0
