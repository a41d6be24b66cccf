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
operator call (:class:`hrm.hardware.Dispatch`: kernel launches and stream syncs on a GPU,
Python/torch dispatch on an emulated tier). Each lane then also pays, per micro-batch, the
α of the tasks the schedule puts on it (:func:`decode_dispatch`) — still affine, so the
solver carries it through the same coefficients. Without it (datasheet profiles) every
α is 0 and the lanes are the plain roofline of eq. 14.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import costs
from .costs import OpCost
from .model import ModelSpec
from .rates import Rates
from .units import dtype_bytes

SCHEDULES = ("cgopipe", "flexgen", "flexgen-cpu-attn", "sequential")
SCHEDULE_HELP = {
    "cgopipe": "MoE-Lightning CGOPipe: GPU, CPU, H2D and D2H overlap, weights paged (eq. 12)",
    "flexgen": "FlexGen S4: attention on GPU, KV cache prefetched over the link with the weights",
    "flexgen-cpu-attn": "FlexGen S3: CPU attention not overlapped with GPU work; weights overlap",
    "sequential": "no overlap: every task of every resource back to back",
}


@dataclass(frozen=True)
class Lane:
    """time = n·per_micro_batch_s + n·(1−r_c)·per_micro_batch_kv_cpu_s + (1−r_w)·per_layer_offloaded_weights_s"""

    name: str
    per_micro_batch_s: np.ndarray | float = 0.0
    per_micro_batch_kv_cpu_s: np.ndarray | float = 0.0
    per_layer_offloaded_weights_s: np.ndarray | float = 0.0

    def time_s(self, num_micro_batches, weights_gpu_ratio, kv_gpu_ratio):
        n = np.asarray(num_micro_batches, dtype=float)
        return (
            n * self.per_micro_batch_s
            + n * (1.0 - np.asarray(kv_gpu_ratio, dtype=float)) * self.per_micro_batch_kv_cpu_s
            + (1.0 - np.asarray(weights_gpu_ratio, dtype=float)) * self.per_layer_offloaded_weights_s
        )

    def __add__(self, other: "Lane") -> "Lane":
        return Lane(
            f"{self.name}+{other.name}",
            self.per_micro_batch_s + other.per_micro_batch_s,
            self.per_micro_batch_kv_cpu_s + other.per_micro_batch_kv_cpu_s,
            self.per_layer_offloaded_weights_s + other.per_layer_offloaded_weights_s,
        )


def _sum_lanes(name: str, lanes) -> Lane:
    total = Lane(name)
    for lane in lanes:
        total = total + lane
    return Lane(name, total.per_micro_batch_s, total.per_micro_batch_kv_cpu_s, total.per_layer_offloaded_weights_s)


def op_time_s(op: OpCost, flops_per_s, bytes_per_s):
    """Eq. 14 / eq. 8: a task is bound by its compute or its memory roof."""
    return np.maximum(op.flops / flops_per_s, op.bytes / bytes_per_s)


def gpu_time_s(op: OpCost, rates: Rates, matmul_rows=None):
    return op_time_s(op, rates.gpu_flops(matmul_rows), rates.gpu_bandwidth_bytes_s)


def cpu_time_s(op: OpCost, rates: Rates, matmul_rows=None):
    return op_time_s(op, rates.cpu_flops(matmul_rows), rates.cpu_bandwidth_bytes_s)


def allreduce_time_s(model: ModelSpec, rates: Rates, tokens):
    """Tensor parallelism: two ring all-reduces of the hidden states per layer (after the
    attention output projection and after the FFN), 2(p−1)/p of the bytes each over the
    GPU-to-GPU link. The paper leaves this traffic out; we charge it to the GPU lane."""
    p = rates.gpu_count
    if p <= 1 or not rates.g2g_bytes_s:
        return 0.0
    payload = np.asarray(tokens, dtype=float) * model.hidden_size * dtype_bytes(model.activation_dtype)
    return 2 * 2 * (p - 1) / p * payload / rates.g2g_bytes_s


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
    resource's affine time. ``kind`` groups tasks for pictures (:mod:`hrm.timeline`)."""

    name: str
    resource: str
    kind: str
    lane: Lane


def decode_tasks(model: ModelSpec, rates: Rates, micro_batch, context, attn_on_gpu, ffn_on_gpu,
                 moe: bool = True) -> list[DecodeTask]:
    """The tasks of one micro-batch in a decode layer with their time coefficients (arrays
    broadcast over μ, c, A_g, F_g; a task absent under a placement costs 0). Dispatch α
    (:func:`decode_dispatch`) is per lane and added by :func:`decode_resources`."""
    mu = np.asarray(micro_batch, dtype=float)
    attn = np.asarray(attn_on_gpu, dtype=float)
    ffn = np.asarray(ffn_on_gpu, dtype=float) if moe else 1.0
    ops = costs.decode_layer_ops(model, mu, context, moe)
    ab = dtype_bytes(model.activation_dtype)
    kv_token = costs.kv_bytes_per_token(model)
    context = np.asarray(context, dtype=float)
    zero = np.zeros(np.broadcast(mu, context, attn).shape)
    ffn_rows = _expert_rows(model, mu) if moe else mu

    def task(name, resource, kind, per_mb=0.0, per_mb_kv=0.0, weights=0.0):
        return DecodeTask(name, resource, kind, Lane(name, per_mb + zero, per_mb_kv + zero, weights + zero))

    return [
        task("PreAttn", "gpu", "pre_attn", gpu_time_s(ops.pre_attn, rates, mu)),
        task("GPUAttn", "gpu", "attention", attn * gpu_time_s(ops.attention, rates, attention_rows(model))),
        task("PostAttn", "gpu", "post_attn", gpu_time_s(ops.post_attn, rates, mu) + allreduce_time_s(model, rates, mu)
             + ffn * gpu_time_s(ops.ffn, rates, ffn_rows)),
        task("CPUAttn", "cpu", "attention", (1 - attn) * cpu_time_s(ops.attention, rates, attention_rows(model))),
        task("CPUExperts", "cpu", "experts", (1 - ffn) * cpu_time_s(ops.ffn, rates, ffn_rows)),
        # D1 QKV to the CPU; hidden states to CPU experts
        task("QKV→CPU", "d2h", "qkv", (1 - attn) * mu * costs.qkv_width(model) * ab / rates.d2h_bytes_s),
        task("FFN→CPU", "d2h", "hidden", (1 - ffn) * mu * model.hidden_size * ab / rates.d2h_bytes_s),
        # the new token's K/V written back to the CPU-resident cache after GPU attention
        task("KV→CPU", "d2h", "kv", per_mb_kv=attn * mu * kv_token / rates.d2h_bytes_s),
        # D2 hidden back after CPU attention; expert outputs back when experts run on the CPU
        task("Hidden→GPU", "h2d", "hidden", (1 - attn) * mu * model.attn_out_dim * ab / rates.h2d_bytes_s),
        task("FFN→GPU", "h2d", "hidden", (1 - ffn) * mu * model.hidden_size * ab / rates.h2d_bytes_s),
        # D4: the CPU-resident part of the cache moves to the GPU for GPU attention
        task("KV→GPU", "h2d", "kv", per_mb_kv=attn * mu * context * kv_token / rates.h2d_bytes_s),
        # D3: the offloaded expert weights of the next layer, in n pages
        task("W", "h2d", "weights", weights=ffn * costs.layer_expert_bytes(model) / rates.h2d_bytes_s if moe else 0.0),
    ]


RESOURCES = ("gpu", "cpu", "h2d", "d2h")


def decode_resources(model: ModelSpec, rates: Rates, micro_batch, context, attn_on_gpu, ffn_on_gpu,
                     moe: bool = True) -> dict[str, Lane]:
    """GPU, CPU, H2D and D2H lanes of one decode layer: the sum of each resource's tasks
    (:func:`decode_tasks`) plus its dispatch α (arrays broadcast over μ, c, A_g, F_g)."""
    tasks = decode_tasks(model, rates, micro_batch, context, attn_on_gpu, ffn_on_gpu, moe)
    lanes = {r: _sum_lanes(r, [t.lane for t in tasks if t.resource == r]) for r in RESOURCES}
    if rates.gpu_dispatch is not None or rates.cpu_dispatch is not None:
        ffn = np.asarray(ffn_on_gpu, dtype=float) if moe else 1.0
        alpha = decode_dispatch(model, rates, np.asarray(micro_batch, dtype=float),
                                np.asarray(attn_on_gpu, dtype=float), ffn, moe)
        lanes = {r: _sum_lanes(r, [lane, Lane(r, *alpha[r])]) for r, lane in lanes.items()}
    return lanes


def prefill_resources(model: ModelSpec, rates: Rates, micro_batch, prompt_len, moe: bool = True) -> dict[str, Lane]:
    """Prefill of one layer (paper §4: all computation on GPU, KV offloaded to the CPU)."""
    mu = np.asarray(micro_batch, dtype=float)
    tokens = mu * prompt_len
    ops = costs.prefill_layer_ops(model, mu, prompt_len, moe)
    rows = _expert_rows(model, tokens) if moe else tokens
    gpu = (gpu_time_s(ops.pre_attn, rates, tokens) + gpu_time_s(ops.attention, rates, attention_rows(model, prompt_len))
           + gpu_time_s(ops.post_attn, rates, tokens) + gpu_time_s(ops.ffn, rates, rows)
           + allreduce_time_s(model, rates, tokens))
    kv_offload = tokens * costs.kv_bytes_per_token(model) / rates.d2h_bytes_s
    weights = costs.layer_expert_bytes(model) / rates.h2d_bytes_s if moe else 0.0
    zero = np.zeros(mu.shape)
    alpha = prefill_dispatch(model, rates, mu, prompt_len, moe)
    return {
        "gpu": Lane("gpu", gpu + alpha["gpu"] + zero),
        "h2d": Lane("h2d", alpha["h2d"] + zero, zero, weights + zero),
        "d2h": Lane("d2h", alpha["d2h"] + zero, kv_offload + zero),
    }


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


def schedule_lanes(resources: dict[str, Lane], schedule: str, shared_unit: bool) -> list[Lane]:
    """Combine resources into concurrently running lanes for ``schedule``.

    - cgopipe / flexgen: every resource is its own lane (eq. 12: T = max(comm, T_cpu, T_gpu));
    - flexgen-cpu-attn (S3): per micro-batch pre-attn → D1 → CPU attention → D2 → post-attn
      run back to back; only the weight transfer overlaps them (on the H2D lane);
    - sequential, or any schedule on a CPU-only host (one unit, one bus): one lane, the sum.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule}")
    if schedule == "sequential" or shared_unit:
        return [_sum_lanes("all", resources.values())]
    if schedule == "flexgen-cpu-attn" and "cpu" in resources:
        h2d = resources["h2d"]
        chain = _sum_lanes("chain", [resources["gpu"], resources["cpu"], resources["d2h"],
                                     Lane("h2d", h2d.per_micro_batch_s, h2d.per_micro_batch_kv_cpu_s)])
        return [chain, h2d]
    return list(resources.values())


def lanes_time_s(lanes: list[Lane], num_micro_batches, weights_gpu_ratio, kv_gpu_ratio):
    """Layer time = max over lanes (eq. 12)."""
    return np.max([lane.time_s(num_micro_batches, weights_gpu_ratio, kv_gpu_ratio) for lane in lanes], axis=0)


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


def decode_contexts(prompt_len: int, gen_len: int) -> np.ndarray:
    """Cached tokens before each decode step: the prompt plus the tokens generated so far.
    Prefill yields the first token; decode steps t = 1..gen−1 see s + t − 1 cached tokens."""
    return prompt_len + np.arange(gen_len - 1, dtype=float)
