"""`hrm fit --rate-per-s` against llama.cpp's default server, measured (docs/validation/fit.md, "A
server's load"): for each GGUF named, `hrm fit` on the profile picks the llama-server command
for a Poisson load (the same draw, seed 0, that it predicted), and the real server runs that load
with its pick and with llama.cpp's default command (`llama-server -m FILE -c C`: 4 slots, one
unified cache), alternating A B A B (``--reps`` each), every other process stopped meanwhile.
Each request's send and completion times and the server's timings are kept.

    python benchmarks/ground_truth/fit_load_runs.py --llama-cpp DIR --models DIR --out raw.json \
        --hw PROFILE.yaml --rate gt-qwen3moe-q4_k_m=3 [--rate NAME=R ...]
    python benchmarks/ground_truth/fit_load_runs.py --write docs/validation/runs/fit-load.yaml raw.json [raw2.json ...]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from llama_cpu_runs import Paused, measurement_parser
from server_load import run_trace
from server_runs import PORT, _wait_ready

ROOT = Path(__file__).resolve().parents[2]
REQUESTS, GEN, CONTEXT = 24, 32, 129


def picks(hw_path: str, name: str, rate: float) -> dict:
    """hrm fit's answer for one GGUF (its tensor table) and rate, as `hrm fit --json` prints it."""
    table = ROOT / "docs/validation/runs/gguf" / f"{name}.tensors.json"
    out = subprocess.run(["hrm", "fit", "--hw", hw_path, "--gguf", str(table), "--context", str(CONTEXT), "--gen",
                          str(GEN), "--rate-per-s", str(rate), "--requests", str(REQUESTS), "--json"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def serve_once(bin_dir: Path, gguf: Path, args: str, trace: tuple) -> list[dict]:
    cmd = [str(bin_dir / "llama-server"), "-m", str(gguf), *args.split(), "--host", "127.0.0.1", "--port", str(PORT)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(proc)
        run_trace(PORT, trace[:4])  # warm-up: page faults and first-use costs
        return run_trace(PORT, trace)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def write(out: Path, raw_paths: list[Path]) -> None:
    """The committed file: per GGUF, the two commands, what hrm fit predicted, and every run's
    requests (sent s, prompt tokens, generated tokens, latency s) with its p90 latency; several
    raw files (windows on the same profile) in order."""
    raws = [json.loads(p.read_text()) for p in raw_paths]
    raw = {**raws[0], "finished": raws[-1]["finished"], "points": [p for r in raws for p in r["points"]]}
    points = []
    for p in raw["points"]:
        runs = {}
        for label, reps in p["runs"].items():
            runs[label] = [{"latency_p90_s": round(float(np.percentile([r["done_s"] - r["sent_s"] for r in tr], 90)), 4),
                            "requests": [[round(r["sent_s"], 4), r["timings"]["prompt_n"], r["timings"]["predicted_n"],
                                          round(r["done_s"] - r["sent_s"], 4)] for r in tr]} for tr in reps]
        pred = p["predicted"]
        points.append({"gguf": f"gguf/{p['model']}.tensors.json", "rate_per_s": p["rate_per_s"],
                       "commands": p["commands"],
                       "predicted": {"hrm fit p90_s": round(pred["best"]["latency_p90_s"], 4),
                                     "llama.cpp default p90_s": round(pred["llama_cpp_default"]["latency_p90_s"], 4),
                                     "gain": round(pred["gain"], 4)},
                       "runs": runs})
    doc = {"hardware": Path(raw["hw"]).name, "requests": raw["requests"], "context": raw["context"], "gen": raw["gen"],
           "measured_between": [raw["started"], raw["finished"]], "columns": ["sent_s", "prompt_tokens", "gen_tokens",
                                                                              "latency_s"], "points": points}
    out.write_text("# hrm fit --rate-per-s against llama.cpp's default server under the same Poisson load, measured\n"
                   "# (benchmarks/ground_truth/fit_load_runs.py; docs/validation/fit.md; tests/test_fit_load.py)\n"
                   + yaml.safe_dump(doc, sort_keys=False, width=120))


def main() -> int:
    if "--write" in sys.argv:
        i = sys.argv.index("--write")
        write(Path(sys.argv[i + 1]), [Path(a) for a in sys.argv[i + 2:]])
        return 0
    ap = measurement_parser(__doc__)
    ap.add_argument("--hw", required=True)
    ap.add_argument("--rate", action="append", required=True, help="NAME=RATE (a GGUF's name in --models)")
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    from hrm.cost.ggml_server import poisson

    bin_dir = args.llama_cpp / "build" / "bin"
    raw = {"hw": args.hw, "requests": REQUESTS, "gen": GEN, "context": CONTEXT, "points": []}
    todo = []
    for item in args.rate:
        name, rate = item.split("=")
        answer = picks(args.hw, name, float(rate))
        trace = tuple((r.arrival_s, 1, GEN) for r in poisson(float(rate), REQUESTS, CONTEXT - GEN, GEN, seed=0))
        best = answer["best"]["command"].split(".json ", 1)[1]
        default = answer["llama_cpp_default"]["command"].split(".json ", 1)[1]
        todo.append((name, float(rate), trace, {"hrm fit": best, "llama.cpp default": default}, answer))
    with Paused():
        raw["started"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for name, rate, trace, commands, answer in todo:
            runs = {label: [] for label in commands}
            for _ in range(args.reps):
                for label, cmd in commands.items():
                    runs[label].append(serve_once(bin_dir, args.models / f"{name}.gguf", cmd, trace))
                    print(name, label, flush=True)
            raw["points"].append({"model": name, "rate_per_s": rate, "commands": commands, "trace": trace,
                                  "predicted": answer, "runs": runs})
        raw["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    args.out.write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
