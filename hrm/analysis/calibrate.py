"""Calibrate a hardware profile's achieved rates to the user's own runs (``hrm calibrate``;
docs/calibrate.md).

A runs file names a profile, a model and runs, each an engine, a workload, a policy and
what the user measured (throughput, TPOT, TTFT). Only achieved-rate fields of the profile
move — link rates, host copy and DRAM rates, the GPU's streaming and GEMM efficiencies,
the GPU task dispatch α — each within a stated physical range (:data:`FIELDS`), by bounded
least squares on ``ln(predicted / measured)`` (:func:`fit`). A field no run depends on
cannot be identified and stays as the profile has it. Never fit to published end-to-end
results: only to runs of the user's own machine.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Literal, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict

from ..machine.achieved import achieved_rates
from ..engines.engine import Engine, list_engines, load_engine
from ..errors import HRMError, read_input_text, read_yaml_mapping
from ..estimate import estimate
from ..machine.hardware import HardwareProfile, profile_dirs
from ..cost.memory import MemoryLimits, memory_limits
from ..model.spec import ModelSpec
from ..model.options import DEFAULT_OPTIONS, options_in_dtype, spec_in_dtype
from ..policy import Policy, parse_policy
from ..units import FLOAT_DTYPES, GB
from ..workload import PRESETS, Workload, make_workload

# --- the fitted fields and their physical ranges ----------------------------------------

#: pinned DMA over the profile's figure: down to 0.25x (a x4/x8 slot, or a host buffer on
#: the far NUMA socket: 3.78 of 12.15 GB/s, hrm.machine.achieved.NUMA_REMOTE_FRACTION) and up to 2x
#: (a datasheet profile's conservative constant: 16 GiB/s on a PCIe 4.0 x16 link whose
#: theoretical rate is 31.5 GB/s)
LINK_PINNED_RANGE = (0.25, 2.0)
#: a pageable copy over the profile's *pinned* rate: the driver stages it through a pinned
#: buffer, so it is never faster than pinned (1x); 2-2.5x slower is typical and FlexGen's
#: fit on L4 (5.4 of 17.2 GB/s) is 3.2x slower (docs/mechanisms.md §1): floor 0.2x
PAGEABLE_OF_PINNED_RANGE = (0.2, 1.0)
#: one thread's memcpy, GB/s: ~3 GB/s on old or virtualised cores, ~30 GB/s on the fastest
#: desktop/server cores (docs/mechanisms.md §1 quotes ~10 for server CPUs)
MEMCPY_ONE_THREAD_GBPS_RANGE = (2.0, 40.0)
#: all threads' memcpy over cpu.memory_bandwidth_gbps (STREAM counting): a copy moves at
#: least 2 DRAM bytes per byte (read + non-temporal write), so at most 1/2; 3 bytes with
#: write-allocate (hrm.machine.achieved.COPY_DRAM_BYTES_PER_BYTE, the default 1/3); 1/10 floor for a
#: thread team that reaches only part of the channels
MEMCPY_ALL_OF_DRAM_RANGE = (0.1, 0.5)
#: host DRAM rate (CPU attention, staging copies, DMA) over the profile's figure: STREAM
#: reaches 60-90% of the channels' theoretical rate, a VM or one NUMA node less (0.3x); a
#: profile may understate it (an artifact's default flag): up to 1.5x
DRAM_RANGE = (0.3, 1.5)
#: the emulated tiers' copy rate, x the profile's 256 MiB copy: the runtime's copies are KB to MB
#: and stay in the caches (measured on this VM: its h2d/d2h lanes took x0.59/x0.68 of the time
#: predicted at that rate, docs/validation/tiny-mixtral.json term_ratios), or pay more per byte
#: when tiny; 4x leaves room above that measurement, 0.3x as DRAM_RANGE (our choice)
EMULATED_COPY_RANGE = (0.3, 4.0)
#: share of datasheet GPU memory bandwidth a streaming kernel reaches: at most 1 by
#: definition; 70-90% typical (docs/mechanisms.md §2); 0.4 floor for small, fragmented reads
STREAM_EFFICIENCY_RANGE = (0.4, 1.0)
#: share of tensor peak a large GEMM reaches: at most 1; ~0.8 on H100 (docs/facts.md); 0.2
#: floor for untuned kernels
GEMM_EFFICIENCY_RANGE = (0.2, 1.0)
#: fixed cost of one GPU task (launch, dependency hand-off, sync), seconds: from 0 (the
#: datasheet roofline) to 1 ms (a Python-driven task loop; a CUDA launch alone is ~5 µs)
TASK_DISPATCH_S_RANGE = (0.0, 1e-3)
#: the linear parameter of the dispatch α is seconds over this unit (100 µs), so that every
#: fitted parameter moves predictions on the same scale as a log-rate does
TASK_DISPATCH_UNIT_S = 1e-4
#: parameters count from their range's lower bound plus this offset: scipy's trf starts its
#: trust region at the norm of the start, which must not be ~0 (a dispatch α starting at 0)
PARAMETER_OFFSET = 1.0


@dataclass(frozen=True)
class FieldSpec:
    """A fitted profile field: its path, unit, the parameter it is fitted as (``log`` of a
    rate, ``linear`` for the dispatch α: :func:`to_parameter`), its profile section, its
    range (a function of the base profile) and the reason for the range."""

    name: str
    unit: str
    scale: Literal["log", "linear"]
    section: str
    range_of: Callable[[HardwareProfile], tuple[float, float]]
    why: str


def _relative(field: str, factors: tuple[float, float]) -> Callable[[HardwareProfile], tuple[float, float]]:
    """A range of ``factors`` times the base profile's effective value of ``field``."""
    return lambda hw: (factors[0] * effective_value(hw, field), factors[1] * effective_value(hw, field))


def _fixed(bounds: tuple[float, float]) -> Callable[[HardwareProfile], tuple[float, float]]:
    return lambda hw: bounds


FIELDS: dict[str, FieldSpec] = {f.name: f for f in (
    FieldSpec("link.h2d_gbps", "GB/s", "log", "link", _relative("link.h2d_gbps", LINK_PINNED_RANGE),
              "pinned DMA: x0.25 (x8 slot, far NUMA socket) to x2 (a conservative datasheet constant)"),
    FieldSpec("link.d2h_gbps", "GB/s", "log", "link", _relative("link.d2h_gbps", LINK_PINNED_RANGE),
              "as link.h2d_gbps"),
    FieldSpec("link.h2d_pageable_gbps", "GB/s", "log", "link", _relative("link.h2d_gbps", PAGEABLE_OF_PINNED_RANGE),
              "x0.2 to x1 the pinned rate: a driver-staged copy is never faster than pinned"),
    FieldSpec("link.d2h_pageable_gbps", "GB/s", "log", "link", _relative("link.d2h_gbps", PAGEABLE_OF_PINNED_RANGE),
              "as link.h2d_pageable_gbps"),
    FieldSpec("cpu.memcpy_one_thread_gbps", "GB/s", "log", "cpu", _fixed(MEMCPY_ONE_THREAD_GBPS_RANGE),
              "one core's memcpy, old/virtual to the fastest cores"),
    FieldSpec("cpu.memcpy_all_threads_gbps", "GB/s", "log", "cpu",
              _relative("cpu.memory_bandwidth_gbps", MEMCPY_ALL_OF_DRAM_RANGE),
              "1/10 to 1/2 of DRAM bandwidth: a copy moves 2-3 DRAM bytes per byte"),
    FieldSpec("cpu.memory_bandwidth_gbps", "GB/s", "log", "cpu", _relative("cpu.memory_bandwidth_gbps", DRAM_RANGE),
              "host DRAM (CPU attention, copies): STREAM reaches 60-90% of theoretical"),
    FieldSpec("gpu.memory_stream_efficiency", "", "log", "gpu", _fixed(STREAM_EFFICIENCY_RANGE),
              "at most 1 (a share of the datasheet); 0.7-0.9 typical"),
    FieldSpec("gpu.gemm_efficiency", "", "log", "gpu", _fixed(GEMM_EFFICIENCY_RANGE),
              "at most 1 (a share of tensor peak); ~0.8 for large GEMMs"),
    FieldSpec("gpu.dispatch.task_s", "s", "linear", "gpu", _fixed(TASK_DISPATCH_S_RANGE),
              "0 (roofline) to 1 ms (a Python task loop); a CUDA launch is ~5 us"),
    # a CPU-only host's emulated tier (hrm.machine.rates.emulated_rates): its tasks' α and its copy rate
    FieldSpec("cpu.dispatch.task_s", "s", "linear", "cpu", _fixed(TASK_DISPATCH_S_RANGE),
              "as gpu.dispatch.task_s, for the CPU's tasks (both tiers of a CPU-only host)"),
    FieldSpec("emulation.copy_gbps", "GB/s", "log", "emulation", _relative("emulation.copy_gbps", EMULATED_COPY_RANGE),
              "a copy between the emulated tiers: the profiler measures a 256 MiB copy, the runtime's are "
              "small and cache-resident (faster)"),
)}

#: the per-task dispatch α of each tier (0 where the profile has no dispatch section)
DISPATCH_FIELDS = ("gpu.dispatch.task_s", "cpu.dispatch.task_s")

#: fields whose effective value is an :class:`hrm.machine.achieved.Achieved` rate (a named default
#: where the profile lacks it), by the Achieved attribute and its scale to the field's unit
ACHIEVED_ATTRIBUTES = {
    "link.h2d_pageable_gbps": ("h2d_pageable_bytes_s", 1 / GB),
    "link.d2h_pageable_gbps": ("d2h_pageable_bytes_s", 1 / GB),
    "cpu.memcpy_one_thread_gbps": ("memcpy_one_thread_bytes_s", 1 / GB),
    "cpu.memcpy_all_threads_gbps": ("memcpy_all_threads_bytes_s", 1 / GB),
    "gpu.memory_stream_efficiency": ("gpu_memory_stream_efficiency", 1.0),
    "gpu.gemm_efficiency": ("gpu_gemm_efficiency", 1.0),
}

# --- the fit's numerical settings ----------------------------------------------------------

#: parameter step of the identification Jacobian (5% of a rate; 5 µs of dispatch α)
IDENTIFY_STEP = 0.05
#: a field whose every |d ln(prediction) / d parameter| is below this cannot be identified
#: (a 1% change of the field moves no prediction by 0.001%)
IDENTIFY_TOL = 1e-3
#: a field whose unit Jacobian column lies within this distance of the span of the
#: stronger columns is collinear with them (pivoted QR): the runs cannot tell them apart
COLLINEAR_TOL = 0.02
#: evaluation cap of one least-squares solve (each evaluation predicts every run)
MAX_EVALUATIONS = 400
#: fitted values are rounded to this many significant digits (far below what runs resolve)
SIGNIFICANT_DIGITS = 6
#: a parameter this close to its bound has ended on it (and is set to it exactly)
BOUND_TOL = 1e-6


def _frozen() -> ConfigDict:
    return ConfigDict(extra="forbid", frozen=True)


# --- the runs file ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Quantity:
    """A measurable quantity: the :class:`hrm.estimate.EstimateResult` attribute that
    predicts it, its unit, and what it is."""

    attribute: str
    unit: str
    label: str


QUANTITIES: dict[str, Quantity] = {
    "generation_throughput_tok_s": Quantity("generation_throughput_tok_s", "tok/s", "gen tok/s"),
    "decode_throughput_tok_s": Quantity("decode_throughput_tok_s", "tok/s", "dec tok/s"),
    "tpot_s": Quantity("per_token_latency_s", "s", "TPOT s"),
    "ttft_s": Quantity("prefill_latency_s", "s", "TTFT s"),
    # an engine's own timers (FlexGen's write_benchmark_log, flexgen/utils.py:263-281): for a
    # batch engine prefill_s is the TTFT, and total_s = prefill_s + decode_s
    "prefill_s": Quantity("prefill_latency_s", "s", "prefill s"),
    "decode_s": Quantity("decode_time_s", "s", "decode s"),
    "total_s": Quantity("total_time_s", "s", "total s"),
}
#: what a run records besides what is fitted: the command as run, the ``hrm import --from``
#: target that reads it, the engine's version, and the spread of repeated measurements
PROVENANCE_KEYS = ("command", "from", "engine_version", "spread")
RUN_KEYS = ("name", "engine", "workload", "policy", "gpu_mem_gib", "cpu_mem_gib", "measured", *PROVENANCE_KEYS)
WORKLOAD_KEYS = ("preset", "prompt_len", "max_prompt_len", "gen_len", "padding")


class Measurement(BaseModel):
    model_config = _frozen()

    quantity: str
    value: float


class Run(BaseModel):
    """One measured run: engine, workload, policy, memory overrides and what was measured."""

    model_config = _frozen()

    label: str
    engine: Engine
    workload: Workload
    policy: Policy
    gpu_mem_gib: Optional[float] = None
    cpu_mem_gib: Optional[float] = None
    measured: tuple[Measurement, ...]
    #: the runs file's ``dtype``: every tensor held and computed in it (the reference runtime's
    #: ``--dtype``, which ``hrm validate --runs-out`` writes); None: the model's own dtypes
    dtype: Optional[str] = None
    #: provenance (:data:`PROVENANCE_KEYS`), None where the file gives none: the engine's
    #: command as run, the ``hrm import --from`` target that reads it, the engine's version,
    #: and per quantity the (min, max) of ``spread_n`` repeats whose median is measured
    command: Optional[str] = None
    source: Optional[str] = None
    engine_version: Optional[str] = None
    spread_n: Optional[int] = None
    spread: tuple[tuple[str, float, float], ...] = ()


class Runs(BaseModel):
    """A runs file: the profile and model it names (resolved against the file's folder),
    its runs, and its sha256."""

    model_config = _frozen()

    path: str
    sha256: str
    hardware: str
    model: str
    runs: tuple[Run, ...]


def _resolve_beside(value: str, folder: Path) -> str:
    """A relative path (a folder in it, or a file suffix) that exists beside the runs file,
    else ``value`` unchanged (a shipped name, or a path from the working folder)."""
    path_like = "/" in value or value.endswith((".yaml", ".yml", ".json"))
    candidate = folder / value
    return str(candidate) if path_like and not Path(value).is_absolute() and candidate.exists() else value


def _text(data: dict, key: str, where: str) -> str:
    if key not in data:
        raise HRMError(f"{where}: missing key '{key}'")
    value = data[key]
    if not isinstance(value, str) or not value.strip():
        raise HRMError(f"{where}.{key}: expected a non-empty string, got {type(value).__name__}")
    return value.strip()


def _unknown_keys(data: dict, known: tuple[str, ...], where: str) -> None:
    extra = [str(k) for k in data if k not in known]
    if extra:
        raise HRMError(f"{where}: unknown key '{extra[0]}' (keys: {', '.join(known)})")


def _engine(text: str, folder: Path, where: str) -> Engine:
    path = Path(_resolve_beside(text, folder))
    if text != "ideal" and text not in list_engines() and not (path.suffix in (".yaml", ".yml") and path.is_file()):
        raise HRMError(f"{where}: unknown engine '{text}' (shipped: {', '.join(list_engines())}; or a YAML file)")
    try:
        return load_engine(str(path) if path.suffix in (".yaml", ".yml") else text)
    except HRMError as exc:
        raise HRMError(f"{where}: {exc}") from None


def _workload(value, where: str) -> Workload:
    """A preset name, or a mapping of prompt_len, max_prompt_len, gen_len, padding (and an
    optional preset the others override)."""
    if isinstance(value, str):
        value = {"preset": value}
    if not isinstance(value, dict):
        raise HRMError(f"{where}: expected a preset name ({', '.join(PRESETS)}) or a mapping of "
                       f"{', '.join(WORKLOAD_KEYS)}")
    _unknown_keys(value, WORKLOAD_KEYS, where)
    numbers = {k: value.get(k) for k in ("prompt_len", "max_prompt_len", "gen_len")}
    for key, number in numbers.items():
        if number is not None and (isinstance(number, bool) or not isinstance(number, int)):
            raise HRMError(f"{where}.{key}: expected a whole number of tokens, got {number!r}")
    padding = value.get("padding", False)
    if not isinstance(padding, bool):
        raise HRMError(f"{where}.padding: expected true or false, got {padding!r}")
    try:
        return make_workload(value.get("preset"), numbers["prompt_len"], numbers["max_prompt_len"],
                             numbers["gen_len"], padding)
    except HRMError as exc:
        raise HRMError(f"{where}: {exc}") from None


def _positive_number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise HRMError(f"{where}: expected a finite positive number, got {value!r}")
    return float(value)


def _measured(value, where: str) -> tuple[Measurement, ...]:
    if not isinstance(value, dict) or not value:
        raise HRMError(f"{where}: expected a mapping of one or more of {', '.join(QUANTITIES)}")
    out = []
    for key, number in value.items():
        if key not in QUANTITIES:
            raise HRMError(f"{where}: unknown quantity '{key}' (one of {', '.join(QUANTITIES)})")
        out.append(Measurement(quantity=key, value=_positive_number(number, f"{where}.{key}")))
    return tuple(out)


def _spread(value, measured: tuple[Measurement, ...], where: str) -> tuple[Optional[int], tuple]:
    """``spread: {n: N, QUANTITY: [min, max], ...}``: N ≥ 2 repeats, each quantity one of the
    run's measured ones, min ≤ measured ≤ max."""
    if value is None:
        return None, ()
    if not isinstance(value, dict):
        raise HRMError(f"{where}: expected a mapping of n and [min, max] per measured quantity")
    n = value.get("n")
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise HRMError(f"{where}.n: expected the number of repeats (2 or more), got {n!r}")
    shown = {m.quantity: m.value for m in measured}
    out = []
    for key, pair in value.items():
        if key == "n":
            continue
        if key not in shown:
            raise HRMError(f"{where}: '{key}' is not one of the run's measured quantities ({', '.join(shown)})")
        if not isinstance(pair, list) or len(pair) != 2:
            raise HRMError(f"{where}.{key}: expected [min, max], got {pair!r}")
        lo, hi = (_positive_number(x, f"{where}.{key}") for x in pair)
        if not lo <= shown[key] <= hi:
            raise HRMError(f"{where}.{key}: measured {shown[key]} lies outside [{lo}, {hi}]")
        out.append((key, lo, hi))
    return n, tuple(out)


def _optional_text(data: dict, key: str, where: str) -> Optional[str]:
    return None if data.get(key) is None else _text(data, key, where)


def _source(data: dict, where: str) -> Optional[str]:
    """``from``: an ``hrm import --from`` target (it reads ``command``)."""
    from ..export import EXPORTERS

    name = _optional_text(data, "from", where)
    if name is not None and name not in EXPORTERS:
        raise HRMError(f"{where}.from: unknown import target '{name}' (one of {', '.join(EXPORTERS)})")
    if name is not None and data.get("command") is None:
        raise HRMError(f"{where}: 'from' names the target that reads 'command': give the command")
    return name


def _memory(data: dict, key: str, where: str) -> Optional[float]:
    return None if data.get(key) is None else _positive_number(data[key], f"{where}.{key}")


def parse_run(data, index: int, folder: Path, source: str, dtype: Optional[str] = None) -> Run:
    """One entry of ``runs:``; HRMError naming ``source`` and the entry's field."""
    where = f"{source}: runs[{index}]"
    if not isinstance(data, dict):
        raise HRMError(f"{where}: expected a mapping of {', '.join(RUN_KEYS)}")
    _unknown_keys(data, RUN_KEYS, where)
    engine = _engine(_text(data, "engine", where), folder, f"{where}.engine")
    for key in ("workload", "measured"):
        if key not in data:
            raise HRMError(f"{where}: missing key '{key}'")
    workload = _workload(data["workload"], f"{where}.workload")
    policy = parse_policy(_text(data, "policy", where), f"{where}.policy")
    label = data.get("name")
    label = str(label) if label is not None else f"#{index + 1} {engine.name}"
    measured = _measured(data["measured"], f"{where}.measured")
    spread_n, spread = _spread(data.get("spread"), measured, f"{where}.spread")
    return Run(label=label, engine=engine, workload=workload, policy=policy,
               gpu_mem_gib=_memory(data, "gpu_mem_gib", where), cpu_mem_gib=_memory(data, "cpu_mem_gib", where),
               measured=measured, dtype=dtype, command=_optional_text(data, "command", where),
               source=_source(data, where), engine_version=_optional_text(data, "engine_version", where),
               spread_n=spread_n, spread=spread)


def load_runs(path: str | Path) -> Runs:
    """Read a runs file (YAML through the project's safe reader); HRMError, one line naming
    the file and the field, for anything missing, unknown or not a finite positive number."""
    data = read_yaml_mapping(path, "a runs YAML file", "hardware, model and runs")
    source = str(path)
    _unknown_keys(data, ("hardware", "model", "dtype", "runs"), source)
    dtype = data.get("dtype")
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise HRMError(f"{source}: dtype: expected one of {', '.join(FLOAT_DTYPES)}, got {dtype!r}")
    folder = Path(path).parent
    hardware = _resolve_beside(_text(data, "hardware", source), folder)
    model = _resolve_beside(_text(data, "model", source), folder)
    entries = data.get("runs")
    if not isinstance(entries, list) or not entries:
        raise HRMError(f"{source}: runs: expected a list of one or more runs")
    runs = tuple(parse_run(entry, i, folder, source, dtype) for i, entry in enumerate(entries))
    digest = hashlib.sha256(read_input_text(path, "a runs YAML file").encode()).hexdigest()
    return Runs(path=source, sha256=digest, hardware=hardware, model=model, runs=runs)


# --- predictions on a modified profile ---------------------------------------------------------

def effective_value(hw: HardwareProfile, name: str) -> float:
    """The value ``hw`` runs at for field ``name``: the profile's own, else the named
    default of :mod:`hrm.machine.achieved` (a measured profile's GPU efficiencies: 1), 0 for an
    absent dispatch α."""
    if name in ACHIEVED_ATTRIBUTES:
        attribute, scale = ACHIEVED_ATTRIBUTES[name]
        return float(getattr(achieved_rates(hw), attribute)) * scale
    if name in DISPATCH_FIELDS:
        dispatch = getattr(hw, FIELDS[name].section).dispatch
        return float(dispatch.task_s) if dispatch is not None else 0.0
    section, key = name.split(".")
    return float(getattr(getattr(hw, section), key))


def profile_value(hw: HardwareProfile, name: str) -> Optional[float]:
    """The value ``hw`` states for field ``name`` (None: a default applies)."""
    node = hw
    for part in name.split("."):
        node = getattr(node, part, None)
        if node is None:
            return None
    return float(node)


def with_values(hw: HardwareProfile, values: dict[str, float]) -> HardwareProfile:
    """``hw`` with the fields ``values`` names set (a validated copy, as :mod:`hrm.machine.whatif`)."""
    data = hw.model_dump(exclude_none=True)
    for name, value in values.items():
        *sections, key = name.split(".")
        node = data
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = float(value)
    return HardwareProfile.model_validate(data)


def run_limits(hw: HardwareProfile, run: Run) -> MemoryLimits | None:
    """The run's --gpu-mem/--cpu-mem overrides as limits (None: the profile's)."""
    if run.gpu_mem_gib is None and run.cpu_mem_gib is None:
        return None
    return memory_limits(hw, gpu_mem_gib=run.gpu_mem_gib, cpu_mem_gib=run.cpu_mem_gib)


def predict_run(hw: HardwareProfile, model: ModelSpec, run: Run, limits: MemoryLimits | None = None) -> np.ndarray:
    """The predicted value of each of the run's measurements on ``hw`` (in the runs' dtype,
    where the file states one)."""
    options = DEFAULT_OPTIONS
    if run.dtype is not None:
        model, options = spec_in_dtype(model, run.dtype), options_in_dtype(run.dtype)
    result = estimate(hw, model, run.workload, run.policy, limits=limits, engine=run.engine, options=options)
    return np.array([float(getattr(result, QUANTITIES[m.quantity].attribute)) for m in run.measured])


# --- the fit --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CalibrationFit:
    """What a fit needs: the base profile, model, runs, their limits, the candidate fields
    with their start values, ranges and parameter bounds."""

    hw: HardwareProfile
    model: ModelSpec
    runs: tuple[Run, ...]
    limits: tuple[Optional[MemoryLimits], ...]
    fields: tuple[str, ...]
    start: np.ndarray   # the base profile's effective values
    lo: np.ndarray      # range, field units
    hi: np.ndarray

    def to_values(self, theta: np.ndarray, which: tuple[int, ...]) -> dict[str, float]:
        """Field values of parameters ``theta`` (one per index of ``which``), clipped into each
        field's range: exp(ln(hi / lo)) · lo can land an ulp above ``hi`` (a measured profile's
        GPU efficiency starts at its bound 1, which the profile's validator then refuses)."""
        return {self.fields[j]: min(max(from_parameter(self.fields[j], t, self.lo[j]), float(self.lo[j])),
                                    float(self.hi[j])) for j, t in zip(which, theta)}

    def bounds(self, which: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        lo = [to_parameter(self.fields[j], self.lo[j], self.lo[j]) for j in which]
        hi = [to_parameter(self.fields[j], self.hi[j], self.lo[j]) for j in which]
        return np.array(lo, dtype=float), np.array(hi, dtype=float)

    def x0(self, which: tuple[int, ...]) -> np.ndarray:
        """The start (clipped into the range) as parameters."""
        start = np.clip(self.start, self.lo, self.hi)
        return np.array([to_parameter(self.fields[j], start[j], self.lo[j]) for j in which], dtype=float)


def to_parameter(name: str, value: float, lo: float) -> float:
    """The fitted parameter of field ``name``: :data:`PARAMETER_OFFSET` + ln(value / lo)
    (a rate) or + (value − lo) / :data:`TASK_DISPATCH_UNIT_S` (the dispatch α), ``lo`` the
    range's lower bound."""
    if FIELDS[name].scale == "linear":
        return PARAMETER_OFFSET + (value - lo) / TASK_DISPATCH_UNIT_S
    return PARAMETER_OFFSET + math.log(value / lo)


def from_parameter(name: str, theta: float, lo: float) -> float:
    """The field value of parameter ``theta`` (:func:`to_parameter` inverted)."""
    if FIELDS[name].scale == "linear":
        return float(lo + (theta - PARAMETER_OFFSET) * TASK_DISPATCH_UNIT_S)
    return float(lo * math.exp(theta - PARAMETER_OFFSET))


def applicable_fields(hw: HardwareProfile) -> tuple[str, ...]:
    """The fields of :data:`FIELDS` whose profile section ``hw`` has (a CPU-only profile has
    no link nor gpu section)."""
    return tuple(name for name, spec in FIELDS.items() if getattr(hw, spec.section) is not None)


def check_fields(hw: HardwareProfile, fields) -> tuple[str, ...]:
    """The requested fields (all applicable ones when None); HRMError for an unknown one or
    one the profile has no section for."""
    if fields is None:
        return applicable_fields(hw)
    out = []
    for name in fields:
        if name not in FIELDS:
            raise HRMError(f"--fields: unknown field '{name}' (fittable: {', '.join(FIELDS)})")
        if getattr(hw, FIELDS[name].section) is None:
            raise HRMError(f"--fields: profile '{hw.name}' has no {FIELDS[name].section} section for {name}")
        if name not in out:
            out.append(name)
    if not out:
        raise HRMError("--fields: give one or more fields")
    return tuple(out)


def runs_limits(hw: HardwareProfile, runs: Runs) -> tuple[Optional[MemoryLimits], ...]:
    """Each run's limits (:func:`run_limits`); HRMError naming the file and the run."""
    out = []
    for i, run in enumerate(runs.runs):
        try:
            out.append(run_limits(hw, run))
        except HRMError as exc:
            raise HRMError(f"{runs.path}: runs[{i}]: {exc}") from None
    return tuple(out)


def make_fit(hw: HardwareProfile, model: ModelSpec, runs: Runs, fields=None) -> CalibrationFit:
    names = check_fields(hw, fields)
    ranges = [FIELDS[n].range_of(hw) for n in names]
    return CalibrationFit(hw=hw, model=model, runs=runs.runs, limits=runs_limits(hw, runs), fields=names,
                      start=np.array([effective_value(hw, n) for n in names]),
                      lo=np.array([r[0] for r in ranges]), hi=np.array([r[1] for r in ranges]))


def predictions(problem: CalibrationFit, values: dict[str, float], runs: tuple[int, ...]) -> list[np.ndarray]:
    """Each of ``runs``' predictions on the base profile with ``values`` set."""
    hw = with_values(problem.hw, values) if values else problem.hw
    return [predict_run(hw, problem.model, problem.runs[i], problem.limits[i]) for i in runs]


def measured_of(problem: CalibrationFit, runs: tuple[int, ...]) -> np.ndarray:
    return np.concatenate([[m.value for m in problem.runs[i].measured] for i in runs])


def residuals(problem: CalibrationFit, theta: np.ndarray, which: tuple[int, ...], runs: tuple[int, ...]) -> np.ndarray:
    """ln(predicted / measured) of every measurement of ``runs``."""
    predicted = np.concatenate(predictions(problem, problem.to_values(theta, which), runs))
    return np.log(predicted / measured_of(problem, runs))


def identification_jacobian(problem: CalibrationFit) -> np.ndarray:
    """d ln(prediction) / d parameter at the start, one row per measurement of every run, one
    column per field: one-sided differences of :data:`IDENTIFY_STEP` each way the range
    allows, the larger in magnitude (a kink of max() within the step still shows)."""
    everything = tuple(range(len(problem.fields)))
    all_runs = tuple(range(len(problem.runs)))
    x0 = problem.x0(everything)
    lo, hi = problem.bounds(everything)
    base = residuals(problem, x0, everything, all_runs)
    columns = []
    for j in everything:
        best = np.zeros_like(base)
        for step in (IDENTIFY_STEP, -IDENTIFY_STEP):
            theta = x0.copy()
            theta[j] = x0[j] + step
            if not lo[j] - 1e-12 <= theta[j] <= hi[j] + 1e-12:
                continue
            slope = (residuals(problem, theta, everything, all_runs) - base) / step
            best = np.where(np.abs(slope) > np.abs(best), slope, best)
        columns.append(best)
    return np.column_stack(columns)


def measurement_rows(problem: CalibrationFit, runs: tuple[int, ...]) -> np.ndarray:
    """Row indices (into the identification Jacobian) of the measurements of ``runs``."""
    starts = np.cumsum([0] + [len(r.measured) for r in problem.runs])
    return np.concatenate([np.arange(starts[i], starts[i + 1]) for i in runs]).astype(int)


#: why a field was left as the profile has it
NO_DEPENDENCE = "no run's prediction depends on it"
COLLINEAR = "collinear with other fields in these runs"


def dependent(jacobian: np.ndarray, candidates: tuple[int, ...]) -> tuple[tuple[int, ...], dict[int, str]]:
    """(columns some row depends on, {column: why not} for the others): a column ~0 in every
    row (:data:`IDENTIFY_TOL`) cannot be identified from these runs."""
    moving = tuple(j for j in candidates if np.max(np.abs(jacobian[:, j]), initial=0.0) >= IDENTIFY_TOL)
    return moving, {j: NO_DEPENDENCE for j in candidates if j not in moving}


def independent(jacobian: np.ndarray, columns: tuple[int, ...]) -> tuple[tuple[int, ...], dict[int, str]]:
    """(columns the rows tell apart, {column: why not} for the others): pivoted QR on unit
    columns keeps those at least :data:`COLLINEAR_TOL` away from the span of the stronger."""
    from scipy.linalg import qr

    if not columns:
        return (), {}
    unit = jacobian[:, columns] / np.linalg.norm(jacobian[:, columns], axis=0)
    _, r, order = qr(unit, mode="economic", pivoting=True)
    diagonal = np.abs(np.diag(r))
    kept = tuple(sorted(columns[k] for i, k in enumerate(order) if i < len(diagonal) and diagonal[i] >= COLLINEAR_TOL))
    return kept, {j: COLLINEAR for j in columns if j not in kept}


def identify(jacobian: np.ndarray, candidates: tuple[int, ...]) -> tuple[tuple[int, ...], dict[int, str]]:
    """(identifiable columns, {column: why not} for the others): :func:`dependent`, then
    :func:`independent`."""
    moving, why = dependent(jacobian, candidates)
    kept, collinear = independent(jacobian, moving)
    return kept, {**why, **collinear}


def solve(problem: CalibrationFit, which: tuple[int, ...], runs: tuple[int, ...]) -> tuple[np.ndarray, int]:
    """Bounded least squares (scipy trf) of the parameters ``which`` on ``runs``; returns the
    parameters and the evaluation count."""
    from scipy.optimize import least_squares

    lo, hi = problem.bounds(which)
    x0 = np.clip(problem.x0(which), lo, hi)
    result = least_squares(lambda theta: residuals(problem, theta, which, runs), x0, bounds=(lo, hi),
                           method="trf", max_nfev=MAX_EVALUATIONS)
    return result.x, int(result.nfev)


# --- the result -----------------------------------------------------------------------------------

class FieldFit(BaseModel):
    """One candidate field: its start (the base profile's effective value; ``defaulted``:
    the profile lacks it and a named default applied), range, fitted value (None: left as
    the profile has it, ``reason`` says why) and whether the fit ended on a bound."""

    model_config = _frozen()

    name: str
    unit: str
    start: float
    defaulted: bool
    lo: float
    hi: float
    why_range: str
    value: Optional[float] = None
    at_bound: bool = False
    reason: str = ""


class MeasurementFit(BaseModel):
    """One measurement: measured, predicted on the base profile, on the fitted one, and
    leave-one-out (the run left out of the fit; None where the other runs cannot fit)."""

    model_config = _frozen()

    run: str
    quantity: str
    measured: float
    before: float
    after: float
    loo: Optional[float] = None


class Calibration(BaseModel):
    """What :func:`fit` found: every candidate field, every measurement, and the fit's size."""

    model_config = _frozen()

    base: str
    base_sha256: str
    runs_path: str
    runs_sha256: str
    run_count: int
    fields: tuple[FieldFit, ...]
    measurements: tuple[MeasurementFit, ...]
    evaluations: int

    @property
    def fitted(self) -> dict[str, float]:
        return {f.name: f.value for f in self.fields if f.value is not None}

    @property
    def left(self) -> tuple[FieldFit, ...]:
        return tuple(f for f in self.fields if f.value is None)

    def rms_log_error(self, which: str) -> Optional[float]:
        """Root mean square of ln(predicted / measured) over the measurements (``before``,
        ``after`` or ``loo``; None if no measurement has that prediction)."""
        pairs = [(getattr(m, which), m.measured) for m in self.measurements if getattr(m, which) is not None]
        if not pairs:
            return None
        return float(np.sqrt(np.mean([math.log(p / m) ** 2 for p, m in pairs])))


def _refuse_size(source: str, run_count: int, names: list[str]) -> HRMError:
    return HRMError(f"{source}: {run_count} run(s) cannot determine {len(names)} fields the runs depend on "
                    f"({', '.join(names)}); add runs or choose fewer with --fields")


def leave_one_out(problem: CalibrationFit, jacobian: np.ndarray, fitted: tuple[int, ...], left_out: int) -> Optional[np.ndarray]:
    """Predictions of run ``left_out`` by a fit of the other runs (the same fields, less those
    the others cannot identify, from the same start); None where they cannot fit one."""
    others = tuple(i for i in range(len(problem.runs)) if i != left_out)
    if not others:
        return None
    rows = jacobian[measurement_rows(problem, others)]
    moving, _ = dependent(rows, fitted)
    if not moving or len(others) < len(moving):
        return None
    which, _ = independent(rows, moving)
    theta, _ = solve(problem, which, others)
    return predictions(problem, problem.to_values(theta, which), (left_out,))[0]


def base_predictions(problem: CalibrationFit, source: str, index: int) -> np.ndarray:
    """Run ``index``'s predictions on the base profile; HRMError naming the file and the run
    when the model cannot predict it (a policy outside the engine's space, a context beyond
    the model's window) or predicts no positive value (a decode throughput with gen_len 1)."""
    try:
        values = predictions(problem, {}, (index,))[0]
    except HRMError as exc:
        raise HRMError(f"{source}: runs[{index}]: {exc}") from None
    for measurement, value in zip(problem.runs[index].measured, values):
        if not (math.isfinite(value) and value > 0):
            raise HRMError(f"{source}: runs[{index}].measured.{measurement.quantity}: the model predicts {value:g} "
                           f"for this run, nothing a ratio can be fitted to")
    return values


def fit(hw: HardwareProfile, model: ModelSpec, runs: Runs, fields=None, with_loo: bool = True) -> Calibration:
    """Fit ``fields`` (default: every field of :data:`FIELDS` the profile has) of ``hw`` to
    ``runs``. Fields no run depends on, or collinear with stronger ones, stay as ``hw`` has
    them (:func:`identify`); HRMError (one line) when none is left or the runs are fewer than
    the fields left. ``with_loo``: also refit without each run in turn and predict it (one more
    fit per run)."""
    problem = make_fit(hw, model, runs, fields)
    all_runs = tuple(range(len(problem.runs)))
    before = [base_predictions(problem, runs.path, i) for i in all_runs]
    jacobian = identification_jacobian(problem)
    moving, why = dependent(jacobian, tuple(range(len(problem.fields))))
    if not moving:
        raise HRMError(f"{runs.path}: no field can be identified from these runs (no prediction depends on "
                       f"{', '.join(problem.fields)})")
    if len(all_runs) < len(moving):
        raise _refuse_size(runs.path, len(all_runs), [problem.fields[j] for j in moving])
    which, collinear = independent(jacobian, moving)
    why.update(collinear)
    theta, evaluations = solve(problem, which, all_runs)
    lo, hi = problem.bounds(which)
    bound = np.where(theta - lo < BOUND_TOL, -1, np.where(hi - theta < BOUND_TOL, 1, 0))
    theta = np.where(bound < 0, lo, np.where(bound > 0, hi, theta))
    values = {name: float(f"{value:.{SIGNIFICANT_DIGITS}g}") for name, value in problem.to_values(theta, which).items()}
    after = predictions(problem, values, all_runs)
    loo = [leave_one_out(problem, jacobian, which, i) if with_loo else None for i in all_runs]
    ended = {problem.fields[j]: int(b) for j, b in zip(which, bound)}
    return Calibration(base=hw.name, base_sha256=hw.sha256(), runs_path=runs.path, runs_sha256=runs.sha256,
                       run_count=len(all_runs), fields=field_fits(problem, values, ended, why),
                       measurements=measurement_fits(problem, before, after, loo), evaluations=evaluations)


def field_fits(problem: CalibrationFit, values: dict[str, float], ended: dict[str, int],
               why: dict[int, str]) -> tuple[FieldFit, ...]:
    """Every candidate field: start, range, fitted value (or why it was left), and whether it
    ended on a bound that is not a physical zero (a dispatch α of 0 is the plain roofline)."""
    out = []
    for j, name in enumerate(problem.fields):
        spec = FIELDS[name]
        ending = ended.get(name, 0)
        physical_zero = spec.scale == "linear" and problem.lo[j] == 0
        at_bound = ending > 0 or (ending < 0 and not physical_zero)
        out.append(FieldFit(name=name, unit=spec.unit, start=float(problem.start[j]),
                            defaulted=profile_value(problem.hw, name) is None, lo=float(problem.lo[j]),
                            hi=float(problem.hi[j]), why_range=spec.why, value=values.get(name), at_bound=at_bound,
                            reason=why.get(j, "")))
    return tuple(out)


def measurement_fits(problem: CalibrationFit, before, after, loo) -> tuple[MeasurementFit, ...]:
    return tuple(MeasurementFit(run=run.label, quantity=m.quantity, measured=m.value, before=float(before[i][q]),
                                after=float(after[i][q]), loo=None if loo[i] is None else float(loo[i][q]))
                 for i, run in enumerate(problem.runs) for q, m in enumerate(run.measured))


# --- the calibrated profile ------------------------------------------------------------------------

#: the GPU efficiencies a measured profile runs at 1 when unset (its peaks are achieved
#: rates, hrm.machine.achieved); a calibrated profile states them, so that it runs as its base did
MEASURED_IMPLICIT_FIELDS = ("gpu.memory_stream_efficiency", "gpu.gemm_efficiency")


def tool_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return f"hrm-calibrate {version('hrm-moe')}"
    except (ImportError, PackageNotFoundError):
        return "hrm-calibrate (unknown version)"


def calibrated_profile(hw: HardwareProfile, calibration: Calibration, name: str | None = None) -> HardwareProfile:
    """``hw`` with the fitted fields set, named ``<base>@calibrated`` (or ``name``), and a
    ``source`` of kind ``calibrated``: the runs file's sha256, a ``methods`` line per fitted
    field. Fields left at their defaults stay as ``hw`` has them."""
    if calibration.base_sha256 != hw.sha256():
        raise HRMError(f"calibration of profile '{calibration.base}' applied to another profile ('{hw.name}')")
    values = dict(calibration.fitted)
    for field in DISPATCH_FIELDS:
        tier = getattr(hw, FIELDS[field].section)
        if tier is not None and tier.dispatch is None and values.get(field) == 0.0:
            del values[field]  # no dispatch section: the α is 0 already
    if hw.source.kind == "measured" and hw.gpu is not None:
        for field in MEASURED_IMPLICIT_FIELDS:
            values.setdefault(field, effective_value(hw, field))
    data = with_values(hw, values).model_dump(exclude_none=True)
    data["name"] = name or f"{hw.name}@calibrated"
    methods = dict(hw.source.methods)
    for f in calibration.fields:
        if f.value is not None:
            methods[f.name] = (f"calibrated: bounded least squares on ln(predicted/measured) over "
                               f"{calibration.run_count} runs of {Path(calibration.runs_path).name}; was {f.start:.4g}"
                               f"{' (default)' if f.defaulted else ''}, range [{f.lo:.4g}, {f.hi:.4g}]"
                               f"{', ended on a bound' if f.at_bound else ''}")
    left = ", ".join(f.name for f in calibration.left) or "none"
    data["source"] = {**hw.source.model_dump(exclude_none=True), "kind": "calibrated", "methods": methods,
                      "runs_sha256": calibration.runs_sha256, "tool_version": tool_version(),
                      "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      "notes": (f"profile {hw.name} (sha256 {calibration.base_sha256[:12]}, source {hw.source.kind}) "
                                f"calibrated to the user's runs {Path(calibration.runs_path).name}; fitted: "
                                f"{', '.join(calibration.fitted)}; left as the base has them: {left}")}
    return HardwareProfile.model_validate(data)


def is_shipped_profile(path: str | Path) -> bool:
    """Whether ``path`` is one of the shipped profiles (which never change)."""
    target = Path(path).resolve()
    return any(target.parent == folder.resolve() for folder in profile_dirs()) and target.suffix in (".yaml", ".yml")
