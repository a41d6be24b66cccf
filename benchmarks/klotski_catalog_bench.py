"""Klotski's search time on every catalog model (issue 24's must-show: median and max).

For each catalog MoE model on each machine: the seconds ``hrm-search --engine klotski``
takes, whether it was proven optimal or stopped at its time limit
(``solver.expert_level.SEARCH_TIME_LIMIT_S``) and the gap it reports. Seconds are of this
machine, measured in one run (compare them with each other, not across machines).

Run: python benchmarks/klotski_catalog_bench.py [--hw l4,rtx3090] [--cpu-mem GIB] [--models a,b]
(``--cpu-mem 512``: ample host memory, every catalog model feasible; issue 35's 16 cases).
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

from hrm.errors import HRMError
from hrm.machine.hardware import load_hardware
from hrm.cost.memory import memory_limits
from hrm.model.spec import list_catalog, load_model
from hrm.workload import make_workload
from solver.search import search


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hw", default="l4,rtx3090")
    parser.add_argument("--cpu-mem", type=float, help="host memory in GiB (as hrm-search --cpu-mem)")
    parser.add_argument("--models", help="catalog models (comma-separated; default every MoE model)")
    args = parser.parse_args()
    seconds = []
    print(f"{'hw':<9} {'model':<22} {'s':>6}  {'result':<22} policy")
    for hw_name in args.hw.split(","):
        hw = load_hardware(hw_name)
        limits = memory_limits(hw, cpu_mem_gib=args.cpu_mem)
        for name in args.models.split(",") if args.models else list_catalog():
            model = load_model(name)
            if model.num_experts <= 1 or name.startswith("tiny") or name.startswith("small"):
                continue
            start = time.perf_counter()
            try:
                result = search(hw, model, make_workload(), engine="klotski", top=0, limits=limits)
                gap = re.search(r"at most ([\d.]+%) better", " ".join(result.stats.notes))
                what = "optimal" if result.plan.solver.optimal else f"stopped, gap {gap.group(1) if gap else '?'}"
                what += f" ({result.iterations} of {result.stats.modes_total:,})"
                policy = result.best.policy.short()
            except HRMError as exc:
                what, policy = "refused/infeasible", str(exc)[:60]
            took = time.perf_counter() - start
            seconds.append(took)
            print(f"{hw_name:<9} {name:<22} {took:6.1f}  {what:<22} {policy}")
    print(f"\n{len(seconds)} searches: median {statistics.median(seconds):.1f} s, max {max(seconds):.1f} s")


if __name__ == "__main__":
    main()
