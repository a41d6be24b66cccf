"""The emulated device tier of a CPU-only host, measured with the runtime's own operators
(``hrm.machine.hardware.Emulation``): torch ``F.linear`` vs rows M and a large torch copy, on the
runtime's intra-op thread count (``runtime.device.EMULATED_THREADS``).

Matmul weights are *cold*: every sample uses the next weight of a pool larger than the
last-level cache, as decode streams each expert's weights once per layer; the same
(M x K) input is reused. Copy: ``dst.copy_(src)`` of a large fp32 tensor; bytes moved per
second is the transfer rate, twice that (read + write) the memory bandwidth.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

from hrm.units import GB, MIB, dtype_bytes

from .cpu import F32_BYTES, Measured
from .timing import Budget, measure

POOL_LLC_MULTIPLE = 4  # weight pool >= 4x the last-level cache (and >= 2 weights)


@dataclass(frozen=True)
class EmulationResult:
    threads: int
    matmul: dict[str, dict[int, Measured]]  # dtype -> M -> TFLOP/s
    copy: Measured  # GB/s moved


@contextmanager
def torch_threads(torch, threads: int):
    """Run the block with ``threads`` intra-op threads, then restore."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def pool_size(weight_bytes: int, llc_bytes: int) -> int:
    """Weights in the cold pool: their total at least POOL_LLC_MULTIPLE x the LLC."""
    return max(2, -(-POOL_LLC_MULTIPLE * llc_bytes // max(weight_bytes, 1)))


def linear_factory(torch, k: int, n: int, pool: int, dtype: str = "fp32") -> Callable[[int], Callable[[], float]]:
    """M -> timed op of ``F.linear(x[M, K], W[N, K])`` in ``dtype`` cycling over ``pool`` weights."""
    import time

    import torch.nn.functional as F

    from runtime.model import torch_dtype

    tdtype = torch_dtype(dtype)
    weights = [torch.full((n, k), 0.01 * (i + 1), dtype=tdtype) for i in range(pool)]
    state = {"i": 0}

    def make(m: int):
        x = torch.full((m, k), 0.02, dtype=tdtype)

        def op() -> float:
            w = weights[state["i"] % pool]
            state["i"] += 1
            start = time.perf_counter()
            F.linear(x, w)
            return time.perf_counter() - start

        return op

    return make


def copy_op(torch, nbytes: int) -> Callable[[], float]:
    import time

    src = torch.full((max(1, nbytes // F32_BYTES),), 1.0, dtype=torch.float32)
    dst = torch.empty_like(src)

    def op() -> float:
        start = time.perf_counter()
        dst.copy_(src)
        return time.perf_counter() - start

    return op


def measure_emulation(torch, threads: int, ms: tuple[int, ...], k: int, n: int, copy_bytes: int, llc_bytes: int, *,
                      warmup: int, repeats: int, budget: Budget | None,
                      dtypes: tuple[str, ...] = ("fp32",)) -> EmulationResult:
    """F.linear curve per dtype (fp32 first; a curve stops early when the budget runs out,
    a later dtype is skipped then) and the copy rate."""
    matmul: dict[str, dict[int, Measured]] = {}
    with torch_threads(torch, threads), torch.no_grad():
        for dtype in sorted(dtypes, key=lambda d: d != "fp32"):
            if matmul and budget is not None and budget.expired():
                break
            make = linear_factory(torch, k, n, pool_size(int(k * n * dtype_bytes(dtype)), llc_bytes), dtype)
            curve: dict[int, Measured] = {}
            for m in sorted(ms):
                if curve and budget is not None and budget.expired():
                    break
                stats = measure(make(m), warmup, repeats, budget)
                curve[m] = Measured(stats.median_rate(2.0 * m * k * n) / 1e12, "TFLOP/s", stats,
                                    f"emulated tier {dtype} F.linear, torch {torch.__version__} ({threads} thread(s)), "
                                    f"({m} x {k}) @ ({n} x {k})^T, cold weights, 2*M*K*N FLOPs")
            matmul[dtype] = curve
        stats = measure(copy_op(torch, copy_bytes), warmup, repeats, budget)
        copy = Measured(stats.median_rate(copy_bytes) / GB, "GB/s", stats,
                        f"emulated tier torch copy_ of {copy_bytes / MIB:.0f} MiB fp32 ({threads} thread(s)); "
                        f"bytes moved per second")
    return EmulationResult(threads, matmul, copy)
