"""Real llama-server runs with parallel users on this CPU machine (docs/validation/ground_truth.md
§1.11): for each ground-truth GGUF and thread count, a server with ``-np USERS`` slots on 127.0.0.1,
one warm-up request, then REQUESTS requests each carrying USERS prompts (one /completion call with a
prompt array: the server posts one task per prompt together, tools/server/server-context.cpp:4280-4300,
so the slots prefill in one batch and decode together), ``cache_prompt`` off so every request
prefills its prompts. Every task's own ``timings`` (prompt_n, prompt_ms, predicted_n, predicted_ms)
is kept. Between the servers, every other process is stopped (``Paused``); the 18 llama-completion
commands of §1.10 run again in the same window, so the drift since their profile is measured.

    python benchmarks/ground_truth/server_runs.py --llama-cpp DIR --models DIR --out raw.json
"""

from __future__ import annotations

import itertools
import json
import platform
import subprocess
import time
import urllib.request
from pathlib import Path

from llama_cpu_runs import (COMPLETION_N, COMPLETION_PROMPT, FORMATS, MODELS, THREADS, Paused, completion_points,
                            measurement_parser, run)

USERS, REQUESTS, CTX, PORT = 4, 2, 4096, 18931
#: the users' prompts: §1.10's prompt after a different first line each (distinct tokens, equal length)
PROMPTS = [f"Question {i} of {USERS}. {COMPLETION_PROMPT}" for i in range(1, USERS + 1)]


def _post(body: dict, timeout_s: float = 300.0):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read())


def _wait_ready(proc, timeout_s: float = 120.0) -> None:
    start = time.time()
    while time.time() - start < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("llama-server not ready")


def server_point(bin_dir: Path, models: Path, model: str, fmt: str, threads: int) -> dict:
    cmd = [str(bin_dir / "llama-server"), "-m", str(models / f"{model}-{fmt}.gguf"), "-t", str(threads), "-np",
           str(USERS), "-c", str(CTX), "-n", str(COMPLETION_N), "--host", "127.0.0.1", "--port", str(PORT)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(proc)
        body = {"prompt": PROMPTS, "ignore_eos": True, "cache_prompt": False, "seed": 1}
        _post(body)  # warm-up: the first request after load pays page faults and first-use costs
        samples = []
        for _ in range(REQUESTS):
            t0 = time.time()
            out = _post(body)
            samples.append({"wall_s": round(time.time() - t0, 4), "tasks": [r["timings"] for r in out]})
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"key": {"tool": "llama-server", "model": model, "format": fmt, "threads": threads, "parallel": USERS},
            "command": cmd[:cmd.index("--host")], "samples": samples}


def main() -> int:
    args = measurement_parser(__doc__).parse_args()
    bin_dir = args.llama_cpp / "build" / "bin"
    raw = {"host": platform.node(), "cpu": platform.processor(), "points": []}
    completion = [{"key": k, "command": c, "samples": []} for k, c in completion_points(bin_dir, args.models)]
    with Paused():
        raw["started"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for m, f, t in itertools.product(MODELS, FORMATS, THREADS):
            raw["points"].append(server_point(bin_dir, args.models, m, f, t))
            print("server", m, f, t, flush=True)
        for point in completion:
            point["samples"].append(run(point["command"]))
        raw["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    raw["completion_again"] = completion
    args.out.write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
