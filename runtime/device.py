"""The device tier: where "GPU" tensors live, the lanes that run tasks, and its memory.

One code path for both hosts (docs/model.md §8):

- **CUDA**: device tensors on ``cuda``; every lane (gpu, cpu, h2d, d2h) is a worker thread,
  the device-side lanes each own a CUDA stream; a task runs on its lane's stream and the
  lane records CUDA events around it (the end event is synchronised before dependants run).
- **Emulated** (CPU-only host): device tensors are CPU tensors kept apart from the host
  tier's; copies between tiers are explicit ``copy_`` calls on the h2d/d2h lanes. By
  default (``lanes="exclusive"``) the four lanes share one unit (:class:`SharedUnit`): their
  tasks run one at a time, in launch order as dependencies allow — the CPU-only machine the
  model describes, where a layer's time is the sum of its tasks. ``lanes="concurrent"``
  gives each lane a worker thread instead, so CPU attention overlaps device work as far
  as the shared cores and the GIL allow.

Device memory is tracked explicitly: persistent buffers through :meth:`DeviceTier.alloc`
(weights, double buffer, KV), transient activations of device-side tasks through a
dispatch mode that counts every tensor an op creates until it is freed (emulated tier); on
CUDA the allocator's peak above what was live when the tier opened is reported instead (what
this plan held, not what earlier executors or the caller still hold).
"""

from __future__ import annotations

import gc
import itertools
import queue
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from hrm.errors import HRMError

LANES = ("gpu", "cpu", "h2d", "d2h")
# Intra-op threads of the emulated device tier (both lane modes). One: an OpenMP team of
# several threads stalls at every barrier while another process holds one of its cores
# (a shared 2-core host turns 0.1 ms ops into ms), and teams of different lane threads
# oversubscribe the cores. ``hrm profile`` measures the emulation at this count.
EMULATED_THREADS = 1
DEVICE_LANES = ("gpu", "h2d")  # lanes whose op outputs are device-tier tensors


def resolve_device(choice: str = "auto") -> str:
    """'cuda' or 'cpu' for ``--device auto|cpu|cuda``."""
    if choice not in ("auto", "cpu", "cuda"):
        raise HRMError(f"--device must be auto, cpu or cuda, not {choice!r}")
    if choice == "cuda" and not torch.cuda.is_available():
        raise HRMError("--device cuda: no CUDA device is available on this host")
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return choice


LANE_MODES = ("auto", "exclusive", "concurrent")


def resolve_lane_mode(choice: str, is_cuda: bool) -> str:
    """How the lanes share the machine: 'concurrent' (a thread per lane: CUDA streams, or
    their emulation) or 'exclusive' (:class:`SharedUnit`); 'auto' = concurrent on CUDA,
    exclusive on a CPU-only host."""
    if choice not in LANE_MODES:
        raise HRMError(f"--lanes must be one of {', '.join(LANE_MODES)}, not {choice!r}")
    if choice == "auto":
        return "concurrent" if is_cuda else "exclusive"
    if choice == "exclusive" and is_cuda:
        raise HRMError("--lanes exclusive emulates a CPU-only host; on CUDA the lanes are streams (concurrent)")
    return choice


def _nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


class DeviceMemory:
    """Bytes live on the device tier: persistent (explicit) + transient (tracked), and the peak."""

    def __init__(self):
        self._lock = threading.Lock()
        self.persistent_bytes = 0
        self.transient_bytes = 0
        self.peak_bytes = 0
        self.peak_persistent_bytes = 0
        self._persistent_keys: dict[int, int] = {}
        self._transient: dict[int, list[int]] = {}  # storage key -> [bytes, live tensor refs]

    def _update_peak(self) -> None:
        live = self.persistent_bytes + self.transient_bytes
        self.peak_bytes = max(self.peak_bytes, live)
        self.peak_persistent_bytes = max(self.peak_persistent_bytes, self.persistent_bytes)

    def add_persistent(self, t: torch.Tensor) -> None:
        key = t.untyped_storage().data_ptr()
        with self._lock:
            if key in self._persistent_keys or t.numel() == 0:
                return
            self._persistent_keys[key] = _nbytes(t)
            self.persistent_bytes += _nbytes(t)
            self._update_peak()

    def release_persistent(self, t: torch.Tensor) -> None:
        key = t.untyped_storage().data_ptr()
        with self._lock:
            size = self._persistent_keys.pop(key, 0)
            self.persistent_bytes -= size

    def track_transient(self, t: torch.Tensor, input_keys: frozenset = frozenset()) -> None:
        """Count ``t``'s storage until the last tracked tensor viewing it is collected. A view
        of an untracked input (host tensors, persistent buffers) allocates nothing."""
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            return
        key = t.untyped_storage().data_ptr()
        with self._lock:
            if key in self._persistent_keys:
                return
            entry = self._transient.get(key)
            if entry is None:
                if key in input_keys:
                    return
                entry = self._transient[key] = [_nbytes(t), 0]
                self.transient_bytes += entry[0]
                self._update_peak()
            entry[1] += 1
        weakref.finalize(t, self._drop_transient, key)

    def _drop_transient(self, key: int) -> None:
        with self._lock:
            entry = self._transient.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] <= 0:
                self.transient_bytes -= entry[0]
                del self._transient[key]


class _TransientTracker(TorchDispatchMode):
    """Counts the outputs of every op run inside a device-side task (emulated tier)."""

    def __init__(self, memory: DeviceMemory):
        super().__init__()
        self.memory = memory

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = frozenset(a.untyped_storage().data_ptr() for a in tree_leaves((args, kwargs))
                           if isinstance(a, torch.Tensor) and a.numel())
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.memory.track_transient(t, inputs)
        return out


@dataclass
class Task:
    """One unit of work on one lane; ``deps`` must finish first (Algorithm 1 synchronisation)."""

    lane: str
    name: str
    fn: Callable[[], Any]
    deps: list["Task"] = field(default_factory=list)
    args: dict = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
    error: Optional[BaseException] = None
    seq: int = 0  # launch order (the shared unit runs the earliest ready head first)
    start_s: float = 0.0
    end_s: float = 0.0


_LANE_STREAMS: dict = {}
_LANE_STREAMS_LOCK = threading.Lock()


def lane_stream(device: torch.device, lane: str):
    """The CUDA stream of ``lane`` on ``device``, one per process. cuBLAS keeps a workspace per
    (handle, stream) for the life of the process (32 MiB on Hopper: torch's default
    CUBLAS_WORKSPACE_CONFIG ":4096:8", aten/src/ATen/cuda/CublasHandlePool.cpp), so a fresh stream per executor would leave one more
    workspace allocated after every run (measured on an H200: +34 MB per executor,
    docs/validation/gpu.md)."""
    key = (device.type, device.index if device.index is not None else torch.cuda.current_device(), lane)
    with _LANE_STREAMS_LOCK:
        if key not in _LANE_STREAMS:
            _LANE_STREAMS[key] = torch.cuda.Stream(device=torch.device(device.type, key[1]))
        return _LANE_STREAMS[key]


class Lane:
    """An in-order worker (a CUDA stream's host side, or its emulation). Under the shared
    unit (exclusive emulation) the lane is only a queue that :class:`SharedUnit` drains."""

    def __init__(self, name: str, tier: "DeviceTier", unit: Optional["SharedUnit"] = None):
        self.name, self.tier, self.unit = name, tier, unit
        self.stream = lane_stream(tier.device, name) if tier.is_cuda and name != "cpu" else None
        self._queue: queue.Queue = queue.Queue()
        self._thread = None
        if unit is None:
            self._thread = threading.Thread(target=self._loop, name=f"lane-{name}", daemon=True)
            self._thread.start()

    def submit(self, task: Task) -> Task:
        if self.unit is not None:
            return self.unit.submit(self, task)
        self._queue.put(task)
        return task

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        if self.tier.lane_threads:
            torch.set_num_threads(self.tier.lane_threads)
        while True:
            task = self._queue.get()
            if task is None:
                return
            self.tier.gate.wait()
            self._run(task)

    def _run(self, task: Task) -> None:
        try:
            for dep in task.deps:
                dep.done.wait()
                if dep.error is not None:
                    raise RuntimeError(f"dependency {dep.name} failed") from dep.error
            task.start_s = time.perf_counter()
            with self.tier.task_context(self):
                task.fn()
            task.end_s = time.perf_counter()
        except BaseException as exc:  # recorded; the launcher re-raises after the run
            task.error = exc
            task.end_s = time.perf_counter()
        finally:
            self.tier.tracer.record(task)
            task.done.set()


class SharedUnit:
    """Exclusive emulation of the device tier on a CPU-only host: the four lanes keep their
    in-order queues, but their tasks run one at a time, on the launcher's own thread when
    it waits (:meth:`DeviceTier.wait`) — at each point the earliest-launched lane head whose
    dependencies are done — with :data:`EMULATED_THREADS` intra-op threads.

    This is the machine the model describes for a CPU-only host (``hrm.machine.rates.Rates.
    shared_unit``: one compute unit, one memory bus, so a layer's time is the *sum* of its
    tasks). Lanes on threads of their own would instead compete for the cores and the GIL,
    and idle OpenMP teams of other threads spin on the cores a task needs."""

    def __init__(self, tier: "DeviceTier"):
        self.tier = tier
        self._lock = threading.Lock()
        self._queues: dict[str, deque] = {}

    def submit(self, lane: Lane, task: Task) -> Task:
        with self._lock:
            self._queues.setdefault(lane.name, deque()).append((lane, task))
        return task

    def _next_ready(self):
        """(lane, task) of the earliest-launched head whose dependencies are all done."""
        with self._lock:
            heads = [q[0] for q in self._queues.values() if q]
            ready = [h for h in heads if all(d.done.is_set() for d in h[1].deps)]
            if not ready:
                if heads:
                    self._fail_stuck()
                return None
            lane, task = min(ready, key=lambda h: h[1].seq)
            self._queues[lane.name].popleft()
            return lane, task

    def drain(self) -> None:
        """Run every queued task (in the order above) on the calling thread."""
        saved = torch.get_num_threads()
        if self.tier.lane_threads:
            torch.set_num_threads(self.tier.lane_threads)
        try:
            with torch.no_grad():
                item = self._next_ready()
                while item is not None:
                    item[0]._run(item[1])
                    item = self._next_ready()
        finally:
            torch.set_num_threads(saved)

    def _fail_stuck(self) -> None:
        """No head can run (it depends on a task queued behind another head): fail them all."""
        for q in self._queues.values():
            while q:
                _lane, task = q.popleft()
                task.error = RuntimeError(f"task {task.name}: its dependencies can never run on the shared unit")
                task.end_s = time.perf_counter()
                task.done.set()


class _NullContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class DeviceTier:
    """Device-tier tensors, copies and lanes; ``kind`` is 'cuda' or 'emulated'."""

    def __init__(self, device: str = "auto", track_memory: bool = True, tracer=None,
                 lane_threads: Optional[int] = None, lanes: str = "auto"):
        from .trace import Tracer

        device = resolve_device(device)
        self.is_cuda = device == "cuda"
        self.kind = "cuda" if self.is_cuda else "emulated"
        self.device = torch.device(device)
        self.track_memory = track_memory
        # emulated tier: ``exclusive`` (default) runs every lane's tasks one at a time on the
        # launcher's thread; ``concurrent`` gives each lane a thread; both with
        # EMULATED_THREADS intra-op threads (0 = torch's default, the CUDA case)
        self.lane_mode = resolve_lane_mode(lanes, self.is_cuda)
        self.lane_threads = lane_threads if lane_threads is not None else (0 if self.is_cuda else EMULATED_THREADS)
        self._seq = itertools.count()
        self.memory = DeviceMemory()
        self.tracer = tracer or Tracer()
        self.gate = threading.Event()
        self.gate.set()
        self.unit = SharedUnit(self) if self.lane_mode == "exclusive" else None
        self.lanes = {name: Lane(name, self, self.unit) for name in LANES}
        self.baseline_bytes = 0
        if self.is_cuda:
            # what earlier executors left to the garbage collector is freed now, not during this
            # plan's run (which would put the baseline above the plan's own peak)
            gc.collect()
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline_bytes = int(torch.cuda.memory_allocated(self.device))

    # --- tensors ------------------------------------------------------------------
    def pin(self, t: torch.Tensor) -> torch.Tensor:
        """Host-tier tensor, page-locked when a CUDA device will copy from/to it."""
        t = t.contiguous()
        return t.pin_memory() if self.is_cuda else t

    def alloc(self, t: torch.Tensor) -> torch.Tensor:
        """A persistent device-tier copy of host tensor ``t`` (weights, buffers, KV)."""
        out = torch.empty(t.shape, dtype=t.dtype, device=self.device)
        out.copy_(t)
        self.memory.add_persistent(out)
        return out

    def empty(self, shape, dtype) -> torch.Tensor:
        """A persistent, zero-filled device-tier buffer."""
        out = torch.zeros(shape, dtype=dtype, device=self.device)
        self.memory.add_persistent(out)
        return out

    def free(self, t: Optional[torch.Tensor]) -> None:
        if t is not None:
            self.memory.release_persistent(t)

    def to_device(self, src: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Explicit host→device copy (h2d lane): into ``out`` or a new device tensor."""
        if out is None:
            out = torch.empty(src.shape, dtype=src.dtype, device=self.device)
        out.copy_(src, non_blocking=self.is_cuda)
        return out

    def to_host(self, src: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Explicit device→host copy (d2h lane): into ``out`` or a new (pinned) host tensor."""
        if out is None:
            out = torch.empty(src.shape, dtype=src.dtype, device="cpu", pin_memory=self.is_cuda)
        out.copy_(src, non_blocking=self.is_cuda)
        return out

    # --- tasks ------------------------------------------------------------------------
    def task_context(self, lane: Lane):
        if self.is_cuda and lane.stream is not None:
            return _CudaTask(lane.stream)
        if self.track_memory and lane.name in DEVICE_LANES:
            return _TransientTracker(self.memory)
        return _NullContext()

    def submit(self, lane: str, name: str, fn: Callable[[], Any], deps=(), **args) -> Task:
        task = Task(lane, name, fn, [d for d in deps if d is not None], args, seq=next(self._seq))
        return self.lanes[lane].submit(task)

    def hold(self) -> None:
        """Stop lanes from starting tasks (the launcher queues a phase, then :meth:`release`)."""
        self.gate.clear()

    def release(self) -> float:
        self.gate.set()
        return time.perf_counter()

    def wait(self, tasks: list[Task]) -> float:
        """Wait for ``tasks`` (the shared unit runs them here, on the caller's thread);
        re-raise the first failure; return the latest end time."""
        if self.unit is not None:
            self.unit.drain()
        return wait_all(tasks)

    def peak_bytes(self) -> int:
        """Peak device-tier bytes: on CUDA the allocator's peak less what was live when the tier
        opened (so memory other executors or the caller hold is not this plan's); the tracked
        peak when emulated."""
        if self.is_cuda:
            return int(torch.cuda.max_memory_allocated(self.device)) - self.baseline_bytes
        return int(self.memory.peak_bytes)

    def close(self) -> None:
        for lane in self.lanes.values():
            lane.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class _CudaTask:
    """Runs a task on its lane's stream and waits for it, so that wall-clock start/end and
    cross-lane dependencies hold for the GPU work too."""

    def __init__(self, stream):
        self.stream = stream
        self._ctx = torch.cuda.stream(stream)

    def __enter__(self):
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
        self.stream.synchronize()
        return False


def wait_all(tasks: list[Task]) -> float:
    """Wait for ``tasks``; re-raise the first failure; return the latest end time."""
    end = 0.0
    for task in tasks:
        task.done.wait()
    for task in tasks:
        if task.error is not None:
            err = task.error
            while isinstance(err, RuntimeError) and err.__cause__ is not None and "dependency" in str(err):
                err = err.__cause__
            if isinstance(err, HRMError):
                raise err
            raise RuntimeError(f"task {task.name} on lane {task.lane} failed: {err!r}") from err
        end = max(end, task.end_s)
    return end
