"""Committed real runs against the model's predictions (docs/validation/ground_truth.md).

A runs file (docs/calibrate.md's format, extended) lists runs that this project measured itself,
each with its exact ``command``, the engine it ran (``from``), the GGUF's tensor table, and what
was measured. :func:`compare_runs` predicts every run from its command on the file's hardware
profile and pairs each measured quantity with its prediction; the CI test holds the ratios to a
documented tolerance, so a model change that moves a prediction away from its measurement fails.
"""

from __future__ import annotations

import statistics

import numpy as np
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import HRMError, read_yaml_mapping
from ..model.gguf import read_inventory
from ..machine.hardware import HardwareProfile, load_hardware

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


#: llama-bench's JSON fields a CPU step model run is read from, and the values it must have
#: (tools/llama-bench/llama-bench.cpp: test::to_json; a CPU-backend run with the default cache)
_BENCH_REQUIRED = ("model_filename", "n_threads", "n_prompt", "n_gen", "n_depth", "n_batch", "n_ubatch", "samples_ns")


def runs_from_llama_bench(text: str, where: str, gguf: str | Path) -> tuple[dict, ...]:
    """llama-bench's own output (``-o json``: one array, or ``-o jsonl``: one object a line) as runs
    of the CPU step model: each test its exact command (rebuilt from the fields llama-bench prints)
    and its measured time (the median of its ``samples_ns``: a pp test's prefill, a tg test's
    decode), the GGUF it ran being ``gguf`` (the file, or its tensor table). One-line HRMError,
    naming ``where`` and the field, for a test this model does not price: a GPU backend, a K/V
    type other than f16, an -ncmoe, a pp+tg (-pg) test."""
    import json

    text = text.strip()
    try:
        tests = json.loads(text) if text.startswith("[") else [json.loads(line) for line in text.splitlines()
                                                               if line.strip()]
    except json.JSONDecodeError as exc:
        raise HRMError(f"{where}: not llama-bench's -o json or -o jsonl output ({exc.msg}, line {exc.lineno})") from None
    if not tests:
        raise HRMError(f"{where}: no tests")
    runs = []
    for i, t in enumerate(tests, 1):
        at = f"{where}: test {i}"
        if not isinstance(t, dict):
            raise HRMError(f"{at}: not a JSON object")
        missing = [k for k in _BENCH_REQUIRED if k not in t]
        if missing:
            raise HRMError(f"{at}: no {', '.join(missing)} (llama-bench's -o json / jsonl fields)")
        if str(t.get("backends", "CPU")) != "CPU" or int(t.get("n_cpu_moe", 0) or 0) != 0:
            raise HRMError(f"{at}: backends {t.get('backends')!r}, n_cpu_moe {t.get('n_cpu_moe')}: the CPU step model "
                           "calibrates CPU-backend runs only")
        if {str(t.get("type_k", "f16")), str(t.get("type_v", "f16"))} != {"f16"}:
            raise HRMError(f"{at}: type_k/type_v {t.get('type_k')}/{t.get('type_v')}: the CPU step model prices an "
                           "f16 K/V cache")
        n_prompt, n_gen = int(t["n_prompt"]), int(t["n_gen"])
        if (n_prompt > 0) == (n_gen > 0):
            raise HRMError(f"{at}: n_prompt {n_prompt}, n_gen {n_gen}: a pp or a tg test (a -pg test's time is not "
                           "split into its phases)")
        samples = [float(x) for x in t["samples_ns"]]
        if not samples or min(samples) <= 0:
            raise HRMError(f"{at}: samples_ns: positive nanoseconds")
        name = Path(str(t["model_filename"])).name
        repack = "" if t.get("repack", True) in (True, 1, "1", "true") else " --repack 0"
        command = (f"llama-bench -m {name} -t {int(t['n_threads'])} -p {n_prompt} -n {n_gen} -d {int(t['n_depth'])} "
                   f"-b {int(t['n_batch'])} -ub {int(t['n_ubatch'])}{repack}")
        phase = "prefill_s" if n_prompt else "decode_s"
        label = f"pp{n_prompt}" if n_prompt else f"tg{n_gen}"
        runs.append({"name": f"{name} t{int(t['n_threads'])} {label} d{int(t['n_depth'])}", "engine": "llama.cpp",
                     "from": "llama.cpp", "command": command, "gguf": str(Path(gguf).resolve()),
                     "measured": {phase: statistics.median(samples) / 1e9}})
    return tuple(runs)


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


def served_estimate(run: dict, base: Path, hardware: HardwareProfile, inventory):
    """A llama-server / llama-cli / llama-completion run on the CPU step model
    (:func:`hrm.export.importing.estimate_without_gpu`), on the workload the run records: the prompt's
    tokens as the tool counted them and the tokens generated (``workload``: prompt_len, gen_len)."""
    from ..export.importing import estimate_without_gpu
    from ..model.spec import load_model
    from ..workload import make_workload

    w = run.get("workload")
    if not isinstance(w, dict) or not {"prompt_len", "gen_len"} <= set(w):
        raise HRMError(f"{run.get('name', 'a run')}: a {run['command'].split()[0]} run needs workload: "
                       "{prompt_len, gen_len} (the prompt's tokens and the tokens generated)")
    workload = make_workload(None, prompt_len=int(w["prompt_len"]), gen_len=int(w["gen_len"]))
    return estimate_without_gpu("llama.cpp", run["command"], load_model(str(base / run["model"])), workload, hardware,
                                inventory)


def predict_llama_cpu(run: dict, base: Path, hardware: HardwareProfile) -> dict[str, float]:
    """A llama.cpp CPU run's predicted prefill and decode seconds, from its command."""
    from ..export.llama_tools import bench_runs, predict, tool_of

    if hardware.ggml_cpu is None:
        raise HRMError(f"{hardware.name}: no ggml_cpu section (run hrm profile --llama-cpp DIR on the machine)")
    inventory = read_inventory(base / run["gguf"])
    if tool_of(run["command"]) is None:  # llama-server / llama-cli / llama-completion: the one run it serves
        times = served_estimate(run, base, hardware, inventory).times
        return {"prefill_s": times.prefill_s, "decode_s": times.decode_s}
    tests, _ = bench_runs(run["command"], hardware.cpu.cores)
    # a llama-bench pp test has no decode and a tg test no prefill: the command's times are sums
    times = [predict(t, inventory, hardware.ggml_cpu) for t in tests]
    return {"prefill_s": sum(t.prefill_s for t in times), "decode_s": sum(t.decode_s for t in times)}


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


def worst_factor(ratios_: list[float]) -> float:
    """The largest predicted/measured ratio either way: max of r and 1/r (0.8 and 1.25 are both 1.25)."""
    return max(max(r, 1 / r) for r in ratios_)


def summary(comparisons: list[RunComparison]) -> dict[str, float]:
    """Median ratio, the worst factor either way (:func:`worst_factor`) and runs beyond 1.25x."""
    rs = ratios(comparisons)
    return {"median_ratio": statistics.median(rs), "worst_factor": worst_factor(rs),
            "beyond_1_25x": sum(1 for r in rs if max(r, 1 / r) > 1.25), "quantities": len(rs)}


# --- calibration of the CPU step model to a user's own runs ------------------------------------

#: the fields hrm calibrate fits for llama.cpp CPU runs (hrm.machine.hardware.GgmlCpu)
GGML_FIELDS = ("stream_scale", "compute_scale")
#: each within [1/2, 2]: a shared VM's speed moves by up to 70% between a profile and a run
#: (docs/validation/cpu_noise.md: median drift 27%, max 70%), a kernel's by no more
GGML_SCALE_RANGE = (0.5, 2.0)


@dataclass(frozen=True)
class GgmlCalibration:
    """The fitted scales, and the RMS of log(predicted / measured) over the fitted runs."""

    stream_scale: float
    compute_scale: float
    rms_log_before: float
    rms_log_after: float


def with_scales(hardware: HardwareProfile, stream_scale: float, compute_scale: float) -> HardwareProfile:
    section = hardware.ggml_cpu.model_copy(update={"stream_scale": stream_scale, "compute_scale": compute_scale})
    return hardware.model_copy(update={"ggml_cpu": section})


def _log_errors(runs_file: RunsFile, hardware: HardwareProfile, indices: tuple[int, ...]) -> np.ndarray:
    sub = RunsFile(runs_file.path, hardware, tuple(runs_file.runs[i] for i in indices))
    return np.log(np.array(ratios(compare_runs(sub))))


def fit_ggml_scales(runs_file: RunsFile, indices: tuple[int, ...]) -> GgmlCalibration:
    """Least squares on log(predicted / measured) of the runs ``indices`` over the two scales
    (log-parameters, bounded by GGML_SCALE_RANGE). Both start at the profile's values."""
    from scipy.optimize import least_squares

    base = runs_file.hardware
    if base.ggml_cpu is None:
        raise HRMError(f"{base.name}: no ggml_cpu section to calibrate (hrm profile --llama-cpp DIR)")
    lo, hi = np.log(GGML_SCALE_RANGE[0]), np.log(GGML_SCALE_RANGE[1])
    start = np.clip(np.log([base.ggml_cpu.stream_scale, base.ggml_cpu.compute_scale]), lo, hi)

    def residuals(theta):
        return _log_errors(runs_file, with_scales(base, *np.exp(theta)), indices)

    before = residuals(start)
    solved = least_squares(residuals, start, bounds=([lo, lo], [hi, hi]), x_scale=0.3, max_nfev=200)
    stream, compute = (float(f"{v:.6g}") for v in np.exp(solved.x))
    return GgmlCalibration(stream, compute, float(np.sqrt(np.mean(before ** 2))),
                           float(np.sqrt(np.mean(solved.fun ** 2))))


@dataclass(frozen=True)
class HeldOut:
    """One group's calibration: the runs fitted, and every other run's ratio before and after."""

    group: str
    fitted: tuple[str, ...]
    calibration: GgmlCalibration
    before: tuple[float, ...]
    after: tuple[float, ...]

    @property
    def worst_after(self) -> float:
        return worst_factor(self.after)

    @property
    def worst_before(self) -> float:
        return worst_factor(self.before)


def held_out(runs_file: RunsFile, group_of, fitted_of) -> list[HeldOut]:
    """Per group of runs (``group_of(run)``, e.g. one model file as one user has it): fit the
    runs ``fitted_of(group runs)`` picks (indices into the group) and predict the others."""
    groups: dict[str, list[int]] = {}
    for i, run in enumerate(runs_file.runs):
        groups.setdefault(group_of(run), []).append(i)
    out = []
    for name, members in groups.items():
        picks = tuple(members[j] for j in fitted_of([runs_file.runs[i] for i in members]))
        rest = tuple(i for i in members if i not in picks)
        cal = fit_ggml_scales(runs_file, picks)
        before = tuple(np.exp(_log_errors(runs_file, runs_file.hardware, rest)))
        after = tuple(np.exp(_log_errors(runs_file, with_scales(runs_file.hardware, cal.stream_scale,
                                                                  cal.compute_scale), rest)))
        out.append(HeldOut(name, tuple(runs_file.runs[i].get("name", str(i)) for i in picks), cal,
                           tuple(float(x) for x in before), tuple(float(x) for x in after)))
    return out
