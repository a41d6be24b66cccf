"""Klotski (``../shared/papers/klotski.txt`` §4-§7) on the expert-level list scheduler of
:mod:`hrm.timeline`: its decode layer, its own choice of n, the pipeline step by step, and
the engine ``klotski`` that the search plans (:mod:`solver.klotski`).

Klotski runs a *batch group* of n batches (μ sequences each) through every layer: the
attention of all n batches, then their gates, then each expert once for all n batches'
tokens, so one expert load serves n batches. During the attention it prefetches the gate
and the K hottest experts (K = top-k, §5.1), loads the cold experts the gates pick on
demand, and computes hot experts first so cold loads hide behind them.

- :func:`klotski_layer` — one layer's durations from the cost model (GPU roofline of each
  task, CPU→GPU loads over the engine's link), with the hot set and the expected number of
  distinct cold experts from the routing distribution (:mod:`hrm.routing`); options give the
  engine's placement: experts of the layer resident, non-expert weights resident, a share
  of the KV cache in host memory loaded per batch;
- :func:`klotski_batches` — Klotski's own choice of n: the smallest n that satisfies its
  inequalities (4)-(7) (§7), with the durations taken at each n;
- :data:`PIPELINE_STEPS` and :func:`pipeline_steps` — the paper's construction step by step
  (simple pipeline → + multi-batch → + hot-only prefetch → + hot-first order);
- :func:`klotski_times` / :func:`klotski_memory` / :func:`estimate_klotski` — a whole
  policy: prefill and decode time from the scheduled layer periods, and the engine's memory.

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
from dataclasses import dataclass, replace

import numpy as np

from . import costs, latency
from .costs import OpCost
from .engine import IDEAL, Engine
from .model import ModelSpec
from .rates import Rates
from .routing import Routing, expected_misses, uniform
from .timeline import KV_BUFFERS, ExpertSchedule, expert_schedule
from .units import dtype_bytes

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


def expert_compute_s(model: ModelSpec, rates: Rates, tokens, engine: Engine = IDEAL):
    """One expert's SwiGLU call on ``tokens`` tokens (expected, may be fractional; array) on
    the GPU: its weights read once from HBM, 2·3·h·h2 FLOPs per token."""
    t = np.asarray(tokens, dtype=float)
    seconds = np.asarray(latency.gpu_time_s(costs.single_expert(model, t), rates, np.maximum(t, 1.0), engine,
                                            kernel=True), dtype=float)
    return float(seconds) if seconds.ndim == 0 else seconds


def _dispatch(rates: Rates) -> dict[str, float]:
    """A measured profile's α per Klotski task (0 on a datasheet profile): a batch's
    attention task (pre-attention, attention, O projection), its gate with the host reading
    its choice, one expert call per batch with its token list read on the host, one copy."""
    g = rates.gpu_dispatch
    a = (lambda name: latency._alpha(g, name))
    attention = a("device_attention_s") if g is not None and g.device_attention_s is not None else a("attention_s")
    return {"attention": a("task_s") + a("pre_attn_s") + attention + a("post_attn_s"),
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
        rows = latency.attention_rows(model)
    else:
        ops = costs.prefill_layer_ops(model, mu, prompt_len, moe)
        rows = latency.attention_rows(model, prompt_len)
    alpha = _dispatch(rates)
    kv_path = engine.decode.kv_cache if prompt_len is None else engine.prefill.kv_cache
    kv_pageable = kv_path == "pageable" and latency.host_side_modelled(rates)
    kv_token = costs.kv_bytes_per_token(model)
    host_kv = 1.0 - np.asarray(kv_gpu_ratio, dtype=float)
    loaded = host_kv * mu * float(context) * kv_token if prompt_len is None else 0.0 * host_kv
    stored = host_kv * tokens * kv_token
    post, gate = _split_router(ops.post_attn, model, tokens) if moe else (ops.post_attn, None)
    attention = (latency.gpu_time_s(ops.pre_attn, rates, tokens, engine)
                 + latency.gpu_time_s(ops.attention, rates, rows, engine)
                 + latency.gpu_time_s(post, rates, tokens, engine) + alpha["attention"])
    if not moe:
        attention = attention + latency.gpu_time_s(ops.ffn, rates, tokens, engine)
    zero = 0.0 * (mu + host_kv)
    return {
        "attention_s": attention + zero,
        "gate_s": (latency.gpu_time_s(gate, rates, tokens, engine) + alpha["gate"] if moe else 0.0) + zero,
        "kv_load_s": np.where(loaded > 0, loaded / latency.link_bytes_s(rates, engine, "h2d", kv_pageable)
                              + alpha["kv_load"], 0.0) + zero,
        "kv_store_s": np.where(stored > 0, stored / latency.link_bytes_s(rates, engine, "d2h", kv_pageable)
                               + alpha["kv_store"], 0.0) + zero,
    }


def weight_link_bytes_s(rates: Rates, engine: Engine = IDEAL, prefill: bool = False) -> float:
    """CPU→GPU rate of the engine's weight path in the phase (pinned, or the pageable rate)."""
    path = engine.prefill.weight_path if prefill else engine.decode.weight_path
    return latency.link_bytes_s(rates, engine, "h2d", pageable=path == "pageable-driver")


def expert_load_s(model: ModelSpec, rates: Rates, engine: Engine = IDEAL, prefill: bool = False) -> float:
    """One expert's CPU→GPU load over the engine's weight path, with one copy's α."""
    return costs.expert_bytes(model) / weight_link_bytes_s(rates, engine, prefill) + _dispatch(rates)["copy"]


def experts_used(model: ModelSpec, group_tokens, routing: Routing | None = None) -> np.ndarray:
    """How many experts a group of ``group_tokens`` tokens (n·t; array) runs per layer: the
    top-k hot ones and the expected distinct cold ones (:func:`hrm.routing.expected_misses`,
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
    if not moe:
        return KlotskiLayer(n, per_batch["attention_s"], 0.0, 0.0, 0.0, 0.0, [], [], per_batch["kv_load_s"],
                            per_batch["kv_store_s"])
    prefill = prompt_len is not None
    tokens = float(micro_batch) * (prompt_len if prefill else 1)
    used = int(experts_used(model, n * tokens, routing))
    seconds = batch_expert_s(model, rates, tokens, routing, engine)
    load = 0.0 if experts_resident else expert_load_s(model, rates, engine, prefill)
    call = _dispatch(rates)["expert"]
    experts = [(load, float(c) + call) for c in seconds[:used]]
    static = 0.0 if dense_resident else 1.0
    link = weight_link_bytes_s(rates, engine, prefill)
    wb = dtype_bytes(model.weight_dtype)
    return KlotskiLayer(
        num_batches=n, attention_s=per_batch["attention_s"], gate_s=per_batch["gate_s"],
        gate_load_s=static * costs.router_params(model) * wb / link,
        attention_load_s=static * (costs.moe_layer_static_params(model) - costs.router_params(model)) * wb / link,
        expert_load_s=load, hot=experts[:model.top_k], cold=experts[model.top_k:],
        kv_load_s=per_batch["kv_load_s"], kv_store_s=per_batch["kv_store_s"])


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
                   layers: int = 6) -> ExpertSchedule:
    """The list-scheduled steady-state layer of ``layer`` (:func:`hrm.timeline.expert_schedule`
    over ``layers`` layers; more than :data:`MAX_SCHEDULED_BATCHES` batches are scheduled in
    chunks, :func:`chunked`)."""
    layer = chunked(layer)
    return expert_schedule(layer.num_batches, layer.attention_s, layer.gate_s, layer.hot, layer.cold, layers=layers,
                           order=order, prefetch_hot=prefetch_hot, gate_load_s=layer.gate_load_s,
                           attention_load_s=layer.attention_load_s, kv_load_s=layer.kv_load_s,
                           kv_store_s=layer.kv_store_s)


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


# --- the engine: a whole policy -----------------------------------------------------------
#
# A Klotski policy in the toolkit's terms: μ sequences per batch, n batches per group
# (N = n·μ), attention and experts on the GPU, r_w the share of MoE layers whose experts stay
# on the GPU (whole layers: the greedy fill's unit), r_c the share of the KV cache on the GPU.

def resident_moe_layers(model: ModelSpec, weights_gpu_ratio: float) -> int:
    """MoE layers whose experts stay on the GPU: r_w·L, whole layers."""
    return int(round(float(weights_gpu_ratio) * model.num_moe_layers))


def mean_decode_context(workload) -> float:
    """The context the decode periods are taken at: the mean over the decode steps (the
    periods are near-affine in the context: attention and KV loads grow with it)."""
    contexts = latency.decode_contexts(workload.effective_prompt_len, workload.gen_len)
    return float(np.mean(contexts)) if len(contexts) else float(workload.effective_prompt_len)


@dataclass(frozen=True)
class KlotskiTimes:
    """Times of a policy: per layer kind (``offloaded``, ``resident`` MoE layers, ``dense``)
    the scheduled decode and prefill layers and how many layers of each kind there are."""

    decode_step_s: float
    decode_steps: int
    prefill_s: float
    counts: dict[str, int]
    decode: dict[str, ExpertSchedule]
    prefill: dict[str, ExpertSchedule]
    context: float

    @property
    def decode_s(self) -> float:
        return self.decode_step_s * self.decode_steps

    def per_layer_s(self, what: str = "period") -> dict[str, float]:
        """Decode: each resource's busy seconds per layer (``busy``), or the layer period
        (``period``), averaged over the layers."""
        total = sum(self.counts.values())
        if what == "period":
            return {"period": sum(c * self.decode[k].period_s for k, c in self.counts.items() if c) / total}
        out: dict[str, float] = {}
        for kind, count in self.counts.items():
            if count:
                for resource, busy in self.decode[kind].resource_busy_s.items():
                    out[resource] = out.get(resource, 0.0) + count * busy / total
        return out


def layer_kinds(model: ModelSpec, weights_gpu_ratio: float) -> dict[str, int]:
    resident = resident_moe_layers(model, weights_gpu_ratio)
    return {"offloaded": model.num_moe_layers - resident, "resident": resident, "dense": model.first_dense_layers}


def _kind_options(kind: str) -> dict:
    return {"offloaded": {"experts_resident": False}, "resident": {"experts_resident": True},
            "dense": {"moe": False}}[kind]


def klotski_times(model: ModelSpec, rates: Rates, workload, policy, engine: Engine = IDEAL,
                  routing: Routing | None = None) -> KlotskiTimes:
    """Prefill and decode time of ``policy`` run by Klotski: per layer kind one scheduled
    layer (:func:`schedule_layer`), decode at :func:`mean_decode_context`; per step the
    n batches' heads; prefill one pass of the prompts through the same pipeline."""
    mu, n = policy.micro_batch_size, policy.num_micro_batches
    counts = layer_kinds(model, policy.weights_gpu_ratio)
    context = mean_decode_context(workload)
    common = dict(engine=engine, kv_gpu_ratio=policy.kv_gpu_ratio, dense_resident=True)
    decode, prefill = {}, {}
    for kind, count in counts.items():
        if count:
            options = {**common, **_kind_options(kind)}
            decode[kind] = schedule_layer(klotski_layer(model, rates, mu, context, n, routing, **options))
            prefill[kind] = schedule_layer(klotski_layer(model, rates, mu, context, n, routing,
                                                         prompt_len=workload.effective_prompt_len, **options))
    head = n * float(latency.lm_head_time_s(model, rates, mu))
    step = head + sum(count * decode[kind].period_s for kind, count in counts.items() if count)
    pre = head + sum(count * prefill[kind].period_s for kind, count in counts.items() if count)
    return KlotskiTimes(step, max(workload.gen_len - 1, 0), pre, counts, decode, prefill, context)


@dataclass(frozen=True)
class KlotskiMemory:
    """Peak bytes per tier, affine in r_c: ``*_const`` + r_c·``*_per_kv_ratio``; arrays
    broadcast over μ, N and the resident layers."""

    gpu_const: np.ndarray | float
    gpu_per_kv_ratio: np.ndarray | float
    cpu_const: np.ndarray | float
    cpu_per_kv_ratio: np.ndarray | float
    components: dict

    def gpu_bytes(self, kv_gpu_ratio):
        return self.gpu_const + self.gpu_per_kv_ratio * np.asarray(kv_gpu_ratio, dtype=float)

    def cpu_bytes(self, kv_gpu_ratio):
        return self.cpu_const + self.cpu_per_kv_ratio * np.asarray(kv_gpu_ratio, dtype=float)


def klotski_memory(model: ModelSpec, workload, micro_batch, batch_size, resident_layers,
                   routing: Routing | None = None) -> KlotskiMemory:
    """The engine's memory (module docstring). GPU: every non-expert weight and the
    embeddings (the greedy fill's first item), the experts of the resident layers, one
    layer's experts as the load buffer when any layer is offloaded
    (``configuration_mixtral.py:113``), r_c of every sequence's KV cache, two batch buffers
    of one layer's host-resident KV, the hidden states of all N sequences, one batch's
    workspace and the largest expert call's activations (a batch's t·q_max tokens, prefill
    or decode). CPU: the offloaded layers' experts and (1 − r_c) of the KV cache."""
    from .memory import gpu_workspace_bytes, kv_bytes_per_sequence

    routing = routing or model.routing or uniform(model.num_experts, model.top_k)
    mu = np.asarray(micro_batch, dtype=float)
    big = np.asarray(batch_size, dtype=float)
    resident = np.asarray(resident_layers, dtype=float)
    ab = dtype_bytes(model.activation_dtype)
    layer_experts = costs.layer_expert_bytes(model)
    offloaded = model.num_moe_layers - resident
    kv_seq = kv_bytes_per_sequence(model, workload)
    kv_buffers = KV_BUFFERS * mu * workload.max_context_len * costs.kv_bytes_per_token(model)
    q_max = float(routing.q.max())
    per_expert_token = (2 * model.hidden_size + 3 * model.expert_intermediate_size) * ab
    expert_call = mu * max(workload.effective_prompt_len, 1) * q_max * per_expert_token
    static = costs.static_weight_bytes(model)
    buffer = np.where(offloaded > 0, layer_experts, 0.0)
    hidden = big * 2 * model.hidden_size * ab
    work = gpu_workspace_bytes(model, workload, mu, True) + expert_call
    return KlotskiMemory(
        gpu_const=static + resident * layer_experts + buffer + kv_buffers + hidden + work,
        gpu_per_kv_ratio=big * kv_seq - kv_buffers,
        cpu_const=offloaded * layer_experts + big * kv_seq,
        cpu_per_kv_ratio=-big * kv_seq,
        components={"gpu": {"static_weights": static, "resident_experts": resident * layer_experts,
                            "expert_load_buffer": buffer, "kv_batch_buffers_at_rc0": kv_buffers, "hidden": hidden,
                            "workspace": work, "kv_per_sequence": kv_seq},
                    "cpu": {"offloaded_experts": offloaded * layer_experts, "kv_per_sequence": kv_seq}})


def klotski_own_batches(model: ModelSpec, rates: Rates, workload, policy, engine: Engine = IDEAL,
                        routing: Routing | None = None) -> int | None:
    """Klotski's planner's n at this policy's μ and placement (inequalities 4-7 at the mean
    decode context, an offloaded layer)."""
    if not layer_kinds(model, policy.weights_gpu_ratio)["offloaded"]:
        return None
    return klotski_batches(model, rates, policy.micro_batch_size, mean_decode_context(workload), routing,
                           engine=engine, kv_gpu_ratio=policy.kv_gpu_ratio, dense_resident=True)


def policy_timeline(model: ModelSpec, rates: Rates, policy, engine: Engine, context: float, layers: int = 6):
    """The list-scheduled decode layers of ``policy`` (:class:`hrm.timeline.Timeline`): its
    offloaded MoE layers, or its resident ones when every layer's experts are on the GPU."""
    kinds = layer_kinds(model, policy.weights_gpu_ratio)
    kind = "offloaded" if kinds["offloaded"] else "resident"
    layer = klotski_layer(model, rates, policy.micro_batch_size, context, policy.num_micro_batches, engine=engine,
                          kv_gpu_ratio=policy.kv_gpu_ratio, dense_resident=True, **_kind_options(kind))
    return schedule_layer(layer, layers=max(3, layers)).timeline


def estimate_klotski(hw, model: ModelSpec, workload, policy, options, limits, engine: Engine):
    """:class:`hrm.estimate.EstimateResult` of a policy run by Klotski (the single source of
    the numbers a Klotski plan reports)."""
    from .errors import HRMError
    from .estimate import EstimateResult, lane_label, used_defaults
    from .rates import rates_from_profile

    if limits.shared or hw.gpu is None:
        raise HRMError(f"engine {engine.name}: profile '{hw.name}' has no GPU (Klotski loads experts to a GPU)")
    rates = rates_from_profile(hw, options)
    times = klotski_times(model, rates, workload, policy, engine)
    memory = klotski_memory(model, workload, policy.micro_batch_size, policy.batch_size,
                            resident_moe_layers(model, policy.weights_gpu_ratio))
    gpu_peak = float(memory.gpu_bytes(policy.kv_gpu_ratio))
    cpu_peak = float(memory.cpu_bytes(policy.kv_gpu_ratio))
    g, c = gpu_peak / limits.gpu_bytes, cpu_peak / limits.cpu_bytes
    binding = f"GPU memory {100 * g:.0f}%" if g >= c else f"CPU memory {100 * c:.0f}%"
    busy = times.per_layer_s("busy")
    period = times.per_layer_s("period")["period"]
    top = max(busy, key=busy.get)
    bubble = period - busy[top]
    bottleneck = lane_label(top) + (f" (+{bubble / period:.0%} bubble)" if period and bubble / period >= 0.005 else "")
    decode, steps, big = times.decode_s, times.decode_steps, policy.batch_size
    total = times.prefill_s + decode
    notes = []
    own = klotski_own_batches(model, rates, workload, policy, engine)
    notes.append(f"Klotski's own planner (inequalities 4-7) at mu={policy.micro_batch_size}: "
                 + (f"n={own}" if own is not None else "no n up to 512 hides the loads" if times.counts["offloaded"]
                    else "no offloaded layer"))
    return EstimateResult(
        policy=policy, schedule=engine.schedule, decode_layer_latency_s=period,
        prefill_latency_s=times.prefill_s, decode_time_s=decode, total_time_s=total,
        decode_throughput_tok_s=big * steps / decode if decode else 0.0,
        generation_throughput_tok_s=big * workload.gen_len / total,
        per_token_latency_s=times.decode_step_s if steps else times.prefill_s,
        gpu_peak_bytes=gpu_peak, cpu_peak_bytes=cpu_peak, gpu_limit_bytes=limits.gpu_bytes,
        cpu_limit_bytes=limits.cpu_bytes, shared_memory=limits.shared, bottleneck=bottleneck,
        binding_memory=binding, resource_layer_s=busy, lane_layer_s={**busy, "scheduled period": period},
        memory_components=memory.components,
        engine=engine.name, notes=tuple(notes), defaulted=used_defaults(engine, rates))
