"""The offloaded weights of a layer: which bytes cross the link per load (the whole offloaded
layer, or only the experts a micro-batch uses), where offloaded experts run (streamed to the
GPU, or computed on the CPU: ``offloaded_experts: cpu``), what an expert cache's misses cost
(``cached`` / ``cached-cpu``, a convex piecewise-linear term of the lane), and the share
ZeRO-3 fetches on demand beyond its prefetch bucket.
"""

from __future__ import annotations

import numpy as np

from .. import costs
from ...engines.engine import Engine
from ...machine.rates import Rates
from ...model.spec import ModelSpec
from ...units import dtype_bytes
from .ops import cpu_time_s, expert_rows
from .transfers import link_bytes_s


def offloaded_experts_on_cpu(engine: Engine, phase, tokens) -> np.ndarray:
    """1 where ``phase`` computes the experts not kept on the GPU on the CPU
    (``offloaded_experts: cpu`` below ``engine.op_offload_min_tokens`` tokens per micro-batch),
    0 where they reach the GPU (streamed, or copied for the op: llama.cpp's op offload)."""
    t = np.asarray(tokens, dtype=float)
    if phase.offloaded_experts != "cpu":
        return np.zeros(t.shape)
    if engine.op_offload_min_tokens is None:
        return np.ones(t.shape)
    return (t < engine.op_offload_min_tokens).astype(float)


def cache_miss_pieces(model: ModelSpec, phase, tokens, seconds_per_miss, zero) -> tuple:
    """``offloaded_experts: cached`` / ``cached-cpu``: the cost of one micro-batch's expert
    cache misses as pieces of a convex piecewise-linear function of x = 1 − r_w
    (:class:`hrm.cost.latency.lane.Lane`): with C of a layer's E experts cached (the C hottest, r_w = C/E), the
    misses are Σ_{e∉top C} 1 − (1 − q_e)^tokens experts (:func:`hrm.model.routing.expected_misses`),
    convex in C; each costs ``seconds_per_miss``. The secant of each (C, C + 1) segment is one
    piece, and their max is exact at every whole C. Uniform routing gives one line:
    (1 − r_w)·D(tokens)·seconds_per_miss. () for the other mechanisms."""
    if phase.offloaded_experts not in ("cached", "cached-cpu"):
        return ()
    from ...model.routing import expected_misses, uniform

    routing = model.routing or uniform(model.num_experts, model.top_k)
    ne = model.num_experts
    cost = [expected_misses(routing, c, tokens) * seconds_per_miss for c in range(ne + 1)]
    pieces = []
    for c in range(ne):
        slope = ne * (cost[c] - cost[c + 1])  # per unit of x = 1 − C/E
        pieces.append((cost[c] - slope * (1.0 - c / ne) + zero, slope + zero))
    return tuple(pieces)


def seconds_per_miss(model: ModelSpec, rates: Rates, engine: Engine, phase, tokens, gpu_experts_s) -> np.ndarray:
    """What one expert-cache miss costs a micro-batch of ``tokens`` tokens: ``cached`` — its
    load over the pinned link (it then runs on the GPU like a hit); ``cached-cpu`` — below
    ``offload_min_tokens_per_expert`` tokens per touched expert (tokens·k / D(tokens)) it runs
    on the CPU with its tokens' hidden states there and back, and the GPU's share of the
    expert work (``gpu_experts_s`` / D) is not spent; from there on its weights are copied
    from pageable memory (Fiddler: ``load_state_dict`` into a GPU placeholder)."""
    t = np.asarray(tokens, dtype=float)
    load = costs.expert_bytes(model) / link_bytes_s(rates, engine, "h2d")
    if phase.offloaded_experts == "cached":
        return load + 0 * t
    distinct = costs.expected_distinct_experts(model, t)
    per_expert = expert_rows(model, t)  # tokens per touched expert
    hidden = (2 * per_expert * model.hidden_size * dtype_bytes(model.activation_dtype)
              / link_bytes_s(rates, engine, "h2d"))
    on_cpu = (cpu_time_s(costs.single_expert(model, per_expert), rates, per_expert, engine) + hidden
              - gpu_experts_s / distinct)
    copied = costs.expert_bytes(model) / link_bytes_s(rates, engine, "h2d", pageable=True)
    threshold = engine.offload_min_tokens_per_expert
    return np.where(per_expert < threshold if threshold is not None else True, on_cpu, copied)


def crossing_layer_bytes(model: ModelSpec, engine: Engine, phase, tokens, moe: bool, ffn_on_gpu=1.0):
    """Bytes of one layer's offloaded weights that cross the link per load at r_w = 0: the
    whole offloaded layer (:func:`offloaded_layer_bytes`), or — CPU-kept experts copied for
    an offloaded op (``offloaded_experts: cpu``) — only the experts the micro-batch's tokens
    use (llama.cpp copies just those: ggml-backend.cpp:1709-1775); with an expert cache
    (``cached``) the misses are :func:`cache_miss_pieces`, not a whole-layer load."""
    if moe and phase.offloaded_experts in ("cached", "cached-cpu"):
        return 0.0 * np.asarray(tokens, dtype=float)
    if moe and phase.offloaded_experts == "cpu" and engine.offloaded_weights == "experts":
        return costs.expected_distinct_experts(model, tokens) * costs.expert_bytes(model) * np.asarray(ffn_on_gpu,
                                                                                                      dtype=float)
    return offloaded_layer_bytes(model, engine, moe, ffn_on_gpu)


def on_demand_weights_share(model: ModelSpec, engine: Engine, layer_bytes):
    """Share of a layer's crossing weights (``layer_bytes``) that ZeRO-3 fetches on demand,
    serial with the GPU: all but its prefetch bucket of ``prefetch_bucket_hidden_sq`` × hidden²
    parameters (FlexGen's DeepSpeed baseline sets hidden², benchmark/hf_ds/hf_opt.py:115;
    DeepSpeed fetches the next sub-modules up to the bucket while the current one runs,
    partitioned_param_coordinator.py:379-413). 0 without a bucket (all prefetched)."""
    bucket = engine.prefetch_bucket_hidden_sq
    layer_bytes = np.asarray(layer_bytes, dtype=float)
    if bucket is None:
        return 0.0 * layer_bytes
    bucket_bytes = bucket * model.hidden_size ** 2 * costs.weight_bytes_per_param(model)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(layer_bytes > 0, np.clip(1.0 - bucket_bytes / layer_bytes, 0.0, 1.0), 0.0)


def offloaded_layer_bytes(model: ModelSpec, engine: Engine, moe: bool, ffn_on_gpu=1.0):
    """Offloadable weights of one layer at r_w = 0 (W_L of eq. 12's D3): the routed experts
    when they run on the GPU; with ``offloaded_weights: all`` (FlexGen ``--percent``) the
    layer's other weights too (attention, norms, router, shared experts, a dense MLP)."""
    experts = costs.layer_expert_bytes(model) * np.asarray(ffn_on_gpu, dtype=float) if moe else 0.0
    if engine.offloaded_weights != "all":
        return experts
    params = costs.moe_layer_static_params(model) if moe else costs.dense_layer_params(model)
    return experts + params * costs.static_bytes_per_param(model)


def attention_block_share(model: ModelSpec, engine: Engine, moe: bool, ffn_on_gpu=1.0):
    """Share of a layer's offloaded bytes (:func:`offloaded_layer_bytes`) that are its attention
    block's (projections and norms; the rest, the FFN block's: experts, router, shared experts
    or a dense MLP), for an engine that loads a layer's two blocks one at a time (FlexGen's
    ``--sep-layer``). 0 when only experts are offloaded; exact at r_w = 0 and 1, where the
    whole-tensor placement of ``--percent`` takes every tensor or none."""
    if engine.offloaded_weights != "all":
        return 0.0 * np.asarray(ffn_on_gpu, dtype=float)
    layer = np.asarray(offloaded_layer_bytes(model, engine, moe, ffn_on_gpu), dtype=float)
    attention = (costs.attention_params(model) + costs.norm_params(model)) * costs.static_bytes_per_param(model)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(layer > 0, attention / layer, 0.0)

