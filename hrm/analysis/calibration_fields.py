"""The profile fields ``hrm calibrate`` fits (docs/calibrate.md): each one's physical range,
its value on a profile, and the parameter it is fitted as.

Only achieved-rate fields move — link rates, host copy and DRAM rates, the GPU's streaming
and GEMM efficiencies, the task dispatch α, the emulated tiers' copy rate — each within a
stated range (:data:`FIELDS`), a function of the base profile where the range is relative.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal, Optional

from ..errors import HRMError
from ..machine.achieved import achieved_rates
from ..machine.hardware import HardwareProfile
from ..units import GB

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


def _host_dram_relative(factors: tuple[float, float]) -> Callable[[HardwareProfile], tuple[float, float]]:
    """A range of ``factors`` times the most host DRAM traffic the profile knows: its measured
    ``cpu.dram_gbps`` (every core and the DMA), else its DRAM rate (a STREAM triad understates
    what a team's copy moves: 45.3 GB/s of memcpy against a 30.8 GB/s triad on the lent H100
    box, docs/validation/runs/h100-flexgen-box.yaml)."""
    def bounds(hw: HardwareProfile) -> tuple[float, float]:
        roof = max(float(achieved_rates(hw).dram_bytes_s) / GB, effective_value(hw, "cpu.memory_bandwidth_gbps"))
        return factors[0] * roof, factors[1] * roof
    return bounds


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
              _host_dram_relative(MEMCPY_ALL_OF_DRAM_RANGE),
              "1/10 to 1/2 of the host's DRAM traffic (cpu.dram_gbps where measured): a copy moves 2-3 DRAM "
              "bytes per byte"),
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

# --- a field's value on a profile ---------------------------------------------------------------

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


# --- the fitted parameters and the fields a fit may move ------------------------------------------

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
