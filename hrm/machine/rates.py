"""Achieved rates of a machine's resources (SI), from a hardware profile.

Tiers: ``gpu`` (all GPUs of a tensor-parallel group together; one GPU where the engine splits
the layers between GPUs that run in turn) and ``cpu``; links
``h2d`` (CPU→GPU) and ``d2h`` (GPU→CPU), one per GPU; ``g2g`` for all-reduce. On a
CPU-only host the device tier is the CPU itself (``shared_unit``): the latency model then
adds, rather than overlaps, the work of all resources.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from .achieved import Achieved, achieved_rates
from .launches import EAGER_CPU_OP_S, EAGER_GPU_OP_S, SYNC_BUBBLE_S, OpCosts
from .hardware import CurvePoint, Dispatch, GgmlCpu, HardwareProfile, interpolate_curve
from ..model.options import DEFAULT_OPTIONS, ModelOptions
from ..units import GB, TFLOPS


@dataclass(frozen=True)
class Rates:
    gpu_peak_flops: float
    gpu_bandwidth_bytes_s: float
    cpu_peak_flops: float
    cpu_bandwidth_bytes_s: float
    h2d_bytes_s: float
    d2h_bytes_s: float
    gpu_count: int
    g2g_bytes_s: Optional[float]
    shared_unit: bool
    gpu_matmul_curve: tuple[CurvePoint, ...] = ()
    cpu_matmul_curve: tuple[CurvePoint, ...] = ()
    # fixed cost per invocation (α of the α-β model) of the device tier's and the CPU's
    # tasks; None = 0 (datasheet profiles, or ModelOptions.use_dispatch_overhead off)
    gpu_dispatch: Optional[Dispatch] = None
    cpu_dispatch: Optional[Dispatch] = None
    # achieved rates beside the peaks (engines use them; the ideal engine does not)
    achieved: Optional[Achieved] = None
    # seconds per host operator call an engine's launch counts are charged at (hrm.machine.launches):
    # a GPU host whose profile has no measured dispatch; None otherwise
    op_costs: Optional[OpCosts] = None
    # sequential read rate of the disk that weights beyond host memory stream from
    # (profile ``disk.read_gbps``); None: no disk section (nothing spills), or a CPU-only host
    disk_read_bytes_s: Optional[float] = None
    # llama.cpp's CPU kernels as the profile measured them (hrm.cost.ggml_cpu), and the threads a
    # llama.cpp process runs them on by default (common/common.cpp:144-145: the cores, halved
    # above 4); None: not measured (the CPU roofline)
    ggml_cpu: Optional[GgmlCpu] = None
    cpu_threads: int = 1
    # GPUs that split the layers between them and run one after another (an engine's
    # ``gpu_split: layers``); the device tier's and the links' rates are then one GPU's
    layer_split_gpus: int = 1

    def gpu_flops(self, matmul_rows=None):
        """Achieved FLOP/s of the device tier for matmuls with ``matmul_rows`` rows (M)."""
        return _achieved(self.gpu_peak_flops, self.gpu_matmul_curve, matmul_rows, self.gpu_count)

    def cpu_flops(self, matmul_rows=None):
        return _achieved(self.cpu_peak_flops, self.cpu_matmul_curve, matmul_rows, 1)


def _achieved(peak: float, curve, rows, scale: int):
    if rows is None or not curve:
        return peak
    return np.minimum(peak, interpolate_curve(list(curve), np.maximum(rows, 1.0)) * TFLOPS * scale)


def _curve(curves: dict, flops, dtype: str) -> tuple:
    """The efficiency curve of ``dtype``; where the profile has no peak for it, the peak
    falls back to fp32 (:meth:`Flops.flops`) and so does the curve."""
    return tuple(curves.get(flops.dtype_used(dtype), ()))


def emulated_rates(hw: HardwareProfile, options: ModelOptions, dispatch: Optional[Dispatch]) -> Rates:
    """CPU-only host with a measured ``emulation`` section: both tiers are the runtime's
    emulated unit (same FLOP/s curve, same bus); a transfer is a copy at ``copy_gbps``."""
    emu = hw.emulation
    curves = emu.matmul_tflops_vs_m if options.use_efficiency_curves else {}
    bw = emu.memory_bandwidth_gbps * GB
    copy = emu.copy_gbps * GB
    return Rates(emu.tflops.flops(options.gpu_compute_dtype), bw, emu.tflops.flops(options.cpu_compute_dtype), bw,
                 copy, copy, 1, None, True, _curve(curves, emu.tflops, options.gpu_compute_dtype),
                 _curve(curves, emu.tflops, options.cpu_compute_dtype), dispatch, dispatch, achieved_rates(hw))


#: the engine whose per-task costs ``hrm profile`` measures (profiler/dispatch.py runs the
#: reference runtime's own operators): a measured profile's dispatch without an owner is its
RUNTIME_ENGINE = "hrm-runtime"


def dispatch_owner(hw: HardwareProfile, dispatch: Optional[Dispatch]) -> Optional[str]:
    """The engine a profile's measured ``dispatch`` belongs to: its ``owner``; unset, the
    reference runtime in a measured profile (``hrm profile`` measured it on the runtime's
    operators, docs/validation/h100-measured.yaml's methods say so), else None (a hand-set
    or calibrated α: every engine)."""
    if dispatch is None:
        return None
    if dispatch.owner is not None:
        return dispatch.owner
    return RUNTIME_ENGINE if hw.source.kind == "measured" else None


def op_costs_of(hw: HardwareProfile, options: ModelOptions) -> OpCosts:
    """Seconds per host operator call: the options' override, else the profile's measurement
    (``gpu.eager_op_s``, ``cpu.eager_op_s``, ``gpu.sync_bubble_s``), else the sourced defaults
    of :mod:`hrm.machine.launches`."""
    def pick(option, measured, default):
        return option if option is not None else measured if measured is not None else default

    gpu = hw.gpu
    return OpCosts(pick(options.eager_gpu_op_s, gpu.eager_op_s if gpu else None, EAGER_GPU_OP_S),
                   pick(options.eager_cpu_op_s, hw.cpu.eager_op_s, EAGER_CPU_OP_S),
                   pick(options.sync_bubble_s, gpu.sync_bubble_s if gpu else None, SYNC_BUBBLE_S))


def rates_from_profile(hw: HardwareProfile, options: ModelOptions = DEFAULT_OPTIONS,
                       engine: Optional[str] = None, gpu_split: str = "tensor") -> Rates:
    """Achieved rates; pass ``options.for_model(model)`` so that the device compute dtype
    follows the model's weights (unresolved options compute in fp16). ``engine`` (a name):
    on a GPU host a measured dispatch is charged only to the engine it belongs to
    (:func:`dispatch_owner`); any other engine pays its own launch counts at
    :func:`op_costs_of` instead. None: the dispatch applies (the runtime's view).
    ``gpu_split`` (the engine's): ``tensor``, the GPUs work at once, so the device tier and the
    links have their summed rates; ``layers``, each GPU runs its own block of layers after the
    previous one, so a pass takes the sum over GPUs of their blocks' times at one GPU's rates,
    which for identical GPUs is the whole model at one GPU's rates, whatever the split
    (:func:`gpus_at_once`)."""
    if options.gpu_compute_dtype is None:
        options = options.model_copy(update={"gpu_compute_dtype": "fp16"})
    eff = hw.efficiency if options.use_efficiency_curves else None
    cpu_dispatch = hw.cpu.dispatch if options.use_dispatch_overhead else None
    cpu_curve = _curve(eff.cpu_matmul_tflops_vs_m, hw.cpu.tflops, options.cpu_compute_dtype) if eff else ()
    cpu_flops = hw.cpu.tflops.flops(options.cpu_compute_dtype)
    cpu_bw = hw.cpu.memory_bandwidth_bytes_s
    if hw.gpu is None and hw.emulation is not None and options.use_emulation:
        return emulated_rates(hw, options, cpu_dispatch)
    if hw.gpu is None:
        # device tier emulated on the CPU: same unit, same bus; a "transfer" is a DRAM copy
        # (reads + writes the bytes once each, so half the STREAM-counted bandwidth)
        dev_curve = _curve(eff.cpu_matmul_tflops_vs_m, hw.cpu.tflops, options.gpu_compute_dtype) if eff else ()
        copy = hw.link.h2d_gbps * GB if hw.link else cpu_bw / 2
        copy_back = hw.link.d2h_gbps * GB if hw.link else cpu_bw / 2
        return Rates(hw.cpu.tflops.flops(options.gpu_compute_dtype), cpu_bw, cpu_flops, cpu_bw, copy, copy_back,
                     1, None, True, dev_curve or cpu_curve, cpu_curve, cpu_dispatch, cpu_dispatch, achieved_rates(hw))
    gpu_curve = _curve(eff.gpu_matmul_tflops_vs_m, hw.gpu.tflops, options.gpu_compute_dtype) if eff else ()
    count = gpus_at_once(hw.gpu.count, gpu_split)
    gpu_dispatch = hw.gpu.dispatch if options.use_dispatch_overhead else None
    if engine is not None:  # the reference runtime's own per-task costs are never another engine's
        if dispatch_owner(hw, hw.gpu.dispatch) not in (None, engine):
            gpu_dispatch = None
        if dispatch_owner(hw, hw.cpu.dispatch) not in (None, engine):
            cpu_dispatch = None
    op_costs = (op_costs_of(hw, options) if options.use_dispatch_overhead and gpu_dispatch is None else None)
    g2g = hw.gpu.gpu_to_gpu_gbps * GB if hw.gpu.gpu_to_gpu_gbps else None
    return Rates(
        hw.gpu.tflops.flops(options.gpu_compute_dtype) * count,
        hw.gpu.memory_bandwidth_bytes_s * count,
        cpu_flops,
        cpu_bw,
        hw.link.h2d_gbps * GB * count,
        hw.link.d2h_gbps * GB * count,
        count,
        g2g,
        False,
        gpu_curve,
        cpu_curve,
        gpu_dispatch,
        cpu_dispatch,
        achieved_rates(hw),
        op_costs,
        hw.disk.read_gbps * GB if hw.disk is not None else None,
        hw.ggml_cpu,
        (hw.ggml_cpu.default_threads if hw.ggml_cpu is not None and hw.ggml_cpu.default_threads
         else default_llama_threads(hw.cpu.cores)),
        hw.gpu.count if gpu_split == "layers" else 1,
    )


def gpus_at_once(gpus: int, gpu_split: str) -> int:
    """GPUs whose rates add up in one pass: all of them under tensor parallelism, one under
    a layer split (the GPUs take their blocks of layers in turn)."""
    return 1 if gpu_split == "layers" else gpus


def default_llama_threads(cores: int) -> int:
    """llama.cpp's default -t where it cannot count physical cores: the cores, halved above 4
    (common/common.cpp:144-145 at ggml-org/llama.cpp@0c1e5709)."""
    return cores if cores <= 4 else cores // 2
