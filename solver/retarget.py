"""A plan for one engine exported to another (``hrm export PLAN --to TARGET``), re-planned
inside the target's own policy space.

A plan searched for ``ideal`` (or any engine but the target's) holds a policy the target
may not run at all (llama-server's 256 slots, vLLM's GPU-only attention, FlexGen's whole-
tensor placement) or runs slower than its own best. So unless the plan was made with one of
the target's HRM engines and the target expresses it exactly within memory, the export
repeats the plan's search — same hardware, model, workload, objective, latency limits,
batch cap and memory — with each of the target's engines (their ``policy:`` blocks are its
space, :mod:`hrm.export.space`), keeps the best the target expresses exactly, and prints
that; the plan's own policy and prediction are reported beside it. A target whose server
picks its own policy (MoE-Lightning) is exported with its pick, never re-planned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hrm.engines.engine import load_engine
from hrm.errors import HRMError, InfeasibleError
from hrm.export import Context, Export, export_plan, export_policy, get_exporter
from hrm.export.exporting import policy_differences
from hrm.export.target import EngineFlags
from hrm.cost.memory import MemoryLimits
from hrm.model.options import DEFAULT_OPTIONS, ModelOptions
from hrm.plan import Plan, resolve_plan_engine, resolve_plan_hardware, resolve_plan_model

from .search import objective_score, search
from .lanes.terms import DEFAULT_MAX_BATCH, LatencyLimits


@dataclass(frozen=True)
class Retargeted:
    """An export and how it was reached: ``replanned`` (the target's own search) with the
    engines searched and why, or the plan's policy exported as it is (or its nearest)."""

    export: Export
    replanned: bool
    reason: str = ""
    #: per engine of the target searched: its best's objective value, or why it had none
    searched: tuple[tuple[str, str], ...] = ()


def _plan_search_kwargs(plan: Plan) -> dict:
    """The plan's search settings as :func:`solver.search.search` arguments (defaults for a
    plan that did not record them)."""
    settings = plan.search
    if settings is None:
        return {"objective": "generation", "max_batch": DEFAULT_MAX_BATCH}
    return {"objective": settings.objective, "max_batch": settings.max_batch,
            "latency_limits": LatencyLimits(settings.max_tpot_s, settings.max_ttft_s),
            "limits": MemoryLimits(settings.gpu_limit_bytes, settings.cpu_limit_bytes, settings.shared_memory)}


def _direct_reason(plan: Plan, target: EngineFlags, options: ModelOptions, hw, model) -> tuple[Optional[Export], str]:
    """(the plan exported as it is, '') when the plan is the target's own and it runs it
    exactly within memory; else (None, why it must be re-planned)."""
    if plan.engine not in target.engines:
        return None, f"the plan is for engine {plan.engine}, not {target.name}'s ({', '.join(target.engines)})"
    try:
        export = export_plan(plan, target.name, options, hw=hw, model=model)
    except HRMError as exc:
        return None, f"{target.name} cannot run the plan's policy as it is ({exc})"
    if not export.exact:
        return None, f"{target.name} cannot express {plan.policy.short()} exactly ({', '.join(export.differences)})"
    if export.exported_feasible is False:
        return None, f"{plan.policy.short()} exceeds memory as {target.name} runs it"
    return export, ""


def _expresses(target: EngineFlags, policy, ctx: Context) -> bool:
    """Whether ``target``'s flags run exactly ``policy`` (its nearest policies include it)."""
    try:
        return policy in target.nearest(policy, ctx)
    except HRMError:
        return False


def _search_engines(plan: Plan, target: EngineFlags, hw, model, ctx: Context, options: ModelOptions):
    """Each of the target's engines' best policy for the plan's problem that the target
    expresses exactly: [(score, engine name, policy)], and per engine what happened."""
    kwargs = _plan_search_kwargs(plan)
    objective = kwargs["objective"]
    workload = target.run_workload(None, ctx)
    pin_sets = target.replan_pins(ctx) if target.replan_pins is not None else [{}]
    found, searched = [], []
    for name in target.engines:
        reads = ctx.model_copy(update={"rw_reads": load_engine(name).offloaded_weights})
        best, why = None, "nothing fits"
        for pins in pin_sets:
            try:
                result = search(hw, model, workload, engine=name, options=options, top=0, fixed=pins,
                                hw_name=plan.hardware.name, model_name=plan.model.name, **kwargs)
            except HRMError as exc:  # InfeasibleError included: nothing of this engine fits
                why = str(exc)
                continue
            policy = result.best.policy
            if not _expresses(target, policy, reads):
                why = f"{target.name} cannot express its best {policy.short()}"
                continue
            score = objective_score(result.best.estimate, objective)
            if best is None or score > best[0]:
                best = (score, name, policy)
        if best is None:
            searched.append((name, why))
            continue
        found.append(best)
        searched.append((name, f"{best[2].short()}: {best[0]:,.4g} ({objective})"))
    return found, tuple(searched)


def export_for_target(plan: Plan, target_name: str, options: ModelOptions = DEFAULT_OPTIONS, hw=None,
                      model=None) -> Retargeted:
    """``plan`` as ``target_name``'s command lines, re-planned inside its space when the plan
    is not one it runs as it is (module docstring). ``hw``/``model``: the plan's own (the
    search's), else resolved from the plan's names and hashes. InfeasibleError (exit 3) when
    none of the target's engines has a policy that fits; HRMError when the target cannot run
    the model or the machine at all."""
    target = get_exporter(target_name)
    hw = hw if hw is not None else resolve_plan_hardware(plan)
    model = model if model is not None else resolve_plan_model(plan)
    if target.server_picks_policy:
        return Retargeted(export=export_plan(plan, target_name, options, hw=hw, model=model), replanned=False)
    direct, reason = _direct_reason(plan, target, options, hw, model)
    if direct is not None:
        return Retargeted(export=direct, replanned=False)
    if hw is None or model is None:
        missing = "hardware profile" if hw is None else "model"
        raise HRMError(f"{reason}; re-planning for {target.name} needs the plan's {missing} "
                       f"({plan.hardware.name if hw is None else plan.model.name}) as it was when planned, "
                       "which does not load here with the plan's hash")
    ctx = Context(model=model, workload=plan.workload, hardware=hw,
                  gpu_memory_utilization=options.gpu_memory_utilization)
    if target.check_runs is not None:
        target.check_runs(ctx)  # the model or the machine, whatever the policy: nothing to re-plan
    found, searched = _search_engines(plan, target, hw, model, ctx, options)
    if not found:
        raise InfeasibleError(f"{target.name}: no policy of its engines fits the plan's problem ("
                              + "; ".join(f"{name}: {why}" for name, why in searched) + ")")
    _, engine_name, policy = max(found, key=lambda item: (item[0], -target.engines.index(item[1])))
    export = export_policy(target.name, policy, ctx, hw=hw, plan_engine=load_engine(engine_name), options=options)
    planned = plan.estimate.generation_throughput_tok_s
    differences = tuple(policy_differences(plan.policy, policy))
    export = export.model_copy(update={"planned_policy": plan.policy, "planned_throughput_tok_s": planned,
                                       "planned_engine": resolve_plan_engine(plan).name, "replanned": True,
                                       "exact": not differences, "differences": differences})
    return Retargeted(export=export, replanned=True, reason=reason, searched=searched)
