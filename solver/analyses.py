"""Analyses around a search, for the CLI and the web planner alike: every engine at its own
best policy (:func:`compare_engines`), the ideal machine's bound beside an engine's best
(:func:`ideal_bound_tok_s`), and what a routing does to the chosen policy against uniform
routing (:func:`routing_effect`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hrm.cost.memory import MemoryLimits
from hrm.engines.engine import Engine
from hrm.errors import HRMError
from hrm.model.options import DEFAULT_OPTIONS, ModelOptions

from .request import Candidate, SearchResult
from .search import objective_score, search

#: the reference runtime (runtime/, ``hrm run``): it runs the plain model (no engine
#: mechanism), so on a datasheet profile it ties ``ideal`` row for row; it is not a serving
#: engine, and :func:`compare_engines` lists it only when asked (``with_reference``), under this label
REFERENCE_ENGINES = {"hrm-runtime": "hrm-runtime (reference runtime)"}

#: throughputs closer than this (relative) are "the same" when a routing is compared with
#: uniform: float noise of two estimates, far below any modelled effect (our choice)
SAME_THROUGHPUT_REL = 1e-6

#: fewer than this many expected inactive experts per layer counts as "all active" (our choice:
#: a hundredth of an expert changes no estimate visibly)
ALL_EXPERTS_MARGIN = 0.01


@dataclass(frozen=True)
class EngineBest:
    """One engine of :func:`compare_engines`: its label and its best policy's search, or the
    one line why it has none."""

    #: the engine's name (``ideal/SCHEDULE`` for ideal's other schedules; the reference
    #: runtime as :data:`REFERENCE_ENGINES` labels it)
    label: str
    #: the engine's search at its own best policy (None: no policy, see ``refusal``)
    result: SearchResult | None = None
    #: why the engine admits no policy, in one line (None when it has one)
    refusal: str | None = None


def compare_engines(hw, model, workload, *, with_reference: bool = False, **search_kwargs) -> list[EngineBest]:
    """Every shipped engine (and ideal's other schedules) at its own best policy
    (:func:`solver.search.search` with ``search_kwargs``, no alternatives), best first by the
    objective, engines without a policy last. The reference runtime (:data:`REFERENCE_ENGINES`)
    only ``with_reference``, labelled as such. HRMError when no engine admits a policy."""
    from hrm.engines.engine import list_engines, load_engine
    from hrm.engines.schedules import SCHEDULES

    runs = [(REFERENCE_ENGINES.get(name, name), load_engine(name)) for name in list_engines()
            if with_reference or name not in REFERENCE_ENGINES]
    runs += [(f"ideal/{s}", load_engine("ideal").with_schedule(s)) for s in SCHEDULES if s != "cgopipe"]
    rows = []
    for label, engine in runs:
        try:
            rows.append(EngineBest(label, search(hw, model, workload, top=0, engine=engine, **search_kwargs)))
        except HRMError as exc:
            rows.append(EngineBest(label, refusal=str(exc)))
    rows.sort(key=lambda row: _rank(row, search_kwargs.get("objective", "generation")))
    if all(row.result is None for row in rows):
        raise HRMError("no engine admits a policy: " + "; ".join(f"{row.label}: {row.refusal}" for row in rows))
    return rows


def _rank(row: EngineBest, objective: str) -> float:
    """Sort key of a compared engine: best first by the objective, engines without a policy last."""
    if row.result is None:
        return float("inf")
    return -objective_score(row.result.best.estimate, objective)


def ideal_bound_tok_s(hw, model, workload, engine: Engine, **search_kwargs) -> float | None:
    """The ideal machine's best generation throughput (tok/s) under the same inputs
    (``search_kwargs``: :func:`solver.search.search`'s), the headroom no engine's mechanisms
    leave; None for engine ideal itself, or when ideal has no policy either."""
    if engine.name == "ideal":
        return None
    try:
        ideal = search(hw, model, workload, top=0, engine="ideal", **search_kwargs).best.estimate
    except HRMError:
        return None
    return ideal.generation_throughput_tok_s


@dataclass(frozen=True)
class RoutingEffect:
    """A routing's effect on one policy's generation throughput against uniform routing."""

    #: the routing planned with, in words (:meth:`hrm.model.routing.Routing.label`)
    routing_label: str
    #: generation throughput of the policy under the routing (tok/s)
    planned_tok_s: float
    #: generation throughput of the same policy under uniform routing (tok/s)
    uniform_tok_s: float
    #: why the two are the same (:func:`routing_unchanged_reason`); None when they differ
    unchanged_reason: str | None


def routing_effect(hw, model, workload, engine: Engine, best: Candidate, options: ModelOptions = DEFAULT_OPTIONS,
                   limits: MemoryLimits | None = None) -> RoutingEffect | None:
    """The model's routing against uniform routing on the chosen policy ``best`` (one more
    estimate, with ``options`` and ``limits`` as the search had them, not a search); None
    when the model has no routing."""
    if model.routing is None:
        return None
    from hrm.estimate import estimate

    uniform = estimate(hw, model.with_routing(None), workload, best.policy, options=options, limits=limits,
                       engine=engine)
    planned_tok_s, uniform_tok_s = best.estimate.generation_throughput_tok_s, uniform.generation_throughput_tok_s
    same = math.isclose(planned_tok_s, uniform_tok_s, rel_tol=SAME_THROUGHPUT_REL)
    return RoutingEffect(model.routing.label(), planned_tok_s, uniform_tok_s,
                         routing_unchanged_reason(model, engine, best.policy) if same else None)


def routing_unchanged_reason(model, engine: Engine, policy) -> str:
    """Why a routing leaves the policy's estimate as uniform routing has it: every expert of a
    layer is active in each micro-batch under both, or the engine's cost at this policy does
    not depend on which experts are chosen."""
    from hrm.model.routing import expected_distinct_experts, routing_reach, uniform

    reach = routing_reach(engine, model.num_experts, model.top_k)
    if not reach.can_change_plan:
        return reach.reason
    tokens = policy.micro_batch_size  # one decode token per sequence of a micro-batch
    active = [float(expected_distinct_experts(r, tokens)) for r in
              (model.routing, uniform(model.num_experts, model.top_k))]
    if min(active) >= model.num_experts - ALL_EXPERTS_MARGIN:
        return (f"at mu={tokens} tokens per micro-batch all {model.num_experts} experts of a layer are active under "
                "either routing, so every layer moves and computes the same experts")
    return (f"{reach.reason}; none of these binds at this policy ({min(active):.1f}-{max(active):.1f} of "
            f"{model.num_experts} experts active per micro-batch)")
