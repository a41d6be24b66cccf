"""GPU and CPU peak memory (docs/model.md §4.5; paper appendix A.1) as affine forms.

For a fixed micro-batch size μ and placement (A_g, F_g), peak bytes are affine in the batch
size N, the static weight ratio r_w and the number of sequences whose KV stays on the GPU
(r_c·N):

    bytes = const + per_sequence·N + per_weights_ratio·r_w + per_gpu_kv_sequence·(r_c·N)

so the solver can use the very same coefficients as linear constraints. Headroom is an
explicit option (``ModelOptions.*_memory_utilization``), applied to the capacity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import costs
from ..engines.engine import IDEAL, Engine
from ..machine.hardware import HardwareProfile
from ..model.spec import ModelSpec
from ..model.options import DEFAULT_OPTIONS, ModelOptions
from ..units import dtype_bytes
from ..workload import Workload

FP32_BYTES = 4.0  # attention scores, logits and CPU expert intermediates are kept in fp32


@dataclass(frozen=True)
class MemoryForm:
    """bytes = const + per_sequence·N + per_weights_ratio·r_w + per_gpu_kv_sequence·(r_c·N)."""

    const: np.ndarray | float
    per_sequence: np.ndarray | float
    per_weights_ratio: np.ndarray | float
    per_gpu_kv_sequence: np.ndarray | float
    components: dict = field(default_factory=dict, compare=False)

    def bytes(self, batch_size, weights_gpu_ratio, kv_gpu_ratio):
        batch_size = np.asarray(batch_size, dtype=float)
        return (self.const + self.per_sequence * batch_size + self.per_weights_ratio * np.asarray(weights_gpu_ratio)
                + self.per_gpu_kv_sequence * batch_size * np.asarray(kv_gpu_ratio))


def kv_cache_bytes(model: ModelSpec, context_tokens) -> float:
    """KV cache of one sequence of ``context_tokens`` tokens, all layers (a sliding-window or chunked
    layer keeps at most its window: :func:`hrm.cost.costs.kept_context`)."""
    return float(costs.kept_context(model, context_tokens)) * costs.kv_bytes_per_token(model) * model.num_layers


def kv_bytes_per_sequence(model: ModelSpec, workload: Workload, engine: Engine = IDEAL) -> float:
    """KV cache of one sequence at the end of generation: :func:`kv_cache_bytes` of its longest
    context, rounded up to the engine's ``memory.kv_tokens_multiple`` (the cells it allocates a sequence)."""
    tokens, multiple = workload.max_context_len, engine.memory.kv_tokens_multiple
    return kv_cache_bytes(model, tokens if multiple == 1 else math.ceil(tokens / multiple) * multiple)


def prefill_tokens(workload: Workload, micro_batch, max_tokens_per_pass=None):
    """Tokens of one prefill pass: μ prompts of the effective length, and at least the
    longest prompt (Algorithm 2 balances tokens across micro-batches); at most
    ``max_tokens_per_pass`` under chunked prefill (``prefill.max_tokens_per_pass``)."""
    tokens = np.maximum(np.asarray(micro_batch, dtype=float) * workload.effective_prompt_len, workload.max_prompt_len)
    return tokens if max_tokens_per_pass is None else np.minimum(tokens, max_tokens_per_pass)


def gpu_workspace_bytes(model: ModelSpec, workload: Workload, micro_batch, attn_on_gpu, max_tokens_per_pass=None):
    """Activations of one micro-batch on the device tier, the larger of decode and prefill
    (one pass of at most ``max_tokens_per_pass`` tokens under chunked prefill)."""
    ab = dtype_bytes(model.activation_dtype)
    per_token = (2 * model.hidden_size + costs.qkv_width(model) + model.attn_out_dim
                 + model.top_k * 2 * model.expert_intermediate_size + 2 * model.shared_intermediate_size
                 + 2 * model.dense_intermediate_size) * ab
    mu = np.asarray(micro_batch, dtype=float)
    scores = np.asarray(attn_on_gpu, dtype=float) * mu * model.num_heads * workload.max_context_len * FP32_BYTES
    decode = mu * per_token + scores + mu * model.vocab_size * FP32_BYTES
    prefill = prefill_tokens(workload, mu, max_tokens_per_pass) * per_token + mu * model.vocab_size * FP32_BYTES
    return np.maximum(decode, prefill)


def offloadable_weight_bytes(model: ModelSpec, engine: Engine = IDEAL) -> tuple[float, float]:
    """(all layers, one MoE layer) of the weights r_w splits between the tiers: the routed
    experts, or with ``offloaded_weights: all`` every layer's weights (FlexGen ``--percent``)."""
    from .latency.offload import offloaded_layer_bytes

    layer = float(offloaded_layer_bytes(model, engine, True))
    total = model.num_moe_layers * layer + model.first_dense_layers * float(offloaded_layer_bytes(model, engine, False))
    return total, layer


def gpu_memory_form(model: ModelSpec, workload: Workload, micro_batch, attn_on_gpu, ffn_on_gpu,
                    engine: Engine = IDEAL) -> MemoryForm:
    """Device tier: weights that always stay on the GPU, r_w of the offloadable weights, the
    engine's weight buffer (``memory.gpu_weight_buffer_layers`` × the offloaded part of one
    layer; 2 = the double buffer) when experts run on the GPU, KV kept on the GPU, the
    hidden states of all N sequences, and one micro-batch's workspace."""
    ffn = np.asarray(ffn_on_gpu, dtype=float)
    total, layer = offloadable_weight_bytes(model, engine)
    static = costs.static_weight_bytes(model)
    if engine.offloaded_weights == "all":  # only the embeddings stay on the GPU for sure
        static = static + costs.total_expert_bytes(model) - total
    buffer = engine.memory.gpu_weight_buffer_layers * layer * ffn
    work = gpu_workspace_bytes(model, workload, micro_batch, attn_on_gpu, engine.prefill.max_tokens_per_pass)
    hidden = 2 * model.hidden_size * dtype_bytes(model.activation_dtype)
    return MemoryForm(
        const=static + buffer + work,
        per_sequence=hidden,
        per_weights_ratio=total - buffer,
        per_gpu_kv_sequence=kv_bytes_per_sequence(model, workload, engine),
        components={"static_weights": static, "expert_weights_at_rw1": total, "weight_buffer_at_rw0": buffer,
                    "workspace": work, "hidden_per_sequence": hidden,
                    "kv_per_sequence": kv_bytes_per_sequence(model, workload, engine)},
    )


def cpu_memory_form(model: ModelSpec, workload: Workload, micro_batch, attn_on_gpu, ffn_on_gpu,
                    engine: Engine = IDEAL) -> MemoryForm:
    """Host tier: offloaded weights (every expert when the engine's CPU tensor holds them
    all, ``memory.cpu_holds_all_experts``), the pinned staging buffer
    (``memory.pinned_staging_layers`` × the offloaded part of one layer), the KV cache of the
    CPU-resident sequences, QKV/hidden staging, and CPU attention/expert workspace."""
    ffn = np.asarray(ffn_on_gpu, dtype=float)
    attn = np.asarray(attn_on_gpu, dtype=float)
    mu = np.asarray(micro_batch, dtype=float)
    total, layer = offloadable_weight_bytes(model, engine)
    pinned = engine.memory.pinned_staging_layers * layer * ffn
    offloaded_per_rw = 0.0 if engine.memory.cpu_holds_all_experts else -total
    kv_seq = kv_bytes_per_sequence(model, workload, engine)
    staging = (costs.qkv_width(model) + model.hidden_size) * dtype_bytes(model.activation_dtype)
    work = ((1 - attn) * mu * model.num_heads * workload.max_context_len * FP32_BYTES
            + (1 - ffn) * mu * model.top_k * 2 * model.expert_intermediate_size * FP32_BYTES)
    return MemoryForm(
        const=total + pinned + work,
        per_sequence=kv_seq + staging,
        per_weights_ratio=offloaded_per_rw - pinned,
        per_gpu_kv_sequence=-kv_seq,
        components={"expert_weights_at_rw0": total, "pinned_buffer_at_rw0": pinned, "workspace": work,
                    "kv_per_sequence": kv_seq, "staging_per_sequence": staging},
    )


def spillable_weights_form(model: ModelSpec, engine: Engine = IDEAL) -> MemoryForm:
    """The offloaded weights the host tier holds (the ``expert_weights_at_rw0`` part of
    :func:`cpu_memory_form`: (1 − r_w) of the offloadable weights, or all of them when the
    engine's CPU tensor holds every expert): the only bytes that may spill to disk
    (``memory.disk_weights``; buffers, KV cache and workspaces stay in host memory)."""
    total, _ = offloadable_weight_bytes(model, engine)
    return MemoryForm(const=total, per_sequence=0.0,
                      per_weights_ratio=0.0 if engine.memory.cpu_holds_all_experts else -total,
                      per_gpu_kv_sequence=0.0)


def host_floor_form(cpu_form: MemoryForm, spillable: MemoryForm) -> MemoryForm:
    """The least host bytes a policy needs when every spillable weight is on disk: the
    host tier's form less :func:`spillable_weights_form`. With disk spill the host
    constraint is floor ≤ usable host bytes (spill ≤ the spillable weights), the form the
    search uses for the CPU tier (:func:`solver.lanes.terms.memory_terms`)."""
    return MemoryForm(const=cpu_form.const - spillable.const, per_sequence=cpu_form.per_sequence - spillable.per_sequence,
                      per_weights_ratio=cpu_form.per_weights_ratio - spillable.per_weights_ratio,
                      per_gpu_kv_sequence=cpu_form.per_gpu_kv_sequence - spillable.per_gpu_kv_sequence,
                      components=cpu_form.components)


def disk_spill_allowed(engine: Engine, disk_read_bytes_s: float | None, limits: "MemoryLimits") -> bool:
    """Whether weights may spill to disk: the engine keeps weights there
    (``memory.disk_weights``), the profile has a disk (``disk.read_gbps``; rates give None
    without one) and the host memory is the host's alone (on a CPU-only host the device
    tier shares it: not modelled, nothing spills)."""
    return engine.memory.disk_weights and disk_read_bytes_s is not None and not limits.shared


def disk_spill_bytes(cpu_bytes, spillable_bytes, cpu_limit_bytes):
    """The minimal spill (docs/model.md §4.9): E = max(0, host need − usable host bytes),
    at most the spillable weights (beyond them the policy does not fit at all). Disk only
    adds time, so no policy spills more than it must."""
    return np.clip(np.asarray(cpu_bytes, dtype=float) - cpu_limit_bytes, 0.0, spillable_bytes)


def fits(gpu_bytes: float, cpu_bytes: float, limits: "MemoryLimits") -> bool:
    """Whether peaks of ``gpu_bytes`` and ``cpu_bytes`` fit ``limits`` (one memory for both on
    a CPU-only host)."""
    if limits.shared:
        return gpu_bytes + cpu_bytes <= limits.cpu_bytes
    return gpu_bytes <= limits.gpu_bytes and cpu_bytes <= limits.cpu_bytes


def physical_limits(hw: HardwareProfile, engine: Engine = IDEAL, gpu_mem_gib: float | None = None,
                    cpu_mem_gib: float | None = None) -> MemoryLimits:
    """What a pinned policy may use: all of each memory (``--gpu-mem/--cpu-mem`` replace the
    capacities) less what the engine's process holds beside its tensors
    (``memory.gpu_reserved_gib`` per GPU, ``memory.host_reserved_gib``)."""
    from ..units import GIB

    whole = memory_limits(hw, ModelOptions(gpu_memory_utilization=1.0, cpu_memory_utilization=1.0),
                          gpu_mem_gib, cpu_mem_gib)
    gpus = hw.gpu.count if hw.gpu is not None else 0
    host = engine.memory.host_reserved_gib * GIB
    if whole.shared:
        return MemoryLimits(whole.gpu_bytes - host, whole.cpu_bytes - host, True)
    return MemoryLimits(whole.gpu_bytes - gpus * engine.memory.gpu_reserved_gib * GIB, whole.cpu_bytes - host, False)


@dataclass(frozen=True)
class MemoryLimits:
    """Usable bytes after headroom. ``shared``: a CPU-only host, both tiers in one memory."""

    gpu_bytes: float
    cpu_bytes: float
    shared: bool


def memory_limits(hw: HardwareProfile, options: ModelOptions = DEFAULT_OPTIONS,
                  gpu_mem_gib: float | None = None, cpu_mem_gib: float | None = None) -> MemoryLimits:
    """Capacities × utilisation; overrides (``--gpu-mem/--cpu-mem``, GiB in total) replace
    the profile's capacity. Tensor parallelism: GPU capacity scales with the GPU count.
    Overrides are checked against :mod:`hrm.bounds` (finite, plausible per GPU / per host)."""
    from .. import bounds
    from ..errors import HRMError
    from ..units import GIB

    if cpu_mem_gib is not None:
        cpu_mem_gib = bounds.CPU_MEMORY_GIB.check(cpu_mem_gib, "--cpu-mem")
    if gpu_mem_gib is not None:
        if hw.gpu is None:
            raise HRMError(f"--gpu-mem: profile '{hw.name}' has no GPU (its device tier shares the host memory: "
                           f"use --cpu-mem)")
        gpu_mem_gib = bounds.TOTAL_GPU_MEMORY_GIB.check(gpu_mem_gib, "--gpu-mem")
        bounds.GPU_MEMORY_GIB.check(gpu_mem_gib / hw.gpu.count, f"--gpu-mem over {hw.gpu.count} GPU(s)")
    cpu_cap = (cpu_mem_gib * GIB if cpu_mem_gib is not None else hw.cpu.memory_bytes) * options.cpu_memory_utilization
    if hw.gpu is None:
        return MemoryLimits(cpu_cap, cpu_cap, True)
    gpu_total = gpu_mem_gib * GIB if gpu_mem_gib is not None else hw.gpu.memory_bytes * hw.gpu.count
    return MemoryLimits(gpu_total * options.gpu_memory_utilization, cpu_cap, False)
