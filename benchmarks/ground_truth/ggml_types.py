"""Every ggml weight type's CPU MUL_MAT_ID kernel, measured on this host (docs/validation/ggml_types.md).

The CPU experts of a machine with a GPU (``--n-cpu-moe``, ``-ot exps=CPU``) run in ggml's plain CPU
kernels: llama.cpp keeps them in the GPU's pinned host buffer, ahead of the CPU's repacking buffer
(src/llama-model.cpp make_cpu_buft_list), so the probe runs with HRM_PROBE_NO_REPACK=1. For each
type: seconds per weight element at 1-64 rows per expert, 1 and 2 threads, with the weights
cycled through a cache-sized pool (the kernel's own work: :mod:`hrm.machine.ggml_prior` turns it
into cycles per element with the probe's ``clock``) and a DRAM-sized one (what the prior is checked
against). Every other process is paused while it runs (benchmarks/ground_truth/paused.py).

    python benchmarks/ground_truth/ggml_types.py --llama-cpp TREE [--build build] [--isa avx512] --out FILE.yaml
    python benchmarks/ground_truth/ggml_types.py --table    # docs/validation/ggml_types.md's table
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from hrm.machine.ggml_prior import PRIOR_TYPES  # noqa: E402
from profiler.ggml_cpu import PROBE_SOURCE, run_probe  # noqa: E402

#: rows per expert measured: one user's decode (1) to a few users' or a short prompt's
ROWS = (1, 2, 4, 8, 16, 64)
#: the cache-sized pool (this VM's last-level cache holds it; the kernel's own work) and the
#: DRAM-sized one (a model's experts, read once a step)
CACHE_POOL_MIB, DRAM_POOL_MIB = 32.0, 1024.0
REPEATS = 7
#: dependent adds the clock probe times per repeat
CLOCK_ADDS = 200_000_000


def build(tree: Path, build_dir: str) -> Path:
    """The probe compiled against ``tree/build_dir/bin`` (its own libraries: an AVX2 build beside the
    AVX-512 one)."""
    import subprocess

    lib = tree / build_dir / "bin"
    exe = Path("/tmp") / f"hrm-ggml-types-{build_dir}"
    subprocess.run(["g++", "-O2", "-std=c++17", f"-I{tree / 'ggml' / 'include'}", str(PROBE_SOURCE), "-o", str(exe),
                    f"-L{lib}", "-lggml", "-lggml-base", "-lggml-cpu", f"-Wl,-rpath,{lib}"], check=True)
    return exe


def measure(exe: Path, types: tuple[str, ...], threads: tuple[int, ...]) -> tuple[list[dict], dict]:
    os.environ["HRM_PROBE_NO_REPACK"] = "1"
    clock = run_probe(exe, "f32", 1, "clock", (CLOCK_ADDS,), 0, REPEATS)[0]
    kernels = []
    for t in threads:
        for ggml_type in types:
            for pool in (CACHE_POOL_MIB, DRAM_POOL_MIB):
                points = run_probe(exe, ggml_type, t, "mmid", ROWS, pool, REPEATS)
                kernels.append({"type": ggml_type, "op": "mmid", "threads": t, "buffer": points[0].buffer,
                                "pool_mib": pool,
                                "s_per_elem_vs_rows": [{"x": p.rows, "y": p.s_per_elem} for p in points],
                                "spread": [round(p.spread, 4) for p in points]})
                print(ggml_type, t, pool, " ".join(f"{p.s_per_elem:.3e}" for p in points), flush=True)
    return kernels, {"s_per_cycle": clock.s_per_elem, "spread": round(clock.spread, 4)}


def table() -> str:
    """The committed measurements as docs/validation/ggml_types.md's table: cycles per weight element
    on one core (cache-sized pool) at 1, 4, 16 and 64 rows, per build, and the DRAM-sized pool's
    two-thread stream at one row (GB/s of the type's own bytes)."""
    from hrm.machine.ggml_prior import bytes_per_element, type_runs

    docs = {isa: yaml.safe_load((ROOT / "hrm" / "data" / "ggml_cpu" / f"types-{isa}.yaml").read_text())
            for isa in ("avx512", "avx2")}
    rows = ["| type | bytes/weight | AVX-512 build: cycles/weight at 1 / 4 / 16 / 64 rows | AVX2 build: the same | "
            "DRAM pool, 2 threads, 1 row: GB/s (AVX-512 / AVX2) |", "|---|---|---|---|---|"]
    for t in PRIOR_TYPES:
        cells, stream = [], []
        for isa, doc in docs.items():
            runs = type_runs(isa)
            cells.append(" / ".join(f"{runs.cycles_per_element(t, r):.2f}" for r in (1, 4, 16, 64)))
            k = next(k for k in doc["kernels"] if (k["type"], k["threads"], k["pool_mib"]) == (t, 2, DRAM_POOL_MIB))
            stream.append(f"{bytes_per_element(t) / k['s_per_elem_vs_rows'][0]['y'] / 1e9:.1f}")
        rows.append(f"| {t} | {bytes_per_element(t):.4f} | {cells[0]} | {cells[1]} | {' / '.join(stream)} |")
    return "\n".join(rows) + "\n"


def main() -> int:
    if sys.argv[1:] == ["--table"]:
        print(table(), end="")
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", required=True, type=Path)
    ap.add_argument("--build", default="build", help="the build folder of TREE whose bin/ has the ggml libraries")
    ap.add_argument("--isa", default="avx512", choices=("avx512", "avx2"), help="what that build was compiled for")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--types", default=",".join(PRIOR_TYPES))
    ap.add_argument("--out", required=True, type=Path)
    a = ap.parse_args()
    exe = build(a.llama_cpp.resolve(), a.build)
    started = dt.datetime.now(dt.timezone.utc)
    kernels, clock = measure(exe, tuple(a.types.split(",")), tuple(int(t) for t in a.threads.split(",")))
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    doc = {
        "format": "hrm-ggml-types/1",
        "host": f"{cpu}, {os.cpu_count()} CPUs (this project's CI/session VM)",
        "llama_cpp": "ggml-org/llama.cpp@0c1e5709 (llama-cpp-python 0.3.36 sdist), CPU backend, "
                     f"{a.isa} build ({a.build}; flags: ../shared/llamacpp-cpu/README.md, AVX-512 "
                     f"{'on' if a.isa == 'avx512' else 'off'}, AMX off)",
        "isa": a.isa,
        "measured": f"{started:%Y-%m-%d %H:%M} - {dt.datetime.now(dt.timezone.utc):%H:%M} UTC, every other process paused",
        "method": "profiler/ggml_kernels.cpp TYPE THREADS mmid POOL_MIB 7 ROWS with HRM_PROBE_NO_REPACK=1: "
                  "MUL_MAT_ID of [1024 x 1024 x 8] experts, top-2, every expert given ROWS tokens, the weights in "
                  "the plain CPU buffer, cycled through POOL_MIB; seconds per weight element, median of 7 after a "
                  "warm-up. clock: the probe's `clock` op, 2e8 x 8 dependent register adds on one core",
        "clock": clock,
        "kernels": kernels,
    }
    a.out.write_text(yaml.safe_dump(doc, sort_keys=False))
    print(f"{a.out}: {len(kernels)} curves")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
