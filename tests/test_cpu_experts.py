"""CPU-computed experts per layer (issue 13, item 4): the ``llama.cpp`` engine keeps the experts
of the first N MoE layers in host memory and runs them on the CPU (``--n-cpu-moe N``); a
micro-batch of >= 32 tokens instead has the experts it uses copied to the GPU (op offload).
The policy's r_w is the share of layers whose experts stay on the GPU; the search chooses it.

Checks derived independently of the engine code: the time is the layer-weighted mix of an
all-GPU-experts layer and an all-CPU-experts layer (one lane, no overlap), the CPU endpoint
equals the plain ffn=cpu placement of the same engine, the op-offload copy is the expected
distinct experts' bytes over the link, and the MILP and enumeration agree with the search.
"""

from __future__ import annotations

import numpy as np
import pytest

from hrm.cost import costs
from hrm.cost.latency.decode import decode_resources
from hrm.cost.latency.transfers import link_bytes_s
from hrm.engines.engine import Engine, load_engine
from hrm.estimate import estimate
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.model.options import DEFAULT_OPTIONS
from hrm.policy import Policy
from hrm.machine.rates import rates_from_profile
from hrm.workload import make_workload
from solver.search import search

WL = make_workload("mtbench", gen_len=16)


def llama() -> Engine:
    return load_engine("llama.cpp")


def with_fields(engine: Engine, **update) -> Engine:
    return Engine.model_validate({**engine.model_dump(), **update})


def decode_s(hw, model, engine, policy) -> float:
    return estimate(hw, model, WL, policy, engine=engine).decode_time_s


def policy(n_seqs: int, rw: float, ffn: bool = True) -> Policy:
    return Policy(batch_size=n_seqs, micro_batch_size=n_seqs, num_micro_batches=1, attn_on_gpu=True, ffn_on_gpu=ffn,
                  weights_gpu_ratio=rw if ffn else 0.0, kv_gpu_ratio=1.0)


@pytest.mark.parametrize("n_seqs", [1, 8, 31, 32, 64])
def test_time_is_the_layer_weighted_mix_of_the_two_layer_kinds(n_seqs):
    hw, model, engine = load_hardware("rtx3090"), load_model("mixtral"), llama()
    layers = model.num_moe_layers
    all_cpu, all_gpu = decode_s(hw, model, engine, policy(n_seqs, 0.0)), decode_s(hw, model, engine, policy(n_seqs, 1.0))
    for on_gpu in (1, 8, 21):
        mixed = decode_s(hw, model, engine, policy(n_seqs, on_gpu / layers))
        want = (on_gpu * all_gpu + (layers - on_gpu) * all_cpu) / layers
        assert mixed == pytest.approx(want, rel=1e-12)
    assert all_gpu < all_cpu  # a GPU layer's experts are faster than the CPU's or the link's


def test_below_op_offload_the_cpu_endpoint_is_the_ffn_cpu_placement():
    hw, model = load_hardware("rtx3090"), load_model("mixtral")
    engine = llama()
    # the same engine allowed to place every expert on the CPU (ffn=cpu): no expert on the GPU
    both = with_fields(engine, policy={**engine.policy.model_dump(), "ffn": ["gpu", "cpu"]})
    for n_seqs in (1, 16, 31):
        assert decode_s(hw, model, engine, policy(n_seqs, 0.0)) == pytest.approx(
            decode_s(hw, model, both, policy(n_seqs, 0.0, ffn=False)), rel=1e-12)


def test_op_offload_copies_the_used_experts_over_the_link():
    hw, model, engine = load_hardware("rtx3090"), load_model("mixtral"), llama()
    rates = rates_from_profile(hw, DEFAULT_OPTIONS.for_model(model))
    link = link_bytes_s(rates, engine, "h2d")
    for mu, on_cpu in ((31.0, True), (32.0, False), (200.0, False)):
        lanes = decode_resources(model, rates, mu, 500.0, 1.0, 1.0, True, engine)
        h2d = float(lanes["h2d"].per_layer_offloaded_weights_s)
        cpu = float(lanes["cpu"].per_layer_offloaded_weights_s)
        hidden = mu * model.hidden_size * 2 / link  # fp16 hidden states back from the CPU experts
        if on_cpu:
            assert h2d == pytest.approx(hidden, rel=1e-12) and cpu > 0
        else:  # distinct experts of mu tokens: 8·(1 − (6/8)^mu), each 3·h·h2·2 bytes
            used = 8 * (1 - 0.75 ** mu) * 3 * model.hidden_size * model.expert_intermediate_size * 2
            assert h2d == pytest.approx(used / link, rel=1e-12) and cpu == 0.0
    assert costs.expected_distinct_experts(model, 32.0) == pytest.approx(8 * (1 - 0.75 ** 32))


def test_whole_layers_granularity_and_placement():
    hw, model, engine = load_hardware("rtx3090"), load_model("mixtral"), llama()
    found = search(hw, model, WL, engine=engine, fixed={"batch_size": 1}, top=0)
    rw = found.best.policy.weights_gpu_ratio
    on_gpu = round(rw * model.num_moe_layers)
    assert rw == on_gpu / model.num_moe_layers and 0 < on_gpu < model.num_moe_layers
    layers = found.plan.placement.layers
    # --n-cpu-moe N: the first N layers' experts on the CPU, the rest all on the GPU
    assert [len(p.gpu_experts) for p in layers] == [0] * (len(layers) - on_gpu) + [model.num_experts] * on_gpu
    noted = search(hw, model, WL, engine=engine, fixed={"batch_size": 1, "weights_gpu_ratio": 0.1}, top=0)
    assert noted.best.policy.weights_gpu_ratio == 3 / 32
    assert "the experts of 3 of 32 MoE layers" in " ".join(noted.stats.notes)


@pytest.mark.slow
@pytest.mark.parametrize("model_name,hw_name,fixed", [
    ("mixtral", "rtx3090", {}), ("mixtral", "rtx3090", {"batch_size": 16}), ("mixtral", "l4", {"batch_size": 48}),
    ("tiny-mixtral", "t4", {}), ("deepseek-v2-lite", "rtx3090", {"batch_size": 4}),
])
def test_milp_and_enumeration_agree_with_the_search(model_name, hw_name, fixed):
    found = search(load_hardware(hw_name), load_model(model_name), WL, engine=llama(), fixed=fixed, top=0, verify=True)
    assert found.verified, (found.stats.objective_value, found.verify_objective)


def test_the_engine_needs_one_micro_batch():
    with pytest.raises(ValueError, match="num_micro_batches: 1"):
        with_fields(llama(), policy={"attention": ["gpu"], "ffn": ["gpu"], "fixed": {}})


def test_export_of_a_llama_cpp_plan_round_trips():
    from hrm.export import Context, export_policy, import_flags

    hw, model = load_hardware("rtx3090"), load_model("mixtral")
    found = search(hw, model, WL, engine=llama(), fixed={"batch_size": 4}, top=0)
    ctx = Context(model=model, workload=WL, hardware=hw, gpu_memory_utilization=0.86)
    export = export_policy("llama.cpp", found.best.policy, ctx)
    command = export.commands[0]
    flags = command.split(" ", 1)[1]  # after the program name
    cpu_layers = model.num_moe_layers - round(found.best.policy.weights_gpu_ratio * model.num_moe_layers)
    assert f"--n-cpu-moe {cpu_layers}" in flags
    back = import_flags("llama.cpp", flags, model, WL, hw)
    assert back.weights_gpu_ratio == pytest.approx(found.best.policy.weights_gpu_ratio)
    assert (back.batch_size, back.micro_batch_size, back.attn_on_gpu) == (4, 4, True)
    assert np.isclose(back.kv_gpu_ratio, 1.0)


def test_nkvo_variant_runs_attention_on_the_cpu():
    hw, model = load_hardware("rtx3090"), load_model("mixtral")
    nkvo = load_engine("llama.cpp-nkvo")
    found = search(hw, model, WL, engine=nkvo, fixed={"batch_size": 16}, top=0, verify=True)
    p = found.best.policy
    assert found.verified and (p.attn_on_gpu, p.kv_gpu_ratio, p.num_micro_batches) == (False, 0.0, 1)
    # the same experts placement: only attention and the KV cache move to the host
    with_kv = Policy(**{**p.model_dump(), "attn_on_gpu": True, "kv_gpu_ratio": 1.0})
    host, device = estimate(hw, model, WL, p, engine=nkvo), estimate(hw, model, WL, with_kv, engine=llama())
    assert host.gpu_peak_bytes < device.gpu_peak_bytes  # the KV cache left the GPU
    assert host.cpu_peak_bytes > device.cpu_peak_bytes
