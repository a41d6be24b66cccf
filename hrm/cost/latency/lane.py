"""The affine lane (paper §4.2, eq. 12): a resource's or a lane's per-layer time, affine in
the policy's remaining decisions, and the layer time as the max over lanes.

    time = n · per_micro_batch_s + n · (1 − r_c) · per_micro_batch_kv_cpu_s
           + (1 − r_w) · per_layer_offloaded_weights_s + per_layer_s

(the KV-cache terms scale with the CPU-resident KV fraction, the weight pages with the
offloaded weight fraction). The solver uses these same coefficients, so the formulas exist
once. :data:`RESOURCES` run tasks (each a queue); :data:`BOUNDS` are capacity bounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: resources that run tasks (each a queue); ``copy`` and ``dram`` are capacity bounds
RESOURCES = ("gpu", "cpu", "h2d", "d2h")
BOUNDS = ("copy", "dram", "gpu+weights", "gpu+ffn-weights", "gpu+attention-weights")


@dataclass(frozen=True)
class Lane:
    """time = n·per_micro_batch_s + n·(1−r_c)·per_micro_batch_kv_cpu_s
    + (1−r_w)·per_layer_offloaded_weights_s + per_layer_s
    [+ max_j (pieces[j][0] + (1−r_w)·pieces[j][1]): a convex piecewise-linear term in r_w,
    the expert-cache misses of ``offloaded_experts: cached``; :meth:`expanded` turns a lane
    with pieces into one affine lane per piece, whose max is the same time]"""

    name: str
    per_micro_batch_s: np.ndarray | float = 0.0
    per_micro_batch_kv_cpu_s: np.ndarray | float = 0.0
    per_layer_offloaded_weights_s: np.ndarray | float = 0.0
    per_layer_s: np.ndarray | float = 0.0
    pieces: tuple = ()

    def time_s(self, num_micro_batches, weights_gpu_ratio, kv_gpu_ratio):
        """The lane's seconds per layer at (n, r_w, r_c) (arrays broadcast)."""
        n = np.asarray(num_micro_batches, dtype=float)
        offloaded = 1.0 - np.asarray(weights_gpu_ratio, dtype=float)
        time = (
            n * self.per_micro_batch_s
            + n * (1.0 - np.asarray(kv_gpu_ratio, dtype=float)) * self.per_micro_batch_kv_cpu_s
            + offloaded * self.per_layer_offloaded_weights_s
            + self.per_layer_s
        )
        if self.pieces:
            time = time + np.max([np.asarray(a) + offloaded * np.asarray(b) for a, b in self.pieces], axis=0)
        return time

    def __add__(self, other: "Lane") -> "Lane":
        if self.pieces and other.pieces:
            raise ValueError("lanes with two piecewise terms cannot be added (their max does not distribute)")
        return Lane(
            f"{self.name}+{other.name}",
            self.per_micro_batch_s + other.per_micro_batch_s,
            self.per_micro_batch_kv_cpu_s + other.per_micro_batch_kv_cpu_s,
            self.per_layer_offloaded_weights_s + other.per_layer_offloaded_weights_s,
            self.per_layer_s + other.per_layer_s,
            self.pieces or other.pieces,
        )

    def renamed(self, name: str) -> "Lane":
        """This lane under another name."""
        return Lane(name, self.per_micro_batch_s, self.per_micro_batch_kv_cpu_s, self.per_layer_offloaded_weights_s,
                    self.per_layer_s, self.pieces)

    def expanded(self) -> list["Lane"]:
        """This lane as affine lanes (one per piece: the piece's terms added) whose max over
        r_w is :meth:`time_s`."""
        if not self.pieces:
            return [self]
        return [Lane(f"{self.name}#{j}", self.per_micro_batch_s, self.per_micro_batch_kv_cpu_s,
                     self.per_layer_offloaded_weights_s + b, self.per_layer_s + a)
                for j, (a, b) in enumerate(self.pieces)]


def sum_lanes(name: str, lanes) -> Lane:
    """The lane ``name`` whose time is the sum of ``lanes``' (one queue running them in turn)."""
    total = Lane(name)
    for lane in lanes:
        total = total + lane
    return total.renamed(name)


def scaled_lane(lane: Lane, factor: float, name: str) -> Lane:
    """``lane``'s affine terms times ``factor``, as the lane ``name`` (no pieces)."""
    return Lane(name, lane.per_micro_batch_s * factor, lane.per_micro_batch_kv_cpu_s * factor,
                lane.per_layer_offloaded_weights_s * factor, lane.per_layer_s * factor)


def expanded_lanes(lanes: list[Lane]) -> list[Lane]:
    """Affine lanes only (:meth:`Lane.expanded`): what eq. 12's max and the solver take."""
    return [piece for lane in lanes for piece in lane.expanded()]


def lanes_time_s(lanes: list[Lane], num_micro_batches, weights_gpu_ratio, kv_gpu_ratio):
    """Layer time = max over lanes (eq. 12)."""
    times = [lane.time_s(num_micro_batches, weights_gpu_ratio, kv_gpu_ratio) for lane in lanes]
    return np.max(np.broadcast_arrays(*times), axis=0)  # a lane without a step axis (disk) broadcasts
