"""How a one-user decode's per-token time moves with the number of tokens generated
(docs/validation/ground_truth.md §1.10): llama-bench ``-p 0 -n 1,2,4,8,32,128`` at 2 threads, every
other process stopped, on the Q4_K_M files (a decode step reads 30-50 MB: the last-level cache can
keep its repeated experts) and two f16 files (130-250 MB a step: it cannot). Each rep of a test
clears the KV cache and decodes ``-n`` random tokens from position 0
(tools/llama-bench/llama-bench.cpp:2198-2222), so a test's time per token is its first steps'
average. Both load modes (``LOAD_MODES``).

    python benchmarks/ground_truth/paused.py -- python benchmarks/ground_truth/decode_steps.py \
        --llama-cpp DIR --models DIR --out docs/validation/runs/decode-steps.json
"""

from __future__ import annotations

import json
import platform
import subprocess
import time

from llama_cpu_runs import measurement_parser

FILES = ("gt-mixtral-q4_k_m", "gt-qwen3moe-q4_k_m", "gt-deepseekv2-q4_k_m", "gt-mixtral-f16", "gt-qwen3moe-f16")
N_GEN, REPS, THREADS = "1,2,4,8,32,128", 5, 2
#: none first (the weights read at load), then mmap (llama.cpp's default: each page faulted in when
#: first touched, so the first tests after load pay it for every expert they meet first)
LOAD_MODES = ("none", "mmap")


def main() -> int:
    args = measurement_parser(__doc__).parse_args()
    out = {"host": platform.node(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "engine": "ggml-org/llama.cpp@0c1e5709 (llama-cpp-python 0.3.36 sdist), CPU backend", "runs": []}
    for name, load_mode in ((n, m) for m in LOAD_MODES for n in FILES):
        cmd = [str(args.llama_cpp / "build" / "bin" / "llama-bench"), "-m", str(args.models / f"{name}.gguf"), "-t",
               str(THREADS), "-p", "0", "-n", N_GEN, "-r", str(REPS), "-lm", load_mode, "-o", "jsonl"]
        p = subprocess.run(cmd, capture_output=True, text=True, check=True)
        for line in p.stdout.splitlines():
            if line.startswith("{"):
                t = json.loads(line)
                out["runs"].append({"gguf": f"{name}.gguf", "load_mode": load_mode, "threads": t["n_threads"],
                                    "n_gen": t["n_gen"],
                                    "command": " ".join(w.rsplit("/", 1)[-1] for w in cmd),
                                    "samples_s": [round(x / 1e9, 6) for x in t["samples_ns"]]})
    out["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
