"""Real llama-server runs under a staggered load on this CPU machine (docs/validation/ground_truth.md
§1.12): for each ground-truth GGUF at 2 threads, two servers on 127.0.0.1 — ``-np 4`` (four slots, a
KV stream each: the batch is cut by ``split_equal``, src/llama-kv-cache.cpp:713) and no ``-np``
(its default: four slots sharing one unified KV stream, tools/server/server.cpp:156-160, cut by
``split_simple``). Each server first takes one request of four simultaneous prompts (§1.11's point:
the control that ties this window to the profile), then the trace TRACE twice: requests arriving at
their own offsets with their own prompt lengths and tokens to generate, each posted by its own
thread, so the server's continuous batching mixes one slot's prompt with the others' decode steps
and leaves slots idle between requests. Every request's send and completion times (from the
trace's start) and the server's own ``timings`` are kept. Every other process is stopped meanwhile
(``Paused``). With ``--hw BASE --profile OUT``, the window is two passes of every server (one trace
each) and of §1.10's llama-completion commands at 2 threads, with ``hrm profile --llama-cpp``'s
ggml section at 2 threads measured between them (this VM's speed drifts: ground_truth.md §1.2),
written as BASE with that section.

    python benchmarks/ground_truth/server_load.py --llama-cpp DIR --models DIR --out raw.json [--hw BASE --profile OUT]
"""

from __future__ import annotations

import json
import platform
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from llama_cpu_runs import COMPLETION_PROMPT, MODELS, Paused, completion_points, measurement_parser, run
from server_runs import PORT, PROMPTS, USERS, _post, _wait_ready

CTX, THREADS, REPS = 4096, 2, 2
LOAD_FORMATS = ("f16", "q4_k_m")
#: (arrival offset s, copies of the prompt text, tokens to generate): bursts that fill the four
#: slots, a queue, and slots left idle between requests (distinct first words: no slot is
#: chosen by prompt similarity, server-context.cpp:1541-1590, so the least recently used one is)
TRACE = ((0.00, 1, 48), (0.10, 2, 16), (0.25, 1, 32), (0.90, 3, 64), (1.10, 1, 24), (1.30, 2, 40),
         (2.20, 1, 56), (2.30, 2, 8))
WORDS = ("Alpha", "Bravo", "Charlie", "Delta", "Echo", "Foxtrot", "Golf", "Hotel")


#: ``--poisson``: POISSON_REQUESTS requests of one prompt and POISSON_GEN tokens, arriving as the
#: Poisson process ``hrm import --rate-per-s R --requests N`` predicts (hrm.cost.ggml_server.poisson,
#: seed 0), at a rate per weight format that keeps the four slots mostly busy
POISSON_REQUESTS, POISSON_GEN = 24, 32
POISSON_RATE_PER_S = {"f16": 1.5, "q4_k_m": 3.0}


def trace_prompt(i: int, copies: int) -> str:
    return f"{WORDS[i % len(WORDS)]} {i} asks: " + " ".join([COMPLETION_PROMPT] * copies)


def poisson_trace(fmt: str) -> tuple:
    """The ``--poisson`` trace of a weight format: (arrival s, copies, tokens) per request."""
    from hrm.cost.ggml_server import poisson

    return tuple((r.arrival_s, 1, POISSON_GEN)
                 for r in poisson(POISSON_RATE_PER_S[fmt], POISSON_REQUESTS, 1, POISSON_GEN, seed=0))


def _post_to(port: int, body: dict, timeout_s: float = 300.0):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read())


def run_trace(port: int, trace: tuple = TRACE) -> list[dict]:
    """Post a trace's requests at their offsets; each one's send/done times and the server's timings."""
    out: list[dict] = [{} for _ in trace]
    t0 = time.monotonic() + 0.05

    def one(i: int, arrival: float, copies: int, n: int) -> None:
        time.sleep(max(0.0, t0 + arrival - time.monotonic()))
        sent = time.monotonic() - t0
        r = _post_to(port, {"prompt": trace_prompt(i, copies), "n_predict": n, "ignore_eos": True,
                            "cache_prompt": False, "seed": 1})
        out[i] = {"sent_s": round(sent, 4), "done_s": round(time.monotonic() - t0, 4), "timings": r["timings"]}

    threads = [threading.Thread(target=one, args=(i, *req)) for i, req in enumerate(trace)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def load_point(bin_dir: Path, models: Path, model: str, fmt: str, explicit_slots: bool, reps: int = REPS,
               trace: tuple = TRACE) -> dict:
    cmd = [str(bin_dir / "llama-server"), "-m", str(models / f"{model}-{fmt}.gguf"), "-t", str(THREADS),
           *(["-np", str(USERS)] if explicit_slots else []), "-c", str(CTX), "--host", "127.0.0.1", "--port",
           str(PORT)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(proc)
        burst = {"prompt": PROMPTS, "n_predict": 64, "ignore_eos": True, "cache_prompt": False, "seed": 1}
        _post(burst)  # warm-up: page faults and first-use costs
        t = time.time()
        control = {"wall_s": None, "tasks": [r["timings"] for r in _post(burst)]}
        control["wall_s"] = round(time.time() - t, 4)
        traces = [run_trace(PORT, trace) for _ in range(reps)]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"key": {"tool": "llama-server", "model": model, "format": fmt, "threads": THREADS,
                    "slots": "np4" if explicit_slots else "default"},
            "command": cmd[:cmd.index("--host")], "trace": trace, "controls": [control], "traces": traces}


def merge(a: dict, b: dict) -> dict:
    """Two passes of one server point: their controls and traces together."""
    return {**a, "controls": a["controls"] + b["controls"], "traces": a["traces"] + b["traces"]}


def main() -> int:
    ap = measurement_parser(__doc__)
    ap.add_argument("--hw", help="the profile whose ggml_cpu section the window's probe replaces")
    ap.add_argument("--profile", type=Path, help="where that profile is written")
    ap.add_argument("--poisson", action="store_true", help="Poisson arrivals (POISSON_*) instead of TRACE")
    args = ap.parse_args()
    bin_dir = args.llama_cpp / "build" / "bin"
    raw = {"host": platform.node(), "cpu": platform.processor(), "points": []}
    todo = [(m, f, explicit) for m in MODELS for f in LOAD_FORMATS for explicit in (True, False)]
    windowed = args.hw is not None
    completion = [{"key": k, "command": c, "samples": []} for k, c in completion_points(bin_dir, args.models)
                  if k["threads"] == THREADS] if windowed else []

    def one_pass(reps: int) -> list[dict]:
        points = []
        for m, f, explicit in todo:
            trace = poisson_trace(f) if args.poisson else TRACE
            points.append(load_point(bin_dir, args.models, m, f, explicit, reps, trace))
            print("load", m, f, "np4" if explicit else "default", flush=True)
        for point in completion:
            point["samples"].append(run(point["command"]))
        return points

    with Paused():
        raw["started"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if windowed:
            from one_window import TYPES
            from profiler.ggml_cpu import measure_ggml_cpu

            first = one_pass(1)
            section, methods = measure_ggml_cpu(args.llama_cpp, (THREADS,), TYPES)
            print("probe done", flush=True)
            raw["points"] = [merge(a, b) for a, b in zip(first, one_pass(1))]
        else:
            raw["points"] = one_pass(REPS)
        raw["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    raw["completion_again"] = completion
    if windowed:
        from profile_patch import write_with_section

        write_with_section(args.hw, section, methods, args.profile)
    args.out.write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
