"""Routing distributions (issue 13, part 1): the closed forms against Monte-Carlo sampling
of the same distribution, the marginals of the sampler, and refusals of bad inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hrm.cost import costs
from hrm.errors import HRMError
from hrm.model.spec import load_model
from hrm.model.routing import (TRACE_FORMAT, cache_hit_rate, capped_marginals, expected_distinct_experts, expected_misses,
                         from_counts, hottest_experts, load_trace, parse_routing, sample_top_k_sets, uniform, zipf)

TOKENS = [1, 2, 4, 8, 16, 32, 64]


def monte_carlo(routing, tokens, draws, seed=0, cached=None, layer=0):
    """(mean distinct experts, mean misses of the `cached` hottest, hit rate, standard error
    of the mean misses) over `draws` micro-batches."""
    rng = np.random.default_rng(seed)
    hot = set(hottest_experts(routing, cached or 0)[layer].tolist())
    distinct, misses, hits, total = [], [], 0, 0
    for _ in range(draws):
        sets = sample_top_k_sets(routing, tokens, rng, layer)
        touched = set(np.unique(sets).tolist())
        distinct.append(len(touched))
        misses.append(len(touched - hot))
        hits += int(np.isin(sets, list(hot)).sum())
        total += sets.size
    return float(np.mean(distinct)), float(np.mean(misses)), hits / total, float(np.std(misses) / np.sqrt(draws))


def test_uniform_is_the_spec_formula_and_the_cost_model_uses_it():
    model = load_model("mixtral")
    routing = uniform(8, 2)
    t = np.array(TOKENS, dtype=float)
    np.testing.assert_allclose(expected_distinct_experts(routing, t), 8 * (1 - (1 - 2 / 8) ** t))
    np.testing.assert_allclose(costs.expected_distinct_experts(model, t), expected_distinct_experts(routing, t))
    assert expected_distinct_experts(routing, 1) == pytest.approx(2.0)


def test_zipf_marginals_sum_to_k_and_are_capped():
    q = zipf(64, 6, 1.5).q[0]
    assert q.sum() == pytest.approx(6.0) and q.max() <= 1.0 + 1e-12
    assert np.all(np.diff(q) <= 1e-15)  # popularity falls with rank
    assert np.sum(q == 1.0) >= 1  # the hottest expert is in every token's set at this skew
    np.testing.assert_allclose(zipf(8, 2, 0.0).q[0], 0.25)  # s = 0 is uniform
    np.testing.assert_allclose(capped_marginals([10, 1, 1, 1], 2), [1, 1 / 3, 1 / 3, 1 / 3])


@pytest.mark.parametrize("routing", [uniform(8, 2), zipf(8, 2, 1.2), zipf(64, 6, 0.8), zipf(60, 4, 2.0)],
                         ids=lambda r: f"{r.label()}-{r.num_experts}x{r.top_k}")
def test_sampler_has_the_marginals(routing):
    rng = np.random.default_rng(1)
    sets = sample_top_k_sets(routing, 20000, rng)
    assert all(len(set(row)) == routing.top_k for row in sets.tolist()[:2000])  # no expert twice
    freq = np.bincount(sets.ravel(), minlength=routing.num_experts) / 20000
    np.testing.assert_allclose(freq, routing.q[0], atol=0.015)


@pytest.mark.slow
@pytest.mark.parametrize("routing", [uniform(8, 2), zipf(8, 2, 1.2), zipf(64, 6, 1.0), zipf(60, 4, 2.0)],
                         ids=lambda r: f"{r.label()}-{r.num_experts}x{r.top_k}")
@pytest.mark.parametrize("tokens", [1, 4, 16, 64])
def test_distinct_experts_and_misses_match_monte_carlo(routing, tokens):
    cached = routing.num_experts // 4
    mc_distinct, mc_misses, mc_hit, misses_se = monte_carlo(routing, tokens, draws=1500, seed=tokens, cached=cached)
    assert expected_distinct_experts(routing, tokens) == pytest.approx(mc_distinct, rel=0.03)
    # within 4 standard errors of the sample mean (a false alarm once in ~16,000 runs)
    assert abs(expected_misses(routing, cached, tokens) - mc_misses) <= 4 * misses_se + 1e-3
    assert cache_hit_rate(routing, cached) == pytest.approx(mc_hit, abs=0.02)


@settings(max_examples=25, deadline=None)
@given(ne=st.integers(2, 64), k_frac=st.floats(0.01, 1.0), s=st.floats(0.0, 3.0), t=st.integers(1, 4096))
def test_distinct_experts_bounds(ne, k_frac, s, t):
    k = max(1, min(ne, round(k_frac * ne)))
    routing = zipf(ne, k, s)
    d = float(expected_distinct_experts(routing, t))
    # at least k (one token's set), at most ne and at most k·t; skew never touches more than uniform
    assert k - 1e-9 <= d <= min(ne, k * t) + 1e-9
    assert d <= float(expected_distinct_experts(uniform(ne, k), t)) + 1e-9
    assert cache_hit_rate(routing, ne) == pytest.approx(1.0) and cache_hit_rate(routing, 0) == 0.0
    assert float(expected_misses(routing, 0, t)) == pytest.approx(d)


def test_trace_round_trip_per_layer(tmp_path):
    rng = np.random.default_rng(7)
    layers = [zipf(8, 2, 0.5), zipf(8, 2, 2.0)]
    counts, tokens = [], 4000
    for routing in layers:
        sets = sample_top_k_sets(routing, tokens, rng)
        counts.append(np.bincount(sets.ravel(), minlength=8).tolist())
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"format": TRACE_FORMAT, "top_k": 2,
                                "layers": [{"tokens": tokens, "expert_counts": c} for c in counts]}))
    trace = parse_routing(f"trace:{path}", 8, 2)
    assert trace.kind == "trace" and trace.q.shape == (2, 8)
    np.testing.assert_allclose(trace.q, np.vstack([r.q[0] for r in layers]), atol=0.03)
    for t in (1, 8, 64):  # the layer average of the two layers' distinct counts
        want = np.mean([float(expected_distinct_experts(r, t)) for r in layers])
        assert float(expected_distinct_experts(trace, t)) == pytest.approx(want, rel=0.02)


@pytest.mark.parametrize("text,needle", [
    ("zipf", "zipf needs an exponent"), ("zipf:-1", "must be in [0, 100]"), ("lognormal:2", "expected uniform"),
    ("trace:", "expected uniform"), ("uniform:3", "expected uniform"),
])
def test_bad_routing_flag(text, needle):
    with pytest.raises(HRMError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        parse_routing(text, 8, 2)


@pytest.mark.parametrize("content,needle", [
    ("{", "malformed JSON"), ('{"format": "x"}', "not a routing trace"),
    (json.dumps({"format": TRACE_FORMAT, "top_k": 2, "layers": []}), "every layer needs"),
    (json.dumps({"format": TRACE_FORMAT, "top_k": 2, "layers": [{"tokens": 10}]}), "missing or malformed"),
    (json.dumps({"format": TRACE_FORMAT, "top_k": 2, "layers": [{"tokens": 10, "expert_counts": [5, 5, 5, 6]}]}),
     "must sum to top_k"),
    (json.dumps({"format": TRACE_FORMAT, "top_k": 2, "layers": [{"tokens": 10, "expert_counts": [20, 0, 0, 0]}]}),
     "in \\[0, 1\\]"),
])
def test_bad_trace_refused(tmp_path, content, needle):
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.raises(HRMError, match=needle):
        load_trace(path)


def test_trace_must_match_the_model(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": TRACE_FORMAT, "top_k": 2,
                                "layers": [{"tokens": 10, "expert_counts": [5, 5, 5, 5]}]}))
    with pytest.raises(HRMError, match="the model has 8, top-2"):
        parse_routing(f"trace:{path}", 8, 2)
    assert from_counts([[5, 5, 5, 5]], [10], 2).q.shape == (1, 4)


# --- the distribution in the cost model, plans and the CLI ------------------------------------
def test_model_routing_drives_the_cost_model_and_keeps_uniform_hashes():
    base = load_model("mixtral")
    skewed = base.with_routing(zipf(8, 2, 1.2))
    assert base.with_routing(uniform(8, 2)) is base and base.routing is None
    assert skewed.sha256() != base.sha256()
    assert base.model_copy().sha256() == base.sha256()
    t = np.array(TOKENS, dtype=float)
    np.testing.assert_allclose(costs.expected_distinct_experts(skewed, t),
                               expected_distinct_experts(zipf(8, 2, 1.2), t))
    assert np.all(costs.expected_distinct_experts(skewed, t[1:]) < costs.expected_distinct_experts(base, t[1:]))
    with pytest.raises(ValueError, match="the model has 8, top-2"):
        base.with_routing(zipf(16, 2, 1.0))


def test_skew_never_slows_a_policy_and_plans_keep_their_routing(tmp_path):
    from hrm.estimate import estimate
    from hrm.machine.hardware import load_hardware
    from hrm.plan import load_plan, resolve_plan_model, save_plan
    from hrm.workload import make_workload
    from solver.search import search

    hw, wl = load_hardware("l4"), make_workload("mtbench", gen_len=16)
    base = load_model("mixtral")
    skewed = base.with_routing(zipf(8, 2, 1.5))
    found = search(hw, skewed, wl, top=0, engine="ideal")
    policy = found.best.policy
    # fewer distinct experts per micro-batch: fewer HBM bytes and calls, fuller expert GEMMs
    assert (estimate(hw, skewed, wl, policy, engine="ideal").decode_throughput_tok_s
            >= estimate(hw, base, wl, policy, engine="ideal").decode_throughput_tok_s)
    assert found.plan.routing == skewed.routing
    path = tmp_path / "plan.json"
    save_plan(found.plan, path)
    plan = load_plan(path)  # re-estimated on load: a stale estimate would be refused
    assert resolve_plan_model(plan) == skewed


def test_routing_flag(tmp_path, capsys):
    from hrm_cli import main

    assert main(["search", "--hw", "l4", "--model", "mixtral", "--gen-len", "16", "--routing", "zipf:1.2",
                 "--out", str(tmp_path / "p.json")]) == 0
    assert main(["show", str(tmp_path / "p.json")]) == 0
    assert "zipf:1.2" in capsys.readouterr().out
    assert main(["ops", "--model", "mixtral", "--routing", "zipf:2", "--json"]) == 0
    capsys.readouterr()
    assert main(["search", "--hw", "l4", "--model", "mixtral", "--routing", "zipf:x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --routing zipf:x")


def test_hot_and_cold_bytes():
    from hrm.model.routing import hot_and_cold_bytes

    routing = zipf(8, 2, 1.2)
    hot, cold = hot_and_cold_bytes(routing, 100.0, 0, 16)
    assert hot == 0.0 and float(cold) == pytest.approx(100.0 * float(expected_distinct_experts(routing, 16)))
    hot, cold = hot_and_cold_bytes(routing, 100.0, 8, 16)
    assert hot == 800.0 and float(cold) == 0.0
    hot, cold = hot_and_cold_bytes(routing, 100.0, 2, np.array([1.0, 64.0]))
    assert hot == 200.0 and cold[0] < cold[1] <= 600.0 + 1e-9  # at most the 6 cold experts


@pytest.mark.parametrize("ne, k", [(8, 2), (128, 8), (384, 8)])
def test_uniform_misses_are_the_closed_form_of_the_sum(ne, k):
    """Uniform routing's expected misses, (ne − C)·(1 − (1 − k/ne)^t), equal the sum over the
    cold experts Σ_{e∉S} 1 − (1 − q_e)^t written out by hand."""
    from hrm.model.routing import uniform

    t = np.array([1, 3.5, 17, 400, 5000.0])
    for cached in (0, 1, ne // 2, ne):
        by_hand = np.array([sum(1 - (1 - k / ne) ** x for _ in range(ne - cached)) for x in t])
        assert np.allclose(expected_misses(uniform(ne, k), cached, t), by_hand, rtol=1e-12, atol=1e-12)
