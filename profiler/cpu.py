"""CPU measurements: host facts, STREAM-like bandwidth, matmul curves, decode attention, disk.

Byte counting (as STREAM does): copy ``b = a`` counts 2 x 8 bytes per element (one read,
one write), triad ``a = b + s*c`` counts 3 x 8 bytes (two reads, one write). The extra
read-for-ownership a cached store causes (write-allocate) is *not* counted, so numbers are
comparable with published STREAM results; non-temporal stores (used by large memcpy) avoid
it anyway. All cores work: numpy releases the GIL inside copies and ufuncs, so a thread
pool over contiguous chunks drives every core.
"""

from __future__ import annotations

import os
import platform
import socket
import tempfile
import time
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from hrm.units import GB, GIB, KIB, MIB

from .timing import Budget, Stats, TimedOp, describe, measure, wall_timed

F64_BYTES = 8
F32_BYTES = 4
TRIAD_SCALAR = 3.0
TRIAD_BLOCK_ELEMS = 1 << 15  # 256 KiB of float64: the triad's temporary stays in L2


@dataclass(frozen=True)
class HostInfo:
    """Static facts of the machine (no timing)."""

    hostname: str
    cpu_name: str
    cores: int
    memory_gib: float
    llc_bytes: int
    numa_nodes: int = 1


@dataclass(frozen=True)
class Measured:
    """One measured number with its statistics and how it was obtained."""

    value: float
    unit: str
    stats: Stats
    how: str

    def method(self) -> str:
        """Method note for ``source.methods``: how + repeats, median, spread."""
        return f"{self.how}; {describe(self.stats, self.value, self.unit)}"


# --- host facts ----------------------------------------------------------------------

def _read_text(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def cpu_model_name(cpuinfo_text: str) -> str:
    """The ``model name`` of /proc/cpuinfo, else the platform's processor string."""
    for line in cpuinfo_text.splitlines():
        if line.lower().startswith("model name") and ":" in line:
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def usable_cores() -> int:
    """CPUs this process may run on (affinity), falling back to os.cpu_count()."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def memory_total_bytes(meminfo_text: str) -> int:
    """MemTotal of /proc/meminfo in bytes, else sysconf pages x page size."""
    for line in meminfo_text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 * GIB


def parse_cache_size_bytes(text: str) -> int:
    """``32768K`` / ``8M`` (sysfs cache size) to bytes; 0 when unparsable."""
    text = text.strip().upper()
    scale = {"K": KIB, "M": MIB, "G": GIB}
    try:
        if text and text[-1] in scale:
            return int(text[:-1]) * scale[text[-1]]
        return int(text)
    except ValueError:
        return 0


def last_level_cache_bytes() -> int:
    """Largest cache of cpu0 from sysfs; 32 MiB when unknown."""
    sizes = [parse_cache_size_bytes(_read_text(str(p)))
             for p in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size")]
    return max(sizes, default=0) or 32 * MIB


def host_info() -> HostInfo:
    """Collect the host facts that go into the ``cpu`` section."""
    return HostInfo(
        hostname=socket.gethostname(),
        cpu_name=cpu_model_name(_read_text("/proc/cpuinfo")),
        cores=usable_cores(),
        memory_gib=memory_total_bytes(_read_text("/proc/meminfo")) / GIB,
        llc_bytes=last_level_cache_bytes(),
        numa_nodes=numa_node_count(),
    )


NUMA_NODE_DIR = "/sys/devices/system/node"


def numa_node_count(root: str | Path = NUMA_NODE_DIR) -> int:
    """NUMA nodes the OS reports: the ``node<N>`` directories of sysfs; 1 where there are none
    (no sysfs, a kernel without NUMA)."""
    try:
        nodes = [p for p in Path(root).glob("node*") if p.name[4:].isdigit() and p.is_dir()]
    except OSError:
        return 1
    return max(1, len(nodes))


#: STREAM's own rule for its arrays: "each array must be at least 4 times the size of the
#: available cache memory" (J. McCalpin, STREAM FAQ / stream.c header); the full profile uses
#: twice that for margin, --quick the rule itself
STREAM_LLC_MULTIPLE = 4


def stream_array_bytes(llc_bytes: int, memory_gib: float, llc_multiple: int = 2 * STREAM_LLC_MULTIPLE) -> int:
    """One STREAM array: ``llc_multiple`` x the last-level cache, >= 256 MiB, <= 1/16 of RAM."""
    wanted = max(llc_multiple * llc_bytes, 256 * MIB)
    return int(min(wanted, memory_gib * GIB / 16))


def stocked_arrays(n_elems: int, count: int, pool: Executor | None, threads: int,
                   stock: list[np.ndarray] | None) -> list[np.ndarray]:
    """``count`` touched float64 arrays of ``n_elems``: those of ``stock`` with that size first
    (the STREAM, memcpy and DRAM-read steps stream the same size, so each reuses the pages the
    last one faulted in), new ones for the rest, added to ``stock``. The values are any
    finite numbers: the steps time copies, sums and triads, never read a result."""
    if stock is None:
        return [touched_array(n_elems, 1.0, pool=pool, threads=threads) for _ in range(count)]
    have = [a for a in stock if a.size == n_elems and a.dtype == np.float64][:count]
    while len(have) < count:
        have.append(touched_array(n_elems, 1.0, pool=pool, threads=threads))
        stock.append(have[-1])
    return have


# --- STREAM-like bandwidth -----------------------------------------------------------

def chunk_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """Split ``range(n)`` into ``parts`` contiguous nearly equal (start, stop) pieces."""
    parts = max(1, min(parts, n))
    edges = np.linspace(0, n, parts + 1).astype(np.int64)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def touched_array(n_elems: int, value: float, dtype=np.float64, pool: Executor | None = None,
                  threads: int = 1) -> np.ndarray:
    """An array whose pages are all faulted in (np.empty + fill), so timing sees no page faults.
    With ``pool``, each of ``threads`` workers fills the chunk it will later stream (STREAM's
    own parallel initialisation: first touch places a page on the toucher's NUMA node, and
    the faults are taken by every core, not one)."""
    array = np.empty(n_elems, dtype=dtype)
    if pool is None or threads <= 1:
        array.fill(value)
        return array

    def fill(bound: tuple[int, int]) -> None:
        array[bound[0]:bound[1]].fill(value)

    list(pool.map(fill, chunk_bounds(n_elems, threads)))
    return array


def copy_op(src: np.ndarray, dst: np.ndarray, pool: Executor, threads: int) -> TimedOp:
    """``dst[:] = src`` split over ``threads`` pool workers (one chunk each)."""
    bounds = chunk_bounds(src.size, threads)

    def one(bound: tuple[int, int]) -> None:
        start, stop = bound
        np.copyto(dst[start:stop], src[start:stop])

    return wall_timed(lambda: list(pool.map(one, bounds)))


def triad_op(a: np.ndarray, b: np.ndarray, c: np.ndarray, pool: Executor, threads: int,
             block_elems: int = TRIAD_BLOCK_ELEMS) -> TimedOp:
    """``a = b + s*c`` split over threads; each thread walks its chunk in L2-sized blocks so
    ``s*c`` lands in a cache-resident temporary and memory sees exactly 2 reads + 1 write."""
    bounds = chunk_bounds(a.size, threads)

    def one(bound: tuple[int, int]) -> None:
        tmp = np.empty(block_elems, dtype=a.dtype)
        for start in range(bound[0], bound[1], block_elems):
            stop = min(start + block_elems, bound[1])
            part = tmp[: stop - start]
            np.multiply(c[start:stop], TRIAD_SCALAR, out=part)
            np.add(part, b[start:stop], out=a[start:stop])

    return wall_timed(lambda: list(pool.map(one, bounds)))


@dataclass(frozen=True)
class StreamResult:
    copy: Measured
    triad: Measured
    copy_curve: dict[int, Measured]  # array bytes -> copy GB/s


def measure_stream(array_bytes: int, curve_sizes_bytes: tuple[int, ...], threads: int, pool: Executor,
                   warmup: int, repeats: int, budget: Budget | None,
                   stock: list[np.ndarray] | None = None) -> StreamResult:
    """Copy and triad GB/s over three ``array_bytes`` float64 arrays, plus copy GB/s for
    each (smaller) size of ``curve_sizes_bytes`` using prefixes of the same arrays
    (``stock``: :func:`stocked_arrays`)."""
    n = max(threads, array_bytes // F64_BYTES)
    a, b, c = stocked_arrays(n, 3, pool, threads, stock)
    mib = n * F64_BYTES / MIB
    copy_stats = measure(copy_op(a, b, pool, threads), warmup, repeats, budget)
    copy_bytes = 2 * n * F64_BYTES
    copy = Measured(copy_stats.median_rate(copy_bytes) / GB, "GB/s", copy_stats,
                    f"STREAM copy b=a, float64, {mib:.0f} MiB per array, {threads} threads; "
                    f"bytes = read + write (16 B/element), write-allocate not counted")
    triad_stats = measure(triad_op(a, b, c, pool, threads), warmup, repeats, budget)
    triad_bytes = 3 * n * F64_BYTES
    triad = Measured(triad_stats.median_rate(triad_bytes) / GB, "GB/s", triad_stats,
                     f"STREAM triad a=b+s*c, float64, {mib:.0f} MiB per array, {threads} threads, "
                     f"L2-blocked temporary; bytes = 2 reads + 1 write (24 B/element), "
                     f"write-allocate not counted")
    curve: dict[int, Measured] = {}
    for size_bytes in sorted(s for s in curve_sizes_bytes if s < n * F64_BYTES):
        if budget is not None and budget.expired():
            break
        m = max(threads, size_bytes // F64_BYTES)
        stats = measure(copy_op(a[:m], b[:m], pool, threads), warmup, repeats, budget)
        curve[m * F64_BYTES] = Measured(stats.median_rate(2 * m * F64_BYTES) / GB, "GB/s", stats,
                                        "copy b=a over a prefix")
    curve[n * F64_BYTES] = copy
    return StreamResult(copy=copy, triad=triad, copy_curve=curve)


# --- host memcpy (one thread vs all threads) -----------------------------------------

@dataclass(frozen=True)
class MemcpyResult:
    """Bytes *moved* per second by a large host copy (each byte counted once, not read +
    write): on one thread, and split over all threads (the DRAM roof of a copy)."""

    one_thread: Measured
    all_threads: Measured


def measure_memcpy(nbytes: int, threads: int, pool: Executor, warmup: int, repeats: int,
                   budget: Budget | None, stock: list[np.ndarray] | None = None) -> MemcpyResult:
    """``dst[:] = src`` of two ``nbytes`` float64 arrays (pages faulted in beforehand): once
    with ``np.copyto`` on the calling thread (numpy copies on one thread), once split into
    ``threads`` contiguous chunks over the pool. Rate = bytes copied / time."""
    n = max(threads, nbytes // F64_BYTES)
    src, dst = stocked_arrays(n, 2, pool, threads, stock)
    size = n * F64_BYTES
    what = f"host memcpy dst[:] = src, {size / MIB:.0f} MiB float64 (numpy copyto)"
    counted = "bytes moved per second (each byte copied counted once, not read + write)"
    one_stats = measure(wall_timed(lambda: np.copyto(dst, src)), warmup, repeats, budget)
    one = Measured(one_stats.median_rate(size) / GB, "GB/s", one_stats, f"{what} on 1 thread; {counted}")
    all_stats = measure(copy_op(src, dst, pool, threads), warmup, repeats, budget)
    all_threads = Measured(all_stats.median_rate(size) / GB, "GB/s", all_stats,
                           f"{what} split into {threads} contiguous chunks over {threads} threads; {counted}")
    return MemcpyResult(one_thread=one, all_threads=all_threads)


# --- host DRAM read with every core ---------------------------------------------------

def read_op(src: np.ndarray, pool: Executor, threads: int) -> TimedOp:
    """Every byte of ``src`` read once: ``np.add.reduce`` of one contiguous chunk per pool
    worker (numpy releases the GIL inside the reduction, so every core streams)."""
    bounds = chunk_bounds(src.size, threads)

    def one(bound: tuple[int, int]) -> None:
        np.add.reduce(src[bound[0]:bound[1]])

    return wall_timed(lambda: list(pool.map(one, bounds)))


def measure_dram_read(nbytes: int, threads: int, pool: Executor, warmup: int, repeats: int,
                      budget: Budget | None, stock: list[np.ndarray] | None = None) -> Measured:
    """Host DRAM read rate with every core: bytes read per second of a ``nbytes`` float64
    array (pages faulted in beforehand; size well above the last-level cache). What the
    DMA engine and CPU attention do to DRAM is reads: a copy's write half (STREAM copy)
    understates it on hosts whose stores are slower."""
    n = max(threads, nbytes // F64_BYTES)
    (src,) = stocked_arrays(n, 1, pool, threads, stock)
    stats = measure(read_op(src, pool, threads), warmup, repeats, budget)
    return Measured(stats.median_rate(n * F64_BYTES) / GB, "GB/s", stats,
                    f"host DRAM read, np.add.reduce over {n * F64_BYTES / MIB:.0f} MiB float64 split into {threads} "
                    f"contiguous chunks over {threads} threads; bytes read per second")


# --- per-op cost of an eager framework on CPU tensors --------------------------------

#: ops timed back to back per sample (a tiny op is ~1-10 us: one sample is a few ms)
OPS_PER_SAMPLE = 2000


def measure_cpu_op(torch, warmup: int, repeats: int, budget: Budget | None,
                   ops: int = OPS_PER_SAMPLE) -> Measured:
    """Seconds per eager torch op on a small CPU tensor (``c.add_(1)`` on 16 float32
    elements, ``ops`` in a row per sample): the Python argument parsing, the dispatcher and
    the op itself — what an engine's CPU-attention thread pays per op beside its FLOPs."""
    tensor = torch.zeros(16)

    def run() -> None:
        for _ in range(ops):
            tensor.add_(1)

    stats = measure(wall_timed(run), warmup, repeats, budget)
    seconds = stats.median_s / ops
    return Measured(seconds, "s", stats, f"eager torch {torch.__version__} op on a CPU tensor: "
                    f"c.add_(1), 16 float32 elements, {ops} ops per sample, wall time / {ops}")


# --- matmul --------------------------------------------------------------------------

MatmulFactory = Callable[[int], TimedOp]  # M -> timed op of one (M x K) @ (K x N)


def numpy_matmul_factory(k: int, n: int) -> MatmulFactory:
    """fp32 matmuls through numpy's BLAS (multi-threaded by the BLAS itself)."""
    weight = touched_array(k * n, 0.01, np.float32).reshape(k, n)

    def make(m: int) -> TimedOp:
        x = touched_array(m * k, 0.02, np.float32).reshape(m, k)
        out = np.empty((m, n), dtype=np.float32)
        return wall_timed(lambda: np.matmul(x, weight, out=out))

    return make


def torch_matmul_factory(torch, k: int, n: int, dtype: str) -> MatmulFactory:
    """CPU matmuls through torch in ``dtype`` (bf16/fp16/fp32)."""
    tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    weight = torch.full((k, n), 0.01, dtype=tdtype)

    def make(m: int) -> TimedOp:
        x = torch.full((m, k), 0.02, dtype=tdtype)
        out = torch.empty((m, n), dtype=tdtype)
        return wall_timed(lambda: torch.matmul(x, weight, out=out))

    return make


def fits_budget(last_m: int, last_median_s: float, next_m: int, samples: int, budget: Budget | None) -> bool:
    """Whether ``samples`` runs of the next (larger) matmul, predicted linear in M from the
    last point, fit in what is left of the budget. A slow dtype (e.g. bf16 on a CPU without
    bf16 units) then stops early instead of overrunning the run."""
    if budget is None:
        return True
    return last_median_s * (next_m / last_m) * samples <= budget.remaining_s()


def measure_matmul_curve(factory: MatmulFactory, ms: tuple[int, ...], k: int, n: int, warmup: int,
                         repeats: int, budget: Budget | None, how: str) -> dict[int, Measured]:
    """Achieved TFLOP/s (2*M*K*N FLOPs per matmul) for each M; stops early (keeping at least
    the first point) once the budget is spent or the next point would not fit in it."""
    curve: dict[int, Measured] = {}
    for m in sorted(ms):
        if curve:
            last_m, last = max(curve.items())
            if not fits_budget(last_m, last.stats.median_s, m, warmup + 2, budget):
                break
        stats = measure(factory(m), warmup, repeats, budget)
        flops = 2.0 * m * k * n
        curve[m] = Measured(stats.median_rate(flops) / 1e12, "TFLOP/s", stats,
                            f"{how}, ({m} x {k}) @ ({k} x {n}), 2*M*K*N FLOPs")
    return curve


def best_of(curve: dict[int, Measured]) -> tuple[int, Measured]:
    """The (x, point) with the highest value: peak = best point of the curve."""
    return max(curve.items(), key=lambda item: item[1].value)


# --- decode attention ----------------------------------------------------------------

def attention_flops(batch: int, context: int, kv_heads: int, group: int, head_dim: int) -> float:
    """QK^T and PV: 2*c*d FLOPs each per query head per sequence (as hrm.cost.costs counts)."""
    return 4.0 * batch * kv_heads * group * head_dim * context


def attention_kv_bytes(batch: int, context: int, kv_heads: int, head_dim: int, elem_bytes: int) -> float:
    """K and V cache bytes read by one decode step."""
    return 2.0 * batch * kv_heads * context * head_dim * elem_bytes


ATTENTION_CHUNK_TOKENS = 256  # (4 x 128) @ (128 x 256) stays below BLAS multi-threading thresholds


def attention_op(batch: int, context: int, kv_heads: int, group: int, head_dim: int,
                 pool: Executor, threads: int, chunk: int = ATTENTION_CHUNK_TOKENS) -> TimedOp:
    """One GQA decode step in fp32 numpy: each of ``group`` query heads per kv head attends
    over ``context`` cached tokens. Sequences are split over the thread pool; within a thread
    the cache is walked in ``chunk``-token blocks so every BLAS call is small and runs on that
    thread alone (no BLAS threads on top of the pool: oversubscribing cores halves throughput)."""
    q = touched_array(batch * kv_heads * group * head_dim, 0.01, np.float32).reshape(batch, kv_heads, group, head_dim)
    keys = touched_array(batch * kv_heads * context * head_dim, 0.01, np.float32).reshape(
        batch, kv_heads, context, head_dim)
    values = touched_array(keys.size, 0.02, np.float32).reshape(keys.shape)
    out = np.empty((batch, kv_heads, group, head_dim), dtype=np.float32)
    scale = np.float32(1.0 / np.sqrt(head_dim))
    bounds = chunk_bounds(batch, threads)
    blocks = [(start, min(start + chunk, context)) for start in range(0, context, chunk)]

    def one(bound: tuple[int, int]) -> None:
        lo, hi = bound
        scores = np.empty((hi - lo, kv_heads, group, context), dtype=np.float32)
        for start, stop in blocks:  # scores = q K^T
            scores[..., start:stop] = np.matmul(q[lo:hi], keys[lo:hi, :, start:stop].swapaxes(-1, -2))
        scores *= scale
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        acc = out[lo:hi]
        acc.fill(0.0)
        for start, stop in blocks:  # out = P V
            acc += np.matmul(scores[..., start:stop], values[lo:hi, :, start:stop])

    return wall_timed(lambda: list(pool.map(one, bounds)))


def measure_decode_attention(contexts: tuple[int, ...], kv_total_bytes: int, kv_heads: int, group: int,
                             head_dim: int, threads: int, pool: Executor, *, warmup: int, repeats: int,
                             budget: Budget | None) -> dict[int, Measured]:
    """KV-cache read GB/s of decode attention for each context; the batch is chosen so the
    cache is ``kv_total_bytes`` (far beyond the caches). GFLOP/s goes into the note."""
    curve: dict[int, Measured] = {}
    per_seq_token_bytes = 2 * kv_heads * head_dim * F32_BYTES
    for context in sorted(contexts):
        if curve and budget is not None and budget.expired():
            break
        batch = max(threads, int(kv_total_bytes // (per_seq_token_bytes * context)))
        stats = measure(attention_op(batch, context, kv_heads, group, head_dim, pool, threads),
                        warmup, repeats, budget)
        kv_bytes = attention_kv_bytes(batch, context, kv_heads, head_dim, F32_BYTES)
        gflops = stats.median_rate(attention_flops(batch, context, kv_heads, group, head_dim)) / 1e9
        curve[context] = Measured(
            stats.median_rate(kv_bytes) / GB, "GB/s", stats,
            f"GQA decode attention fp32 numpy (blocked over {ATTENTION_CHUNK_TOKENS}-token chunks), batch "
            f"{batch}, context {context}, {kv_heads} kv heads x {group} q/kv, head_dim {head_dim}, "
            f"{threads} threads; KV bytes read / time "
            f"({gflops:.1f} GFLOP/s)")
    return curve


# --- disk ----------------------------------------------------------------------------

def drop_file_cache(fd: int) -> bool:
    """Ask the kernel to drop the file's cached pages; False where unsupported."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return False
    try:
        advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except OSError:
        return False


def read_file_op(path: Path, block_bytes: int) -> TimedOp:
    """Read ``path`` sequentially (page cache dropped before each read)."""
    buffer = bytearray(block_bytes)

    def op() -> float:
        fd = os.open(path, os.O_RDONLY)
        try:
            drop_file_cache(fd)
            start_s = time.perf_counter()
            with os.fdopen(fd, "rb", buffering=0, closefd=False) as handle:
                while handle.readinto(buffer):
                    pass
            return time.perf_counter() - start_s
        finally:
            os.close(fd)

    return op


def write_probe_file(folder: Path, nbytes: int, block_bytes: int) -> Path:
    """A file of ``nbytes`` non-zero bytes in ``folder``, fsynced and evicted from the cache."""
    block = np.random.default_rng(0).integers(1, 255, block_bytes, dtype=np.uint8).tobytes()
    fd, name = tempfile.mkstemp(prefix=".hrm-disk-probe.", dir=folder)
    with os.fdopen(fd, "wb") as handle:
        for _ in range(max(1, nbytes // block_bytes)):
            handle.write(block)
        handle.flush()
        os.fsync(handle.fileno())
        drop_file_cache(handle.fileno())
    return Path(name)


def measure_disk_read(folder: Path, nbytes: int, repeats: int, budget: Budget | None,
                      block_bytes: int = 8 * MIB) -> Measured:
    """Sequential read GB/s of a fresh ``nbytes`` file in ``folder`` (no warm-up: a warm-up
    would fill the page cache; the cache is dropped with posix_fadvise before each read)."""
    path = write_probe_file(folder, nbytes, block_bytes)
    try:
        size = path.stat().st_size
        stats = measure(read_file_op(path, block_bytes), 0, repeats, budget)
    finally:
        path.unlink(missing_ok=True)
    how = (f"sequential read of a {size / MIB:.0f} MiB file in {folder}, {block_bytes >> 20} MiB blocks, "
           f"page cache dropped (posix_fadvise DONTNEED) before each read")
    return Measured(stats.median_rate(size) / GB, "GB/s", stats, how)


def optional_torch():
    """The torch module, or None when it is not importable (it is an optional extra)."""
    try:
        import torch  # noqa: PLC0415
    except (ImportError, OSError):
        return None
    return torch
