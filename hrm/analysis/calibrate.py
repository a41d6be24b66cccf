"""Calibrate a hardware profile's achieved rates to the user's own runs (``hrm calibrate``;
docs/calibrate.md).

A runs file (:mod:`hrm.analysis.calibration_runs`) names a profile, a model and runs, each
an engine, a workload, a policy and what the user measured (throughput, TPOT, TTFT). Only
achieved-rate fields of the profile move — link rates, host copy and DRAM rates, the GPU's
streaming and GEMM efficiencies, the GPU task dispatch α — each within a stated physical
range (:data:`hrm.analysis.calibration_fields.FIELDS`), by bounded least squares on
``ln(predicted / measured)`` (:func:`fit`). A field no run depends on cannot be identified
and stays as the profile has it. Never fit to published end-to-end results: only to runs
of the user's own machine. This module holds the fit, its result and the calibrated profile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import numpy as np
from pydantic import BaseModel, ConfigDict

from ..cost.memory import MemoryLimits, memory_limits
from ..errors import HRMError
from ..estimate import estimate
from ..machine.hardware import HardwareProfile, profile_dirs
from ..model.options import DEFAULT_OPTIONS, options_in_dtype, spec_in_dtype
from ..model.spec import ModelSpec
from .calibration_fields import (DISPATCH_FIELDS, FIELDS, check_fields, effective_value, from_parameter,
                                 profile_value, to_parameter, with_values)
from .calibration_runs import QUANTITIES, Run, Runs, run_as_commanded

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


# --- the runs' predictions on a modified profile -----------------------------------------------------

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
    commanded = []
    for i, run in enumerate(runs.runs):
        try:
            commanded.append(run_as_commanded(run, hw, model))
        except HRMError as exc:
            raise HRMError(f"{runs.path}: runs[{i}].command: {exc}") from None
    return CalibrationFit(hw=hw, model=model, runs=tuple(commanded), limits=runs_limits(hw, runs), fields=names,
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

    model_config = ConfigDict(extra="forbid", frozen=True)

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

    model_config = ConfigDict(extra="forbid", frozen=True)

    run: str
    quantity: str
    measured: float
    before: float
    after: float
    loo: Optional[float] = None


class Calibration(BaseModel):
    """What :func:`fit` found: every candidate field, every measurement, and the fit's size."""

    model_config = ConfigDict(extra="forbid", frozen=True)

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
