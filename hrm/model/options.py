"""Modelling options that are choices, not physics: each has a name, a source and a default."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict

from .. import bounds
from ..bounds import Flag
from .spec import Dtype, ModelSpec
from ..units import FLOAT_DTYPES


class ModelOptions(BaseModel):
    """Knobs of the performance and memory model.

    - ``gpu_memory_utilization`` / ``cpu_memory_utilization``: fraction of each memory the
      plan may use (headroom for the CUDA context, allocator fragmentation, the OS). Source:
      the MoE-Lightning artifact caps GPU use at 0.86 and CPU use at 0.8 of capacity.
    - ``gpu_compute_dtype``: the dtype device kernels run in (FLOP/s looked up per dtype);
      None (default) = the weights' float dtype, fp16 for quantised (int8/int4) weights —
      kernels dequantise to fp16 (:meth:`for_model` resolves it).
    - ``cpu_compute_dtype``: the paper computes CPU attention in float32 (Fig. 4 footnote).
    - ``use_efficiency_curves``: use a measured profile's achieved-FLOP/s-vs-M and
      bandwidth-vs-size curves instead of peaks where the profile has them.
    - ``use_dispatch_overhead``: charge a measured profile's fixed cost per task and per
      operator call (``dispatch`` of the gpu/cpu sections, the α of the α-β model) on top
      of each task's roofline time; datasheet profiles have none, so it changes nothing
      for them. Source: ``hrm profile`` (the reference runtime's operators at minimal size).
    - ``eager_gpu_op_s`` / ``eager_cpu_op_s`` / ``sync_bubble_s``: the host's time per eager
      CUDA op and per op on CPU tensors, and the GPU's idle time after a host sync, charged
      per operator an engine's source issues (:mod:`hrm.machine.launches`: sources there); None (the
      default): the profile's measured ``gpu.eager_op_s``, ``cpu.eager_op_s``,
      ``gpu.sync_bubble_s``, else :mod:`hrm.machine.launches`' sourced defaults. A measured
      ``gpu.dispatch`` replaces them for the engine it belongs to (``dispatch.owner``).
    - ``use_emulation``: on a CPU-only host, take both tiers' rates from the profile's
      ``emulation`` section (the runtime's torch operators on its thread count) where it
      has one, instead of the whole machine's peaks of the ``cpu`` section.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_memory_utilization: bounds.MEMORY_UTILIZATION.type = 0.86
    cpu_memory_utilization: bounds.MEMORY_UTILIZATION.type = 0.8
    gpu_compute_dtype: Optional[Dtype] = None
    cpu_compute_dtype: Dtype = "fp32"
    use_efficiency_curves: Flag = True
    use_dispatch_overhead: Flag = True
    use_emulation: Flag = True
    eager_gpu_op_s: Optional[bounds.DISPATCH_S.type] = None
    eager_cpu_op_s: Optional[bounds.DISPATCH_S.type] = None
    sync_bubble_s: Optional[bounds.DISPATCH_S.type] = None

    def for_model(self, model: ModelSpec) -> "ModelOptions":
        """These options with the device compute dtype resolved for ``model``."""
        if self.gpu_compute_dtype is not None:
            return self
        dtype = model.weight_dtype if model.weight_dtype in FLOAT_DTYPES else "fp16"
        return self.model_copy(update={"gpu_compute_dtype": dtype})



DEFAULT_OPTIONS = ModelOptions()


def spec_in_dtype(spec: ModelSpec, dtype: str) -> ModelSpec:
    """``spec`` with weights, KV and activations held in ``dtype`` (the reference runtime's
    ``--dtype``: every tensor in one dtype; predictions then count the same bytes)."""
    return spec.model_copy(update={"weight_dtype": dtype, "kv_dtype": dtype, "activation_dtype": dtype})


def options_in_dtype(dtype: str) -> ModelOptions:
    """Both tiers compute in ``dtype`` (a fact of such a run, not a fitted knob)."""
    return ModelOptions(gpu_compute_dtype=dtype, cpu_compute_dtype=dtype)
