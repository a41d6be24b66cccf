"""Golden outputs for a behaviour-neutral refactor: every shipped engine x six hardware profiles x
five catalog models, eight engines on three big ones, Klotski on three pairs, as
`hrm-search --json` prints them, and every workload preset on nine pairs as `hrm-search` prints
its table.

    python benchmarks/golden_outputs.py capture OUT.jsonl [--shard I/N]  # before the refactor
    python benchmarks/golden_outputs.py check OUT.jsonl [--shard I/N]    # after: numbers equal at rel 1e-12

Runs the CLI in-process, one JSON line per case; a capture resumes where an OUT it finds left
off, and shards split the cases for parallel processes (about 30 min on one core). Only the
solver's wall time is left out.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import sys
import time
from pathlib import Path

from hrm_cli import search_main

#: one of each kind: consumer, datacenter, multi-GPU and CPU-only
HARDWARE = ("l4", "t4", "a100-80g", "h100", "2xa100-80g", "cpu-only")
MODELS = ("mixtral", "deepseek-v2-lite", "qwen3-30b-a3b", "olmoe-1b-7b", "tiny-mixtral")
#: big models, without the engines whose search takes minutes on them (fiddler on gpt-oss-120b: 330 s)
BIG_MODELS = ("dbrx", "deepseek-v3", "gpt-oss-120b")
SLOW_ON_BIG = {"fiddler", "moe-infinity", "flexgen", "flexgen-cpu-attn", "klotski"}
#: their per-expert caches make these two searches take minutes with 64-128 experts
#: (fiddler on qwen3-30b-a3b, 4xt4: 160 s): on the 8-64-expert models only
SLOW_ON_MANY_EXPERTS = {"fiddler", "moe-infinity"}
FEW_EXPERTS = ("mixtral", "deepseek-v2-lite", "tiny-mixtral")
ENGINES = sorted(p.stem for p in Path(__file__).resolve().parents[1].glob("hrm/data/engines/*.yaml"))
#: the expert-level search is exact but slow on big grids (docs/klotski_bench.md): a few pairs
KLOTSKI_PAIRS = (("l4", "mixtral"), ("t4", "tiny-mixtral"), ("a100-80g", "olmoe-1b-7b"))
WORKLOADS = ("mtbench", "synthetic-reasoning", "summarization")
REL_TOL = 1e-12
# what a clock decides, not the model: the solver's seconds, and the text table's solve line
WALL_KEYS = {"seconds"}
WALL_LINE = re.compile(r"\d+\.\d+ s, optimal|solve .*\d s")


def _cli(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = search_main(argv)
        except SystemExit as e:
            code = e.code
    return int(code or 0), out.getvalue() + err.getvalue()


def _cases():
    for hw in HARDWARE:
        for model in MODELS + BIG_MODELS:
            for engine in ENGINES:
                if engine == "klotski" and (hw, model) not in KLOTSKI_PAIRS:
                    continue
                if model in BIG_MODELS and engine in SLOW_ON_BIG:
                    continue
                if engine in SLOW_ON_MANY_EXPERTS and model not in FEW_EXPERTS:
                    continue
                yield f"{hw}/{model}/{engine}", ["--hw", hw, "--model", model, "--engine", engine, "--json"]
    for hw in ("l4", "a100-80g", "cpu-only"):
        for model in ("mixtral", "deepseek-v2-lite", "qwen3-30b-a3b"):
            for wl in WORKLOADS:
                yield f"{hw}/{model}/{wl}/text", ["--hw", hw, "--model", model, "--workload", wl]


def _shard(cases, shard: str):
    i, n = (int(x) for x in shard.split("/"))
    return [c for k, c in enumerate(cases) if k % n == i]


def run_case(argv: list[str]) -> dict:
    code, text = _cli(argv)
    try:
        body = json.loads(text) if "--json" in argv and code == 0 else text
    except json.JSONDecodeError:
        body = text
    return {"exit": code, "out": body}


def shard_path(path: Path, shard: str) -> Path:
    """Each shard writes its own file (concurrent appends of long lines may interleave)."""
    return path if shard == "0/1" else path.with_name(f"{path.name}.{shard.replace('/', 'of')}")


def read_lines(path: Path) -> dict:
    """Every case captured in ``path`` and in its shards' files."""
    found = {}
    for part in [path, *sorted(path.parent.glob(path.name + ".*of*"))]:
        if part.exists():
            found.update((d["key"], d["value"]) for d in map(json.loads, part.read_text().splitlines()) if d)
    return found


def capture(path: Path, shard: str) -> None:
    done = read_lines(path)
    with shard_path(path, shard).open("a") as out:
        for key, argv in _shard(list(_cases()), shard):
            if key in done:
                continue
            start = time.perf_counter()
            value = run_case(argv)
            out.write(json.dumps({"key": key, "value": value}) + "\n")
            out.flush()
            print(f"{key}: exit {value['exit']} ({time.perf_counter() - start:.1f} s)", file=sys.stderr)


def _diff(a, b, path: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k in WALL_KEYS:
                continue
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'before' if k in a else 'after'}")
            else:
                _diff(a[k], b[k], f"{path}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, f"{path}[{i}]", out)
    elif isinstance(a, float) and isinstance(b, (int, float)):
        if not math.isclose(a, b, rel_tol=REL_TOL, abs_tol=0.0) and not (math.isnan(a) and math.isnan(b)):
            out.append(f"{path}: {a!r} -> {b!r}")
    elif isinstance(a, str) and isinstance(b, str):
        la = [s for s in a.splitlines() if not WALL_LINE.search(s)]
        lb = [s for s in b.splitlines() if not WALL_LINE.search(s)]
        if la != lb:
            first = next((i for i, (x, y) in enumerate(zip(la, lb)) if x != y), min(len(la), len(lb)))
            out.append(f"{path}: text differs at line {first}: {la[first:first + 1]} -> {lb[first:first + 1]}")
    elif a != b:
        out.append(f"{path}: {a!r} -> {b!r}")


def main(argv: list[str]) -> int:
    shard = "0/1"
    if "--shard" in argv:
        at = argv.index("--shard")
        shard, argv = argv[at + 1], argv[:at] + argv[at + 2:]
    if len(argv) != 2 or argv[0] not in ("capture", "check"):
        print(__doc__, file=sys.stderr)
        return 2
    mode, path = argv[0], Path(argv[1])
    if mode == "capture":
        capture(path, shard)
        return 0
    before, diffs = read_lines(path), []
    cases = _shard(list(_cases()), shard)
    for key, argv_case in cases:
        if key not in before:
            diffs.append(f"{key}: not captured")
            continue
        _diff(before[key], run_case(argv_case), key, diffs)
    print("\n".join(diffs[:50]) or f"golden outputs equal at rel {REL_TOL} ({len(cases)} cases)")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
