"""Skew measured, not assumed (issue 13, part 1): the reference runtime's skewed test router
(``hrm run --router-skew S``) and its expert activation trace (``--routing-trace FILE``),
checked against the planner's routing formulas (:mod:`hrm.model.routing`).

The quantitative checks run a 16-expert variant of tiny-mixtral (the tiny model's config
with ``num_local_experts`` = 16, written here): with tiny-mixtral's own 4 experts and top-2 a
decode micro-batch of 16 tokens touches nearly all 4 experts whatever the skew, so a 5%
tolerance could not tell a skewed prediction from a uniform one. Expected values come from
the trace's counts through the formulas; nothing measured is written into this file."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from conftest import call

torch = pytest.importorskip("torch")

from scipy import stats  # noqa: E402

from hrm.errors import HRMError  # noqa: E402
from hrm.estimate import estimate  # noqa: E402
from hrm.machine.hardware import load_hardware  # noqa: E402
from hrm.model.spec import load_model  # noqa: E402
from hrm.placement import policy_placement  # noqa: E402
from hrm.plan import Estimate, Plan, SolverInfo, SpecRef, save_plan  # noqa: E402
from hrm.policy import parse_policy  # noqa: E402
from hrm.model.routing import (TRACE_FORMAT, cache_hit_rate, expected_distinct_experts, from_counts,  # noqa: E402
                         hottest_experts, load_trace, uniform)
from hrm.workload import Workload  # noqa: E402
from hrm_cli import main  # noqa: E402
from runtime import ops  # noqa: E402
from runtime.executor import run_plan_once  # noqa: E402
from runtime.model import ReferenceModel, random_weights, router_skew_bias, to_state_dict  # noqa: E402
from runtime.requests import plan_rounds, prompt_lengths, synthetic_requests  # noqa: E402
from runtime.validate import runtime_spec  # noqa: E402

SKEW = 1.5
#: relative error allowed between a formula and the measurement (the issue's target)
TOLERANCE = 0.05
#: padded prompts (FlexGen batching): rounds are consecutive, exchangeable groups of requests.
#: Without padding, Algorithm 2 sorts requests by length, so round 0 would hold the longest
#: prompts and a round-to-round comparison would measure prompt length, not routing.
WORKLOAD = Workload(prompt_len=8, max_prompt_len=12, gen_len=16, padding=True)
#: 4 micro-batches of 16 sequences; 256 requests = 4 rounds → 4·4·15 = 240 decode router calls per layer
POLICY = "N=64,mu=16,attn=cpu,rw=0.5"
REQUESTS = 256
SEED = 0


# --- helpers ---------------------------------------------------------------------------
def write_plan(path: Path, model: str, workload: Workload, policy_text: str) -> Path:
    """A plan for ``model`` on the cpu-only profile with the given policy (no search)."""
    hw = load_hardware("cpu-only")
    spec = load_model(model, "bf16", "bf16")
    policy = parse_policy(policy_text)
    plan = Plan(
        hardware=SpecRef(name="cpu-only", sha256=hw.sha256()), model=SpecRef(name=model, sha256=spec.sha256()),
        workload=workload, policy=policy, schedule="cgopipe",
        estimate=Estimate(**estimate(hw, spec, workload, policy, engine="ideal").to_plan_estimate()),
        placement=policy_placement(spec, policy),
        solver=SolverInfo(name="test", seconds=0.0, optimal=True, candidates_evaluated=1), created_by="test",
    )
    save_plan(plan, path)
    return path


def sixteen_expert_config(folder: Path) -> Path:
    """tiny-mixtral's config with 16 experts (top-2 kept)."""
    config = json.loads((Path(__file__).resolve().parents[1] / "hrm/data/models/tiny-mixtral.json").read_text())
    config.update({"_source": "test: tiny-mixtral with 16 experts", "num_local_experts": 16})
    path = folder / "tiny-mixtral-16e.json"
    path.write_text(json.dumps(config))
    return path


def refused(capsys, *args, needle: str) -> None:
    code, _, err = call(capsys, *args)
    lines = err.strip().splitlines()
    assert "Traceback" not in err and code == 2, (code, err)
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], err


def decode_calls(trace: dict, layer: int, rounds=None) -> list[dict]:
    return [m for m in trace["micro_batches"] if m["layer"] == layer and m["phase"] == "decode"
            and (rounds is None or m["round"] in rounds)]


def pooled(calls: list[dict], top_k: int):
    """The distribution q = counts / tokens of a set of router calls (one layer)."""
    counts = np.sum([m["expert_counts"] for m in calls], axis=0)
    return from_counts([counts], [sum(m["tokens"] for m in calls)], top_k), counts


def mean_distinct_by_size(calls: list[dict]) -> dict[int, tuple[float, int]]:
    """{micro-batch tokens t: (mean measured distinct experts, number of calls)}."""
    by_size = defaultdict(list)
    for m in calls:
        by_size[m["tokens"]].append(m["distinct"])
    return {t: (float(np.mean(d)), len(d)) for t, d in sorted(by_size.items())}


def relative_error(measured: float, predicted: float) -> float:
    return measured / predicted - 1.0


# --- S = 0 changes nothing; S > 0 is one bias, the same on every execution path -------------
def test_zero_skew_is_bit_identical_and_has_no_bias():
    spec = runtime_spec(load_model("tiny-mixtral"), "fp32")
    plain, zero = random_weights(spec, seed=3), random_weights(spec, seed=3, router_skew=0.0)
    assert all(layer.router_bias is None for layer in zero.layers)
    for a, b in zip(plain.layers, zero.layers):
        assert a.static_tensors().keys() == b.static_tensors().keys()
        assert all(torch.equal(a.static_tensors()[k], b.static_tensors()[k]) for k in a.static_tensors())
    workload = Workload(prompt_len=6, max_prompt_len=8, gen_len=4)
    policy = parse_policy("N=8,mu=4,attn=cpu,rw=0.5")
    requests = synthetic_requests(workload, 8, spec.vocab_size, seed=5)
    runs = [run_plan_once(spec, w, policy, workload, requests, device="cpu") for w in (plain, zero)]
    for req in requests:
        assert torch.equal(runs[0].logits(req.rid), runs[1].logits(req.rid))
    x, router = torch.randn(5, spec.hidden_size), plain.layers[0].router
    assert all(torch.equal(a, b) for a, b in zip(ops.route(x, router, 2), ops.route(x, router, 2, bias=None)))


def test_skew_is_one_logit_bias_and_draws_no_random_numbers():
    """Every weight of a skewed model equals the unskewed one; each MoE layer only gains
    b_e = −S·ln(e + 1), which moves tokens towards expert 0."""
    spec = runtime_spec(load_model("tiny-mixtral"), "fp32")
    plain, skewed = random_weights(spec, seed=3), random_weights(spec, seed=3, router_skew=SKEW)
    for a, b in zip(plain.layers, skewed.layers):
        expected = -SKEW * torch.log(torch.arange(1, spec.num_experts + 1, dtype=torch.float32))
        torch.testing.assert_close(b.router_bias, expected, rtol=0, atol=1e-6)
        assert b.router_bias.dtype == torch.float32
        assert all(torch.equal(t, b.static_tensors()[k]) for k, t in a.static_tensors().items())
    x = torch.randn(2000, spec.hidden_size, generator=torch.Generator().manual_seed(1))
    router = plain.layers[0].router
    ids_plain, _ = ops.route(x, router, spec.top_k)
    ids_skewed, _ = ops.route(x, router, spec.top_k, bias=router_skew_bias(spec.num_experts, SKEW))
    assert int((ids_skewed == 0).sum()) > int((ids_plain == 0).sum())
    assert int((ids_skewed == spec.num_experts - 1).sum()) < int((ids_plain == spec.num_experts - 1).sum())


@pytest.mark.parametrize("policy_text", ["N=8,mu=4,attn=cpu,rw=0.5", "N=8,mu=4,attn=gpu,rw=0,rc=0.5",
                                         "N=8,mu=4,attn=cpu,ffn=cpu"])
def test_skewed_router_is_the_same_on_every_path(policy_text):
    """Experts on the device (static or paged) or on the CPU: the offloaded run with a skewed
    router reproduces the plain forward pass, and differs from the unskewed model."""
    spec = runtime_spec(load_model("tiny-mixtral"), "fp32")
    weights = random_weights(spec, seed=3, router_skew=SKEW)
    workload = Workload(prompt_len=6, max_prompt_len=10, gen_len=4)
    requests = synthetic_requests(workload, 8, spec.vocab_size, seed=7)
    result = run_plan_once(spec, weights, parse_policy(policy_text), workload, requests, device="cpu")
    reference, unskewed = ReferenceModel(spec, weights), ReferenceModel(spec, random_weights(spec, seed=3))
    differs = False
    for req in requests:
        tokens, logits = reference.generate(list(req.prompt), workload.gen_len)
        assert result.tokens(req.rid) == tokens
        torch.testing.assert_close(result.logits(req.rid), logits, rtol=1e-4, atol=1e-4)
        differs |= not torch.allclose(unskewed.generate(list(req.prompt), workload.gen_len)[1], logits)
    assert differs


def test_a_skewed_model_has_no_checkpoint_form():
    spec = runtime_spec(load_model("tiny-mixtral"), "fp32")
    with pytest.raises(HRMError, match="router skew"):
        to_state_dict(spec, random_weights(spec, router_skew=SKEW))
    with pytest.raises(HRMError, match="router skew: -1 must be at least 0"):
        random_weights(spec, router_skew=-1.0)


# --- the CLI ------------------------------------------------------------------------------
def test_cli_without_the_option_and_with_zero_skew_trace_the_same_routing(tmp_path, capsys):
    plan = write_plan(tmp_path / "plan.json", "tiny-mixtral", Workload(prompt_len=6, max_prompt_len=8, gen_len=4),
                      "N=8,mu=4,attn=cpu,rw=0.5")
    traces = []
    for extra in ([], ["--router-skew", "0"]):
        path = tmp_path / f"routing{len(traces)}.json"
        code, out, _ = call(capsys, "run", "--plan", plan, "--device", "cpu", "--no-warmup", "--routing-trace", path,
                            *extra)
        assert code == 0 and f"wrote {path}" in out
        traces.append(json.loads(path.read_text()))
    assert traces[0] == traces[1] and traces[0]["router_skew"] == 0.0


def test_strong_skew_orders_the_experts(tmp_path, capsys):
    """At S = 3 the bias dominates the random router's own per-expert preference: activations
    fall with the expert id in every layer. (At S = 1.5 it need not: the random router's
    logits have a spread of about 4, the bias step from expert 0 to 1 is 1.5·ln 2 ≈ 1.)"""
    plan = write_plan(tmp_path / "plan.json", "tiny-mixtral", Workload(prompt_len=6, max_prompt_len=8, gen_len=8),
                      "N=16,mu=8,attn=cpu,rw=0.5")
    path = tmp_path / "routing.json"
    code, _, err = call(capsys, "run", "--plan", plan, "--device", "cpu", "--no-warmup", "--router-skew", "3",
                        "--routing-trace", path)
    assert code == 0, err
    for layer in json.loads(path.read_text())["layers"]:
        counts = layer["expert_counts"]
        assert counts == sorted(counts, reverse=True), counts


@pytest.mark.parametrize("args,needle", [
    (["--router-skew", "-1"], "--router-skew"), (["--router-skew", "nan"], "--router-skew"),
    (["--router-skew", "1000"], "--router-skew"), (["--router-skew", "x"], "--router-skew"),
    (["--routing-trace", "/nonexistent/dir/routing.json"], "does not exist"),
    (["--routing-trace", "TMP"], "directory"),
    (["--routing-trace", "TMP/same.json", "--trace", "TMP/same.json"], "same file"),
    (["--router-skew", "1", "--checkpoint", "PLAN"], "random weights"),
])
def test_bad_routing_flags_are_refused_before_running(tmp_path, capsys, args, needle):
    plan = write_plan(tmp_path / "plan.json", "tiny-mixtral", Workload(prompt_len=6, max_prompt_len=8, gen_len=4),
                      "N=8,mu=4,attn=cpu,rw=0.5")
    args = [str(plan) if a == "PLAN" else a.replace("TMP", str(tmp_path)) for a in args]
    refused(capsys, "run", "--plan", plan, "--device", "cpu", *args, needle=needle)
    assert not (tmp_path / "same.json").exists()


# --- measured vs predicted: one skewed run, its trace ------------------------------------
@pytest.fixture(scope="module")
def skewed_run(tmp_path_factory):
    """``hrm run --router-skew 1.5 --routing-trace`` on the 16-expert model: (trace, spec)."""
    folder = tmp_path_factory.mktemp("skewed")
    model = str(sixteen_expert_config(folder))
    plan = write_plan(folder / "plan.json", model, WORKLOAD, POLICY)
    path = folder / "routing.json"
    start = time.perf_counter()
    assert main(["run", "--plan", str(plan), "--device", "cpu", "--no-warmup", "--requests", str(REQUESTS),
                 "--seed", str(SEED), "--router-skew", str(SKEW), "--routing-trace", str(path)]) == 0
    print(f"skewed run: {time.perf_counter() - start:.1f} s")
    return path, json.loads(path.read_text()), load_model(model)


@pytest.mark.slow
def test_trace_loads_and_every_count_adds_up(skewed_run):
    path, trace, spec = skewed_run
    k, ne = spec.top_k, spec.num_experts
    routing = load_trace(path)
    assert (routing.kind, routing.num_experts, routing.top_k) == ("trace", ne, k)
    assert trace["format"] == TRACE_FORMAT and trace["router_skew"] == SKEW and trace["model"] == spec.name
    # real tokens of every request: its prompt, then one token per decode step (pads not counted)
    prompts = sum(prompt_lengths(WORKLOAD, REQUESTS, SEED))
    tokens = prompts + REQUESTS * (WORKLOAD.gen_len - 1)
    assert [layer["layer"] for layer in trace["layers"]] == list(range(spec.num_layers))
    policy = parse_policy(POLICY)
    rounds = -(-REQUESTS // policy.batch_size)
    for p, layer in enumerate(trace["layers"]):
        assert layer["tokens"] == tokens and sum(layer["expert_counts"]) == k * tokens
        calls = [m for m in trace["micro_batches"] if m["layer"] == layer["layer"]]
        assert sum(m["tokens"] for m in calls) == tokens
        assert np.array_equal(np.sum([m["expert_counts"] for m in calls], axis=0), layer["expert_counts"])
        for m in calls:
            assert sum(m["expert_counts"]) == k * m["tokens"] and m["experts"] == sorted(m["experts"])
            assert m["distinct"] == len(m["experts"]) == np.count_nonzero(m["expert_counts"])
        decode = decode_calls(trace, layer["layer"])
        assert len(decode) == rounds * policy.num_micro_batches * (WORKLOAD.gen_len - 1)
        assert {m["tokens"] for m in decode} == {policy.micro_batch_size}
        # left pads (to max_prompt_len) are routed but left out of the counts, and reported
        pads = sum(m.get("pad_tokens", 0) for m in calls if m["phase"] == "prefill")
        assert pads == REQUESTS * WORKLOAD.max_prompt_len - prompts
        # MoE-Infinity's per-sequence matrix sums to the layer's counts
        assert len(trace["sequences"]) == REQUESTS
        matrix = np.array([s["expert_counts"][p] for s in trace["sequences"]])
        assert np.array_equal(matrix.sum(axis=0), layer["expert_counts"])
    lengths = prompt_lengths(WORKLOAD, REQUESTS, SEED)
    for s in trace["sequences"]:
        assert np.sum(s["expert_counts"], axis=1).tolist() == [k * (lengths[s["sequence"]] + WORKLOAD.gen_len - 1)] * 2


@pytest.mark.slow
def test_the_skew_is_real(skewed_run):
    """Expert 0 draws well above its uniform share, activations tend to fall with the expert
    id, and the counts are far from uniform. At S = 1.5 the random router's own per-expert
    preference still reorders neighbours (test_strong_skew_orders_the_experts), so the trend
    is a rank correlation (seeds 0-3: rho -0.59 in the weakest layer, -0.84 and below in
    the others). The chi-square allows a design effect of 10: a sequence's tokens are
    correlated, so the counts are not independent draws."""
    _, trace, spec = skewed_run
    k, ne = spec.top_k, spec.num_experts
    for layer in trace["layers"]:
        counts = np.asarray(layer["expert_counts"], dtype=float)
        q = counts / layer["tokens"]
        assert q[0] >= 1.5 * k / ne, q
        rho = stats.spearmanr(np.arange(ne), counts).statistic
        assert rho <= -0.5, rho
        chi2 = stats.chisquare(counts).statistic
        assert chi2 / 10 > stats.chi2.isf(1e-6, ne - 1), chi2


@pytest.mark.slow
def test_distinct_experts_per_decode_micro_batch_within_5_percent(skewed_run):
    """D(t) = Σ_e 1 − (1 − q_e)^t with q from the layer's counts vs the mean measured distinct
    experts of the decode router calls of t tokens — in-sample, and out of sample (q from the
    first half of the rounds, measured on the second half). The uniform prediction misses by
    more (at least twice the skewed prediction's error), so the check tells skew from none."""
    _, trace, spec = skewed_run
    k, ne = spec.top_k, spec.num_experts
    rounds = sorted({m["round"] for m in trace["micro_batches"]})
    first, second = rounds[: len(rounds) // 2], rounds[len(rounds) // 2:]
    for layer in trace["layers"]:
        whole = from_counts([layer["expert_counts"]], [layer["tokens"]], k)
        calibration, _ = pooled(decode_calls(trace, layer["layer"], first), k)
        checks = [(whole, decode_calls(trace, layer["layer"])),
                  (calibration, decode_calls(trace, layer["layer"], second))]
        for routing, calls in checks:
            for t, (measured, n) in mean_distinct_by_size(calls).items():
                assert n >= 100
                error = relative_error(measured, float(expected_distinct_experts(routing, t)))
                assert abs(error) <= TOLERANCE, (layer["layer"], t, measured, error)
                no_skew = relative_error(measured, float(expected_distinct_experts(uniform(ne, k), t)))
                assert abs(no_skew) > 2 * abs(error), (layer["layer"], t, no_skew, error)


def round_requests(spec) -> list[set[int]]:
    """The request ids of each round, from the batching rule (padded: consecutive groups)."""
    policy = parse_policy(POLICY)
    requests = synthetic_requests(WORKLOAD, REQUESTS, spec.vocab_size, SEED)
    rounds = plan_rounds(requests, WORKLOAD, policy.num_micro_batches, policy.micro_batch_size)
    return [{req.rid for mb in batch for req in mb} for batch in rounds]


def hit_share_standard_error(trace: dict, position: int, rids: set[int], hot) -> float:
    """Standard error of the hit share Σ hits / Σ activations over the sequences ``rids``,
    with sequences as the independent units (a ratio estimator): a sequence's tokens are
    correlated, so counting activations as independent would understate it. From the
    per-sequence matrix (prompt and decode tokens)."""
    matrix = np.array([s["expert_counts"][position] for s in trace["sequences"] if s["sequence"] in rids], float)
    hits, activations = matrix[:, hot].sum(axis=1), matrix.sum(axis=1)
    share, n = hits.sum() / activations.sum(), len(matrix)
    return float(np.sqrt(n / (n - 1) * np.sum((hits - share * activations) ** 2)) / activations.sum())


@pytest.mark.slow
@pytest.mark.parametrize("cached", [1, 2])
def test_hot_expert_cache_hit_rate_within_5_percent(skewed_run, cached):
    """Share of decode activations that hit the C hottest experts (by the trace) vs
    h = Σ_{top C} q / k of the decode phase, within 5%. This is bookkeeping more than a
    prediction — both sides count the same activations, and differ only where the trace's
    hot set (prompt tokens included) is not the decode phase's."""
    path, trace, spec = skewed_run
    by_trace = hottest_experts(load_trace(path), cached)
    for p, layer in enumerate(trace["layers"]):
        decode, counts = pooled(decode_calls(trace, layer["layer"]), spec.top_k)
        measured = counts[by_trace[p]].sum() / counts.sum()
        error = relative_error(measured, cache_hit_rate(decode, cached))
        assert abs(error) <= TOLERANCE, (layer["layer"], cached, measured, error)


@pytest.mark.slow
@pytest.mark.parametrize("cached", [1, 2])
def test_hot_expert_cache_hit_rate_out_of_sample(skewed_run, cached):
    """The prediction proper: hot set and h from the decode calls of the first half of the
    rounds, the hit share measured on the second half (other requests). Not within 5%: with
    128 requests per half the sampling error of h is itself 3-8% (a sequence's tokens share
    experts: the per-sequence spread of a share is 1.5-1.7x that of independent tokens), and
    picking the hottest of near-tied experts biases h upwards. On seeds 0-3 the error ranged
    from -11% to +6% (C = 1) — so the bound is three standard errors of the difference."""
    _, trace, spec = skewed_run
    halves = np.array_split(np.arange(len(round_requests(spec))), 2)
    rids = [set().union(*(round_requests(spec)[r] for r in half)) for half in halves]
    for p, layer in enumerate(trace["layers"]):
        calibration, _ = pooled(decode_calls(trace, layer["layer"], set(halves[0].tolist())), spec.top_k)
        _, held_out = pooled(decode_calls(trace, layer["layer"], set(halves[1].tolist())), spec.top_k)
        hot = hottest_experts(calibration, cached)[0]
        measured, predicted = held_out[hot].sum() / held_out.sum(), cache_hit_rate(calibration, cached)
        error = np.hypot(*(hit_share_standard_error(trace, p, r, hot) for r in rids))
        assert abs(measured - predicted) <= 3 * error, (layer["layer"], cached, measured, predicted, error)
