"""The policy space an engine can run, in one home: the placements (attention and experts on
the GPU or the CPU) its schedule and its :class:`hrm.engines.engine.PolicySpace` allow, the
parts of the policy it fixes, the most sequences it runs at once, the granularity it keeps
static experts in (r_w snapped) and the r_w its placement rule realises
(:data:`hrm.engines.rules.WEIGHT_LEVELS`).

A policy (:func:`realised_policy`) or the user's pins (:func:`engine_fixed`,
:func:`pins_refusal`, :func:`engine_max_batch`) are checked against that space here, by the
estimate and by every pipeline's search alike; a refusal is a one-line reason (``*_refusal``,
None when allowed) or an HRMError carrying one.
"""

from __future__ import annotations

from ..errors import HRMError
from ..model.spec import ModelSpec
from ..policy import Policy
from .engine import Engine, as_engine, attention_engine, is_shipped
from .rules import WEIGHT_LEVELS
from .schedules import SCHEDULES


def schedule_refusal(policy_attn: bool, policy_ffn: bool, schedule: str) -> str | None:
    """Why a placement is not allowed under ``schedule`` (None if it is)."""
    if schedule not in SCHEDULES:
        return f"unknown schedule '{schedule}' (one of {', '.join(SCHEDULES)})"
    return SCHEDULES[schedule].refusal(policy_attn, policy_ffn)


def engine_refusal(engine: Engine, policy_attn: bool, policy_ffn: bool) -> str | None:
    """Why a placement is not one ``engine`` can run (its schedule's and its own policy space)."""
    refusal = schedule_refusal(policy_attn, policy_ffn, engine.schedule)
    if refusal:
        return refusal if engine.name == "ideal" else f"engine {engine.name}: {refusal}"
    tier = {True: "gpu", False: "cpu"}
    if tier[policy_attn] not in engine.policy.attention:
        return f"engine {engine.name} runs attention on the {'/'.join(engine.policy.attention).upper()} (attn=...)"
    if tier[policy_ffn] not in engine.policy.ffn:
        return f"engine {engine.name} runs the experts on the {'/'.join(engine.policy.ffn).upper()} (ffn=...)"
    return None


def allowed_placements(engine: Engine, attn=None, ffn=None) -> list[tuple[bool, bool]]:
    """The (A_g, F_g) the engine runs, optionally pinned."""
    engine = as_engine(engine)
    return [(a, f) for a in (False, True) for f in (True, False)
            if (attn is None or a == attn) and (ffn is None or f == ffn) and engine_refusal(engine, a, f) is None]


def implied_pins(fixed: dict) -> dict:
    """The pins with the placement pinned static ratios imply: weights on the GPU need
    experts on the GPU, a KV share on the GPU needs attention there."""
    fixed = dict(fixed)
    if fixed.get("weights_gpu_ratio", 0) > 0:
        fixed.setdefault("ffn_on_gpu", True)
    if fixed.get("kv_gpu_ratio", 0) > 0:
        fixed.setdefault("attn_on_gpu", True)
    return fixed


def _placements_of_pins(engine: Engine, implied: dict) -> list[tuple[bool, bool]]:
    """The (A_g, F_g) the engine runs under pins that already carry their implied placement."""
    return allowed_placements(engine, implied.get("attn_on_gpu"), implied.get("ffn_on_gpu"))


def _no_placement_reason(engine: Engine, implied: dict) -> str:
    """Why no placement meets the (implied) pins, in words."""
    return (engine_refusal(engine, implied.get("attn_on_gpu", False), implied.get("ffn_on_gpu", True))
            or "no placement is allowed by --fix and the engine")


def pins_refusal(engine: Engine, fixed: dict) -> str | None:
    """Why the engine runs no placement under the pins ``fixed`` (with the placement their
    static ratios imply, :func:`implied_pins`); None when it runs one."""
    implied = implied_pins(fixed)
    return None if _placements_of_pins(engine, implied) else _no_placement_reason(engine, implied)


def pinned_placements(engine: Engine, fixed: dict) -> tuple[dict, list[tuple[bool, bool]]]:
    """The pins with the placement pinned static ratios imply (:func:`implied_pins`), and the
    (A_g, F_g) the engine runs under them; HRMError when there is none (:func:`pins_refusal`)."""
    implied = implied_pins(fixed)
    placements = _placements_of_pins(engine, implied)
    if not placements:
        raise HRMError(_no_placement_reason(engine, implied))
    return implied, placements


#: expert matrices per step of r_w (m = r_w·L·E) for each ``static_experts`` granularity
STATIC_EXPERT_STEP = {
    "continuous": lambda model: 1,
    "whole-experts-per-layer": lambda model: model.num_moe_layers,  # the same whole count per layer
    "whole-layers": lambda model: model.num_experts,  # all of a layer's experts, or none
}


def static_expert_step(model: ModelSpec, engine: Engine) -> int:
    """Granularity of r_w in expert matrices over all MoE layers (r_w = m / (L·E))."""
    return STATIC_EXPERT_STEP[engine.static_experts](model)


def snap_weights_ratio(model: ModelSpec, engine: Engine, ratio: float) -> float:
    """r_w as the engine realises it: the largest multiple of its granularity at or below
    r_w (``whole-experts-per-layer``: int(E·r_w) experts of every layer, MoE-Lightning's
    ``num_experts_gpu = int(num_local_experts * wg)``; ``whole-layers``: int(L·r_w) layers)."""
    if engine.static_experts == "continuous" or model.num_experts <= 1:
        return ratio
    units = model.num_moe_layers * model.num_experts // static_expert_step(model, engine)
    return int(units * ratio + 1e-9) / units


def static_experts_in_words(model: ModelSpec, engine: Engine, ratio: float) -> str:
    """What a snapped r_w keeps on the GPU under the engine's granularity, in words."""
    if engine.static_experts == "whole-layers":
        return f"the experts of {round(ratio * model.num_moe_layers)} of {model.num_moe_layers} MoE layers"
    return f"int({model.num_experts}*rw) = {round(ratio * model.num_experts)} experts of every layer"


def realised_policy(model: ModelSpec, engine: Engine, policy: Policy) -> tuple[Policy, list[str]]:
    """``policy`` as ``engine`` runs it (r_w snapped to its static-weight granularity), with
    a note for each change; HRMError for a policy outside the engine's space."""
    refusal = engine_refusal(engine, policy.attn_on_gpu, policy.ffn_on_gpu)
    if refusal:
        raise HRMError(refusal)
    for key, value in engine.policy.fixed.items():
        if abs(float(getattr(policy, key)) - value) > 1e-9:
            raise HRMError(f"engine {engine.name} runs {key}={value:g} (policy has {getattr(policy, key):g})")
    limit = engine.policy.max_batch_size
    if limit is not None and policy.batch_size > limit:
        raise HRMError(f"engine {engine.name} runs at most {limit} sequences at once (policy has N={policy.batch_size})")
    notes = []
    snapped = snap_weights_ratio(model, engine, policy.weights_gpu_ratio)
    if snapped != policy.weights_gpu_ratio:
        notes.append(f"rw={policy.weights_gpu_ratio:.4g} snapped to {snapped:.4g}: engine {engine.name} keeps "
                     f"{static_experts_in_words(model, engine, snapped)} on the GPU")
        policy = policy.model_copy(update={"weights_gpu_ratio": snapped})
    return policy, notes


def engine_for_policy(engine: Engine, policy: Policy) -> Engine:
    """The engine that runs ``policy``: ``engine``, or the one its ``policy.attention_engines``
    names for the policy's attention tier (a shipped engine as shipped only: an edited one
    keeps its own tiers, as its search does)."""
    if not engine.policy.attention_engines or not is_shipped(engine):
        return engine
    return attention_engine(engine, policy.attn_on_gpu)


def engine_fixed(engine: Engine, model: ModelSpec, fixed: dict) -> tuple[dict, list[str]]:
    """The user's pins merged with what the engine fixes (a contradiction is refused), and
    r_w snapped to the engine's granularity (with a note saying so)."""
    fixed = dict(fixed)
    refusal = pins_refusal(engine, fixed)  # every pipeline refuses a tier pin its engine cannot run (Klotski's too)
    if refusal:
        raise HRMError(refusal)
    for key, value in engine.policy.fixed.items():
        value = int(value) if key == "num_micro_batches" else float(value)
        if key in fixed and abs(float(fixed[key]) - value) > 1e-9:
            raise HRMError(f"--fix {key}={fixed[key]:g}: engine {engine.name} runs {key}={value:g}")
        fixed[key] = value
    notes = []
    if "weights_gpu_ratio" in fixed:
        snapped = snap_weights_ratio(model, engine, fixed["weights_gpu_ratio"])
        if snapped != fixed["weights_gpu_ratio"]:
            notes.append(f"--fix rw={fixed['weights_gpu_ratio']:g} snapped to {snapped:.4g}: engine {engine.name} "
                         f"keeps {static_experts_in_words(model, engine, snapped)} on the GPU")
            fixed["weights_gpu_ratio"] = snapped
    return fixed, notes


def engine_max_batch(engine: Engine, max_batch: int, fixed: dict, notes: list) -> tuple[int, list]:
    """The batch cap within the engine's own limit (``policy.max_batch_size``); a pinned N
    above the cap asked for, or above the engine's limit, is refused (a conflict of inputs,
    not a memory limit)."""
    if fixed.get("batch_size", 0) > max_batch:
        raise HRMError(f"--fix N={fixed['batch_size']}: above --max-batch {max_batch}; raise --max-batch")
    limit = engine.policy.max_batch_size
    if limit is None or max_batch <= limit:
        return max_batch, notes
    if fixed.get("batch_size", 0) > limit:
        raise HRMError(f"--fix N={fixed['batch_size']}: engine {engine.name} runs at most {limit} sequences at once")
    return limit, [*notes, f"N <= {limit}: engine {engine.name}'s own limit on sequences at once"]


def weights_levels(engine: Engine, model: ModelSpec, fixed: dict) -> tuple[float, ...] | None:
    """The r_w an engine with a placement rule (``policy.weights_levels``) can realise, or
    None (no rule, or r_w pinned: then it must be one of them)."""
    if engine.policy.weights_levels is None:
        return None
    levels = tuple(WEIGHT_LEVELS[engine.policy.weights_levels](model))
    if "weights_gpu_ratio" in fixed:
        if not any(abs(fixed["weights_gpu_ratio"] - level) < 1e-9 for level in levels):
            raise HRMError(f"--fix rw={fixed['weights_gpu_ratio']:g}: engine {engine.name} places weights only at "
                           f"rw one of {' '.join(f'{v:.4g}' for v in levels)} ({engine.policy.weights_levels})")
        return None
    return levels
