"""Task-level timeline of decode layers for a schedule (paper §4.1, Fig. 6, Algorithm 1).

:mod:`hrm.latency` sums each resource's work into a lane and takes the max over lanes
(eq. 12), which assumes perfect overlap. This module splits the same work into the tasks
of every micro-batch — PreAttn, D1 QKV offload, CPU attention, D2 hidden back, PostAttn
(O projection + MoE FFN), D3 weight pages, D4 KV prefetch — places them on in-order
resource queues in the launch order of the schedule, and list-schedules them with their
data dependencies. The result shows where the pipeline has bubbles; its steady-state
layer period is ≥ the eq. 12 time and equal to it when the pipeline is fully overlapped.

The durations are the ones the lanes sum (a test checks that per resource they add up to
:func:`hrm.latency.decode_resources`), so the picture and the estimate never disagree
about how long a task takes, only about how well tasks overlap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import costs, latency
from .model import ModelSpec
from .policy import Policy
from .rates import Rates
from .units import dtype_bytes

RESOURCES = ("gpu", "cpu", "h2d", "d2h")
#: CGOPipe launches CPU attention this many micro-batches ahead (Algorithm 1, lines 13–16).
LOOKAHEAD = 2


@dataclass(frozen=True)
class TaskTimes:
    """Seconds of each task of one micro-batch in one decode layer (0 = task absent)."""

    pre_attn: float          # GPU: norm + QKV projection
    gpu_attention: float     # GPU: attention core (A_g = 1)
    post_attn: float         # GPU: O projection, router, shared + routed experts (F_g = 1), all-reduce
    cpu_attention: float     # CPU: attention core (A_g = 0)
    cpu_experts: float       # CPU: routed experts (F_g = 0)
    qkv_to_cpu: float        # D1
    hidden_to_gpu: float     # D2 (attention output back)
    ffn_to_cpu: float        # hidden states to CPU experts
    ffn_to_gpu: float        # CPU expert outputs back
    kv_to_gpu: float         # D4: the CPU-resident part of this micro-batch's KV cache
    kv_to_cpu: float         # the new token's K/V written back to the CPU cache
    weight_page: float       # D3: one of the n pages of the next layer's offloaded experts


def decode_task_times(model: ModelSpec, rates: Rates, policy: Policy, context: float, moe: bool = True) -> TaskTimes:
    """Per-task seconds of one micro-batch of ``policy`` at ``context`` cached tokens."""
    mu = float(policy.micro_batch_size)
    attn, ffn = policy.attn_on_gpu, (policy.ffn_on_gpu or not moe)
    ops = costs.decode_layer_ops(model, mu, context, moe)
    ab = dtype_bytes(model.activation_dtype)
    kv_token = costs.kv_bytes_per_token(model)
    rows = latency._expert_rows(model, mu) if moe else mu
    kv_cpu = 1.0 - policy.kv_gpu_ratio
    weights = costs.layer_expert_bytes(model) if (moe and ffn) else 0.0
    return TaskTimes(
        pre_attn=float(latency.gpu_time_s(ops.pre_attn, rates, mu)),
        gpu_attention=float(latency.gpu_time_s(ops.attention, rates)) if attn else 0.0,
        post_attn=float(latency.gpu_time_s(ops.post_attn, rates, mu) + latency.allreduce_time_s(model, rates, mu)
                        + (latency.gpu_time_s(ops.ffn, rates, rows) if ffn else 0.0)),
        cpu_attention=0.0 if attn else float(latency.cpu_time_s(ops.attention, rates)),
        cpu_experts=0.0 if ffn else float(latency.cpu_time_s(ops.ffn, rates, rows)),
        qkv_to_cpu=0.0 if attn else mu * costs.qkv_width(model) * ab / rates.d2h_bytes_s,
        hidden_to_gpu=0.0 if attn else mu * model.attn_out_dim * ab / rates.h2d_bytes_s,
        ffn_to_cpu=0.0 if ffn else mu * model.hidden_size * ab / rates.d2h_bytes_s,
        ffn_to_gpu=0.0 if ffn else mu * model.hidden_size * ab / rates.h2d_bytes_s,
        kv_to_gpu=kv_cpu * mu * context * kv_token / rates.h2d_bytes_s if attn else 0.0,
        kv_to_cpu=kv_cpu * mu * kv_token / rates.d2h_bytes_s if attn else 0.0,
        weight_page=(1.0 - policy.weights_gpu_ratio) * weights / rates.h2d_bytes_s / policy.num_micro_batches,
    )


def resource_totals_s(times: TaskTimes, num_micro_batches: int) -> dict[str, float]:
    """Busy seconds per resource for one layer (what the lanes of eq. 12 hold)."""
    n = num_micro_batches
    return {
        "gpu": n * (times.pre_attn + times.gpu_attention + times.post_attn),
        "cpu": n * (times.cpu_attention + times.cpu_experts),
        "h2d": n * (times.hidden_to_gpu + times.ffn_to_gpu + times.kv_to_gpu + times.weight_page),
        "d2h": n * (times.qkv_to_cpu + times.ffn_to_cpu + times.kv_to_cpu),
    }


@dataclass(frozen=True)
class ScheduledTask:
    resource: str
    name: str
    kind: str
    layer: int
    micro_batch: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Timeline:
    """List-scheduled tasks of ``layers`` consecutive decode layers."""

    schedule: str
    tasks: list[ScheduledTask]
    layer_end_s: list[float]        # when the last task of each layer ends
    lane_bound_s: float             # eq. 12: max over lanes (perfect overlap)
    resource_busy_s: dict[str, float]

    @property
    def layer_period_s(self) -> float:
        """Steady-state time per layer: the spacing of the ends of the two layers before the
        last (the last layer has no next layer to launch ahead into, the first no previous
        one to overlap with)."""
        ends = self.layer_end_s
        if len(ends) >= 3:
            return ends[-2] - ends[-3]
        return ends[-1] - ends[-2] if len(ends) == 2 else ends[-1]

    def window(self, layer: int) -> tuple[float, float]:
        """(start, end) of one layer: from the previous layer's end to its own."""
        start = self.layer_end_s[layer - 1] if layer > 0 else 0.0
        return start, self.layer_end_s[layer]

    def frame(self):
        import pandas as pd

        return pd.DataFrame([t.__dict__ for t in self.tasks])


@dataclass
class _Task:
    resource: str
    name: str
    kind: str
    layer: int
    mb: int
    duration_s: float
    deps: list
    start_s: float | None = None
    end_s: float | None = None


def _build_tasks(times: TaskTimes, n: int, layers: int, schedule: str):
    """Tasks and per-resource launch order for ``schedule`` (the order of Algorithm 1 for
    CGOPipe; FlexGen S4 prefetches the next micro-batch's KV; S3 runs each micro-batch's
    chain back to back)."""
    queues: dict[str, list[_Task]] = {r: [] for r in RESOURCES}
    order: list[_Task] = []  # global launch order (used by the sequential schedule)

    def add(resource, name, kind, i, j, duration, deps):
        # absent tasks (0 s) stay in the queues as joins of their inputs; they are not drawn
        task = _Task(resource, name, kind, i, j, duration, [d for d in deps if d is not None])
        queues[resource].append(task)
        order.append(task)
        return task

    flat = [(i, j) for i in range(layers) for j in range(n)]
    done = {}   # (i, j) -> last task of micro-batch j in layer i
    pages = {}  # layer -> its weight pages (loaded during the previous layer)
    gpu_attention = times.gpu_attention > 0 or times.cpu_attention == 0

    def pre(f, after=None):
        i, j = flat[f]
        p = add("gpu", f"PreAttn L{i} mb{j}", "pre_attn", i, j, times.pre_attn, [done.get((i - 1, j)), after])
        if gpu_attention:
            return p
        q = add("d2h", f"QKV→CPU L{i} mb{j}", "qkv", i, j, times.qkv_to_cpu, [p])
        return add("cpu", f"CPUAttn L{i} mb{j}", "attention", i, j, times.cpu_attention, [q])

    def post(f, ready):
        i, j = flat[f]
        need = [ready, *pages.get(i, [])]
        p = add("gpu", f"PostAttn L{i} mb{j}", "post_attn", i, j, times.post_attn, need)
        if times.cpu_experts > 0:
            a = add("d2h", f"FFN→CPU L{i} mb{j}", "hidden", i, j, times.ffn_to_cpu, [p])
            e = add("cpu", f"CPUExperts L{i} mb{j}", "experts", i, j, times.cpu_experts, [a])
            p = add("h2d", f"FFN→GPU L{i} mb{j}", "hidden", i, j, times.ffn_to_gpu, [e])
        done[(i, j)] = p

    def page(i, j):
        # double buffer: layer i+1's pages overwrite layer i−1's, so they wait for its last PostAttn
        w = add("h2d", f"W L{i + 1} page{j}", "weights", i, j, times.weight_page, [done.get((i - 1, n - 1))])
        pages.setdefault(i + 1, []).append(w)

    if gpu_attention:  # FlexGen S4 (and CGOPipe with A_g = 1): KV of the next micro-batch prefetched
        kv, gpu_attn = {}, {}
        kv[0] = add("h2d", "KV→GPU L0 mb0", "kv", 0, 0, times.kv_to_gpu, [])
        for f, (i, j) in enumerate(flat):
            page(i, j)
            if f + 1 < len(flat):
                ni, nj = flat[f + 1]
                # double buffer: the KV of micro-batch f+1 reuses the buffer of f−1's attention
                kv[f + 1] = add("h2d", f"KV→GPU L{ni} mb{nj}", "kv", ni, nj, times.kv_to_gpu, [gpu_attn.get(f - 1)])
            p = pre(f)
            a = gpu_attn[f] = add("gpu", f"Attn L{i} mb{j}", "attention", i, j, times.gpu_attention, [p, kv[f]])
            add("d2h", f"KV→CPU L{i} mb{j}", "kv", i, j, times.kv_to_cpu, [a])
            post(f, a)
    elif schedule == "flexgen-cpu-attn":  # S3: each micro-batch's chain back to back
        last = None
        for f, (i, j) in enumerate(flat):
            a = pre(f, after=last)  # waits for the previous micro-batch's whole chain
            h = add("h2d", f"Hidden→GPU L{i} mb{j}", "hidden", i, j, times.hidden_to_gpu, [a])
            page(i, j)
            post(f, h)
            last = done[(i, j)]
    else:  # CGOPipe, Algorithm 1: CPU attention launched two micro-batches ahead
        attn = {}
        ahead = min(LOOKAHEAD, len(flat))
        for f in range(ahead):
            attn[f] = pre(f)
        for f, (i, j) in enumerate(flat):
            h = add("h2d", f"Hidden→GPU L{i} mb{j}", "hidden", i, j, times.hidden_to_gpu, [attn[f]])
            page(i, j)
            post(f, h)
            if f + ahead < len(flat):
                attn[f + ahead] = pre(f + ahead)
    if schedule == "sequential":
        for before, after in zip(order, order[1:]):
            after.deps.append(before)
    return queues, order


def _list_schedule(queues: dict[str, list[_Task]]) -> None:
    """Each resource runs its queue in order; a task starts when its resource is free and
    its inputs are done."""
    heads = {r: 0 for r in queues}
    free = {r: 0.0 for r in queues}
    remaining = sum(len(q) for q in queues.values())
    while remaining:
        best = None
        for r, q in queues.items():
            if heads[r] >= len(q):
                continue
            task = q[heads[r]]
            if any(d.end_s is None for d in task.deps):
                continue
            start = max([free[r], *(d.end_s for d in task.deps)])
            if best is None or start < best[0]:
                best = (start, r, task)
        if best is None:
            raise RuntimeError("timeline: dependency cycle in the task order")
        start, r, task = best
        task.start_s, task.end_s = start, start + task.duration_s
        free[r] = task.end_s
        heads[r] += 1
        remaining -= 1


def decode_timeline(model: ModelSpec, rates: Rates, policy: Policy, schedule: str, context: float,
                    layers: int = 4, moe: bool = True) -> Timeline:
    """List-schedule ``layers`` decode layers of ``policy`` under ``schedule``. A CPU-only
    host (one unit, ``rates.shared_unit``) runs everything in sequence, as the estimate does."""
    if schedule not in latency.SCHEDULES:
        raise ValueError(f"unknown schedule {schedule}")
    times = decode_task_times(model, rates, policy, context, moe)
    effective = "sequential" if rates.shared_unit else schedule
    queues, _ = _build_tasks(times, policy.num_micro_batches, layers, effective)
    _list_schedule(queues)
    tasks = [ScheduledTask(t.resource, t.name, t.kind, t.layer, t.mb, t.start_s, t.end_s)
             for q in queues.values() for t in q if t.duration_s > 0]
    ends = [max(t.end_s for t in tasks if t.layer == i) for i in range(layers)]
    resources = latency.decode_resources(model, rates, policy.micro_batch_size, context,
                                         policy.attn_on_gpu, policy.ffn_on_gpu, moe)
    lanes = latency.schedule_lanes(resources, schedule, rates.shared_unit)
    bound = float(latency.lanes_time_s(lanes, policy.num_micro_batches, policy.weights_gpu_ratio, policy.kv_gpu_ratio))
    return Timeline(effective, sorted(tasks, key=lambda t: (t.start_s, t.resource)), ends, bound,
                    resource_totals_s(times, policy.num_micro_batches))


def mid_context(prompt_len: int, gen_len: int) -> float:
    """The mean context over the decode steps (the estimate averages over all of them)."""
    contexts = latency.decode_contexts(prompt_len, gen_len)
    return float(np.mean(contexts)) if len(contexts) else float(prompt_len)
