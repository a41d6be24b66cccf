"""Match a plan to what the runtime is asked to run: hardware and model by content hash
(:func:`hrm.plan.resolve_plan_hardware` / :func:`hrm.plan.resolve_plan_model`), refused with
one line naming the hashes when they differ."""

from __future__ import annotations

from typing import Optional

from hrm.errors import HRMError
from hrm.machine.hardware import HardwareProfile, load_hardware
from hrm.model.spec import ModelSpec, load_model
from hrm.plan import Plan, resolve_plan_hardware, resolve_plan_model


def _short(sha: str) -> str:
    return sha[:12]


def plan_hardware(plan: Plan, hw: Optional[str] = None) -> HardwareProfile:
    """The profile named by ``--hw`` (default: the plan's), refused if its hash differs."""
    name = hw or plan.hardware.name
    profile = resolve_plan_hardware(plan, name)
    if profile is None:
        other = load_hardware(name)  # a name that does not load is refused here, naming it
        raise HRMError(f"plan was made for hardware '{plan.hardware.name}' (sha256 {_short(plan.hardware.sha256)}), "
                       f"but '{name}' has sha256 {_short(other.sha256())}; re-plan with this profile or pass the plan's --hw")
    return profile


def plan_model(plan: Plan, model: Optional[str] = None) -> ModelSpec:
    """The model named by ``--model`` (default: the plan's) in the dtypes whose hash the plan
    recorded; refused if no dtype choice reproduces the hash (a different model or config)."""
    name = model or plan.model.name
    spec = resolve_plan_model(plan, name)
    if spec is None:
        base = load_model(name)  # a name that does not load is refused here, naming it
        raise HRMError(f"plan was made for model '{plan.model.name}' (sha256 {_short(plan.model.sha256)}), "
                       f"but '{name}' (sha256 {_short(base.sha256())}) differs in more than dtypes; re-plan for this model")
    return spec
