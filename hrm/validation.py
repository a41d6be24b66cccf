"""Committed real runs against the model's predictions (docs/validation/ground_truth.md).

A runs file (docs/calibrate.md's format, extended) lists runs that this project measured itself,
each with its exact ``command``, the engine it ran (``from``), the GGUF's tensor table, and what
was measured. :func:`compare_runs` predicts every run from its command on the file's hardware
profile and pairs each measured quantity with its prediction; the CI test holds the ratios to a
documented tolerance, so a model change that moves a prediction away from its measurement fails.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .errors import HRMError, read_yaml_mapping
from .gguf import read_inventory
from .hardware import HardwareProfile, load_hardware

#: the measured quantities a CPU llama.cpp run is compared on
QUANTITIES = ("prefill_s", "decode_s")


@dataclass(frozen=True)
class RunComparison:
    """One run's measured and predicted seconds per quantity (``ratio`` = predicted / measured)."""

    name: str
    command: str
    measured: dict[str, float]
    predicted: dict[str, float]

    def ratio(self, quantity: str) -> float:
        return self.predicted[quantity] / self.measured[quantity]


@dataclass(frozen=True)
class RunsFile:
    path: Path
    hardware: HardwareProfile
    runs: tuple[dict, ...]


def load_runs_file(path: str | Path, hardware: Optional[HardwareProfile] = None) -> RunsFile:
    p = Path(path)
    data = read_yaml_mapping(p, "runs file", "hardware, runs")
    runs = data.get("runs")
    if not isinstance(runs, list) or not runs:
        raise HRMError(f"{p}: runs: a non-empty list of runs")
    if hardware is None:
        hw_path = data.get("hardware")
        if not isinstance(hw_path, str):
            raise HRMError(f"{p}: hardware: a profile path")
        hardware = load_hardware(str((p.parent / hw_path)) if not Path(hw_path).is_absolute() else hw_path)
    return RunsFile(p, hardware, tuple(runs))


def predict_llama_cpu(run: dict, base: Path, hardware: HardwareProfile) -> dict[str, float]:
    """A llama.cpp CPU run's predicted prefill and decode seconds, from its command."""
    from .export.llama_tools import bench_runs, predict

    if hardware.ggml_cpu is None:
        raise HRMError(f"{hardware.name}: no ggml_cpu section (run hrm profile --llama-cpp DIR on the machine)")
    inventory = read_inventory(base / run["gguf"])
    tests, _ = bench_runs(run["command"], hardware.cpu.cores)
    prefill = sum(predict(t, inventory, hardware.ggml_cpu).prefill_s for t in tests if t.prompt_len and t.tool == "llama-bench" and not t.gen_len)
    decode = sum(predict(t, inventory, hardware.ggml_cpu).decode_s for t in tests if t.gen_len and t.tool == "llama-bench" and not t.prompt_len)
    for t in tests:
        if t.tool == "llama-batched-bench":
            times = predict(t, inventory, hardware.ggml_cpu)
            prefill += times.prefill_s
            decode += times.decode_s
    return {"prefill_s": prefill, "decode_s": decode}


def compare_runs(runs_file: RunsFile) -> list[RunComparison]:
    out = []
    for i, run in enumerate(runs_file.runs):
        where = f"{runs_file.path}: runs[{i}]"
        if run.get("from") != "llama.cpp" or "command" not in run:
            raise HRMError(f"{where}: only llama.cpp CPU runs with a command are compared here")
        predicted = predict_llama_cpu(run, runs_file.path.parent, runs_file.hardware)
        measured = {q: float(run["measured"][q]) for q in QUANTITIES if q in run.get("measured", {})}
        out.append(RunComparison(run.get("name", f"run {i}"), run["command"], measured,
                                 {q: predicted[q] for q in measured}))
    return out


def ratios(comparisons: list[RunComparison], quantity: Optional[str] = None) -> list[float]:
    return [c.ratio(q) for c in comparisons for q in c.measured if quantity in (None, q)]


def summary(comparisons: list[RunComparison]) -> dict[str, float]:
    """Median ratio, the worst factor either way (max of r and 1/r) and runs beyond 1.25x."""
    rs = ratios(comparisons)
    worst = max(max(r, 1 / r) for r in rs)
    return {"median_ratio": statistics.median(rs), "worst_factor": worst,
            "beyond_1_25x": sum(1 for r in rs if max(r, 1 / r) > 1.25), "quantities": len(rs)}
