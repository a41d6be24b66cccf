"""Roofline and the Hierarchical Roofline Model (paper §3, eqs. 1–11), returned as data.

Levels are memory levels each coupled with a processor (here ``gpu`` = level i and
``cpu`` = level j); ``cross_bandwidth[(j, i)]`` is B_peak^{j,i}, the bandwidth moving data
from level j to level i (CPU→GPU = the host link's H2D bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..machine.hardware import HardwareProfile
from ..model.options import DEFAULT_OPTIONS, ModelOptions


@dataclass(frozen=True)
class Level:
    """One memory level with its processor: P_peak^i (FLOP/s) and B_peak^i (bytes/s)."""

    name: str
    peak_flops: float
    bandwidth_bytes_s: float

    @property
    def ridge_intensity(self) -> float:
        """Eq. 3: Ī = P_peak / B_peak (FLOP/byte) where the two roofs of a level meet."""
        return self.peak_flops / self.bandwidth_bytes_s


@dataclass(frozen=True)
class HRM:
    levels: dict[str, Level]
    cross_bandwidth: dict[tuple[str, str], float] = field(default_factory=dict)

    def level(self, name: str) -> Level:
        return self.levels[name]


def roofline(level: Level, intensity):
    """Eq. 8 (and eqs. 1–2): attainable FLOP/s = min(P_peak^i, B_peak^i · I^i)."""
    return np.minimum(level.peak_flops, level.bandwidth_bytes_s * np.asarray(intensity, dtype=float))


def attainable(hrm: HRM, i: str, intensity_i, j: str | None = None, intensity_j=None):
    """Eq. 7: P_x^i = min(P_peak^i, B_peak^i · I_x^i, B_peak^{j,i} · I_x^j) when x runs on
    level i and fetches data from level j; eq. 8 when ``j`` is None."""
    perf = roofline(hrm.level(i), intensity_i)
    if j is not None:
        perf = np.minimum(perf, hrm.cross_bandwidth[(j, i)] * np.asarray(intensity_j, dtype=float))
    return perf


def turning_point_p1(hrm: HRM, i: str, j: str, intensity_j) -> np.ndarray:
    """Eq. 9: Ī_x^j = min(P_peak^j, B_peak^j · I_x^j) / B_peak^{j,i}. Below this intensity
    (w.r.t. level j) moving the data from j to i does not beat computing on j."""
    return roofline(hrm.level(j), intensity_j) / hrm.cross_bandwidth[(j, i)]


def turning_point_p2(hrm: HRM, i: str, j: str, intensity_i) -> np.ndarray:
    """Eq. 10: Ī_x^j = min(P_peak^i, B_peak^i · I_x^i) / B_peak^{j,i}. Below this intensity
    (w.r.t. level j) computation x on level i is bound by the j→i link."""
    return roofline(hrm.level(i), intensity_i) / hrm.cross_bandwidth[(j, i)]


def balance_point(hrm: HRM, i: str, j: str, intensity_i) -> np.ndarray:
    """Eq. 11: the I_x^j at which B_peak^i · I_x^i = B_peak^{j,i} · I_x^j (level i's memory
    roof meets the cross-level roof); returns that I_x^j."""
    return hrm.level(i).bandwidth_bytes_s * np.asarray(intensity_i, dtype=float) / hrm.cross_bandwidth[(j, i)]


def hrm_from_profile(hw: HardwareProfile, options: ModelOptions = DEFAULT_OPTIONS) -> HRM:
    """The two-level HRM of a profile, from the same peaks the latency model uses
    (:func:`hrm.machine.rates.rates_from_profile`): ``gpu`` (all GPUs together under tensor
    parallelism) and ``cpu``; cross roof CPU→GPU = h2d bandwidth × GPU count (one link per
    GPU). A CPU-only host maps the device tier onto the CPU (its measured emulated tier when
    the profile has one; its 'link' is a DRAM copy)."""
    from ..machine.rates import rates_from_profile

    rates = rates_from_profile(hw, options)
    gpu = Level("gpu", rates.gpu_peak_flops, rates.gpu_bandwidth_bytes_s)
    cpu = Level("cpu", rates.cpu_peak_flops, rates.cpu_bandwidth_bytes_s)
    return HRM({"gpu": gpu, "cpu": cpu}, {("cpu", "gpu"): rates.h2d_bytes_s, ("gpu", "cpu"): rates.d2h_bytes_s})


@dataclass(frozen=True)
class TurningPoints:
    """Turning points of one operator (intensities w.r.t. level j, performance in FLOP/s)."""

    p1_intensity: float
    p1_flops: float
    p2_intensity: float
    p2_flops: float
    balance_intensity: float
    balance_flops: float


def turning_points(hrm: HRM, intensity_i: float, intensity_j: float, i: str = "gpu", j: str = "cpu") -> TurningPoints:
    """P1 (eq. 9), P2 (eq. 10) and the balance point (eq. 11) for an operator with
    intensity ``intensity_i`` on level i and ``intensity_j`` w.r.t. data on level j.
    Each point lies on the cross-level roof: P = B^{j,i} · Ī."""
    cross = hrm.cross_bandwidth[(j, i)]
    p1 = float(turning_point_p1(hrm, i, j, intensity_j))
    p2 = float(turning_point_p2(hrm, i, j, intensity_i))
    bal = float(balance_point(hrm, i, j, intensity_i))
    return TurningPoints(p1, p1 * cross, p2, p2 * cross, bal, bal * cross)
