"""One operator's time on a tier (paper eq. 14, the roofline of eq. 8): max(FLOPs / FLOP/s,
bytes / bandwidth) at the tier's achieved rates, in the engine's MoE kernel or dequantizing
kernel family on the device tier, in ggml's measured kernels or a family's CPU fractions on
the CPU tier; the rows of attention's and an expert's matmuls; the lm_head of a micro-batch.
"""

from __future__ import annotations

import numpy as np

from .. import costs
from ..costs import OpCost
from ...engines.engine import IDEAL, Engine
from ...machine.launches import charged, step_host_s
from ...machine.rates import Rates
from ...model import quantized
from ...model.spec import ModelSpec
from .dispatch import dispatch_alpha_s


def op_time_s(op: OpCost, flops_per_s, bytes_per_s):
    """Eq. 14 / eq. 8: a task is bound by its compute or its memory roof."""
    return np.maximum(op.flops / flops_per_s, op.bytes / bytes_per_s)


def gpu_rate_factors(rates: Rates, engine: Engine = IDEAL) -> tuple[float, float]:
    """(FLOP/s factor, bandwidth factor) of the device tier under ``engine``: with
    ``achieved_gpu_rates`` GEMMs run at the GPU's achieved fraction of tensor peak (unless
    a measured FLOP/s-vs-M curve already is achieved) and memory at its streaming
    efficiency. The emulated tier of a CPU-only host is measured as it runs: factors 1."""
    ach = rates.achieved
    if ach is None or rates.shared_unit:
        return 1.0, 1.0
    flops, bandwidth = 1.0, 1.0
    if engine.achieved_gpu_rates:
        bandwidth = ach.gpu_memory_stream_efficiency
        flops = 1.0 if rates.gpu_matmul_curve else ach.gpu_gemm_efficiency
    return flops, bandwidth


def kernel_flops_per_s(rates: Rates, engine: Engine, matmul_rows=None):
    """The FLOP rate of a GEMM in the engine's MoE kernel at ``matmul_rows`` rows: the GEMM's
    own rate at those rows, under the kernel's compute ceiling, its measured fraction of the
    GPU's peak (:meth:`hrm.engines.engine.Kernel.factor`; the fractions are measured where the
    GEMM is compute-bound, M = 4096 and up, so at small M, where a GEMM is bound by its weight
    reads, the ceiling does not bind); the emulated tier of a CPU-only host is measured as it
    runs."""
    rate = rates.gpu_flops(matmul_rows)
    ach = rates.achieved
    if ach is None or rates.shared_unit:
        return rate
    return np.minimum(rate, rates.gpu_flops(None) * engine.kernel.factor(ach.architecture))


def gpu_time_s(op: OpCost, rates: Rates, matmul_rows=None, engine: Engine = IDEAL, kernel: bool = False):
    """``op`` on the device tier; ``kernel``: it runs in the engine's MoE kernel, whose
    compute ceiling (:func:`kernel_flops_per_s`) and time factor at ``matmul_rows`` tokens per
    expert (:func:`kernel_slowdown`) apply.

    An op on quantized weights (``op.quantized``) under an engine that names a dequantizing
    kernel family (``engine.quant_kernel``) runs in that family instead
    (:func:`quantized_gpu_time_s`): its fractions are measured against the fp16 GEMM, so they
    replace the fp16 MoE kernel's (``kernel``'s factor and slowdown are not applied on top)."""
    if quant_family(op, rates, engine) is not None:
        return quantized_gpu_time_s(op, rates, matmul_rows, engine)
    flops, bandwidth = gpu_rate_factors(rates, engine)
    rate = kernel_flops_per_s(rates, engine, matmul_rows) if kernel else rates.gpu_flops(matmul_rows)
    seconds = op_time_s(op, rate * flops, rates.gpu_bandwidth_bytes_s * bandwidth)
    return seconds * kernel_slowdown(rates, engine, matmul_rows) if kernel else seconds


def quantized_gpu_time_s(op: OpCost, rates: Rates, matmul_rows, engine: Engine):
    """``op`` (quantized weights) in the engine's dequantizing kernel family
    (:mod:`hrm.model.quantized`): eq. 14's roofline at the fp16 path's FLOP rate at
    ``matmul_rows`` and memory rate (the engine's achieved-rate factors, no MoE-kernel
    factor) times the family's compute and bandwidth fractions on the GPU's architecture
    (``default`` on a datasheet profile without one)."""
    flops, bandwidth = gpu_rate_factors(rates, engine)
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
    from ..ggml_cpu import HOST_BUFFER, ggml_type_of, nearest_threads, seconds_per_element

    threads = nearest_threads(rates.ggml_cpu, engine.cpu_threads or rates.cpu_threads)
    kind = ggml_type_of(model)
    elements = np.asarray(op.weight_bytes, dtype=float) / costs.weight_bytes_per_param(model)
    rows = np.broadcast_to(np.asarray(1.0 if matmul_rows is None else matmul_rows, dtype=float), elements.shape)
    # beside a GPU the experts sit in its pinned host buffer: ggml's plain kernels, where measured
    per = np.vectorize(lambda r: seconds_per_element(rates.ggml_cpu, kind, "mmid", threads, float(r),
                                                     buffer=HOST_BUFFER))(rows)
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


def attention_rows(model: ModelSpec, query_tokens=1):
    """Rows M of attention's matmuls: QK^T and PV run per (sequence, KV head) as an
    (M × d) @ (d × c) product over the cached tokens, with the query heads that share the KV
    head stacked — nq/nkv of them (GQA; MLA: all heads share the latent) — times the query
    tokens. With a measured FLOP/s-vs-M curve, decode attention is then charged at the
    efficiency of an M-row matmul streaming its operand (the KV cache) once, like a weight;
    without a curve (datasheet profiles) at the peak, as before."""
    group = model.num_heads if model.is_mla else model.num_heads // model.num_kv_heads
    return group * np.asarray(query_tokens, dtype=float)


def expert_rows(model: ModelSpec, tokens):
    """Rows of one expert's matmul: tokens·k spread over the distinct experts touched."""
    return np.asarray(tokens, dtype=float) * model.top_k / costs.expected_distinct_experts(model, tokens)


def lm_head_time_s(model: ModelSpec, rates: Rates, micro_batch, engine: Engine = IDEAL):
    """Embedding + final norm + lm_head for one micro-batch on the device tier (static weights),
    plus its dispatch: the head task and, where all lanes share one unit, the copy of the
    tokens to the host (on a GPU host that copy overlaps the next micro-batch); plus the
    engine's counted host work outside the layers (:func:`hrm.machine.launches.step_host_s`:
    its syncs end the step's slots, so the host's time adds to the GPU's)."""
    g = rates.gpu_dispatch
    alpha = dispatch_alpha_s(g, "task_s") + dispatch_alpha_s(g, "head_s")
    if rates.shared_unit:
        alpha += dispatch_alpha_s(g, "task_s") + dispatch_alpha_s(g, "copy_s")
    if charged(engine.launches, rates.op_costs):
        alpha += step_host_s(engine.launches, rates.op_costs)
    return gpu_time_s(costs.lm_head(model, micro_batch), rates, micro_batch) + alpha
