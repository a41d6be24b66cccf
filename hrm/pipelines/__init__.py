"""Pipelines as first-class objects: the registry :data:`PIPELINES`, the pipeline of an engine
(:func:`pipeline_of`) and every pipeline's timeline (:func:`decode_timeline`).

- :mod:`hrm.pipelines.base` — the ``Pipeline`` protocol, a policy's ``PhaseTimes`` and ``MemoryUse``, lane labels;
- :mod:`hrm.pipelines.lanes` — the lanes pipeline: the max of affine lanes per layer (eq. 12);
- :mod:`hrm.pipelines.lanes_timeline` — the lanes pipeline's task graph of decode layers;
- :mod:`hrm.pipelines.expert_level` — the expert-level pipeline (Klotski): a policy's times and memory;
- :mod:`hrm.pipelines.expert_level_tasks` — Klotski's layer durations, batch group and task graph;
- :mod:`hrm.pipelines.list_scheduler` — the list scheduler every pipeline's task graph runs on.
"""

from __future__ import annotations

from ..engines.engine import Engine
from ..engines.schedules import get_schedule
from ..policy import Policy
from ..problem import Problem
from .base import MemoryUse, PhaseTimes, Pipeline, lane_label
from .expert_level import EXPERT_LEVEL
from .lanes import LANES
from .list_scheduler import Timeline

#: every pipeline by name (:attr:`hrm.engines.schedules.Schedule.pipeline` names one)
PIPELINES: dict[str, Pipeline] = {p.name: p for p in (LANES, EXPERT_LEVEL)}


def pipeline_of(engine: Engine) -> Pipeline:
    """The pipeline ``engine``'s schedule runs on."""
    return PIPELINES[get_schedule(engine.schedule).pipeline]


def decode_timeline(problem: Problem, policy: Policy, *, context: float, layers: int = 4,
                    moe: bool = True) -> Timeline:
    """List-schedule ``layers`` decode layers of ``policy`` at ``context`` cached tokens on the
    task graph of the problem's engine's pipeline (a dense layer with ``moe=False``)."""
    return pipeline_of(problem.engine).timeline(problem, policy, context=context, layers=layers, moe=moe)


__all__ = ["PIPELINES", "Pipeline", "PhaseTimes", "MemoryUse", "pipeline_of", "decode_timeline", "lane_label"]
