"""kTransformers' ``--kt-*`` flags of SGLang read as HRM quantities: the share of routed
experts kept on the GPU (``--kt-num-gpu-experts`` per MoE layer, or ``--kt-gpu-experts-ratio``
of all of them), the format the CPU experts are stored in (``--kt-method``: a converted file of
the same model, not another model), kt-kernel's CPU threads and NUMA thread pools, and its
GPU prefill threshold. Read against kTransformers' own SGLang build (kvcache-ai/sglang) and
kt-kernel at pinned commits (:data:`SGLANG_KT`, :data:`KT_KERNEL`); docs/engines/sglang.md §3."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, ValidationError

from .. import bounds
from ..errors import HRMError, pydantic_message
from ..model.spec import FLOAT_DTYPES
from .target import Context
from .values import EXPERTS, float_value, int_value

#: kTransformers' SGLang build, python/sglang/srt/ (its server_args.py and
#: layers/moe/kt_ep_wrapper.py)
SGLANG_KT = "kvcache-ai/sglang@04653fa8"
#: kt-kernel, kvcache-ai/ktransformers kt-kernel/ (python/ and operators/)
KT_KERNEL = "kvcache-ai/ktransformers@95009ea6"
_ARGS = f"{SGLANG_KT} python/sglang/srt/server_args.py"
_WRAP = f"{SGLANG_KT} python/sglang/srt/layers/moe/kt_ep_wrapper.py"
#: --kt-method's default (server_args.py:4834-4839)
DEFAULT_KT_METHOD = "AMXINT4"
#: the placement strategies (server_args.py:4896-4906; default uniform, server_args.py:735)
PLACEMENTS = ("uniform", "frequency", "front-loading", "random")
#: --kt-gpu-prefill-token-threshold's values: 0 (off) or a token count
PREFILL_TOKENS = bounds.Range(0, bounds.MAX_CONTEXT_TOKENS, "tokens", integer=True, why="tokens of one pass (0: off)")
#: kt-kernel's inference methods (kt-kernel/python/experts.py:33-48)
INFERENCE_METHODS = ("AMXINT4", "AMXINT8", "RAWINT4", "FP8", "BF16", "FP8_PERCHANNEL", "GPTQ_INT4",
                     "SYCL_GPTQ_INT4", "MXFP4", "MXFP8", "LLAMAFILE", "MOE_INT4", "MOE_INT8")


class KtFormat(BaseModel):
    """How one --kt-method stores the CPU experts, in HRM's terms: the weight dtype and
    :data:`hrm.model.quantized.WEIGHT_FORMATS` name (None: 16-bit, the model's own float
    dtype), and the kt-kernel source that says so."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    weight_dtype: str
    weight_format: Optional[str]
    source: str


#: --kt-method -> the CPU experts' stored format. The others of INFERENCE_METHODS have no HRM
#: format (RAWINT4's and FP8_PERCHANNEL's layouts, LLAMAFILE's GGUF types, MOE_INT4/8) and are
#: refused in one line
KT_FORMATS = {
    "BF16": KtFormat(weight_dtype="bf16", weight_format=None,
                     source="16-bit experts read from the Hugging Face checkpoint (kt-kernel/python/utils/amx.py "
                            "NativeMoEWrapper, BF16SafeTensorLoader)"),
    "AMXINT8": KtFormat(weight_dtype="int8", weight_format="int8-channelwise",
                        source="int8 with one fp32 scale per output row (kt-kernel/operators/amx/la/"
                               "amx_kernels.hpp:1079-1091 BufferB: n·k int8 + n floats)"),
    "AMXINT4": KtFormat(weight_dtype="int4", weight_format="int4-channelwise",
                        source="int4 with one fp32 scale per output row (kt-kernel/operators/amx/la/"
                               "amx_buffers.hpp:499-514 BufferBInt4Impl: n·k/2 bytes + n floats)"),
    "FP8": KtFormat(weight_dtype="int8", weight_format="fp8-block128",
                    source="fp8 with 128x128 block scales (kt-kernel/operators/amx/fp8-moe.hpp:9)"),
    "GPTQ_INT4": KtFormat(weight_dtype="int4", weight_format="int4-g128",
                          source="GPTQ int4 read from the checkpoint (kt-kernel/python/utils/amx.py "
                                 "GPTQSafeTensorLoader); HRM's int4-g128: group 128"),
    "MXFP4": KtFormat(weight_dtype="int4", weight_format="mxfp4",
                      source="E2M1 nibbles + one ue8m0 scale per 32 (kt-kernel/python/experts.py:43)"),
}


def kt_method(values: dict[str, list[str]]) -> str:
    """The command's --kt-method, upper case (kt-kernel compares names exactly; SGLang passes
    the value through: kt_ep_wrapper.py:2134), or the default AMXINT4; one line for a name
    kt-kernel does not have."""
    method = values.get("--kt-method", [DEFAULT_KT_METHOD])[0]
    if method not in INFERENCE_METHODS:
        raise HRMError(f"sglang: --kt-method {method}: not one of kt-kernel's inference methods "
                       f"({', '.join(INFERENCE_METHODS)}; {KT_KERNEL} kt-kernel/python/experts.py:33-48)")
    if method not in KT_FORMATS:
        raise HRMError(f"sglang: --kt-method {method}: HRM has no weight format for its CPU experts; it reads "
                       f"{', '.join(KT_FORMATS)}")
    return method


def method_for(model) -> str:
    """The --kt-method whose CPU experts are ``model``'s own routed experts' format (export)."""
    fmt = model.weight_format if model.weight_dtype not in FLOAT_DTYPES else None
    for name, kt in KT_FORMATS.items():
        if kt.weight_format == fmt and (fmt is not None or model.weight_dtype in FLOAT_DTYPES):
            return name
    raise HRMError(f"sglang: the model's experts are {fmt or model.weight_dtype}: no --kt-method of kt-kernel "
                   f"computes that format ({', '.join(f'{n} {k.weight_format or 16}' for n, k in KT_FORMATS.items())})")


def _same_file(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


def _own_static(model) -> str:
    """How ``model`` stores its weights other than the routed experts: a float dtype or a
    weight format name (the checkpoint --model-path names)."""
    if model.static_weight_format is not None:
        return model.static_weight_format
    if model.weight_format is not None:
        return model.weight_format
    if model.weight_dtype in FLOAT_DTYPES:
        return model.weight_dtype
    raise HRMError(f"sglang: the model's {model.weight_dtype} weights name no format; give --weight-format")


def _own_experts(model) -> str:
    """The routed experts' format of ``model``: its weight format, or its dtype."""
    return model.weight_format if model.weight_dtype not in FLOAT_DTYPES else model.weight_dtype


def stored_model(values: dict[str, list[str]], ctx: Context):
    """(model, notes): ``ctx.model`` as the command stores it. With kTransformers on the routed
    experts are in --kt-method's format (:data:`KT_FORMATS`; 16-bit: the model's own float
    dtype), from --kt-weight-path: a converted copy of the same model (kt-kernel/README.md
    "Prepare Weights"). Where that is --model-path itself, the whole checkpoint is in that
    format; else attention and the other non-expert weights stay as the model stores them."""
    model = ctx.model
    on = "--kt-num-gpu-experts" in values or "--kt-gpu-experts-ratio" in values
    if "--kt-weight-path" not in values or not on:
        return model, []
    method = kt_method(values)
    kt = KT_FORMATS[method]
    floats = model.weight_dtype in FLOAT_DTYPES
    experts = kt.weight_format or (model.weight_dtype if floats else kt.weight_dtype)
    if experts == _own_experts(model):
        return model, []
    named = (values.get("serve") or values.get("--model-path") or [""])[0]
    shared = _same_file(named, values["--kt-weight-path"][0])
    static = None if shared else _own_static(model)
    dtype = kt.weight_dtype if kt.weight_format else experts
    update = {"weight_dtype": dtype, "weight_format": kt.weight_format,
              "static_weight_format": None if static == experts else static}
    if kt.weight_format is None:
        update["activation_dtype"] = dtype
    try:
        stored = type(model).model_validate({**model.model_dump(), **update})
    except ValidationError as exc:
        raise HRMError(pydantic_message(f"sglang: --kt-method {method}", exc)) from None
    where = ("--kt-weight-path is --model-path: the whole model is stored so" if shared
             else f"the rest stays as --model-path stores it ({static})")
    if not shared and gpu_expert_share(values, ctx)[0] > 0:
        where += (f"; so do the GPU's experts ({_WRAP}:2570-2579 builds them from --model-path), which HRM counts "
                  f"as {experts} (one format for every routed expert)")
    return stored, [f"sglang: --kt-method {method}: the CPU experts are {experts} ({kt.source}); {where}"]


def gpu_expert_share(values: dict[str, list[str]], ctx: Context) -> tuple[float, list[str]]:
    """(r_w, notes): the routed experts the GPU holds. --kt-gpu-experts-ratio f overrides:
    int(L·E·f) of all L·E (kt_ep_wrapper.py:1918-1934); else --kt-num-gpu-experts k per MoE
    layer, k·L in all (:1935-1941); with neither kTransformers is off (:1942-1944 returns no
    masks, so no layer is wrapped: :3335-3336) and every expert stays on the GPU."""
    model = ctx.model
    experts, layers = int(model.num_experts), int(model.num_moe_layers)
    ratio = float_value(values, "--kt-gpu-experts-ratio", bounds.FRACTION)
    count = int_value(values, "--kt-num-gpu-experts", EXPERTS)
    if count is not None and count > experts:
        raise HRMError(f"--kt-num-gpu-experts {count}: {model.name} has {experts} experts per MoE layer")
    if ratio is not None:
        total = int(layers * experts * ratio)
        return total / (layers * experts), [f"sglang: --kt-gpu-experts-ratio {ratio:g}: int({layers} x {experts} x "
                                            f"{ratio:g}) = {total} experts on the GPU ({_WRAP}:1918-1934)"
                                            + (", --kt-num-gpu-experts ignored" if count is not None else "")]
    if count is None:
        return 1.0, [f"sglang: --kt-weight-path without --kt-num-gpu-experts or --kt-gpu-experts-ratio: "
                     f"kTransformers is off ({_WRAP}:1942-1944), every expert on the GPU"]
    return count / experts, []


def placement_notes(values: dict[str, list[str]]) -> list[str]:
    """What the placement flags change: which experts the GPU holds, not how many."""
    strategy = values.get("--kt-expert-placement-strategy", ["uniform"])[0]
    if strategy not in PLACEMENTS:
        raise HRMError(f"sglang: --kt-expert-placement-strategy {strategy}: one of {', '.join(PLACEMENTS)} "
                       f"({_ARGS}:4896-4906)")
    notes = []
    if strategy != "uniform":
        notes.append(f"sglang: --kt-expert-placement-strategy {strategy}: the same number of GPU experts placed "
                     f"unevenly over the layers ({_WRAP}:1952-2042); HRM spreads them evenly")
    if "--kt-enable-dynamic-expert-update" in values:
        notes.append("sglang: --kt-enable-dynamic-expert-update swaps which experts the GPU holds after a GPU "
                     "prefill, not how many; under uniform routing it changes no estimate")
    return notes


def thread_notes(values: dict[str, list[str]], ctx: Context) -> list[str]:
    """--kt-cpuinfer (CPU threads) and --kt-threadpool-count (one pool per NUMA node,
    server_args.py:4845-4850, default 2) read against the machine: HRM's CPU tier runs at the
    profile's rate whatever the count, so a count other than the machine's is said."""
    threads = int_value(values, "--kt-cpuinfer", bounds.CORES)
    pools = int_value(values, "--kt-threadpool-count", bounds.NUMA_NODES, 2)
    if threads is not None and pools > threads:
        raise HRMError(f"--kt-threadpool-count {pools}: more thread pools than --kt-cpuinfer {threads} threads")
    cpu = getattr(ctx.hardware, "cpu", None)
    if cpu is None:
        return []
    notes = []
    cores, nodes = int(cpu.cores), int(getattr(cpu, "numa_nodes", None) or 1)
    if threads is not None and threads != cores:
        notes.append(f"sglang: --kt-cpuinfer {threads}: kt-kernel's CPU threads ({_ARGS}:4840-4844); the machine has "
                     f"{cores} cores and HRM's CPU experts run at its whole measured rate")
    if pools != nodes:
        notes.append(f"sglang: --kt-threadpool-count {pools}{' (the default)' if '--kt-threadpool-count' not in values else ''}"
                     f": one pool per NUMA node ({_ARGS}:4845-4850); the machine has {nodes}")
    return notes


def prefill_threshold_fields(values: dict[str, list[str]], ctx: Context) -> dict:
    """--kt-gpu-prefill-token-threshold T: a forward pass of T tokens or more copies the
    layer's experts to the GPU and computes them there (kt_ep_wrapper.py:2954-2958), HRM's
    ``op_offload_min_tokens``; off by default (server_args.py:4879-4884)."""
    if "--kt-weight-path" not in values:
        return {}
    threshold = int_value(values, "--kt-gpu-prefill-token-threshold", PREFILL_TOKENS)
    return {"op_offload_min_tokens": threshold} if threshold else {}  # 0: off (kt_ep_wrapper.py:2955)
