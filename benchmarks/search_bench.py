"""hrm-search speed and exactness over the whole catalog.

Every catalog model × every shipped profile it fits × the three workload presets: the
in-process ``solver.search`` time (median and max over the cases, each the best of
``--repeats`` runs), the process start-up of ``hrm-search --help``, and the gap between the
search's optimum and the verifier's dense sweep over every μ (``--verify``: every mode's
per-step bound, every (n, m) of the modes the bounds leave open). ``--before FILE`` (a JSON
list of {model, hw, wl, s, tok_s} from an older build) adds its times and its gap to the
dense optimum.

Run: python benchmarks/search_bench.py [--repeats 1] [--verify] [--before before.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hrm.errors import HRMError
from hrm.machine.hardware import list_profiles, load_hardware
from hrm.model.spec import list_catalog, load_model
from hrm.workload import PRESETS, make_workload
from solver.search import search


def startup_seconds(repeats: int = 5) -> float:
    """Median wall time of ``hrm-search --help`` in a fresh interpreter."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "from hrm_cli import search_main; search_main(['--help'])"],
                       capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--verify", action="store_true", help="also run the verifier's dense sweep per case")
    parser.add_argument("--before", help="JSON results of an older build to compare with")
    parser.add_argument("--json", help="write the per-case results here")
    args = parser.parse_args()
    before = {(r["model"], r["hw"], r["wl"]): r for r in json.loads(Path(args.before).read_text())} if args.before else {}
    rows, console = [], Console(width=220)
    for model_name in list_catalog():
        model = load_model(model_name)
        for hw_name in list_profiles():
            hw = load_hardware(hw_name)
            for preset in PRESETS:
                wl = make_workload(preset)
                times, result = [], None
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    try:
                        result = search(hw, model, wl, engine="ideal")
                    except HRMError:
                        result = None
                        break
                    times.append(time.perf_counter() - start)
                if result is None:
                    continue
                row = {"model": model_name, "hw": hw_name, "wl": preset, "s": min(times),
                       "tok_s": result.stats.objective_value, "policy": result.best.policy.short(),
                       "modes": result.stats.modes_total, "solved": result.iterations}
                if args.verify:
                    checked = search(hw, model, wl, top=0, verify=True, engine="ideal")
                    row["verify_s"] = checked.verify_seconds
                    row["gap"] = 1 - checked.stats.objective_value / checked.verify_objective
                old = before.get((model_name, hw_name, preset))
                if old and old.get("tok_s"):
                    row["before_s"] = old["s"]
                    row["before_gap"] = 1 - old["tok_s"] / row["tok_s"]
                rows.append(row)
    table = Table(title="hrm-search over the catalog (best of repeats, in-process)")
    for col in ("model", "hardware", "workload", "policy", "modes (solved)", "s", "verify s", "gap vs dense",
                "before s", "before gap"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["model"], r["hw"], r["wl"], r["policy"], f"{r['modes']} ({r['solved']})", f"{r['s']:.3f}",
                      f"{r['verify_s']:.2f}" if "verify_s" in r else "-", f"{r['gap']:.1e}" if "gap" in r else "-",
                      f"{r['before_s']:.3f}" if "before_s" in r else "-",
                      f"{r['before_gap']:.2%}" if "before_gap" in r else "-")
    console.print(table)
    secs = [r["s"] for r in rows]
    summary = Table(title="summary")
    for col in ("cases", "median s", "max s", "hrm-search start-up s", "max verify s", "max gap vs dense",
                "before: median s", "before: max s", "before: max gap"):
        summary.add_column(col)
    olds = [r["before_s"] for r in rows if "before_s" in r]
    summary.add_row(str(len(rows)), f"{statistics.median(secs):.3f}", f"{max(secs):.3f}", f"{startup_seconds():.3f}",
                    f"{max(r['verify_s'] for r in rows):.2f}" if args.verify else "-",
                    f"{max(r['gap'] for r in rows):.1e}" if args.verify else "-",
                    f"{statistics.median(olds):.3f}" if olds else "-", f"{max(olds):.3f}" if olds else "-",
                    f"{max(r['before_gap'] for r in rows if 'before_gap' in r):.2%}" if olds else "-")
    console.print(summary)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
