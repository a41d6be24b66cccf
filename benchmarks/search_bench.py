"""Median hrm-search solve time (seconds) on this machine, plus the optimality gap vs the
exhaustive verifier. Run: python benchmarks/search_bench.py [--repeats 5]."""

from __future__ import annotations

import argparse
import statistics
import time

from rich.console import Console
from rich.table import Table

from hrm.hardware import load_hardware
from hrm.model import load_model
from hrm.workload import make_workload
from solver.search import search

CASES = [(hw, "mixtral", wl) for hw in ("t4", "l4", "a100-80g") for wl in ("mtbench", "synthetic-reasoning", "summarization")]
CASES.append(("4xt4", "dbrx", "mtbench"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--solver", default="auto")
    args = parser.parse_args()
    table = Table(title=f"hrm-search solve time, median of {args.repeats} (top-3 alternatives included)")
    for col in ("hardware", "model", "workload", "policy", "gen tok/s", "median s", "min s", "max s", "solver", "gap vs exhaustive"):
        table.add_column(col)
    for hw_name, model_name, preset in CASES:
        hw, model, wl = load_hardware(hw_name), load_model(model_name), make_workload(preset)
        times, result = [], None
        for _ in range(args.repeats):
            start = time.perf_counter()
            result = search(hw, model, wl, solver=args.solver)
            times.append(time.perf_counter() - start)
        checked = search(hw, model, wl, solver=args.solver, top=0, verify=True)
        gap = 1 - checked.extras["objective"] / checked.verify_objective
        table.add_row(hw_name, model_name, preset, result.best.policy.short(),
                      f"{result.best.estimate.generation_throughput_tok_s:,.1f}", f"{statistics.median(times):.3f}",
                      f"{min(times):.3f}", f"{max(times):.3f}", result.solver_name, f"{gap:.2e}")
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
