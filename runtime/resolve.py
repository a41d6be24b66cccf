"""Match a plan to what the runtime is asked to run: hardware and model by content hash."""

from __future__ import annotations

from itertools import product
from typing import Optional

from hrm.errors import HRMError
from hrm.hardware import HardwareProfile, load_hardware
from hrm.model import ModelSpec, load_model
from hrm.plan import Plan
from hrm.units import DTYPES


def _short(sha: str) -> str:
    return sha[:12]


def plan_hardware(plan: Plan, hw: Optional[str] = None) -> HardwareProfile:
    """The profile named by ``--hw`` (default: the plan's), refused if its hash differs."""
    name = hw or plan.hardware.name
    profile = load_hardware(name)
    if profile.sha256() != plan.hardware.sha256:
        raise HRMError(f"plan was made for hardware '{plan.hardware.name}' (sha256 {_short(plan.hardware.sha256)}), "
                       f"but '{name}' has sha256 {_short(profile.sha256())}; re-plan with this profile or pass the plan's --hw")
    return profile


def dtype_variants(spec: ModelSpec):
    """The spec under every (weight, kv, activation) dtype choice (a plan may record any)."""
    yield spec
    for wd, kd, ad in product(DTYPES, DTYPES, DTYPES):
        yield spec.model_copy(update={"weight_dtype": wd, "kv_dtype": kd, "activation_dtype": ad})


def plan_model(plan: Plan, model: Optional[str] = None) -> ModelSpec:
    """The model named by ``--model`` (default: the plan's) in the dtypes whose hash the plan
    recorded; refused if no dtype choice reproduces the hash (a different model or config)."""
    name = model or plan.model.name
    base = load_model(name)
    for spec in dtype_variants(base):
        if spec.sha256() == plan.model.sha256:
            return spec
    raise HRMError(f"plan was made for model '{plan.model.name}' (sha256 {_short(plan.model.sha256)}), "
                   f"but '{name}' (sha256 {_short(base.sha256())}) differs in more than dtypes; re-plan for this model")
