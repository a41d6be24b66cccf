"""The list scheduler every pipeline's task graph runs on: tasks on in-order resource queues
with data dependencies (:class:`Task`, :class:`TaskQueues`), scheduled by
:func:`list_schedule`; the result as a :class:`Timeline` of :class:`ScheduledTask` with its
steady-state layer period. :class:`TimedQueues` gives the same times without tasks, for a
graph built front to back that is timed, not drawn (the Klotski search). The lanes
pipeline's task builder is :mod:`hrm.pipelines.lanes_timeline`, the expert-level pipeline's
is :func:`hrm.pipelines.expert_level_tasks.klotski_layer_tasks`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ScheduledTask:
    resource: str
    name: str
    kind: str
    layer: int
    micro_batch: int
    start_s: float
    end_s: float


def layer_period_s(layer_end_s: list[float]) -> float:
    """Steady-state time per layer from the layers' ends: the spacing of the ends of the two
    layers before the last (the last layer has no next layer to launch ahead into, the
    first no previous one to overlap with)."""
    ends = layer_end_s
    if len(ends) >= 3:
        return ends[-2] - ends[-3]
    return ends[-1] - ends[-2] if len(ends) == 2 else ends[-1]


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
        """Steady-state time per layer (:func:`layer_period_s`)."""
        return layer_period_s(self.layer_end_s)

    def window(self, layer: int) -> tuple[float, float]:
        """(start, end) of one layer: from the previous layer's end to its own."""
        start = self.layer_end_s[layer - 1] if layer > 0 else 0.0
        return start, self.layer_end_s[layer]

    def frame(self):
        import pandas as pd

        return pd.DataFrame([t.__dict__ for t in self.tasks])


@dataclass(eq=False, slots=True)
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
    # the scheduler's bookkeeping (:func:`list_schedule`): inputs still running, the latest
    # end among those done, and the tasks waiting on this one
    pending: int = field(default=0, init=False, repr=False)
    ready_s: float = field(default=0.0, init=False, repr=False)
    dependents: list = field(default_factory=list, init=False, repr=False)


class TaskQueues:
    """Per-resource in-order queues and the global launch order of the tasks added to them."""

    def __init__(self, resources=()):
        self.queues: dict[str, list[Task]] = {r: [] for r in resources}
        self.order: list[Task] = []

    def add(self, name: str, resource: str, duration_s: float, deps=(), **labels) -> Task:
        """Queue a task behind the ones already on ``resource`` (``None`` deps are dropped)
        and return it, so later tasks can depend on it."""
        task = Task(name, resource, float(duration_s), [d for d in deps if d is not None], **labels)
        self.queues.setdefault(resource, []).append(task)
        self.order.append(task)
        return task


class TimedQueues:
    """In-order resource queues whose tasks are scheduled as they are added, for a graph
    built front to back (every input of a task added before it); a task is only its end
    time. A task starts at the later of its resource's last end and its inputs' ends: the
    start :func:`list_schedule` gives it (in whatever order that picks resources), so these
    are its times, without the :class:`Task` objects a search would never read. Kept: each
    layer's last end and each resource's durations per layer, in queue order."""

    def __init__(self, resources=()):
        self.free = dict.fromkeys(resources, 0.0)
        self.ends: dict[int, float] = {}
        self.durations: dict[tuple[str, int], list[float]] = {}

    def add(self, name: str, resource: str, duration_s: float, deps=(), layer: int = 0, micro_batch: int = 0,
            kind: str = "other") -> float:
        """Schedule a task behind the ones already on ``resource`` and return its end (what
        later tasks pass in ``deps``; ``None`` deps are dropped). ``name``, ``micro_batch``
        and ``kind`` label a :class:`Task`; unused here."""
        duration_s = float(duration_s)
        start = self.free.get(resource, 0.0)
        for end in deps:
            if end is not None and end > start:
                start = end
        end = self.free[resource] = start + duration_s
        if end > self.ends.get(layer, 0.0):
            self.ends[layer] = end
        self.durations.setdefault((resource, layer), []).append(duration_s)
        return end

    def layer_ends_s(self, layers: int) -> list[float]:
        """When the last task of each layer ends (as :func:`layer_ends_s`)."""
        return [self.ends.get(i, 0.0) for i in range(layers)]

    def busy_s(self, layer: int) -> dict[str, float]:
        """Each resource's busy seconds in ``layer`` (its durations summed in queue order)."""
        return {r: sum(self.durations.get((r, layer), ())) for r in self.free}


def list_schedule(queues: dict[str, list[Task]]) -> float:
    """Set every task's start and end and return the makespan. Each resource runs its queue
    in order; a task starts when its resource is free and its inputs are done; of the
    resources whose head task is ready, the one that can start earliest goes first (ties:
    the resource listed first). One scheduler for every engine's task graph.

    Each task keeps a count of its inputs still running and the latest end among those done
    (updated as each input ends), so a step looks at each resource's head once instead of
    walking every head's inputs."""
    for q in queues.values():
        for task in q:
            task.dependents = []
    for q in queues.values():
        for task in q:
            ends = [d.end_s for d in task.deps if d.end_s is not None]
            task.ready_s = max(ends, default=0.0)
            task.pending = len(task.deps) - len(ends)
            for d in task.deps:
                if d.end_s is None:
                    d.dependents.append(task)
    lanes = [q for q in queues.values() if q]
    heads = [0] * len(lanes)      # per lane, its next task
    free = [0.0] * len(lanes)     # per lane, the end of its last task
    remaining = sum(map(len, lanes))
    while remaining:
        best, best_start, best_task = -1, 0.0, None
        for k, q in enumerate(lanes):
            if heads[k] < len(q):
                task = q[heads[k]]
                if not task.pending:
                    start = free[k] if free[k] > task.ready_s else task.ready_s
                    if best < 0 or start < best_start:
                        best, best_start, best_task = k, start, task
        if best < 0:
            raise RuntimeError("timeline: dependency cycle in the task order")
        best_task.start_s = best_start
        end = best_task.end_s = best_start + best_task.duration_s
        for waiting in best_task.dependents:
            waiting.pending -= 1
            if end > waiting.ready_s:
                waiting.ready_s = end
        free[best] = end
        heads[best] += 1
        remaining -= 1
    return max(free, default=0.0)


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
