"""MoE-Infinity (issue 13, item 3): a GPU cache of each layer's hottest experts (r_w·E of
them), the other experts a micro-batch uses loaded on demand. Transferred bytes per layer =
expected misses × expert bytes, a convex piecewise-linear function of r_w carried as pieces
(one affine lane each). Checked against the routing formulas (themselves checked against
Monte-Carlo sampling in test_routing.py) and by the MILP and enumeration agreeing with the
search, whose lanes now include the pieces."""

from __future__ import annotations

import numpy as np
import pytest

from hrm.cost import costs
from hrm.cost.latency.decode import decode_resources
from hrm.cost.latency.lane import RESOURCES, lanes_time_s, sum_lanes
from hrm.cost.latency.lanes import schedule_lanes
from hrm.cost.latency.transfers import link_bytes_s
from hrm.engines.engine import Engine, load_engine
from hrm.estimate import estimate
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.model.options import DEFAULT_OPTIONS
from hrm.policy import Policy
from hrm.machine.rates import rates_from_profile
from hrm.model.routing import expected_misses, zipf
from hrm.workload import make_workload
from solver.search import search

WL = make_workload("mtbench", gen_len=16)


def misses_s(model, engine, rates, mu: float, rw: float) -> float:
    """The decode h2d lane's time beyond its r_w-free part (the misses' load)."""
    h2d = decode_resources(model, rates, mu, 300.0, 1.0, 1.0, True, engine)["h2d"]
    return float(h2d.time_s(1, rw, 1.0) - h2d.time_s(1, 1.0, 1.0))


@pytest.fixture(scope="module")
def setting():
    model = load_model("mixtral")
    rates = rates_from_profile(load_hardware("rtx3090"), DEFAULT_OPTIONS.for_model(model))
    return model, rates, load_engine("moe-infinity"), link_bytes_s(rates, load_engine("moe-infinity"), "h2d")


@pytest.mark.parametrize("mu", [1.0, 4.0, 16.0])
def test_uniform_routing_is_one_line(setting, mu):
    model, rates, engine, link = setting
    distinct = 8 * (1 - (1 - 2 / 8) ** mu)  # D(μ) of uniform top-2 over 8 experts
    for cached in range(0, 9):
        rw = cached / 8
        assert misses_s(model, engine, rates, mu, rw) == pytest.approx(
            (1 - rw) * distinct * costs.expert_bytes(model) / link, rel=1e-12)


@pytest.mark.parametrize("mu", [1.0, 8.0])
def test_skewed_routing_is_the_expected_misses_and_convex(setting, mu):
    model, rates, engine, link = setting
    skewed = model.with_routing(zipf(8, 2, 1.5))
    values = []
    for cached in range(0, 9):
        want = float(expected_misses(zipf(8, 2, 1.5), cached, mu)) * costs.expert_bytes(model) / link
        got = misses_s(skewed, engine, rates, mu, cached / 8)
        assert got == pytest.approx(want, rel=1e-12, abs=1e-15)
        values.append(got)
    steps = np.diff(values)
    assert np.all(steps <= 1e-15) and np.all(np.diff(steps) >= -1e-15)  # decreasing, convex in C
    # between whole experts: the chord (what the pieces' max gives)
    mid = misses_s(skewed, engine, rates, mu, 2.5 / 8)
    assert mid == pytest.approx((values[2] + values[3]) / 2, rel=1e-12)
    # a cache of the hottest experts misses less than uniform routing would
    assert values[2] < misses_s(model, engine, rates, mu, 2 / 8)


def test_lanes_expand_to_affine_pieces_with_the_same_max(setting):
    model, rates, engine, _ = setting
    skewed = model.with_routing(zipf(8, 2, 1.2))
    resources = decode_resources(skewed, rates, 4.0, 300.0, 1.0, 1.0, True, engine)
    lanes = schedule_lanes(resources, engine, rates.shared_unit)
    # serial: one lane per piece, plus the host thread issuing the ops (its own lane)
    assert len(lanes) == 9 and not any(lane.pieces for lane in lanes if lane.name != "host")
    lanes = [lane for lane in lanes if lane.name != "host"]
    total = sum_lanes("all", [resources[r] for r in RESOURCES])
    for rw in (0.0, 0.125, 0.3, 0.75, 1.0):
        assert float(lanes_time_s(lanes, 1, rw, 1.0)) == pytest.approx(float(total.time_s(1, rw, 1.0)),
                                                                              rel=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("model_name,hw_name,routing,fixed", [
    ("mixtral", "rtx3090", None, {"batch_size": 1}), ("mixtral", "rtx3090", "zipf", {"batch_size": 4}),
    ("mixtral", "l4", "zipf", {}), ("deepseek-v2-lite", "rtx3090", "zipf", {"batch_size": 2}),
])
def test_milp_and_enumeration_agree_with_the_search(model_name, hw_name, routing, fixed):
    model = load_model(model_name)
    if routing:
        model = model.with_routing(zipf(model.num_experts, model.top_k, 1.2))
    found = search(load_hardware(hw_name), model, WL, engine=load_engine("moe-infinity"), fixed=fixed, top=0,
                   verify=True)
    assert found.verified, (found.stats.objective_value, found.verify_objective)


def test_skew_lowers_the_latency_of_a_cached_policy():
    hw, model = load_hardware("rtx3090"), load_model("mixtral")
    engine = load_engine("moe-infinity")
    policy = Policy(batch_size=1, micro_batch_size=1, num_micro_batches=1, attn_on_gpu=True, ffn_on_gpu=True,
                    weights_gpu_ratio=0.25, kv_gpu_ratio=1.0)
    flat = estimate(hw, model, WL, policy, engine=engine).per_token_latency_s
    hot = estimate(hw, model.with_routing(zipf(8, 2, 1.5)), WL, policy, engine=engine).per_token_latency_s
    assert hot < flat


def test_engine_rules():
    base = load_engine("moe-infinity").model_dump()
    with pytest.raises(ValueError, match="num_micro_batches: 1"):
        Engine.model_validate({**base, "policy": {"attention": ["gpu"], "ffn": ["gpu"], "fixed": {}}})
    with pytest.raises(ValueError, match="weight_path: pinned"):
        Engine.model_validate({**base, "decode": {**base["decode"], "weight_path": "pageable-driver"}})
