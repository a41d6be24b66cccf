"""Per-layer latency for a schedule (paper §4.2, eqs. 12–14) as affine *lanes*.

Each resource (GPU, CPU, CPU→GPU link, GPU→CPU link) accumulates, over the n micro-batches
of a layer, the time of its tasks; a task's time is max(FLOPs / FLOP/s, bytes / bandwidth)
(eq. 14, the roofline of eq. 8). For a fixed micro-batch size μ and placement (A_g, F_g) a
resource's time is affine in the remaining decisions:

    time = n · per_micro_batch_s + n · (1 − r_c) · per_micro_batch_kv_cpu_s
           + (1 − r_w) · per_layer_offloaded_weights_s

(the KV-cache terms D4/new-KV offload scale with the CPU-resident KV fraction, the weight
pages D3 with the offloaded weight fraction). A schedule combines resources into *lanes*
that run concurrently; the layer time is the max over lanes (eq. 12). The solver uses these
same coefficients, so the formulas exist once.

Transfers (paper §4.1): D1 QKV GPU→CPU, D2 hidden CPU→GPU, D3 weight pages CPU→GPU,
D4 KV cache CPU→GPU (attention on GPU with KV on CPU).

Dispatch overhead (α-β model): a measured profile may carry a fixed cost per task and per
operator call (:class:`hrm.machine.hardware.Dispatch`: kernel launches and stream syncs on a GPU,
Python/torch dispatch on an emulated tier). Each lane then also pays, per micro-batch, the
α of the tasks the schedule puts on it (:func:`decode_dispatch`) — still affine, so the
solver carries it through the same coefficients. Without it (datasheet profiles) every
α is 0 and the lanes are the plain roofline of eq. 14.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from . import costs
from ..model import quantized
from .costs import OpCost
from ..engines.engine import IDEAL, Engine
from ..model.spec import ModelSpec
from ..machine.rates import Rates
from ..machine.achieved import COPY_DRAM_BYTES_PER_BYTE, NUMA_REMOTE_FRACTION
from ..engines.schedules import SCHEDULES as _SCHEDULE_REGISTRY
from ..engines.schedules import get_schedule
from ..machine.launches import (charged, cpu_issue_s, host_issue_s, layer_host_issue_s, layer_sync_bubbles_s,
    sync_bubbles_s)
from ..units import dtype_bytes

SCHEDULES = tuple(_SCHEDULE_REGISTRY)
SCHEDULE_HELP = {name: sched.help for name, sched in _SCHEDULE_REGISTRY.items()}


@dataclass(frozen=True)
class Lane:
    """time = n·per_micro_batch_s + n·(1−r_c)·per_micro_batch_kv_cpu_s
    + (1−r_w)·per_layer_offloaded_weights_s + per_layer_s
    [+ max_j (pieces[j][0] + (1−r_w)·pieces[j][1]): a convex piecewise-linear term in r_w,
    the expert-cache misses of ``offloaded_experts: cached``; :meth:`expanded` turns a lane
    with pieces into one affine lane per piece, whose max is the same time]"""

    name: str
    per_micro_batch_s: np.ndarray | float = 0.0
    per_micro_batch_kv_cpu_s: np.ndarray | float = 0.0
    per_layer_offloaded_weights_s: np.ndarray | float = 0.0
    per_layer_s: np.ndarray | float = 0.0
    pieces: tuple = ()

    def time_s(self, num_micro_batches, weights_gpu_ratio, kv_gpu_ratio):
        n = np.asarray(num_micro_batches, dtype=float)
        offloaded = 1.0 - np.asarray(weights_gpu_ratio, dtype=float)
        time = (
            n * self.per_micro_batch_s
            + n * (1.0 - np.asarray(kv_gpu_ratio, dtype=float)) * self.per_micro_batch_kv_cpu_s
            + offloaded * self.per_layer_offloaded_weights_s
            + self.per_layer_s
        )
        if self.pieces:
            time = time + np.max([np.asarray(a) + offloaded * np.asarray(b) for a, b in self.pieces], axis=0)
        return time

    def __add__(self, other: "Lane") -> "Lane":
        if self.pieces and other.pieces:
            raise ValueError("lanes with two piecewise terms cannot be added (their max does not distribute)")
        return Lane(
            f"{self.name}+{other.name}",
            self.per_micro_batch_s + other.per_micro_batch_s,
            self.per_micro_batch_kv_cpu_s + other.per_micro_batch_kv_cpu_s,
            self.per_layer_offloaded_weights_s + other.per_layer_offloaded_weights_s,
            self.per_layer_s + other.per_layer_s,
            self.pieces or other.pieces,
        )

    def renamed(self, name: str) -> "Lane":
        return Lane(name, self.per_micro_batch_s, self.per_micro_batch_kv_cpu_s, self.per_layer_offloaded_weights_s,
                    self.per_layer_s, self.pieces)

    def expanded(self) -> list["Lane"]:
        """This lane as affine lanes (one per piece: the piece's terms added) whose max over
        r_w is :meth:`time_s`."""
        if not self.pieces:
            return [self]
        return [Lane(f"{self.name}#{j}", self.per_micro_batch_s, self.per_micro_batch_kv_cpu_s,
                     self.per_layer_offloaded_weights_s + b, self.per_layer_s + a)
                for j, (a, b) in enumerate(self.pieces)]


def _sum_lanes(name: str, lanes) -> Lane:
    total = Lane(name)
    for lane in lanes:
        total = total + lane
    return total.renamed(name)


def op_time_s(op: OpCost, flops_per_s, bytes_per_s):
    """Eq. 14 / eq. 8: a task is bound by its compute or its memory roof."""
    return np.maximum(op.flops / flops_per_s, op.bytes / bytes_per_s)


def gpu_rate_factors(rates: Rates, engine: Engine = IDEAL, kernel: bool = False) -> tuple[float, float]:
    """(FLOP/s factor, bandwidth factor) of the device tier under ``engine``: with
    ``achieved_gpu_rates`` GEMMs run at the GPU's achieved fraction of tensor peak (unless
    a measured FLOP/s-vs-M curve already is achieved) and memory at its streaming
    efficiency; ``kernel`` applies the engine's MoE-kernel efficiency on top. The emulated
    tier of a CPU-only host is measured as it runs: factors 1."""
    ach = rates.achieved
    if ach is None or rates.shared_unit:
        return 1.0, 1.0
    flops, bandwidth = 1.0, 1.0
    if engine.achieved_gpu_rates:
        bandwidth = ach.gpu_memory_stream_efficiency
        flops = 1.0 if rates.gpu_matmul_curve else ach.gpu_gemm_efficiency
    if kernel:
        flops *= engine.kernel.factor(ach.architecture)
    return flops, bandwidth


def gpu_time_s(op: OpCost, rates: Rates, matmul_rows=None, engine: Engine = IDEAL, kernel: bool = False):
    """``op`` on the device tier; ``kernel``: it runs in the engine's MoE kernel, whose
    efficiency (:func:`gpu_rate_factors`) and time factor at ``matmul_rows`` tokens per
    expert (:func:`kernel_slowdown`) apply.

    An op on quantized weights (``op.quantized``) under an engine that names a dequantizing
    kernel family (``engine.quant_kernel``) runs in that family instead
    (:func:`quantized_gpu_time_s`): its fractions are measured against the fp16 GEMM, so they
    replace the fp16 MoE kernel's (``kernel``'s factor and slowdown are not applied on top)."""
    if quant_family(op, rates, engine) is not None:
        return quantized_gpu_time_s(op, rates, matmul_rows, engine)
    flops, bandwidth = gpu_rate_factors(rates, engine, kernel)
    seconds = op_time_s(op, rates.gpu_flops(matmul_rows) * flops, rates.gpu_bandwidth_bytes_s * bandwidth)
    return seconds * kernel_slowdown(rates, engine, matmul_rows) if kernel else seconds


def quantized_gpu_time_s(op: OpCost, rates: Rates, matmul_rows, engine: Engine):
    """``op`` (quantized weights) in the engine's dequantizing kernel family
    (:mod:`hrm.model.quantized`): eq. 14's roofline at the fp16 path's FLOP rate at
    ``matmul_rows`` and memory rate (the engine's achieved-rate factors, no MoE-kernel
    factor) times the family's compute and bandwidth fractions on the GPU's architecture
    (``default`` on a datasheet profile without one)."""
    flops, bandwidth = gpu_rate_factors(rates, engine, kernel=False)
    architecture = rates.achieved.architecture if rates.achieved is not None else None
    compute, memory = quant_family(op, rates, engine).fractions(architecture)
    return op_time_s(op, rates.gpu_flops(matmul_rows) * flops * compute,
                     rates.gpu_bandwidth_bytes_s * bandwidth * memory)


def kernel_slowdown(rates: Rates, engine: Engine, rows):
    """The engine's MoE kernel time over a tuned kernel's at ``rows`` tokens per expert
    (:meth:`hrm.engines.engine.Kernel.slowdown`); 1 on the emulated tier of a CPU-only host, which is
    measured as it runs."""
    if rates.achieved is None or rates.shared_unit or rows is None:
        return 1.0
    return engine.kernel.slowdown(rows)


def cpu_time_s(op: OpCost, rates: Rates, matmul_rows=None, engine: Engine = IDEAL, model: ModelSpec | None = None):
    """``op`` on the CPU tier at its FLOP/s (at ``matmul_rows`` rows) and memory rate. An op
    on quantized weights under an engine whose dequantizing family has CPU numbers
    (:meth:`hrm.model.quantized.QuantKernel.cpu_fractions`: llama.cpp's CPU experts) runs at the
    family's CPU fractions of those rates; the emulated tier of a CPU-only host is measured
    as it runs (no family)."""
    if engine.cpu_kernels == "ggml" and rates.ggml_cpu is not None and op.name == "experts" and model is not None:
        return ggml_experts_s(op, model, rates, matmul_rows, engine)
    compute, memory = cpu_quant_fractions(op, rates, engine) or (1.0, 1.0)
    return op_time_s(op, rates.cpu_flops(matmul_rows) * compute, rates.cpu_bandwidth_bytes_s * memory)


def ggml_experts_s(op: OpCost, model: ModelSpec, rates: Rates, matmul_rows, engine: Engine = IDEAL):
    """Routed experts in ggml's CPU MUL_MAT_ID kernel (docs/model.md §4.10): their weight
    elements × the profile's measured seconds per element for the model's weight type at the
    rows each touched expert gets, on the command's -t (``engine.cpu_threads``) or llama.cpp's
    default threads, the nearest measured count."""
    from .ggml_cpu import ggml_type_of, nearest_threads, seconds_per_element

    threads = nearest_threads(rates.ggml_cpu, engine.cpu_threads or rates.cpu_threads)
    kind = ggml_type_of(model)
    elements = np.asarray(op.weight_bytes, dtype=float) / costs.weight_bytes_per_param(model)
    rows = np.broadcast_to(np.asarray(1.0 if matmul_rows is None else matmul_rows, dtype=float), elements.shape)
    per = np.vectorize(lambda r: seconds_per_element(rates.ggml_cpu, kind, "mmid", threads, float(r)))(rows)
    return elements * per


def quant_family(op: OpCost, rates: Rates, engine: Engine):
    """The dequantizing kernel family (:class:`hrm.model.quantized.QuantKernel`) ``op`` runs in:
    the engine's, for an op on quantized weights; None at the plain roofline (unquantized
    weights, no family, a CPU-only host's emulated tier, which is measured as it runs)."""
    if not op.quantized or engine.quant_kernel is None or rates.shared_unit:
        return None
    return quantized.quant_kernel(engine.quant_kernel)


def cpu_quant_fractions(op: OpCost, rates: Rates, engine: Engine) -> tuple[float, float] | None:
    """(compute, bandwidth) fractions of ``op`` on the CPU in its dequantizing family, or
    None where it runs at the CPU roofline (:func:`quant_family` None, or a family without
    CPU numbers)."""
    family = quant_family(op, rates, engine)
    return family.cpu_fractions() if family is not None else None


# --- engine mechanisms: the host side -------------------------------------------------

def host_side_modelled(rates: Rates) -> bool:
    """Whether the host side of transfers is modelled: a real CPU↔GPU link with achieved
    rates (on a CPU-only host a "transfer" is the emulated tier's measured copy)."""
    return rates.achieved is not None and not rates.shared_unit


def dram_bytes_per_byte(pageable: bool) -> float:
    """Host DRAM bytes per byte a DMA moves: the DMA's own read or write, plus, for a
    pageable buffer, the staging copy's read + write + write-allocate."""
    return 1.0 + (COPY_DRAM_BYTES_PER_BYTE if pageable else 0.0)


def link_bytes_s(rates: Rates, engine: Engine, direction: str, pageable: bool = False) -> float:
    """Aggregate CPU↔GPU rate of all GPUs (``direction`` h2d or d2h) for pinned or pageable
    copies. Ranks that share a PCIe switch share its uplink when the engine's ranks share
    the host (``tensor_parallel.host_shared``); pinned buffers on the far socket of a
    NUMA host (an engine that is not NUMA-aware: a buffer lands on each node alike) copy
    at :data:`hrm.machine.achieved.NUMA_REMOTE_FRACTION` of the local rate."""
    pinned = rates.h2d_bytes_s if direction == "h2d" else rates.d2h_bytes_s
    if not host_side_modelled(rates):
        return pinned
    ach = rates.achieved
    per_gpu = pinned / rates.gpu_count
    if pageable:
        per_gpu = ach.h2d_pageable_bytes_s if direction == "h2d" else ach.d2h_pageable_bytes_s
    links = ach.host_uplinks(rates.gpu_count) if engine.tensor_parallel.host_shared else rates.gpu_count
    rate = per_gpu * links
    if not engine.numa_aware and ach.numa_nodes > 1 and not pageable:
        local = 1.0 / ach.numa_nodes
        rate = 1.0 / (local / rate + (1.0 - local) / (rate * NUMA_REMOTE_FRACTION))
    return rate


def dram_bytes_s(rates: Rates) -> float:
    """Host DRAM bandwidth of the host-DRAM lane (STREAM counting: every byte read or written
    counts): the profile's measured all-core DRAM traffic (``cpu.dram_gbps``), else its DRAM
    rate (:mod:`hrm.machine.achieved`); on a CPU-only host the tier's own bandwidth."""
    ach = rates.achieved
    if ach is None or rates.shared_unit or ach.dram_bytes_s <= 0:
        return rates.cpu_bandwidth_bytes_s
    return ach.dram_bytes_s


def weight_transfer_s(rates: Rates, engine: Engine, path: str, weight_bytes) -> dict[str, np.ndarray | float]:
    """Seconds per resource to bring ``weight_bytes`` of offloaded weights to the GPU:

    - ``pinned``: DMA at the pinned rate; DRAM reads each byte once;
    - ``pageable-staged``: a CPU team of ``copy_threads`` threads copies pageable → pinned
      (the ``copy`` lane at the team's memcpy rate; the cores it holds, its share of the
      ``cpu`` lane), then DMA at the pinned rate; DRAM: read + write + write-allocate of the
      copy, then the DMA read;
    - ``pageable-driver``: the driver stages the copy (pageable rate), on the issuing
      thread's core; DRAM as for the staged path."""
    ach = rates.achieved
    staged = path != "pinned" and host_side_modelled(rates)
    out: dict = {"h2d": weight_bytes / link_bytes_s(rates, engine, "h2d", pageable=path == "pageable-driver")}
    if staged and path == "pageable-staged":
        threads = min(engine.copy_threads or ach.cores, ach.cores)
        out["copy"] = weight_bytes / ach.memcpy_bytes_s(threads)
        out["cpu"] = out["copy"] * threads / ach.cores
    elif staged:
        out["cpu"] = out["h2d"] / ach.cores
    out["dram"] = weight_bytes * dram_bytes_per_byte(staged) / dram_bytes_s(rates)
    return out


def kv_cache_s(rates: Rates, engine: Engine, path: str, kv_bytes) -> dict[str, np.ndarray | float]:
    """Seconds per resource to write ``kv_bytes`` of new KV cache to CPU memory: pinned
    (async DMA) or pageable (driver-staged: the pageable rate, 3 more DRAM bytes per byte)."""
    pageable = path == "pageable" and host_side_modelled(rates)
    return {"d2h": kv_bytes / link_bytes_s(rates, engine, "d2h", pageable=pageable),
            "dram": kv_bytes * dram_bytes_per_byte(pageable) / dram_bytes_s(rates)}


def kv_load_s(rates: Rates, engine: Engine, path: str, kv_bytes) -> dict[str, np.ndarray | float]:
    """Seconds per resource to bring ``kv_bytes`` of host-resident KV cache to the GPU: the
    cache's memory sets the path (pinned: DMA; pageable: driver-staged at the pageable rate,
    3 more DRAM bytes per byte)."""
    pageable = path == "pageable" and host_side_modelled(rates)
    return {"h2d": kv_bytes / link_bytes_s(rates, engine, "h2d", pageable=pageable),
            "dram": kv_bytes * dram_bytes_per_byte(pageable) / dram_bytes_s(rates)}


def allreduce_s(model: ModelSpec, rates: Rates, engine: Engine, tokens) -> dict[str, np.ndarray | float]:
    """Tensor parallelism: two ring all-reduces of the hidden states per layer (after the
    attention output projection and after the FFN), 2(p−1)/p of the bytes each per GPU, on
    the compute stream (the ``gpu`` lane waits for them). Over the GPU-to-GPU link
    (``gpu-link``; NCCL with peer-to-peer); NCCL without P2P stages through host memory:
    every GPU writes its share to the host and reads the others' back over its own link,
    so the traffic also loads the h2d/d2h lanes and host DRAM (write + read). The paper
    leaves this traffic out."""
    p = rates.gpu_count
    if p <= 1:
        return {}
    payload = np.asarray(tokens, dtype=float) * model.hidden_size * dtype_bytes(model.activation_dtype)
    per_gpu = 2 * 2 * (p - 1) / p * payload
    ach = rates.achieved
    if engine.tensor_parallel.allreduce == "gpu-link" or ach is None or ach.p2p:
        return {"gpu": per_gpu / rates.g2g_bytes_s} if rates.g2g_bytes_s else {}
    d2h, h2d = link_bytes_s(rates, engine, "d2h"), link_bytes_s(rates, engine, "h2d")
    return {"gpu": per_gpu * p / d2h + per_gpu * p / h2d, "d2h": per_gpu * p / d2h, "h2d": per_gpu * p / h2d,
            "dram": 2 * per_gpu * p / dram_bytes_s(rates)}


def allreduce_time_s(model: ModelSpec, rates: Rates, tokens, engine: Engine = IDEAL):
    """The compute stream's wait for the all-reduces of one layer (:func:`allreduce_s`)."""
    return allreduce_s(model, rates, engine, tokens).get("gpu", 0.0)


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
    (:class:`Lane`): with C of a layer's E experts cached (the C hottest, r_w = C/E), the
    misses are Σ_{e∉top C} 1 − (1 − q_e)^tokens experts (:func:`hrm.model.routing.expected_misses`),
    convex in C; each costs ``seconds_per_miss``. The secant of each (C, C + 1) segment is one
    piece, and their max is exact at every whole C. Uniform routing gives one line:
    (1 − r_w)·D(tokens)·seconds_per_miss. () for the other mechanisms."""
    if phase.offloaded_experts not in ("cached", "cached-cpu"):
        return ()
    from ..model.routing import expected_misses, uniform

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
    per_expert = _expert_rows(model, t)  # tokens per touched expert
    hidden = 2 * per_expert * model.hidden_size * dtype_bytes(model.activation_dtype) / link_bytes_s(rates, engine, "h2d")
    on_cpu = cpu_time_s(costs.single_expert(model, per_expert), rates, per_expert, engine) + hidden - gpu_experts_s / distinct
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


def _alpha(dispatch, name: str) -> float:
    """One α of a Dispatch (0 without one)."""
    return float(getattr(dispatch, name)) if dispatch is not None else 0.0


def experts_call_dispatch_s(model: ModelSpec, dispatch, tokens):
    """α of one routed-expert call for ``tokens`` tokens: the call, plus one expert
    invocation per distinct expert touched (the loop runs over the experts the router
    picked, E = ne·(1 − (1 − k/ne)^tokens) of them in expectation)."""
    return _alpha(dispatch, "experts_call_s") + costs.expected_distinct_experts(model, tokens) * _alpha(dispatch, "expert_s")


def post_attn_dispatch_s(model: ModelSpec, dispatch, moe: bool = True) -> float:
    """α of post-attention: the call, plus one expert invocation for a shared expert (MoE
    layer) or the dense MLP (dense layer)."""
    extra = 1.0 if (not moe or model.shared_intermediate_size) else 0.0
    return _alpha(dispatch, "post_attn_s") + extra * _alpha(dispatch, "expert_s")


def decode_dispatch(model: ModelSpec, rates: Rates, micro_batch, attn, ffn, moe: bool = True) -> dict[str, tuple]:
    """Per micro-batch α of each lane in a decode layer, as (always, × (1 − r_c)): the tasks
    of the schedule (paper Algorithm 1; FlexGen S4 order with attention on the GPU) and
    the operator calls and transfers inside them.

    - gpu: PreAttn and PostAttn (one fused task when attention is on the GPU), the expert
      loop when the experts run there, the merge of CPU experts' output otherwise;
    - cpu: CPU attention; CPU experts;
    - d2h: D1 QKV (attention on the GPU: the new token's K and V, 2 copies and the cache
      indexing × (1 − r_c)); the 3 router outputs to the CPU experts;
    - h2d: D2 hidden (GPU attention: the K and V prefetch, 2 copies and the cache indexing
      × (1 − r_c)); the CPU
      experts' output; one weight page per micro-batch while experts run on the GPU
      (exact for r_w < 1; with r_w = 1 nothing is paged and this overcounts n page tasks).
    """
    g, c = rates.gpu_dispatch, rates.cpu_dispatch
    task_g, copy_g, task_c = _alpha(g, "task_s"), _alpha(g, "copy_s"), _alpha(c, "task_s")
    mu = np.asarray(micro_batch, dtype=float)
    ffn_g = experts_call_dispatch_s(model, g, mu) if moe else 0.0
    ffn_c = experts_call_dispatch_s(model, c, mu) if moe else 0.0
    routed = 1.0 if moe else 0.0
    device_attention = g.device_attention() if g is not None else 0.0
    gpu = ((2 - attn) * task_g + _alpha(g, "pre_attn_s") + post_attn_dispatch_s(model, g, moe)
           + attn * device_attention + ffn * ffn_g + routed * (1 - ffn) * task_g)
    cpu = (1 - attn) * (task_c + _alpha(c, "attention_s")) + routed * (1 - ffn) * (task_c + ffn_c)
    d2h = (1 - attn) * (task_g + copy_g) + attn * task_g + routed * (1 - ffn) * (task_g + 3 * copy_g)
    h2d = (1 - attn) * (task_g + copy_g) + attn * task_g + routed * (1 - ffn) * (task_g + copy_g) + routed * ffn * (task_g + copy_g)
    kv_load = attn * (2 * copy_g + _alpha(g, "kv_load_s"))
    kv_store = attn * (2 * copy_g + _alpha(g, "kv_store_s"))
    return {"gpu": (gpu, 0.0), "cpu": (cpu, 0.0), "h2d": (h2d, kv_load), "d2h": (d2h, kv_store)}


def attention_rows(model: ModelSpec, query_tokens=1):
    """Rows M of attention's matmuls: QK^T and PV run per (sequence, KV head) as an
    (M × d) @ (d × c) product over the cached tokens, with the query heads that share the KV
    head stacked — nq/nkv of them (GQA; MLA: all heads share the latent) — times the query
    tokens. With a measured FLOP/s-vs-M curve, decode attention is then charged at the
    efficiency of an M-row matmul streaming its operand (the KV cache) once, like a weight;
    without a curve (datasheet profiles) at the peak, as before."""
    group = model.num_heads if model.is_mla else model.num_heads // model.num_kv_heads
    return group * np.asarray(query_tokens, dtype=float)


def _expert_rows(model: ModelSpec, tokens):
    """Rows of one expert's matmul: tokens·k spread over the distinct experts touched."""
    return np.asarray(tokens, dtype=float) * model.top_k / costs.expected_distinct_experts(model, tokens)


@dataclass(frozen=True)
class DecodeTask:
    """One task of a micro-batch in a decode layer (paper §4.1) and its share of its
    resource's affine time. ``kind`` groups tasks for pictures (:mod:`hrm.pipelines.lanes_timeline`)."""

    name: str
    resource: str
    kind: str
    lane: Lane


def decode_tasks(model: ModelSpec, rates: Rates, micro_batch, context, attn_on_gpu, ffn_on_gpu,
                 moe: bool = True, engine: Engine = IDEAL) -> list[DecodeTask]:
    """The tasks of one micro-batch in a decode layer with their time coefficients (arrays
    broadcast over μ, c, A_g, F_g; a task absent under a placement costs 0), as ``engine``
    runs them. Dispatch α (:func:`decode_dispatch`) is per lane and added by
    :func:`decode_resources`. Resources ``copy`` (the staging-copy team) and ``dram``
    (host DRAM traffic) are capacity bounds, not task queues."""
    mu = np.asarray(micro_batch, dtype=float)
    attn = np.asarray(attn_on_gpu, dtype=float)
    ffn = np.asarray(ffn_on_gpu, dtype=float) if moe else 1.0
    ops = costs.decode_layer_ops(model, mu, context, moe)
    ab = dtype_bytes(model.activation_dtype)
    kv_token = costs.kv_bytes_per_token(model)
    context = np.asarray(context, dtype=float)
    zero = np.zeros(np.broadcast(mu, context, attn).shape)
    ffn_rows = _expert_rows(model, mu) if moe else mu
    ffn_op = ops.ffn
    if moe and engine.moe_reads_all_experts:
        # the fused kernel walks every resident expert of the layer for each micro-batch
        ffn_op = replace(ffn_op, weight_bytes=costs.layer_expert_bytes(model) + 0 * mu, kv_bytes=0.0)
    h2d, d2h = link_bytes_s(rates, engine, "h2d"), link_bytes_s(rates, engine, "d2h")
    # the host KV cache's memory sets the path of its prefetch too (pageable: driver-staged)
    kv_read = kv_load_s(rates, engine, engine.decode.kv_cache, attn * mu * costs.attended_context(model, context)
                        * kv_token)
    qkv_bytes = (1 - attn) * mu * costs.qkv_width(model) * ab
    hidden_bytes = (1 - attn) * mu * model.attn_out_dim * ab
    ffn_bytes = (1 - ffn) * mu * model.hidden_size * ab
    kv_new = kv_cache_s(rates, engine, engine.decode.kv_cache, attn * mu * kv_token)
    # experts not kept on the GPU: streamed to it, or (offloaded_experts: cpu) computed on the CPU
    on_cpu = offloaded_experts_on_cpu(engine, engine.decode, mu) * ffn if moe else zero
    crossing = (1 - on_cpu) * crossing_layer_bytes(model, engine, engine.decode, mu, moe, ffn)
    weights = weight_transfer_s(rates, engine, engine.decode.weight_path, crossing)
    reduce = allreduce_s(model, rates, engine, mu)
    gpu_experts_s = gpu_time_s(ffn_op, rates, ffn_rows, engine, kernel=moe)  # a dense layer: its MLP
    misses = cache_miss_pieces(model, engine.decode, mu, seconds_per_miss(model, rates, engine, engine.decode, mu,
                                                                          gpu_experts_s), zero) if moe else ()
    cpu_experts_s = cpu_time_s(ops.ffn, rates, ffn_rows, engine, model)
    hidden_each_way = mu * model.hidden_size * ab  # to CPU experts and back

    def task(name, resource, kind, per_mb=0.0, per_mb_kv=0.0, weights=0.0, pieces=()):
        return DecodeTask(name, resource, kind, Lane(name, per_mb + zero, per_mb_kv + zero, weights + zero,
                                                     pieces=pieces))

    tasks = [
        task("PreAttn", "gpu", "pre_attn", gpu_time_s(ops.pre_attn, rates, mu, engine)),
        task("GPUAttn", "gpu", "attention", attn * gpu_time_s(ops.attention, rates, attention_rows(model), engine)),
        # (the offloaded share of the layers runs its experts on the CPU under offloaded_experts: cpu)
        task("PostAttn", "gpu", "post_attn", gpu_time_s(ops.post_attn, rates, mu, engine) + reduce.get("gpu", 0.0)
             + ffn * gpu_experts_s, weights=-on_cpu * gpu_experts_s),
        task("CPUAttn", "cpu", "attention", (1 - attn) * cpu_time_s(ops.attention, rates, attention_rows(model), engine)),
        task("CPUExperts", "cpu", "experts", (1 - ffn) * cpu_experts_s, weights=on_cpu * cpu_experts_s),
        # D1 QKV to the CPU; hidden states to CPU experts
        task("QKV→CPU", "d2h", "qkv", qkv_bytes / d2h),
        task("FFN→CPU", "d2h", "hidden", ffn_bytes / d2h, weights=on_cpu * hidden_each_way / d2h),
        # the new token's K/V written back to the CPU-resident cache after GPU attention
        task("KV→CPU", "d2h", "kv", per_mb_kv=kv_new["d2h"]),
        # D2 hidden back after CPU attention; expert outputs back when experts run on the CPU
        task("Hidden→GPU", "h2d", "hidden", hidden_bytes / h2d),
        task("FFN→GPU", "h2d", "hidden", ffn_bytes / h2d, weights=on_cpu * hidden_each_way / h2d),
        # D4: the CPU-resident part of the cache moves to the GPU for GPU attention
        task("KV→GPU", "h2d", "kv", per_mb_kv=kv_read["h2d"]),
        # D3: the offloaded weights of the next layer, in n pages (cached: the misses of the micro-batch)
        task("W", "h2d", "weights", weights=weights["h2d"], pieces=misses),
    ]
    if engine.prefetch_bucket_hidden_sq is not None:
        # beyond the prefetch bucket the GPU waits for its weights: this bound's other part is
        # the GPU chain (:func:`decode_resources`)
        tasks.append(task("W on demand", "gpu+weights", "weights",
                          weights=on_demand_weights_share(model, engine, crossing) * weights["h2d"]))
    if "cpu" in weights:  # the CPU side of a pageable weight path
        tasks.append(task("StageW", "cpu", "weights", weights=weights["cpu"]))
    if "copy" in weights:
        tasks.append(task("CopyTeam", "copy", "weights", weights=weights["copy"]))
    if "d2h" in reduce:  # all-reduce through host memory
        tasks += [task("AllReduce→CPU", "d2h", "allreduce", reduce["d2h"]),
                  task("AllReduce→GPU", "h2d", "allreduce", reduce["h2d"])]
    if engine.host_dram:
        dram = dram_bytes_s(rates)
        cpu_reads = (1 - attn) * ops.attention.bytes + (1 - ffn) * ops.ffn.bytes
        dma = qkv_bytes + hidden_bytes + 2 * ffn_bytes
        offloaded_cpu = on_cpu * (ops.ffn.bytes + 2 * hidden_each_way) / dram
        tasks.append(task("HostDRAM", "dram", "dram", (cpu_reads + dma) / dram + reduce.get("dram", 0.0),
                          kv_new["dram"] + kv_read["dram"], weights["dram"] + offloaded_cpu))
    return tasks


#: resources that run tasks (each a queue); ``copy`` and ``dram`` are capacity bounds
RESOURCES = ("gpu", "cpu", "h2d", "d2h")
BOUNDS = ("copy", "dram", "gpu+weights")


def launch_overhead_s(model: ModelSpec, rates: Rates, engine: Engine, tokens, moe: bool = True) -> dict[str, Lane]:
    """The engine's host operator calls (:mod:`hrm.machine.launches`) in one layer of micro-batches of
    ``tokens`` tokens, as lanes: ``host`` — the host thread issuing its kernels and copies
    (a lane of its own: the GPU runs them asynchronously, so the layer takes at least the
    issue time); ``gpu`` — the GPU's idle time after each host sync; ``cpu`` — the dispatch
    of ops on CPU tensors (paid by the thread that computes CPU attention). Per micro-batch,
    plus once per layer the weight fetches' copies and syncs. {} where not charged (a
    measured dispatch, a CPU-only host, an engine without counts)."""
    ops, op = engine.launches, rates.op_costs
    if not charged(ops, op):
        return {}
    experts = costs.expected_distinct_experts(model, tokens) if moe else 0.0 * np.asarray(tokens, dtype=float)
    return {"host": Lane("host", host_issue_s(ops, op, experts), 0.0, 0.0, layer_host_issue_s(ops, op)),
            "gpu": Lane("gpu", sync_bubbles_s(ops, op, experts), 0.0, 0.0, layer_sync_bubbles_s(ops, op)),
            "cpu": Lane("cpu", cpu_issue_s(ops, op) + 0.0 * experts)}


def with_launches(lanes: dict[str, Lane], launch: dict[str, Lane], zero) -> dict[str, Lane]:
    """``lanes`` with the launch overhead's lanes added (the host lane new, the others summed)."""
    out = dict(lanes)
    for name, lane in launch.items():
        lane = Lane(name, lane.per_micro_batch_s + zero, lane.per_micro_batch_kv_cpu_s + zero,
                    lane.per_layer_offloaded_weights_s + zero, lane.per_layer_s + zero)
        out[name] = _sum_lanes(name, [out[name], lane]) if name in out else lane
    return out


def decode_resources(model: ModelSpec, rates: Rates, micro_batch, context, attn_on_gpu, ffn_on_gpu,
                     moe: bool = True, engine: Engine = IDEAL) -> dict[str, Lane]:
    """GPU, CPU, H2D and D2H lanes of one decode layer (plus the engine's bounds): the sum
    of each resource's tasks (:func:`decode_tasks`) plus its dispatch α (arrays broadcast
    over μ, c, A_g, F_g)."""
    tasks = decode_tasks(model, rates, micro_batch, context, attn_on_gpu, ffn_on_gpu, moe, engine)
    names = list(RESOURCES) + [r for r in BOUNDS if any(t.resource == r for t in tasks)]
    lanes = {r: _sum_lanes(r, [t.lane for t in tasks if t.resource == r]) for r in names}
    if rates.gpu_dispatch is not None or rates.cpu_dispatch is not None:
        ffn = np.asarray(ffn_on_gpu, dtype=float) if moe else 1.0
        alpha = decode_dispatch(model, rates, np.asarray(micro_batch, dtype=float),
                                np.asarray(attn_on_gpu, dtype=float), ffn, moe)
        lanes = {r: _sum_lanes(r, [lane, Lane(r, *alpha[r])]) if r in alpha else lane for r, lane in lanes.items()}
    mu = np.asarray(micro_batch, dtype=float)
    lanes = with_launches(lanes, launch_overhead_s(model, rates, engine, mu, moe), 0.0 * lanes["gpu"].per_micro_batch_s)
    if "gpu+weights" in lanes:  # the GPU chain plus what it waits for (the on-demand weights)
        lanes["gpu+weights"] = _sum_lanes("gpu+weights", [lanes["gpu"], lanes["gpu+weights"]])
    return lanes


def step_sync_s(resources: dict[str, Lane], engine: Engine = IDEAL):
    """Per decode step, an engine that ends every step with host syncs (``sync: per-step``)
    drains its pipeline: the next step starts empty and waits one micro-batch's chain of
    tasks (the sum of its per-micro-batch task times) before the lanes overlap again."""
    if engine.sync != "per-step" or get_schedule(engine.schedule).lanes == "serial":
        return 0.0  # a serial schedule overlaps nothing, so a drained pipeline loses nothing
    return sum(resources[r].per_micro_batch_s for r in RESOURCES if r in resources)


def prefill_passes(engine: Engine, tokens):
    """Forward passes of one micro-batch's prefill of ``tokens`` prompt tokens: one, or
    ⌈tokens / prefill.max_tokens_per_pass⌉ under chunked prefill (each re-reads the layer's
    offloaded weights: vLLM's UVA reads happen inside every pass's kernels)."""
    cap = engine.prefill.max_tokens_per_pass
    tokens = np.asarray(tokens, dtype=float)
    return np.ones(tokens.shape) if cap is None else np.ceil(tokens / cap)


def prefill_resources(model: ModelSpec, rates: Rates, micro_batch, prompt_len, moe: bool = True,
                      engine: Engine = IDEAL, gen_len: int = 0) -> dict[str, Lane]:
    """Prefill of one layer, layer-major (every micro-batch of the layer, then the next
    layer): all computation on the GPU, the layer's offloaded weights loaded once on the
    engine's prefill weight path, the prompt's KV written back to the CPU (with the slots
    reserved for the ``gen_len`` tokens to come when the engine allocates them there), and
    the hidden states' round trip to pinned CPU memory when the engine parks them there.
    Under chunked prefill the offloaded weights cross once per pass (:func:`prefill_passes`).

    The weight load overlaps the layer as ``prefill.weights_overlap`` says: ``full`` — its
    own lane; ``last-micro-batch-moe`` — issued after the last micro-batch was queued, so
    the ``gpu+weights`` bound is n·(GPU per micro-batch) − (its MoE) + load; ``none`` —
    n·(GPU per micro-batch) + load. A pageable KV write-back blocks: it joins the GPU chain."""
    mu = np.asarray(micro_batch, dtype=float)
    tokens = mu * prompt_len
    ops = costs.prefill_layer_ops(model, mu, prompt_len, moe)
    rows = _expert_rows(model, tokens) if moe else tokens
    ab = dtype_bytes(model.activation_dtype)
    zero = np.zeros(mu.shape)
    reduce = allreduce_s(model, rates, engine, tokens)
    moe_s = gpu_time_s(ops.ffn, rates, rows, engine, kernel=moe)
    alpha = prefill_dispatch(model, rates, mu, prompt_len, moe)
    launch = launch_overhead_s(model, rates, engine, tokens, moe)
    bubbles = launch["gpu"] if launch else Lane("gpu")
    gpu = (gpu_time_s(ops.pre_attn, rates, tokens, engine)
           + gpu_time_s(ops.attention, rates, attention_rows(model, prompt_len), engine)
           + gpu_time_s(ops.post_attn, rates, tokens, engine) + moe_s + reduce.get("gpu", 0.0) + alpha["gpu"]
           + bubbles.per_micro_batch_s)
    kv_tokens = mu * (prompt_len + gen_len) if engine.prefill.kv_reserved_gen_slots else tokens
    kv = kv_cache_s(rates, engine, engine.prefill.kv_cache, kv_tokens * costs.kv_bytes_per_token(model))
    blocking = engine.prefill.kv_cache == "pageable"
    on_cpu = offloaded_experts_on_cpu(engine, engine.prefill, tokens) if moe else zero
    crossing = (1 - on_cpu) * crossing_layer_bytes(model, engine, engine.prefill, tokens, moe)
    weights = weight_transfer_s(rates, engine, engine.prefill.weight_path, prefill_passes(engine, tokens) * crossing)
    hidden = tokens * model.hidden_size * ab if engine.prefill.hidden_round_trip else 0.0
    h2d, d2h = link_bytes_s(rates, engine, "h2d"), link_bytes_s(rates, engine, "d2h")
    kv_chain = kv["d2h"] if blocking else 0.0
    cpu_hidden = on_cpu * tokens * model.hidden_size * ab  # each way, for the layers' CPU experts
    misses = cache_miss_pieces(model, engine.prefill, tokens, seconds_per_miss(model, rates, engine, engine.prefill,
                                                                               tokens, moe_s), zero) if moe else ()
    lanes = {
        "gpu": Lane("gpu", gpu + zero, kv_chain + zero, -on_cpu * moe_s + zero),
        "h2d": Lane("h2d", alpha["h2d"] + hidden / h2d + reduce.get("h2d", 0.0) + zero, zero,
                    weights["h2d"] + cpu_hidden / h2d + zero, pieces=misses),
        "d2h": Lane("d2h", alpha["d2h"] + hidden / d2h + reduce.get("d2h", 0.0) + zero,
                    (0.0 if blocking else kv["d2h"]) + zero, cpu_hidden / d2h + zero),
    }
    cpu_weights = weights.get("cpu", 0.0) + (on_cpu * cpu_time_s(ops.ffn, rates, rows, engine, model) if moe else 0.0)
    if "cpu" in weights or np.any(on_cpu):
        lanes["cpu"] = Lane("cpu", zero, zero, cpu_weights + zero)
    if "copy" in weights:
        lanes["copy"] = Lane("copy", zero, zero, weights["copy"] + zero)
    if engine.prefill.weights_overlap != "full":
        overlap = {"one-micro-batch": gpu, "last-micro-batch-moe": moe_s, "none": 0.0}[engine.prefill.weights_overlap]
        lanes["gpu+weights"] = Lane("gpu+weights", gpu + zero, kv_chain + zero, weights["h2d"] + zero, -overlap + zero)
    elif engine.prefetch_bucket_hidden_sq is not None:  # the GPU chain waits for what the bucket does not hold
        on_demand = on_demand_weights_share(model, engine, crossing) * weights["h2d"]
        lanes["gpu+weights"] = Lane("gpu+weights", gpu + zero, kv_chain + zero, on_demand + zero)
    if engine.host_dram:
        lanes["dram"] = Lane("dram", (2 * hidden / dram_bytes_s(rates) + reduce.get("dram", 0.0)) + zero,
                             kv["dram"] + zero, weights["dram"] + zero)
    # the GPU's sync bubbles are in its chain above (so in every bound built on it); the rest:
    # the host's issue lane, the CPU ops, the once-per-layer syncs
    for name in ("gpu", "gpu+weights"):
        if name in lanes and launch:
            lanes[name] = _sum_lanes(name, [lanes[name], Lane(name, per_layer_s=bubbles.per_layer_s + zero)])
    return with_launches(lanes, {k: lane for k, lane in launch.items() if k != "gpu"}, zero)


def prefill_dispatch(model: ModelSpec, rates: Rates, micro_batch, prompt_len, moe: bool = True) -> dict:
    """Per micro-batch α of a prefill layer: one device task (pre-attention, causal
    attention once per sequence, post-attention, the expert loop over μ·s tokens), the
    hidden states parked on the host and loaded back (a copy each way), the prompt's KV
    written to the host (K and V of each sequence: 2μ copies), one weight page."""
    g = rates.gpu_dispatch
    if g is None:
        return {"gpu": 0.0, "h2d": 0.0, "d2h": 0.0}
    mu = np.asarray(micro_batch, dtype=float)
    task, copy = _alpha(g, "task_s"), _alpha(g, "copy_s")
    ffn = experts_call_dispatch_s(model, g, mu * prompt_len) if moe else 0.0
    gpu = task + _alpha(g, "pre_attn_s") + mu * _alpha(g, "attention_s") + post_attn_dispatch_s(model, g, moe) + ffn
    h2d = task + copy + ((task + copy) if moe else 0.0)
    d2h = 2 * task + copy + 2 * mu * copy
    return {"gpu": gpu, "h2d": h2d, "d2h": d2h}


def schedule_lanes(resources: dict[str, Lane], schedule: str | Engine, shared_unit: bool,
                   phase: str = "decode") -> list[Lane]:
    """Combine resources into concurrently running lanes for ``schedule``
    (:mod:`hrm.engines.schedules`):

    - ``overlap``: every resource is its own lane (eq. 12: T = max(comm, T_cpu, T_gpu));
    - ``chain`` (decode): per micro-batch pre-attn → D1 → CPU attention → D2 → post-attn
      run back to back; only the weight transfer overlaps them (the H2D lane, and the CPU
      side of a pageable weight path); prefill runs on the GPU alone: ``overlap``;
    - ``serial``, or any schedule on a CPU-only host (one unit, one bus): one lane, the sum.

    Capacity bounds (the staging-copy team, host DRAM, prefill's weight-load chain) stay
    lanes of their own under every structure: they limit, they do not queue."""
    engine = schedule if isinstance(schedule, Engine) else IDEAL
    lanes = get_schedule(engine.schedule if isinstance(schedule, Engine) else schedule).lanes
    if lanes not in ("overlap", "chain", "serial"):
        # an expert-level schedule (Klotski) has no lanes: its layer time is a scheduled period
        raise ValueError(f"schedule {engine.schedule if isinstance(schedule, Engine) else schedule} has no lanes "
                         f"(its layer time comes from hrm.pipelines.expert_level_tasks)")
    tasks = {r: lane for r, lane in resources.items() if r in RESOURCES}
    bounds = [lane for r, lane in resources.items() if r not in RESOURCES]
    if lanes == "serial" or shared_unit:
        return _expanded([_sum_lanes("all", tasks.values()), *bounds])
    if lanes == "chain" and phase == "decode" and "cpu" in tasks:
        h2d, cpu = tasks["h2d"], tasks["cpu"]
        chain = _sum_lanes("chain", [tasks["gpu"], Lane("cpu", cpu.per_micro_batch_s, cpu.per_micro_batch_kv_cpu_s),
                                     tasks["d2h"], Lane("h2d", h2d.per_micro_batch_s, h2d.per_micro_batch_kv_cpu_s)])
        staged = [Lane("cpu", 0.0, 0.0, cpu.per_layer_offloaded_weights_s)] \
            if np.any(np.asarray(cpu.per_layer_offloaded_weights_s) != 0) else []
        combined = [chain, h2d, *staged]
    else:
        combined = list(tasks.values())
    if engine.sync == "per-micro-batch" and phase == "decode" and "h2d" in tasks:
        combined += micro_batch_sync_lanes(combined, tasks["h2d"].per_layer_offloaded_weights_s)
    return _expanded([*combined, *bounds])


def _expanded(lanes: list[Lane]) -> list[Lane]:
    """Affine lanes only (:meth:`Lane.expanded`): what eq. 12's max and the solver take."""
    return [piece for lane in lanes for piece in lane.expanded()]


def micro_batch_sync_lanes(lanes: list[Lane], weights_s) -> list[Lane]:
    """An engine that syncs after every (layer, micro-batch) slot issues the next layer's
    weight load in the first slot (FlexGen: ``load_weight`` copies when k == 0), so the load
    overlaps one micro-batch's tasks only: the layer takes at least, for every lane ℓ,
    (n − 1)·(ℓ's work per micro-batch) + the load. Affine: n·a + n(1−r_c)·b + (1−r_w)·W − a
    (one micro-batch's KV part is kept in, a slight over-count that keeps the form affine)."""
    return [Lane(f"{lane.name}+weights", lane.per_micro_batch_s, lane.per_micro_batch_kv_cpu_s, weights_s,
                 -np.asarray(lane.per_micro_batch_s)) for lane in lanes
            if not np.any(np.asarray(lane.per_layer_offloaded_weights_s) != 0)]


def disk_spill_lane(cpu_form, cpu_limit_bytes, micro_batch) -> Lane:
    """The spill E = host need − usable host bytes (:func:`hrm.cost.memory.disk_spill_bytes`
    before its max with 0) as a :class:`Lane` in *bytes*: the host form
    c + s·N + w·r_w + k·(r_c·N) (:class:`hrm.cost.memory.MemoryForm`) with N = μ·n, r_c·N =
    μ·n − μ·n·(1 − r_c) and r_w = 1 − (1 − r_w) is
    n·μ(s + k) − n(1 − r_c)·μk − (1 − r_w)·w + (c + w − limit)."""
    mu = np.asarray(micro_batch, dtype=float)
    s, k, w = cpu_form.per_sequence, cpu_form.per_gpu_kv_sequence, cpu_form.per_weights_ratio
    return Lane("spill", mu * (s + k), -mu * k, -w + 0 * mu, cpu_form.const + w - cpu_limit_bytes + 0 * mu)


def _scaled(lane: Lane, factor: float, name: str) -> Lane:
    return Lane(name, lane.per_micro_batch_s * factor, lane.per_micro_batch_kv_cpu_s * factor,
                lane.per_layer_offloaded_weights_s * factor, lane.per_layer_s * factor)


def disk_lanes(spill: Lane, num_layers: int, rates: Rates, engine: Engine, resources: dict[str, Lane]) -> list[Lane]:
    """Lanes of the weights beyond host memory (``memory.disk_weights``): each pass of a
    layer reads its share E / L of the spill from disk (the ``disk`` lane, E / (L · disk read
    rate)), concurrent with the rest of the layer (the read of layer i + 1 overlaps layer
    i, as the host-to-GPU copy does). Under ``host_dram`` the read also writes E / L bytes
    into host DRAM (``dram+disk``: the DRAM lane plus that write; its later DMA read is the
    weight path's). Both are affine (``spill`` from :func:`disk_spill_lane`); their max with
    the lanes without disk is the max with E = 0, so the spill's own max with 0 is free."""
    per_layer = 1.0 / num_layers
    lanes = [_scaled(spill, per_layer / rates.disk_read_bytes_s, "disk")]
    if engine.host_dram and "dram" in resources:
        lanes.append(_sum_lanes("dram+disk", [resources["dram"], _scaled(spill, per_layer / dram_bytes_s(rates), "")]))
    return lanes


def lanes_time_s(lanes: list[Lane], num_micro_batches, weights_gpu_ratio, kv_gpu_ratio):
    """Layer time = max over lanes (eq. 12)."""
    times = [lane.time_s(num_micro_batches, weights_gpu_ratio, kv_gpu_ratio) for lane in lanes]
    return np.max(np.broadcast_arrays(*times), axis=0)  # a lane without a step axis (disk) broadcasts


def lm_head_time_s(model: ModelSpec, rates: Rates, micro_batch):
    """Embedding + final norm + lm_head for one micro-batch on the device tier (static weights),
    plus its dispatch: the head task and, where all lanes share one unit, the copy of the
    tokens to the host (on a GPU host that copy overlaps the next micro-batch)."""
    g = rates.gpu_dispatch
    alpha = _alpha(g, "task_s") + _alpha(g, "head_s")
    if rates.shared_unit:
        alpha += _alpha(g, "task_s") + _alpha(g, "copy_s")
    return gpu_time_s(costs.lm_head(model, micro_batch), rates, micro_batch) + alpha


def layer_kinds(model: ModelSpec) -> list[tuple[bool, int]]:
    """(is_moe, number of layers) for the model's layer kinds."""
    kinds = [(True, model.num_moe_layers)]
    if model.first_dense_layers:
        kinds.append((False, model.first_dense_layers))
    return kinds

