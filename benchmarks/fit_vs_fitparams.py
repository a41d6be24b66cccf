"""``hrm fit`` against llama.cpp's own ``llama-fit-params``, measured (docs/validation/fit.md).

For each GGUF: llama-fit-params prints the arguments llama.cpp's memory fit sets (on a CPU-only
build: -c and -ngl); ``hrm fit`` (hrm.analysis.fit.fit_cpu on the host's measured profile) prints its
command. Each is run as one user's request with llama-bench's ``-pg P,G`` test (a prompt of P
tokens, then G generated: the context ``--context`` = P + G), the commands alternated
(A B A B A B), each run a separate llama-bench invocation of one repetition with the machine's
other processes paused (ground_truth/paused.py). Writes the runs as YAML.

    python benchmarks/fit_vs_fitparams.py --bin DIR --hw PROFILE --context 2048 --gen 64 \
        --out docs/validation/runs/fit-vs-fitparams.yaml MODEL.gguf ...
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAUSED = ROOT / "benchmarks" / "ground_truth" / "paused.py"

#: llama-bench takes one -t for prompt and generation (tools/llama-bench/llama-bench.cpp
#: n_threads; no -tb); these hrm fit flags map to llama-bench's own spelling
BENCH_FLAGS = {"-t": "-t", "-b": "-b", "-ub": "-ub", "-fa": "-fa", "-ctk": "-ctk", "-ctv": "-ctv", "-ngl": "-ngl"}
#: the switches (no value) of an hrm fit / llama-fit-params argument string
SWITCHES = {"-kvu", "-nkvo", "-nr"}
#: switches llama-bench spells with a value: -nr/--no-repack (common/arg.cpp:2421-2428) is llama-bench's
#: --repack 0 (tools/llama-bench/llama-bench.cpp:912-918)
BENCH_SWITCHES = {"-nr": ["--repack", "0"]}


def fit_params_args(bin_dir: Path, model: Path) -> str:
    out = subprocess.run([str(bin_dir / "llama-fit-params"), "-m", str(model)], capture_output=True, text=True,
                         timeout=120, check=True)
    return out.stdout.strip().splitlines()[-1]


def bench_args(args: str) -> list[str]:
    """The flags of a llama-server/llama-cli argument string that llama-bench takes (-c and -np
    have no llama-bench spelling: its context is the test's own tokens; -ngl -1 is all)."""
    words = shlex.split(args)
    out = []
    i = 0
    while i < len(words):
        w = words[i]
        if w in SWITCHES:
            out += BENCH_SWITCHES.get(w, [])
            i += 1
            continue
        value = words[i + 1]
        if w in BENCH_FLAGS:
            out += [BENCH_FLAGS[w], "99" if (w == "-ngl" and value == "-1") else value]
        i += 2
    return out


def run_bench(bin_dir: Path, model: Path, flags: list[str], prompt: int, gen: int) -> dict:
    cmd = [str(bin_dir / "llama-bench"), "-m", str(model), "-p", "0", "-n", "0", "-pg", f"{prompt},{gen}",
           "-r", "1", "-o", "json"] + flags
    proc = subprocess.run([sys.executable, str(PAUSED), "--"] + cmd, capture_output=True, text=True, timeout=300,
                          cwd=PAUSED.parent)
    if proc.returncode:
        raise SystemExit(f"llama-bench failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    rows = json.loads(proc.stdout)
    row = rows[-1]
    return {"command": " ".join(["llama-bench", "-m", model.name] + cmd[3:]), "avg_ts": row["avg_ts"],
            "total_s": (prompt + gen) / row["avg_ts"], "samples_ns": row.get("samples_ns")}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bin", type=Path, required=True, help="llama.cpp build/bin with llama-bench and llama-fit-params")
    p.add_argument("--hw", required=True, help="the host's measured profile (ggml_cpu section)")
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--gen", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("models", nargs="+", type=Path)
    a = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from hrm.analysis.fit import fit_cpu
    from hrm.model.gguf import read_inventory
    from hrm.machine.hardware import load_hardware

    hw = load_hardware(a.hw)
    prompt = a.context - a.gen
    start = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    runs = []
    for model in a.models:
        theirs = fit_params_args(a.bin, model)
        fit = fit_cpu(hw, read_inventory(model), a.context, a.gen)
        ours = fit.best.args()
        if fit.best.knobs["threads"] != fit.best.knobs["threads_batch"]:
            raise SystemExit(f"{model.name}: hrm fit picks -t != -tb, which llama-bench cannot run")
        pair = {"fit-params": bench_args(theirs), "hrm-fit": bench_args(ours)}
        samples: dict[str, list] = {"fit-params": [], "hrm-fit": []}
        for _ in range(a.reps):
            for who in ("fit-params", "hrm-fit"):
                samples[who].append(run_bench(a.bin, model, pair[who], prompt, a.gen))
        d = fit.default
        runs.append({
            "model": model.name, "context": a.context, "prompt": prompt, "gen": a.gen,
            "fit_params_args": theirs, "hrm_fit_args": ours,
            "predicted_total_s": {"fit-params": d.total_s if d else None, "hrm-fit": fit.best.total_s},
            "measured_total_s": {k: [round(s["total_s"], 4) for s in v] for k, v in samples.items()},
            "bench_commands": {k: v[0]["command"] for k, v in samples.items()},
        })
        print(json.dumps(runs[-1]), file=sys.stderr)
    import yaml

    header = ("# hrm fit vs llama-fit-params, measured on this project's CPU host (benchmarks/fit_vs_fitparams.py):\n"
              "# each command as one user's request (llama-bench -pg PROMPT,GEN, -r 1 per run, the two commands\n"
              "# alternated, other processes paused by benchmarks/ground_truth/paused.py). total_s = tokens / avg_ts.\n")
    data = {"hardware": Path(a.hw).name, "engine_version": "ggml-org/llama.cpp@0c1e5709 (llama-cpp-python 0.3.36 "
            "vendor/llama.cpp), CPU backend", "measured_between": [start, dt.datetime.now(dt.timezone.utc).strftime(
                "%Y-%m-%dT%H:%M:%SZ")], "runs": runs}
    a.out.write_text(header + yaml.safe_dump(data, sort_keys=False, width=120))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
