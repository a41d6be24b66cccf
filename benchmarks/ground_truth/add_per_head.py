"""Measure MLA's per-head matmuls (op ``mmh``: one [K x N] matrix per head over permuted
activations, profiler.ggml_cpu.measure_per_head) at the shapes and types the ground-truth GGUFs hold,
and add them to committed profiles, each with its ``source.methods`` line saying when and how.

The probe's dense MUL_MAT curve is a [1024 x 1024] matrix; gt-deepseekv2's attn_k_b [64, 256, 16]
and attn_v_b [256, 64, 16] cost 2-4.5x its seconds per element (docs/validation/ground_truth.md §1.9).
The shapes come from the tensor tables (every 3-D weight that is not a routed expert), so a profile
measured before the probe had them gains them without its other curves moving (a new profile:
``hrm profile --llama-cpp DIR --gguf FILE``).

    python benchmarks/ground_truth/add_per_head.py --llama-cpp TREE --gguf TABLE.json [...] PROFILE.yaml [...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from profiler.ggml_cpu import (  # noqa: E402
    DEFAULT_REPEATS,
    build_probe,
    llama_cpp_tree,
    measure_per_head,
    per_head_shapes,
)
from profile_patch import profile_threads, stamped, write_kernels  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profiles", nargs="+", type=Path)
    ap.add_argument("--llama-cpp", required=True, type=Path)
    ap.add_argument("--gguf", action="append", required=True, type=Path, help="a tensor table (repeatable)")
    ap.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    args = ap.parse_args()
    docs = {p: yaml.safe_load(p.read_text()) for p in args.profiles}
    threads = profile_threads(docs)
    shapes = per_head_shapes(args.gguf)
    exe = build_probe(llama_cpp_tree(args.llama_cpp.resolve()))
    kernels, methods = [], {}
    for t in threads:
        measured, lines = measure_per_head(exe, t, args.repeats, shapes)
        kernels += [k.model_dump(mode="json", exclude_none=True) for k in measured]
        methods.update(stamped(lines, "benchmarks/ground_truth/add_per_head.py"))
    write_kernels(docs, kernels, methods, {"mmh"})
    for path in docs:
        print(f"{path}: {len(kernels)} per-head curves at threads {threads}: {shapes}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
