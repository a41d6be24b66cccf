"""``hrm fit``'s answer for SGLang with kTransformers (``--kt-weight-path``, ``--kt-method``,
``--kt-num-gpu-experts k``, ``--kt-cpuinfer``): k experts of every MoE layer on the GPU, the
others computed on the CPU by kt-kernel (:mod:`hrm.export.sglang`, :mod:`hrm.export.sglang_kt`);
the fastest k by :mod:`hrm.analysis.fit_server`'s search, or one line where SGLang cannot run the
model on the machine:

- no GPU: SGLang keeps attention and the KV pool on the GPU (the ``sglang`` engine's ``policy:
  attention [gpu]``; HRM's target runs ``--device cuda`` only);
- CPU experts in a format kt-kernel has no ``--kt-method`` for in HRM
  (:data:`hrm.export.sglang_kt.KT_FORMATS`; e.g. GGUF's q4_k_m): only k = E (kTransformers off)
  is searched, and where that does not fit, the exporter's line says why;
- nothing fits: even with every expert on the CPU (k = 0) attention, the other weights and the KV
  pool exceed ``--mem-fraction-static``, or the experts the host's memory (kt-kernel holds every
  expert of the layer in host memory: the ``sglang`` engine's ``cpu_holds_all_experts``).
"""

from __future__ import annotations

from ..errors import HRMError
from .fit_server import ServerAnswer, ServerPick, answer, refused, search

ENGINE = "sglang"


def refusal(hw) -> str | None:
    """Why SGLang cannot run a model on ``hw`` whatever its flags, or None."""
    if hw.gpu is None:
        return (f"{hw.name} has no GPU: SGLang keeps attention and the KV pool on the GPU (hrm/data/engines/sglang.yaml "
                "policy; srt/arg_groups/memory_hook.py:52-66) and HRM's sglang target runs --device cuda only")
    return None


def kt_method_refusal(model) -> str | None:
    """Why no --kt-method HRM prices computes the model's routed experts (the exporter's
    :func:`hrm.export.sglang_kt.method_for`), or None."""
    from ..export.sglang_kt import KT_FORMATS, method_for

    try:
        method_for(model)
    except HRMError:
        fmt = model.weight_format or model.weight_dtype
        return (f"HRM prices no --kt-method for its {fmt} experts: it reads {', '.join(KT_FORMATS)} "
                "(hrm/export/sglang_kt.py KT_FORMATS; kt-kernel's other methods, LLAMAFILE's GGUF types among them, "
                "have no HRM weight format)")
    return None


def _describe(method: str | None):
    def describe(pick: ServerPick) -> str:
        if pick.gpu_units == pick.units:
            return f"every expert on the GPU (kTransformers off); bottleneck: {pick.bottleneck}"
        return (f"kTransformers: {pick.gpu_units} of {pick.units} experts of every MoE layer on the GPU, the other "
                f"{pick.units - pick.gpu_units} computed on the CPU by kt-kernel (--kt-method {method}); "
                f"bottleneck: {pick.bottleneck}")
    return describe


def sglang_answer(hw, model, workload, users: int = 1, objective: str = "latency") -> ServerAnswer:
    """SGLang + kTransformers' best command for ``model`` on ``hw`` serving ``users`` requests."""
    from ..export.sglang_kt import method_for

    why = refusal(hw)
    if why is not None:
        return refused(ENGINE, why)
    no_kt = kt_method_refusal(model)
    picks, ctx = search(ENGINE, hw, model, workload, users, objective,
                        allowed=lambda k, units: no_kt is None or k == units)
    if no_kt is not None:
        none_fit = f"with every expert on the GPU it does not fit, and {no_kt}"
        return answer(ENGINE, picks, ctx, _describe(None), none_fit)
    none_fit = ("with every expert on the CPU (--kt-num-gpu-experts 0), attention, the other weights and the KV pool "
                "still exceed --mem-fraction-static of the GPU (or the experts the host's memory); lower --context or "
                "--users")
    return answer(ENGINE, picks, ctx, _describe(method_for(model)), none_fit)
