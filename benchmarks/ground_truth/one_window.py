"""Runs and the kernel probe in one quiet window: this VM's speed drifts by up to 1.5x over hours
(docs/validation/ground_truth.md, "Drift"), so a profile measured at another time cannot judge a
run. Inside one ``Paused`` block: the llama-bench points at ``--threads`` (one user, depth 0 and
1024), then ``hrm profile --llama-cpp``'s ggml section at that thread count, then the same points
again (the two passes bracket any drift inside the window; both are kept as samples). ``--all``:
every one of llama_cpu_runs.py's 99 commands (batched-bench and llama-bench, 1 and 2 threads) in
each pass, and the probe at both thread counts between them. ``--completion``: the 18
llama-completion commands (one user through llama-cli's path: 3 models x 3 formats x 1 and 2
threads) in each pass, the probe at both thread counts between them. ``--tiles``: llama-bench at prompt
lengths about the flash-attention kernel's 64-row query tiles (llama_cpu_runs.py TILE_PROMPTS; the 3 models in
f16 and Q4_K_M, 1 and 2 threads), the probe at both thread counts between the passes. ``--kvu``: batched-bench
with and without one unified KV stream (llama_cpu_runs.py KVU_PARALLEL sequences, 2 threads), the probe at 2
threads between the passes. ``--ubatch``: llama-bench's 512-token prompt at -ub 32, 128 and 512
(llama_cpu_runs.py UBATCHES; the 3 models in f16 and Q4_K_M, 2 threads), the probe at 2 threads between
the passes.

    python one_window.py --llama-cpp DIR --models DIR --hw PROFILE.yaml --raw OUT.json --profile OUT.yaml [--all]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from llama_cpu_runs import (BENCH_N, BENCH_P, DEPTHS, FORMATS, MODELS, THREADS, Paused, completion_points, points, run,
                             kvu_points, tile_points, ubatch_points)

#: the probe's types a ground-truth GGUF holds (make_models.py: f16, Q8_0, Q4_K_M files)
TYPES = ("f16", "q8_0", "q4_K", "q5_K", "q6_K", "q5_0", "f32")


def bench_points(bin_dir: Path, models: Path, threads: int):
    for m in MODELS:
        for f in FORMATS:
            for d in DEPTHS:
                cmd = [str(bin_dir / "llama-bench"), "-m", str(models / f"{m}-{f}.gguf"), "-t", str(threads), "-p",
                       str(BENCH_P), "-n", str(BENCH_N), "-d", str(d), "-r", "3", "-o", "json"]
                yield {"tool": "llama-bench", "model": m, "format": f, "threads": threads, "parallel": 1,
                       "depth": d}, cmd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", required=True, type=Path)
    ap.add_argument("--models", required=True, type=Path)
    ap.add_argument("--hw", required=True, help="the profile whose ggml_cpu section is replaced")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--raw", required=True, type=Path)
    ap.add_argument("--profile", required=True, type=Path)
    ap.add_argument("--all", action="store_true", help="all 99 commands at 1 and 2 threads, the probe at both")
    ap.add_argument("--completion", action="store_true", help="the 18 llama-completion commands, the probe at 1 and 2 threads")
    ap.add_argument("--tiles", action="store_true", help="llama-bench about the 64-row query tiles, the probe at 1 and 2 threads")
    ap.add_argument("--kvu", action="store_true", help="batched-bench with and without -kvu, the probe at 2 threads")
    ap.add_argument("--ubatch", action="store_true", help="llama-bench across -ub, the probe at 2 threads")
    args = ap.parse_args()
    from hrm.machine.hardware import load_hardware
    from profile_patch import write_with_section
    from profiler.ggml_cpu import measure_ggml_cpu

    bin_dir = args.llama_cpp / "build" / "bin"
    todo = (ubatch_points(bin_dir, args.models) if args.ubatch else kvu_points(bin_dir, args.models) if args.kvu else tile_points(bin_dir, args.models) if args.tiles else completion_points(bin_dir, args.models) if args.completion else
            points(bin_dir, args.models) if args.all else bench_points(bin_dir, args.models, args.threads))
    probe_threads = THREADS if args.all or args.completion or args.tiles else (args.threads,)
    raw = {"host": platform.node(), "cpu": platform.processor(),
           "points": [{"key": k, "command": c, "samples": []} for k, c in todo]}
    load_hardware(args.hw)  # a bad --hw fails before the window, not after it
    with Paused():
        raw["started"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for rep in range(2):
            for point in raw["points"]:
                t0 = time.time()
                out = run(point["command"])
                point["samples"].append({**out, "rep": rep, "wall_s": round(time.time() - t0, 3)})
                print(rep, point["key"], f"{time.time() - t0:.1f}s", flush=True)
            if rep == 0:
                section, methods = measure_ggml_cpu(args.llama_cpp, probe_threads, TYPES)
                print("probe done", flush=True)
        raw["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write_with_section(args.hw, section, methods, args.profile)
    args.raw.write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
