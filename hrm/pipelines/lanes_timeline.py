"""Task-level timeline of decode layers for a schedule (paper §4.1, Fig. 6, Algorithm 1).

:mod:`hrm.cost.latency` sums each resource's work into a lane and takes the max over lanes
(eq. 12), which assumes perfect overlap. This module splits the same work into the tasks
of every micro-batch — PreAttn, D1 QKV offload, CPU attention, D2 hidden back, PostAttn
(O projection + MoE FFN), D3 weight pages, D4 KV prefetch — places them on in-order
resource queues in the launch order of the schedule, and list-schedules them with their
data dependencies. The result shows where the pipeline has bubbles; its steady-state
layer period is ≥ the eq. 12 time and equal to it when the pipeline is fully overlapped.

The durations are the ones the lanes sum (a test checks that per resource they add up to
:func:`hrm.cost.latency.decode.decode_resources`), so the picture and the estimate never disagree
about how long a task takes, only about how well tasks overlap.

This is the lanes pipeline's task builder on the generic scheduler of :mod:`hrm.pipelines.list_scheduler`
(the expert-level pipeline's is :func:`hrm.pipelines.expert_level_tasks.klotski_layer_tasks`); every pipeline's
timeline is :func:`hrm.pipelines.decode_timeline`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cost.latency.decode import decode_resources, decode_tasks
from ..cost.latency.dispatch import decode_dispatch
from ..cost.latency.lane import RESOURCES, lanes_time_s
from ..cost.latency.lanes import schedule_lanes
from ..engines.engine import IDEAL, Engine
from ..engines.schedules import get_schedule
from ..machine.rates import Rates
from ..model.spec import ModelSpec
from ..policy import Policy
from ..problem import Problem
from .list_scheduler import Task, TaskQueues, Timeline, list_schedule, scheduled_tasks

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
    """Seconds of each task of one micro-batch (names of :func:`hrm.cost.latency.decode.decode_tasks`;
    "W" is one of the n weight pages). A measured profile's dispatch α is per lane: it is
    spread evenly over the lane's tasks of the micro-batch (its KV part onto the KV task),
    so each resource's total stays the lane's."""
    n, rw, rc = policy.num_micro_batches, policy.weights_gpu_ratio, policy.kv_gpu_ratio
    tasks = [t for t in decode_tasks(model, rates, policy.micro_batch_size, context,
                                             policy.attn_on_gpu, policy.ffn_on_gpu, moe, engine)
             if t.resource in RESOURCES]  # capacity bounds (copy team, DRAM) are not queues
    times = {t.name: float(t.lane.time_s(n, rw, rc)) / n for t in tasks}
    if rates.gpu_dispatch is not None or rates.cpu_dispatch is not None:
        _spread_dispatch(model, rates, policy, tasks, times, moe)
    return [TaskTime(t.name, t.resource, t.kind, times[t.name]) for t in tasks]


def _spread_dispatch(model, rates, policy, tasks, times, moe) -> None:
    rc = policy.kv_gpu_ratio
    ffn = float(policy.ffn_on_gpu) if moe else 1.0
    alpha = decode_dispatch(model, rates, float(policy.micro_batch_size), float(policy.attn_on_gpu), ffn, moe)
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


class _DecodeGraph:
    """The task graph of ``layers`` decode layers of n micro-batches while it is built: the
    queues, each micro-batch's last task and each layer's weight pages so far, and how a
    micro-batch's attention and post-attention are queued."""

    def __init__(self, times: list[TaskTime], n: int, layers: int, gpu_attention: bool, cpu_experts: bool):
        self.graph = TaskQueues(RESOURCES)  # its global launch order is used by the sequential schedule
        self.spec = {t.name: t for t in times}
        self.n, self.gpu_attention, self.cpu_experts = n, gpu_attention, cpu_experts
        self.flat = [(i, j) for i in range(layers) for j in range(n)]
        self.done: dict[tuple[int, int], Task] = {}   # (i, j) -> last task of micro-batch j in layer i
        self.pages: dict[int, list[Task]] = {}        # layer -> its weight pages (loaded during the previous layer)

    def add(self, key: str, i: int, j: int, deps, label: str | None = None) -> Task:
        """The queued task ``key`` of micro-batch j in layer i (absent tasks, 0 s, stay in the
        queues as joins of their inputs; they are not drawn)."""
        t = self.spec[key]
        return self.graph.add(label or f"{key} L{i} mb{j}", t.resource, t.seconds, deps, layer=i, micro_batch=j,
                              kind=t.kind)

    def pre(self, f: int, after: Task | None = None) -> Task:
        """The last task before attention's result of the f-th micro-batch: PreAttn on the GPU,
        then, with attention on the CPU, D1 and the CPU attention."""
        i, j = self.flat[f]
        p = self.add("PreAttn", i, j, [self.done.get((i - 1, j)), after])
        if self.gpu_attention:
            return p
        q = self.add("QKV→CPU", i, j, [p])
        return self.add("CPUAttn", i, j, [q])

    def post(self, f: int, ready: Task) -> None:
        """Queue the f-th micro-batch's PostAttn (after ``ready`` and its layer's weight pages)
        and, with CPU experts, their round trip; record its last task."""
        i, j = self.flat[f]
        p = self.add("PostAttn", i, j, [ready, *self.pages.get(i, [])])
        if self.cpu_experts:
            a = self.add("FFN→CPU", i, j, [p])
            e = self.add("CPUExperts", i, j, [a])
            p = self.add("FFN→GPU", i, j, [e])
        self.done[(i, j)] = p

    def page(self, i: int, j: int) -> None:
        """Queue the j-th weight page of layer i + 1. Double buffer: layer i+1's pages overwrite
        layer i−1's, so they wait for its last PostAttn; a pageable weight path first stages
        the page on the CPU."""
        last = self.done.get((i - 1, self.n - 1))
        stage = self.add("StageW", i, j, [last], f"StageW L{i + 1} page{j}") if "StageW" in self.spec else None
        w = self.add("W", i, j, [last, stage], f"W L{i + 1} page{j}")
        self.pages.setdefault(i + 1, []).append(w)


def _queue_prefetched_kv(b: _DecodeGraph) -> None:
    """FlexGen S4 (and CGOPipe with A_g = 1): GPU attention, the KV of the next micro-batch
    prefetched into a double buffer."""
    kv, gpu_attn = {}, {}
    kv[0] = b.add("KV→GPU", 0, 0, [])
    for f, (i, j) in enumerate(b.flat):
        b.page(i, j)
        if f + 1 < len(b.flat):
            ni, nj = b.flat[f + 1]
            # double buffer: the KV of micro-batch f+1 reuses the buffer of f−1's attention
            kv[f + 1] = b.add("KV→GPU", ni, nj, [gpu_attn.get(f - 1)])
        p = b.pre(f)
        a = gpu_attn[f] = b.add("GPUAttn", i, j, [p, kv[f]])
        b.add("KV→CPU", i, j, [a])
        b.post(f, a)


def _queue_chains(b: _DecodeGraph) -> None:
    """FlexGen S3: each micro-batch's chain back to back."""
    last = None
    for f, (i, j) in enumerate(b.flat):
        a = b.pre(f, after=last)  # waits for the previous micro-batch's whole chain
        h = b.add("Hidden→GPU", i, j, [a])
        b.page(i, j)
        b.post(f, h)
        last = b.done[(i, j)]


def _queue_lookahead(b: _DecodeGraph) -> None:
    """CGOPipe, Algorithm 1: CPU attention launched :data:`LOOKAHEAD` micro-batches ahead."""
    attn = {}
    ahead = min(LOOKAHEAD, len(b.flat))
    for f in range(ahead):
        attn[f] = b.pre(f)
    for f, (i, j) in enumerate(b.flat):
        h = b.add("Hidden→GPU", i, j, [attn[f]])
        b.page(i, j)
        b.post(f, h)
        if f + ahead < len(b.flat):
            attn[f + ahead] = b.pre(f + ahead)


def _build_tasks(times: list[TaskTime], n: int, layers: int, schedule: str, gpu_attention: bool,
                 cpu_experts: bool) -> tuple[dict[str, list[Task]], list[Task]]:
    """Tasks and per-resource launch order for ``schedule`` (the order of Algorithm 1 for
    CGOPipe; FlexGen S4 prefetches the next micro-batch's KV; S3 runs each micro-batch's
    chain back to back): (queues, the global launch order)."""
    b = _DecodeGraph(times, n, layers, gpu_attention, cpu_experts)
    if gpu_attention:
        _queue_prefetched_kv(b)
    elif get_schedule(schedule).order == "chain":
        _queue_chains(b)
    else:
        _queue_lookahead(b)
    graph = b.graph
    if get_schedule(schedule).order == "serial":
        for before, after in zip(graph.order, graph.order[1:]):
            after.deps.append(before)
    return graph.queues, graph.order


def lanes_timeline(problem: Problem, policy: Policy, *, context: float, layers: int = 4,
                   moe: bool = True) -> Timeline:
    """List-schedule ``layers`` decode layers of ``policy`` as the problem's engine's lanes
    schedule launches them, at ``context`` cached tokens (a dense layer with ``moe=False``).
    A CPU-only host (one unit, ``rates.shared_unit``) runs everything in sequence, as the
    estimate does."""
    model, rates, engine = problem.model, problem.rates, problem.engine
    times = decode_task_times(model, rates, policy, context, moe, engine)
    effective = "sequential" if rates.shared_unit else engine.schedule
    cpu_experts = moe and not policy.ffn_on_gpu
    queues, _ = _build_tasks(times, policy.num_micro_batches, layers, effective, policy.attn_on_gpu, cpu_experts)
    list_schedule(queues)
    tasks = scheduled_tasks(queues)
    ends = [max(t.end_s for t in tasks if t.layer == i) for i in range(layers)]
    resources = decode_resources(model, rates, policy.micro_batch_size, context,
                                 policy.attn_on_gpu, policy.ffn_on_gpu, moe, engine)
    lanes = schedule_lanes(resources, engine, rates.shared_unit)
    bound = float(lanes_time_s(lanes, policy.num_micro_batches, policy.weights_gpu_ratio, policy.kv_gpu_ratio))
    return Timeline(effective, tasks, ends, bound, resource_totals_s(times, policy.num_micro_batches))
