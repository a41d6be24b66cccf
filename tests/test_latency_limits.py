"""Latency objective and limits (issue 13, item 5): --objective latency, --max-tpot-ms,
--max-ttft-s. The search must stay exact under the limits: it agrees with the verifier's
enumeration and MILP (both apply the limits independently of the bisection), every result
meets its limits in the estimate, and tightening a limit never raises throughput."""

from __future__ import annotations

import numpy as np
import pytest

from hrm.errors import HRMError, InfeasibleError
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.workload import make_workload
from hrm_cli import main
from solver.lanes.exact import convex_argmin, first_where, last_where
from solver.search import search
from solver.lanes.terms import LatencyLimits

WL = make_workload("mtbench", gen_len=16)


def test_bisection_helpers_on_hand_arrays():
    values = np.array([[9, 7, 4, 3, 3, 5, 8], [1, 2, 3, 4, 5, 6, 7]], dtype=float)

    def f(sel, m):
        return values[sel, m]

    lo, hi = np.array([0, 0]), np.array([6, 6])
    at, _ = convex_argmin(f, lo, hi)
    assert list(at) == [3, 0]  # the first of the tie 3, 3; a rising row's least is its first
    under = lambda sel, m: values[sel, m] <= 4.5  # noqa: E731
    assert list(first_where(under, lo, at)) == [2, 0]
    assert list(last_where(under, at, hi)) == [4, 3]
    never = lambda sel, m: values[sel, m] < 0  # noqa: E731
    assert list(first_where(never, lo, hi)) == [7, 7] and list(last_where(never, lo, hi)) == [-1, -1]


@pytest.fixture(scope="module")
def unconstrained():
    return search(load_hardware("l4"), load_model("mixtral"), WL, top=0, engine="ideal")


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [1.0, 0.08])  # the unconstrained optimum, and a limit that binds hard
def test_tpot_limit_met_exact_and_monotone(unconstrained, fraction):
    hw, model = load_hardware("l4"), load_model("mixtral")
    free = unconstrained.best.estimate
    limit = free.per_token_latency_s * fraction
    found = search(hw, model, WL, top=0, latency_limits=LatencyLimits(tpot_s=limit), verify=True, engine="ideal")
    est = found.best.estimate
    assert est.per_token_latency_s <= limit * (1 + 1e-9)
    assert found.verified, (found.stats.objective_value, found.verify_objective)
    assert est.generation_throughput_tok_s <= free.generation_throughput_tok_s * (1 + 1e-12)
    if fraction == 1.0:  # the unconstrained optimum meets its own TPOT: same optimum
        assert est.generation_throughput_tok_s == pytest.approx(free.generation_throughput_tok_s, rel=1e-12)
    else:
        assert est.generation_throughput_tok_s < free.generation_throughput_tok_s


@pytest.mark.slow
def test_ttft_limit_and_both_limits():
    hw, model = load_hardware("l4"), load_model("mixtral")
    both = LatencyLimits(tpot_s=3.0, ttft_s=10.0)
    found = search(hw, model, WL, top=0, latency_limits=both, verify=True, engine="ideal")
    est = found.best.estimate
    assert est.per_token_latency_s <= 3.0 * (1 + 1e-9) and est.prefill_latency_s <= 10.0 * (1 + 1e-9)
    assert found.verified
    assert "subject to TPOT <= 3000 ms and TTFT <= 10 s" in found.plan.solver.name
    looser = search(hw, model, WL, top=0, latency_limits=LatencyLimits(tpot_s=3.0), engine="ideal")
    assert est.generation_throughput_tok_s <= looser.best.estimate.generation_throughput_tok_s * (1 + 1e-12)


def test_latency_objective_is_least_tpot_at_the_pinned_batch():
    hw, model = load_hardware("l4"), load_model("mixtral")
    for batch in (1, 8):
        found = search(hw, model, WL, top=0, objective="latency", fixed={"batch_size": batch}, verify=True, engine="ideal")
        assert found.best.policy.batch_size == batch and found.verified
        # no policy at this batch has a smaller TPOT: a limit just below it is infeasible
        tpot = found.best.estimate.per_token_latency_s
        with pytest.raises(InfeasibleError, match="latency limit binds"):
            search(hw, model, WL, top=0, fixed={"batch_size": batch}, latency_limits=LatencyLimits(tpot_s=tpot * 0.999), engine="ideal")


def test_latency_objective_needs_a_batch():
    with pytest.raises(HRMError, match="--fix N=1"):
        search(load_hardware("l4"), load_model("mixtral"), WL, objective="latency", engine="ideal")


@pytest.mark.parametrize("flags,code,needle", [
    (["--max-tpot-ms", "50"], 3, "latency limit binds: --max-tpot-ms 50 ms: the fastest policy for 1 request(s) has TPOT"),
    (["--max-ttft-s", "0.1"], 3, "--max-ttft-s 0.1 s"),
    (["--max-tpot-ms", "0"], 2, "--max-tpot-ms"),
    (["--max-tpot-ms", "abc"], 2, "--max-tpot-ms"),
    (["--objective", "latency"], 2, "pin it, e.g. --fix N=1"),
    (["--max-tpot-ms", "100", "--gen-len", "1"], 2, "needs --gen-len >= 2"),
])
def test_cli_refusals(capsys, flags, code, needle):
    args = ["search", "--hw", "l4", "--model", "mixtral", *([] if "--gen-len" in flags else ["--gen-len", "16"]), *flags]
    try:
        rc = main(args)
    except SystemExit as exc:  # argparse: a malformed flag value
        rc = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == code and len(err) == 1 and err[0].startswith("error:") and needle in err[0], err


def test_cli_prints_the_limits_and_compare_shows_latency(capsys):
    assert main(["search", "--hw", "l4", "--model", "mixtral", "--gen-len", "16", "--max-tpot-ms", "3000",
                 "--engine", "ideal"]) == 0
    out = capsys.readouterr().out
    assert "latency limits" in out and "<= 3000 ms" in out
    # the compare table's TPOT and TTFT columns: test_compare_plot_every_engine (one compare run)


def test_compare_plot_every_engine(tmp_path, capsys):
    from hrm.engines.engine import list_engines
    from hrm.engines.schedules import SCHEDULES

    png = tmp_path / "compare.png"
    assert main(["search", "--hw", "l4", "--model", "mixtral", "--gen-len", "16", "--compare", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "plot written to" in out and "moe-lightning" in out
    assert "TPOT" in out and "TTFT" in out  # the compare shows latency
    assert "hrm-runtime" not in out  # the reference runtime is a row only when asked for (below)
    from solver.analyses import compare_engines

    # every shipped engine but the reference runtime, and ideal's other schedules, are rows; asked
    # for, the reference runtime is one more row, labelled as such, tied with ideal (datasheet l4)
    rows = {row.label: row.result for row in
            compare_engines(load_hardware("l4"), load_model("mixtral"), WL, with_reference=True)}
    engines = [e for e in list_engines() if e != "hrm-runtime"]
    assert sorted(rows) == sorted(engines + [f"ideal/{s}" for s in SCHEDULES if s != "cgopipe"]
                                  + ["hrm-runtime (reference runtime)"])
    reference = rows["hrm-runtime (reference runtime)"]
    assert reference.best.estimate.generation_throughput_tok_s == rows["ideal"].best.estimate.generation_throughput_tok_s
    assert main(["search", "--hw", "l4", "--model", "mixtral", "--plot", str(tmp_path / "x.png")]) == 2
    assert "add --compare" in capsys.readouterr().err


def test_compare_table_and_ranking_by_objective():
    from hrm.plots import compare_table, plot_compare
    from solver.analyses import compare_engines

    hw, model = load_hardware("l4"), load_model("mixtral")
    common = dict(objective="latency", fixed={"batch_size": 4}, max_batch=4)
    rows = compare_engines(hw, model, WL, **common)
    table = compare_table(rows)
    feasible = table[table["reason"] == ""]
    tpot = feasible["per_token_latency_s"].to_list()
    assert tpot == sorted(tpot) and len(feasible) >= 5  # least TPOT first at N = 4
    assert plot_compare(table, "t").axes[1].get_xscale() == "log"
