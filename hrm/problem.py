"""A planning problem: the machine, the model, the workload and the engine, with the modelling
options, the usable memory and the achieved rates they resolve to. Every estimate and search
of a pipeline takes one (instead of the long argument lists it replaces)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from .engines.engine import Engine, IDEAL
from .machine.hardware import HardwareProfile
from .cost.memory import MemoryLimits, memory_limits
from .model.spec import ModelSpec
from .model.options import DEFAULT_OPTIONS, ModelOptions
from .machine.rates import Rates, rates_from_profile
from .workload import Workload


class Problem(BaseModel):
    """(hardware, model, workload, engine) and what they resolve to: ``options`` with the
    device compute dtype resolved for the model, ``limits`` (usable bytes per tier) and
    ``rates`` (the profile's achieved rates under the options). Build it with
    :func:`make_problem`."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    hw: HardwareProfile
    model: ModelSpec
    workload: Workload
    engine: Engine = IDEAL
    options: ModelOptions = DEFAULT_OPTIONS
    limits: MemoryLimits
    rates: Rates

    def with_engine(self, engine: Engine) -> "Problem":
        return self.model_copy(update={"engine": engine})


def make_problem(hw: HardwareProfile, model: ModelSpec, workload: Workload, engine: Engine = IDEAL,
                 options: ModelOptions = DEFAULT_OPTIONS, limits: MemoryLimits | None = None) -> Problem:
    """The problem with options resolved for the model, the usable memory (``limits``, or the
    options' share of the profile's) and the profile's rates."""
    options = options.for_model(model)
    if engine.pads_prompts and not workload.padding:  # the engine runs every prompt at the longest
        workload = workload.model_copy(update={"padding": True})
    return Problem(hw=hw, model=model, workload=workload, engine=engine, options=options,
                   limits=limits or memory_limits(hw, options),
                   rates=rates_from_profile(hw, options, engine.name, engine.gpu_split))
