"""Achieved rates of a machine (SI), with a named default for every value a profile lacks.

A datasheet peak is an upper bound; engines run at what the hardware *achieves*: a host
memcpy on one thread or on a team of threads, a pageable (driver-staged) copy over PCIe,
a streaming kernel's share of GPU memory bandwidth, a large GEMM's share of tensor peak.
A profile may carry each of them (``hrm profile`` measures what it can on its host); a
value nobody measured falls back to the default below, each with its source, and
:attr:`Achieved.defaulted` lists which ones were used (``hrm estimate`` prints them).
To override a default, set the field in the hardware profile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from .hardware import HardwareProfile
from ..units import GB


@dataclass(frozen=True)
class Default:
    """A named default: the value used where a profile lacks the field (a function of the
    profile), and why."""

    field: str
    source: str
    value: Callable[[HardwareProfile], object]


#: single-thread host memcpy rate when a profile has none (GB/s)
MEMCPY_ONE_THREAD_GBPS = 10.0
#: share of datasheet GPU memory bandwidth (streaming kernel) and tensor peak (large GEMM)
#: when a datasheet profile has none
GPU_STREAM_EFFICIENCY = GPU_GEMM_EFFICIENCY = 0.8
#: bytes of DRAM traffic per byte copied by a CPU memcpy: read + write + write-allocate read
COPY_DRAM_BYTES_PER_BYTE = 3.0


def in_turn_rate(*rates: float) -> float:
    """The rate of stages that move every byte one after the other (a copy, then a DMA):
    1 / Σ 1/rate, in the rates' own unit."""
    return 1.0 / sum(1.0 / r for r in rates)


def pageable_copy_gbps(pinned_gbps: float, memcpy_one_thread_gbps: float) -> float:
    """A pageable host<->device copy where the profile measured none: CUDA stages it through a
    pinned buffer of the driver ("the CUDA driver must first allocate a temporary page-locked,
    or pinned, host array, copy the host data to the pinned array, and then transfer the data
    from the pinned array to device memory": NVIDIA Technical Blog, M. Harris, "How to Optimize
    Data Transfers in CUDA C/C++", 2012), one CPU thread copying and the DMA reading it in
    turn, so each byte costs one single-thread memcpy and one pinned transfer:
    1 / (1/pinned + 1/memcpy_one_thread). Check against the project's own measured boxes
    (pinned, memcpy on one thread -> this rule; measured pageable from the best size to 1 GiB):
    H100 VM 55.17, 12.35 -> 10.09 GB/s vs 14.13 to 8.24 (docs/validation/h100-measured.yaml:
    143-146, 241-248); H200 VM 55.19, 10.75 -> 9.00 GB/s vs 12.76 to 7.24
    (docs/validation/h200-measured.yaml:143-146, 241-248): inside both measured spans, where a
    fixed pinned/pageable ratio (3.9x, 4.3x at their best sizes, 6.7x, 7.6x at 1 GiB) would not
    carry to another link (FlexGen's own fit of unpinned CPU->GPU copies on T4 and L4, ~5.4 GB/s
    on PCIe 3 and 4 alike, experimental/cost_model.py: the rule gives 4.9 and 6.3)."""
    return in_turn_rate(pinned_gbps, memcpy_one_thread_gbps)


def _memcpy_one_thread_gbps(hw: HardwareProfile) -> float:
    value = hw.cpu.memcpy_one_thread_gbps
    return MEMCPY_ONE_THREAD_GBPS if value is None else value


#: Every default of this module, by profile field (value rules in :func:`achieved_rates`).
DEFAULTS: dict[str, Default] = {d.field: d for d in (
    Default("cpu.memcpy_one_thread_gbps",
            f"{MEMCPY_ONE_THREAD_GBPS:g} GB/s: single-thread memcpy on server CPUs (docs/mechanisms.md §1)",
            lambda hw: MEMCPY_ONE_THREAD_GBPS),
    Default("cpu.memcpy_all_threads_gbps",
            f"cpu.memory_bandwidth_gbps / {COPY_DRAM_BYTES_PER_BYTE:g}: a copy with ordinary stores reads, writes and "
            f"write-allocates each byte (docs/mechanisms.md §1), so DRAM moves {COPY_DRAM_BYTES_PER_BYTE:g} bytes per "
            f"byte copied",
            lambda hw: hw.cpu.memory_bandwidth_gbps / COPY_DRAM_BYTES_PER_BYTE),
    Default("cpu.numa_nodes", "1: one socket (no NUMA penalty)", lambda hw: 1),
    Default("cpu.dram_gbps",
            "cpu.memory_bandwidth_gbps: the profile's own DRAM rate (a datasheet peak, or a measured STREAM triad, "
            "which understates what the DMA and every core's reads sustain: docs/mechanisms.md §1)",
            lambda hw: hw.cpu.memory_bandwidth_gbps),
    Default("link.h2d_pageable_gbps",
            "1 / (1/h2d_gbps + 1/cpu.memcpy_one_thread_gbps): the driver stages a pageable copy through its own "
            "pinned buffer with one CPU thread, then DMAs it (docs/mechanisms.md §1; pageable_copy_gbps)",
            lambda hw: pageable_copy_gbps(hw.link.h2d_gbps, _memcpy_one_thread_gbps(hw))),
    Default("link.d2h_pageable_gbps",
            "1 / (1/d2h_gbps + 1/cpu.memcpy_one_thread_gbps): as h2d_pageable_gbps (docs/mechanisms.md §1)",
            lambda hw: pageable_copy_gbps(hw.link.d2h_gbps, _memcpy_one_thread_gbps(hw))),
    Default("link.gpus_per_pcie_switch", "1: each GPU on its own x16 root port", lambda hw: 1),
    Default("link.p2p", "true: peer-to-peer copies between GPUs work (gpu_to_gpu_gbps applies)", lambda hw: True),
    Default("gpu.memory_stream_efficiency",
            f"{GPU_STREAM_EFFICIENCY:g}: a streaming kernel reaches 70-90% of datasheet HBM/GDDR bandwidth "
            f"(docs/mechanisms.md §2)",
            lambda hw: GPU_STREAM_EFFICIENCY),
    Default("gpu.gemm_efficiency",
            f"{GPU_GEMM_EFFICIENCY:g}: a large bf16 GEMM reaches ~790 of 989 TFLOP/s on H100 (docs/facts.md)",
            lambda hw: GPU_GEMM_EFFICIENCY),
)}

#: a pinned copy whose buffer sits on the far socket runs at this fraction of a local one
#: (gearshifft PR #82: 12.15 → 3.78 GB/s H2D across a NUMA socket)
NUMA_REMOTE_FRACTION = 3.78 / 12.15


@dataclass(frozen=True)
class Achieved:
    """Achieved rates in SI units. Link rates are per GPU."""

    memcpy_one_thread_bytes_s: float
    memcpy_all_threads_bytes_s: float
    cores: int
    numa_nodes: int
    h2d_pageable_bytes_s: float
    d2h_pageable_bytes_s: float
    gpus_per_pcie_switch: int
    p2p: bool
    gpu_memory_stream_efficiency: float
    gpu_gemm_efficiency: float
    architecture: str | None
    defaulted: tuple[str, ...]
    #: host DRAM traffic the host-DRAM lane is charged against (reads + writes per second)
    dram_bytes_s: float = 0.0

    def memcpy_bytes_s(self, threads: int) -> float:
        """A host copy on ``threads`` threads: one thread's rate per thread, capped by the
        all-threads rate (the DRAM roof)."""
        threads = max(1, min(int(threads), self.cores))
        return min(threads * self.memcpy_one_thread_bytes_s, self.memcpy_all_threads_bytes_s)

    def host_uplinks(self, gpu_count: int) -> int:
        """Independent host links of ``gpu_count`` GPUs: GPUs behind one PCIe switch share one."""
        return max(1, math.ceil(gpu_count / self.gpus_per_pcie_switch))


def achieved_rates(hw: HardwareProfile) -> Achieved:
    """The achieved rates of ``hw``; :attr:`Achieved.defaulted` names the defaults used."""
    used: list[str] = []

    def pick(section: str, key: str):
        value = getattr(getattr(hw, section), key)
        if value is None:
            used.append(f"{section}.{key}")
            return DEFAULTS[f"{section}.{key}"].value(hw)
        return value

    cpu, gpu, link = hw.cpu, hw.gpu, hw.link
    one = pick("cpu", "memcpy_one_thread_gbps") * GB
    all_threads = pick("cpu", "memcpy_all_threads_gbps") * GB
    numa = pick("cpu", "numa_nodes")
    dram = pick("cpu", "dram_gbps") * GB
    # no link (CPU-only host): the emulated tier copies within host memory
    h2d_pageable = d2h_pageable = all_threads
    per_switch, p2p = 1, True
    if link is not None:
        h2d_pageable = pick("link", "h2d_pageable_gbps") * GB
        d2h_pageable = pick("link", "d2h_pageable_gbps") * GB
        per_switch = pick("link", "gpus_per_pcie_switch")
        p2p = pick("link", "p2p")
    stream = gemm = 1.0
    if gpu is not None and hw.source.kind == "measured":
        # a measured profile's peaks are already achieved rates (device copy, best matmul)
        stream, gemm = gpu.memory_stream_efficiency or 1.0, gpu.gemm_efficiency or 1.0
    elif gpu is not None:
        stream = pick("gpu", "memory_stream_efficiency")
        gemm = pick("gpu", "gemm_efficiency")
    return Achieved(one, all_threads, cpu.cores, int(numa), h2d_pageable, d2h_pageable, int(per_switch), bool(p2p),
                    float(stream), float(gemm), gpu.architecture if gpu is not None else None, tuple(used), dram)
