"""A policy or a plan as a target's command lines (``hrm export``).

An engine can express only part of HRM's policy space (FlexGen places whole tensors by
midpoint; llama.cpp keeps experts on the CPU per whole layer). A plan it cannot express
exactly is exported with the nearest policy it can, re-estimated, and the difference stated
(:class:`Export`); one it cannot run at all is refused in one line (vLLM and SGLang have no
CPU attention). A server that picks its own policy at launch (MoE-Lightning) is exported with
its pick. Every prediction is for the workload the target runs (FlexGen pads every prompt).
"""

from __future__ import annotations

import math
import shlex
from typing import Optional

from ..errors import HRMError
from ..policy import Policy
from ..workload import Workload
from .registry import get_exporter
from .target import Context, EngineFlags, Frozen


class FlagValue(Frozen):
    flag: str
    value: str
    policy_field: str
    checked_against: str
    source: str


class Export(Frozen):
    """A plan as an engine's command lines, with the policy they express."""

    engine: str
    version: str
    commands: tuple[str, ...]
    flags: tuple[FlagValue, ...]
    planned_policy: Policy
    exported_policy: Policy
    exact: bool
    differences: tuple[str, ...]
    #: the HRM engine both policies were re-estimated with (None: not re-estimated)
    estimate_engine: Optional[str] = None
    planned_throughput_tok_s: Optional[float] = None
    exported_throughput_tok_s: Optional[float] = None
    #: the exported policy fits physical memory less the engine's fixed costs (a pinned policy)
    exported_feasible: Optional[bool] = None
    #: ... and within the planning caps (--gpu-util/--cpu-util): above them, a warning only
    exported_within_caps: Optional[bool] = None
    caveats: tuple[str, ...] = ()
    #: the target's server picks its own policy at launch: ``exported_policy`` is its pick
    server_picks_policy: bool = False
    #: what this export should say besides the caveats (the target's ``notes`` hook, the workload)
    notes: tuple[str, ...] = ()
    #: the workload both predictions are for: the one the target runs (FlexGen: padded)
    workload: Optional[Workload] = None
    #: the exported policy is the target's own search for the plan's problem, not the plan's
    #: policy (:mod:`solver.retarget`); ``planned_*`` are then the plan's as it was made
    replanned: bool = False
    #: the engine the plan was made with, when re-planned
    planned_engine: Optional[str] = None

    def to_json(self) -> dict:
        data = self.model_dump(mode="json")
        data["planned_policy"] = self.planned_policy.short()
        data["exported_policy"] = self.exported_policy.short()
        return data


def _estimate(hw, model, workload, policy: Policy, engine, options=None):
    """(throughput, fits, within the planning caps) of ``policy`` under ``engine``, or None
    when it cannot run it. An exported policy is pinned: it fits when it fits physical memory
    less the engine's fixed costs (:func:`hrm.cost.memory.physical_limits`); above the planning
    caps (``--gpu-util``/``--cpu-util``) it is only warned about."""
    from ..engines.engine import resolve_engine
    from ..estimate import estimate
    from ..cost.memory import physical_limits

    try:
        kwargs = {"options": options} if options is not None else {}
        result = estimate(hw, model, workload, policy, engine=engine, **kwargs)
    except HRMError:
        return None
    fits_physical = result.fits(physical_limits(hw, resolve_engine(engine, None, hw)))
    return result.generation_throughput_tok_s, fits_physical, result.feasible


def _estimate_engine(target: EngineFlags, policy: Policy, plan_engine):
    """The HRM engine to re-estimate with: the target's closest shipped one, else the plan's."""
    from ..engines.engine import load_engine

    name = target.hrm_engine(policy) if target.hrm_engine else None
    return load_engine(name) if name else plan_engine


def choose_nearest(target: EngineFlags, policy: Policy, ctx: Context, estimate_with=None) -> Policy:
    """The policy ``target`` runs for ``policy``: itself when expressible, else the best
    (feasible first, then fastest by ``estimate_with(policy)``) of the nearest ones."""
    candidates = target.nearest(policy, ctx)
    if not candidates:
        raise HRMError(f"{target.name} cannot express {policy.short()}")
    if policy in candidates or len(candidates) == 1 or estimate_with is None:
        return policy if policy in candidates else candidates[0]
    scored = [(estimate_with(p), i, p) for i, p in enumerate(candidates)]
    ranked = sorted(scored, key=lambda s: (s[0] is None, not (s[0] and s[0][1]), -(s[0][0] if s[0] else 0), s[1]))
    return ranked[0][2]


def policy_differences(old: Policy, new: Policy) -> list[str]:
    """Each policy field that differs, as 'N 2548 -> 256'."""
    names = {"batch_size": "N", "micro_batch_size": "mu", "num_micro_batches": "n", "attn_on_gpu": "attn",
             "ffn_on_gpu": "ffn", "weights_gpu_ratio": "rw", "kv_gpu_ratio": "rc"}

    def show(value):
        return ("gpu" if value else "cpu") if isinstance(value, bool) else f"{value:.4g}"

    return [f"{names[k]} {show(getattr(old, k))} -> {show(getattr(new, k))}" for k in names
            if getattr(old, k) != getattr(new, k) and not (isinstance(getattr(old, k), float)
                                                          and math.isclose(getattr(old, k), getattr(new, k),
                                                                           abs_tol=1e-9))]


def command_lines(target: EngineFlags, values: dict[str, list[str]]) -> tuple[str, ...]:
    """The programs' command lines (flags split by program for a server + client pair)."""
    if len(target.programs) == 1:
        groups = [values]
    else:  # the client's flags go to the second program
        client = set(target.client_flags)
        groups = [{k: v for k, v in values.items() if k not in client},
                  {k: v for k, v in values.items() if k in client}]
    lines = []
    for program, group in zip(target.programs, groups):
        tokens = [program]
        for flag, args in group.items():
            tokens += [flag] + [shlex.quote(a) for a in args]
        lines.append(" ".join(tokens))
    return tuple(lines)


def _flag_values(target: EngineFlags, values: dict[str, list[str]]) -> tuple[FlagValue, ...]:
    """Each rendered flag with the policy field it carries and where its form was read."""
    rows = []
    for flag, args in values.items():
        spec = target.spec(flag)
        rows.append(FlagValue(flag=flag, value=" ".join(args), policy_field=spec.policy_field,
                              checked_against=spec.checked_against, source=spec.source))
    return tuple(rows)


def _workload_notes(target: EngineFlags, plan_workload, run) -> list[str]:
    """A line when the target runs another workload than the plan's (FlexGen pads prompts)."""
    def show(w) -> str:
        return f"prompts of {w.effective_prompt_len} tokens{' (padded)' if w.padding else ''}, {w.gen_len} generated"

    if show(plan_workload) == show(run):
        return []
    return [f"{target.name} runs {show(run)}, the plan {show(plan_workload)}: both predictions are for "
            f"{target.name}'s workload"]


def export_policy(target_name: str, policy: Policy, ctx: Context, hw=None, plan_engine=None, options=None,
                  planned_throughput: float | None = None) -> Export:
    """``policy`` as ``target_name``'s flags (the nearest expressible policy when needed, the
    server's own pick for a target that picks), both policies re-estimated with the target's
    closest HRM engine on the workload the target runs when ``hw`` is given."""
    from ..engines.engine import load_engine

    target = get_exporter(target_name)
    plan_engine = plan_engine if plan_engine is not None else load_engine("ideal")
    ctx = ctx.model_copy(update={"rw_reads": plan_engine.offloaded_weights})
    run = target.run_workload(None, ctx)

    def estimate_with(p: Policy):
        return _estimate(hw, ctx.model, run, p, _estimate_engine(target, p, plan_engine), options)

    exported = choose_nearest(target, policy, ctx, estimate_with if hw is not None else None)
    values = target.render(exported, ctx)
    differences = policy_differences(policy, exported)
    engine_name = old_tput = new_tput = feasible = within_caps = None
    if hw is not None:
        engine = _estimate_engine(target, exported, plan_engine)
        engine_name = engine.name
        new = _estimate(hw, ctx.model, run, exported, engine, options)
        old = _estimate(hw, ctx.model, run, policy, engine, options)
        new_tput, feasible, within_caps = (new if new else (None, None, None))
        old_tput = old[0] if old else planned_throughput
    notes = target.export_notes(exported, ctx) + _workload_notes(target, ctx.workload, run)
    return Export(engine=target.name, version=target.version, commands=command_lines(target, values),
                  flags=_flag_values(target, values), planned_policy=policy, exported_policy=exported,
                  exact=not differences, differences=tuple(differences), estimate_engine=engine_name,
                  planned_throughput_tok_s=old_tput, exported_throughput_tok_s=new_tput, exported_feasible=feasible,
                  exported_within_caps=within_caps, caveats=target.caveats, server_picks_policy=target.server_picks_policy, notes=tuple(notes),
                  workload=run)


def export_plan(plan, engine_name: str, options=None, hw=None, model=None) -> Export:
    """A plan (:class:`hrm.plan.Plan`) as ``engine_name``'s command lines. The model and the
    hardware (unless given: the search's own) are resolved from the plan's names and hashes;
    without them the export is not re-estimated (and the model's layer and expert counts are
    needed: an HRMError then)."""
    from ..model.options import DEFAULT_OPTIONS
    from ..plan import resolve_plan_engine, resolve_plan_hardware, resolve_plan_model

    model = model if model is not None else resolve_plan_model(plan)
    if model is None:
        raise HRMError(f"plan: model {plan.model.name!r} with the plan's hash does not load here; "
                       "export needs its layers and experts")
    hw = hw if hw is not None else resolve_plan_hardware(plan)
    options = options or DEFAULT_OPTIONS
    ctx = Context(model=model, workload=plan.workload, hardware=hw,
                  gpu_memory_utilization=options.gpu_memory_utilization)
    return export_policy(engine_name, plan.policy, ctx, hw=hw, plan_engine=resolve_plan_engine(plan),
                         options=options, planned_throughput=plan.estimate.generation_throughput_tok_s)
