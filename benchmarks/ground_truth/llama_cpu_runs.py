"""Measure real llama.cpp runs on this CPU machine: llama-batched-bench (1 to 64 parallel
sequences) and llama-bench (one user, with and without a filled context), over the
ground-truth models (make_models.py) in f16, Q8_0 and Q4_K_M, at 1 and 2 threads.

Each point is its own invocation, recorded with its exact command. Points run round-robin,
`--reps` times, each after the machine has been idle for a moment (another process's load
would be measured as llama.cpp's), and the raw samples are kept. Writes a JSON file of raw
runs that `runs_file.py` turns into the committed runs file.

    python llama_cpu_runs.py --llama-cpp DIR --models DIR --out raw.json [--reps 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import signal
import subprocess
import time
from pathlib import Path

MODELS = ("gt-mixtral", "gt-qwen3moe", "gt-deepseekv2")
FORMATS = ("f16", "q8_0", "q4_k_m")
THREADS = (1, 2)
PARALLEL = (1, 4, 16, 64)
#: prompt and generated tokens per sequence of a batched point (short: 64 sequences x 32 prompt
#: tokens is already a 2048-token prefill at 1 thread)
NPP, NTG = 32, 16
#: llama-bench points: one user, prompt 128 then 32 generated, at depth 0 and 1024 (a filled context)
BENCH_P, BENCH_N, DEPTHS = 128, 32, (0, 1024)
IDLE_BUSY_MAX = 0.15  # the machine counts as idle when under 15% of its CPU time is busy


def cpu_busy(window_s: float = 0.5) -> float:
    def read():
        vals = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return vals[3] + vals[4], sum(vals)
    i0, t0 = read()
    time.sleep(window_s)
    i1, t1 = read()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def wait_idle(max_wait_s: float = 600.0) -> float:
    start = time.time()
    while cpu_busy() > IDLE_BUSY_MAX and time.time() - start < max_wait_s:
        time.sleep(2.0)
    return time.time() - start


#: every other process is paused (SIGSTOP) while a point runs and resumed (SIGCONT) after: on a
#: shared 2-core machine another process's load would be measured as llama.cpp's time. Spared:
#: pid 1 (the machine's own agent), this process's ancestors, kernel threads (no command line).


def pausable_pids() -> list[int]:
    import os
    mine = {os.getpid()}
    pid = os.getpid()
    while pid > 1:  # ancestors
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        mine.add(pid)
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) in mine or d.name == "1":
            continue
        try:
            if not (d / "cmdline").read_bytes():
                continue  # a kernel thread
        except OSError:
            continue
        pids.append(int(d.name))
    return pids


def signal_all(pids, sig) -> None:
    import os
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _is_ours(pid: int, me: int) -> bool:
    while pid > 1:
        if pid == me:
            return True
        pid = _parent(pid)
    return False


class Paused:
    """Every other process stopped while the block runs, and any process started meanwhile (a
    tool call spawned by pid 1 is not a child of a stopped one) stopped as it appears, every
    RESCAN_S; this process's own children run. All resumed on exit, SIGTERM included."""

    RESCAN_S = 0.2

    def __enter__(self):
        import os
        import threading

        self.me, self.stopped, self.done = os.getpid(), set(), threading.Event()
        self._previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(143)))
        self._stop_new()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _stop_new(self) -> None:
        new = [p for p in pausable_pids() if p not in self.stopped and not _is_ours(p, self.me)]
        signal_all(new, signal.SIGSTOP)
        self.stopped.update(new)

    def _watch(self) -> None:
        while not self.done.wait(self.RESCAN_S):
            self._stop_new()

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        signal_all(self.stopped, signal.SIGCONT)
        signal.signal(signal.SIGTERM, self._previous)
        return False


def points(bin_dir: Path, models: Path):
    for m, f, t in itertools.product(MODELS, FORMATS, THREADS):
        gguf = models / f"{m}-{f}.gguf"
        for b in PARALLEL:
            cmd = [str(bin_dir / "llama-batched-bench"), "-m", str(gguf), "-t", str(t), "-tb", str(t), "-c", "8192",
                   "-b", "2048", "-ub", "512", "-npp", str(NPP), "-ntg", str(NTG), "-npl", str(b),
                   "--output-format", "jsonl"]
            yield {"tool": "llama-batched-bench", "model": m, "format": f, "threads": t, "parallel": b}, cmd
        for d in DEPTHS:
            if d and t == 1:
                continue  # the context dimension at 2 threads only
            cmd = [str(bin_dir / "llama-bench"), "-m", str(gguf), "-t", str(t), "-p", str(BENCH_P), "-n",
                   str(BENCH_N), "-d", str(d), "-r", "3", "-o", "json"]
            yield {"tool": "llama-bench", "model": m, "format": f, "threads": t, "parallel": 1, "depth": d}, cmd


#: prompt lengths about the tiled flash-attention kernel's 64-row query tiles (ground_truth.md §1.13):
#: 63 runs the one-row kernel, 64 one whole tile, 65 a whole tile and a 1-row one padded to 64,
#: and so on at 128 and 192; one user, one generated token (llama-bench's tg test needs one)
TILE_PROMPTS, TILE_FORMATS, TILE_REPS = (63, 64, 65, 127, 128, 129, 192, 193), ("f16", "q4_k_m"), 5


def tile_points(bin_dir: Path, models: Path):
    for m, f, t in itertools.product(MODELS, TILE_FORMATS, THREADS):
        for n in TILE_PROMPTS:
            cmd = [str(bin_dir / "llama-bench"), "-m", str(models / f"{m}-{f}.gguf"), "-t", str(t), "-p", str(n),
                   "-n", "1", "-r", str(TILE_REPS), "-o", "json"]
            yield {"tool": "llama-bench", "model": m, "format": f, "threads": t, "parallel": 1, "depth": 0,
                   "prompt": n}, cmd


#: llama-bench points across -ub (ground_truth.md §1.15): one user's 512-token prompt in passes of 32,
#: 128 and 512 tokens (16, 4 and 1 graphs, each reading every weight again), f16 and Q4_K_M, 2 threads
UBATCH_PROMPT, UBATCHES, UBATCH_THREADS, UBATCH_REPS = 512, (32, 128, 512), 2, 3


def ubatch_points(bin_dir: Path, models: Path):
    for m, f, ub in itertools.product(MODELS, TILE_FORMATS, UBATCHES):
        cmd = [str(bin_dir / "llama-bench"), "-m", str(models / f"{m}-{f}.gguf"), "-t", str(UBATCH_THREADS), "-p",
               str(UBATCH_PROMPT), "-n", "1", "-ub", str(ub), "-r", str(UBATCH_REPS), "-o", "json"]
        yield {"tool": "llama-bench", "model": m, "format": f, "threads": UBATCH_THREADS, "parallel": 1, "depth": 0,
               "prompt": UBATCH_PROMPT, "ubatch": ub}, cmd


#: batched-bench points with and without one unified KV stream (``-kvu``, ground_truth.md §1.14): 16
#: and 64 sequences (64 rows a decode step is the tiled kernel's threshold), 2 threads
KVU_PARALLEL, KVU_THREADS = (16, 64), 2


def kvu_points(bin_dir: Path, models: Path):
    for m, f, b in itertools.product(MODELS, TILE_FORMATS, KVU_PARALLEL):
        for unified in (False, True):
            cmd = [str(bin_dir / "llama-batched-bench"), "-m", str(models / f"{m}-{f}.gguf"), "-t", str(KVU_THREADS),
                   "-tb", str(KVU_THREADS), "-c", "8192", "-b", "2048", "-ub", "512", "-npp", str(NPP), "-ntg",
                   str(NTG), "-npl", str(b), *(["-kvu"] if unified else []), "--output-format", "jsonl"]
            yield {"tool": "llama-batched-bench", "model": m, "format": f, "threads": KVU_THREADS, "parallel": b,
                   "kv_unified": unified}, cmd


#: llama-completion points (one user as llama-cli runs one, through common's threadpool and
#: sampler): a fixed English prompt (its token count is the tool's own, read from its output),
#: COMPLETION_N tokens generated whatever the random weights sample (--ignore-eos), seed fixed
COMPLETION_PROMPT = ("The planner reads the machine and the model, and it says how fast a mixture of experts "
                     "will run when its weights do not fit in the memory of the accelerator. It was wrong before "
                     "anyone measured it, so now every number it prints is checked against a real engine.")
COMPLETION_N, COMPLETION_CTX = 64, 2048


def completion_points(bin_dir: Path, models: Path):
    for m, f, t in itertools.product(MODELS, FORMATS, THREADS):
        cmd = [str(bin_dir / "llama-completion"), "-m", str(models / f"{m}-{f}.gguf"), "-t", str(t), "-c",
               str(COMPLETION_CTX), "-p", COMPLETION_PROMPT, "-n", str(COMPLETION_N), "-no-cnv", "--ignore-eos",
               "-s", "1"]
        yield {"tool": "llama-completion", "model": m, "format": f, "threads": t, "parallel": 1}, cmd


#: llama-completion's timing lines (common/common.cpp common_perf_print): milliseconds and counts
_PERF = {"prompt_ms": r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens",
         "eval_ms": r"(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) runs",
         "sampling_ms": r"sampling time =\s*([\d.]+) ms", "total_ms": r"total time =\s*([\d.]+) ms"}


def completion_result(text: str) -> dict | None:
    import re

    out = {}
    for key, pattern in _PERF.items():
        m = re.search(pattern, text)
        if m is None:
            return None
        out[key] = float(m.group(1))
        if m.lastindex == 2:
            out[key.replace("_ms", "_count")] = int(m.group(2))
    return out


#: attempts at a command that exits without its result (seen once in ~400 invocations: a
#: batched-bench that exited 0 after 0.3 s with no JSON line; the same command then ran)
ATTEMPTS = 3


def run(cmd) -> dict:
    for attempt in range(ATTEMPTS):
        # errors="replace": random weights generate bytes that are not UTF-8 (llama-completion prints them)
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
        if p.returncode != 0:
            out = {"error": p.stderr[-2000:]}
        elif "llama-completion" in cmd[0]:
            res = completion_result(p.stdout + p.stderr)
            out = {"result": res} if res else {"error": "no timing lines: " + p.stderr[-2000:]}
        elif "llama-batched-bench" in cmd[0]:
            lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
            out = {"result": lines[-1]} if lines else {"error": "no JSON line: " + p.stderr[-2000:]}
        else:
            out = {"result": json.loads(p.stdout)}
        if "result" in out:
            return {**out, "attempts": attempt + 1} if attempt else out
    return out


def add_measurement_args(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The arguments every measurement script here takes: the llama.cpp tree, the GGUFs, the raw output."""
    ap.add_argument("--llama-cpp", required=True, type=Path)
    ap.add_argument("--models", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    return ap


def measurement_parser(doc: str) -> argparse.ArgumentParser:
    """A script's parser with :func:`add_measurement_args`."""
    return add_measurement_args(argparse.ArgumentParser(description=doc.splitlines()[0]))


def main() -> int:
    ap = measurement_parser(__doc__)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    bin_dir = args.llama_cpp / "build" / "bin"
    todo = list(points(bin_dir, args.models))
    raw = {"host": platform.node(), "cpu": platform.processor(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "points": [{"key": k, "command": c, "samples": []} for k, c in todo]}
    for rep in range(args.reps):
        for i, point in enumerate(raw["points"]):
            with Paused():
                waited = wait_idle(30.0)
                t0 = time.time()
                out = run(point["command"])
            out.update(rep=rep, wall_s=time.time() - t0, waited_idle_s=waited)
            point["samples"].append(out)
            args.out.write_text(json.dumps(raw, indent=1))
            print(rep, i, point["key"], f"{out['wall_s']:.1f}s", "ERR" if "error" in out else "", flush=True)
    raw["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    args.out.write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
