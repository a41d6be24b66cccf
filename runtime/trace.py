"""Instrumentation: start/end of every task on every resource lane, and a Chrome trace.

Open the JSON in chrome://tracing or https://ui.perfetto.dev: one row per lane (gpu, cpu,
h2d, d2h), one box per task with its layer / micro-batch / step in ``args``.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

from hrm.plan import write_atomic

LANE_ORDER = {"gpu": 1, "cpu": 2, "h2d": 3, "d2h": 4}


@dataclass(frozen=True)
class TaskRecord:
    lane: str
    name: str
    start_s: float
    end_s: float
    args: dict

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


class Tracer:
    """Thread-safe list of finished tasks (lanes append as they finish)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.records: list[TaskRecord] = []

    def record(self, task) -> None:
        rec = TaskRecord(task.lane, task.name, task.start_s, task.end_s, dict(task.args))
        with self._lock:
            self.records.append(rec)

    def clear(self) -> None:
        with self._lock:
            self.records = []

    def between(self, start_s: float, end_s: float) -> list[TaskRecord]:
        with self._lock:
            return [r for r in self.records if r.start_s >= start_s and r.end_s <= end_s]

    def busy_s(self, records=None) -> dict[str, float]:
        """Busy seconds per lane (sum of task durations)."""
        out: dict[str, float] = {}
        for r in self.records if records is None else records:
            out[r.lane] = out.get(r.lane, 0.0) + r.duration_s
        return out


def chrome_trace(records: list[TaskRecord], origin_s: float | None = None, metadata: dict | None = None) -> dict:
    """Chrome trace-event JSON ('X' complete events, µs) with one thread row per lane."""
    origin = min((r.start_s for r in records), default=0.0) if origin_s is None else origin_s
    events = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": lane}}
              for lane, tid in LANE_ORDER.items()]
    for r in sorted(records, key=lambda r: r.start_s):
        events.append({
            "name": r.name, "cat": r.args.get("phase", "task"), "ph": "X", "pid": 0,
            "tid": LANE_ORDER.get(r.lane, 9), "ts": (r.start_s - origin) * 1e6,
            "dur": max(r.duration_s, 0.0) * 1e6, "args": {k: v for k, v in r.args.items()},
        })
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": metadata or {}}


def write_chrome_trace(path: str | Path, records: list[TaskRecord], metadata: dict | None = None) -> None:
    write_atomic(path, json.dumps(chrome_trace(records, metadata=metadata)) + "\n")
