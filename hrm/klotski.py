"""Klotski's decode pipeline (``../shared/papers/klotski.txt`` §4-§6) on the expert-level
list scheduler of :mod:`hrm.timeline`.

Klotski runs a *batch group* of n batches (μ sequences each) through every layer: the
attention of all n batches, then their gates, then each expert once for all n batches'
tokens, so one expert load serves n batches. During the attention it prefetches the gate
and the K hottest experts (K = top-k, §5.1), loads the cold experts the gates pick on
demand, and computes hot experts first so cold loads hide behind them.

- :func:`klotski_layer` — one decode layer's durations from the cost model (GPU roofline of
  each task, CPU→GPU loads over the pinned link), with the hot set and the expected number
  of distinct cold experts from the routing distribution (:mod:`hrm.routing`);
- :func:`klotski_batches` — Klotski's own choice of n: the smallest n that satisfies its
  inequalities (4)-(7) (§6.2), with the durations taken at each n;
- :data:`PIPELINE_STEPS` and :func:`pipeline_steps` — the paper's construction step by step
  (simple pipeline → + multi-batch → + hot-only prefetch → + hot-first order), each a
  list-scheduled layer period and the throughput it gives.

The KV cache and every non-expert weight but the attention's are taken as GPU-resident (the
batch group's KV on the GPU); attention weights are loaded every layer, as eq. (7) counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from . import costs, latency
from .costs import OpCost
from .engine import IDEAL
from .model import ModelSpec
from .rates import Rates
from .routing import Routing, expected_misses, uniform
from .timeline import ExpertSchedule, expert_schedule
from .units import dtype_bytes

#: the most batches per group :func:`klotski_batches` tries (the paper's planner caps n by memory)
MAX_BATCH_GROUP = 512


@dataclass(frozen=True)
class KlotskiLayer:
    """Durations of one decode layer for a group of ``num_batches`` batches of μ sequences:
    per batch ``attention_s`` (pre-attention, attention, O projection) and ``gate_s``; per
    expert one ``(load_s, compute_s per batch)``; loads of the gate and attention weights."""

    num_batches: int
    attention_s: float
    gate_s: float
    gate_load_s: float
    attention_load_s: float
    expert_load_s: float
    hot: list[tuple[float, float]]
    cold: list[tuple[float, float]]

    @property
    def hot_compute_s(self) -> float:
        """t_c_hot-E of eq. (6): the hot experts over all n batches."""
        return self.num_batches * sum(c for _, c in self.hot)

    @property
    def cold_compute_s(self) -> float:
        """Σ_{i∈Q} t_c_Ei of eq. (7): the cold experts over all n batches."""
        return self.num_batches * sum(c for _, c in self.cold)


def _split_router(post: OpCost, model: ModelSpec, tokens: float) -> tuple[OpCost, OpCost]:
    """(post-attention without the router, the router) of :func:`hrm.costs.post_attention`."""
    gate = costs.router(model, tokens)
    rest = replace(post, flops=post.flops - gate.flops, weight_bytes=post.weight_bytes - gate.weight_bytes)
    return rest, gate


def expert_compute_s(model: ModelSpec, rates: Rates, tokens: float) -> float:
    """One expert's SwiGLU on ``tokens`` tokens (expected, may be fractional) on the GPU: its
    weights read once from HBM, 2·3·h·h2 FLOPs per token."""
    return float(latency.gpu_time_s(costs.single_expert(model, tokens), rates, max(tokens, 1.0)))


def klotski_layer(model: ModelSpec, rates: Rates, micro_batch: int, context: float, num_batches: int,
                  routing: Routing | None = None) -> KlotskiLayer:
    """The durations of one decode layer (module docstring). Hot experts: the top-k by mean
    activation probability; cold: the expected number of distinct other experts the group's
    n·μ tokens touch (:func:`hrm.routing.expected_misses`, rounded to whole experts), the
    next hottest ones. An expert's compute per batch is for its expected μ·q_e tokens."""
    routing = routing or model.routing or uniform(model.num_experts, model.top_k)
    q = routing.q.mean(axis=0)
    order = np.argsort(-q, kind="stable")
    k = model.top_k
    ops = costs.decode_layer_ops(model, float(micro_batch), float(context))
    post, gate = _split_router(ops.post_attn, model, float(micro_batch))
    attention_s = float(latency.gpu_time_s(ops.pre_attn, rates, micro_batch)
                        + latency.gpu_time_s(ops.attention, rates, latency.attention_rows(model))
                        + latency.gpu_time_s(post, rates, micro_batch))
    link = latency.link_bytes_s(rates, IDEAL, "h2d")
    load = costs.expert_bytes(model) / link
    cold_count = int(round(float(expected_misses(routing, k, num_batches * micro_batch))))

    def expert(e) -> tuple[float, float]:
        return load, expert_compute_s(model, rates, micro_batch * float(q[e]))

    wb = dtype_bytes(model.weight_dtype)
    return KlotskiLayer(
        num_batches=num_batches, attention_s=attention_s, gate_s=float(latency.gpu_time_s(gate, rates, micro_batch)),
        gate_load_s=costs.router_params(model) * wb / link,
        attention_load_s=costs.attention_params(model) * wb / link, expert_load_s=load,
        hot=[expert(e) for e in order[:k]], cold=[expert(e) for e in order[k:k + cold_count]])


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
                    routing: Routing | None = None, max_batches: int = MAX_BATCH_GROUP) -> int | None:
    """Klotski's n: the smallest batch-group size whose durations satisfy (4)-(7) (None when
    no n up to ``max_batches`` does: the link cannot keep up at this μ)."""
    for n in range(1, max_batches + 1):
        if all(inequalities_hold(klotski_layer(model, rates, micro_batch, context, n, routing))):
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


def schedule_layer(layer: KlotskiLayer, prefetch_hot: bool, order: str) -> ExpertSchedule:
    """The list-scheduled steady-state layer of ``layer`` (:func:`hrm.timeline.expert_schedule`)."""
    return expert_schedule(layer.num_batches, layer.attention_s, layer.gate_s, layer.hot, layer.cold,
                           order=order, prefetch_hot=prefetch_hot, gate_load_s=layer.gate_load_s,
                           attention_load_s=layer.attention_load_s)


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
