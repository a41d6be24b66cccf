"""Turn measurements into a :class:`hrm.machine.hardware.HardwareProfile` (source: measured).

Peaks are the best point of each curve; every number gets a ``source.methods`` note that
says how it was measured, with repeats, median and spread.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hrm.machine.hardware import (CPU, GPU, CurvePoint, Disk, Dispatch, Efficiency, Emulation, Flops, HardwareProfile, Link,
                          Source)
from hrm.machine.rates import RUNTIME_ENGINE
from hrm.units import GIB, MIB

from .cpu import NUMA_NODE_DIR, HostInfo, Measured, MemcpyResult, StreamResult, best_of
from .dispatch import DispatchResult
from .emulation import EmulationResult
from .gpu import GpuResults, architecture_of

SIG_DIGITS = 4


@dataclass
class CpuResults:
    """Everything measured on the CPU side (filled step by step)."""

    stream: StreamResult | None = None
    matmul: dict[str, dict[int, Measured]] = field(default_factory=dict)
    attention: dict[int, Measured] = field(default_factory=dict)
    disk: Measured | None = None
    dispatch: DispatchResult | None = None  # measured on the emulated tier or, with a GPU, on CUDA
    memcpy: MemcpyResult | None = None  # host copy, one thread vs all threads
    emulation: EmulationResult | None = None  # the emulated device tier (CPU-only host)
    dram_read: Measured | None = None  # host DRAM read with every core (GB/s)
    cpu_op: Measured | None = None  # seconds per eager torch op on a CPU tensor


@dataclass(frozen=True)
class RunFacts:
    """Who/when/how of a run, for the ``source`` section."""

    name: str
    date: str
    tool_version: str
    mode: str
    elapsed_s: float
    budget_s: float
    notes: tuple[str, ...] = ()


def sig(value: float, digits: int = SIG_DIGITS) -> float:
    """Round to ``digits`` significant digits (readable YAML; still > 0 for positive input)."""
    return float(f"{value:.{digits}g}")


def profile_name(hostname: str) -> str:
    """``measured-<host>`` with anything unusual replaced by '-'."""
    return "measured-" + (re.sub(r"[^A-Za-z0-9._-]+", "-", hostname).strip("-") or "host")


def curve_points(curve: dict[int, Measured]) -> list[CurvePoint]:
    """Sorted CurvePoints (x = size/M/context, y = measured value)."""
    return [CurvePoint(x=float(x), y=sig(m.value)) for x, m in sorted(curve.items()) if m.value > 0]


def x_label(x_name: str, x: float) -> str:
    """``M=64``, ``context=2048``, ``bytes=16MiB``."""
    return f"{x_name}={x / MIB:g}MiB" if x_name == "bytes" else f"{x_name}={x:g}"


def curve_method(curve: dict[int, Measured], x_name: str) -> str:
    """One note for a curve: how (first point) + per-point repeats and spread."""
    first = next(iter(sorted(curve.items())))[1]
    spreads = ", ".join(f"{x_label(x_name, x)}: {m.stats.spread_pct():.1f}%" for x, m in sorted(curve.items()))
    repeats = sorted({m.stats.repeats for m in curve.values()})
    return (f"{first.how.split(',')[0]}; per point median of {'/'.join(map(str, repeats))} repeats after "
            f"{first.stats.warmup} warm-up; spread (max-min)/median per point: {spreads}")


def curve_values_method(curve: dict[int, Measured], x_name: str) -> str:
    """Note for a curve the schema has no field for: every point's median and spread."""
    first = next(iter(sorted(curve.items())))[1]
    points = ", ".join(f"{x_label(x_name, x)}: {m.value:.4g} {m.unit} (spread {m.stats.spread_pct():.1f}%)"
                       for x, m in sorted(curve.items()))
    return f"{first.how.split(' of ')[0]} vs size, median of {first.stats.repeats} repeats: {points}"


def peak_method(curve: dict[int, Measured], x_name: str) -> str:
    """Note for a peak taken as the best point of a curve."""
    x, best = best_of(curve)
    return f"best point of the curve ({x_label(x_name, x)}): {best.method()}"


def dram_traffic(cpu: CpuResults, gpu: GpuResults | None, methods: dict[str, str]) -> dict:
    """``cpu.dram_gbps``: the most host DRAM traffic any measurement sustained (bytes read +
    written per second): STREAM copy, every core reading, and — on a GPU host — every core
    reading while the DMA copies, whichever is highest (the host-DRAM lane charges reads,
    writes and DMA traffic against one capacity)."""
    found = [(cpu.stream.copy, "STREAM copy (read + write counted)")] if cpu.stream is not None else []
    if cpu.dram_read is not None:
        found.append((cpu.dram_read, "every core reading"))
    if gpu is not None and gpu.read_during_dma is not None:
        found.append((gpu.read_during_dma, "every core reading while the DMA copies"))
    found = [(m, what) for m, what in found if m.value > 0]
    if not found:
        return {}
    best, what = max(found, key=lambda pair: pair[0].value)
    others = "; ".join(f"{w} {m.value:.4g} GB/s" for m, w in found if m is not best)
    methods["cpu.dram_gbps"] = (f"the most host DRAM traffic measured: {what}, {best.method()}"
                                + (f" (also: {others})" if others else ""))
    return {"dram_gbps": sig(best.value)}


def build_cpu(host: HostInfo, cpu: CpuResults, methods: dict[str, str], gpu: GpuResults | None = None) -> CPU:
    """The ``cpu`` section; memory bandwidth = STREAM triad (copy recorded alongside)."""
    if cpu.stream is None or "fp32" not in cpu.matmul or not cpu.matmul["fp32"]:
        raise ValueError("CPU bandwidth and fp32 matmul are required for a profile")
    tflops = {dtype: sig(best_of(curve)[1].value) for dtype, curve in cpu.matmul.items() if curve}
    for dtype, curve in cpu.matmul.items():
        if curve:
            methods[f"cpu.tflops.{dtype}"] = peak_method(curve, "M")
    stream = cpu.stream
    methods["cpu.memory_bandwidth_gbps"] = (
        f"{stream.triad.method()}; triad is used (2 reads : 1 write, closer to the read-heavy "
        f"CPU attention/FFN than copy); copy measured {stream.copy.value:.3g} GB/s")
    methods["cpu.stream_copy_gbps"] = stream.copy.method()
    methods["cpu.cores"] = "usable CPUs (sched_getaffinity)"
    methods["cpu.memory_gib"] = "MemTotal of /proc/meminfo"
    memcpy = {}
    if cpu.memcpy is not None and cpu.memcpy.one_thread.value > 0 and cpu.memcpy.all_threads.value > 0:
        memcpy = {"memcpy_one_thread_gbps": sig(cpu.memcpy.one_thread.value),
                  "memcpy_all_threads_gbps": sig(cpu.memcpy.all_threads.value)}
        methods["cpu.memcpy_one_thread_gbps"] = cpu.memcpy.one_thread.method()
        methods["cpu.memcpy_all_threads_gbps"] = cpu.memcpy.all_threads.method()
        if host.numa_nodes > 1:
            methods["cpu.memcpy_all_threads_gbps"] += (f"; arrays first-touched by one thread, so on this "
                                                       f"{host.numa_nodes}-node host they sit on one NUMA node")
    methods["cpu.numa_nodes"] = f"node<N> directories of {NUMA_NODE_DIR} (1 where absent)"
    extra = dram_traffic(cpu, gpu, methods)
    if cpu.cpu_op is not None and cpu.cpu_op.value > 0:
        extra["eager_op_s"] = float(f"{cpu.cpu_op.value:.3g}")
        methods["cpu.eager_op_s"] = cpu.cpu_op.method()
    return CPU(name=host.cpu_name, cores=host.cores, memory_gib=sig(host.memory_gib),
               memory_bandwidth_gbps=sig(stream.triad.value), tflops=Flops(**tflops),
               dispatch=build_dispatch(cpu.dispatch, "cpu", methods), numa_nodes=host.numa_nodes, **memcpy, **extra)


def build_dispatch(result: DispatchResult | None, section: str, methods: dict[str, str]) -> Dispatch | None:
    """A ``dispatch`` block (α per task / operator call, seconds) with a note per value."""
    if result is None:
        return None
    for key, note in result.notes.items():
        methods[f"{section}.dispatch.{key}"] = note
    # the probe runs the reference runtime's operators: its costs are that engine's alone
    methods[f"{section}.dispatch.owner"] = (f"{RUNTIME_ENGINE}: the probe runs the reference runtime's own operators "
                                            f"(profiler/dispatch.py); no other engine is charged them")
    return Dispatch(**{k: float(f"{v:.3g}") for k, v in result.values.items()}, owner=RUNTIME_ENGINE)


def build_gpu(gpu: GpuResults, methods: dict[str, str]) -> tuple[GPU, Link]:
    """The ``gpu`` and ``link`` sections from GPU results (fp32 matmul, copy, h2d/d2h needed)."""
    if not gpu.matmul.get("fp32") or gpu.copy is None or not gpu.h2d_pinned or not gpu.d2h_pinned:
        raise ValueError("GPU results lack fp32 matmul, device copy or pinned transfers")
    tflops = {dtype: sig(best_of(curve)[1].value) for dtype, curve in gpu.matmul.items() if curve}
    for dtype, curve in gpu.matmul.items():
        if curve:
            methods[f"gpu.tflops.{dtype}"] = peak_method(curve, "M")
    methods["gpu.memory_bandwidth_gbps"] = gpu.copy.method()
    methods["gpu.memory_gib"] = "total_memory of the device properties"
    peer_gbps = None
    if gpu.info.count > 1:
        if gpu.peer is not None:
            peer_gbps = sig(gpu.peer.value)
            methods["gpu.gpu_to_gpu_gbps"] = gpu.peer.method()
        else:
            peer_gbps = sig(best_of(gpu.h2d_pinned)[1].value)
            methods["gpu.gpu_to_gpu_gbps"] = "NOT measured (peer copy failed); set to the pinned h2d rate"
    architecture = architecture_of(gpu.info.capability)
    if architecture is not None:
        major, minor = gpu.info.capability
        methods["gpu.architecture"] = f"compute capability {major}.{minor} of the device properties"
    for key, peak in (("memory_stream_efficiency", "gpu.memory_bandwidth_gbps (a device copy)"),
                      ("gemm_efficiency", "gpu.tflops (best matmul of each curve)")):
        methods[f"gpu.{key}"] = (f"not set: {peak} is already an achieved rate of this GPU "
                                 f"(hrm.machine.achieved applies no efficiency to a measured profile)")
    launch = {}
    if gpu.launch is not None:
        launch = {"eager_op_s": float(f"{gpu.launch.eager_op.value:.3g}"),
                  "sync_bubble_s": float(f"{gpu.launch.sync_bubble.value:.3g}")}
        methods["gpu.eager_op_s"] = gpu.launch.eager_op.method()
        methods["gpu.sync_bubble_s"] = gpu.launch.sync_bubble.method()
    gpu_section = GPU(name=gpu.info.name, count=gpu.info.count, memory_gib=sig(gpu.info.memory_bytes / GIB),
                      memory_bandwidth_gbps=sig(gpu.copy.value), tflops=Flops(**tflops),
                      gpu_to_gpu_gbps=peer_gbps, dispatch=build_dispatch(gpu.dispatch, "gpu", methods),
                      architecture=architecture, **launch)
    methods["link.h2d_gbps"] = peak_method(gpu.h2d_pinned, "bytes")
    methods["link.d2h_gbps"] = peak_method(gpu.d2h_pinned, "bytes")
    pageable = None
    if gpu.h2d_pageable:
        pageable = sig(best_of(gpu.h2d_pageable)[1].value)
        methods["link.h2d_pageable_gbps"] = peak_method(gpu.h2d_pageable, "bytes")
    d2h_pageable = None
    if gpu.d2h_pageable:
        d2h_pageable = sig(best_of(gpu.d2h_pageable)[1].value)
        methods["link.d2h_pageable_gbps"] = peak_method(gpu.d2h_pageable, "bytes")
    if gpu.p2p is not None:
        methods["link.p2p"] = (f"torch.cuda.can_device_access_peer over every ordered pair of the "
                               f"{gpu.info.count} GPUs: {'all' if gpu.p2p else 'not all'} True")
    curves = {"link.h2d_gbps_vs_bytes": gpu.h2d_pinned, "link.d2h_gbps_vs_bytes": gpu.d2h_pinned,
              "link.h2d_pageable_gbps_vs_bytes": gpu.h2d_pageable, "link.d2h_pageable_gbps_vs_bytes": gpu.d2h_pageable}
    for key, curve in curves.items():
        if curve:
            methods[key] = curve_values_method(curve, "bytes")
    link = Link(h2d_gbps=sig(best_of(gpu.h2d_pinned)[1].value), d2h_gbps=sig(best_of(gpu.d2h_pinned)[1].value),
                h2d_pageable_gbps=pageable, d2h_pageable_gbps=d2h_pageable, p2p=gpu.p2p)
    return gpu_section, link


def build_efficiency(cpu: CpuResults, gpu: GpuResults | None, methods: dict[str, str]) -> Efficiency:
    """Measured curves: CPU/GPU matmul vs M. The CPU copy-vs-bytes and decode-attention
    points, which the model does not read, are recorded as notes only."""
    cpu_mm = {dtype: curve_points(c) for dtype, c in cpu.matmul.items() if c}
    for dtype, c in cpu.matmul.items():
        if c:
            methods[f"efficiency.cpu_matmul_tflops_vs_m.{dtype}"] = curve_method(c, "M")
    if cpu.stream and cpu.stream.copy_curve:
        methods["cpu.stream_copy_gbps_vs_bytes"] = curve_values_method(cpu.stream.copy_curve, "bytes")
    for context, m in sorted(cpu.attention.items()):
        methods[f"cpu.decode_attention.context_{context}"] = m.method()
    gpu_mm = {}
    if gpu is not None:
        gpu_mm = {dtype: curve_points(c) for dtype, c in gpu.matmul.items() if c}
        for dtype, c in gpu.matmul.items():
            if c:
                methods[f"efficiency.gpu_matmul_tflops_vs_m.{dtype}"] = curve_method(c, "M")
    return Efficiency(gpu_matmul_tflops_vs_m=gpu_mm, cpu_matmul_tflops_vs_m=cpu_mm)


def build_profile(facts: RunFacts, host: HostInfo, cpu: CpuResults, gpu: GpuResults | None) -> HardwareProfile:
    """Assemble and validate the profile (pydantic validates on construction)."""
    methods: dict[str, str] = {}
    cpu_section = build_cpu(host, cpu, methods, gpu)
    gpu_section, link = build_gpu(gpu, methods) if gpu is not None else (None, None)
    if gpu is None:
        methods["gpu"] = "no gpu/link section: " + next(
            (n for n in facts.notes if n.startswith("GPU skipped")), "GPU skipped")
    disk = None
    if cpu.disk is not None:
        disk = Disk(read_gbps=sig(cpu.disk.value))
        methods["disk.read_gbps"] = cpu.disk.method()
    efficiency = build_efficiency(cpu, gpu, methods)
    emulation = build_emulation(cpu.emulation, methods) if gpu_section is None else None
    notes = "; ".join((f"hrm profile ({facts.mode}), {facts.elapsed_s:.1f} s of a {facts.budget_s:.0f} s budget",
                       *facts.notes))
    source = Source(kind="measured", date=facts.date, tool_version=facts.tool_version, host=host.hostname,
                    notes=notes, methods=methods)
    gpu_desc = f"{gpu.info.count}x {gpu.info.name}" if gpu is not None else "no GPU"
    description = (f"measured on {host.hostname}: {host.cpu_name}, {host.cores} cores, "
                   f"{host.memory_gib:.0f} GiB, {gpu_desc}")
    return HardwareProfile(name=facts.name, description=description, source=source, gpu=gpu_section,
                           cpu=cpu_section, link=link, disk=disk, efficiency=efficiency, emulation=emulation)


def build_emulation(result: EmulationResult | None, methods: dict[str, str]) -> Emulation | None:
    """The ``emulation`` section: peaks = best point of each curve; bandwidth = 2 x copy."""
    if result is None or not any(result.matmul.values()):
        return None
    curves = {dtype: c for dtype, c in result.matmul.items() if c}
    for dtype, c in curves.items():
        methods[f"emulation.tflops.{dtype}"] = peak_method(c, "M")
        methods[f"emulation.matmul_tflops_vs_m.{dtype}"] = curve_method(c, "M")
    methods["emulation.copy_gbps"] = result.copy.method()
    methods["emulation.memory_bandwidth_gbps"] = "2 x emulation.copy_gbps (bytes read + written, STREAM's counting)"
    methods["emulation.threads"] = "runtime.device.EMULATED_THREADS (intra-op threads of the emulated tier)"
    return Emulation(threads=result.threads, tflops=Flops(**{d: sig(best_of(c)[1].value) for d, c in curves.items()}),
                     memory_bandwidth_gbps=sig(2 * result.copy.value), copy_gbps=sig(result.copy.value),
                     matmul_tflops_vs_m={d: curve_points(c) for d, c in curves.items()})
