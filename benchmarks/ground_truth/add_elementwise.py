"""Measure the elementwise kinds of llama.cpp's layer graphs (``hrm profile --llama-cpp``'s
``ew:KIND`` probe, hrm.cost.ggml_elementwise) on this host and add them to profiles measured
before the probe had them, each with its ``source.methods`` line saying when and how.

A new ``hrm profile --llama-cpp DIR`` measures them itself; this is for the committed profiles
the ground-truth runs are predicted on (docs/validation/ground_truth.md §1.6), so the matmul and
attention curves they were measured with stay as measured.

    python benchmarks/ground_truth/add_elementwise.py --llama-cpp TREE PROFILE.yaml [...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from hrm.cost.ggml_elementwise import ELEMENTWISE_KINDS  # noqa: E402
from profiler.ggml_cpu import DEFAULT_REPEATS, build_probe, llama_cpp_tree, measure_elementwise  # noqa: E402
from profile_patch import profile_threads, stamped, write_kernels  # noqa: E402


def measure(tree: Path, threads: list[int], repeats: int) -> tuple[list[dict], dict[str, str]]:
    """hrm profile's own elementwise measurement (profiler.ggml_cpu.measure_elementwise), as
    profile YAML, each method line saying when it was added."""
    exe = build_probe(llama_cpp_tree(tree))
    kernels, methods = [], {}
    for t in threads:
        measured, lines = measure_elementwise(exe, t, repeats)
        kernels += [k.model_dump(mode="json", exclude_none=True) for k in measured]
        methods.update(stamped(lines, "benchmarks/ground_truth/add_elementwise.py"))
    return kernels, methods


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profiles", nargs="+", type=Path)
    ap.add_argument("--llama-cpp", required=True, type=Path)
    ap.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    args = ap.parse_args()
    docs = {p: yaml.safe_load(p.read_text()) for p in args.profiles}
    threads = profile_threads(docs)
    kernels, methods = measure(args.llama_cpp, threads, args.repeats)
    write_kernels(docs, kernels, methods, set(ELEMENTWISE_KINDS))
    for path in docs:
        print(f"{path}: {len(kernels)} elementwise curves at threads {threads}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
