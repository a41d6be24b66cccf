#!/usr/bin/env python3
"""docs/validation/ground_truth.md §3's table: every committed FlexGen run measured on a lent GPU
against HRM's prediction of its command (as ``hrm import --from flexgen`` reads it) on the
profile measured on that box.

    python benchmarks/ground_truth/flexgen_table.py [--runs docs/validation/runs/flexgen-h100.yaml]
        [--write docs/validation/ground_truth.md]

Columns: measured and predicted TTFT (FlexGen's prefill latency), TPOT (its decode latency over
gen_len - 1) and generation throughput, each ratio predicted / measured. ``--write`` replaces the
text between the file's ``<!-- flexgen-table -->`` and ``<!-- /flexgen-table -->`` markers.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from hrm.analysis.calibrate import predict_run
from hrm.analysis.calibration_runs import load_runs, run_as_commanded, runs_model
from hrm.machine.hardware import load_hardware

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = (("ttft_s", "TTFT s", 1.0), ("tpot_s", "TPOT ms", 1e3), ("generation_throughput_tok_s", "tok/s", 1.0))
MARKERS = ("<!-- flexgen-table -->", "<!-- /flexgen-table -->")


def table(path: Path) -> str:
    runs = load_runs(path)
    hw, model = load_hardware(runs.hardware), runs_model(runs)
    head = "| run | engine | " + " | ".join(f"{label} measured | predicted | ratio" for _, label, _ in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (2 + 3 * len(COLUMNS))]
    ratios = []
    for run in runs.runs:
        commanded = run_as_commanded(run, hw, model)
        predicted = dict(zip((m.quantity for m in run.measured), predict_run(hw, model, commanded)))
        measured = {m.quantity: m.value for m in run.measured}
        cells = []
        for quantity, _, scale in COLUMNS:
            ratio = predicted[quantity] / measured[quantity]
            cells.append(f"{measured[quantity] * scale:.4g} | {predicted[quantity] * scale:.4g} | {ratio:.2f}")
        ratios.append(predicted["generation_throughput_tok_s"] / measured["generation_throughput_tok_s"])
        lines.append(f"| {run.label} | {commanded.engine.name} | " + " | ".join(cells) + " |")
    within = sum(1 / 1.25 <= r <= 1.25 for r in ratios)
    lines.append("")
    lines.append(f"Throughput predicted / measured: median {statistics.median(ratios):.3f}, range "
                 f"{min(ratios):.2f}-{max(ratios):.2f}, {within} of {len(ratios)} runs within 1.25x.")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default=str(ROOT / "docs/validation/runs/flexgen-h100.yaml"))
    ap.add_argument("--write", help="replace the table between the markers of this markdown file")
    args = ap.parse_args(argv)
    text = table(Path(args.runs))
    if not args.write:
        print(text)
        return 0
    doc = Path(args.write).read_text()
    start, end = doc.find(MARKERS[0]), doc.find(MARKERS[1])
    if start < 0 or end < start:
        print(f"error: {args.write}: no {MARKERS[0]} ... {MARKERS[1]} markers", file=sys.stderr)
        return 2
    Path(args.write).write_text(doc[:start + len(MARKERS[0])] + "\n" + text + "\n" + doc[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
