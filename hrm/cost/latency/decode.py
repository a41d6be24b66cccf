"""A decode layer (paper §4.1, Algorithm 1): the tasks of one micro-batch with their time
coefficients (:class:`DecodeTask`: each a share of its resource's affine lane) and the
resources they sum to, with the dispatch α and the engine's launches (:func:`decode_resources`).

Resources ``copy`` (the staging-copy team), ``dram`` (host DRAM traffic) and
``gpu+weights`` (the GPU chain waiting on ZeRO-3's on-demand weights) are capacity bounds,
not task queues.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .. import costs
from ..costs import LayerOps
from ...engines.engine import IDEAL, Engine
from ...machine.rates import Rates
from ...model.spec import ModelSpec
from ...units import dtype_bytes
from .dispatch import decode_dispatch, launch_overhead_s, with_launches
from .lane import BOUNDS, RESOURCES, Lane, sum_lanes
from .offload import (cache_miss_pieces, crossing_layer_bytes, offloaded_experts_on_cpu, on_demand_weights_share,
    seconds_per_miss)
from .ops import attention_rows, cpu_time_s, expert_rows, gpu_time_s
from .transfers import allreduce_s, dram_bytes_s, kv_cache_s, kv_load_s, link_bytes_s, weight_transfer_s
from .workspace_attention import workspace_attention_s, workspace_passes


@dataclass(frozen=True)
class DecodeTask:
    """One task of a micro-batch in a decode layer (paper §4.1) and its share of its
    resource's affine time. ``kind`` groups tasks for pictures (:mod:`hrm.pipelines.lanes_timeline`)."""

    name: str
    resource: str
    kind: str
    lane: Lane


@dataclass(frozen=True)
class DecodeLayerTerms:
    """What the tasks of one micro-batch in a decode layer are built from (arrays broadcast
    over μ, c, A_g, F_g): the placement shares, the layer's operators, the bytes each
    transfer moves, the KV paths' and the weight path's seconds per resource, the share of
    offloaded experts computed on the CPU, and the experts' seconds on each tier."""

    mu: np.ndarray
    attn: np.ndarray
    ffn: np.ndarray | float
    zero: np.ndarray
    ops: LayerOps
    qkv_bytes: np.ndarray
    hidden_bytes: np.ndarray
    ffn_bytes: np.ndarray
    hidden_each_way_bytes: np.ndarray
    kv_read_s: dict
    kv_new_s: dict
    on_cpu: np.ndarray
    crossing_bytes: np.ndarray
    weights_s: dict
    allreduce_s: dict
    gpu_experts_s: np.ndarray
    cpu_experts_s: np.ndarray
    cpu_attention_s: np.ndarray
    cpu_attention_dram_bytes: np.ndarray
    miss_pieces: tuple


def decode_layer_terms(model: ModelSpec, rates: Rates, micro_batch, context, attn_on_gpu, ffn_on_gpu,
                       moe: bool = True, engine: Engine = IDEAL) -> DecodeLayerTerms:
    """The :class:`DecodeLayerTerms` of one micro-batch in a decode layer as ``engine`` runs it."""
    mu = np.asarray(micro_batch, dtype=float)
    attn = np.asarray(attn_on_gpu, dtype=float)
    ffn = np.asarray(ffn_on_gpu, dtype=float) if moe else 1.0
    ops = costs.decode_layer_ops(model, mu, context, moe)
    ab = dtype_bytes(model.activation_dtype)
    kv_token = costs.kv_bytes_per_token(model)
    context = np.asarray(context, dtype=float)
    zero = np.zeros(np.broadcast(mu, context, attn).shape)
    ffn_rows = expert_rows(model, mu) if moe else mu
    ffn_op = ops.ffn
    if moe and engine.moe_reads_all_experts:
        # the fused kernel walks every resident expert of the layer for each micro-batch
        ffn_op = replace(ffn_op, weight_bytes=costs.layer_expert_bytes(model) + 0 * mu, kv_bytes=0.0)
    # the host KV cache's memory sets the path of its prefetch too (pageable: driver-staged)
    kv_read = kv_load_s(rates, engine, engine.decode.kv_cache, attn * mu * costs.attended_context(model, context)
                        * kv_token)
    kv_new = kv_cache_s(rates, engine, engine.decode.kv_cache, attn * mu * kv_token)
    # experts not kept on the GPU: streamed to it, or (offloaded_experts: cpu) computed on the CPU
    on_cpu = offloaded_experts_on_cpu(engine, engine.decode, mu) * ffn if moe else zero
    crossing = (1 - on_cpu) * crossing_layer_bytes(model, engine, engine.decode, mu, moe, ffn)
    gpu_experts_s = gpu_time_s(ffn_op, rates, ffn_rows, engine, kernel=moe)  # a dense layer: its MLP
    misses = cache_miss_pieces(model, engine.decode, mu, seconds_per_miss(model, rates, engine, engine.decode, mu,
                                                                          gpu_experts_s), zero) if moe else ()
    return DecodeLayerTerms(
        mu=mu, attn=attn, ffn=ffn, zero=zero, ops=ops,
        qkv_bytes=(1 - attn) * mu * costs.qkv_width(model) * ab,
        hidden_bytes=(1 - attn) * mu * model.attn_out_dim * ab,
        ffn_bytes=(1 - ffn) * mu * model.hidden_size * ab,
        hidden_each_way_bytes=mu * model.hidden_size * ab,  # to CPU experts and back
        kv_read_s=kv_read, kv_new_s=kv_new, on_cpu=on_cpu, crossing_bytes=crossing,
        weights_s=weight_transfer_s(rates, engine, engine.decode.weight_path, crossing),
        allreduce_s=allreduce_s(model, rates, engine, mu), gpu_experts_s=gpu_experts_s,
        cpu_experts_s=cpu_time_s(ops.ffn, rates, ffn_rows, engine, model),
        cpu_attention_s=cpu_attention_s(model, rates, mu, context, ops, engine) + zero,
        cpu_attention_dram_bytes=cpu_attention_dram_bytes(model, mu, context, ops, engine) + zero, miss_pieces=misses)


def cpu_attention_s(model: ModelSpec, rates: Rates, micro_batch, context, ops: LayerOps, engine: Engine):
    """One micro-batch's decode attention on the CPU as ``engine`` runs it: the roofline of the
    attention operator, or FlexGen's fp32-workspace passes (:mod:`.workspace_attention`)."""
    if engine.cpu_attention == "fp32-workspace":
        return workspace_attention_s(model, rates, micro_batch, context)
    return cpu_time_s(ops.attention, rates, attention_rows(model), engine)


def cpu_attention_dram_bytes(model: ModelSpec, micro_batch, context, ops: LayerOps, engine: Engine):
    """Host DRAM bytes of one micro-batch's CPU attention: the operator's bytes, or every pass of
    FlexGen's fp32 workspace (:func:`.workspace_attention.workspace_passes`)."""
    if engine.cpu_attention == "fp32-workspace":
        return workspace_passes(model, micro_batch, context).dram_bytes
    return ops.attention.bytes


def _task(t: DecodeLayerTerms, name: str, resource: str, kind: str, per_mb=0.0, per_mb_kv=0.0, weights=0.0,
          pieces=()) -> DecodeTask:
    """The task ``name`` with its lane's terms broadcast to the layer's shape."""
    return DecodeTask(name, resource, kind, Lane(name, per_mb + t.zero, per_mb_kv + t.zero, weights + t.zero,
                                                 pieces=pieces))


def compute_tasks(model: ModelSpec, rates: Rates, engine: Engine, t: DecodeLayerTerms) -> list[DecodeTask]:
    """The GPU's and the CPU's tasks of one micro-batch: pre-attention, attention on either
    tier, post-attention with the GPU's experts, the CPU's experts."""
    ops, mu, attn, ffn = t.ops, t.mu, t.attn, t.ffn
    return [
        _task(t, "PreAttn", "gpu", "pre_attn", gpu_time_s(ops.pre_attn, rates, mu, engine)),
        _task(t, "GPUAttn", "gpu", "attention", attn * gpu_time_s(ops.attention, rates, attention_rows(model), engine)),
        # (the offloaded share of the layers runs its experts on the CPU under offloaded_experts: cpu)
        _task(t, "PostAttn", "gpu", "post_attn", gpu_time_s(ops.post_attn, rates, mu, engine)
              + t.allreduce_s.get("gpu", 0.0) + ffn * t.gpu_experts_s, weights=-t.on_cpu * t.gpu_experts_s),
        _task(t, "CPUAttn", "cpu", "attention", (1 - attn) * t.cpu_attention_s),
        _task(t, "CPUExperts", "cpu", "experts", (1 - ffn) * t.cpu_experts_s, weights=t.on_cpu * t.cpu_experts_s),
    ]


def transfer_tasks(rates: Rates, engine: Engine, t: DecodeLayerTerms) -> list[DecodeTask]:
    """The link's tasks of one micro-batch (paper §4.1's D1-D4, the CPU experts' hidden
    states, the new KV written back)."""
    h2d, d2h = link_bytes_s(rates, engine, "h2d"), link_bytes_s(rates, engine, "d2h")
    each_way = t.hidden_each_way_bytes
    return [
        # D1 QKV to the CPU; hidden states to CPU experts
        _task(t, "QKV→CPU", "d2h", "qkv", t.qkv_bytes / d2h),
        _task(t, "FFN→CPU", "d2h", "hidden", t.ffn_bytes / d2h, weights=t.on_cpu * each_way / d2h),
        # the new token's K/V written back to the CPU-resident cache after GPU attention
        _task(t, "KV→CPU", "d2h", "kv", per_mb_kv=t.kv_new_s["d2h"]),
        # D2 hidden back after CPU attention; expert outputs back when experts run on the CPU
        _task(t, "Hidden→GPU", "h2d", "hidden", t.hidden_bytes / h2d),
        _task(t, "FFN→GPU", "h2d", "hidden", t.ffn_bytes / h2d, weights=t.on_cpu * each_way / h2d),
        # D4: the CPU-resident part of the cache moves to the GPU for GPU attention
        _task(t, "KV→GPU", "h2d", "kv", per_mb_kv=t.kv_read_s["h2d"]),
        # D3: the offloaded weights of the next layer, in n pages (cached: the misses of the micro-batch)
        _task(t, "W", "h2d", "weights", weights=t.weights_s["h2d"], pieces=t.miss_pieces),
    ]


def mechanism_tasks(model: ModelSpec, rates: Rates, engine: Engine, t: DecodeLayerTerms) -> list[DecodeTask]:
    """The tasks the engine's mechanisms add: ZeRO-3's on-demand weights, a pageable weight
    path's staging (the CPU side, the copy team), all-reduces through host memory, and the
    host DRAM traffic of the layer."""
    weights, reduce = t.weights_s, t.allreduce_s
    tasks = []
    if engine.prefetch_bucket_hidden_sq is not None:
        # beyond the prefetch bucket the GPU waits for its weights: this bound's other part is
        # the GPU chain (:func:`decode_resources`)
        tasks.append(_task(t, "W on demand", "gpu+weights", "weights",
                           weights=on_demand_weights_share(model, engine, t.crossing_bytes) * weights["h2d"]))
    if "cpu" in weights:  # the CPU side of a pageable weight path
        tasks.append(_task(t, "StageW", "cpu", "weights", weights=weights["cpu"]))
    if "copy" in weights:
        tasks.append(_task(t, "CopyTeam", "copy", "weights", weights=weights["copy"]))
    if "d2h" in reduce:  # all-reduce through host memory
        tasks += [_task(t, "AllReduce→CPU", "d2h", "allreduce", reduce["d2h"]),
                  _task(t, "AllReduce→GPU", "h2d", "allreduce", reduce["h2d"])]
    if engine.host_dram:
        dram = dram_bytes_s(rates)
        ops = t.ops
        cpu_reads = (1 - t.attn) * t.cpu_attention_dram_bytes + (1 - t.ffn) * ops.ffn.bytes
        dma = t.qkv_bytes + t.hidden_bytes + 2 * t.ffn_bytes
        offloaded_cpu = t.on_cpu * (ops.ffn.bytes + 2 * t.hidden_each_way_bytes) / dram
        tasks.append(_task(t, "HostDRAM", "dram", "dram", (cpu_reads + dma) / dram + reduce.get("dram", 0.0),
                           t.kv_new_s["dram"] + t.kv_read_s["dram"], weights["dram"] + offloaded_cpu))
    return tasks


def decode_tasks(model: ModelSpec, rates: Rates, micro_batch, context, attn_on_gpu, ffn_on_gpu,
                 moe: bool = True, engine: Engine = IDEAL) -> list[DecodeTask]:
    """The tasks of one micro-batch in a decode layer with their time coefficients (arrays
    broadcast over μ, c, A_g, F_g; a task absent under a placement costs 0), as ``engine``
    runs them. Dispatch α (:func:`hrm.cost.latency.dispatch.decode_dispatch`) is per lane and
    added by :func:`decode_resources`."""
    t = decode_layer_terms(model, rates, micro_batch, context, attn_on_gpu, ffn_on_gpu, moe, engine)
    return [*compute_tasks(model, rates, engine, t), *transfer_tasks(rates, engine, t),
            *mechanism_tasks(model, rates, engine, t)]


def decode_resources(model: ModelSpec, rates: Rates, micro_batch, context, attn_on_gpu, ffn_on_gpu,
                     moe: bool = True, engine: Engine = IDEAL) -> dict[str, Lane]:
    """GPU, CPU, H2D and D2H lanes of one decode layer (plus the engine's bounds): the sum
    of each resource's tasks (:func:`decode_tasks`) plus its dispatch α (arrays broadcast
    over μ, c, A_g, F_g)."""
    tasks = decode_tasks(model, rates, micro_batch, context, attn_on_gpu, ffn_on_gpu, moe, engine)
    names = list(RESOURCES) + [r for r in BOUNDS if any(t.resource == r for t in tasks)]
    lanes = {r: sum_lanes(r, [t.lane for t in tasks if t.resource == r]) for r in names}
    if rates.gpu_dispatch is not None or rates.cpu_dispatch is not None:
        ffn = np.asarray(ffn_on_gpu, dtype=float) if moe else 1.0
        alpha = decode_dispatch(model, rates, np.asarray(micro_batch, dtype=float),
                                np.asarray(attn_on_gpu, dtype=float), ffn, moe)
        lanes = {r: sum_lanes(r, [lane, Lane(r, *alpha[r])]) if r in alpha else lane for r, lane in lanes.items()}
    mu = np.asarray(micro_batch, dtype=float)
    launch = launch_overhead_s(model, rates, engine, mu, moe)
    gpu_work = lanes["gpu"]
    lanes = with_launches(lanes, launch, 0.0 * lanes["gpu"].per_micro_batch_s)
    if launch and engine.sync == "per-micro-batch":
        lanes["host+gpu"] = sum_lanes("host+gpu", [lanes["host"], gpu_work])
    if "gpu+weights" in lanes:  # the GPU chain plus what it waits for (the on-demand weights)
        lanes["gpu+weights"] = sum_lanes("gpu+weights", [lanes["gpu"], lanes["gpu+weights"]])
    return lanes
