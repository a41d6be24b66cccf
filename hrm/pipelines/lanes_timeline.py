"""Task-level timeline of decode layers for a schedule (paper §4.1, Fig. 6, Algorithm 1).

:mod:`hrm.cost.latency` sums each resource's work into a lane and takes the max over lanes
(eq. 12), which assumes perfect overlap. This module splits the same work into the tasks
of every micro-batch — PreAttn, D1 QKV offload, CPU attention, D2 hidden back, PostAttn
(O projection + MoE FFN), D3 weight pages, D4 KV prefetch — places them on in-order
resource queues in the launch order of the schedule, and list-schedules them with their
data dependencies. The result shows where the pipeline has bubbles; its steady-state
layer period is ≥ the eq. 12 time and equal to it when the pipeline is fully overlapped.

The durations are the ones the lanes sum (a test checks that per resource they add up to
:func:`hrm.cost.latency.decode_resources`), so the picture and the estimate never disagree
about how long a task takes, only about how well tasks overlap.

This is the lanes pipeline's task builder on the generic scheduler of :mod:`hrm.pipelines.list_scheduler`
(the expert-level pipeline's is :func:`hrm.pipelines.expert_level_tasks.klotski_layer_tasks`); every pipeline's
timeline is :func:`hrm.pipelines.decode_timeline`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cost import latency
from ..model.spec import ModelSpec
from ..engines.engine import IDEAL, Engine
from ..engines.schedules import get_schedule
from ..policy import Policy
from ..machine.rates import Rates
from .list_scheduler import TaskQueues, Timeline, list_schedule, scheduled_tasks

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
    """Seconds of each task of one micro-batch (names of :func:`hrm.cost.latency.decode_tasks`;
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


def _build_tasks(times: list[TaskTime], n: int, layers: int, schedule: str, gpu_attention: bool, cpu_experts: bool):
    """Tasks and per-resource launch order for ``schedule`` (the order of Algorithm 1 for
    CGOPipe; FlexGen S4 prefetches the next micro-batch's KV; S3 runs each micro-batch's
    chain back to back)."""
    graph = TaskQueues(RESOURCES)  # its global launch order is used by the sequential schedule
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


def lanes_timeline(model: ModelSpec, rates: Rates, policy: Policy, engine: Engine, context: float,
                   layers: int = 4, moe: bool = True) -> Timeline:
    """List-schedule ``layers`` decode layers of ``policy`` as ``engine``'s lanes schedule
    launches them. A CPU-only host (one unit, ``rates.shared_unit``) runs everything in
    sequence, as the estimate does."""
    schedule = engine.schedule
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
