"""Klotski (Fang et al., ASPLOS'25, arXiv:2502.06888, §4-§7) on the expert-level list scheduler of
:mod:`hrm.pipelines.list_scheduler`: its decode layer's durations, its task graph, its own choice of n and
the pipeline step by step. The engine ``klotski`` (a whole policy: times, memory) is the
expert-level pipeline, :mod:`hrm.pipelines.expert_level`, planned by :mod:`solver.expert_level`.

Klotski runs a *batch group* of n batches (μ sequences each) through every layer: the
attention of all n batches, then their gates, then each expert once for all n batches'
tokens, so one expert load serves n batches. During the attention it prefetches the gate
and the K hottest experts (K = top-k, §5.1), loads the cold experts the gates pick on
demand, and computes hot experts first so cold loads hide behind them.

- :func:`klotski_layer` — one layer's durations from the cost model (GPU roofline of each
  task, CPU→GPU loads over the engine's weight path, :func:`hrm.cost.latency.transfers.weight_transfer_s`),
  with the hot set and the expected number of distinct cold experts from the routing
  distribution (:mod:`hrm.model.routing`); options give the engine's placement: experts of the
  layer resident, non-expert weights resident, a share of the KV cache in host memory
  loaded per batch (:func:`hrm.cost.latency.transfers.kv_load_s`);
- :func:`klotski_batches` — Klotski's own choice of n: the smallest n that satisfies its
  inequalities (4)-(7) (§7), with the durations taken at each n;
- :data:`PIPELINE_STEPS` and :func:`pipeline_steps` — the paper's construction step by step
  (simple pipeline → + multi-batch → + hot-only prefetch → + hot-first order);
- :func:`klotski_layer_tasks` / :func:`expert_schedule` / :func:`schedule_layer` — the task
  graph of the decode layers on the generic list scheduler and its steady-state period.

Mechanisms of the engine, from the public implementation (mindspore-lab/models@220d9e77,
``research/SYSU/Klotski/``, paths relative to it) where the paper is silent:

- experts run hot first, then the cold ones in load order, each expert for every batch in
  turn — one call per (expert, batch), so a batch's call reads the expert from HBM again
  (``pytorch_backend.py:449-486``; paper Algorithm 1 line 7);
- the KV cache of a layer stays on the GPU when it fits, else in host memory (the greedy
  fill: dense weights, then KV, then experts layer by layer, ``mixtral/configuration_mixtral.py:63-182``);
  a host-resident cache is loaded per batch before its attention, double-buffered, and the
  new token's slice stored back (``mixtral/mixtral.py:307-328,1090-1099``); it is not
  pinned (``pytorch_backend.py:259-260``, FlexGen's "high memory overhead" note);
- non-expert weights and hidden states stay on the GPU when the dense weights fit
  (``mixtral/mixtral.py:88,137,241,368,556-557``); a layer's experts on the GPU are the
  greedy fill's whole layers;
- the GPU reserves one layer's experts for the loaded ones (``expert * 8``,
  ``mixtral/configuration_mixtral.py:113``);
- host syncs: the gate's choice read per batch and each expert's token list per (expert,
  batch) (``mixtral/mixtral.py:777,801``; ``pytorch_backend.py:454-458``) — a measured
  profile's dispatch α is charged to those tasks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from ..cost import costs
from ..cost.latency import transfers  # by module: kv_load_s names a duration here
from ..cost.latency.dispatch import device_attention_alpha_s, dispatch_alpha_s
from ..cost.latency.ops import attention_rows, gpu_time_s
from ..cost.costs import OpCost
from ..engines.engine import IDEAL, Engine
from ..machine.launches import charged
from ..model.spec import ModelSpec
from ..machine.rates import Rates
from ..model.routing import Routing, expected_misses, uniform
from .list_scheduler import (Task, TaskQueues, TimedQueues, Timeline, layer_ends_s, layer_period_s, list_schedule,
                             scheduled_tasks)

#: the most batches per group :func:`klotski_batches` tries (the paper's planner caps n by memory)
MAX_BATCH_GROUP = 512
#: the scheduler runs a group of more batches as this many equal chunks of batches (each
#: chunk's tasks the sum of its batches'): the pipeline's fill and drain then cost at most
#: one chunk, 1/64 of the attention phase, instead of one batch (tests bound the difference)
MAX_SCHEDULED_BATCHES = 64


@dataclass(frozen=True)
class KlotskiLayer:
    """Durations of one layer for a group of ``num_batches`` batches of μ sequences: per
    batch ``attention_s`` (pre-attention, attention, O projection) and ``gate_s``, and the
    loads and stores of its host-resident KV cache; per expert one ``(load_s, compute_s per
    batch)``; loads of the gate and attention weights."""

    num_batches: int
    attention_s: float
    gate_s: float
    gate_load_s: float
    attention_load_s: float
    expert_load_s: float
    hot: list[tuple[float, float]]
    cold: list[tuple[float, float]]
    kv_load_s: float = 0.0
    kv_store_s: float = 0.0
    #: per layer, the group's busy seconds on capacity-bound resources (the staging-copy
    #: team ``copy``, its cores' share ``cpu``, host DRAM ``dram``): they limit the period,
    #: they do not queue (as the lanes pipeline's bounds, :func:`hrm.cost.latency.lanes.schedule_lanes`)
    capacity_s: tuple[tuple[str, float], ...] = ()

    @property
    def hot_compute_s(self) -> float:
        """t_c_hot-E of eq. (6): the hot experts over all n batches."""
        return self.num_batches * sum(c for _, c in self.hot)

    @property
    def cold_compute_s(self) -> float:
        """Σ_{i∈Q} t_c_Ei of eq. (7): the cold experts over all n batches."""
        return self.num_batches * sum(c for _, c in self.cold)


def _split_router(post: OpCost, model: ModelSpec, tokens: float) -> tuple[OpCost, OpCost]:
    """(post-attention without the router, the router) of :func:`hrm.cost.costs.post_attention`."""
    gate = costs.router(model, tokens)
    rest = replace(post, flops=post.flops - gate.flops, weight_bytes=post.weight_bytes - gate.weight_bytes)
    return rest, gate


def expert_compute_s(model: ModelSpec, rates: Rates, tokens, engine: Engine = IDEAL):
    """One expert's SwiGLU call on ``tokens`` tokens (expected, may be fractional; array) on
    the GPU: its weights read once from HBM, 2·3·h·h2 FLOPs per token."""
    t = np.asarray(tokens, dtype=float)
    seconds = np.asarray(gpu_time_s(costs.single_expert(model, t), rates, np.maximum(t, 1.0), engine,
                                            kernel=True), dtype=float)
    return float(seconds) if seconds.ndim == 0 else seconds


def task_dispatch_s(rates: Rates, engine: Engine = IDEAL) -> dict[str, float]:
    """A measured profile's α per Klotski task (0 on a datasheet profile): a batch's
    attention task (pre-attention, attention, O projection), its gate with the host reading
    its choice, one expert call per batch with its token list read on the host, one copy.

    Without a measured dispatch, the engine's counted host operator calls (:mod:`hrm.machine.launches`)
    at the machine's per-op costs, serial with the task: every Klotski expert call and gate
    ends in a host read of the GPU's result (``sync``), so host issue and GPU work alternate
    rather than overlap."""
    g = rates.gpu_dispatch
    ops, op = engine.launches, rates.op_costs
    if charged(ops, op):  # op_costs: a GPU host without a measured dispatch
        issue = (lambda kernels, syncs: op.gpu_op_s * kernels + op.sync_bubble_s * syncs)
        return {"attention": issue(ops.gpu_ops + ops.copies, ops.syncs) + op.cpu_op_s * ops.cpu_ops, "gate": 0.0,
                "expert": issue(ops.expert_gpu_ops + ops.expert_copies, ops.expert_syncs), "copy": op.gpu_op_s,
                "kv_load": 2 * op.gpu_op_s, "kv_store": 2 * op.gpu_op_s}
    a = (lambda name: dispatch_alpha_s(g, name))
    return {"attention": a("task_s") + a("pre_attn_s") + device_attention_alpha_s(g) + a("post_attn_s"),
            "gate": a("task_s"), "expert": a("task_s") + a("expert_s"), "copy": a("copy_s"),
            "kv_load": 2 * a("copy_s") + a("kv_load_s"), "kv_store": 2 * a("copy_s") + a("kv_store_s")}


def batch_durations(model: ModelSpec, rates: Rates, micro_batch, context, engine: Engine = IDEAL,
                    kv_gpu_ratio=1.0, prompt_len: int | None = None, moe: bool = True) -> dict:
    """Per-batch durations of a layer (arrays broadcast over μ and r_c): ``attention_s``
    (pre-attention, attention, O projection and shared experts; a dense layer's MLP too),
    ``gate_s``, and the load and store of its host-resident KV share (``kv_load_s``: the
    cached ``context`` tokens, decode only; ``kv_store_s``: the new tokens), with a measured
    profile's dispatch α. Decode at ``context``, or the prefill of ``prompt_len`` tokens."""
    mu = np.asarray(micro_batch, dtype=float)
    tokens = mu * (prompt_len if prompt_len is not None else 1)
    if prompt_len is None:
        ops = costs.decode_layer_ops(model, mu, context, moe)
        rows = attention_rows(model)
    else:
        ops = costs.prefill_layer_ops(model, mu, prompt_len, moe)
        rows = attention_rows(model, prompt_len)
    alpha = task_dispatch_s(rates, engine)
    host_kv = 1.0 - np.asarray(kv_gpu_ratio, dtype=float)
    post, gate = _split_router(ops.post_attn, model, tokens) if moe else (ops.post_attn, None)
    attention = (gpu_time_s(ops.pre_attn, rates, tokens, engine)
                 + gpu_time_s(ops.attention, rates, rows, engine)
                 + gpu_time_s(post, rates, tokens, engine) + alpha["attention"])
    if not moe:
        attention = attention + gpu_time_s(ops.ffn, rates, tokens, engine)
    zero = 0.0 * (mu + host_kv)
    return {
        "attention_s": attention + zero,
        "gate_s": (gpu_time_s(gate, rates, tokens, engine) + alpha["gate"] if moe else 0.0) + zero,
        **batch_kv_s(model, rates, mu, context, engine, kv_gpu_ratio, prompt_len),
    }


def batch_kv_s(model: ModelSpec, rates: Rates, micro_batch, context, engine: Engine = IDEAL, kv_gpu_ratio=1.0,
               prompt_len: int | None = None) -> dict:
    """The host-resident KV share's part of :func:`batch_durations` (arrays broadcast over μ
    and r_c): ``kv_load_s``, ``kv_store_s`` and their host-DRAM seconds ``kv_dram_s``. Apart
    because only these depend on r_c: the search evaluates the rest once per μ."""
    mu = np.asarray(micro_batch, dtype=float)
    tokens = mu * (prompt_len if prompt_len is not None else 1)
    alpha = task_dispatch_s(rates, engine)
    kv_path = engine.decode.kv_cache if prompt_len is None else engine.prefill.kv_cache
    kv_token = costs.kv_bytes_per_token(model)
    host_kv = 1.0 - np.asarray(kv_gpu_ratio, dtype=float)
    loaded = host_kv * mu * costs.attended_context(model, float(context)) * kv_token if prompt_len is None \
        else 0.0 * host_kv
    stored = host_kv * tokens * kv_token
    zero = 0.0 * (mu + host_kv)
    kv_in = transfers.kv_load_s(rates, engine, kv_path, loaded)
    kv_out = transfers.kv_cache_s(rates, engine, kv_path, stored)
    return {
        "kv_load_s": np.where(loaded > 0, kv_in["h2d"] + alpha["kv_load"], 0.0) + zero,
        "kv_store_s": np.where(stored > 0, kv_out["d2h"] + alpha["kv_store"], 0.0) + zero,
        # host DRAM seconds of the KV loads and stores (a capacity bound when host_dram is modelled)
        "kv_dram_s": (kv_in["dram"] + kv_out["dram"]) + zero,
    }


def weight_load_s(rates: Rates, weight_bytes, engine: Engine = IDEAL, prefill: bool = False) -> dict:
    """Seconds per resource to load ``weight_bytes`` over the engine's weight path in the
    phase: :func:`hrm.cost.latency.transfers.weight_transfer_s` (the lanes pipeline's weight path), so a
    pageable path costs the same here as there."""
    path = engine.prefill.weight_path if prefill else engine.decode.weight_path
    return transfers.weight_transfer_s(rates, engine, path, weight_bytes)


def expert_load_s(model: ModelSpec, rates: Rates, engine: Engine = IDEAL, prefill: bool = False) -> float:
    """One expert's CPU→GPU load over the engine's weight path, with one copy's α."""
    return weight_load_s(rates, costs.expert_bytes(model), engine, prefill)["h2d"] + task_dispatch_s(rates, engine)["copy"]


def capacity_bounds_s(rates: Rates, engine: Engine, loaded_bytes: float, kv_dram_s: float,
                      prefill: bool = False) -> tuple[tuple[str, float], ...]:
    """A layer's busy seconds on the capacity-bound resources (:attr:`KlotskiLayer.capacity_s`):
    the staging-copy team and its cores for a pageable weight path, and host DRAM (weight
    loads and the KV cache's loads and stores) when the engine charges it (``host_dram``)."""
    weights = weight_load_s(rates, loaded_bytes, engine, prefill)
    bounds = {r: float(weights[r]) for r in ("copy", "cpu") if r in weights and loaded_bytes > 0}
    if engine.host_dram:
        bounds["dram"] = float(weights["dram"]) + float(kv_dram_s)
    return tuple((r, s) for r, s in bounds.items() if s > 0)


def experts_used(model: ModelSpec, group_tokens, routing: Routing | None = None) -> np.ndarray:
    """How many experts a group of ``group_tokens`` tokens (n·t; array) runs per layer: the
    top-k hot ones and the expected distinct cold ones (:func:`hrm.model.routing.expected_misses`,
    rounded to whole experts)."""
    routing = routing or model.routing or uniform(model.num_experts, model.top_k)
    cold = np.rint(expected_misses(routing, model.top_k, group_tokens))
    return np.minimum(model.top_k + cold, model.num_experts).astype(int)


def batch_expert_s(model: ModelSpec, rates: Rates, batch_tokens, routing: Routing | None = None,
                   engine: Engine = IDEAL) -> np.ndarray:
    """[..., ne] seconds of each expert's call for one batch of ``batch_tokens`` tokens
    (array), hottest expert (by mean activation probability) first: its expected t·q_e
    tokens, its weights read from HBM once per call."""
    routing = routing or model.routing or uniform(model.num_experts, model.top_k)
    q = np.sort(routing.q.mean(axis=0))[::-1]
    return expert_compute_s(model, rates, np.asarray(batch_tokens, dtype=float)[..., None] * q, engine)


def klotski_layer(model: ModelSpec, rates: Rates, micro_batch: int, context: float, num_batches: int,
                  routing: Routing | None = None, *, engine: Engine = IDEAL, kv_gpu_ratio: float = 1.0,
                  experts_resident: bool = False, dense_resident: bool = False, prompt_len: int | None = None,
                  moe: bool = True) -> KlotskiLayer:
    """The durations of one layer (module docstring): per batch :func:`batch_durations`;
    the :func:`experts_used` of the group's n·t tokens, hottest first, each one call per
    batch (:func:`batch_expert_s`, plus one expert call's α).
    ``kv_gpu_ratio`` of the cache is on the GPU, the rest loaded per batch.
    ``experts_resident``: the layer's experts are on the GPU (no loads); ``dense_resident``:
    its attention and gate weights are (eq. 7 loads them every layer otherwise). A dense
    layer (``moe=False``) is its attention and MLP, resident."""
    n = int(num_batches)
    per_batch = {k: float(v) for k, v in batch_durations(model, rates, micro_batch, context, engine, kv_gpu_ratio,
                                                         prompt_len, moe).items()}
    prefill = prompt_len is not None
    if not moe:
        return KlotskiLayer(n, per_batch["attention_s"], 0.0, 0.0, 0.0, 0.0, [], [], per_batch["kv_load_s"],
                            per_batch["kv_store_s"],
                            capacity_bounds_s(rates, engine, 0.0, n * per_batch["kv_dram_s"], prefill))
    tokens = float(micro_batch) * (prompt_len if prefill else 1)
    used = int(experts_used(model, n * tokens, routing))
    seconds = batch_expert_s(model, rates, tokens, routing, engine)
    load = 0.0 if experts_resident else expert_load_s(model, rates, engine, prefill)
    call = task_dispatch_s(rates, engine)["expert"]
    experts = [(load, float(c) + call) for c in seconds[:used]]
    static = 0.0 if dense_resident else 1.0
    wb = costs.static_bytes_per_param(model)
    gate_bytes = static * costs.router_params(model) * wb
    attention_bytes = static * (costs.moe_layer_static_params(model) - costs.router_params(model)) * wb
    loaded = gate_bytes + attention_bytes + (0.0 if experts_resident else used * costs.expert_bytes(model))
    return KlotskiLayer(
        num_batches=n, attention_s=per_batch["attention_s"], gate_s=per_batch["gate_s"],
        gate_load_s=weight_load_s(rates, gate_bytes, engine, prefill)["h2d"],
        attention_load_s=weight_load_s(rates, attention_bytes, engine, prefill)["h2d"],
        expert_load_s=load, hot=experts[:model.top_k], cold=experts[model.top_k:],
        kv_load_s=per_batch["kv_load_s"], kv_store_s=per_batch["kv_store_s"],
        capacity_s=capacity_bounds_s(rates, engine, loaded, n * per_batch["kv_dram_s"], prefill))


def inequalities_hold(layer: KlotskiLayer) -> list[bool]:
    """Klotski's inequalities (4)-(7) (§6.2) for the layer's n: the gate, the hot experts,
    the first cold expert and the next attention arrive before they are needed."""
    n, ta, tg = layer.num_batches, layer.attention_s, layer.gate_s
    io_g, io_e, io_a, hot_k = layer.gate_load_s, layer.expert_load_s, layer.attention_load_s, len(layer.hot)
    return [
        n * ta >= io_g,                                                                     # (4)
        n * (ta + tg) >= io_g + hot_k * io_e,                                               # (5)
        n * (ta + tg) + layer.hot_compute_s >= io_g + (hot_k + 1) * io_e,                   # (6)
        n * (ta + tg) + layer.hot_compute_s + layer.cold_compute_s
        >= io_g + (hot_k + len(layer.cold)) * io_e + io_a,                                  # (7)
    ]


def klotski_batches(model: ModelSpec, rates: Rates, micro_batch: int, context: float,
                    routing: Routing | None = None, max_batches: int = MAX_BATCH_GROUP, **layer_options) -> int | None:
    """Klotski's n: the smallest batch-group size whose durations satisfy (4)-(7) (None when
    no n up to ``max_batches`` does: the link cannot keep up at this μ). ``layer_options``
    go to :func:`klotski_layer` (the inequalities do not see a host KV cache's loads)."""
    for n in range(1, max_batches + 1):
        if all(inequalities_hold(klotski_layer(model, rates, micro_batch, context, n, routing, **layer_options))):
            return n
    return None


@dataclass(frozen=True)
class PipelineStep:
    name: str
    multi_batch: bool
    prefetch_hot: bool
    order: str


#: the paper's construction (§4, Fig. 4 and 7): each step adds one idea to the one before
PIPELINE_STEPS = (
    PipelineStep("simple pipeline (one batch, experts loaded after the gate)", False, False, "as-routed"),
    PipelineStep("+ multi-batch (n batches share each expert load)", True, False, "as-routed"),
    PipelineStep("+ hot-only prefetch (gate and top-k experts during attention)", True, True, "as-routed"),
    PipelineStep("+ hot-first order (cold loads hide behind hot compute)", True, True, "hot-first"),
)


@dataclass(frozen=True)
class StepResult:
    step: PipelineStep
    num_batches: int
    schedule: ExpertSchedule
    decode_tok_s: float  # n·μ tokens per decode step of model.num_layers layers


def chunked(layer: KlotskiLayer, max_batches: int = MAX_SCHEDULED_BATCHES) -> KlotskiLayer:
    """``layer`` with its batches grouped into at most ``max_batches`` equal chunks (the
    per-batch durations scaled by batches per chunk; loads unchanged), for the scheduler."""
    n = layer.num_batches
    if n <= max_batches:
        return layer
    f = n / max_batches
    scale = (lambda experts: [(load, f * compute) for load, compute in experts])
    return replace(layer, num_batches=max_batches, attention_s=f * layer.attention_s, gate_s=f * layer.gate_s,
                   kv_load_s=f * layer.kv_load_s, kv_store_s=f * layer.kv_store_s, hot=scale(layer.hot),
                   cold=scale(layer.cold))


def schedule_layer(layer: KlotskiLayer, prefetch_hot: bool = True, order: str = "hot-first",
                   layers: int = 6, expert_buffers: int = 1) -> ExpertSchedule:
    """The list-scheduled steady-state layer of ``layer`` (:func:`expert_schedule` over
    ``layers`` layers; more than :data:`MAX_SCHEDULED_BATCHES` batches are scheduled in
    chunks, :func:`chunked`), its period at least each capacity bound's busy time."""
    layer = chunked(layer)
    scheduled = expert_schedule(layer.num_batches, layer.attention_s, layer.gate_s, layer.hot, layer.cold,
                                layers=layers, order=order, prefetch_hot=prefetch_hot, gate_load_s=layer.gate_load_s,
                                attention_load_s=layer.attention_load_s, expert_buffers=expert_buffers,
                                kv_load_s=layer.kv_load_s, kv_store_s=layer.kv_store_s)
    return with_capacity_bounds(scheduled, dict(layer.capacity_s))


def pipeline_steps(model: ModelSpec, rates: Rates, micro_batch: int, context: float, num_batches: int,
                   routing: Routing | None = None) -> list[StepResult]:
    """Each of :data:`PIPELINE_STEPS` at this μ (``num_batches`` for the multi-batch steps)."""
    out = []
    for step in PIPELINE_STEPS:
        n = num_batches if step.multi_batch else 1
        layer = klotski_layer(model, rates, micro_batch, context, n, routing)
        sched = schedule_layer(layer, step.prefetch_hot, step.order)
        per_step_s = sched.period_s * model.num_layers
        out.append(StepResult(step, n, sched, n * micro_batch / per_step_s if per_step_s > 0 else math.inf))
    return out


#: KV buffers a host-resident cache of Klotski is loaded into (Algorithm 1 lines 13-14: batch
#: k+1's cache loads while batch k computes)
KV_BUFFERS = 2

#: Klotski's expert compute orders: hot experts first (each over all batches), then the cold
#: ones in load order (paper §5); or batch by batch in the router's order, cold listed first
#: (the strawman of Fig. 7(c), whose GPU stalls on a cold expert while a hot one could run).
KLOTSKI_ORDERS = ("hot-first", "as-routed")


def _check_klotski(num_batches, durations_s, experts, layers, order, expert_buffers) -> None:
    if int(num_batches) != num_batches or num_batches < 1:
        raise ValueError(f"num_batches must be a positive integer, not {num_batches!r}")
    if int(layers) != layers or layers < 1:
        raise ValueError(f"layers must be a positive integer, not {layers!r}")
    if int(expert_buffers) != expert_buffers or expert_buffers < 1:
        raise ValueError(f"expert_buffers must be a positive integer, not {expert_buffers!r}")
    if order not in KLOTSKI_ORDERS:
        raise ValueError(f"order must be one of {', '.join(KLOTSKI_ORDERS)}, not {order!r}")
    for value in [*durations_s, *(x for pair in experts for x in pair)]:
        if not (np.isfinite(value) and value >= 0):
            raise ValueError(f"durations must be finite and ≥ 0 s, not {value!r}")


def klotski_layer_tasks(num_batches: int, attention_s: float, gate_s: float,
                        hot_experts: list[tuple[float, float]], cold_experts: list[tuple[float, float]], *,
                        layers: int = 6, order: str = "hot-first", prefetch_hot: bool = True,
                        gate_load_s: float = 0.0, attention_load_s: float = 0.0,
                        expert_buffers: int = 1, kv_load_s: float = 0.0, kv_store_s: float = 0.0) -> TaskQueues:
    """The task graph of ``layers`` Klotski decode layers (paper §5, Fig. 9, Algorithm 1) on
    the queues "gpu" (attention, gate, expert compute) and "h2d" (weight loads), for
    :func:`list_schedule`.

    Each expert is a ``(load_s, compute_s)`` pair: one CPU→GPU load per layer shared by the
    ``num_batches`` batches, and ``compute_s`` per batch (every batch routes tokens to
    every listed expert). ``attention_s`` and ``gate_s`` are per batch. Per layer the GPU
    runs attention of every batch, then the gate of every batch, then the experts in
    ``order`` (hot-first: one task per expert over all batches). The link loads, in this
    order: the attention weights (``attention_load_s``, double-buffered: during the previous
    layer's experts), the gate weights and the hot
    experts (prefetched: from the layer's start, during attention; after the first gate if
    not ``prefetch_hot``), then the cold experts on demand after the first gate (the first
    batch's gate selects them). An expert's compute for batch b waits for its load and
    batch b's gate; attention of batch b for its experts of the layer before.

    Buffer assumption: the GPU holds the gate and experts of ``expert_buffers`` layers; a
    layer's prefetch waits until the experts of the layer ``expert_buffers`` back have all
    been computed (1, Fig. 9: prefetch during the layer's own attention; 2: double-buffered
    slots, the next layer's hot experts load as soon as this layer's cold ones are in).

    A host-resident KV cache (``kv_load_s`` > 0, per batch): each batch's cache is loaded
    before its attention into one of two buffers (Algorithm 1 lines 13-14: batch k+1's cache
    loads while batch k computes; a load waits for the attention two batches back to free
    its buffer), and its new entries are stored back after it (``kv_store_s``, lines 16-17,
    on the "d2h" queue). The link takes the transfers in the order the host issues them
    (one copy engine per direction): the first batch's cache with the attention weights
    during the layer before (line 6), then the gate and hot experts at the layer's start,
    then the other batches' caches one by one, then the cold experts."""
    return _queue_layers(TaskQueues(KLOTSKI_RESOURCES), num_batches, attention_s, gate_s, hot_experts, cold_experts,
                         layers=layers, order=order, prefetch_hot=prefetch_hot, gate_load_s=gate_load_s,
                         attention_load_s=attention_load_s, expert_buffers=expert_buffers, kv_load_s=kv_load_s,
                         kv_store_s=kv_store_s)


#: the queues of Klotski's task graph: GPU compute, CPU→GPU and GPU→CPU copies
KLOTSKI_RESOURCES = ("gpu", "h2d", "d2h")


def _queue_layers(queues: TaskQueues | TimedQueues, num_batches, attention_s, gate_s, hot_experts, cold_experts, *,
                  layers, order, prefetch_hot, gate_load_s, attention_load_s, expert_buffers, kv_load_s, kv_store_s):
    """``queues`` with the tasks of :func:`klotski_layer_tasks` (same arguments) added."""
    _check_klotski(num_batches, (attention_s, gate_s, gate_load_s, attention_load_s, kv_load_s, kv_store_s),
                   [*hot_experts, *cold_experts], layers, order, expert_buffers)
    builder = _KlotskiGraph(queues, int(num_batches), attention_s, gate_s, hot_experts, cold_experts, order=order,
                            prefetch_hot=prefetch_hot, gate_load_s=gate_load_s, attention_load_s=attention_load_s,
                            expert_buffers=expert_buffers, kv_load_s=kv_load_s, kv_store_s=kv_store_s)
    for i in range(layers):
        builder.queue_layer(i)
    return queues


#: a queued task as the graph's queues return it: a :class:`Task`, or its end (:class:`TimedQueues`)
Queued = Task | float


class _KlotskiGraph:
    """The task graph of :func:`klotski_layer_tasks` while it is built (same arguments) on
    ``queues``: :class:`TaskQueues` (tasks, named for drawing) or :class:`TimedQueues` (end
    times only, for the search), both taking tasks as ``add(label, resource, seconds, deps,
    layer, batch, kind)`` (batch -1: every batch) and returning what later tasks depend on.
    Kept: every attention so far (KV buffer reuse), and per layer its last GPU task (its
    experts are then all computed) and its last attention; per batch its last expert of the
    layer before."""

    def __init__(self, queues: TaskQueues | TimedQueues, num_batches: int, attention_s: float, gate_s: float,
                 hot_experts, cold_experts, *, order: str, prefetch_hot: bool, gate_load_s: float,
                 attention_load_s: float, expert_buffers: int, kv_load_s: float, kv_store_s: float):
        self.queues = queues
        # names are labels of a drawing: only tasks kept for one get them
        self.add = self._add_named if isinstance(queues, TaskQueues) else queues.add
        self.n, self.attention_s, self.gate_s = num_batches, attention_s, gate_s
        self.hot_experts, self.cold_experts = hot_experts, cold_experts
        self.order, self.prefetch_hot, self.expert_buffers = order, prefetch_hot, expert_buffers
        self.gate_load_s, self.attention_load_s = gate_load_s, attention_load_s
        self.kv_load_s, self.kv_store_s = kv_load_s, kv_store_s
        self.names = [f"Hot{e}" for e in range(len(hot_experts))] + [f"Cold{e}" for e in range(len(cold_experts))]
        self.last_gpu: list[Queued] = []
        self.last_attention: list[Queued] = []
        self.batch_done: list[Queued | None] = [None] * num_batches
        self.attended: list[Queued] = []

    def _add_named(self, label: str, resource: str, seconds: float, deps, layer: int, batch: int, kind: str) -> Task:
        """A :class:`Task` named ``"{label} L{layer}"``, with `` b{batch}`` for one batch's."""
        name = f"{label} L{layer}" if batch < 0 else f"{label} L{layer} b{batch}"
        return self.queues.add(name, resource, seconds, deps, layer=layer, micro_batch=batch, kind=kind)

    def load(self, label: str, i: int, seconds: float, deps) -> Queued:
        """The queued weight load ``label`` of layer i on the link."""
        return self.add(label, "h2d", seconds, deps, i, -1, "weights")

    def kv_load(self, i: int, b: int) -> Queued | None:
        """The queued load of batch b's host-resident cache in layer i, into the buffer the
        attention two batches back frees (None without a host cache)."""
        if not self.kv_load_s:
            return None
        buffer_free = self.attended[-KV_BUFFERS] if len(self.attended) >= KV_BUFFERS else None
        return self.add("KV", "h2d", self.kv_load_s, [buffer_free], i, b, "kv")

    def attend(self, i: int, b: int, deps) -> Queued:
        """The queued attention of batch b in layer i (and the store of its new KV entries)."""
        task = self.add("Attn", "gpu", self.attention_s, deps, i, b, "attention")
        self.attended.append(task)
        if self.kv_store_s:
            self.add("KV→CPU", "d2h", self.kv_store_s, [task], i, b, "kv")
        return task

    def queue_layer(self, i: int) -> None:
        """Queue layer i: its weight and KV loads in the host's issue order, the attention and
        gate of every batch, the cold loads after the first gate, then the expert calls."""
        hot, n = len(self.hot_experts), self.n
        freed = self.last_gpu[i - self.expert_buffers] if i >= self.expert_buffers else None
        attention_w = self.load("AttnW", i, self.attention_load_s, [self.last_attention[i - 2] if i >= 2 else None])
        first_kv = self.kv_load(i, 0)
        gate_w = self.load("GateW", i, self.gate_load_s, [freed])
        loads = [self.load(self.names[e], i, self.hot_experts[e][0], [freed]) for e in range(hot)] \
            if self.prefetch_hot else []
        attention = []
        for b in range(n):
            kv = first_kv if b == 0 else self.kv_load(i, b)
            attention.append(self.attend(i, b, [attention_w, self.batch_done[b], kv]))
        gates = [self.add("Gate", "gpu", self.gate_s, [attention[b], gate_w], i, b, "post_attn") for b in range(n)]
        if not self.prefetch_hot:
            loads += [self.load(self.names[e], i, self.hot_experts[e][0], [gates[0], freed]) for e in range(hot)]
        loads += [self.load(self.names[hot + e], i, self.cold_experts[e][0], [gates[0], freed])
                  for e in range(len(self.cold_experts))]
        self.batch_done = self.queue_expert_compute(i, loads, gates)
        # the last batch's last task is the layer's last on the GPU (each order queues it last)
        self.last_gpu.append(self.batch_done[-1])
        self.last_attention.append(attention[-1])

    def queue_expert_compute(self, i: int, loads: list[Queued], gates: list[Queued]) -> list[Queued]:
        """Queue layer ``i``'s expert calls on the GPU in the graph's order; per batch, its
        last task (a layer without experts ends with its gates)."""
        n, hot, names = len(gates), len(self.hot_experts), self.names
        experts = [*self.hot_experts, *self.cold_experts]
        batch_done = list(gates)
        if self.order == "hot-first":
            # expert by expert, hot ones first, each one call over every batch's tokens (its
            # per-batch tasks would run back to back anyway: every gate precedes it on the GPU)
            for e in range(len(experts)):
                task = self.add(names[e], "gpu", n * experts[e][1], [loads[e], *gates], i, -1, "post_attn")
                batch_done = [task] * n
        else:  # batch by batch, each batch's experts cold first
            routed = [*range(hot, len(experts)), *range(hot)]
            for b in range(n):
                for e in routed:
                    batch_done[b] = self.add(names[e], "gpu", experts[e][1], [loads[e], gates[b]], i, b, "post_attn")
        return batch_done


@dataclass(frozen=True)
class ExpertSchedule:
    """Steady-state layer of an expert-level schedule: the list-scheduled period against the
    lane-max bound (each resource's busy time per layer, perfect overlap). ``graph``: the
    arguments of :func:`klotski_layer_tasks` it was scheduled from, for :attr:`timeline`."""

    period_s: float
    lane_bound_s: float
    resource_busy_s: dict[str, float]
    graph: dict = field(repr=False)

    @property
    def bubble_s(self) -> float:
        """Idle time per layer that overlap cannot remove under this task order."""
        return self.period_s - self.lane_bound_s

    @cached_property
    def timeline(self) -> Timeline:
        """The scheduled tasks, built on first use (a search reads only the times above)."""
        return _drawn_timeline(self.graph)


def expert_schedule(num_batches: int, attention_s: float, gate_s: float,
                    hot_experts: list[tuple[float, float]], cold_experts: list[tuple[float, float]], *,
                    layers: int = 6, order: str = "hot-first", prefetch_hot: bool = True,
                    gate_load_s: float = 0.0, attention_load_s: float = 0.0,
                    expert_buffers: int = 1, kv_load_s: float = 0.0, kv_store_s: float = 0.0) -> ExpertSchedule:
    """List-schedule :func:`klotski_layer_tasks` (same arguments) and return its steady-state
    layer period (the spacing of the ends of the two layers before the last, as
    :attr:`Timeline.layer_period_s`), the lane bound of one layer and the bubble between.
    The times come from :class:`TimedQueues` (the same as :func:`list_schedule`'s); the
    tasks only when :attr:`ExpertSchedule.timeline` is read."""
    # tuples: the timeline drawn later must see the experts as they are now
    graph = dict(num_batches=num_batches, attention_s=attention_s, gate_s=gate_s, hot_experts=tuple(hot_experts),
                 cold_experts=tuple(cold_experts), layers=layers, order=order, prefetch_hot=prefetch_hot,
                 gate_load_s=gate_load_s, attention_load_s=attention_load_s, expert_buffers=expert_buffers,
                 kv_load_s=kv_load_s, kv_store_s=kv_store_s)
    timed = _queue_layers(TimedQueues(KLOTSKI_RESOURCES), **graph)
    busy = timed.busy_s(layers - 1)
    return ExpertSchedule(layer_period_s(timed.layer_ends_s(layers)), max(busy.values()), busy, graph)


def _drawn_timeline(graph: dict) -> Timeline:
    """The list-scheduled tasks of :func:`klotski_layer_tasks` (``graph``: its arguments)."""
    layers = graph["layers"]
    queues = klotski_layer_tasks(**graph).queues
    list_schedule(queues)
    busy = {r: sum(t.duration_s for t in q if t.layer == layers - 1) for r, q in queues.items()}
    return Timeline(f"klotski-{graph['order']}", scheduled_tasks(queues), layer_ends_s(queues, layers),
                    max(busy.values()), busy)


def with_capacity_bounds(scheduled: ExpertSchedule, capacity_s: dict[str, float]) -> ExpertSchedule:
    """``scheduled`` with capacity-bound resources (staging-copy team, host DRAM; they do
    not queue tasks) in its busy times: the period and the lane bound are at least each."""
    if not capacity_s:
        return scheduled
    busy = {**scheduled.resource_busy_s, **capacity_s}
    return replace(scheduled, period_s=max(scheduled.period_s, *capacity_s.values()),
                   lane_bound_s=max(scheduled.lane_bound_s, *capacity_s.values()), resource_busy_s=busy)
