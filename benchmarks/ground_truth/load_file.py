"""server_load.py's raw output as a committed load file (docs/validation/runs/llamacpp-cpu-load*.yaml),
and its table against the model (docs/validation/ground_truth.md §1.12).

A load file holds, per llama-server command, the passes of its trace: each request's arrival
(s from the trace's start, as sent), its prompt tokens (the server's ``prompt_n``) and generated
tokens, and what was measured — latency (send to response), the server's ``prompt_ms`` and
``predicted_ms`` in seconds. ``tests/test_ggml_server.py`` re-predicts every request from it.

    python benchmarks/ground_truth/load_file.py RAW.json OUT.yaml --profile PROFILE.yaml --what WORDS
    python benchmarks/ground_truth/load_file.py --table OUT.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "docs" / "validation" / "runs"
COLUMNS = ["arrival_s", "prompt_tokens", "gen_tokens", "latency_s", "prompt_s", "decode_s"]
ENGINE = ("ggml-org/llama.cpp@0c1e5709 (the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp), CPU backend, "
          "GGML_NATIVE=OFF with AVX-512/VNNI/BF16 on and AMX off (../shared/llamacpp-cpu/README.md)")


def write(raw_path: Path, out: Path, profile: str, what: str) -> None:
    raw = json.loads(raw_path.read_text())
    points = []
    for p in raw["points"]:
        k = p["key"]
        cmd = p["command"]
        words = [Path(w).name if i in (0, cmd.index("-m") + 1) else w for i, w in enumerate(cmd)]
        passes = []
        for trace in p["traces"]:
            rows = [[round(r["sent_s"], 4), r["timings"]["prompt_n"], r["timings"]["predicted_n"],
                     round(r["done_s"] - r["sent_s"], 4), round(r["timings"]["prompt_ms"] / 1e3, 5),
                     round(r["timings"]["predicted_ms"] / 1e3, 5)] for r in trace]
            passes.append(rows)
        points.append({"name": f"{k['model']} {k['format']} t{k['threads']} {k['slots']} (llama-server, {what})",
                       "command": " ".join(words),
                       "model": f"../../../benchmarks/ground_truth/configs/{k['model']}.json",
                       "gguf": f"gguf/{k['model']}-{k['format']}.tensors.json", "passes": passes})
    doc = {"hardware": profile, "engine_version": ENGINE, "host": "vm",
           "measured_between": [raw["started"], raw["finished"]], "what": what, "columns": COLUMNS,
           "points": points}
    head = ("# Real llama-server runs under a load on this project's CPU machine (benchmarks/ground_truth/server_load.py):\n"
            "# per command, each pass's requests: when sent, their tokens, and the measured latency and the server's\n"
            "# own prompt and decode seconds. Predicted by hrm.cost.ggml_server on `hardware` (tests/test_ggml_server.py).\n")
    out.write_text(head + yaml.safe_dump(doc, sort_keys=False, width=120))


def predicted(path: Path):
    """Every pass of a load file against the model: (point, pass rows, ServedLoad, each request's
    latency alone — one user, no queue: what ``hrm import`` printed for the command before the load
    model)."""
    sys.path.insert(0, str(ROOT))
    from hrm.cost.ggml_cpu import HOST_BUFFER, run_times
    from hrm.cost.ggml_server import Request, serve
    from hrm.export.importing import estimate_without_gpu
    from hrm.export.llama_cpp import server_setup
    from hrm.machine.hardware import load_hardware
    from hrm.model.gguf import read_inventory
    from hrm.model.spec import load_model
    from hrm.workload import make_workload

    doc = yaml.safe_load(path.read_text())
    hw = load_hardware(str(path.parent / doc["hardware"]))
    for point in doc["points"]:
        inventory = read_inventory(path.parent / point["gguf"])
        model = load_model(str((path.parent / point["model"]).resolve()))
        for rows in point["passes"]:
            workload = make_workload(None, prompt_len=max(r[1] for r in rows), gen_len=max(r[2] for r in rows))
            run = estimate_without_gpu("llama.cpp", point["command"], model, workload, hw, inventory).served
            load = serve([Request(r[0], r[1], r[2]) for r in rows], server_setup(run), inventory, hw.ggml_cpu)
            buffer = None if run.run.repack else HOST_BUFFER
            shapes = {(r[1], r[2]) for r in rows}  # one run per request shape
            times = {(p, g): run_times(inventory, hw.ggml_cpu, run.run.threads, 1, p, g - 1, 0, run.run.n_batch,
                                       run.run.n_ubatch, run.run.threads_batch, buffer).total_s for p, g in shapes}
            alone = [times[(r[1], r[2])] for r in rows]
            yield point, rows, load, alone


def table(path: Path) -> str:
    lines = ["| command | pass | requests | p50 latency, predicted / measured | p90 ratio | makespan ratio "
             "| per-request latency ratio: median (range) | before: one request alone, p50 ratio |",
             "|---|---|---|---|---|---|---|---|"]
    for point, rows, load, alone in predicted(path):
        measured = np.array([r[3] for r in rows])
        model = np.array([s.latency_s for s in load.requests])
        ratio = model / measured
        span = max(r[0] + r[3] for r in rows) - min(r[0] for r in rows)
        n = point["passes"].index(rows) + 1
        lines.append(f"| {point['name']} | {n} | {len(rows)} | {np.median(model):.3f} / {np.median(measured):.3f} s "
                     f"({np.median(model) / np.median(measured):.3f}) "
                     f"| {np.percentile(model, 90) / np.percentile(measured, 90):.3f} | {load.makespan_s / span:.3f} "
                     f"| {np.median(ratio):.3f} ({ratio.min():.2f}–{ratio.max():.2f}) "
                     f"| {np.median(alone) / np.median(measured):.3f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", nargs="?", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--profile", help="the profile's file name, beside OUT")
    ap.add_argument("--what", default="a trace")
    ap.add_argument("--table", action="store_true")
    args = ap.parse_args()
    if args.table:
        print(table(args.out))
        return 0
    write(args.raw, args.out, args.profile, args.what)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
