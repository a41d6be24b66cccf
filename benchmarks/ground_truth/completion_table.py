"""docs/validation/ground_truth.md §1.10-§1.11: the llama-completion runs (one user through
llama-cli's path) or the llama-server runs (``-np`` users) against `hrm import`'s prediction now
(the CPU step model, on a machine without a GPU) and before (HRM's llama.cpp engine on a profile
whose "GPU" tier is the host: `--engine llama.cpp`).

    python benchmarks/ground_truth/completion_table.py [--runs docs/validation/runs/llamacpp-cpu-completion.yaml] \
        [--models .ground/models]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from hrm.analysis.validation import compare_runs, load_runs_file, worst_factor

ROOT = Path(__file__).resolve().parents[2]


def before(run: dict, runs_dir: Path, hw: str, models: Path) -> tuple[float, float]:
    """(prefill s, decode s) as `hrm import --engine llama.cpp` estimated the command before: its
    prefill latency, and the run's decode steps at its decode throughput."""
    gguf = models / run["gguf"].split("/")[-1].replace(".tensors.json", ".gguf")
    cmd = run["command"].replace(gguf.name, str(gguf), 1)
    w = run["workload"]
    out = subprocess.run([sys.executable, "-m", "hrm_cli", "import", "--from", "llama.cpp", cmd, "--hw",
                          str(runs_dir / hw), "--prompt-len", str(w["prompt_len"]), "--engine", "llama.cpp", "--json"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    est = json.loads(out.stdout)["estimate"]
    words = run["command"].split()
    users = int(words[words.index("-np") + 1]) if "-np" in words else 1
    # the decode rate counts every user's tokens: N (gen - 1) / decode
    return est["prefill_latency_s"], users * (w["gen_len"] - 1) / est["decode_throughput_tok_s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=ROOT / "docs/validation/runs/llamacpp-cpu-completion.yaml")
    ap.add_argument("--models", type=Path, default=ROOT / ".ground/models", help="the GGUFs (the 'before' path reads them)")
    args = ap.parse_args()
    runs_file = load_runs_file(args.runs)
    raw = {r["name"]: r for r in runs_file.runs}
    print("| run | prompt tok | measured prefill s | now | before | measured decode s | now | before |")
    print("|---|---|---|---|---|---|---|---|")
    now_r, old_r = [], []
    for c in compare_runs(runs_file):
        run = raw[c.name]
        old = before(run, args.runs.parent, load_hw_name(args.runs), args.models)
        cells = []
        for q, o in zip(("prefill_s", "decode_s"), old):
            m = c.measured[q]
            now_r.append(c.predicted[q] / m)
            old_r.append(o / m)
            cells += [f"{m:.3f}", f"{c.predicted[q] / m:.2f}", f"{o / m:.2f}"]
        print(f"| {c.name.replace(' (llama-completion)', '').replace(' (llama-server)', '')} | {run['workload']['prompt_len']} | " + " | ".join(cells) + " |")
    for label, rs in (("now", now_r), ("before", old_r)):
        print(f"{label}: median {statistics.median(rs):.3f}, worst {worst_factor(rs):.2f}x, "
              f"beyond 1.25x: {sum(max(r, 1 / r) > 1.25 for r in rs)} of {len(rs)}")
    return 0


def load_hw_name(runs: Path) -> str:
    import yaml

    return yaml.safe_load(runs.read_text())["hardware"]


if __name__ == "__main__":
    raise SystemExit(main())
