"""GPU measurements written against a small device interface.

:class:`GpuDevice` is all the measuring logic needs: timed ops for a matmul, a device copy,
host<->device transfers and peer copies. :class:`TorchCudaDevice` implements it with
torch.cuda (CUDA events); tests drive the same logic with a fake device, so the GPU branch
is exercised on machines without CUDA or torch. Nothing here imports torch at module level.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Literal, Protocol

from hrm.units import GB, MIB

from .cpu import Measured
from .timing import Budget, TimedOp, measure

Direction = Literal["h2d", "d2h"]
GPU_ERRORS = (RuntimeError, ValueError, MemoryError, AssertionError)


@dataclass(frozen=True)
class GpuInfo:
    """Name, number of (identical) GPUs and per-GPU memory."""

    name: str
    count: int
    memory_bytes: int
    capability: tuple[int, int] | None = None  # CUDA compute capability (major, minor)


class GpuDevice(Protocol):
    """What the GPU measurements need. Each ``*_op`` allocates its buffers and returns a
    timed op (seconds per operation); raising ValueError/RuntimeError means unsupported.
    Optional: ``peer_access() -> bool`` (every GPU pair can copy peer-to-peer; ``link.p2p``);
    ``launch_op(ops)`` / ``sync_op(ops)`` (host seconds per tiny eager op, and per op +
    ``.item()`` round trip: :func:`measure_launch`); ``dma_while(nbytes, func)`` (pinned H2D
    copies kept running while ``func`` runs on the host: :func:`measure_read_during_dma`)."""

    def info(self) -> GpuInfo: ...

    def supports(self, dtype: str) -> bool: ...

    def matmul_op(self, m: int, k: int, n: int, dtype: str) -> TimedOp: ...

    def copy_op(self, nbytes: int) -> TimedOp: ...

    def transfer_op(self, nbytes: int, direction: Direction, pinned: bool) -> TimedOp: ...

    def peer_op(self, nbytes: int, src: int, dst: int) -> TimedOp: ...

    def release(self) -> None: ...


@dataclass
class GpuResults:
    """Everything measured on the GPU side (filled step by step)."""

    info: GpuInfo
    matmul: dict[str, dict[int, Measured]] = field(default_factory=dict)
    copy: Measured | None = None
    h2d_pinned: dict[int, Measured] = field(default_factory=dict)
    h2d_pageable: dict[int, Measured] = field(default_factory=dict)
    d2h_pinned: dict[int, Measured] = field(default_factory=dict)
    d2h_pageable: dict[int, Measured] = field(default_factory=dict)
    peer: Measured | None = None
    p2p: bool | None = None  # every GPU pair can copy peer-to-peer (None: not queried)
    notes: list[str] = field(default_factory=list)
    dispatch: object | None = None  # profiler.dispatch.DispatchResult of the runtime on CUDA
    launch: "LaunchResult | None" = None  # eager per-op and host-sync costs (measure_launch)
    read_during_dma: Measured | None = None  # host DRAM read + DMA traffic together (GB/s)


# --- the generic measuring logic ------------------------------------------------------

def measure_gpu_matmul(device: GpuDevice, dtype: str, ms: tuple[int, ...], k: int, n: int, warmup: int,
                       repeats: int, budget: Budget | None, notes: list[str]) -> dict[int, Measured]:
    """Achieved TFLOP/s (2*M*K*N / time) of ``dtype`` matmuls for each M; points the device
    rejects are skipped and noted."""
    curve: dict[int, Measured] = {}
    if not device.supports(dtype):
        notes.append(f"gpu {dtype} matmul: not supported by this device/torch, skipped")
        return curve
    for m in sorted(ms):
        if curve and budget is not None and budget.expired():
            notes.append(f"gpu {dtype} matmul: budget spent, stopped before M={m}")
            break
        try:
            stats = measure(device.matmul_op(m, k, n, dtype), warmup, repeats, budget)
        except GPU_ERRORS as exc:
            notes.append(f"gpu {dtype} matmul M={m}: skipped ({one_line(exc)})")
            continue
        finally:
            device.release()
        curve[m] = Measured(stats.median_rate(2.0 * m * k * n) / 1e12, "TFLOP/s", stats,
                            f"gpu {dtype} matmul ({m} x {k}) @ ({k} x {n}), 2*M*K*N FLOPs, CUDA-event timed")
    return curve


def measure_gpu_copy(device: GpuDevice, nbytes: int, warmup: int, repeats: int,
                     budget: Budget | None) -> Measured:
    """Device memory bandwidth: device-to-device copy, bytes = read + write (2 x size)."""
    try:
        stats = measure(device.copy_op(nbytes), warmup, repeats, budget)
    finally:
        device.release()
    return Measured(stats.median_rate(2.0 * nbytes) / GB, "GB/s", stats,
                    f"device-to-device copy of {nbytes / MIB:.0f} MiB, bytes = read + write")


def measure_transfer_curve(device: GpuDevice, sizes_bytes: tuple[int, ...], direction: Direction, pinned: bool,
                           warmup: int, repeats: int, budget: Budget | None,
                           notes: list[str]) -> dict[int, Measured]:
    """Host<->device GB/s (bytes moved / time) for each transfer size."""
    curve: dict[int, Measured] = {}
    kind = "pinned" if pinned else "pageable"
    for size in sorted(sizes_bytes):
        if curve and budget is not None and budget.expired():
            notes.append(f"{direction} {kind}: budget spent, stopped before {size} bytes")
            break
        try:
            stats = measure(device.transfer_op(size, direction, pinned), warmup, repeats, budget)
        except GPU_ERRORS as exc:
            notes.append(f"{direction} {kind} {size} bytes: skipped ({one_line(exc)})")
            continue
        finally:
            device.release()
        curve[size] = Measured(stats.median_rate(size) / GB, "GB/s", stats,
                               f"{direction} {kind} copy of {size / MIB:.3g} MiB")
    return curve


def measure_peer(device: GpuDevice, nbytes: int, warmup: int, repeats: int,
                 budget: Budget | None) -> Measured:
    """GPU0 -> GPU1 copy GB/s (bytes moved / time)."""
    try:
        stats = measure(device.peer_op(nbytes, 0, 1), warmup, repeats, budget)
    finally:
        device.release()
    return Measured(stats.median_rate(nbytes) / GB, "GB/s", stats,
                    f"GPU0 -> GPU1 copy of {nbytes / MIB:.0f} MiB")


@dataclass(frozen=True)
class LaunchResult:
    """Per-op costs of an eager framework on this GPU host: ``eager_op`` (host seconds to
    issue one tiny CUDA op) and ``sync_bubble`` (the GPU's idle seconds per host sync beyond
    the ops' issue: an op + ``.item()`` round trip less its two eager ops)."""

    eager_op: Measured
    sync_bubble: Measured


#: tiny ops per sample of the launch measurements (a few ms per sample at ~10 us per op)
LAUNCH_OPS = 1000


def measure_launch(device: GpuDevice, warmup: int, repeats: int, budget: Budget | None,
                   ops: int = LAUNCH_OPS) -> LaunchResult:
    """Host seconds per eager CUDA op (``x.add_(1)`` on 16 elements, ``ops`` in a row then one
    synchronize: the host's issue rate, the tiny kernels finishing faster than they arrive)
    and per ``x.add_(1).sum().item()`` (two ops, a scalar D2H and the host's wait). The sync's
    own round trip, during which the GPU's queue is empty, is the second less two of the first."""
    op_stats = measure(device.launch_op(ops), warmup, repeats, budget)
    sync_stats = measure(device.sync_op(ops), warmup, repeats, budget)
    op_s, round_trip_s = op_stats.median_s, sync_stats.median_s
    eager = Measured(op_s, "s", op_stats, f"eager CUDA op x.add_(1) on 16 elements, {ops} in a row then one "
                     f"synchronize, host wall time / {ops}")
    bubble = Measured(max(0.0, round_trip_s - 2 * op_s), "s", sync_stats,
                      f"x.add_(1).sum().item() round trip ({round_trip_s * 1e6:.3g} us per iteration, {ops} "
                      f"iterations per sample) less 2 eager ops ({op_s * 1e6:.3g} us each)")
    return LaunchResult(eager, bubble)


def measure_read_during_dma(device: GpuDevice, read: TimedOp, read_bytes: int, dma_bytes: int, warmup: int,
                            repeats: int, budget: Budget | None) -> Measured:
    """Host DRAM traffic with every core reading (``read``: one pass over ``read_bytes``) while
    pinned H2D copies of ``dma_bytes`` run back to back: (bytes read + bytes the DMA moved in
    the same time) per second — what DRAM sustains for CPU attention and the weight DMA
    together (the host-DRAM lane's capacity). ``device.dma_while(dma_bytes, read)`` returns
    (seconds of the read, DMA bytes per second meanwhile)."""
    dma_rates: list[float] = []

    def op() -> float:
        seconds, dma_bytes_s = device.dma_while(dma_bytes, read)
        dma_rates.append(dma_bytes_s)
        return seconds

    stats = measure(op, warmup, repeats, budget)
    dma_gbps = sorted(dma_rates)[len(dma_rates) // 2] / GB
    read_gbps = stats.median_rate(read_bytes) / GB
    return Measured(read_gbps + dma_gbps, "GB/s", stats,
                    f"host DRAM read with every core ({read_gbps:.4g} GB/s, {read_bytes / MIB:.0f} MiB) while pinned "
                    f"H2D copies of {dma_bytes / MIB:.0f} MiB run back to back ({dma_gbps:.4g} GB/s); bytes read + "
                    f"bytes the DMA moved, per second")


def query_peer_access(device, notes: list[str]) -> bool | None:
    """Whether every GPU can access every other peer-to-peer (``device.peer_access()``);
    None, with a note, when the device cannot say or the query fails."""
    ask = getattr(device, "peer_access", None)
    if ask is None:
        notes.append("link.p2p not queried: the GPU device has no peer-access query")
        return None
    try:
        return bool(ask())
    except Exception as exc:  # noqa: BLE001 - an optional query: its failure is a note
        notes.append(f"link.p2p not queried: {one_line(exc)}")
        return None


#: CUDA compute capability major (or (major, minor)) -> hrm.machine.hardware.GPU.architecture
ARCHITECTURES = {(7, 5): "turing", 8: "ampere", (8, 9): "ada", 9: "hopper", 10: "blackwell", 11: "blackwell",
                 12: "blackwell"}


def architecture_of(capability: tuple[int, int] | None) -> str | None:
    """The GPU architecture of a compute capability (8.9 -> ada, 9.0 -> hopper, 7.0 -> other);
    None when unknown."""
    if capability is None:
        return None
    major, minor = capability
    return ARCHITECTURES.get((major, minor)) or ARCHITECTURES.get(major) or "other"


def missing_gpu_parts(results: GpuResults) -> list[str]:
    """What a gpu+link section needs but the run did not get (empty = complete)."""
    needed = {"fp32 matmul": bool(results.matmul.get("fp32")), "device copy": results.copy is not None,
              "pinned h2d": bool(results.h2d_pinned), "pinned d2h": bool(results.d2h_pinned)}
    return [name for name, ok in needed.items() if not ok]


def clamp_bytes(nbytes: int, memory_bytes: int, buffers: int) -> int:
    """Shrink a size so ``buffers`` buffers of it take at most half the device memory."""
    return int(min(nbytes, memory_bytes // (2 * max(1, buffers))))


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:160]


# --- torch.cuda implementation ---------------------------------------------------------

def open_cuda_device(torch) -> tuple["TorchCudaDevice | None", str]:
    """A TorchCudaDevice when torch sees a CUDA GPU, else (None, why not)."""
    if torch is None:
        return None, "torch is not installed (pip install -e '.[runtime]' for GPU profiling)"
    try:
        if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
            return None, "torch.cuda.is_available() is False (no CUDA GPU or driver visible)"
        return TorchCudaDevice(torch), ""
    except GPU_ERRORS as exc:
        return None, f"CUDA initialisation failed ({one_line(exc)})"


class TorchCudaDevice:
    """GpuDevice on torch.cuda. Timed ops use CUDA events and repeat the operation enough
    times per sample (>= ``min_sample_s``) to hide launch overhead for small ops."""

    def __init__(self, torch, index: int = 0, min_sample_s: float = 2e-3, max_iters: int = 200):
        self.torch = torch
        self.index = index
        self.min_sample_s = min_sample_s
        self.max_iters = max_iters

    def _dtype(self, dtype: str):
        t = self.torch
        return {"fp32": t.float32, "fp16": t.float16, "bf16": t.bfloat16, "int8": t.int8}[dtype]

    def info(self) -> GpuInfo:
        props = self.torch.cuda.get_device_properties(self.index)
        major, minor = getattr(props, "major", None), getattr(props, "minor", None)
        capability = (int(major), int(minor)) if major is not None and minor is not None else None
        return GpuInfo(name=props.name, count=self.torch.cuda.device_count(), memory_bytes=int(props.total_memory),
                       capability=capability)

    def peer_access(self) -> bool:
        """Every ordered pair of the visible GPUs can access each other peer-to-peer."""
        cuda = self.torch.cuda
        count = cuda.device_count()
        return all(cuda.can_device_access_peer(i, j) for i in range(count) for j in range(count) if i != j)

    def supports(self, dtype: str) -> bool:
        cuda = self.torch.cuda
        if dtype == "bf16":
            return bool(cuda.is_bf16_supported())
        if dtype == "int8":
            return hasattr(self.torch, "_int_mm")
        return dtype in ("fp32", "fp16")

    def _event_timed(self, run) -> TimedOp:
        """Calibrate iterations per sample, then time ``run`` with CUDA events."""
        cuda = self.torch.cuda
        run()
        cuda.synchronize(self.index)
        start_s = time.perf_counter()
        run()
        cuda.synchronize(self.index)
        once_s = max(time.perf_counter() - start_s, 1e-7)
        iters = int(min(self.max_iters, max(1, math.ceil(self.min_sample_s / once_s))))
        begin, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)

        def op() -> float:
            begin.record()
            for _ in range(iters):
                run()
            end.record()
            end.synchronize()
            return begin.elapsed_time(end) / 1e3 / iters

        return op

    def matmul_op(self, m: int, k: int, n: int, dtype: str) -> TimedOp:
        t = self.torch
        dev = f"cuda:{self.index}"
        if dtype == "int8":
            if m <= 16 or k % 8 or n % 8:
                raise ValueError("torch._int_mm needs M > 16 and K, N multiples of 8")
            a = t.ones((m, k), dtype=t.int8, device=dev)
            b = t.ones((k, n), dtype=t.int8, device=dev)
            return self._event_timed(lambda: t._int_mm(a, b))
        a = t.full((m, k), 0.01, dtype=self._dtype(dtype), device=dev)
        b = t.full((k, n), 0.01, dtype=self._dtype(dtype), device=dev)
        out = t.empty((m, n), dtype=self._dtype(dtype), device=dev)
        if dtype != "fp32":
            return self._event_timed(lambda: t.matmul(a, b, out=out))
        return self._without_tf32(lambda: self._event_timed(lambda: t.matmul(a, b, out=out)))

    def _without_tf32(self, make_op) -> TimedOp:
        """Build and run an op with TF32 off (true fp32 FLOP/s), restoring the user's flag."""
        flags = self.torch.backends.cuda.matmul

        def scoped(func):
            previous = flags.allow_tf32
            flags.allow_tf32 = False
            try:
                return func()
            finally:
                flags.allow_tf32 = previous

        inner = scoped(make_op)
        return lambda: scoped(inner)

    def copy_op(self, nbytes: int) -> TimedOp:
        t = self.torch
        src = t.ones(nbytes, dtype=t.uint8, device=f"cuda:{self.index}")
        dst = t.empty_like(src)
        return self._event_timed(lambda: dst.copy_(src))

    def transfer_op(self, nbytes: int, direction: Direction, pinned: bool) -> TimedOp:
        t = self.torch
        host = t.ones(nbytes, dtype=t.uint8, pin_memory=pinned)
        dev = t.empty(nbytes, dtype=t.uint8, device=f"cuda:{self.index}")
        if direction == "h2d":
            return self._event_timed(lambda: dev.copy_(host, non_blocking=pinned))
        return self._event_timed(lambda: host.copy_(dev, non_blocking=pinned))

    def peer_op(self, nbytes: int, src: int, dst: int) -> TimedOp:
        t = self.torch
        a = t.ones(nbytes, dtype=t.uint8, device=f"cuda:{src}")
        b = t.empty(nbytes, dtype=t.uint8, device=f"cuda:{dst}")

        def op() -> float:
            t.cuda.synchronize(src)
            start_s = time.perf_counter()
            b.copy_(a)
            t.cuda.synchronize(src)
            t.cuda.synchronize(dst)
            return time.perf_counter() - start_s

        return op

    def _per_op(self, ops: int, step, sync_after: bool) -> TimedOp:
        """Seconds per call of ``step(x)`` on a 16-element device tensor, ``ops`` calls in a
        row (a final device synchronize when ``sync_after``: the calls themselves don't)."""
        t = self.torch
        x = t.zeros(16, device=f"cuda:{self.index}")

        def op() -> float:
            t.cuda.synchronize(self.index)
            start_s = time.perf_counter()
            for _ in range(ops):
                step(x)
            if sync_after:
                t.cuda.synchronize(self.index)
            return (time.perf_counter() - start_s) / ops

        return op

    def launch_op(self, ops: int) -> TimedOp:
        return self._per_op(ops, lambda x: x.add_(1), sync_after=True)

    def sync_op(self, ops: int) -> TimedOp:
        return self._per_op(ops, lambda x: x.add_(1).sum().item(), sync_after=False)

    def dma_while(self, nbytes: int, func) -> tuple[float, float]:
        """Run ``func`` on a host thread while this thread keeps pinned H2D copies of
        ``nbytes`` going; (seconds of ``func``, DMA bytes per second meanwhile)."""
        import threading

        t = self.torch
        host = getattr(self, "_dma_host", None)
        if host is None or host.numel() != nbytes:
            self._dma_host = host = t.ones(nbytes, dtype=t.uint8, pin_memory=True)
            self._dma_dev = t.empty(nbytes, dtype=t.uint8, device=f"cuda:{self.index}")
        dev, stream = self._dma_dev, t.cuda.Stream(self.index)
        took: list[float] = []
        worker = threading.Thread(target=lambda: took.append(func()))
        copies, start_s = 0, time.perf_counter()
        worker.start()
        with t.cuda.stream(stream):
            while worker.is_alive():
                dev.copy_(host, non_blocking=True)
                stream.synchronize()
                copies += 1
        worker.join()
        elapsed_s = time.perf_counter() - start_s
        return took[0], copies * nbytes / max(elapsed_s, 1e-9)

    def release(self) -> None:
        self.torch.cuda.synchronize(self.index)
        self.torch.cuda.empty_cache()
