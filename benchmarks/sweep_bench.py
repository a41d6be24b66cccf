"""hrm sweep throughput: cells per second of one grid on each backend, in one run.

The grid (default: every shipped GPU profile × Mixtral-8x7B, 8x22B × the three presets ×
ideal, moe-lightning, flexgen × two links × two CPU scales: 720 cells) is run in this
process (``inline``), on the local process pool with 1 .. --workers workers, and as Ray
tasks on a local Ray (start-up included). Every backend's table must equal the inline one
but for the measured ``solve_s`` column; the run stops with an error otherwise.

Run: python benchmarks/sweep_bench.py [--grid GRID.yaml] [--workers 2] [--no-ray]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hrm.machine.hardware import list_profiles, load_hardware
from solver.grid import SweepGrid, grid_cells, read_grid
from solver.sweep import MEASURED_COLUMNS, run_sweep


def default_grid() -> SweepGrid:
    gpus = [name for name in list_profiles() if load_hardware(name).gpu is not None]
    return SweepGrid(hardware=gpus, models=["mixtral", "mixtral-8x22b"],
                     workloads=["mtbench", "synthetic-reasoning", "summarization"],
                     engines=["ideal", "moe-lightning", "flexgen"],
                     what_if={"h2d_gbps": [None, 32], "cpu_scale": [1, 2]})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--grid", help="a GRID.yaml (default: the grid of the module docstring)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args()
    grid = read_grid(args.grid) if args.grid else default_grid()
    cells = grid_cells(grid, args.grid)
    runs = [("inline", 1)] + [("local", w) for w in range(1, args.workers + 1)]
    if not args.no_ray:
        runs.append(("ray", args.workers))
    table = Table(title=f"hrm sweep: {len(cells)} cells, {os.cpu_count()} cores")
    for col in ("backend", "workers", "wall s", "cells/s", "vs inline", "rows equal inline"):
        table.add_column(col, justify="right")
    reference, base = None, None
    with tempfile.TemporaryDirectory() as tmp:
        for index, (backend, workers) in enumerate(runs):
            out = Path(tmp) / f"{index}.parquet"
            start = time.perf_counter()
            result = run_sweep(cells, backend, workers, out=out)
            seconds = time.perf_counter() - start
            result = result.drop(columns=list(MEASURED_COLUMNS))
            if reference is None:
                reference, base = result, seconds
            equal = result.equals(reference)
            if not equal:
                raise SystemExit(f"{backend} x{workers}: rows differ from the inline run")
            table.add_row(backend, str(workers), f"{seconds:.1f}", f"{len(cells) / seconds:.1f}",
                          f"{base / seconds:.2f}x", "yes")
    status = reference["status"].value_counts()
    Console(width=160).print(table)
    print("statuses: " + ", ".join(f"{count} {name}" for name, count in status.items()))


if __name__ == "__main__":
    main()
