"""Fiddler (issue 13, item 4): the most popular experts resident on the GPU (a cache of the
hottest, r_w·E per layer); a miss runs on the CPU while its expert gets fewer than 70/7 = 10
tokens (efeslab/fiddler mixtral.py:38-39), else its weights are copied from pageable memory
and it runs on the GPU. The cost per miss is derived here from the profile's rates by hand."""

from __future__ import annotations

import numpy as np
import pytest

from hrm.cost import costs
from hrm.cost.latency.decode import decode_resources
from hrm.cost.latency.lane import RESOURCES, sum_lanes
from hrm.cost.latency.ops import gpu_time_s
from hrm.cost.latency.transfers import link_bytes_s
from hrm.engines.engine import Engine, load_engine
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.model.options import DEFAULT_OPTIONS
from hrm.machine.rates import rates_from_profile
from hrm.model.routing import expected_misses, zipf
from hrm.workload import make_workload
from solver.search import search

WL = make_workload("mtbench", gen_len=16)


def miss_lane_s(model, engine, rates, mu: float, rw: float) -> float:
    """The serial lane's time beyond its value with every expert resident (r_w = 1)."""
    resources = decode_resources(model, rates, mu, 300.0, 1.0, 1.0, True, engine)
    lane = sum_lanes("all", [resources[r] for r in RESOURCES])
    return float(lane.time_s(1, rw, 1.0) - lane.time_s(1, 1.0, 1.0))


@pytest.fixture(scope="module")
def setting():
    model = load_model("mixtral")
    rates = rates_from_profile(load_hardware("rtx3090"), DEFAULT_OPTIONS.for_model(model))
    return model, rates, load_engine("fiddler")


def test_a_miss_below_ten_tokens_runs_on_the_cpu(setting):
    model, rates, engine = setting
    h, h2, eb = model.hidden_size, model.expert_intermediate_size, 3 * model.hidden_size * model.expert_intermediate_size * 2
    for mu in (1.0, 4.0):  # tokens per touched expert: 1 and 4·2/D(4) — both below 10
        distinct = 8 * (1 - 0.75 ** mu)
        per_expert = mu * 2 / distinct
        cpu = max(2 * per_expert * 3 * h * h2 / rates.cpu_flops(per_expert),
                  (eb + per_expert * (2 * h + 3 * h2) * 2) / rates.cpu_bandwidth_bytes_s)
        hidden = 2 * per_expert * h * 2 / link_bytes_s(rates, engine, "h2d")
        gpu_share = float(gpu_time_s(costs.routed_experts(model, mu), rates,
                                             mu * 2 / distinct, engine, kernel=True)) / distinct
        per_miss = cpu + hidden - gpu_share
        for cached in (0, 3, 8):
            want = float(expected_misses(zipf(8, 2, 0.0), cached, mu)) * per_miss
            assert miss_lane_s(model, engine, rates, mu, cached / 8) == pytest.approx(want, rel=1e-9, abs=1e-15)


def test_from_ten_tokens_a_miss_is_a_pageable_copy(setting):
    model, rates, engine = setting
    eb = 3 * model.hidden_size * model.expert_intermediate_size * 2
    copy = eb / link_bytes_s(rates, engine, "h2d", pageable=True)
    for mu in (48.0, 200.0):  # 48·2/8 = 12 tokens per expert
        for cached in (0, 5):
            want = float(expected_misses(zipf(8, 2, 0.0), cached, mu)) * copy
            assert miss_lane_s(model, engine, rates, mu, cached / 8) == pytest.approx(want, rel=1e-9)
    assert link_bytes_s(rates, engine, "h2d", pageable=True) < link_bytes_s(rates, engine, "h2d")


def test_skewed_routing_misses_less(setting):
    model, rates, engine = setting
    skewed = model.with_routing(zipf(8, 2, 1.5))
    assert miss_lane_s(skewed, engine, rates, 1.0, 2 / 8) < miss_lane_s(model, engine, rates, 1.0, 2 / 8)
    steps = np.diff([miss_lane_s(skewed, engine, rates, 1.0, c / 8) for c in range(9)])
    assert np.all(steps <= 1e-15) and np.all(np.diff(steps) >= -1e-15)


@pytest.mark.slow
@pytest.mark.parametrize("n_seqs,routing", [(1, None), (1, "zipf"), (16, "zipf"), (64, None)])
def test_milp_and_enumeration_agree_with_the_search(n_seqs, routing):
    model = load_model("mixtral")
    if routing:
        model = model.with_routing(zipf(8, 2, 1.2))
    found = search(load_hardware("rtx3090"), model, WL, engine=load_engine("fiddler"), fixed={"batch_size": n_seqs},
                   top=0, verify=True)
    assert found.verified


def test_cpu_misses_need_a_serial_schedule():
    base = load_engine("fiddler").model_dump()
    with pytest.raises(ValueError, match="schedule: sequential"):
        Engine.model_validate({**base, "schedule": "cgopipe"})
