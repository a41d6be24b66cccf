"""``hrm sweep GRID.yaml --out results.parquet``: one search per cell of a grid, as Parquet."""

from __future__ import annotations

import time

from hrm_cli.parser import EXIT_CODES, ArgumentParser
from hrm_cli.common import check_input_file, progress_bar
from hrm import bounds
from hrm.errors import HRMError

#: a grid with more cells than this to run is announced on stderr (count and expected time)
#: before it starts: a few lists of a few values multiply to thousands of searches
LARGE_GRID_CELLS = 500
#: typical seconds of one cell on one core, for that announcement: docs/sweep_bench.md measured
#: 720 cells in 43.5 s inline on a 2-core machine (Klotski and many-expert cells take longer)
TYPICAL_CELL_S = 0.06

GRID_HELP = """GRID.yaml (every combination of the lists is one cell; paths are relative to the grid file):
  hardware: [l4, t4, a100-80g]              # profile names or YAML files
  models: [mixtral, mixtral-8x22b]          # catalog names or config.json files
  workloads: [mtbench, {prompt_len: 512, gen_len: 32}]
  engines: [ideal, moe-lightning, flexgen]  # names, YAML files, or ideal/SCHEDULE
  routings: [uniform, zipf:1.2]             # applied to every model (default uniform)
  batch_sizes: [null, 1, 64]                # pinned N as --fix N= (null: searched, the default)
  what_if:                                  # each axis optional; null = as profiled
    h2d_gbps: [16, 32, 64]                  # CPU->GPU link
    cpu_scale: [1, 2]                       # CPU FLOP/s, bandwidth and memory x ratio
    gpu_mem_gib: [null, 48]                 # total GPU memory
    cpu_mem_gib: [null, 512]
  objective: generation                     # or decode, latency; also max_batch, gpu_util, cpu_util,
                                            # weight_dtype, kv_dtype as the hrm-search flags

Output: one row per cell (inputs, cell_key, status ok|infeasible|refused|error, reason, policy,
throughputs, per-token latency, bottleneck, binding memory, solve_s); read it with
pandas.read_parquet or DuckDB. Cells whose cell_key is already in --out are skipped."""


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="hrm sweep", description=(
        "Run hrm-search on every cell of a hardware x model x workload x engine x what-if grid; "
        "results as one Parquet row per cell. Resumable: rerun the same command to finish an interrupted "
        "sweep."), epilog=GRID_HELP + "\n\n" + EXIT_CODES)
    parser.add_argument("grid", metavar="GRID.yaml", help="the grid (see below)")
    parser.add_argument("--out", required=True, metavar="FILE.parquet",
                        help="results; cells already in it are skipped; saved atomically as the sweep goes")
    parser.add_argument("--workers", type=bounds.CORES.flag("--workers"),
                        help="worker processes (default: this machine's cores; with --ray, CPUs of a local Ray)")
    parser.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                        help="run the cells as Ray tasks: a local Ray (no ADDRESS), 'auto' (the running cluster) "
                             "or ray://HOST:PORT; cluster nodes need hrm-moe installed")
    parser.add_argument("--save-every", type=bounds.BUDGET_S.flag("--save-every"), default=30.0, metavar="S",
                        help="seconds between saves of --out while the sweep runs (default 30)")
    parser.add_argument("--dry-run", action="store_true", help="count the cells (and those already done) and stop")
    return parser


def expected_seconds(cells: int, workers: int) -> float:
    """Rough wall-clock seconds of ``cells`` searches on ``workers`` processes."""
    return cells * TYPICAL_CELL_S / max(1, workers)


def large_grid_warning(todo: int, workers: int, where: str) -> str | None:
    """The stderr line that announces a large sweep, or None below :data:`LARGE_GRID_CELLS`."""
    if todo <= LARGE_GRID_CELLS:
        return None
    seconds = expected_seconds(todo, workers)
    took = f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
    return (f"warning: {todo:,} cells to run, about {took} {where} at {TYPICAL_CELL_S} s per cell per core "
            f"(more for Klotski or many-expert models); --dry-run counts them, Ctrl-C stops and keeps what is "
            f"done (rerun to resume)")


def sweep_progress(label: str):
    """(context, ``update(done, total)``): a rich bar on a terminal, a line per report where
    ``HRM_PROGRESS=1`` asks for progress elsewhere (logs, CI), nothing otherwise; stderr only."""
    import sys

    from hrm.progress import Progress, progress_enabled

    if sys.stderr.isatty() or not progress_enabled():
        return progress_bar(label)
    lines = Progress(label)

    def update(done: int, total: int) -> None:
        lines.total = total
        lines(done)

    return lines, update


def main(argv) -> int:
    args = build_parser().parse_args(argv)
    from hrm.plan import check_output_path
    from solver.grid import count_cells, grid_cells, read_grid
    from solver.sweep import read_rows, run_sweep

    check_input_file(args.grid, "GRID.yaml")
    check_output_path(args.out, "--out")
    if not args.out.endswith(".parquet"):
        raise HRMError(f"--out {args.out}: a sweep writes Parquet; name the file *.parquet")
    grid = read_grid(args.grid)
    import os
    import sys

    done = read_rows(args.out) if os.path.exists(args.out) else []
    if args.dry_run:  # counted, not expanded: a grid at the cell cap is counted in milliseconds
        count = count_cells(grid, args.grid, done)
        print(f"{count.cells} cells ({count.distinct} distinct), {count.done} already in {args.out}, "
              f"{count.distinct - count.done} to run")
        return 0
    cells = grid_cells(grid, args.grid)
    have = {row["cell_key"] for row in done}
    keys = {cell.key() for cell in cells}
    todo = len(keys - have)
    backend = "ray" if args.ray else "local"
    print(f"{len(cells)} cells ({len(keys)} distinct), {len(keys & have)} already in {args.out}, {todo} to run"
          + f" on {backend}" + (f" ({args.ray})" if args.ray and args.ray != 'local' else ""))
    on_cluster = args.ray not in (None, "local")
    workers = 1 if on_cluster else (args.workers or os.cpu_count() or 1)
    where = "on one core (a cluster divides it by its cores)" if on_cluster else \
        f"on {workers} worker{'s' if workers > 1 else ''}"
    warning = large_grid_warning(todo, workers, where)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    start = time.perf_counter()
    progress, update = sweep_progress("sweep")
    with progress:
        table = run_sweep(cells, backend, args.workers, None if args.ray in (None, "local") else args.ray,
                          out=args.out, save_every_s=args.save_every, progress=update)
    seconds = time.perf_counter() - start
    mine = table[table["cell_key"].isin(keys)]
    counts = mine["status"].value_counts()
    rate = f", {todo / seconds:.1f} cells/s" if todo and seconds > 0 else ""
    print(f"{args.out}: {len(table)} rows; this grid: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in
                                                                    ("ok", "infeasible", "refused", "error"))
          + f"; ran {todo} cells in {seconds:.1f} s{rate}")
    return 0
