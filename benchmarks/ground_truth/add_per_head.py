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
import datetime as dt
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from profiler.ggml_cpu import (  # noqa: E402
    DEFAULT_REPEATS,
    build_probe,
    llama_cpp_tree,
    measure_per_head,
    per_head_shapes,
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profiles", nargs="+", type=Path)
    ap.add_argument("--llama-cpp", required=True, type=Path)
    ap.add_argument("--gguf", action="append", required=True, type=Path, help="a tensor table (repeatable)")
    ap.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    args = ap.parse_args()
    docs = {p: yaml.safe_load(p.read_text()) for p in args.profiles}
    threads = sorted({int(pt["x"]) for d in docs.values() for pt in d["ggml_cpu"]["node_s_vs_threads"]})
    shapes = per_head_shapes(args.gguf)
    exe = build_probe(llama_cpp_tree(args.llama_cpp.resolve()))
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    kernels, methods = [], {}
    for t in threads:
        measured, lines = measure_per_head(exe, t, args.repeats, shapes)
        kernels += [k.model_dump(mode="json", exclude_none=True) for k in measured]
        methods.update({key: f"{line}; measured {when} and added to this profile by "
                             f"benchmarks/ground_truth/add_per_head.py" for key, line in lines.items()})
    for path, doc in docs.items():
        section = doc["ggml_cpu"]
        section["kernels"] = [k for k in section["kernels"] if k["op"] != "mmh"] + kernels
        doc.setdefault("source", {}).setdefault("methods", {}).update(methods)
        lines = path.read_text().splitlines(keepends=True)
        head = "".join(lines[:next(i for i, line in enumerate(lines) if not line.startswith("#"))])
        path.write_text(head + yaml.safe_dump(doc, sort_keys=False))  # as hrm profile writes it
        print(f"{path}: {len(kernels)} per-head curves at threads {threads}: {shapes}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
