"""Run every measurement of a profile in order, inside one time budget, and build the profile.

The run is a list of steps (label, required, action). Required steps (CPU bandwidth and
fp32 matmul; the GPU basics when a GPU is profiled) always run, with at least two repeats;
optional steps are skipped, and said so, once the budget is spent.
"""

from __future__ import annotations

import dataclasses

import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from hrm.errors import HRMError
from hrm.machine.hardware import HardwareProfile

from . import cpu as cpu_mod
from . import gpu as gpu_mod
from .build import CpuResults, RunFacts, build_profile, profile_name
from .config import ProfileConfig
from .progress import NullReporter, Reporter
from .timing import Budget

AUTO = "auto"
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class Step:
    label: str
    required: bool
    action: Callable[[], None]
    gpu: bool = False


@dataclass(frozen=True)
class ProfileRun:
    """The profile and what happened while measuring it."""

    profile: HardwareProfile
    notes: tuple[str, ...]
    elapsed_s: float


def tool_version() -> str:
    """``hrm-profile <package version>``."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return f"hrm-profile {version('hrm-moe')}"
    except (ImportError, PackageNotFoundError):
        return "hrm-profile (unknown version)"


def resolve_gpu(device: str, gpu_device, torch) -> tuple[object | None, str]:
    """The GpuDevice to profile (or None, with the reason). ``--device cuda`` without a
    usable GPU is a user error."""
    if device not in DEVICES:
        raise HRMError(f"--device must be one of {', '.join(DEVICES)}, got '{device}'")
    if device == "cpu":
        return None, "GPU skipped (--device cpu)"
    if gpu_device is not None:
        return gpu_device, ""
    found, why = gpu_mod.open_cuda_device(torch)
    if found is None and device == "cuda":
        raise HRMError(f"--device cuda: no usable GPU: {why}")
    return found, ("" if found is not None else f"GPU skipped: {why}; CPU-only profile (no gpu/link section)")


@dataclass(frozen=True)
class CpuActions:
    """The CPU measurements of a run, each an action that stores its result in ``results``
    (an optional one that drives the reference runtime notes why it failed in ``notes``)."""

    cfg: ProfileConfig
    host: cpu_mod.HostInfo
    results: CpuResults
    pool: object
    budget: Budget
    torch: object
    notes: list[str]
    disk_folder: Path | None
    #: the STREAM arrays' size (the config's, else sized past the last-level cache)
    array_bytes: int
    #: touched arrays the STREAM, memcpy and DRAM-read steps share (profiler.cpu.stocked_arrays),
    #: emptied by the last of them
    stock: list = dataclasses.field(default_factory=list)

    def stream(self) -> None:
        cfg = self.cfg
        self.results.stream = cpu_mod.measure_stream(self.array_bytes, cfg.copy_sizes_bytes, self.host.cores,
                                                     self.pool, cfg.warmup, cfg.repeats, self.budget, self.stock)
        if cfg.memcpy_bytes < 0:
            self.stock.clear()  # no later step streams them

    def matmul(self, dtype: str) -> Callable[[], None]:
        cfg, torch = self.cfg, self.torch

        def run() -> None:
            if dtype == "fp32":
                factory = cpu_mod.numpy_matmul_factory(cfg.matmul_k, cfg.matmul_n)
                how = "cpu fp32 matmul, numpy BLAS (all BLAS threads)"
            else:
                factory = cpu_mod.torch_matmul_factory(torch, cfg.matmul_k, cfg.matmul_n, dtype)
                how = f"cpu {dtype} matmul, torch {torch.__version__} ({torch.get_num_threads()} threads)"
            self.results.matmul[dtype] = cpu_mod.measure_matmul_curve(factory, cfg.matmul_ms, cfg.matmul_k,
                                                                      cfg.matmul_n, cfg.warmup, cfg.repeats,
                                                                      self.budget, how)
        return run

    def attention(self) -> None:
        cfg, shape = self.cfg, self.cfg.attention
        self.results.attention = cpu_mod.measure_decode_attention(
            cfg.attention_contexts, cfg.attention_kv_bytes, shape.kv_heads, shape.group, shape.head_dim,
            self.host.cores, self.pool, warmup=cfg.warmup, repeats=cfg.repeats, budget=self.budget)

    def emulation(self) -> None:
        from runtime.device import EMULATED_THREADS

        from .emulation import measure_emulation

        cfg = self.cfg
        self.results.emulation = measure_emulation(self.torch, EMULATED_THREADS, cfg.emulation_ms, cfg.emulation_k,
                                                   cfg.emulation_n, cfg.emulation_copy_bytes, self.host.llc_bytes,
                                                   warmup=cfg.warmup, repeats=cfg.repeats, budget=self.budget,
                                                   dtypes=cfg.emulation_dtypes)

    def dispatch(self) -> None:
        from .dispatch import measure_dispatch

        self.results.dispatch = optional_measurement(lambda: measure_dispatch("cpu", self.cfg.dispatch_repeats),
                                                     "dispatch overhead", self.notes)

    def memcpy(self) -> None:
        cfg = self.cfg
        nbytes = cfg.memcpy_bytes or self.array_bytes
        self.results.memcpy = optional_measurement(
            lambda: cpu_mod.measure_memcpy(nbytes, self.host.cores, self.pool, cfg.warmup, cfg.repeats, self.budget,
                                           self.stock),
            "host memcpy", self.notes)

    def dram_read(self) -> None:
        cfg = self.cfg
        nbytes = cfg.memcpy_bytes or self.array_bytes
        self.results.dram_read = optional_measurement(
            lambda: cpu_mod.measure_dram_read(nbytes, self.host.cores, self.pool, cfg.warmup, cfg.repeats,
                                              self.budget, self.stock),
            "host DRAM read", self.notes)
        self.stock.clear()  # the last step that streams them: their memory goes back now

    def cpu_op(self) -> None:
        cfg = self.cfg
        self.results.cpu_op = optional_measurement(
            lambda: cpu_mod.measure_cpu_op(self.torch, cfg.warmup, cfg.repeats, self.budget),
            "eager torch op on a CPU tensor", self.notes)

    def disk(self) -> None:
        folder = self.disk_folder or Path(tempfile.gettempdir())
        self.results.disk = cpu_mod.measure_disk_read(folder, self.cfg.disk_bytes, max(2, self.cfg.repeats),
                                                      self.budget)


def _kernel_cpu_steps(cfg: ProfileConfig, act: CpuActions, emulate: bool) -> list[Step]:
    """The optional CPU kernel steps: the eager torch op and torch matmuls, decode attention,
    the emulated device tier and dispatch (a step that needs torch, without it: a note why)."""
    torch, notes, steps = act.torch, act.notes, []
    if torch is not None:
        steps.append(Step("eager torch op on a CPU tensor", False, act.cpu_op))
    for dtype in cfg.cpu_torch_dtypes:
        if torch is None:
            notes.append(f"CPU {dtype} matmul not measured (torch not importable); the model uses fp32 for it")
        else:
            steps.append(Step(f"CPU {dtype} matmul vs M (torch)", False, act.matmul(dtype)))
    if cfg.attention_contexts:
        steps.append(Step("CPU decode attention (GQA over a KV cache)", False, act.attention))
    if emulate and cfg.emulation_ms:
        if torch is None:
            notes.append("emulated device tier not measured (torch not importable); the model uses the cpu section")
        else:
            steps.append(Step("emulated device tier (torch F.linear vs M, copy)", False, act.emulation))
    if cfg.dispatch_repeats > 0 and emulate:
        if torch is None:
            notes.append("dispatch overhead not measured (torch not importable); the model charges none")
        else:
            steps.append(Step("dispatch overhead per task / operator (reference runtime)", False, act.dispatch))
    return steps


def cpu_steps(cfg: ProfileConfig, host: cpu_mod.HostInfo, results: CpuResults, pool, budget: Budget,
              torch, disk_folder: Path | None, notes: list[str], emulate: bool = True) -> list[Step]:
    """The CPU measurements of the run."""
    array_bytes = cfg.stream_bytes or cpu_mod.stream_array_bytes(host.llc_bytes, host.memory_gib,
                                                                 cfg.stream_llc_multiple)
    act = CpuActions(cfg, host, results, pool, budget, torch, notes, disk_folder, array_bytes)
    steps = [Step("CPU memory bandwidth (STREAM copy + triad)", True, act.stream),
             Step("CPU fp32 matmul vs M (numpy)", True, act.matmul("fp32"))]
    if cfg.memcpy_bytes >= 0:
        steps.append(Step("CPU memcpy, one thread vs all threads", False, act.memcpy))
        steps.append(Step("host DRAM read, every core", False, act.dram_read))
    steps += _kernel_cpu_steps(cfg, act, emulate)
    if cfg.disk_bytes > 0:
        steps.append(Step("disk sequential read", False, act.disk))
    return steps


def optional_measurement(measure: Callable[[], object], label: str, notes: list[str]):
    """The result of an optional measurement that drives the reference runtime, or None with
    a note saying why (the profile is still written; the model then charges nothing for it)."""
    try:
        return measure()
    except Exception as exc:  # noqa: BLE001 - any failure of an optional step is reported, not fatal
        notes.append(f"{label} not measured: {gpu_mod.one_line(exc)}")
        return None


def runs_the_runtime(device) -> bool:
    """Whether ``device`` is a CUDA GPU of the installed torch (the reference runtime runs
    there), not a stand-in."""
    torch = cpu_mod.optional_torch()
    return (isinstance(device, gpu_mod.TorchCudaDevice) and torch is not None and device.torch is torch
            and torch.cuda.is_available())


def gpu_steps(cfg: ProfileConfig, device, results: gpu_mod.GpuResults, budget: Budget, pool=None,
              threads: int = 1) -> list[Step]:
    """The GPU measurements of the run (sizes clamped to the device memory)."""
    memory = results.info.memory_bytes
    w, r = cfg.warmup, cfg.repeats
    notes = results.notes

    def matmul(dtype: str) -> Callable[[], None]:
        def run() -> None:
            results.matmul[dtype] = gpu_mod.measure_gpu_matmul(
                device, dtype, cfg.gpu_matmul_ms, cfg.gpu_matmul_k, cfg.gpu_matmul_n, w, r, budget, notes)
        return run

    def copy() -> None:
        results.copy = gpu_mod.measure_gpu_copy(device, gpu_mod.clamp_bytes(cfg.gpu_copy_bytes, memory, 2),
                                                w, r, budget)

    sizes = tuple(sorted({gpu_mod.clamp_bytes(s, memory, 1) for s in cfg.transfer_sizes_bytes}))

    def transfer(attr: str, direction: str, pinned: bool, sizes_bytes: tuple[int, ...]) -> Callable[[], None]:
        def run() -> None:
            setattr(results, attr, gpu_mod.measure_transfer_curve(device, sizes_bytes, direction, pinned,
                                                                  w, r, budget, notes))
        return run

    steps = [Step(f"GPU {d} matmul vs M", d == "fp32", matmul(d), gpu=True) for d in cfg.gpu_dtypes]
    steps += [Step("GPU device-to-device copy", True, copy, gpu=True),
              Step("H2D pinned vs size", True, transfer("h2d_pinned", "h2d", True, sizes), gpu=True),
              Step("D2H pinned vs size", True, transfer("d2h_pinned", "d2h", True, sizes), gpu=True),
              Step("H2D pageable vs size", False, transfer("h2d_pageable", "h2d", False, sizes), gpu=True),
              Step("D2H pageable vs size", False, transfer("d2h_pageable", "d2h", False, sizes), gpu=True)]
    steps += _host_probe_steps(cfg, device, results, budget, pool, threads, sizes)
    if results.info.count > 1:
        steps += _peer_steps(cfg, device, results, budget)
    return steps


def _host_probe_steps(cfg: ProfileConfig, device, results: gpu_mod.GpuResults, budget: Budget, pool, threads: int,
                      transfer_sizes: tuple[int, ...]) -> list[Step]:
    """The optional GPU steps that involve the host: the reference runtime's dispatch on CUDA,
    an eager launch and sync, and a host DRAM read while a DMA of the largest of
    ``transfer_sizes`` runs."""
    memory = results.info.memory_bytes
    w, r = cfg.warmup, cfg.repeats
    notes = results.notes
    steps = []
    if cfg.dispatch_repeats > 0 and runs_the_runtime(device):
        def dispatch() -> None:
            from .dispatch import measure_dispatch

            results.dispatch = optional_measurement(lambda: measure_dispatch("cuda", cfg.dispatch_repeats),
                                                    "dispatch overhead on CUDA", notes)
        steps.append(Step("dispatch overhead per task / operator on CUDA (reference runtime)", False, dispatch,
                          gpu=True))
    if hasattr(device, "launch_op") and hasattr(device, "sync_op"):
        def launch() -> None:
            results.launch = optional_measurement(lambda: gpu_mod.measure_launch(device, w, r, budget),
                                                  "eager CUDA launch and host sync", notes)
        steps.append(Step("eager CUDA op launch and host sync round trip", False, launch, gpu=True))
    if hasattr(device, "dma_while") and pool is not None and cfg.memcpy_bytes >= 0:
        def read_during_dma() -> None:
            nbytes = cfg.memcpy_bytes or cfg.stream_bytes or cfg.gpu_copy_bytes
            src = cpu_mod.touched_array(max(threads, nbytes // cpu_mod.F64_BYTES), 1.0, pool=pool, threads=threads)
            read = cpu_mod.read_op(src, pool, threads)
            dma = gpu_mod.clamp_bytes(max(transfer_sizes), memory, 1)
            results.read_during_dma = optional_measurement(
                lambda: gpu_mod.measure_read_during_dma(device, read, src.size * cpu_mod.F64_BYTES, dma, w, r, budget),
                "host DRAM read while a DMA runs", notes)
        steps.append(Step("host DRAM read while pinned H2D copies run", False, read_during_dma, gpu=True))
    return steps


def _peer_steps(cfg: ProfileConfig, device, results: gpu_mod.GpuResults, budget: Budget) -> list[Step]:
    """Between GPUs 0 and 1: whether one can access the other, and the copy rate."""
    def peer_access() -> None:
        results.p2p = gpu_mod.query_peer_access(device, results.notes)

    def peer() -> None:
        results.peer = gpu_mod.measure_peer(device, gpu_mod.clamp_bytes(cfg.peer_bytes, results.info.memory_bytes, 1),
                                            cfg.warmup, cfg.repeats, budget)

    # a query, not a measurement (never raises): runs whatever the budget
    return [Step("GPU peer access (can_device_access_peer)", True, peer_access, gpu=True),
            Step("GPU0 -> GPU1 copy", False, peer, gpu=True)]


def run_steps(steps: list[Step], budget: Budget, reporter: Reporter, device: str, notes: list[str]) -> bool:
    """Execute the steps; returns False when the GPU part failed (auto mode: the profile
    becomes CPU-only; ``--device cuda``: HRMError)."""
    gpu_ok = True
    for step in steps:
        reporter.step(step.label)
        if step.gpu and not gpu_ok:
            reporter.done()
            continue
        if not step.required and budget.expired():
            message = f"{step.label}: skipped (time budget of {budget.total_s:.0f} s spent)"
            notes.append(message)
            reporter.note(message)
            reporter.done()
            continue
        try:
            step.action()
        except gpu_mod.GPU_ERRORS as exc:
            if not step.gpu:
                raise
            if device == "cuda":
                raise HRMError(f"GPU measurement '{step.label}' failed: {gpu_mod.one_line(exc)}") from None
            gpu_ok = False
            message = f"GPU skipped: '{step.label}' failed ({gpu_mod.one_line(exc)}); CPU-only profile"
            notes.append(message)
            reporter.note(message)
        reporter.done()
    return gpu_ok


_AUTO_TORCH = object()


def run_profile(cfg: ProfileConfig, device: str = AUTO, reporter: Reporter | None = None, gpu_device=None,
                torch_module=_AUTO_TORCH, disk_folder: Path | None = None, name: str | None = None,
                clock: Callable[[], float] = time.monotonic) -> ProfileRun:
    """Measure this machine (and ``gpu_device`` or the CUDA GPU) into a HardwareProfile.

    ``torch_module``: the torch module to use, None to run without torch, default = import
    it if installed. ``gpu_device``: a GpuDevice to profile instead of probing torch.cuda.
    """
    reporter = reporter or NullReporter()
    budget = Budget(cfg.budget_s, clock)
    torch = cpu_mod.optional_torch() if torch_module is _AUTO_TORCH else torch_module
    device_obj, why = resolve_gpu(device, gpu_device, torch)
    notes: list[str] = [why] if why else []
    if why:
        reporter.note(why)
    host = cpu_mod.host_info()
    cpu_results = CpuResults()
    gpu_results = gpu_mod.GpuResults(info=device_obj.info()) if device_obj is not None else None
    with ThreadPoolExecutor(max_workers=host.cores, thread_name_prefix="hrm-profile") as pool:
        steps = cpu_steps(cfg, host, cpu_results, pool, budget, torch, disk_folder, notes, emulate=device_obj is None)
        if device_obj is not None:
            steps += gpu_steps(cfg, device_obj, gpu_results, budget, pool, host.cores)
        reporter.start(len(steps))
        gpu_ok = run_steps(steps, budget, reporter, device, notes)
    if gpu_results is not None:
        notes.extend(gpu_results.notes)
        missing = gpu_mod.missing_gpu_parts(gpu_results) if gpu_ok else []
        if missing:
            why = "; ".join(gpu_results.notes[:2]) or "no reason recorded"
            if device == "cuda":
                raise HRMError(f"GPU measurements failed ({', '.join(missing)} missing): {why}")
            message = f"GPU skipped: {', '.join(missing)} could not be measured ({why}); CPU-only profile"
            notes.append(message)
            reporter.note(message)
        if not gpu_ok or missing:
            gpu_results = None
        elif gpu_results.dispatch is not None:
            # the CPU lane's tasks (CPU attention, CPU experts) ran in the same CUDA probe
            cpu_results.dispatch = gpu_results.dispatch
    elapsed_s = budget.elapsed_s()
    facts = RunFacts(name=name or profile_name(host.hostname),
                     date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     tool_version=tool_version(), mode=cfg.label, elapsed_s=elapsed_s,
                     budget_s=cfg.budget_s, notes=tuple(notes))
    try:
        profile = build_profile(facts, host, cpu_results, gpu_results)
    except ValueError as exc:
        raise HRMError(f"profile could not be built: {gpu_mod.one_line(exc)}") from None
    return ProfileRun(profile=profile, notes=tuple(notes), elapsed_s=elapsed_s)
