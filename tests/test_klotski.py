"""Klotski (issue 13, item 2): its inequalities (4)-(7) on hand numbers (the paper's own
RTX 3090 example), durations from the cost model, and the step-by-step pipeline gains on
the expert-level scheduler."""

from __future__ import annotations

import pytest

from hrm.machine.hardware import load_hardware
from hrm.pipelines.expert_level_tasks import (PIPELINE_STEPS, KlotskiLayer, expert_compute_s, inequalities_hold, klotski_batches,
                         klotski_layer, pipeline_steps)
from hrm.model.spec import load_model
from hrm.model.options import DEFAULT_OPTIONS
from hrm.machine.rates import rates_from_profile
from hrm.model.routing import zipf


def paper_layer(n: int) -> KlotskiLayer:
    """§1's example (Mixtral-8x7B, RTX 3090, batch 16): attention 2.6 ms per batch, one expert
    ~21 ms over PCIe; a 0.1 ms gate, 0.5 ms gate load, hot experts 1 ms per batch, 2 cold."""
    return KlotskiLayer(num_batches=n, attention_s=2.6e-3, gate_s=0.1e-3, gate_load_s=0.5e-3,
                        attention_load_s=10e-3, expert_load_s=21e-3, hot=[(21e-3, 1e-3)] * 2,
                        cold=[(21e-3, 0.5e-3)] * 2)


def test_inequalities_on_the_papers_example():
    # (5): n·2.7 ms >= 0.5 + 2·21 ms  ->  n >= 15.74: 15 fails, 16 holds
    assert inequalities_hold(paper_layer(15))[1] is False
    assert inequalities_hold(paper_layer(16))[:2] == [True, True]
    # (6): 16·2.7 + 16·2·1 = 75.2 >= 0.5 + 3·21 = 63.5
    assert inequalities_hold(paper_layer(16))[2] is True
    # (7): 43.2 + 32 + 16·2·0.5 = 91.2 >= 0.5 + 4·21 + 10 = 94.5 fails at 16; n = 17: 96.9 holds
    assert inequalities_hold(paper_layer(16))[3] is False
    assert all(inequalities_hold(paper_layer(17)))


@pytest.fixture(scope="module")
def mixtral_3090():
    model = load_model("mixtral")
    return model, rates_from_profile(load_hardware("rtx3090"), DEFAULT_OPTIONS.for_model(model))


def test_layer_durations_from_the_cost_model(mixtral_3090):
    model, rates = mixtral_3090
    layer = klotski_layer(model, rates, 16, 512, 4)
    from hrm.cost.latency.transfers import link_bytes_s
    from hrm.engines.engine import IDEAL

    link = link_bytes_s(rates, IDEAL, "h2d")  # the profile's pinned CPU→GPU rate
    expert_bytes = 3 * model.hidden_size * model.expert_intermediate_size * 2
    assert layer.expert_load_s == pytest.approx(expert_bytes / link, rel=1e-12)
    assert link == pytest.approx(load_hardware("rtx3090").link.h2d_gbps * 1e9, rel=0.3)
    assert len(layer.hot) == model.top_k
    # uniform routing: 64 tokens touch all 8 experts (1 − 0.75^64 ≈ 1): the other 6 are cold
    assert len(layer.cold) == 6
    # a hot expert's call for one batch's 16·(2/8) = 4 tokens is memory-bound: its weights
    # once from HBM, again for every batch (one call per expert and batch)
    assert layer.hot[0][1] == pytest.approx(expert_compute_s(model, rates, 4.0))
    assert expert_compute_s(model, rates, 4.0) == pytest.approx(expert_bytes / rates.gpu_bandwidth_bytes_s, rel=0.01)
    skewed = klotski_layer(model, rates, 16, 512, 1, zipf(8, 2, 2.0))
    assert len(skewed.cold) < len(klotski_layer(model, rates, 16, 512, 1).cold)


def test_each_step_helps_and_klotskis_n_is_bubble_free(mixtral_3090):
    model, rates = mixtral_3090
    n = klotski_batches(model, rates, 16, 512)
    assert n is not None and all(inequalities_hold(klotski_layer(model, rates, 16, 512, n)))
    assert not all(inequalities_hold(klotski_layer(model, rates, 16, 512, n - 1)))
    steps = pipeline_steps(model, rates, 16, 512, n)
    assert [s.step for s in steps] == list(PIPELINE_STEPS)
    tput = [s.decode_tok_s for s in steps]
    assert tput == sorted(tput) and tput[-1] > 10 * tput[0]  # multi-batch amortises the loads
    assert steps[-1].schedule.bubble_s == pytest.approx(0.0, abs=1e-9)  # n from (4)-(7): no bubble left
