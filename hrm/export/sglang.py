"""SGLang with kTransformers: the first k experts of every layer on the GPU, the rest on the CPU.

No shipped HRM engine describes SGLang, so its policy space is stated here (and its policies
are estimated with the plan's engine)."""

from __future__ import annotations


from .. import bounds
from ..engine import PolicySpace
from ..errors import HRMError
from ..policy import Policy
from .target import Context, EngineFlags, FlagSpec
from .values import (EXPERTS, HTTP_SERVER_FLAGS, OFFLOAD_GIB, float_value, int_value, nearest_counts, one_batch,
                     served_batch, streamed_offload)

SGLANG_VERSION = "sglang 0.5.23"
_SGF = "sglang/srt/arg_groups/fields"

#: GPU attention with the whole KV cache on the GPU, one forward pass for the batch; the
#: experts kept on the CPU computed there (kTransformers) or, without it, streamed
SGLANG_POLICY = PolicySpace(attention=("gpu",), ffn=("gpu", "cpu"), fixed={"num_micro_batches": 1, "kv_gpu_ratio": 1.0})


def _kt_gpu_experts(policy: Policy, ctx: Context) -> int:
    experts = int(ctx.model.num_experts)
    return round(experts * policy.weights_gpu_ratio) if policy.ffn_on_gpu else 0


def _experts_policy(policy: Policy, ctx: Context, gpu_experts: int) -> Policy | None:
    rw = gpu_experts / max(int(ctx.model.num_experts), 1)
    # no GPU expert: kTransformers computes every expert on the CPU (ffn=cpu)
    return one_batch(policy, attn_on_gpu=True, kv_gpu_ratio=1.0, ffn_on_gpu=rw > 0, weights_gpu_ratio=rw)


def _nearest(policy: Policy, ctx: Context) -> list[Policy]:
    counts = nearest_counts(int(ctx.model.num_experts) * policy.weights_gpu_ratio if policy.ffn_on_gpu else 0.0)
    return [p for p in (_experts_policy(policy, ctx, c) for c in counts) if p]


def _render(policy: Policy, ctx: Context) -> dict[str, list[str]]:
    out = {"--model-path": ["MODEL"], "--kt-weight-path": ["KT_WEIGHTS"],
           "--kt-num-gpu-experts": [str(_kt_gpu_experts(policy, ctx))],
           "--max-running-requests": [str(policy.batch_size)],
           "--mem-fraction-static": [f"{ctx.gpu_memory_utilization:.2f}"],
           "--tp-size": [str(ctx.gpu_count)]}
    if ctx.hardware is not None:
        out["--kt-cpuinfer"] = [str(int(ctx.hardware.cpu.cores))]
    return out


def _parse(values: dict[str, list[str]], ctx: Context) -> tuple[Policy, list[str]]:
    big = served_batch(values, ctx, engine="sglang", batch_flag="--max-running-requests", tp_flag="--tp-size",
                       memory_flag="--mem-fraction-static")
    int_value(values, "--kt-cpuinfer", bounds.CORES)
    experts = int(ctx.model.num_experts)
    if "--kt-num-gpu-experts" in values:
        gpu_experts = int_value(values, "--kt-num-gpu-experts", EXPERTS)
        if gpu_experts > experts:
            raise HRMError(f"--kt-num-gpu-experts {gpu_experts}: {ctx.model.name} has {experts} experts per layer")
        if float_value(values, "--cpu-offload-gb", OFFLOAD_GIB, 0.0):
            raise HRMError("--cpu-offload-gb with --kt-num-gpu-experts: give one way of offloading the experts")
        whole = Policy(batch_size=big, micro_batch_size=big, num_micro_batches=1)
        return _experts_policy(whole, ctx, gpu_experts), []
    # no kTransformers: --cpu-offload-gb streams weights like vLLM's
    return streamed_offload(big, float_value(values, "--cpu-offload-gb", OFFLOAD_GIB, 0.0), ctx), []


SGLANG = EngineFlags(
    name="sglang", version=SGLANG_VERSION, programs=("python -m sglang.launch_server",), policy=SGLANG_POLICY,
    description="SGLang with kTransformers: the first k experts of every layer on the GPU, the rest on the CPU",
    flags=(
        FlagSpec(flag="--model-path", aliases=("--model",), policy_field="(model)", value_form=r"\S+",
                 source="sglang/srt/arg_groups/fields (model_path)"),
        FlagSpec(flag="--kt-weight-path", policy_field="(kTransformers CPU expert weights)", value_form=r"\S+",
                 source=f"{_SGF}/exec_.py:1016"),
        FlagSpec(flag="--kt-num-gpu-experts", policy_field="weights_gpu_ratio, ffn_on_gpu (whole experts per layer)",
                 source=f"{_SGF}/exec_.py:1030; sglang/srt/layers/moe/kt_ep_wrapper.py:99-113"),
        FlagSpec(flag="--kt-cpuinfer", policy_field="(hardware: CPU threads)", source=f"{_SGF}/exec_.py:1023"),
        FlagSpec(flag="--cpu-offload-gb", policy_field="weights_gpu_ratio (without kTransformers)",
                 source=f"{_SGF}/exec_.py:1068"),
        FlagSpec(flag="--max-running-requests", policy_field="batch_size", source=f"{_SGF}/schedule.py:31"),
        FlagSpec(flag="--mem-fraction-static", policy_field="(GPU memory fraction)", value_form=r"0?\.\d+|1(\.0+)?",
                 source=f"{_SGF}/schedule.py:27"),
        FlagSpec(flag="--tp-size", aliases=("--tensor-parallel-size",), policy_field="(hardware: GPU count)",
                 source=f"{_SGF}/parallel.py:45-51"),
    ),
    passthrough={**HTTP_SERVER_FLAGS, "--kt-method": 1, "--kt-threadpool-count": 1, "--trust-remote-code": 0,
                 "--attention-backend": 1, "--kt-max-deferred-experts-per-token": 1},
    caveats=("kTransformers computes the experts it keeps on the CPU there (AMX/AVX kernels), where HRM's ffn=gpu "
             "streams them: the estimate is of the HRM policy",
             "flag names: '--' + field name with '-' for '_' (sglang/srt/arg_groups/arg_utils.py:290)"),
    nearest=_nearest, render=_render, parse=_parse,
)
