"""llama-bench --repack 1,0 on the three Q4_K_M ground-truth models, and the kernels of both buffers,
in one quiet window (docs/validation/ground_truth.md §1.8).

A CPU-only llama.cpp repacks the weight types it can for its CPU kernels (the CPU_REPACK buffer);
``--repack 0`` (llama-bench; ``-nr`` elsewhere) keeps them in the plain CPU buffer, as a GPU host
keeps its CPU experts. Pass A of the runs, then ``hrm profile --llama-cpp``'s kernel measurement at
2 threads for the Q4_K_M files' types with the plain buffer's kernels too
(profiler.ggml_cpu.measure_ggml_cpu(plain_buffer=True)), then pass B; every other process paused
(run it under paused.py). Then ``write`` turns them into a runs file and a profile:

    python paused.py -- python repack_window.py measure --llama-cpp TREE --models DIR --out RAW_DIR
    python repack_window.py write RAW_DIR --base docs/validation/runs/this-host-llamacpp-m3.yaml \\
        --runs docs/validation/runs/llamacpp-cpu-repack.yaml --profile docs/validation/runs/this-host-repack.yaml
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from runs_file import ENGINE_VERSION, bench_run  # noqa: E402

MODELS = ("gt-mixtral", "gt-qwen3moe", "gt-deepseekv2")
#: the ggml types of the Q4_K_M files' matrices (runs/gguf/gt-*-q4_k_m.tensors.json) and f32
TYPES = ("q4_K", "q5_K", "q6_K", "q8_0", "q5_0", "f32")
THREADS = 2
BENCH = ("-t", str(THREADS), "-p", "128", "-n", "32", "-r", "3", "--repack", "1,0", "-o", "jsonl")


def measure(tree: Path, models: Path, out: Path) -> None:
    from profiler.ggml_cpu import measure_ggml_cpu

    out.mkdir(parents=True, exist_ok=True)

    def bench(tag: str) -> None:
        with open(out / f"runs-{tag}.jsonl", "w") as f:
            for m in MODELS:
                done = subprocess.run([str(tree / "build" / "bin" / "llama-bench"), "-m",
                                       str(models / f"{m}-q4_k_m.gguf"), *BENCH], capture_output=True, text=True)
                f.write(done.stdout)

    times = [dt.datetime.now(dt.timezone.utc)]
    bench("a")
    times.append(dt.datetime.now(dt.timezone.utc))
    section, methods = measure_ggml_cpu(tree, (THREADS,), types=TYPES, plain_buffer=True)
    times.append(dt.datetime.now(dt.timezone.utc))
    bench("b")
    times.append(dt.datetime.now(dt.timezone.utc))
    (out / "section.yaml").write_text(yaml.safe_dump(
        {"ggml_cpu": section.model_dump(mode="json", exclude_none=True), "methods": methods,
         "times": [str(t) for t in times]}, sort_keys=False))


def write(raw: Path, base: Path, runs_out: Path, profile_out: Path) -> None:
    got = yaml.safe_load((raw / "section.yaml").read_text())
    times = [t.replace("+00:00", "Z").replace(" ", "T")[:19] + "Z" for t in got["times"]]
    passes = [[json.loads(line) for line in (raw / f"runs-{tag}.jsonl").read_text().splitlines() if line.strip()]
              for tag in ("a", "b")]
    runs = []
    for m in MODELS:
        for repack in (True, False):
            samples = [{"result": [t for t in tests if t["model_filename"].endswith(f"{m}-q4_k_m.gguf")
                                   and bool(t["repack"]) == repack]} for tests in passes]
            made = bench_run({"samples": samples, "key": {"model": m, "format": "q4_k_m", "threads": THREADS,
                                                           "depth": 0}})
            name = made.pop("name").replace(" (llama-bench)", f" repack{int(repack)} (llama-bench)")
            runs.append({"name": name, "engine": "llama.cpp", "from": "llama.cpp",
                         "command": f"llama-bench -m {m}-q4_k_m.gguf -t {THREADS} -p 128 -n 32 -r 3 --repack "
                                    f"{int(repack)} -o jsonl",
                         "model": f"../../../benchmarks/ground_truth/configs/{m}.json",
                         "gguf": f"gguf/{m}-q4_k_m.tensors.json", **made})
    doc = {"hardware": profile_out.name, "engine_version": ENGINE_VERSION, "host": "vm",
           "measured_between": [times[0], times[3]], "runs": runs}
    runs_out.write_text("# llama-bench --repack 1 and 0 on the Q4_K_M ground-truth models, two passes around the kernel\n"
                        "# probe of both buffers, one quiet window (benchmarks/ground_truth/repack_window.py; each run\n"
                        "# lists its --repack value as llama-bench's sweep ran it; docs/validation/ground_truth.md §1.8)\n"
                        + yaml.safe_dump(doc, sort_keys=False, width=120))
    profile = yaml.safe_load(base.read_text())
    profile["name"] = profile_out.stem
    profile["ggml_cpu"] = got["ggml_cpu"]
    methods = {k: v for k, v in profile["source"]["methods"].items() if not k.startswith("ggml_cpu.")}
    profile["source"]["methods"] = {**methods, **got["methods"]}
    profile["source"]["notes"] = (f"{base.name}'s machine section; its ggml_cpu section measured again "
                                  f"{times[1]} - {times[2]} at {THREADS} threads for the Q4_K_M files' types, both "
                                  "buffers (benchmarks/ground_truth/repack_window.py)")
    profile_out.write_text("# this project's CPU host: the ggml kernels of both buffers, measured between the two passes of\n"
                           f"# {runs_out.name} (benchmarks/ground_truth/repack_window.py)\n"
                           + yaml.safe_dump(profile, sort_keys=False))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--llama-cpp", type=Path, required=True)
    m.add_argument("--models", type=Path, required=True)
    m.add_argument("--out", type=Path, required=True)
    w = sub.add_parser("write")
    w.add_argument("raw", type=Path)
    w.add_argument("--base", type=Path, required=True)
    w.add_argument("--runs", type=Path, required=True)
    w.add_argument("--profile", type=Path, required=True)
    a = ap.parse_args()
    if a.step == "measure":
        measure(a.llama_cpp.resolve(), a.models.resolve(), a.out)
    else:
        write(a.raw, a.base, a.runs, a.profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
