"""Timing primitives: a timed operation, a time budget, and repeat statistics.

A *timed op* is a zero-argument callable that performs one measured operation and returns
the seconds it took (wall clock on the CPU, CUDA events on a GPU). Everything that
measures goes through :func:`measure`, which does the warm-up, the repeats, and stops
early (after ``min_repeats``) when the budget is spent.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

TimedOp = Callable[[], float]


class Budget:
    """A wall-clock allowance shared by all measurements of one profile run.

    ``clock`` is injectable (tests); it must be monotonic and return seconds.
    """

    def __init__(self, total_s: float, clock: Callable[[], float] = time.monotonic):
        self.total_s = float(total_s)
        self._clock = clock
        self._start_s = clock()

    def elapsed_s(self) -> float:
        """Seconds since the budget was created."""
        return self._clock() - self._start_s

    def remaining_s(self) -> float:
        """Seconds left (never negative)."""
        return max(0.0, self.total_s - self.elapsed_s())

    def expired(self) -> bool:
        """True once the allowance is used up."""
        return self.remaining_s() <= 0.0


@dataclass(frozen=True)
class Stats:
    """Samples (seconds per operation) of one measurement, after warm-up."""

    samples_s: tuple[float, ...]
    warmup: int

    @property
    def repeats(self) -> int:
        return len(self.samples_s)

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)

    def rates(self, work: float) -> list[float]:
        """``work / t`` for every sample (e.g. bytes -> bytes/s, FLOPs -> FLOP/s)."""
        return [work / max(t, 1e-12) for t in self.samples_s]

    def median_rate(self, work: float) -> float:
        """Median of the per-sample rates."""
        return statistics.median(self.rates(work))

    def spread_pct(self) -> float:
        """Repeat-to-repeat spread: (max - min) / median of the samples, in percent."""
        if len(self.samples_s) < 2:
            return 0.0
        return 100.0 * (max(self.samples_s) - min(self.samples_s)) / max(self.median_s, 1e-12)


def measure(op: TimedOp, warmup: int, repeats: int, budget: Budget | None = None,
            min_repeats: int = 2) -> Stats:
    """Run ``op`` ``warmup`` times (discarded) then up to ``repeats`` times.

    Stops after ``min_repeats`` samples once ``budget`` has expired, so a measurement
    always has at least ``min(min_repeats, repeats)`` samples and a spread.
    """
    for _ in range(max(0, warmup)):
        op()
    samples: list[float] = []
    for index in range(max(1, repeats)):
        if budget is not None and index >= min_repeats and budget.expired():
            break
        samples.append(float(op()))
    return Stats(samples_s=tuple(samples), warmup=max(0, warmup))


def wall_timed(func: Callable[[], object]) -> TimedOp:
    """Wrap ``func`` into a timed op measured with ``time.perf_counter``."""

    def op() -> float:
        start_s = time.perf_counter()
        func()
        return time.perf_counter() - start_s

    return op


def describe(stats: Stats, value: float, unit: str) -> str:
    """The statistics part of a method note: repeats, warm-up, median and spread."""
    return (f"median {value:.4g} {unit} of {stats.repeats} repeats after {stats.warmup} warm-up, "
            f"spread {stats.spread_pct():.1f}% ((max-min)/median)")
