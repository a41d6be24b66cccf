"""Cross-check the profiler's CPU numbers against an independent plain-numpy measurement.

For STREAM copy, STREAM triad and fp32 matmul (K = N = 4096, a few M), this runs the
profiler's own measurement and an independent one written here from scratch (plain
``threading.Thread`` workers instead of the profiler's pool, slice assignment instead of
``np.copyto``, an expression triad instead of ufunc ``out=`` calls, ``x @ w`` instead of
``np.matmul(out=)``), alternating single samples of the two (which one goes first
alternates too) so that load from other tenants of a shared machine hits both alike. It
prints, as a table, both medians, their ratio (must be within 0.9-1.1), the ratio of the
best samples (interference only slows a sample down, so the best is the least disturbed
estimate on a shared host) and the repeat-to-repeat spread ((max-min)/median) of each side.

    python benchmarks/profiler_bench.py [--samples 25] [--array-mib N]

Exit code 0 when every ratio is within 0.9-1.1, 1 otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from hrm.units import GB, MIB
from profiler import cpu as cpu_mod
from profiler.timing import TimedOp, measure

RATIO_LOW, RATIO_HIGH = 0.9, 1.1
MATMUL_K = MATMUL_N = 4096
MATMUL_MS = (1, 64, 1024)


# --- the independent measurements (no profiler code) ------------------------------------
# Each returns a sampler: a callable that runs the operation once and returns its rate.

def _split(n: int, parts: int) -> list[tuple[int, int]]:
    step = -(-n // parts)
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def _threaded_wall_s(work, n: int, threads: int) -> float:
    """Start one Thread per slice, time from the first start to the last join."""
    workers = [threading.Thread(target=work, args=bounds) for bounds in _split(n, threads)]
    start_s = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return time.perf_counter() - start_s


def independent_copy(a: np.ndarray, b: np.ndarray, threads: int) -> Callable[[], float]:
    """b[:] = a per thread slice -> GB/s counting 16 bytes per float64 element (read + write)."""

    def work(lo: int, hi: int) -> None:
        b[lo:hi] = a[lo:hi]

    return lambda: 2 * a.nbytes / _threaded_wall_s(work, a.size, threads) / GB


def independent_triad(a: np.ndarray, b: np.ndarray, c: np.ndarray, threads: int,
                      block: int = 1 << 16) -> Callable[[], float]:
    """a = b + 3*c in 512 KiB blocks per thread slice -> GB/s counting 24 bytes per element."""

    def work(lo: int, hi: int) -> None:
        for start in range(lo, hi, block):
            stop = min(hi, start + block)
            a[start:stop] = b[start:stop] + 3.0 * c[start:stop]

    return lambda: 3 * a.nbytes / _threaded_wall_s(work, a.size, threads) / GB


def independent_matmul(m: int) -> Callable[[], float]:
    """x @ w with random fp32 data, wall-clocked -> TFLOP/s."""
    rng = np.random.default_rng(m)
    x = rng.standard_normal((m, MATMUL_K), dtype=np.float32)
    w = rng.standard_normal((MATMUL_K, MATMUL_N), dtype=np.float32)

    def sample() -> float:
        start_s = time.perf_counter()
        x @ w
        return 2.0 * m * MATMUL_K * MATMUL_N / (time.perf_counter() - start_s) / 1e12

    return sample


# --- the comparison ---------------------------------------------------------------------

def spread_pct(values: list[float]) -> float:
    return 100.0 * (max(values) - min(values)) / statistics.median(values)


def profiler_sampler(op: TimedOp, work: float, scale: float) -> Callable[[], float]:
    """One sample of a profiler timed op through the profiler's own statistics."""
    return lambda: measure(op, 0, 1).median_rate(work) / scale


def alternate(mine: Callable[[], float], theirs: Callable[[], float], samples: int) -> tuple[list, list]:
    """One warm-up each, then ``samples`` pairs, alternating which goes first."""
    mine(), theirs()
    a, b = [], []
    for index in range(samples):
        if index % 2:
            b.append(theirs())
            a.append(mine())
        else:
            a.append(mine())
            b.append(theirs())
    return a, b


def compare(samples: int, array_bytes: int, threads: int) -> list[dict]:
    """Profiler vs independent for copy, triad and fp32 matmul at MATMUL_MS."""
    n = array_bytes // 8
    a, b, c = (cpu_mod.touched_array(n, v) for v in (1.0, 2.0, 0.5))
    factory = cpu_mod.numpy_matmul_factory(MATMUL_K, MATMUL_N)
    rows = []
    with ThreadPoolExecutor(threads) as pool:
        pairs = [("cpu copy GB/s", profiler_sampler(cpu_mod.copy_op(a, b, pool, threads), 2 * a.nbytes, GB),
                  independent_copy(a, b, threads)),
                 ("cpu triad GB/s", profiler_sampler(cpu_mod.triad_op(a, b, c, pool, threads), 3 * a.nbytes, GB),
                  independent_triad(a, b, c, threads))]
        pairs += [(f"cpu fp32 matmul M={m} TFLOP/s",
                   profiler_sampler(factory(m), 2.0 * m * MATMUL_K * MATMUL_N, 1e12), independent_matmul(m))
                  for m in MATMUL_MS]
        for name, mine, theirs in pairs:
            p, q = alternate(mine, theirs, samples)
            rows.append({"quantity": name, "profiler": statistics.median(p), "independent": statistics.median(q),
                         "ratio": statistics.median(p) / statistics.median(q), "best_ratio": max(p) / max(q),
                         "profiler_spread_pct": spread_pct(p), "independent_spread_pct": spread_pct(q),
                         "samples": samples})
    return rows


def render(rows: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("quantity", "profiler median", "indep. median", "ratio", "ratio of bests", "spread profiler",
                   "spread indep.", "n", "ok"):
        table.add_column(column, justify="left" if column == "quantity" else "right",
                         no_wrap=column == "quantity")
    for row in rows:
        ok = RATIO_LOW <= row["ratio"] <= RATIO_HIGH
        table.add_row(row["quantity"], f"{row['profiler']:.4g}", f"{row['independent']:.4g}", f"{row['ratio']:.3f}", f"{row['best_ratio']:.3f}",
                      f"{row['profiler_spread_pct']:.1f}%", f"{row['independent_spread_pct']:.1f}%",
                      str(row["samples"]), "yes" if ok else "NO")
    Console(width=max(120, Console().width)).print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=25, help="alternating samples per side and quantity")
    parser.add_argument("--array-mib", type=int, default=0, help="STREAM array MiB (0 = the profiler's choice)")
    args = parser.parse_args(argv)
    host = cpu_mod.host_info()
    array_bytes = args.array_mib * MIB or cpu_mod.stream_array_bytes(host.llc_bytes, host.memory_gib)
    start_s = time.perf_counter()
    rows = compare(args.samples, array_bytes, host.cores)
    title = (f"profiler vs independent numpy on {host.cpu_name}, {host.cores} threads, "
             f"{array_bytes >> 20} MiB arrays, K=N={MATMUL_K}, {args.samples} alternating samples each "
             f"({time.perf_counter() - start_s:.0f} s)")
    render(rows, title)
    return 0 if all(RATIO_LOW <= r["ratio"] <= RATIO_HIGH for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
