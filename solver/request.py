"""What every pipeline's search takes and gives: a checked :class:`SearchRequest` (a
:class:`hrm.problem.Problem` and the search's own settings) in, a :class:`SearchResult`
(the optimum, alternatives and the plan :func:`make_plan` builds) out."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hrm.engines.rules import CHOOSERS
from hrm.engines.engine import Engine, is_shipped
from hrm.errors import HRMError
from hrm.estimate import EstimateResult, estimate
from hrm.cost.memory import MemoryLimits
from hrm.model.options import DEFAULT_OPTIONS, ModelOptions
from hrm.plan import SCHEMA_VERSION, Plan, SearchSettings, ServerPick, SolverInfo, SpecRef
from hrm.policy import Policy
from hrm.problem import Problem

from .lanes.terms import Choice, LatencyLimits

CREATED_BY = "hrm-search 0.1.0"


@dataclass(frozen=True)
class Candidate:
    policy: Policy
    estimate: EstimateResult
    choice: Choice | None


@dataclass(frozen=True, kw_only=True)
class SearchStats:
    """What a pipeline's search reports of itself beside its optimum: what it maximised, over
    which space, how much of it it solved, and the notes a user reads with the result."""

    #: the optimum's value as the search computed it: tok/s of the objective it solved for
    #: (``SearchRequest.solve_for``; the lanes search solves the latency objective as decode
    #: tok/s at the pinned N), or for Klotski's search and the latency objective the per-token
    #: latency in seconds
    objective_value: float
    #: the objective asked for (one of :data:`solver.search.OBJECTIVES`)
    objective_name: str
    #: the search's notes (pins the engine added, caps it lowered, how it stopped), in order
    notes: tuple[str, ...]
    #: the TPOT and TTFT limits every policy searched had to meet
    latency_limits: LatencyLimits
    #: the engine searched (its schedule, its placements)
    engine: Engine
    #: the space searched, in words (the plan's solver name says it too)
    search_space: str
    #: modes of the space: (mu, placement) modes of the lanes search, (mu, n, layers)
    #: candidates of Klotski's
    modes_total: int
    #: candidates evaluated (the plan's ``solver.candidates_evaluated``)
    candidates_evaluated: int
    #: the largest micro-batch size mu searched
    mu_max: int
    #: with --verify: modes the verifier enumerated and certified, of ``verify_modes_total``
    verify_modes_enumerated: int | None = None
    #: with --verify: modes the verifier covered, enumerated or bounded
    verify_modes_total: int | None = None
    #: Klotski's search only: the n Klotski's own planner takes at the optimum's mu and
    #: placement (None: not Klotski's search, or no layer offloaded)
    klotski_own_num_micro_batches: int | None = None


@dataclass(frozen=True)
class SearchResult:
    """A pipeline's search, done: the optimum, the best of every other placement, the plan,
    and the search's own record (:class:`SearchStats`). Changed only with
    :func:`dataclasses.replace` (:func:`with_note`, :func:`with_server_pick`)."""

    best: Candidate
    alternatives: list[Candidate]
    plan: Plan
    solver_name: str
    seconds: float
    iterations: int
    verified: bool | None
    verify_objective: float | None
    verify_seconds: float | None
    stats: SearchStats


def _problem_part(name: str) -> property:
    """A read-only attribute of a request that is its problem's ``name``."""
    return property(lambda request: getattr(request.problem, name), doc=f"the problem's ``{name}``")


@dataclass(frozen=True, kw_only=True)
class SearchRequest:
    """A checked search (:func:`solver.search.search`'s arguments: the problem with the
    engine resolved, the user's pins merged with the engine's), handed to the search of the
    engine's pipeline. ``solve_for`` is the throughput the search maximises (``decode`` for
    the ``latency`` objective); ``start`` the ``time.perf_counter()`` the search began at."""

    problem: Problem
    objective: str
    solve_for: str
    fixed: dict
    notes: list
    max_batch: int
    top: int
    solver: str
    verify: bool
    hw_name: str | None
    model_name: str | None
    latency_limits: LatencyLimits
    start: float
    #: the batch cap asked for, before the engine's own limit lowered it (``max_batch``): a
    #: re-plan for another engine starts from it
    asked_max_batch: int | None = None
    #: seconds a branch and bound may run before it returns its best (None: the pipeline's default)
    time_limit_s: float | None = None

    # the problem's parts, as the pipelines' searches read them
    hw = _problem_part("hw")
    model = _problem_part("model")
    workload = _problem_part("workload")
    engine = _problem_part("engine")
    options = _problem_part("options")
    limits = _problem_part("limits")


def make_plan(request: SearchRequest, best: EstimateResult, placement, solver_name: str, seconds: float,
              candidates: int) -> Plan:
    """The plan of a search's optimum, for every pipeline."""
    hw, model, engine = request.hw, request.model, request.engine
    return Plan(
        schema_version=SCHEMA_VERSION,
        hardware=SpecRef(name=request.hw_name or hw.name, sha256=hw.sha256()),
        model=SpecRef(name=request.model_name or model.name, sha256=model.sha256()),
        workload=request.workload,
        policy=best.policy,
        schedule=engine.schedule,
        engine=engine.name,
        engine_definition=None if is_shipped(engine) else engine,
        routing=model.routing,
        estimate=best.to_plan_estimate(),
        placement=placement,
        solver=SolverInfo(name=solver_name, seconds=seconds, optimal=True, candidates_evaluated=candidates),
        created_by=CREATED_BY,
        search=search_settings(request),
    )


def search_settings(request: SearchRequest) -> SearchSettings:
    """What the plan records of the search beside hardware, model and workload (a re-plan
    for another engine repeats it: :mod:`solver.retarget`)."""
    limits = request.limits
    return SearchSettings(objective=request.objective, max_tpot_s=request.latency_limits.tpot_s,
                          max_ttft_s=request.latency_limits.ttft_s,
                          max_batch=request.asked_max_batch or request.max_batch,
                          gpu_limit_bytes=limits.gpu_bytes, cpu_limit_bytes=limits.cpu_bytes,
                          shared_memory=limits.shared)


def describe_limits(latency_limits: LatencyLimits) -> str:
    """The limits in words for the plan's solver name ('' without any)."""
    parts = []
    if latency_limits.tpot_s is not None:
        parts.append(f"TPOT <= {latency_limits.tpot_s * 1e3:g} ms")
    if latency_limits.ttft_s is not None:
        parts.append(f"TTFT <= {latency_limits.ttft_s:g} s")
    return f", subject to {' and '.join(parts)}" if parts else ""


def server_pick(hw, model, workload, engine: Engine, options: ModelOptions = DEFAULT_OPTIONS,
                limits: MemoryLimits | None = None) -> ServerPick | None:
    """The policy ``engine`` picks itself at launch (its ``policy.chosen_by``,
    :data:`hrm.engines.rules.CHOOSERS`), estimated as a search's best is (same engine and options;
    ``limits``: the memory it is checked against, e.g. :func:`hrm.cost.memory.physical_limits`);
    ``unavailable`` holds the one line why there is no pick. None: the engine runs the policy
    it is given."""
    name = engine.policy.chosen_by
    if name is None:
        return None
    chooser = CHOOSERS[name]
    try:
        policy, notes = chooser.choose(hw, model, workload)
        result = estimate(hw, model, workload, policy, options=options, limits=limits, engine=engine)
    except HRMError as exc:
        return ServerPick(chosen_by=name, program=chooser.program, unavailable=str(exc))
    if limits is not None and not result.fits(limits):
        notes = (*notes, f"HRM's memory model puts this pick above the memory it was checked against ({result.binding_memory}): "
                         "the server may fail to start")
    return ServerPick(chosen_by=name, program=chooser.program, policy=policy,
                      generation_throughput_tok_s=result.generation_throughput_tok_s,
                      decode_throughput_tok_s=result.decode_throughput_tok_s, notes=(*notes, *result.notes))


def with_note(result: SearchResult, note: str) -> SearchResult:
    """``result`` with ``note`` after the search's notes."""
    return replace(result, stats=replace(result.stats, notes=(*result.stats.notes, note)))


def with_server_pick(result: SearchResult, pick: ServerPick | None) -> SearchResult:
    """``result`` with its plan recording the engine's own pick (:func:`server_pick`)."""
    return replace(result, plan=result.plan.model_copy(update={"server_pick": pick}))
