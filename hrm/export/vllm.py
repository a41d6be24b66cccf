"""vLLM: weights offloaded by GiB (UVA, read every forward pass), GPU attention.

No shipped HRM engine describes vLLM, so its policy space is stated here (and its policies
are estimated with the plan's engine)."""

from __future__ import annotations

import math

from .. import bounds
from ..engine import PolicySpace
from ..policy import Policy
from ..units import GIB
from .target import Context, EngineFlags, FlagSpec
from .values import (HTTP_SERVER_FLAGS, OFFLOAD_GIB, context_tokens, expert_bytes, float_value, int_value, one_batch,
                     ratio_from_offload, served_batch, streamed_offload)

VLLM_VERSION = "vllm 0.33.0"
_VARGS = "vllm/engine/arg_utils.py"

#: no CPU attention, the whole KV cache on the GPU, one forward pass for the batch (the
#: scheduler's), every expert computed on the GPU (offloaded ones read over UVA:
#: vllm/config/offload.py:23-38)
VLLM_POLICY = PolicySpace(attention=("gpu",), ffn=("gpu",), fixed={"num_micro_batches": 1, "kv_gpu_ratio": 1.0})


def _offload_gib(policy: Policy, ctx: Context) -> float:
    """GiB of expert weights to offload per GPU, rounded up to 0.01 GiB (the flag's text)."""
    offload = (1.0 - (policy.weights_gpu_ratio if policy.ffn_on_gpu else 0.0)) * expert_bytes(ctx)
    return math.ceil(round(offload / GIB / ctx.gpu_count * 100, 6)) / 100


def _nearest(policy: Policy, ctx: Context) -> list[Policy]:
    # GPU attention with the whole KV cache on the GPU, one forward pass for the batch
    rw = ratio_from_offload(_offload_gib(policy, ctx), ctx)
    return [p for p in [one_batch(policy, attn_on_gpu=True, kv_gpu_ratio=1.0, ffn_on_gpu=True,
                                  weights_gpu_ratio=rw)] if p]


def _render(policy: Policy, ctx: Context) -> dict[str, list[str]]:
    return {"serve": ["MODEL"], "--cpu-offload-gb": [f"{_offload_gib(policy, ctx):.2f}"],
            "--max-num-seqs": [str(policy.batch_size)],
            "--max-model-len": [str(context_tokens(ctx))],
            "--gpu-memory-utilization": [f"{ctx.gpu_memory_utilization:.2f}"],
            "-tp": [str(ctx.gpu_count)]}


def _parse(values: dict[str, list[str]], ctx: Context) -> tuple[Policy, list[str]]:
    big = served_batch(values, ctx, engine="vllm", batch_flag="--max-num-seqs", tp_flag="-tp",
                       memory_flag="--gpu-memory-utilization")
    int_value(values, "--max-model-len", bounds.TOKENS)
    return streamed_offload(big, float_value(values, "--cpu-offload-gb", OFFLOAD_GIB, 0.0), ctx), []


VLLM = EngineFlags(
    name="vllm", version=VLLM_VERSION, programs=("vllm",), policy=VLLM_POLICY,
    description="vLLM: weights offloaded by GiB (UVA, read every forward pass), GPU attention",
    flags=(  # in the order of vllm/engine/arg_utils.py
        FlagSpec(flag="serve", policy_field="(model: vllm serve MODEL)", value_form=r"\S+",
                 source="vllm serve MODEL (the subcommand's positional model)"),
        FlagSpec(flag="--max-model-len", policy_field="workload: max prompt + gen", source=f"{_VARGS}:991"),
        FlagSpec(flag="-tp", aliases=("--tensor-parallel-size",), policy_field="(hardware: GPU count)",
                 source=f"{_VARGS}:1209"),
        FlagSpec(flag="--gpu-memory-utilization", aliases=("--device-memory-utilization",),
                 policy_field="(GPU memory fraction)", value_form=r"0?\.\d+|1(\.0+)?",
                 source=f"{_VARGS}:1388-1393; vllm/config/cache.py:215"),
        FlagSpec(flag="--cpu-offload-gb", policy_field="weights_gpu_ratio (GiB of weights per GPU on the CPU)",
                 value_form=r"\d+(\.\d+)?", source=f"{_VARGS}:1470; vllm/config/offload.py:23-38"),
        FlagSpec(flag="--max-num-seqs", policy_field="batch_size", source=f"{_VARGS}:1754-1758"),
    ),
    passthrough={**HTTP_SERVER_FLAGS, "--dtype": 1, "--quantization": 1, "--kv-cache-dtype": 1, "--enforce-eager": 0,
                 "--trust-remote-code": 0},
    caveats=("--cpu-offload-gb offloads whole parameters in module order until the budget is reached "
             "(vllm/config/offload.py:38), not only routed experts",
             "vLLM has no CPU attention; it schedules the batch as one forward pass (n = 1)"),
    nearest=_nearest, render=_render, parse=_parse,
)
