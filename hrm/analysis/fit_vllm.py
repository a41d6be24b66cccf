"""``hrm fit``'s answer for vLLM (``vllm serve``): the fastest ``--cpu-offload-gb`` /
``--cpu-offload-params experts`` command (:mod:`hrm.export.vllm`) by :mod:`hrm.analysis.fit_server`'s
search, or one line where vLLM cannot run the model on the machine:

- no GPU: vLLM keeps attention and the paged KV cache on the GPU (the ``vllm`` engine's
  ``policy: attention [gpu]``, vllm/config/cache.py:215) and computes every expert there: its
  offload reads pinned host memory over UVA in every forward pass (model_executor/offloader/
  uva.py:114-122), it computes nothing on the CPU;
- GGUF weights (a ggml type: ``q4_k_m`` ...): vLLM reads them only through the out-of-tree
  vllm-gguf-plugin, "highly experimental and under-optimized" (:data:`GGUF_SOURCE`), whose
  kernels HRM's vllm engine does not price (its ``quant_kernel`` is Marlin, for GPTQ);
- nothing fits: even with every layer's experts offloaded the rest (attention, the other weights,
  the KV cache) exceeds ``--gpu-memory-utilization``, or the offloaded experts the host's memory.
"""

from __future__ import annotations

from ..model.spec import FLOAT_DTYPES
from .fit_server import ServerAnswer, ServerPick, answer, refused, search

ENGINE = "vllm"
#: where vLLM says how it reads GGUF files (read at this commit of its docs)
GGUF_SOURCE = "vllm-project/vllm@06fed1cf docs/features/quantization/gguf.md:4,7"
#: vLLM's offloaded parameters stay in pinned host memory, read by the GPU kernels in place
UVA_SOURCE = "vllm 0.33.0 model_executor/offloader/uva.py:114-122"


def gguf_format(model) -> str | None:
    """The model's GGUF weight format (a ggml type, q4_k_m, or a per-tensor mix), or None."""
    from ..model.quantized import GGML_BLOCKS, MIX_PREFIX

    fmt = model.weight_format if model.weight_dtype not in FLOAT_DTYPES else None
    if fmt is None:
        return None
    return fmt if fmt == "q4_k_m" or fmt.startswith(MIX_PREFIX) or fmt.upper() in GGML_BLOCKS else None


def refusal(hw, model) -> str | None:
    """Why vLLM cannot run ``model`` on ``hw`` whatever its flags, or None."""
    if hw.gpu is None:
        return (f"{hw.name} has no GPU: vLLM keeps attention and the KV cache on the GPU (hrm/data/engines/vllm.yaml "
                f"policy; vllm/config/cache.py:215) and computes no expert on the CPU ({UVA_SOURCE})")
    fmt = gguf_format(model)
    if fmt is not None:
        return (f"the model's weights are GGUF ({fmt}): vLLM reads GGUF only through the out-of-tree vllm-gguf-plugin, "
                f"'highly experimental and under-optimized' ({GGUF_SOURCE}), whose kernels HRM's vllm engine does not "
                "price; serve the safetensors checkpoint (16-bit, or GPTQ: --weight-dtype int4 --weight-format "
                "int4-g128)")
    return None


def _describe(pick: ServerPick) -> str:
    off = pick.units - pick.gpu_units
    if off == 0:
        return f"every MoE layer's experts on the GPU, no --cpu-offload-gb; bottleneck: {pick.bottleneck}"
    return (f"the experts of {off} of {pick.units} MoE layers offloaded (--cpu-offload-gb), read over PCIe in every "
            f"forward pass, none computed on the CPU ({UVA_SOURCE}); bottleneck: {pick.bottleneck}")


def vllm_answer(hw, model, workload, users: int = 1, objective: str = "latency") -> ServerAnswer:
    """vLLM's best command for ``model`` on ``hw`` serving ``users`` requests of ``workload``."""
    why = refusal(hw, model)
    if why is not None:
        return refused(ENGINE, why)
    picks, ctx = search(ENGINE, hw, model, workload, users, objective)
    none_fit = ("with every MoE layer's experts offloaded, attention, the other weights and the KV cache still exceed "
                "--gpu-memory-utilization of the GPU (or the offloaded experts the host's memory): vLLM has no CPU "
                f"experts ({UVA_SOURCE}); lower --context or --users")
    return answer(ENGINE, picks, ctx, _describe, none_fit)
