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

The scheduler (:class:`Task`, :class:`TaskQueues`, :func:`list_schedule`) is generic, one
for every engine: :func:`klotski_layer_tasks` builds Klotski's expert-level decode layer
(n batches share each expert load; hot experts prefetched during attention, cold ones on
demand after the gate, computed hot-first) from plain durations, and
:func:`expert_schedule` list-schedules it into a layer period, its lane bound and the
intra-layer bubble between them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import latency
from .model import ModelSpec
from .engine import IDEAL, Engine
from .schedules import get_schedule
from .policy import Policy
from .rates import Rates

RESOURCES = latency.RESOURCES
#: CGOPipe launches CPU attention this many micro-batches ahead (Algorithm 1, lines 13–16).
LOOKAHEAD = 2


@dataclass(frozen=True)
class TaskTime:
    name: str
    resource: str
    kind: str
    seconds: float


def decode_task_times(model: ModelSpec, rates: Rates, policy: Policy, context: float,
                      moe: bool = True, engine: Engine = IDEAL) -> list[TaskTime]:
    """Seconds of each task of one micro-batch (names of :func:`hrm.latency.decode_tasks`;
    "W" is one of the n weight pages). A measured profile's dispatch α is per lane: it is
    spread evenly over the lane's tasks of the micro-batch (its KV part onto the KV task),
    so each resource's total stays the lane's."""
    n, rw, rc = policy.num_micro_batches, policy.weights_gpu_ratio, policy.kv_gpu_ratio
    tasks = [t for t in latency.decode_tasks(model, rates, policy.micro_batch_size, context,
                                             policy.attn_on_gpu, policy.ffn_on_gpu, moe, engine)
             if t.resource in RESOURCES]  # capacity bounds (copy team, DRAM) are not queues
    times = {t.name: float(t.lane.time_s(n, rw, rc)) / n for t in tasks}
    if rates.gpu_dispatch is not None or rates.cpu_dispatch is not None:
        _spread_dispatch(model, rates, policy, tasks, times, moe)
    return [TaskTime(t.name, t.resource, t.kind, times[t.name]) for t in tasks]


def _spread_dispatch(model, rates, policy, tasks, times, moe) -> None:
    rc = policy.kv_gpu_ratio
    ffn = float(policy.ffn_on_gpu) if moe else 1.0
    alpha = latency.decode_dispatch(model, rates, float(policy.micro_batch_size), float(policy.attn_on_gpu), ffn, moe)
    kv_task = {"h2d": "KV→GPU", "d2h": "KV→CPU"}
    for resource, (always, kv) in alpha.items():
        mine = [t.name for t in tasks if t.resource == resource]
        present = [name for name in mine if times[name] > 0] or mine[-1:]
        for name in present:
            times[name] += float(always) / len(present)
        if resource in kv_task:
            times[kv_task[resource]] += (1 - rc) * float(kv)


def resource_totals_s(times: list[TaskTime], num_micro_batches: int) -> dict[str, float]:
    """Busy seconds per resource for one layer (what the lanes of eq. 12 hold)."""
    totals = {r: 0.0 for r in RESOURCES}
    for t in times:
        totals[t.resource] += num_micro_batches * t.seconds
    return totals


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


@dataclass(eq=False)
class Task:
    """One task of a list schedule: it runs ``duration_s`` on ``resource`` once every task of
    ``deps`` has ended and the tasks queued before it on ``resource`` have ended. ``layer``,
    ``micro_batch`` and ``kind`` only label it (for drawing); :func:`list_schedule` sets
    ``start_s`` and ``end_s``. A 0 s task is a join of its inputs."""

    name: str
    resource: str
    duration_s: float
    deps: list[Task] = field(default_factory=list)
    layer: int = 0
    micro_batch: int = 0
    kind: str = "other"
    start_s: float | None = None
    end_s: float | None = None


class TaskQueues:
    """Per-resource in-order queues and the global launch order of the tasks added to them."""

    def __init__(self, resources=RESOURCES):
        self.queues: dict[str, list[Task]] = {r: [] for r in resources}
        self.order: list[Task] = []

    def add(self, name: str, resource: str, duration_s: float, deps=(), **labels) -> Task:
        """Queue a task behind the ones already on ``resource`` (``None`` deps are dropped)
        and return it, so later tasks can depend on it."""
        task = Task(name, resource, float(duration_s), [d for d in deps if d is not None], **labels)
        self.queues.setdefault(resource, []).append(task)
        self.order.append(task)
        return task


def _build_tasks(times: list[TaskTime], n: int, layers: int, schedule: str, gpu_attention: bool, cpu_experts: bool):
    """Tasks and per-resource launch order for ``schedule`` (the order of Algorithm 1 for
    CGOPipe; FlexGen S4 prefetches the next micro-batch's KV; S3 runs each micro-batch's
    chain back to back)."""
    graph = TaskQueues()  # its global launch order is used by the sequential schedule
    spec = {t.name: t for t in times}

    def add(key, i, j, deps, label=None):
        # absent tasks (0 s) stay in the queues as joins of their inputs; they are not drawn
        t = spec[key]
        return graph.add(label or f"{key} L{i} mb{j}", t.resource, t.seconds, deps, layer=i, micro_batch=j, kind=t.kind)

    flat = [(i, j) for i in range(layers) for j in range(n)]
    done = {}   # (i, j) -> last task of micro-batch j in layer i
    pages = {}  # layer -> its weight pages (loaded during the previous layer)

    def pre(f, after=None):
        i, j = flat[f]
        p = add("PreAttn", i, j, [done.get((i - 1, j)), after])
        if gpu_attention:
            return p
        q = add("QKV→CPU", i, j, [p])
        return add("CPUAttn", i, j, [q])

    def post(f, ready):
        i, j = flat[f]
        need = [ready, *pages.get(i, [])]
        p = add("PostAttn", i, j, need)
        if cpu_experts:
            a = add("FFN→CPU", i, j, [p])
            e = add("CPUExperts", i, j, [a])
            p = add("FFN→GPU", i, j, [e])
        done[(i, j)] = p

    def page(i, j):
        # double buffer: layer i+1's pages overwrite layer i−1's, so they wait for its last PostAttn;
        # a pageable weight path first stages the page on the CPU
        stage = add("StageW", i, j, [done.get((i - 1, n - 1))], f"StageW L{i + 1} page{j}") if "StageW" in spec else None
        w = add("W", i, j, [done.get((i - 1, n - 1)), stage], f"W L{i + 1} page{j}")
        pages.setdefault(i + 1, []).append(w)

    if gpu_attention:  # FlexGen S4 (and CGOPipe with A_g = 1): KV of the next micro-batch prefetched
        kv, gpu_attn = {}, {}
        kv[0] = add("KV→GPU", 0, 0, [])
        for f, (i, j) in enumerate(flat):
            page(i, j)
            if f + 1 < len(flat):
                ni, nj = flat[f + 1]
                # double buffer: the KV of micro-batch f+1 reuses the buffer of f−1's attention
                kv[f + 1] = add("KV→GPU", ni, nj, [gpu_attn.get(f - 1)])
            p = pre(f)
            a = gpu_attn[f] = add("GPUAttn", i, j, [p, kv[f]])
            add("KV→CPU", i, j, [a])
            post(f, a)
    elif get_schedule(schedule).order == "chain":  # S3: each micro-batch's chain back to back
        last = None
        for f, (i, j) in enumerate(flat):
            a = pre(f, after=last)  # waits for the previous micro-batch's whole chain
            h = add("Hidden→GPU", i, j, [a])
            page(i, j)
            post(f, h)
            last = done[(i, j)]
    else:  # CGOPipe, Algorithm 1: CPU attention launched two micro-batches ahead
        attn = {}
        ahead = min(LOOKAHEAD, len(flat))
        for f in range(ahead):
            attn[f] = pre(f)
        for f, (i, j) in enumerate(flat):
            h = add("Hidden→GPU", i, j, [attn[f]])
            page(i, j)
            post(f, h)
            if f + ahead < len(flat):
                attn[f + ahead] = pre(f + ahead)
    if get_schedule(schedule).order == "serial":
        for before, after in zip(graph.order, graph.order[1:]):
            after.deps.append(before)
    return graph.queues, graph.order


def list_schedule(queues: dict[str, list[Task]]) -> float:
    """Set every task's start and end and return the makespan. Each resource runs its queue
    in order; a task starts when its resource is free and its inputs are done; of the
    resources whose head task is ready, the one that can start earliest goes first (ties:
    the resource listed first). One scheduler for every engine's task graph."""
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
    return max(free.values(), default=0.0)


def scheduled_tasks(queues: dict[str, list[Task]]) -> list[ScheduledTask]:
    """The scheduled tasks that take time (joins left out), in order of start."""
    tasks = [ScheduledTask(t.resource, t.name, t.kind, t.layer, t.micro_batch, t.start_s, t.end_s)
             for q in queues.values() for t in q if t.duration_s > 0]
    return sorted(tasks, key=lambda t: (t.start_s, t.resource))


def layer_ends_s(queues: dict[str, list[Task]], layers: int) -> list[float]:
    """When the last task of each layer ends."""
    ends = [0.0] * layers
    for t in (t for q in queues.values() for t in q):
        ends[t.layer] = max(ends[t.layer], t.end_s)
    return ends


def decode_timeline(model: ModelSpec, rates: Rates, policy: Policy, schedule: str | Engine, context: float,
                    layers: int = 4, moe: bool = True) -> Timeline:
    """List-schedule ``layers`` decode layers of ``policy`` under ``schedule`` (a schedule
    name of engine ideal, or an engine). A CPU-only host (one unit, ``rates.shared_unit``)
    runs everything in sequence, as the estimate does."""
    engine = schedule if isinstance(schedule, Engine) else IDEAL.with_schedule(schedule)
    schedule = engine.schedule
    if get_schedule(schedule).pipeline == "expert-level":  # Klotski: its own expert-level task graph
        from .klotski import policy_timeline

        return policy_timeline(model, rates, policy, engine, context, layers)
    times = decode_task_times(model, rates, policy, context, moe, engine)
    effective = "sequential" if rates.shared_unit else schedule
    cpu_experts = moe and not policy.ffn_on_gpu
    queues, _ = _build_tasks(times, policy.num_micro_batches, layers, effective, policy.attn_on_gpu, cpu_experts)
    list_schedule(queues)
    tasks = scheduled_tasks(queues)
    ends = [max(t.end_s for t in tasks if t.layer == i) for i in range(layers)]
    resources = latency.decode_resources(model, rates, policy.micro_batch_size, context,
                                         policy.attn_on_gpu, policy.ffn_on_gpu, moe, engine)
    lanes = latency.schedule_lanes(resources, engine, rates.shared_unit)
    bound = float(latency.lanes_time_s(lanes, policy.num_micro_batches, policy.weights_gpu_ratio, policy.kv_gpu_ratio))
    return Timeline(effective, tasks, ends, bound, resource_totals_s(times, policy.num_micro_batches))


#: KV buffers a host-resident cache of Klotski is loaded into (Algorithm 1 lines 13-14: batch
#: k+1's cache loads while batch k computes)
KV_BUFFERS = 2

#: Klotski's expert compute orders: hot experts first (each over all batches), then the cold
#: ones in load order (paper §5); or batch by batch in the router's order, cold listed first
#: (the strawman of Fig. 7(c), whose GPU stalls on a cold expert while a hot one could run).
KLOTSKI_ORDERS = ("hot-first", "as-routed")


def _check_klotski(num_batches, durations_s, experts, layers, order, expert_buffers) -> None:
    if int(num_batches) != num_batches or num_batches < 1:
        raise ValueError(f"num_batches must be a positive integer, not {num_batches!r}")
    if int(layers) != layers or layers < 1:
        raise ValueError(f"layers must be a positive integer, not {layers!r}")
    if int(expert_buffers) != expert_buffers or expert_buffers < 1:
        raise ValueError(f"expert_buffers must be a positive integer, not {expert_buffers!r}")
    if order not in KLOTSKI_ORDERS:
        raise ValueError(f"order must be one of {', '.join(KLOTSKI_ORDERS)}, not {order!r}")
    for value in [*durations_s, *(x for pair in experts for x in pair)]:
        if not (np.isfinite(value) and value >= 0):
            raise ValueError(f"durations must be finite and ≥ 0 s, not {value!r}")


def klotski_layer_tasks(num_batches: int, attention_s: float, gate_s: float,
                        hot_experts: list[tuple[float, float]], cold_experts: list[tuple[float, float]],
                        layers: int = 6, order: str = "hot-first", prefetch_hot: bool = True,
                        gate_load_s: float = 0.0, attention_load_s: float = 0.0,
                        expert_buffers: int = 1, kv_load_s: float = 0.0, kv_store_s: float = 0.0) -> TaskQueues:
    """The task graph of ``layers`` Klotski decode layers (paper §5, Fig. 9, Algorithm 1) on
    the queues "gpu" (attention, gate, expert compute) and "h2d" (weight loads), for
    :func:`list_schedule`.

    Each expert is a ``(load_s, compute_s)`` pair: one CPU→GPU load per layer shared by the
    ``num_batches`` batches, and ``compute_s`` per batch (every batch routes tokens to
    every listed expert). ``attention_s`` and ``gate_s`` are per batch. Per layer the GPU
    runs attention of every batch, then the gate of every batch, then the experts in
    ``order`` (hot-first: one task per expert over all batches). The link loads, in this
    order: the attention weights (``attention_load_s``, double-buffered: during the previous
    layer's experts), the gate weights and the hot
    experts (prefetched: from the layer's start, during attention; after the first gate if
    not ``prefetch_hot``), then the cold experts on demand after the first gate (the first
    batch's gate selects them). An expert's compute for batch b waits for its load and
    batch b's gate; attention of batch b for its experts of the layer before.

    Buffer assumption: the GPU holds the gate and experts of ``expert_buffers`` layers; a
    layer's prefetch waits until the experts of the layer ``expert_buffers`` back have all
    been computed (1, Fig. 9: prefetch during the layer's own attention; 2: double-buffered
    slots, the next layer's hot experts load as soon as this layer's cold ones are in).

    A host-resident KV cache (``kv_load_s`` > 0, per batch): each batch's cache is loaded
    before its attention into one of two buffers (Algorithm 1 lines 13-14: batch k+1's cache
    loads while batch k computes; a load waits for the attention two batches back to free
    its buffer), and its new entries are stored back after it (``kv_store_s``, lines 16-17,
    on the "d2h" queue). The link takes the transfers in the order the host issues them
    (one copy engine per direction): the first batch's cache with the attention weights
    during the layer before (line 6), then the gate and hot experts at the layer's start,
    then the other batches' caches one by one, then the cold experts."""
    experts = [*hot_experts, *cold_experts]
    _check_klotski(num_batches, (attention_s, gate_s, gate_load_s, attention_load_s, kv_load_s, kv_store_s), experts,
                   layers, order, expert_buffers)
    graph = TaskQueues(("gpu", "h2d", "d2h"))
    n, hot = int(num_batches), len(hot_experts)
    last_gpu: list[Task] = []          # per layer: its last GPU task (its experts are then all computed)
    last_attention: list[Task] = []    # per layer: its last attention task
    batch_done: list[Task | None] = [None] * n  # per batch: its last expert of the layer before

    def load(name, i, seconds, deps):
        return graph.add(f"{name} L{i}", "h2d", seconds, deps, layer=i, micro_batch=-1, kind="weights")

    attended: list[Task] = []          # every attention so far, in order (KV buffer reuse)

    def kv_load(i, b):
        if not kv_load_s:
            return None
        buffer_free = attended[-KV_BUFFERS] if len(attended) >= KV_BUFFERS else None
        return graph.add(f"KV L{i} b{b}", "h2d", kv_load_s, [buffer_free], layer=i, micro_batch=b, kind="kv")

    def attend(i, b, deps):
        task = graph.add(f"Attn L{i} b{b}", "gpu", attention_s, deps, layer=i, micro_batch=b, kind="attention")
        attended.append(task)
        if kv_store_s:
            graph.add(f"KV→CPU L{i} b{b}", "d2h", kv_store_s, [task], layer=i, micro_batch=b, kind="kv")
        return task

    for i in range(layers):
        freed = last_gpu[i - expert_buffers] if i >= expert_buffers else None
        attention_w = load("AttnW", i, attention_load_s, [last_attention[i - 2] if i >= 2 else None])
        first_kv = kv_load(i, 0)
        gate_w = load("GateW", i, gate_load_s, [freed])
        loads = [load(f"Hot{e}", i, hot_experts[e][0], [freed]) for e in range(hot)] if prefetch_hot else []
        attention = []
        for b in range(n):
            kv = first_kv if b == 0 else kv_load(i, b)
            attention.append(attend(i, b, [attention_w, batch_done[b], kv]))
        gates = [graph.add(f"Gate L{i} b{b}", "gpu", gate_s, [attention[b], gate_w], layer=i, micro_batch=b,
                           kind="post_attn") for b in range(n)]
        if not prefetch_hot:
            loads += [load(f"Hot{e}", i, hot_experts[e][0], [gates[0], freed]) for e in range(hot)]
        loads += [load(f"Cold{e}", i, cold_experts[e][0], [gates[0], freed]) for e in range(len(cold_experts))]
        batch_done = list(gates)  # a layer without experts ends with its gates
        names = [f"Hot{e}" for e in range(hot)] + [f"Cold{e}" for e in range(len(cold_experts))]
        if order == "hot-first":
            # expert by expert, hot ones first, each one call over every batch's tokens (its
            # per-batch tasks would run back to back anyway: every gate precedes it on the GPU)
            for e in range(len(experts)):
                task = graph.add(f"{names[e]} L{i}", "gpu", n * experts[e][1], [loads[e], *gates], layer=i,
                                 micro_batch=-1, kind="post_attn")
                batch_done = [task] * n
        else:  # batch by batch, each batch's experts cold first
            routed = [*range(hot, len(experts)), *range(hot)]
            for b in range(n):
                for e in routed:
                    batch_done[b] = graph.add(f"{names[e]} L{i} b{b}", "gpu", experts[e][1], [loads[e], gates[b]],
                                              layer=i, micro_batch=b, kind="post_attn")
        last_gpu.append(graph.queues["gpu"][-1])
        last_attention.append(attention[-1])
    return graph


@dataclass(frozen=True)
class ExpertSchedule:
    """Steady-state layer of an expert-level schedule: the list-scheduled period against the
    lane-max bound (each resource's busy time per layer, perfect overlap)."""

    period_s: float
    lane_bound_s: float
    resource_busy_s: dict[str, float]
    timeline: Timeline

    @property
    def bubble_s(self) -> float:
        """Idle time per layer that overlap cannot remove under this task order."""
        return self.period_s - self.lane_bound_s


def expert_schedule(num_batches: int, attention_s: float, gate_s: float,
                    hot_experts: list[tuple[float, float]], cold_experts: list[tuple[float, float]],
                    layers: int = 6, order: str = "hot-first", prefetch_hot: bool = True,
                    gate_load_s: float = 0.0, attention_load_s: float = 0.0,
                    expert_buffers: int = 1, kv_load_s: float = 0.0, kv_store_s: float = 0.0) -> ExpertSchedule:
    """List-schedule :func:`klotski_layer_tasks` (same arguments) and return its steady-state
    layer period (the spacing of the ends of the two layers before the last, as
    :attr:`Timeline.layer_period_s`), the lane bound of one layer and the bubble between."""
    graph = klotski_layer_tasks(num_batches, attention_s, gate_s, hot_experts, cold_experts, layers, order,
                                prefetch_hot, gate_load_s, attention_load_s, expert_buffers, kv_load_s, kv_store_s)
    list_schedule(graph.queues)
    busy = {r: sum(t.duration_s for t in q if t.layer == layers - 1) for r, q in graph.queues.items()}
    bound = max(busy.values())
    timeline = Timeline(f"klotski-{order}", scheduled_tasks(graph.queues), layer_ends_s(graph.queues, layers),
                        bound, busy)
    return ExpertSchedule(timeline.layer_period_s, bound, busy, timeline)


def mid_context(prompt_len: int, gen_len: int) -> float:
    """The mean context over the decode steps (the estimate averages over all of them)."""
    contexts = latency.decode_contexts(prompt_len, gen_len)
    return float(np.mean(contexts)) if len(contexts) else float(prompt_len)
