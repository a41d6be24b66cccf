"""A prefill layer, layer-major (every micro-batch of the layer, then the next layer): its
resources as lanes (:func:`prefill_resources`), with the engine's prefill weight path, KV
write-back, hidden-state round trip, chunked passes, weight-load overlap, dispatch α and
launches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import costs
from ..costs import LayerOps
from ...engines.engine import IDEAL, Engine
from ...machine.rates import Rates
from ...model.spec import ModelSpec
from ...units import dtype_bytes
from .dispatch import launch_overhead_s, prefill_dispatch, with_launches
from .lane import Lane, sum_lanes
from .offload import (attention_block_share, cache_miss_pieces, crossing_layer_bytes, offloaded_experts_on_cpu, on_demand_weights_share,
    seconds_per_miss)
from .ops import attention_rows, cpu_time_s, expert_rows, gpu_time_s
from .transfers import allreduce_s, dram_bytes_s, kv_cache_s, link_bytes_s, weight_transfer_s


def prefill_passes(engine: Engine, tokens):
    """Forward passes of one micro-batch's prefill of ``tokens`` prompt tokens: one, or
    ⌈tokens / prefill.max_tokens_per_pass⌉ under chunked prefill. Each pass is a whole graph
    over its share of the tokens, so each reads the layer's weights again: the GPU-resident
    ones from HBM, the offloaded ones over the link (llama.cpp evaluates one graph per
    ubatch, src/llama-context.cpp:1870-2054 ``do { ... process_ubatch ... } while
    (mctx->next())``; vLLM's chunked prefill runs one forward per chunk, its UVA reads inside
    every pass's kernels)."""
    cap = engine.prefill.max_tokens_per_pass
    tokens = np.asarray(tokens, dtype=float)
    return np.ones(tokens.shape) if cap is None else np.ceil(tokens / cap)


@dataclass(frozen=True)
class PrefillLayerTerms:
    """What a prefill layer's lanes are built from (arrays over μ): its tokens, its forward
    passes (:func:`prefill_passes`), one pass's operators and expert rows, the GPU chain per
    micro-batch over all its passes (``gpu_s``, with its MoE part ``moe_s``), the
    dispatch α and the engine's launch lanes, the KV write-back's and the weight path's
    seconds per resource, the share of offloaded experts computed on the CPU, and the bytes
    of the hidden states' round trips."""

    tokens: np.ndarray
    zero: np.ndarray
    #: forward passes of the micro-batch's prompt; ``ops``, ``rows`` and ``crossing_bytes`` are one pass's
    passes: np.ndarray
    ops: LayerOps
    rows: np.ndarray
    moe_s: np.ndarray
    gpu_s: np.ndarray
    allreduce_s: dict
    alpha_s: dict
    launch: dict
    kv_s: dict
    kv_chain_s: np.ndarray | float
    on_cpu: np.ndarray
    crossing_bytes: np.ndarray
    weights_s: dict
    hidden_bytes: np.ndarray | float
    cpu_hidden_bytes: np.ndarray
    miss_pieces: tuple
    #: share of the crossing bytes that are the attention block's (:func:`attention_block_share`)
    attention_share: np.ndarray | float = 0.0


def prefill_layer_terms(model: ModelSpec, rates: Rates, micro_batch, prompt_len, moe: bool = True,
                        engine: Engine = IDEAL, gen_len: int = 0) -> PrefillLayerTerms:
    """The :class:`PrefillLayerTerms` of a prefill layer as ``engine`` runs it."""
    mu = np.asarray(micro_batch, dtype=float)
    tokens = mu * prompt_len
    # one pass holds 1/passes of the micro-batch's tokens (a fraction of a prompt under chunked
    # prefill: its attention FLOPs are that share of the causal whole); each pass reads the
    # layer's weights again, so the GPU chain is passes x one pass's roofline
    passes = prefill_passes(engine, tokens)
    pass_tokens = tokens / passes
    ops = costs.prefill_layer_ops(model, mu / passes, prompt_len, moe)
    rows = expert_rows(model, pass_tokens) if moe else pass_tokens
    ab = dtype_bytes(model.activation_dtype)
    zero = np.zeros(mu.shape)
    reduce = allreduce_s(model, rates, engine, tokens)
    moe_s = passes * gpu_time_s(ops.ffn, rates, rows, engine, kernel=moe)
    alpha = prefill_dispatch(model, rates, mu, prompt_len, moe)
    launch = launch_overhead_s(model, rates, engine, tokens, moe)
    bubbles = launch["gpu"] if launch else Lane("gpu")
    gpu = (passes * (gpu_time_s(ops.pre_attn, rates, pass_tokens, engine)
                     + gpu_time_s(ops.attention, rates, attention_rows(model, prompt_len), engine)
                     + gpu_time_s(ops.post_attn, rates, pass_tokens, engine))
           + moe_s + reduce.get("gpu", 0.0) + alpha["gpu"] + bubbles.per_micro_batch_s)
    kv_tokens = mu * (prompt_len + gen_len) if engine.prefill.kv_reserved_gen_slots else tokens
    kv = kv_cache_s(rates, engine, engine.prefill.kv_cache, kv_tokens * costs.kv_bytes_per_token(model))
    # llama.cpp's op offload decides per ubatch: a pass below its minimum computes the CPU experts there
    on_cpu = offloaded_experts_on_cpu(engine, engine.prefill, pass_tokens) if moe else zero
    crossing = (1 - on_cpu) * crossing_layer_bytes(model, engine, engine.prefill, pass_tokens, moe)
    misses = cache_miss_pieces(model, engine.prefill, tokens, seconds_per_miss(model, rates, engine, engine.prefill,
                                                                               tokens, moe_s), zero) if moe else ()
    return PrefillLayerTerms(
        tokens=tokens, zero=zero, passes=passes, ops=ops, rows=rows, moe_s=moe_s, gpu_s=gpu, allreduce_s=reduce,
        alpha_s=alpha, launch=launch, kv_s=kv, kv_chain_s=kv["d2h"] if engine.prefill.kv_cache == "pageable" else 0.0,
        on_cpu=on_cpu, crossing_bytes=crossing,
        weights_s=weight_transfer_s(rates, engine, engine.prefill.weight_path, passes * crossing),
        hidden_bytes=tokens * model.hidden_size * ab if engine.prefill.hidden_round_trip else 0.0,
        cpu_hidden_bytes=on_cpu * tokens * model.hidden_size * ab,  # each way, for the layers' CPU experts
        miss_pieces=misses, attention_share=attention_block_share(model, engine, moe))


def prefill_task_lanes(model: ModelSpec, rates: Rates, engine: Engine, t: PrefillLayerTerms,
                       moe: bool = True) -> dict[str, Lane]:
    """The lanes of the resources that run a prefill layer's tasks: the GPU chain (a pageable
    KV write-back blocks: it joins it), the links (hidden states, all-reduces, the weight load,
    the CPU experts' hidden states, a cache's misses), the CPU (staging, CPU experts) and the
    staging-copy team."""
    zero, weights, reduce, alpha = t.zero, t.weights_s, t.allreduce_s, t.alpha_s
    h2d, d2h = link_bytes_s(rates, engine, "h2d"), link_bytes_s(rates, engine, "d2h")
    blocking = engine.prefill.kv_cache == "pageable"
    lanes = {
        "gpu": Lane("gpu", t.gpu_s + zero, t.kv_chain_s + zero, -t.on_cpu * t.moe_s + zero),
        "h2d": Lane("h2d", alpha["h2d"] + t.hidden_bytes / h2d + reduce.get("h2d", 0.0) + zero, zero,
                    weights["h2d"] + t.cpu_hidden_bytes / h2d + zero, pieces=t.miss_pieces),
        "d2h": Lane("d2h", alpha["d2h"] + t.hidden_bytes / d2h + reduce.get("d2h", 0.0) + zero,
                    (0.0 if blocking else t.kv_s["d2h"]) + zero, t.cpu_hidden_bytes / d2h + zero),
    }
    cpu_weights = weights.get("cpu", 0.0) + (t.on_cpu * t.passes * cpu_time_s(t.ops.ffn, rates, t.rows, engine, model)
                                             if moe else 0.0)
    if "cpu" in weights or np.any(t.on_cpu):
        lanes["cpu"] = Lane("cpu", zero, zero, cpu_weights + zero)
    if "copy" in weights:
        lanes["copy"] = Lane("copy", zero, zero, weights["copy"] + zero)
    return lanes


def prefill_bound_lanes(model: ModelSpec, rates: Rates, engine: Engine, t: PrefillLayerTerms) -> dict[str, Lane]:
    """A prefill layer's capacity bounds: the GPU chain waiting on the weight load
    (``gpu+weights``), and host DRAM (``dram``) when the engine charges it.

    The weight load overlaps the layer as ``prefill.weights_overlap`` says: ``full`` — its
    own lane; ``last-micro-batch-moe`` — issued after the last micro-batch was queued, so
    the ``gpu+weights`` bound is n·(GPU per micro-batch) − (its MoE) + load; ``none`` —
    n·(GPU per micro-batch) + load; ``next-block-one-micro-batch`` — the layer runs as two
    blocks, each slot synced (FlexGen ``--sep-layer``): the FFN block's weights load beside one
    micro-batch's attention, the attention block's beside one micro-batch's FFN, so the layer
    takes max(W_ffn, attn) + max(W_attn, ffn) + (n − 1)·(GPU per micro-batch): the max of the
    four sums, ``gpu``, ``gpu+weights`` (both loads) and one lane for each block's load."""
    zero, weights = t.zero, t.weights_s
    lanes = {}
    overlap_rule = engine.prefill.weights_overlap
    if overlap_rule != "full":
        overlap = {"one-micro-batch": t.gpu_s, "next-block-one-micro-batch": t.gpu_s, "last-micro-batch-moe": t.moe_s,
                   "none": 0.0}[overlap_rule]
        lanes["gpu+weights"] = Lane("gpu+weights", t.gpu_s + zero, t.kv_chain_s + zero, weights["h2d"] + zero,
                                    -overlap + zero)
    if overlap_rule == "next-block-one-micro-batch":
        attention_share = t.attention_share + zero
        attention_s = t.gpu_s - t.moe_s  # one micro-batch's GPU work outside the FFN block
        lanes["gpu+ffn-weights"] = Lane("gpu+ffn-weights", t.gpu_s + zero, t.kv_chain_s + zero,
                                        (1 - attention_share) * weights["h2d"], -attention_s + zero)
        lanes["gpu+attention-weights"] = Lane("gpu+attention-weights", t.gpu_s + zero, t.kv_chain_s + zero,
                                              attention_share * weights["h2d"], -t.moe_s + zero)
    elif engine.prefetch_bucket_hidden_sq is not None:  # the GPU chain waits for what the bucket does not hold
        on_demand = on_demand_weights_share(model, engine, t.crossing_bytes) * weights["h2d"]
        lanes["gpu+weights"] = Lane("gpu+weights", t.gpu_s + zero, t.kv_chain_s + zero, on_demand + zero)
    if engine.host_dram:
        lanes["dram"] = Lane("dram", (2 * t.hidden_bytes / dram_bytes_s(rates) + t.allreduce_s.get("dram", 0.0)) + zero,
                             t.kv_s["dram"] + zero, weights["dram"] + zero)
    return lanes


def prefill_resources(model: ModelSpec, rates: Rates, micro_batch, prompt_len, moe: bool = True,
                      engine: Engine = IDEAL, gen_len: int = 0) -> dict[str, Lane]:
    """Prefill of one layer, layer-major: all computation on the GPU, the layer's offloaded
    weights loaded once on the engine's prefill weight path, the prompt's KV written back to
    the CPU (with the slots reserved for the ``gen_len`` tokens to come when the engine
    allocates them there), and the hidden states' round trip to pinned CPU memory when the
    engine parks them there. Under chunked prefill the offloaded weights cross once per pass
    (:func:`prefill_passes`). The lanes of the resources (:func:`prefill_task_lanes`), then
    the bounds (:func:`prefill_bound_lanes`), then the engine's launches."""
    t = prefill_layer_terms(model, rates, micro_batch, prompt_len, moe, engine, gen_len)
    lanes = {**prefill_task_lanes(model, rates, engine, t, moe), **prefill_bound_lanes(model, rates, engine, t)}
    # the GPU's sync bubbles are in its chain above (so in every bound built on it); the rest:
    # the host's issue lane, the CPU ops, the once-per-layer syncs
    bubbles = t.launch["gpu"] if t.launch else Lane("gpu")
    for name in ("gpu", "gpu+weights", "gpu+ffn-weights", "gpu+attention-weights"):
        if name in lanes and t.launch:
            lanes[name] = sum_lanes(name, [lanes[name], Lane(name, per_layer_s=bubbles.per_layer_s + t.zero)])
    return with_launches(lanes, {k: lane for k, lane in t.launch.items() if k != "gpu"}, t.zero)
