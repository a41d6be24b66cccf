"""Pipelines as first-class objects (:mod:`hrm.pipelines.base` gives the protocol): the
registry :data:`PIPELINES`, the pipeline of an engine, and every pipeline's timeline."""

from __future__ import annotations

from ..engines.engine import IDEAL, Engine
from ..model.spec import ModelSpec
from ..policy import Policy
from ..machine.rates import Rates
from ..engines.schedules import get_schedule
from .list_scheduler import Timeline
from .base import MemoryUse, PhaseTimes, Pipeline, lane_label
from .expert_level import EXPERT_LEVEL
from .lanes import LANES

#: every pipeline by name (:attr:`hrm.engines.schedules.Schedule.pipeline` names one)
PIPELINES: dict[str, Pipeline] = {p.name: p for p in (LANES, EXPERT_LEVEL)}


def pipeline_of(engine: Engine) -> Pipeline:
    """The pipeline ``engine``'s schedule runs on."""
    return PIPELINES[get_schedule(engine.schedule).pipeline]


def decode_timeline(model: ModelSpec, rates: Rates, policy: Policy, schedule: str | Engine, context: float,
                    layers: int = 4, moe: bool = True) -> Timeline:
    """List-schedule ``layers`` decode layers of ``policy`` under ``schedule`` (a schedule
    name of engine ideal, or an engine) on its pipeline's task graph."""
    engine = schedule if isinstance(schedule, Engine) else IDEAL.with_schedule(schedule)
    return pipeline_of(engine).timeline(model, rates, policy, engine, context, layers, moe)


__all__ = ["PIPELINES", "Pipeline", "PhaseTimes", "MemoryUse", "pipeline_of", "decode_timeline", "lane_label"]
