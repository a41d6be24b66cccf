"""Engines (docs/model.md §4.7): ideal reproduces the plain model, mechanisms by hand, properties, MILP
= verifier for every engine, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hrm.cost import costs
from hrm.cost.latency.decode import decode_resources
from hrm.cost.latency.ops import gpu_time_s
from hrm.cost.latency.prefill import prefill_resources
from hrm.machine.achieved import COPY_DRAM_BYTES_PER_BYTE, achieved_rates
from hrm.engines.engine import ENGINES_DIR, IDEAL, Engine, list_engines, load_engine
from hrm.engines.mechanisms import active_mechanisms, without
from hrm.errors import HRMError, InfeasibleError
from hrm.estimate import estimate
from hrm.analysis.explain import explain
from hrm.machine.hardware import load_hardware, parse_hardware
from hrm.cost.memory import memory_limits
from hrm.model.spec import load_model
from hrm.model.options import ModelOptions
from hrm.policy import parse_policy
from hrm.machine.rates import rates_from_profile
from hrm.units import GB
from hrm.workload import make_workload
from solver.search import search

GOLDEN = Path(__file__).parent / "data" / "ideal_golden.json"
SHIPPED = ("ideal", "moe-lightning", "flexgen", "flexgen-cpu-attn", "deepspeed-zero", "hrm-runtime")


# --- the registry ------------------------------------------------------------------------

def test_shipped_engines_load_and_cite_their_sources():
    assert set(SHIPPED) <= set(list_engines())
    for name in list_engines():
        engine = load_engine(name)
        assert engine.name == name
        if name != "ideal":
            assert engine.sources, f"{name} cites no source"
    assert load_engine(str(ENGINES_DIR / "ideal.yaml")) == IDEAL
    assert active_mechanisms(IDEAL) == []
    assert load_engine("hrm-runtime").schedule == "cgopipe"


def test_without_switches_one_mechanism_to_ideal():
    ml = load_engine("moe-lightning")
    off = without(ml, "decode.weight_path")
    assert off.decode.weight_path == "pinned" and off.prefill == ml.prefill
    all_off = ml
    for m in active_mechanisms(ml):
        all_off = without(all_off, m)
    assert active_mechanisms(all_off) == []


def test_bad_engine_inputs_are_one_line_errors(tmp_path):
    with pytest.raises(HRMError, match="unknown engine 'warp'"):
        load_engine("warp")
    bad = tmp_path / "e.yaml"
    bad.write_text("name: x\nschedule: warp\n")
    with pytest.raises(HRMError, match="schedule"):
        load_engine(str(bad))
    bad.write_text("name: x\nmoe_kernel: magic\n")
    with pytest.raises(HRMError, match="moe_kernel"):
        load_engine(str(bad))


@pytest.mark.parametrize("text,needle", [
    ("copy_threads: 1000000", "copy_threads: 1000000 is above the plausible maximum 4096"),
    ("copy_threads: -1", "copy_threads: -1 must be at least 0"),
    ("copy_threads: .nan", "copy_threads: nan is not a finite number"),
    ("copy_threads: 2.5", "copy_threads: expected an integer"),
    ("memory: {gpu_weight_buffer_layers: 1000000}", "gpu_weight_buffer_layers: 1000000 layers is above"),
    ("memory: {pinned_staging_layers: .inf}", "pinned_staging_layers: inf is not a finite number"),
    ("memory: {pinned_staging_layers: true}", "pinned_staging_layers: expected a number, got a boolean"),
    ("policy: {fixed: {kv_gpu_ratio: 5}}", "fixed.kv_gpu_ratio: 5 is above the plausible maximum 1"),
    ("policy: {fixed: {weights_gpu_ratio: -0.1}}", "fixed.weights_gpu_ratio: -0.1 must be at least 0"),
    ("policy: {fixed: {num_micro_batches: 0}}", "fixed.num_micro_batches: 0 must be at least 1"),
    ("policy: {fixed: {num_micro_batches: 0.5}}", "fixed.num_micro_batches: expected an integer"),
])
def test_engine_numbers_are_plausible(tmp_path, text, needle):
    """Every number of an engine YAML is finite and in a named plausible range (one line)."""
    bad = tmp_path / "e.yaml"
    bad.write_text(f"name: x\n{text}\n")
    with pytest.raises(HRMError) as info:
        load_engine(str(bad))
    assert needle in str(info.value) and "\n" not in str(info.value)


# --- ideal = the model before engines existed ------------------------------------------------

def _captured_hardware(name: str, golden: dict):
    """The shipped profile with the fields it had when the golden cases were captured."""
    hw = load_hardware(name)
    for section, fields in golden["profiles_at_capture"].get(name, {}).items():
        hw = hw.model_copy(update={section: getattr(hw, section).model_copy(update=fields)})
    return hw


def test_ideal_reproduces_the_plain_model():
    golden = json.loads(GOLDEN.read_text())
    for case in golden["estimates"]:
        hw, model = _captured_hardware(case["hw"], golden), load_model(case["model"])
        wl = make_workload(case["workload"], gen_len=case["gen"])
        est = estimate(hw, model, wl, parse_policy(case["policy"]), case["schedule"], engine="ideal")
        assert est.generation_throughput_tok_s == pytest.approx(case["gen_tput"], rel=1e-9)
        assert est.decode_layer_latency_s == pytest.approx(case["decode_layer_s"], rel=1e-9)
        assert est.prefill_latency_s == pytest.approx(case["prefill_s"], rel=1e-9)
        assert est.gpu_peak_bytes == pytest.approx(case["gpu_peak"], rel=1e-9)
        assert est.cpu_peak_bytes == pytest.approx(case["cpu_peak"], rel=1e-9)
    for case in golden["searches"]:
        # captured when the search ran over a 15-value μ grid: pinned to the grid's μ it finds
        # the same optimum; free over every μ it can only do better
        args = (_captured_hardware(case["hw"], golden), load_model(case["model"]), make_workload("mtbench"))
        # the host memory the case was captured with (l4.yaml's was 178.8 GiB then, 192 now)
        limits = memory_limits(args[0], cpu_mem_gib=case.get("cpu_mem_gib"))
        mu = parse_policy(case["policy"]).micro_batch_size
        pinned = search(*args, schedule=case["schedule"], engine="ideal", fixed={"micro_batch_size": mu}, top=0,
                        limits=limits)
        assert pinned.best.estimate.generation_throughput_tok_s == pytest.approx(case["gen_tput"], rel=1e-9)
        free = search(*args, schedule=case["schedule"], engine="ideal", top=0, limits=limits)
        assert free.best.estimate.generation_throughput_tok_s >= case["gen_tput"] * (1 - 1e-9)


# --- mechanisms by hand ----------------------------------------------------------------------

def small_host(**link) -> dict:
    """A one-GPU machine with round numbers (GB = 1e9 bytes)."""
    return {
        "name": "hand", "source": {"kind": "datasheet"},
        "gpu": {"name": "g", "memory_gib": 16, "memory_bandwidth_gbps": 100, "tflops": {"fp32": 10, "fp16": 40}},
        "cpu": {"name": "c", "cores": 4, "memory_gib": 64, "memory_bandwidth_gbps": 100, "tflops": {"fp32": 1},
                "memcpy_one_thread_gbps": 10, "memcpy_all_threads_gbps": 30},
        "link": {"h2d_gbps": 10, "d2h_gbps": 10, "h2d_pageable_gbps": 4, **link},
    }


def test_staging_copy_and_host_dram_lane_by_hand():
    hw = parse_hardware(small_host())
    model = load_model("tiny-mixtral")
    rates = rates_from_profile(hw, ModelOptions().for_model(model))
    engine = Engine(name="staged", decode={"weight_path": "pageable-staged"}, host_dram=True, copy_threads=2)
    lanes = decode_resources(model, rates, 4, 100, False, True, True, engine)
    layer = costs.layer_expert_bytes(model)
    copy_s = layer / (2 * 10 * GB)                       # 2 threads × 10 GB/s, under the 30 GB/s cap
    assert float(lanes["copy"].per_layer_offloaded_weights_s) == pytest.approx(copy_s)
    assert float(lanes["cpu"].per_layer_offloaded_weights_s) == pytest.approx(copy_s * 2 / 4)  # 2 of 4 cores
    assert float(lanes["h2d"].per_layer_offloaded_weights_s) == pytest.approx(layer / (10 * GB))
    # DRAM: copy reads, writes and write-allocates each byte (3), then the DMA reads it (1)
    assert float(lanes["dram"].per_layer_offloaded_weights_s) == pytest.approx(layer * 4 / (100 * GB))
    assert COPY_DRAM_BYTES_PER_BYTE == 3
    # per micro-batch: CPU attention's KV/activation reads + D1 QKV written + D2 hidden read
    ops = costs.decode_layer_ops(model, 4, 100)
    ab = 2.0
    dma = 4 * costs.qkv_width(model) * ab + 4 * model.attn_out_dim * ab
    assert float(lanes["dram"].per_micro_batch_s) == pytest.approx((float(ops.attention.bytes) + dma) / (100 * GB))
    # ideal has neither the copy nor the DRAM lane
    plain = decode_resources(model, rates, 4, 100, False, True, True, IDEAL)
    assert "copy" not in plain and "dram" not in plain


def test_two_ranks_sharing_one_host_by_hand():
    data = small_host(gpus_per_pcie_switch=2, p2p=False)
    data["gpu"].update(count=2, gpu_to_gpu_gbps=50)
    hw = parse_hardware(data)
    model = load_model("tiny-mixtral")
    rates = rates_from_profile(hw, ModelOptions().for_model(model))
    shared = Engine(name="tp", tensor_parallel={"host_shared": True, "allreduce": "nccl"})
    layer = costs.layer_expert_bytes(model)
    ideal = decode_resources(model, rates, 8, 50, False, True, True, IDEAL)
    lanes = decode_resources(model, rates, 8, 50, False, True, True, shared)
    # ideal: each GPU its own 10 GB/s link; shared: both behind one switch, one uplink
    assert float(ideal["h2d"].per_layer_offloaded_weights_s) == pytest.approx(layer / (20 * GB))
    assert float(lanes["h2d"].per_layer_offloaded_weights_s) == pytest.approx(layer / (10 * GB))
    # all-reduce without P2P: per GPU 2 all-reduces × 2(p−1)/p × payload, written to and read
    # from host memory over its share of the one uplink (5 GB/s each way per GPU)
    payload = 8 * model.hidden_size * 2.0
    per_gpu = 2 * 2 * (2 - 1) / 2 * payload
    via_host = per_gpu / (5 * GB) + per_gpu / (5 * GB)
    over_link = per_gpu / (50 * GB)
    gpu_only = decode_resources(model, rates, 8, 50, False, True, True,
                                        Engine(name="x", tensor_parallel={"host_shared": True}))
    # gpu_only charges the all-reduce over the 50 GB/s GPU link, as ideal does
    assert float(lanes["gpu"].per_micro_batch_s - gpu_only["gpu"].per_micro_batch_s) == pytest.approx(
        via_host - over_link)
    assert float(ideal["gpu"].per_micro_batch_s) == pytest.approx(float(gpu_only["gpu"].per_micro_batch_s))
    # the host-staged traffic also loads both links (aggregate bytes over the shared uplink)
    assert float(lanes["h2d"].per_micro_batch_s - gpu_only["h2d"].per_micro_batch_s) == pytest.approx(2 * per_gpu / (10 * GB))
    # the CPU is one CPU: its attention lane is the same with one or two GPUs
    assert float(lanes["cpu"].per_micro_batch_s) == pytest.approx(float(ideal["cpu"].per_micro_batch_s))


def test_pageable_prefill_weight_load_by_hand():
    hw = parse_hardware(small_host())
    model = load_model("tiny-mixtral")
    rates = rates_from_profile(hw, ModelOptions().for_model(model))
    engine = Engine(name="p", prefill={"weight_path": "pageable-driver", "weights_overlap": "last-micro-batch-moe",
                                       "kv_cache": "pageable", "kv_reserved_gen_slots": True})
    lanes = prefill_resources(model, rates, 2, 64, True, engine, gen_len=16)
    layer = costs.layer_expert_bytes(model)
    assert float(lanes["h2d"].per_layer_offloaded_weights_s) == pytest.approx(layer / (4 * GB))  # pageable 4 GB/s
    chain = lanes["gpu+weights"]
    ops = costs.prefill_layer_ops(model, 2, 64)
    rows = 128 * model.top_k / costs.expected_distinct_experts(model, 128)
    moe_s = gpu_time_s(ops.ffn, rates, rows, engine, kernel=True)
    assert float(chain.per_layer_s) == pytest.approx(-float(moe_s))  # overlaps only the last micro-batch's MoE
    assert float(chain.per_layer_offloaded_weights_s) == pytest.approx(layer / (4 * GB))
    # pageable KV write-back of prompt + reserved slots blocks the GPU chain (d2h pageable, no measured
    # rate: the driver stages it with one thread, 1 / (1/10 + 1/10 GB/s) = 5 GB/s)
    kv = 2 * (64 + 16) * costs.kv_bytes_per_token(model)
    assert float(lanes["gpu"].per_micro_batch_kv_cpu_s) == pytest.approx(kv / (5 * GB))
    assert float(lanes["d2h"].per_micro_batch_kv_cpu_s) == 0.0


def test_named_defaults_are_reported():
    hw = load_hardware("l4")
    ach = achieved_rates(hw)
    assert "cpu.memcpy_one_thread_gbps" in ach.defaulted and "link.h2d_pageable_gbps" in ach.defaulted
    # no measured pageable rate: one driver thread stages it (10 GB/s default), then the 17.18 GB/s DMA
    assert ach.h2d_pageable_bytes_s == pytest.approx(GB / (1 / 17.18 + 1 / 10.0), rel=1e-12)
    assert "link.h2d_pageable_gbps" not in achieved_rates(load_hardware("h100")).defaulted  # measured there
    assert ach.memcpy_all_threads_bytes_s == pytest.approx(hw.cpu.memory_bandwidth_gbps * GB / 3)
    est = estimate(hw, load_model("mixtral"), make_workload("mtbench"), parse_policy("N=256,mu=64,attn=cpu"),
                   engine="moe-lightning")
    assert "cpu.memcpy_one_thread_gbps" in est.defaulted
    assert estimate(hw, load_model("mixtral"), make_workload("mtbench"), parse_policy("N=256,mu=64,attn=cpu"), engine="ideal").defaulted == ()


# --- properties --------------------------------------------------------------------------------

POLICIES = {"cpu": "N=512,mu=128,attn=cpu,ffn=gpu,rw=0.25", "gpu": "N=256,mu=64,attn=gpu,ffn=gpu,rw=0.25,rc=0.1"}


def _tput(hw_data: dict, engine: str, policy: str) -> float:
    hw = parse_hardware(hw_data)
    return estimate(hw, load_model("mixtral"), make_workload("mtbench", gen_len=16), parse_policy(policy),
                    engine=engine).generation_throughput_tok_s


def _policy_for(engine: str) -> str:
    e = load_engine(engine)
    if e.policy.fixed:
        return "N=64,mu=64,n=1,attn=gpu,ffn=gpu,rw=0,rc=1"
    return POLICIES["gpu"] if "cpu" not in e.policy.attention else POLICIES["cpu"]


@settings(max_examples=12, deadline=None)
@given(engine=st.sampled_from(["moe-lightning", "flexgen", "flexgen-cpu-attn", "deepspeed-zero"]),
       factor=st.floats(0.1, 0.95), cores=st.integers(1, 23), eff=st.floats(0.2, 0.95))
def test_slower_host_or_gpu_never_raises_throughput(engine, factor, cores, eff):
    base = load_hardware("2xt4").model_dump(mode="json", exclude_none=True)
    base["cpu"].update(memcpy_one_thread_gbps=10.0, memcpy_all_threads_gbps=30.0)
    base["gpu"].update(gemm_efficiency=0.95, memory_stream_efficiency=0.95)
    policy = _policy_for(engine)
    ref = _tput(base, engine, policy)
    for change in (
        lambda d: d["cpu"].update(memcpy_one_thread_gbps=10.0 * factor, memcpy_all_threads_gbps=30.0 * factor),
        lambda d: d["gpu"].update(gemm_efficiency=eff, memory_stream_efficiency=eff),
        lambda d: d["cpu"].update(cores=cores),
        lambda d: d["link"].update(gpus_per_pcie_switch=2),
    ):
        data = json.loads(json.dumps(base))
        change(data)
        assert _tput(data, engine, policy) <= ref * (1 + 1e-9)


@settings(max_examples=15, deadline=None)
@given(hw=st.sampled_from(["t4", "l4", "2xt4", "4xt4", "h100"]), engine=st.sampled_from(SHIPPED[1:]),
       mu=st.sampled_from([8, 32, 128]), n=st.integers(1, 8), rw=st.floats(0, 1), gen=st.sampled_from([8, 64]))
def test_ideal_bounds_every_engine_on_the_same_policy(hw, engine, mu, n, rw, gen):
    e = load_engine(engine)
    attn = "gpu" if "cpu" not in e.policy.attention else "cpu"
    if e.policy.fixed:
        n, rw, rc = 1, 0.0, 1.0
    else:
        rc = 0.0
    policy = parse_policy(f"mu={mu},n={n},attn={attn},ffn=gpu,rw={rw},rc={rc}")
    machine, model, wl = load_hardware(hw), load_model("mixtral"), make_workload("mtbench", gen_len=gen)
    ideal = estimate(machine, model, wl, policy, e.schedule, engine="ideal")
    real = estimate(machine, model, wl, policy, engine=e)
    assert real.generation_throughput_tok_s <= ideal.generation_throughput_tok_s * (1 + 1e-9)


# --- the search ----------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("engine", SHIPPED)
@pytest.mark.parametrize("hw,model,gen", [("l4", "mixtral", 16), ("2xt4", "mixtral", 8)])
def test_milp_equals_exhaustive_for_every_engine(engine, hw, model, gen):
    res = search(load_hardware(hw), load_model(model), make_workload("mtbench", gen_len=gen), engine=engine,
                 verify=True, top=0)
    assert res.verified, (res.stats.objective_value, res.verify_objective)
    # an engine that hands a tier to another file (flexgen's --cpu-cache-compute) may keep it
    assert res.plan.engine in (engine, *load_engine(engine).policy.attention_engines.values())
    e = load_engine(res.plan.engine)
    for key, value in e.policy.fixed.items():
        assert getattr(res.best.policy, key) == pytest.approx(value)


def test_whole_expert_granularity_and_snapped_fix():
    model = load_model("mixtral")
    res = search(load_hardware("a100-80g"), model, make_workload("mtbench", gen_len=16), engine="moe-lightning",
                 fixed={"weights_gpu_ratio": 0.3}, top=0)
    assert res.best.policy.weights_gpu_ratio == pytest.approx(2 / 8)  # int(8 × 0.3) = 2 experts per layer
    assert any("snapped" in note for note in res.stats.notes)
    free = search(load_hardware("a100-80g"), model, make_workload("mtbench", gen_len=16), engine="moe-lightning", top=0)
    assert (free.best.policy.weights_gpu_ratio * 8) == pytest.approx(round(free.best.policy.weights_gpu_ratio * 8))


def test_infeasible_names_the_limit_that_binds():
    # the report: GPU memory is at 106% with this pinned policy, CPU at 78%
    hw, model = load_hardware("t4"), load_model("mixtral")
    wl = make_workload(None, prompt_len=77, max_prompt_len=418, gen_len=128, padding=True)
    limits = memory_limits(hw, ModelOptions(), cpu_mem_gib=192)
    fixed = {"micro_batch_size": 36, "num_micro_batches": 14, "attn_on_gpu": True, "ffn_on_gpu": True,
             "kv_gpu_ratio": 0.0, "weights_gpu_ratio": 0.04}
    with pytest.raises(InfeasibleError, match="GPU memory binds"):
        search(hw, model, wl, schedule="flexgen", fixed=fixed, limits=limits)
    # FlexGen itself splits all weights by --percent: the policy fits its layout at the
    # midpoint rule's placement just below (2.8e-6 of every layer: only the norms on the GPU)
    res = search(hw, model, wl, fixed={**fixed, "weights_gpu_ratio": 2.8223553119549327e-06}, limits=limits,
                 engine="flexgen", top=0)
    assert res.best.estimate.feasible


def test_explain_costs_and_gap():
    hw, model, wl = load_hardware("l4"), load_model("mixtral"), make_workload("mtbench", gen_len=32)
    policy = parse_policy("N=1024,mu=128,attn=cpu,ffn=gpu,rw=0.125")
    engine = load_engine("moe-lightning")
    report = explain(hw, model, wl, policy, engine, ModelOptions(), memory_limits(hw))
    ideal = estimate(hw, model, wl, policy, engine.schedule, engine="ideal")
    assert report.ideal_estimate.total_time_s == pytest.approx(ideal.total_time_s)
    assert report.gap_s > 0
    assert {c.mechanism for c in report.costs} == set(active_mechanisms(engine))
    assert all(c.total_s >= -1e-9 for c in report.costs)
    # the share of the gap is additive: the steps sum to T(engine) - T(ideal), the shares to 1
    base = estimate(hw, model, wl, policy, engine=engine)
    assert sum(c.step_s for c in report.costs) == pytest.approx(base.total_time_s - ideal.total_time_s, rel=1e-9)
    assert sum(c.share_of_gap for c in report.costs) == pytest.approx(1.0, rel=1e-9)


@pytest.mark.parametrize("hw_name, engine_name, policy", [
    ("t4", "flexgen", "N=924,mu=28,attn=gpu,ffn=gpu,rw=0,rc=0.08525"),
    ("l4", "deepspeed-zero", "N=369,mu=369,attn=gpu,ffn=gpu,rw=0,rc=1"),
    ("2xt4", "moe-lightning", "N=8918,mu=637,attn=cpu,ffn=gpu,rw=0.125,rc=0"),
])
def test_explain_shares_add_up_where_alone_costs_do_not(hw_name, engine_name, policy):
    """The engines_bench cases whose alone costs summed past the gap (issue 35: 141%): the
    first step is the largest alone cost, and the shares still add to 100%."""
    hw, model, wl = load_hardware(hw_name), load_model("mixtral"), make_workload("mtbench")
    engine = load_engine(engine_name)
    report = explain(hw, model, wl, parse_policy(policy), engine, ModelOptions(), memory_limits(hw))
    assert sum(c.share_of_gap for c in report.costs) == pytest.approx(1.0, rel=1e-9)
    first = report.costs[0]
    assert first.step_s == pytest.approx(first.total_s, rel=1e-9)  # nothing switched off before it
    assert first.total_s == max(c.total_s for c in report.costs)


# --- CLI -------------------------------------------------------------------------------------------

def _cli(*args):
    return subprocess.run([sys.executable, "-m", "hrm_cli", *args], capture_output=True, text=True, timeout=300)


def test_cli_engine_flags():
    out = _cli("estimate", "--hw", "l4", "--model", "mixtral", "--engine", "moe-lightning", "--policy",
               "N=512,mu=128,attn=cpu,rw=0.2", "--explain", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["engine"] == "moe-lightning" and data["policy"]["weights_gpu_ratio"] == 0.125
    assert data["explain"]["mechanisms"]
    bad = _cli("search", "--hw", "l4", "--model", "mixtral", "--engine", "warp")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    clash = _cli("search", "--hw", "l4", "--model", "mixtral", "--engine", "moe-lightning", "--schedule", "flexgen")
    assert clash.returncode == 2 and "schedule" in clash.stderr
    comp = _cli("search", "--hw", "t4", "--model", "mixtral", "--gen-len", "16", "--compare", "--json")
    assert comp.returncode == 0, comp.stderr
    listed = set(json.loads(comp.stdout))
    assert set(SHIPPED) - {"hrm-runtime"} <= listed and not any(name.startswith("hrm-runtime") for name in listed)


def test_hrm_runtime_engine_predicts_what_validate_predicted_before():
    """hrm validate predicts with the hrm-runtime engine: the runtime runs the plain model's
    mechanisms (pinned pages, CGOPipe, measured dispatch), so on a measured CPU-only profile
    its predictions equal ideal's and the validation scores cannot move."""
    from hrm.machine.hardware import Dispatch

    data = load_hardware("cpu-only").model_dump(mode="json", exclude_none=True)
    data["cpu"]["dispatch"] = Dispatch(task_s=2e-5, copy_s=1e-5, expert_s=3e-5).model_dump()
    hw, model = parse_hardware(data), load_model("tiny-mixtral")
    assert active_mechanisms(load_engine("hrm-runtime")) == []
    for text in ("N=8,mu=4,attn=cpu,ffn=gpu,rw=0.5", "N=8,mu=2,attn=gpu,ffn=gpu,rw=0,rc=0.5", "N=4,mu=4,attn=cpu,ffn=cpu"):
        policy = parse_policy(text)
        wl = make_workload(None, prompt_len=24, gen_len=8)
        a = estimate(hw, model, wl, policy, engine="hrm-runtime")
        b = estimate(hw, model, wl, policy, "cgopipe")
        assert a.decode_layer_latency_s == b.decode_layer_latency_s
        assert a.generation_throughput_tok_s == b.generation_throughput_tok_s


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["ideal", "moe-lightning", "flexgen"])
def test_gen_len_one_is_prefill_only(engine):
    res = search(load_hardware("l4"), load_model("mixtral"), make_workload("mtbench", gen_len=1), engine=engine,
                 verify=True, top=0)
    assert res.verified
    est = res.best.estimate
    assert est.decode_time_s == 0.0
    assert est.generation_throughput_tok_s == pytest.approx(res.best.policy.batch_size / est.prefill_latency_s)


def test_plan_of_an_engine_file_carries_its_definition(tmp_path):
    """A plan made with ``--engine FILE.yaml`` embeds the engine, so it loads, shows and
    re-estimates without the file; a shipped engine stays a name; an edited definition
    makes the recorded estimate stale and the plan is refused."""
    from hrm.engines.engine import is_shipped
    from hrm.plan import load_plan, resolve_plan_engine, save_plan

    hw, model, wl = load_hardware("l4"), load_model("mixtral"), make_workload("mtbench", gen_len=32)
    data = (ENGINES_DIR / "flexgen.yaml").read_text().replace("name: flexgen", "name: my-flexgen")
    engine_file = tmp_path / "my.yaml"
    engine_file.write_text(data)
    custom = load_engine(str(engine_file))
    assert not is_shipped(custom) and is_shipped(load_engine("flexgen")) and is_shipped(IDEAL.with_schedule("flexgen"))
    plan = search(hw, model, wl, engine=str(engine_file), top=0, hw_name="l4", model_name="mixtral",
                  fixed={"attn_on_gpu": True}).plan  # its own tier (attn=cpu is flexgen-cpu-attn's)
    assert plan.engine == "my-flexgen" and plan.engine_definition == custom
    engine_file.unlink()  # the plan no longer needs the file
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    loaded = load_plan(path)
    assert resolve_plan_engine(loaded) == custom
    shipped = search(hw, model, wl, engine="flexgen", top=0).plan
    assert shipped.engine_definition is None
    edited = json.loads(path.read_text())
    edited["engine_definition"]["decode"]["weight_path"] = "pinned"  # a faster link than the file says
    path.write_text(json.dumps(edited))
    with pytest.raises(HRMError, match="stale|estimate"):
        load_plan(path)
    edited["engine_definition"]["name"] = "other"
    path.write_text(json.dumps(edited))
    with pytest.raises(HRMError, match="engine_definition.name"):
        load_plan(path)


def test_one_default_engine_for_the_api_the_cli_and_sweeps():
    """Issue 35: one default engine (hrm.engines.engine.DEFAULT_ENGINE), resolved in one place, for the
    API (search, estimate), the CLI's parsed flags (every subcommand) and a sweep grid; ideal
    on a CPU-only profile and with a schedule (ideal's lane structure)."""
    from argparse import Namespace

    from hrm.engines.engine import DEFAULT_ENGINE, resolve_engine
    from hrm_cli.common import engine_from_args
    from solver.grid import SweepGrid

    l4, cpu = load_hardware("l4"), load_hardware("cpu-only")
    assert DEFAULT_ENGINE == "moe-lightning"
    assert resolve_engine(None, None, l4).name == DEFAULT_ENGINE
    assert resolve_engine(None, None, cpu).name == "ideal"
    assert resolve_engine(None, "sequential", l4) == IDEAL.with_schedule("sequential")
    assert engine_from_args(Namespace(engine=None, schedule=None), l4).name == DEFAULT_ENGINE
    assert engine_from_args(Namespace(engine=None, schedule=None), cpu).name == "ideal"
    assert SweepGrid.model_validate({"hardware": ["l4"], "models": ["mixtral"]}).engines == [DEFAULT_ENGINE]
    model, workload = load_model("mixtral"), make_workload("mtbench")
    policy = parse_policy("N=64,mu=16,n=4,attn=cpu,ffn=gpu,rw=0,rc=0")
    default = estimate(l4, model, workload, policy)
    named = estimate(l4, model, workload, policy, engine=DEFAULT_ENGINE)
    assert default.engine == DEFAULT_ENGINE and default.generation_throughput_tok_s == named.generation_throughput_tok_s
    assert estimate(l4, model, workload, policy, engine="ideal").generation_throughput_tok_s \
        > default.generation_throughput_tok_s  # ideal is the bound, not what the default plans
    with pytest.raises(HRMError, match="moe-lightning runs attention on the CPU"):
        estimate(l4, model, workload, parse_policy("N=64,mu=16,n=4,attn=gpu,ffn=gpu,rw=0,rc=1"))
