"""Coefficients of the search problem, taken from the hrm model itself (one source of truth).

A *mode* fixes the discrete part of a policy that the model is non-linear in: the
micro-batch size μ and the placement (A_g, F_g). For a mode, every quantity the search
needs is affine in the remaining decisions, and the hrm functions hand us exactly those
affine coefficients (:class:`hrm.cost.latency.lane.Lane`, :class:`hrm.cost.memory.MemoryForm`):

- n (micro-batches), N = μ·n;
- m, the number of routed-expert matrices sets kept on the GPU: r_w = m / M where
  M = (MoE layers) × (experts) — r_w is realised in whole experts (the plan's placement);
- z = r_c·N, the (fractional) number of sequences whose KV cache stays on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from hrm.cost.costs import read_breakpoints
from hrm.cost.latency.decode import decode_resources
from hrm.cost.latency.lanes import layer_kinds, schedule_lanes, step_sync_s
from hrm.cost.latency.ops import lm_head_time_s
from hrm.cost.latency.prefill import prefill_resources
from hrm.engines.engine import Engine
from hrm.engines.rules import KV_LEVELS
from hrm.engines.space import allowed_placements, static_expert_step
from hrm.cost.memory import (MemoryLimits, cpu_memory_form, disk_spill_allowed, gpu_memory_form, host_floor_form,
                        spillable_weights_form)
from hrm.model.spec import ModelSpec
from hrm.pipelines.lanes import disk_lanes
from hrm.problem import Problem
from hrm.machine.rates import Rates
from hrm.cost.throughput import end_to_end_time_s
from hrm.workload import decode_contexts

# Default cap on the batch size N (sequences in flight); --max-batch overrides it. Every
# integer μ ≤ N is searched (no grid).
DEFAULT_MAX_BATCH = 16384


@dataclass(frozen=True)
class Mode:
    micro_batch_size: int
    attn_on_gpu: bool
    ffn_on_gpu: bool


def enumerate_modes(engine: Engine, mu_values, attn=None, ffn=None) -> list[Mode]:
    """Every (μ, A_g, F_g) with μ from ``mu_values`` that the engine runs, optionally pinned."""
    places = allowed_placements(engine, attn, ffn)
    return [Mode(int(mu), a, f) for mu in mu_values for a, f in places]


@dataclass(frozen=True)
class Choice:
    """A point of the search space in solver variables: the mode (an index into the terms'
    modes), n, m and z."""

    mode_index: int
    num_micro_batches: int
    gpu_experts: int  # m
    gpu_kv_sequences: float  # z


@dataclass(frozen=True)
class MemoryTerms:
    """The memory part of :class:`Terms` alone (per μ): cheap to evaluate for every μ, it
    screens the micro-batch sizes before any latency is computed."""

    mu: np.ndarray
    attn_on_gpu: np.ndarray
    ffn_on_gpu: np.ndarray
    expert_slots: int  # M
    gpu_const: np.ndarray
    gpu_per_seq: np.ndarray
    gpu_per_rw: np.ndarray
    gpu_kv_seq: float
    cpu_const: np.ndarray
    cpu_per_seq: np.ndarray
    cpu_per_rw: np.ndarray
    cpu_kv_seq: float
    limits: MemoryLimits


@dataclass(frozen=True)
class Terms(MemoryTerms):
    """Arrays indexed [mode, kind, lane, step] (decode) and [mode, kind, lane] (prefill): the
    coefficients of :class:`hrm.cost.latency.lane.Lane`, named after its fields (``prefill_`` for the
    prefill's).

    Decode layer time of kind κ at step t = max_ℓ n·per_micro_batch_s
    + (n − z/μ)·per_micro_batch_kv_cpu_s + (1 − m/M)·per_layer_offloaded_weights_s
    + per_layer_s (the weights term is zero for modes with experts on the CPU; it has no
    step axis); prefill likewise with the ``prefill_`` arrays.
    Each decode step adds ``sync`` (an engine's pipeline drain), m moves in steps of
    ``expert_step`` (the engine's static-weight granularity).
    Memory: bytes = const + per_seq·N + per_rw·(m/M) + kv_seq·z per tier.
    ``step_weight`` is the number of decode steps each evaluated context (column) stands
    for: 1 for the exact terms (one column per step); for ``build_terms(blocks=B)`` the
    steps are cut into B consecutive blocks, each evaluated at its mean context. For
    ``build_terms(pieces=True)`` the columns are the decode steps ``step_index`` between
    which every coefficient is affine: sums over the steps are exact from them (and
    ``step_weight`` holds each column's weight in such a sum).
    """

    modes: list[Mode]
    kind_layers: np.ndarray  # layers per kind
    per_micro_batch_s: np.ndarray  # [mode, kind, lane, step]
    per_micro_batch_kv_cpu_s: np.ndarray  # [mode, kind, lane, step]
    per_layer_offloaded_weights_s: np.ndarray  # [mode, kind, lane]
    per_layer_s: np.ndarray  # [mode, kind, lane, step]
    prefill_per_micro_batch_s: np.ndarray  # [mode, kind, lane]
    prefill_per_micro_batch_kv_cpu_s: np.ndarray
    prefill_per_layer_offloaded_weights_s: np.ndarray
    prefill_per_layer_s: np.ndarray
    sync: np.ndarray  # per decode step [mode, step]
    head: np.ndarray  # lm_head time per micro-batch, per mode
    steps: int
    gen_len: int
    expert_step: int  # m ∈ {0, step, 2·step, …, M}
    step_weight: np.ndarray | float = 1.0  # per column
    affine: np.ndarray | None = None  # [mode, kind]: every lane's step coefficients affine in the step
    # piecewise terms (build_terms(pieces=True)): the decode step of each column; every
    # coefficient is affine in the step between consecutive columns
    step_index: np.ndarray | None = None
    latency_limits: "LatencyLimits" = None  # set by build_terms (NO_LATENCY_LIMITS: none)
    # per mode, the shares of a micro-batch's KV the engine can keep on the GPU (increasing):
    # z ∈ {n·μ·s} (the engine's policy.kv_gpu_shares rule); None: any z
    kv_shares: tuple | None = None
    # the engine places weights only at some r_w (policy.weights_levels): a pinned level is
    # screened at the whole m below it and priced at its exact m = r_w·M (solver.lanes.exact)
    weights_levels: bool = False


def affine_in_step(arr: np.ndarray, rel_tol: float = 1e-12) -> np.ndarray:
    """Whether each row of ``arr`` [..., step] is affine in the step index (up to rounding)."""
    steps = arr.shape[-1]
    if steps < 3:
        return np.ones(arr.shape[:-1], dtype=bool)
    line = arr[..., :1] + (arr[..., -1:] - arr[..., :1]) * (np.arange(steps) / (steps - 1))
    scale = np.maximum(np.max(np.abs(arr), axis=-1), 1e-300)
    return np.max(np.abs(line - arr), axis=-1) <= rel_tol * steps * scale


#: the coefficients of a lane (:class:`hrm.cost.latency.lane.Lane`'s fields), the names of their arrays
LANE_COEFFICIENTS = ("per_micro_batch_s", "per_micro_batch_kv_cpu_s", "per_layer_offloaded_weights_s", "per_layer_s")
#: the one that does not change with the decode step (its arrays have no step axis)
WEIGHTS_COEFFICIENT = "per_layer_offloaded_weights_s"
#: the lane coefficients that change with the decode step, and with the per-step sync every
#: decode coefficient with a column per step (or per piece)
LANE_STEP_COEFFICIENTS = ("per_micro_batch_s", "per_micro_batch_kv_cpu_s", "per_layer_s")
STEP_COEFFICIENTS = (*LANE_STEP_COEFFICIENTS, "sync")


def build_terms(problem: Problem, modes: list[Mode], blocks: int | None = None, pieces: bool = False,
                latency_limits: "LatencyLimits | None" = None) -> Terms:
    """The coefficients of ``modes``: one column per decode step; or (``blocks``) one column
    per block of consecutive steps (:func:`context_blocks`) at the block's mean context,
    weighted by its size; or
    (``pieces``) columns only at the steps where some coefficient changes slope
    (:func:`affine_pieces`), from which every step sum is exact."""
    model, workload, engine, rates = problem.model, problem.workload, problem.engine, problem.rates
    mu = np.array([m.micro_batch_size for m in modes], dtype=float)[:, None]
    attn = np.array([m.attn_on_gpu for m in modes], dtype=float)[:, None]
    ffn = np.array([m.ffn_on_gpu for m in modes], dtype=float)[:, None]
    prompt = workload.effective_prompt_len
    contexts = decode_contexts(prompt, workload.gen_len)
    steps = len(contexts)
    step_weight, step_index = 1.0, None

    def decode_at(ctx: np.ndarray) -> dict:
        return _decode_coefficients(model, rates, engine, mu, attn, ffn, ctx[None, :], len(modes), problem)

    if not steps:  # gen 1: prefill only; evaluate the lanes at one context, keep no decode step
        coef = decode_at(np.array([float(prompt)]))
        coef = {key: (val if key == WEIGHTS_COEFFICIENT else val[..., :0]) for key, val in coef.items()}
    elif pieces and steps > 2:
        step_index, coef = affine_pieces(lambda t: decode_at(prompt + t.astype(float)), steps,
                                         read_break_steps(model, contexts))
        step_weight = piece_sum_weights(step_index)
    elif blocks:
        parts = context_blocks(model, contexts, blocks)
        coef = decode_at(np.array([part.mean() for part in parts]))
        step_weight = np.array([float(len(part)) for part in parts])
    else:
        coef = decode_at(contexts)
    head = np.asarray(lm_head_time_s(model, rates, mu[:, 0], engine), dtype=float) * np.ones(len(modes))
    mem = memory_terms(problem, mu[:, 0], attn[:, 0] > 0, ffn[:, 0] > 0)
    if step_index is not None:
        affine = np.ones(coef["per_micro_batch_s"].shape[:2], dtype=bool)
    elif blocks and steps:
        affine = None
    else:
        affine = np.all(np.logical_and.reduce([affine_in_step(coef[key]) for key in LANE_STEP_COEFFICIENTS]), axis=2)
    return Terms(
        **{f.name: getattr(mem, f.name) for f in fields(MemoryTerms)},
        modes=modes, kind_layers=np.array([count for _, count in layer_kinds(model)], dtype=float),
        **coef, **_prefill_coefficients(problem, mu[:, 0], attn[:, 0], ffn[:, 0], len(modes)), head=head, steps=steps,
        gen_len=workload.gen_len, expert_step=static_expert_step(model, engine),
        step_weight=step_weight, affine=affine, step_index=step_index,
        latency_limits=latency_limits or NO_LATENCY_LIMITS, kv_shares=kv_share_levels(problem, modes),
        weights_levels=problem.engine.policy.weights_levels is not None,
    )


def kv_share_levels(problem: Problem, modes: list[Mode]) -> tuple | None:
    """Per mode, the r_c the engine's ``policy.kv_gpu_shares`` rule realises at its μ
    (:data:`hrm.engines.rules.KV_LEVELS`), as arrays; None when the engine has no rule."""
    rule = problem.engine.policy.kv_gpu_shares
    if rule is None:
        return None
    cache: dict[int, np.ndarray] = {}
    for mode in modes:
        mu = int(mode.micro_batch_size)
        if mu not in cache:
            cache[mu] = np.asarray(KV_LEVELS[rule](problem.model, mu), dtype=float)
    return tuple(cache[int(m.micro_batch_size)] for m in modes)


def _prefill_coefficients(problem: Problem, mu: np.ndarray, attn: np.ndarray, ffn: np.ndarray, count: int) -> dict:
    """The prefill's lane coefficients [mode, kind, lane] (:class:`hrm.cost.latency.lane.Lane`'s fields,
    ``prefill_``-prefixed) of the micro-batch sizes ``mu``."""
    model, workload, engine, rates = problem.model, problem.workload, problem.engine, problem.rates
    per_kind = {name: [] for name in LANE_COEFFICIENTS}
    for moe, _count in layer_kinds(model):
        resources = prefill_resources(model, rates, mu, workload.effective_prompt_len, moe, engine,
                                              workload.gen_len)
        plan = (schedule_lanes(resources, engine, rates.shared_unit, "prefill")
                + disk_lanes(problem, mu, attn, ffn, resources))
        for name in LANE_COEFFICIENTS:
            per_kind[name].append([np.broadcast_to(getattr(lane, name), (count,)) for lane in plan])
    return {f"prefill_{name}": _stack(arrays, 2) for name, arrays in per_kind.items()}


def _decode_coefficients(model: ModelSpec, rates: Rates, engine: Engine, mu, attn, ffn, contexts: np.ndarray,
                         count: int, problem: Problem) -> dict:
    """Decode lane coefficients (:class:`hrm.cost.latency.lane.Lane`'s fields) [mode, kind, lane,
    column], the weights term [mode, kind, lane] and the per-step sync [mode, column] at
    ``contexts`` [1, column]."""
    shape_t = (count, contexts.shape[1])
    per_kind = {name: [] for name in LANE_COEFFICIENTS}
    sync = np.zeros(shape_t)
    for moe, _count in layer_kinds(model):
        resources = decode_resources(model, rates, mu, contexts, attn, ffn, moe, engine)
        lanes = schedule_lanes(resources, engine, rates.shared_unit) + disk_lanes(problem, mu, attn, ffn,
                                                                                           resources)
        for name in LANE_COEFFICIENTS:
            values = [np.broadcast_to(getattr(lane, name), shape_t) for lane in lanes]
            per_kind[name].append([v[:, 0] for v in values] if name == WEIGHTS_COEFFICIENT else values)
        if moe:
            sync = sync + np.broadcast_to(step_sync_s(resources, engine), shape_t)
    # kinds may have different lane counts (an engine's bounds): pad with empty lanes
    coef = {name: _stack(arrays, 2 if name == WEIGHTS_COEFFICIENT else 3) for name, arrays in per_kind.items()}
    return {**coef, "sync": sync}


def context_blocks(model: ModelSpec, contexts: np.ndarray, blocks: int) -> list[np.ndarray]:
    """``contexts`` in ``blocks`` runs of consecutive steps, each further cut where the attention's
    reads bend or fall (:func:`hrm.cost.costs.read_breakpoints`): every lane is convex in the
    context within a run, so a run's sum is at least its size × the value at its mean (Jensen:
    the bounds, :mod:`solver.lanes.bounds`)."""
    runs = []
    for part in np.array_split(contexts, min(blocks, len(contexts))):
        cuts = np.searchsorted(part, read_breakpoints(model, part[0], part[-1]))
        runs += [piece for piece in np.split(part, cuts) if len(piece)]
    return runs


def read_break_steps(model: ModelSpec, contexts: np.ndarray) -> np.ndarray:
    """Indices of the decode steps whose context is one of the model's read breakpoints
    (:func:`hrm.cost.costs.read_breakpoints`: a sliding window's end, a chunk's last and first)."""
    if not len(contexts):
        return np.zeros(0, dtype=int)
    return np.searchsorted(contexts, read_breakpoints(model, contexts[0], contexts[-1]))


def affine_pieces(evaluate, steps: int, seeds=()) -> tuple[np.ndarray, dict]:
    """The decode steps at which to evaluate coefficients so that every coefficient is affine
    between consecutive ones, and the coefficients there. Between consecutive ``seeds`` (steps
    where the attention's reads bend or fall: :func:`read_break_steps`) each coefficient is
    convex in the step (a roofline maximum of terms affine in the context; tested), and a convex
    function that meets its chord at one interior point is affine on the whole interval: a
    segment whose midpoint lies on every chord is affine, any other is halved (a few halvings
    per change of slope). ``evaluate(steps)`` returns the coefficient dict at those steps."""
    start = sorted({0, steps - 1} | {int(t) for t in seeds if 0 < t < steps - 1})
    known = dict.fromkeys(start)
    first = evaluate(np.array(start))
    columns = {t: _column(first, j) for j, t in enumerate(start)}
    open_segments = [(lo, hi) for lo, hi in zip(start, start[1:]) if hi - lo > 1]
    while open_segments:
        mids = np.array([(lo + hi) // 2 for lo, hi in open_segments])
        at_mid = evaluate(mids)
        still_open = []
        for j, (lo, hi) in enumerate(open_segments):
            mid = int(mids[j])
            columns[mid] = _column(at_mid, j)
            known[mid] = None
            if not _on_chord(columns[lo], columns[mid], columns[hi], (mid - lo) / (hi - lo)):
                still_open += [seg for seg in ((lo, mid), (mid, hi)) if seg[1] - seg[0] > 1]
        open_segments = still_open
    index = np.array(sorted(known))
    coef = {key: (columns[0][key] if key == WEIGHTS_COEFFICIENT
                  else np.stack([columns[int(t)][key] for t in index], axis=-1))
            for key in first}
    return index, coef


def _column(coef: dict, j: int) -> dict:
    return {key: (val if key == WEIGHTS_COEFFICIENT else val[..., j]) for key, val in coef.items()}


def _on_chord(left: dict, mid: dict, right: dict, theta: float, rel_tol: float = 1e-12) -> bool:
    """Whether every step-dependent coefficient at ``mid`` equals the interpolation of its
    values at ``left`` and ``right`` (up to rounding)."""
    for key in STEP_COEFFICIENTS:
        line = left[key] + (right[key] - left[key]) * theta
        scale = np.maximum(np.maximum(np.abs(left[key]), np.abs(right[key])), np.abs(mid[key]))
        if np.any(np.abs(mid[key] - line) > rel_tol * 8 * scale + 1e-300):
            return False
    return True


def piece_sum_weights(step_index: np.ndarray) -> np.ndarray:
    """Weights per column such that Σ_t f(t) over the steps 0 … step_index[-1] equals
    Σ_j weight_j · f(step_index[j]) for every f affine between consecutive columns (each
    segment's interior steps split between its two ends by their distance)."""
    weights = np.zeros(len(step_index))
    weights[0] += 1.0  # the first step itself
    for j in range(len(step_index) - 1):
        lo, hi = float(step_index[j]), float(step_index[j + 1])
        t = np.arange(lo + 1, hi + 1)  # steps (lo, hi], the right end included
        theta = (t - lo) / (hi - lo)
        weights[j] += float(np.sum(1 - theta))
        weights[j + 1] += float(np.sum(theta))
    return weights


def memory_terms(problem: Problem, mu, attn, ffn) -> MemoryTerms:
    """Per-tier memory coefficients (:class:`hrm.cost.memory.MemoryForm`) for arrays of μ and placement."""
    model, workload, engine = problem.model, problem.workload, problem.engine
    mu = np.atleast_1d(np.asarray(mu, dtype=float))
    ones = np.ones(len(mu))
    g = gpu_memory_form(model, workload, mu, attn, ffn, engine)
    cm = cpu_memory_form(model, workload, mu, attn, ffn, engine)
    if disk_spill_allowed(engine, problem.rates.disk_read_bytes_s, problem.limits):
        # weights may spill to disk: the host must hold the rest (the spill itself is the
        # disk lanes' time, :func:`hrm.pipelines.lanes.disk_lanes`)
        cm = host_floor_form(cm, spillable_weights_form(model, engine))
    return MemoryTerms(mu=mu, attn_on_gpu=np.asarray(attn, dtype=bool) & (ones > 0),
                       ffn_on_gpu=np.asarray(ffn, dtype=bool) & (ones > 0),
                       expert_slots=model.num_moe_layers * model.num_experts, gpu_const=g.const * ones,
                       gpu_per_seq=g.per_sequence * ones,
                       gpu_per_rw=g.per_weights_ratio * ones, gpu_kv_seq=float(g.per_gpu_kv_sequence),
                       cpu_const=cm.const * ones, cpu_per_seq=cm.per_sequence * ones,
                       cpu_per_rw=cm.per_weights_ratio * ones, cpu_kv_seq=float(cm.per_gpu_kv_sequence),
                       limits=problem.limits)


def tier_bytes(terms: Terms, k: int, batch_size, gpu_experts) -> tuple[np.ndarray, np.ndarray]:
    """(GPU, CPU) bytes of mode k before the KV kept on the GPU: const + per_seq·N +
    per_rw·(m/M) (:class:`hrm.cost.memory.MemoryForm`'s coefficients; the MILP states the same sum
    as constraints)."""
    frac = np.asarray(gpu_experts, dtype=float) / terms.expert_slots
    batch_size = np.asarray(batch_size, dtype=float)
    return (terms.gpu_const[k] + terms.gpu_per_seq[k] * batch_size + terms.gpu_per_rw[k] * frac,
            terms.cpu_const[k] + terms.cpu_per_seq[k] * batch_size + terms.cpu_per_rw[k] * frac)


def largest_static_experts(terms: MemoryTerms) -> np.ndarray:
    """m_max per mode: the most expert matrices any feasible policy keeps on the GPU — the
    GPU (or shared) limit at N = μ and z = 0, since N and z only add GPU bytes (checked:
    otherwise M). Whole expert slots, except for an engine that places weights at its own
    levels (``weights_levels``: FlexGen's whole tensors, whose smallest level is a norm's
    share, far below one expert): there the share the room holds, unrounded, bounds every
    level that fits."""
    M = float(terms.expert_slots)
    lim = terms.limits
    ffn = terms.ffn_on_gpu
    if lim.shared:
        room = lim.cpu_bytes - terms.gpu_const - terms.cpu_const - (terms.gpu_per_seq + terms.cpu_per_seq) * terms.mu
        per_rw = terms.gpu_per_rw + terms.cpu_per_rw
        growing = (terms.gpu_per_seq + terms.cpu_per_seq >= 0) & (terms.gpu_kv_seq + terms.cpu_kv_seq >= 0)
    else:
        room = lim.gpu_bytes - terms.gpu_const - terms.gpu_per_seq * terms.mu
        per_rw = terms.gpu_per_rw
        growing = (terms.gpu_per_seq >= 0) & (terms.gpu_kv_seq >= 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = room * M / np.where(per_rw > 0, per_rw, 1.0)
        most = np.clip(share if getattr(terms, "weights_levels", False) else np.floor(share), 0, M)
        m_max = np.where((per_rw > 0) & growing, most, M)
    return np.where(ffn, m_max, 0.0)


def max_micro_batches(terms: MemoryTerms, max_batch: int) -> np.ndarray:
    """Upper bound n̄_k per mode from the batch cap and the memory limits, each tier at its
    loosest over the policies of the mode: m between 0 and m_max (the most experts one
    micro-batch leaves room for), z between 0 and N with attention on the GPU, 0 without."""
    lim = terms.limits
    mu = terms.mu
    attn = np.asarray(terms.attn_on_gpu, dtype=float)
    share = largest_static_experts(terms) / terms.expert_slots
    bound = np.floor(max_batch / mu)
    with np.errstate(divide="ignore", invalid="ignore"):
        if lim.shared:
            per = terms.gpu_per_seq + terms.cpu_per_seq + min(0.0, terms.gpu_kv_seq + terms.cpu_kv_seq) * attn
            room = (lim.cpu_bytes - terms.gpu_const - terms.cpu_const
                    - np.minimum(0, (terms.gpu_per_rw + terms.cpu_per_rw) * share))
            bound = np.minimum(bound, np.floor(room / np.maximum(per, 1e-9) / mu))
        else:
            per_gpu = terms.gpu_per_seq + min(0.0, terms.gpu_kv_seq) * attn
            room = lim.gpu_bytes - terms.gpu_const - np.minimum(0, terms.gpu_per_rw * share)
            bound = np.minimum(bound, np.floor(room / np.maximum(per_gpu, 1e-9) / mu))
            per_cpu = terms.cpu_per_seq + min(0.0, terms.cpu_kv_seq) * attn
            room = lim.cpu_bytes - terms.cpu_const - np.minimum(0, terms.cpu_per_rw * share)
            bound = np.minimum(bound, np.floor(room / np.maximum(per_cpu, 1e-9) / mu))
    return np.maximum(np.nan_to_num(bound, nan=0.0, neginf=0.0), 0).astype(int)


def snapped_expert_count(terms: Terms, weights_gpu_ratio: float) -> int:
    """m for a pinned r_w: the nearest multiple of the engine's granularity at or below
    r_w·M (the engine floors, e.g. ``int(E·wg)`` experts per layer)."""
    g = terms.expert_step
    raw = weights_gpu_ratio * terms.expert_slots
    if g == 1 and getattr(terms, "weights_levels", False):
        return int(np.floor(raw + 1e-9))  # screening only: the level itself is priced exactly
    return int(np.floor(raw / g + 1e-9)) * g if g > 1 else int(round(raw))


def _stack(per_kind: list[list[np.ndarray]], ndim: int) -> np.ndarray:
    """[kind][lane] arrays over modes (× steps) → [mode, kind, lane(, step)], lanes padded
    with copies of the kind's first lane (a duplicate lane leaves the max unchanged)."""
    lanes = max(len(k) for k in per_kind)
    padded = [k + [k[0]] * (lanes - len(k)) for k in per_kind]
    arr = np.array(padded)
    return arr.transpose(2, 0, 1, 3) if ndim == 3 else arr.transpose(2, 0, 1)


def phase_times_s(terms: Terms, k, n, m, z, objective: str = "generation") -> tuple:
    """(prefill, decode) seconds of mode k (an index, or one per candidate) for candidate
    arrays (n micro-batches, m static expert matrices, z GPU-KV sequences):
    :func:`prefill_time_s` and :func:`decode_time_s`, each only where ``objective`` counts it
    (0 for the other phase of ``decode`` or ``prefill``)."""
    prefill = prefill_time_s(terms, k, n, m, z) if objective != "decode" else 0.0
    decode = decode_time_s(terms, k, n, m, z) if objective != "prefill" else 0.0
    return prefill, decode


def total_time_s(terms: Terms, k, n, m, z, objective: str = "generation") -> np.ndarray:
    """Model time of candidates that ``objective`` counts (:func:`hrm.cost.throughput.end_to_end_time_s`
    of :func:`phase_times_s`): prefill + decode, decode, or the prefill alone. The search,
    the verifier and the MILP's incumbent check call it."""
    return end_to_end_time_s(*phase_times_s(terms, k, n, m, z, objective), objective)


def _candidate_columns(terms: Terms, k, n, m, z):
    """([candidate, 1] arrays) n, the offloaded expert share 1 − m/M and the KV-on-CPU
    micro-batches n − z/μ."""
    n = np.atleast_1d(np.asarray(n, dtype=float))[:, None]
    frac_w = 1.0 - np.atleast_1d(np.asarray(m, dtype=float))[:, None] / terms.expert_slots
    col = np.asarray(terms.mu[k], dtype=float)[..., None]  # [1] for one mode, [candidates, 1] per candidate
    kv_cpu = n - np.atleast_1d(np.asarray(z, dtype=float))[:, None] / col
    return n, frac_w, kv_cpu


def decode_time_s(terms: Terms, k, n, m, z) -> np.ndarray:
    """Decode time of the whole batch: Σ_κ layers_κ · Σ_t max_ℓ (eq. 12 per decode step, with
    the lane form of :class:`Terms`) + the per-step sync and lm_head. The mean time per
    output token (TPOT) is this over ``terms.steps``."""
    n, frac_w, kv_cpu = _candidate_columns(terms, k, n, m, z)
    head = np.asarray(terms.head[k], dtype=float)
    total = terms.steps * n[:, 0] * head + (terms.step_weight * terms.sync[k]).sum(axis=-1)
    for q, layers in enumerate(terms.kind_layers):
        total = total + layers * decode_step_sum(terms, k, q, n, kv_cpu, frac_w)
    return total


def prefill_time_s(terms: Terms, k, n, m, z) -> np.ndarray:
    """Prefill time of the whole batch (every micro-batch's prompt and its first token's
    lm_head): when the last request of the batch gets its first token (TTFT)."""
    n, frac_w, kv_cpu = _candidate_columns(terms, k, n, m, z)
    total = n[:, 0] * np.asarray(terms.head[k], dtype=float)
    per_mb, per_mb_kv = terms.prefill_per_micro_batch_s, terms.prefill_per_micro_batch_kv_cpu_s
    weights, per_layer = terms.prefill_per_layer_offloaded_weights_s, terms.prefill_per_layer_s
    for q, layers in enumerate(terms.kind_layers):
        pre = [n[:, 0] * per_mb[k, q, lane] + kv_cpu[:, 0] * per_mb_kv[k, q, lane]
               + frac_w[:, 0] * weights[k, q, lane] + per_layer[k, q, lane] for lane in range(per_mb.shape[2])]
        total = total + layers * np.max(pre, axis=0)
    return total


@dataclass(frozen=True)
class LatencyLimits:
    """Service-level limits a policy must meet (None: no limit). ``tpot_s``: the mean time
    per output token of a request (:func:`decode_time_s` / decode steps, the estimate's
    ``per_token_latency_s``); ``ttft_s``: the time to the first token of the batch's last
    request (:func:`prefill_time_s`, the estimate's ``prefill_latency_s``)."""

    tpot_s: float | None = None
    ttft_s: float | None = None

    def __bool__(self) -> bool:
        return self.tpot_s is not None or self.ttft_s is not None

    def checks(self, steps: int) -> list[tuple[str, float]]:
        """(time kind of :func:`total_time_s`, the most seconds it may take) per limit."""
        out = []
        if self.tpot_s is not None and steps:
            out.append(("decode", self.tpot_s * steps))
        if self.ttft_s is not None:
            out.append(("prefill", self.ttft_s))
        return out


NO_LATENCY_LIMITS = LatencyLimits()
#: relative slack when checking a time against a latency limit (rounding between the terms
#: and the estimate's own sums)
LATENCY_RTOL = 1e-9


def meets_latency_limits(terms: Terms, k, n, m, z) -> np.ndarray:
    """Whether each candidate meets ``terms.latency_limits``."""
    ok = np.ones(np.shape(np.atleast_1d(n)), dtype=bool)
    for kind, most_s in terms.latency_limits.checks(terms.steps):
        ok &= total_time_s(terms, k, n, m, z, kind) <= most_s * (1 + LATENCY_RTOL)
    return ok


def decode_step_sum(terms: Terms, k, q: int, n, kv_cpu, frac_w) -> np.ndarray:
    """Σ_t max_ℓ lane_ℓ(t) of kind q for candidates ([candidate, 1] arrays). Where every lane
    is affine in t over a step range and one lane is the largest at both ends of it, it is
    the largest at every step of it (each lane's value is the same convex combination of its
    two end values): the range sums in closed form, count × the mean of the two ends; ranges
    whose ends disagree are halved until they agree (a few halvings per change of the
    leading lane). The ranges start as the whole decode (terms with one column per step whose
    rows are affine) or as the pieces of piecewise terms (values between columns
    interpolated); modes whose lanes are not affine are summed step by step."""
    columns = terms.per_micro_batch_s.shape[-1]
    pieces = terms.step_index is not None
    if columns < 2 or terms.affine is None or (np.ndim(terms.step_weight) and not pieces):
        return _dense_step_sum(terms, k, q, n, kv_cpu, frac_w)
    cand = np.arange(n.shape[0])
    k_c = np.broadcast_to(np.asarray(k), cand.shape)
    affine = terms.affine[k_c, q]
    out = np.zeros(len(cand))
    if not np.all(affine):
        dense = np.flatnonzero(~affine)
        out[dense] = _dense_step_sum(terms, k_c[dense], q, n[dense], kv_cpu[dense], frac_w[dense])
    idx = np.flatnonzero(affine)
    if pieces:  # ranges [s_0, s_1], [s_1 + 1, s_2], …: every step once, each inside one piece
        at = terms.step_index
        segs = np.arange(columns - 1)
        seg = np.tile(segs, len(idx))
        t0 = np.tile(np.r_[at[0], at[1:-1] + 1], len(idx))
        t1 = np.tile(at[1:], len(idx))
        idx = np.repeat(idx, len(segs))
    else:
        seg = np.zeros(len(idx), dtype=int)
        t0, t1 = np.zeros(len(idx), dtype=int), np.full(len(idx), columns - 1)
    nn, kv, fw = n[:, 0], kv_cpu[:, 0], frac_w[:, 0]

    def coefficient(arr, kk, t, j):  # arr[kk, q, lane] at step t (of piece j)
        if not pieces:
            return arr[kk, q, :, t]
        lo, hi = terms.step_index[j], terms.step_index[j + 1]
        theta = ((t - lo) / (hi - lo))[:, None]
        return arr[kk, q, :, j] * (1 - theta) + arr[kk, q, :, j + 1] * theta

    def values(i, t, j):
        kk = k_c[i]
        per_mb, per_mb_kv, per_layer = (coefficient(getattr(terms, name), kk, t, j) for name in LANE_STEP_COEFFICIENTS)
        return (nn[i][:, None] * per_mb + kv[i][:, None] * per_mb_kv
                + fw[i][:, None] * terms.per_layer_offloaded_weights_s[kk, q] + per_layer).T

    while len(idx):
        v0, v1 = values(idx, t0, seg), values(idx, t1, seg)
        agree = (np.argmax(v0, axis=0) == np.argmax(v1, axis=0)) | (t0 == t1)
        np.add.at(out, idx[agree], (t1 - t0 + 1)[agree] * (v0.max(axis=0) + v1.max(axis=0))[agree] / 2)
        split = ~agree
        mid = (t0[split] + t1[split]) // 2
        idx, seg = np.concatenate([idx[split], idx[split]]), np.concatenate([seg[split], seg[split]])
        t0, t1 = np.concatenate([t0[split], mid + 1]), np.concatenate([mid, t1[split]])
    return out


def _dense_step_sum(terms: Terms, k, q: int, n, kv_cpu, frac_w) -> np.ndarray:
    per_mb, per_mb_kv, per_layer = (getattr(terms, name) for name in LANE_STEP_COEFFICIENTS)
    weights = terms.per_layer_offloaded_weights_s
    lanes = [n * per_mb[k, q, lane] + kv_cpu * per_mb_kv[k, q, lane]
             + frac_w * np.asarray(weights[k, q, lane])[..., None] + per_layer[k, q, lane]
             for lane in range(per_mb.shape[2])]
    return (np.max(lanes, axis=0) * terms.step_weight).sum(axis=1)
