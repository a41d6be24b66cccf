"""Latency of the web planner's searches: ``hrm serve`` on 127.0.0.1 (2 workers), 50 requests
of the call the page makes when you press Plan (``POST /api/view``: the search and --explain of
its policy, the result the page shows first), 50 of the bare ``POST /api/search`` (hrm-search
--json) and 50 of the calls the page then makes beside each other (``/api/exports``: every
target's command; ``/api/compare``: every engine), one after another as a user would, for the
README's main job. Prints median and p95.

    python benchmarks/web_latency.py [--requests 50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from web_server import running_server  # noqa: E402

#: the README's main job (hrm-search --hw l4.yaml --model mixtral), as the page sends it
JOB = {"hw": "l4", "model": "mixtral", "engine": "moe-lightning", "workload": "mtbench", "objective": "generation"}


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]


def measure(url: str, path: str, count: int) -> list[float]:
    import httpx

    job = {k: v for k, v in JOB.items() if k != "engine"} if path == "/api/compare" else JOB  # every engine
    with httpx.Client(timeout=120) as client:
        warm = client.post(f"{url}{path}", json=job)  # the worker's first search
        assert warm.status_code == 200, warm.text
        times = []
        for _ in range(count):
            start = time.perf_counter()
            response = client.post(f"{url}{path}", json=job)
            times.append(time.perf_counter() - start)
            assert response.status_code == 200, response.text
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50)
    args = parser.parse_args(argv)
    rows = []
    with running_server(workers=2) as url:
        for path, what in (("/api/view", "the page's search (search + --explain)"),
                           ("/api/search", "hrm-search --json"),
                           ("/api/exports", "the page's exports (5 targets)"),
                           ("/api/compare", "the page's --compare table (17 rows)")):
            times = measure(url, path, args.requests)
            rows.append((path, what, statistics.median(times), p95(times)))
    print(f"{args.requests} sequential requests each, hw l4, model mixtral, engine moe-lightning, "
          f"{os.cpu_count()} CPU cores, 2 workers")
    print(f"| {'endpoint':<12} | {'what':<48} | median s | p95 s |")
    print(f"|{'-' * 14}|{'-' * 50}|---------:|------:|")
    for path, what, median, high in rows:
        print(f"| {path:<12} | {what:<48} | {median:8.3f} | {high:5.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
