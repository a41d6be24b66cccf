"""Where a prefill's time goes, by the engine's own per-op timing against the step model's parts
(ground_truth.md §1.15): `op_times.cpp` (built against the llama.cpp tree) runs one prompt through
llama.cpp's scheduler with every node observed, and this script groups its seconds as
hrm.cost.ggml_cpu.step_time prices them — the routed experts (MUL_MAT_ID), attention
(FLASH_ATTN_EXT), every other matmul, the rest — beside the model's parts on a profile.

    python op_times.py measure --llama-cpp DIR --models DIR --out runs.jsonl [--ubatches 32,512]
    python op_times.py table runs.jsonl --hw PROFILE.yaml

`measure` builds op_times.cpp into a temporary folder, runs the 3 models in f16 and Q4_K_M with a
512-token prompt at 2 threads per -ub (3 timed repeats after a warm-up, every other process
paused), and writes one JSON line per run. `table` prints the medians beside the model's parts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from llama_cpu_runs import MODELS, Paused, TILE_FORMATS, add_measurement_args  # noqa: E402

#: prompt tokens, threads (-t) and timed repeats after the warm-up of each run (the §1.15 runs' prompt and threads)
PROMPT, THREADS, REPEATS = 512, 2, 3
#: op_times.cpp's context: n_batch 2048 (llama.cpp's default, common/common.h:453), -ub per run
N_BATCH = 2048
#: the step model's parts (hrm.cost.ggml_cpu.StepTime) and the ggml op kinds each holds
PARTS = ("experts", "attention", "dense", "rest")


def part_of(kind: str) -> str:
    """The step model's part an op kind of op_times.cpp belongs to."""
    if kind.startswith("MUL_MAT_ID"):
        return "experts"
    if kind.startswith("FLASH_ATTN_EXT"):
        return "attention"
    if kind.startswith("MUL_MAT"):
        return "dense"
    return "rest"


def build(tree: Path, out: Path) -> Path:
    exe = out / "op_times"
    bins = tree / "build" / "bin"
    subprocess.run(["g++", "-O2", "-std=c++17", f"-I{tree / 'include'}", f"-I{tree / 'ggml' / 'include'}",
                    str(Path(__file__).with_name("op_times.cpp")), f"-L{bins}", "-lllama", "-lggml", "-lggml-base",
                    f"-Wl,-rpath,{bins}", "-o", str(exe)], check=True)
    return exe


def measure(args) -> int:
    ubatches = [int(u) for u in args.ubatches.split(",")]
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(args.llama_cpp, Path(tmp))
        with Paused():
            for model in MODELS:
                for fmt in TILE_FORMATS:
                    for ub in ubatches:
                        gguf = args.models / f"{model}-{fmt}.gguf"
                        done = subprocess.run([str(exe), str(gguf), str(THREADS), str(PROMPT), str(ub), str(REPEATS)],
                                              capture_output=True, text=True, check=True)
                        runs = [json.loads(l) for l in done.stdout.splitlines() if l.startswith("{")]
                        runs = [r for r in runs if r.get("phase", "prefill") == "prefill"]
                        lines.append({"model": model, "format": fmt, "threads": THREADS, "prompt": PROMPT,
                                      "ubatch": ub, "runs": runs})
                        print(model, fmt, ub, f"{runs[-1]['total']:.3f} s", flush=True)
    args.out.write_text("".join(json.dumps(l) + "\n" for l in lines))
    return 0


def measured_parts(line: dict) -> dict[str, float]:
    """The median over the repeats of each part's seconds, and the total."""
    per_run = []
    for run in line["runs"]:
        parts = dict.fromkeys(PARTS, 0.0)
        for kind, seconds in run.items():
            if kind not in ("total", "phase", "nodes"):
                parts[part_of(kind)] += seconds
        parts["total"] = run["total"]
        per_run.append(parts)
    return {k: statistics.median(p[k] for p in per_run) for k in (*PARTS, "total")}


def predicted_parts(line: dict, hw_path: str) -> dict[str, float]:
    """The step model's parts for the same prompt: the prefill steps of hrm.cost.ggml_cpu.run_times
    (one sequence, op_times.cpp's n_batch), each step's parts summed."""
    from hrm.cost.ggml_cpu import run_times
    from hrm.machine.hardware import load_hardware
    from hrm.model.gguf import read_inventory

    section = load_hardware(hw_path).ggml_cpu
    inventory = read_inventory(str(ROOT / f"docs/validation/runs/gguf/{line['model']}-{line['format']}.tensors.json"))
    parts = dict.fromkeys(PARTS, 0.0)
    run = run_times(inventory, section, line["threads"], 1, line["prompt"], 0, n_batch=N_BATCH, n_ubatch=line["ubatch"])
    for step in run.steps:
        parts["experts"] += step.experts_s
        parts["attention"] += step.attention_s
        parts["dense"] += step.dense_s
        parts["rest"] += step.nodes_s + step.elementwise_s
    parts["total"] = sum(parts[p] for p in PARTS)
    return parts


def table(args) -> int:
    lines = [json.loads(l) for l in args.runs.read_text().splitlines() if l.strip()]
    print("| GGUF, -ub | " + " | ".join(f"{p}: engine / model" for p in (*PARTS, "total")) + " |")
    print("|---|" + "---|" * (len(PARTS) + 1))
    for line in lines:
        got, want = measured_parts(line), predicted_parts(line, args.hw)
        cells = " | ".join(f"{got[p]:.3f} / {want[p]:.3f}" for p in (*PARTS, "total"))
        print(f"| {line['model']} {line['format']} -ub {line['ubatch']} | {cells} |")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = add_measurement_args(sub.add_parser("measure"))
    m.add_argument("--ubatches", default="32,512")
    t = sub.add_parser("table")
    t.add_argument("runs", type=Path)
    t.add_argument("--hw", required=True)
    args = ap.parse_args()
    return measure(args) if args.cmd == "measure" else table(args)


if __name__ == "__main__":
    raise SystemExit(main())
