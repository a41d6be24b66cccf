"""Expert routing distributions: which experts a micro-batch touches (issue 13, part 1).

A distribution is, per MoE layer, each expert's *activation probability* q_e: the chance
that one token's top-k set contains expert e (so Σ_e q_e = k and 0 ≤ q_e ≤ 1). Tokens are
taken as independent, so for a micro-batch of t tokens

- expected distinct experts:   D(t) = Σ_e 1 − (1 − q_e)^t
  (uniform routing, q_e = k/ne: ne·(1 − (1 − k/ne)^t), docs/model.md §4.1);
- hit rate of a cache holding the set S of experts (per token activation):
  h(S) = Σ_{e∈S} q_e / k, best for S = the C hottest experts;
- bytes of the hot set: |S| × expert bytes; the cold set loads on demand.

Distributions: ``uniform``; ``zipf:S`` — expert popularity ∝ 1/rank^S, q = k·popularity
with any q above 1 capped and the excess spread over the rest (water-filling); ``trace:FILE``
— per-layer expert activation counts (MoE-Infinity's expert activation matrix summed over
sequences). :func:`sample_top_k_sets` draws token top-k sets with exactly these marginals
(systematic sampling), which is what the Monte-Carlo tests compare the formulas with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .. import bounds
from ..errors import HRMError, pydantic_message, read_json_object

TRACE_FORMAT = "hrm-routing-trace/1"
#: tolerance on Σ_e q_e = k of a distribution given as probabilities (float rounding)
PROBABILITY_SUM_TOLERANCE = 1e-6
#: layers of a model and of a trace: the deepest published decoders have ~130 (hrm.model.spec reads
#: config.json files against it too; it lives here because hrm.model.spec imports this module)
MAX_LAYERS = 1024
#: routed experts of a layer: the most published are ~512 per layer (as MAX_LAYERS, shared with hrm.model.spec)
MAX_EXPERTS = 1 << 16
#: expert counts of one trace, all layers together: 64x the largest published expert tables
#: (DeepSeek-V3: 58 MoE layers x 256 experts = 14,848); checked on the parsed JSON before any
#: layer is read, as are MAX_LAYERS and MAX_EXPERTS (override: reassign before loading)
MAX_TRACE_COUNTS = 1 << 20
#: integers of a trace (tokens, counts) are exact in float64 up to 2^53, where q = count / tokens is computed
MAX_TRACE_INTEGER = 2**53
TRACE_TOP_K = bounds.Range(1, MAX_TRACE_INTEGER, integer=True, why="experts per token")
TRACE_TOKENS = bounds.Range(1, MAX_TRACE_INTEGER, "tokens", integer=True, why="exact in float64")
TRACE_COUNT = bounds.Range(0, MAX_TRACE_INTEGER, integer=True, why="exact in float64")


class Routing(BaseModel):
    """A routing distribution over ``num_experts`` experts with top-``top_k`` per token.
    ``probabilities``: one row of q_e per MoE layer (a trace), or one row for all layers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["uniform", "zipf", "trace"]
    num_experts: int = Field(gt=0)
    top_k: int = Field(gt=0)
    zipf_s: Optional[float] = Field(default=None, ge=0, le=100)
    source: str = ""
    probabilities: tuple[tuple[float, ...], ...]

    @model_validator(mode="after")
    def _marginals(self):
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds num_experts ({self.num_experts})")
        q = np.asarray(self.probabilities, dtype=float)
        if q.ndim != 2 or q.shape[1] != self.num_experts or q.shape[0] < 1:
            raise ValueError(f"probabilities: expected rows of {self.num_experts} experts")
        if not np.all(np.isfinite(q)) or q.min() < 0 or q.max() > 1 + PROBABILITY_SUM_TOLERANCE:
            raise ValueError("probabilities: each q_e must be in [0, 1]")
        sums = q.sum(axis=1)
        if np.abs(sums - self.top_k).max() > PROBABILITY_SUM_TOLERANCE * self.top_k:
            raise ValueError(f"probabilities: each layer's q_e must sum to top_k = {self.top_k} "
                             f"(found {sums.min():.6g}..{sums.max():.6g})")
        return self

    @property
    def q(self) -> np.ndarray:
        """[layers, experts] activation probabilities (one row when layer-independent)."""
        return np.asarray(self.probabilities, dtype=float)

    def label(self) -> str:
        """The ``--routing`` text that names this distribution."""
        argument = {"uniform": "", "zipf": f":{self.zipf_s:g}" if self.zipf_s is not None else "",
                    "trace": f":{self.source}"}
        return self.kind + argument[self.kind]


def uniform(num_experts: int, top_k: int) -> Routing:
    return Routing(kind="uniform", num_experts=num_experts, top_k=top_k,
                   probabilities=((top_k / num_experts,) * num_experts,))


def capped_marginals(weights, top_k: int) -> np.ndarray:
    """q = k·w/Σw with every q ≤ 1: experts whose share would exceed 1 are set to 1 and the
    rest of the k activations are spread over the others in proportion to w (water-filling;
    exact in at most ne rounds)."""
    w = np.asarray(weights, dtype=float)
    if w.ndim != 1 or w.size < top_k or np.any(w < 0) or np.count_nonzero(w) < top_k:
        raise HRMError(f"expert weights: need at least top_k = {top_k} experts with positive weight")
    q = np.zeros_like(w)
    capped = np.zeros(w.size, dtype=bool)
    for _ in range(w.size):
        free = ~capped
        q[free] = (top_k - capped.sum()) * w[free] / w[free].sum()
        over = free & (q > 1.0)
        if not over.any():
            break
        capped |= over
        q[capped] = 1.0
    return q


def zipf(num_experts: int, top_k: int, s: float) -> Routing:
    """Expert e (rank e+1) chosen with popularity ∝ (e+1)^−s; s = 0 is uniform."""
    q = capped_marginals(np.arange(1, num_experts + 1, dtype=float) ** -float(s), top_k)
    return Routing(kind="zipf", num_experts=num_experts, top_k=top_k, zipf_s=float(s),
                   probabilities=(tuple(q.tolist()),))


def from_counts(counts, tokens, top_k: int, source: str = "") -> Routing:
    """A trace distribution from per-layer activation counts [layers, experts] and the
    tokens each layer routed (q = counts / tokens)."""
    counts = np.asarray(counts, dtype=float)
    tokens = np.asarray(tokens, dtype=float).reshape(-1, 1)
    if counts.ndim != 2 or tokens.shape[0] != counts.shape[0] or np.any(tokens <= 0):
        raise HRMError(f"routing trace {source}: expected expert counts per layer and a positive token count per layer")
    return Routing(kind="trace", num_experts=counts.shape[1], top_k=top_k, source=source,
                   probabilities=tuple(tuple(row) for row in (counts / tokens).tolist()))


class TraceLayer(BaseModel):
    """One MoE layer of a trace: the real tokens it routed and each expert's activations."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    tokens: TRACE_TOKENS.type
    expert_counts: tuple[TRACE_COUNT.type, ...]
    #: the layer's index in the model, as hrm run writes it (dense layers skipped): where present,
    #: indices increase from row to row and stay below MAX_LAYERS
    layer: Optional[TRACE_COUNT.type] = None

    @model_validator(mode="before")
    @classmethod
    def _fields_present(cls, data):
        if not isinstance(data, dict):
            raise ValueError(f"expected {{\"tokens\": T, \"expert_counts\": [...]}}, got {bounds.kind_of(data)}")
        missing = [key for key in ("tokens", "expert_counts") if key not in data]
        if missing:
            raise ValueError(f"missing or malformed field {missing[0]!r}")
        counts = data["expert_counts"]
        if isinstance(counts, list) and len(counts) > MAX_EXPERTS:
            raise ValueError(f"expert_counts: {len(counts)} experts (at most MAX_EXPERTS = {MAX_EXPERTS})")
        return data


class TraceFile(BaseModel):
    """A routing trace file (:data:`TRACE_FORMAT`, written by ``hrm run --routing-trace``): the
    fields :func:`load_trace` reads, each checked (strict integers, sizes capped before the
    layers are read); the run's other fields (model, micro_batches, sequences) are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    format: Literal["hrm-routing-trace/1"]
    #: the model the run routed (its spec name); a trace plans only that model
    model: Optional[bounds.Label] = None
    top_k: TRACE_TOP_K.type
    num_experts: Optional[TRACE_TOP_K.type] = None
    layers: tuple[TraceLayer, ...]

    @field_validator("layers", mode="before")
    @classmethod
    def _size_capped(cls, layers):
        """Refused by size before any layer is validated (a 20,000-layer file costs nothing)."""
        if not isinstance(layers, list):
            raise ValueError(f"expected a list of layers, got {bounds.kind_of(layers)}")
        if not layers:
            raise ValueError("every layer needs expert_counts; the trace has no layer")
        if len(layers) > MAX_LAYERS:
            raise ValueError(f"{len(layers)} layers (at most MAX_LAYERS = {MAX_LAYERS})")
        entries = sum(len(layer.get("expert_counts") or ()) for layer in layers if isinstance(layer, dict))
        if entries > MAX_TRACE_COUNTS:
            raise ValueError(f"{entries} expert counts in all (at most MAX_TRACE_COUNTS = {MAX_TRACE_COUNTS})")
        return layers

    @model_validator(mode="after")
    def _consistent(self):
        widths = [len(layer.expert_counts) for layer in self.layers]
        odd = next((p for p, width in enumerate(widths) if width != widths[0]), None)
        if odd is not None:
            raise ValueError(f"layers: every layer needs expert_counts of the same length (layer 0 has {widths[0]}, "
                             f"layer {odd} has {widths[odd]})")
        if self.num_experts is not None and self.num_experts != widths[0]:
            raise ValueError(f"num_experts: {self.num_experts}, but the layers count {widths[0]} experts")
        if self.top_k > widths[0]:
            raise ValueError(f"top_k: {self.top_k} exceeds the {widths[0]} experts of each layer")
        indices = [layer.layer for layer in self.layers]
        if any(index is not None for index in indices):
            bad = next((p for p, index in enumerate(indices) if index is None or index >= MAX_LAYERS
                        or (p and indices[p - 1] is not None and index <= indices[p - 1])), None)
            if bad is not None:
                raise ValueError(f"layers[{bad}]: layer index {indices[bad]}: expected one row per MoE layer, in "
                                 f"increasing order, each below MAX_LAYERS = {MAX_LAYERS}")
        for p, layer in enumerate(self.layers):  # exact integers: what hrm run writes adds up exactly
            where = f"layers.{p}.expert_counts"
            over = next((e for e, count in enumerate(layer.expert_counts) if count > layer.tokens), None)
            if over is not None:
                raise ValueError(f"{where}: expert {over} has {layer.expert_counts[over]} activations of "
                                 f"{layer.tokens} tokens (each q_e must be in [0, 1])")
            if sum(layer.expert_counts) != self.top_k * layer.tokens:
                raise ValueError(f"{where}: must sum to top_k x tokens = {self.top_k * layer.tokens} "
                                 f"(found {sum(layer.expert_counts)})")
        return self


def load_trace(path: str | Path, model_name: str | None = None) -> Routing:
    """A routing trace file (JSON, :data:`TRACE_FORMAT`): ``top_k``, ``layers`` — a list of
    ``{"tokens": T, "expert_counts": [c_0, ..., c_ne-1]}`` (Σ c = k·T per layer). One-line
    HRMError naming the file and the field for anything else (:class:`TraceFile`)."""
    data = read_json_object(path, "a routing trace (JSON)", finite=True)
    if data.get("format") != TRACE_FORMAT:
        raise HRMError(f"{path}: not a routing trace (expected \"format\": \"{TRACE_FORMAT}\")")
    try:
        trace = TraceFile.model_validate(data)
    except ValidationError as exc:
        raise HRMError(pydantic_message(str(path), exc)) from None
    if model_name is not None and trace.model is not None and trace.model != model_name:
        raise HRMError(f"{path}: model: the trace routed {trace.model!r}, not {model_name!r} (a router's choices "
                       "belong to the trained model that made them)")
    counts = [layer.expert_counts for layer in trace.layers]
    tokens = [layer.tokens for layer in trace.layers]
    try:
        return from_counts(counts, tokens, trace.top_k, source=str(path))
    except ValidationError as exc:  # marginals out of range: counts above tokens, sums not k·T
        raise HRMError(pydantic_message(str(path), exc)) from None


def parse_routing(text: str, num_experts: int, top_k: int, model_name: str | None = None) -> Routing:
    """``uniform``, ``zipf:S`` or ``trace:FILE`` (the ``--routing`` syntax); a trace of another
    model than ``model_name`` (where both are named) is refused."""
    kind, _, arg = text.partition(":")
    if kind == "uniform" and not arg:
        return uniform(num_experts, top_k)
    if kind == "zipf":
        try:
            s = float(arg)
        except ValueError:
            raise HRMError(f"--routing {text}: zipf needs an exponent, e.g. zipf:1.2") from None
        if not 0 <= s <= 100:
            raise HRMError(f"--routing {text}: the zipf exponent must be in [0, 100]")
        return zipf(num_experts, top_k, s)
    if kind == "trace" and arg:
        routing = load_trace(arg, model_name)
        if (routing.num_experts, routing.top_k) != (num_experts, top_k):
            raise HRMError(f"--routing {text}: the trace has {routing.num_experts} experts, top-{routing.top_k}; "
                           f"the model has {num_experts}, top-{top_k}")
        return routing
    raise HRMError(f"--routing {text}: expected uniform, zipf:S or trace:FILE")


# --- the quantities a distribution gives ----------------------------------------------------
def uniform_distinct_experts(num_experts: int, top_k: int, tokens) -> np.ndarray:
    """D(t) of uniform routing, ne·(1 − (1 − k/ne)^t) (docs/model.md §4.1); k for one token."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** np.asarray(tokens, dtype=float))


def expected_distinct_experts(routing: Routing, tokens) -> np.ndarray:
    """D(t) = Σ_e 1 − (1 − q_e)^t averaged over layers, for each t of ``tokens``."""
    t = np.asarray(tokens, dtype=float)
    if routing.kind == "uniform":
        return uniform_distinct_experts(routing.num_experts, routing.top_k, t)
    q = routing.q  # [layers, ne]
    untouched = (1.0 - q)[..., None] ** t.reshape(-1)  # [layers, ne, tokens]
    return (routing.num_experts - untouched.sum(axis=1)).mean(axis=0).reshape(t.shape)


def hottest_experts(routing: Routing, count: int) -> np.ndarray:
    """[layers, count] indices of each layer's ``count`` most activated experts."""
    return np.argsort(-routing.q, axis=1, kind="stable")[:, :count]


def cache_hit_rate(routing: Routing, cached_experts: int) -> float:
    """Share of token activations that find their expert among the ``cached_experts``
    hottest of its layer (a static hot-expert cache), averaged over layers: Σ_{top C} q / k."""
    count = max(0, min(int(cached_experts), routing.num_experts))
    top = np.take_along_axis(routing.q, hottest_experts(routing, count), axis=1)
    return float(top.sum(axis=1).mean() / routing.top_k)


def expected_misses(routing: Routing, cached_experts: int, tokens) -> np.ndarray:
    """Expected distinct experts a micro-batch of ``tokens`` needs that are not in the cache
    of the ``cached_experts`` hottest (each is one expert load): Σ_{e∉S} 1 − (1 − q_e)^t."""
    t = np.asarray(tokens, dtype=float)
    cached = max(0, min(int(cached_experts), routing.num_experts))
    if routing.kind == "uniform":  # every q_e = k/ne: the sum is (ne − C) equal terms, D(t)·(ne − C)/ne
        return uniform_distinct_experts(routing.num_experts, routing.top_k, t) * \
            ((routing.num_experts - cached) / routing.num_experts)
    q = routing.q
    cold = np.ones_like(q, dtype=bool)
    np.put_along_axis(cold, hottest_experts(routing, cached), False, axis=1)
    touched = 1.0 - (1.0 - q)[..., None] ** t.reshape(-1)
    return (touched * cold[..., None]).sum(axis=1).mean(axis=0).reshape(t.shape)


def sample_top_k_sets(routing: Routing, tokens: int, rng: np.random.Generator, layer: int = 0) -> np.ndarray:
    """[tokens, k] expert ids drawn independently per token with inclusion probabilities
    exactly q (systematic sampling over a random order: with every q ≤ 1 no expert is drawn
    twice, and P(e drawn) = q_e)."""
    q = routing.q[min(layer, routing.q.shape[0] - 1)]
    k = routing.top_k
    out = np.empty((tokens, k), dtype=np.int64)
    for i in range(tokens):
        order = rng.permutation(q.size)
        edges = np.concatenate(([0.0], np.cumsum(q[order])))
        edges[-1] = k  # absorb float rounding so every point lands in an interval
        points = rng.random() + np.arange(k)
        out[i] = order[np.searchsorted(edges, points, side="right") - 1]
    return out


def hot_and_cold_bytes(routing: Routing, expert_bytes: float, hot_count: int, tokens) -> tuple[float, np.ndarray]:
    """(bytes of one layer's hot set — the ``hot_count`` hottest experts, kept resident or
    prefetched —, expected bytes of the cold experts a micro-batch of ``tokens`` touches in
    a layer: :func:`expected_misses` × ``expert_bytes``, each loaded on demand)."""
    hot = max(0, min(int(hot_count), routing.num_experts)) * float(expert_bytes)
    return hot, expected_misses(routing, hot_count, tokens) * float(expert_bytes)


# --- whether a routing can change a plan ------------------------------------------------------
@dataclass(frozen=True)
class RoutingReach:
    """Which of an engine's costs depend on the experts tokens choose (:func:`routing_reach`)."""

    #: whether any modelled cost of the engine on this model depends on the routing
    can_change_plan: bool
    #: the costs that do (empty when none)
    costs: tuple[str, ...]
    #: one line: why a routing can (or cannot) change the plan
    reason: str


def routing_reach(engine, num_experts: int, top_k: int) -> RoutingReach:
    """Whether, and through which costs, a routing distribution can change the plan of
    ``engine`` (an :class:`hrm.engines.engine.Engine`) for a model of ``num_experts`` experts, top-``top_k``.
    Mirrors where hrm.cost.latency/hrm.cost.costs read the routing: the GPU's expert reads (distinct
    experts per micro-batch, unless the kernel reads them all), only-the-used experts copied for
    an offloaded op (``offloaded_experts: cpu``), expert-cache misses (``cached``/``cached-cpu``)
    and the expert-level pipeline's loads. Streamed offloaded experts cross the link as whole
    layers whatever the tokens choose, so there routing reaches only the GPU-side reads."""
    if top_k >= num_experts:
        return RoutingReach(False, (), f"every token uses all {num_experts} expert(s) of a layer: no routing changes "
                                       "which experts are read, moved or computed")
    costs = []
    if not engine.moe_reads_all_experts:
        costs.append("the GPU's reads of the experts a micro-batch uses (HBM)")
    mechanisms = {engine.decode.offloaded_experts, engine.prefill.offloaded_experts}
    if "cpu" in mechanisms and engine.offloaded_weights == "experts":
        costs.append("the used experts copied to the GPU for an offloaded op")
    if mechanisms & {"cached", "cached-cpu"}:
        costs.append("expert-cache misses (the cold experts a micro-batch touches)")
    if getattr(engine, "schedule", "") == "klotski":
        costs.append("the expert-level pipeline's expert loads")
    if not costs:
        return RoutingReach(False, (), f"engine {engine.name} reads every expert of a layer and moves offloaded "
                                       "experts as whole layers: no cost depends on which experts tokens choose")
    moved = [c for c in costs if "HBM" not in c]
    why = ("; ".join(costs) if moved else
           f"{costs[0]} only: engine {engine.name} streams offloaded experts as whole layers, so the link time does "
           "not depend on routing, and a plan bound by the link or the CPU is the same under any routing")
    return RoutingReach(True, tuple(costs), f"routing changes {why}")
