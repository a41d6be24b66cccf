"""SGLang with kTransformers CPU experts (``--kt-weight-path``, ``--kt-num-gpu-experts k``,
``--kt-method BF16``): experts 0..k-1 of every layer on the GPU, the others computed on the
CPU by kt-kernel, one forward pass per step, attention and the KV pool on the GPU. Its policy
space and mechanisms: the shipped ``sglang`` engine (``hrm/data/engines/sglang.yaml``); the
flags, defaults and start-up requirements with their file:line: ``docs/engines/sglang.md``."""

from __future__ import annotations

import math
from typing import Optional

from .. import bounds
from ..errors import HRMError
from ..policy import Policy
from .target import Context, EngineFlags, FlagSpec
from .values import (EXPERTS, HTTP_SERVER_FLAGS, context_tokens, int_value, nearest_counts, one_batch,
                     server_notes, suffixed_int, within_context)
from .vllm import batched_tokens

SGLANG_VERSION = "sglang 0.5.23 (kt-kernel 0.7.2; flags also in sglang-kt 0.7.2)"
_F = "sglang/srt/arg_groups/fields"
_KT = "sglang/srt/layers/moe/kt_ep_wrapper.py"

#: sglang/srt/utils/common.py:3394-3424 (human_readable_int): SI k M G T, IEC Ki Mi Gi Ti
#: (no decimals with an IEC suffix)
SGLANG_SUFFIXES = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
                   "Ti": 2**40}
#: --kt-method for the model's weight dtype: kt-kernel's BF16 backend reads the 16-bit Hugging
#: Face checkpoint itself (kt_kernel/utils/loader.py:551-600); the default AMXINT4 needs weights
#: converted to INT4 and an AVX512 CPU (kt_kernel/utils/amx.py:329-334)
KT_METHODS = {"bf16": "BF16", "fp16": "BF16"}
#: sglang/srt/arg_groups/fields/exec_.py:1020-1022
DEFAULT_KT_METHOD = "AMXINT4"
#: flags of mechanisms HRM's sglang engine does not model: the values that keep them off (each
#: flag's default) and why another value is refused
UNMODELLED = {
    "--pp-size": (("1",), "pipeline parallelism splits the layers between GPUs"),
    "--dp-size": (("1",), "data parallelism runs one engine per GPU"),
    "--ep-size": (("1",), "expert parallelism places whole experts per GPU"),
    "--device": (("cuda",), "HRM plans GPU serving"),
    "--enable-paged-experts": ((), "paged experts (K resident per layer, the rest paged on demand) are another "
                                   "mechanism"),
    "--offload-group-size": (("-1", "0"), "layer-group offloading is another mechanism"),
    "--cpu-offload-gb": (("0",), "--cpu-offload-gb copies whole parameters of the first layers to the GPU every "
                                 "forward pass (srt/utils/offloader.py:131-194), a mechanism HRM's vllm engine "
                                 "models: import the same budget with --from vllm"),
}


def kt_method(ctx: Context) -> str:
    """The --kt-method that computes the CPU experts in the model's own weights."""
    dtype = str(ctx.model.weight_dtype)
    if dtype not in KT_METHODS:
        raise HRMError(f"sglang: the model's weights are {dtype}: kTransformers' CPU experts would need weights "
                       f"converted for --kt-method AMXINT4/AMXINT8, which HRM does not model (16-bit only)")
    return KT_METHODS[dtype]


def gpu_experts(policy: Policy, ctx: Context) -> int:
    """Experts of every layer kept on the GPU (--kt-num-gpu-experts), as the engine realises
    r_w: int(E·r_w) (static_experts whole-experts-per-layer)."""
    experts = int(ctx.model.num_experts)
    return int(experts * policy.weights_gpu_ratio + 1e-9) if policy.ffn_on_gpu else 0


def _refuse_cpu_attention(policy: Policy) -> None:
    if not policy.attn_on_gpu:
        raise HRMError("sglang cannot run attention on the CPU (attn=cpu): SGLang keeps attention and the KV pool "
                       "on the GPU; re-plan for it: hrm-search ... --engine sglang")


def _experts_policy(policy: Policy, ctx: Context, count: int) -> Policy | None:
    # k experts of every layer on the GPU, the others on the CPU (r_w = 0: all on the CPU)
    return one_batch(policy, attn_on_gpu=True, kv_gpu_ratio=1.0, ffn_on_gpu=True,
                     weights_gpu_ratio=count / max(int(ctx.model.num_experts), 1))


def _nearest(policy: Policy, ctx: Context) -> list[Policy]:
    _refuse_cpu_attention(policy)
    experts = int(ctx.model.num_experts)
    counts = nearest_counts(experts * policy.weights_gpu_ratio if policy.ffn_on_gpu else 0.0)
    return [p for p in (_experts_policy(policy, ctx, c) for c in counts) if p]


def static_fraction(policy: Policy, ctx: Context) -> float:
    """--mem-fraction-static: SGLang's share of GPU memory for weights and the KV pool, the
    activations left outside it (srt/arg_groups/memory_hook.py:52-66): HRM's planning cap less
    the plan's workspace, rounded down to 0.01."""
    from ..cost.memory import gpu_workspace_bytes

    gpu = getattr(ctx.hardware, "gpu", None)
    if gpu is None:
        return ctx.gpu_memory_utilization
    work = float(gpu_workspace_bytes(ctx.model, ctx.workload, policy.batch_size, True))
    return max(0.01, math.floor((ctx.gpu_memory_utilization - work / gpu.memory_bytes) * 100) / 100)


def _render(policy: Policy, ctx: Context) -> dict[str, list[str]]:
    _refuse_cpu_attention(policy)
    tokens = str(batched_tokens(policy, ctx))
    out = {"--model-path": ["MODEL"]}
    count = gpu_experts(policy, ctx)
    hw = ctx.hardware
    if count < int(ctx.model.num_experts):  # kTransformers on only when some experts stay on the CPU
        out.update({"--kt-weight-path": ["MODEL"], "--kt-method": [kt_method(ctx)], "--kt-num-gpu-experts": [str(count)]})
    if hw is not None and "--kt-weight-path" in out:
        out["--kt-cpuinfer"] = [str(int(hw.cpu.cores))]
        out["--kt-threadpool-count"] = [str(int(getattr(hw.cpu, "numa_nodes", None) or 1))]
    out.update({"--max-running-requests": [str(policy.batch_size)], "--chunked-prefill-size": [tokens],
                "--max-prefill-tokens": [tokens], "--context-length": [str(context_tokens(ctx))],
                "--mem-fraction-static": [f"{static_fraction(policy, ctx):.2f}"],
                "--tp-size": [str(ctx.gpu_count)]})
    return out


def _kt_experts(values: dict[str, list[str]], ctx: Context) -> tuple[int, list[str]]:
    """The experts per layer kept on the GPU: every one without --kt-weight-path (the wrapper
    is off: fused_moe_triton/layer.py:489-497), else --kt-num-gpu-experts, refused unless
    --kt-method computes in the model's own weights."""
    experts = int(ctx.model.num_experts)
    count = int_value(values, "--kt-num-gpu-experts", EXPERTS)
    if count is not None and count > experts:
        raise HRMError(f"--kt-num-gpu-experts {count}: {ctx.model.name} has {experts} experts per layer")
    if "--kt-weight-path" not in values:
        kt = [flag for flag in values if flag.startswith("--kt-")]
        return experts, [f"{', '.join(kt)} without --kt-weight-path: kTransformers is off ({_KT}:78-79), every "
                         "expert on the GPU"] if kt else []
    method = values.get("--kt-method", [DEFAULT_KT_METHOD])[0]
    if method.upper() != kt_method(ctx):
        raise HRMError(f"sglang: --kt-method {method}{' (the default)' if '--kt-method' not in values else ''} "
                       f"computes the CPU experts from weights converted for it (kt_kernel/experts.py:33-49, "
                       f"utils/amx.py:329-340); HRM models the model's {ctx.model.weight_dtype} weights: give "
                       f"--kt-method {kt_method(ctx)}")
    if count is None:
        raise HRMError(f"sglang: --kt-weight-path without --kt-num-gpu-experts ({_KT}:87,205-213 need it)")
    return count, []


def _parse(values: dict[str, list[str]], ctx: Context) -> tuple[Policy, list[str]]:
    named = (values.get("serve") or values.get("--model-path") or [None])[0]
    notes = server_notes(values, ctx, engine="sglang", model=named, unmodelled=UNMODELLED, tp_flag="--tp-size",
                         memory_flag="--mem-fraction-static")
    int_value(values, "--kt-cpuinfer", bounds.CORES)
    big = int_value(values, "--max-running-requests", bounds.SEQUENCES)
    if big is None:
        raise HRMError("sglang: give --max-running-requests (without it SGLang admits as many requests as its KV pool "
                       "holds, at least 2048 slots: srt/mem_cache/kv_cache_configurator.py:3119-3132)")
    count, kt_notes = _kt_experts(values, ctx)
    policy = _experts_policy(Policy(batch_size=big, micro_batch_size=big, num_micro_batches=1), ctx, count)
    return policy, notes + kt_notes


def command_workload(values: Optional[dict[str, list[str]]], ctx: Context):
    """The workload SGLang serves: the plan's; for a command, the HRM workload bounded by
    --context-length (prompt + output per sequence): a longer one is an error."""
    if values is None:
        return ctx.workload
    limit = suffixed_int(values, "--context-length", SGLANG_SUFFIXES, bounds.TOKENS, whole_only=("Ki", "Mi", "Gi", "Ti"))
    return within_context(ctx, limit, "--context-length", "sglang")


def _flag(flag: str, field: str, source: str, **kw) -> FlagSpec:
    return FlagSpec(flag=flag, policy_field=field, source=source, **kw)


_SUFFIXED = r"\d+(\.\d+)?(k|M|G|T|Ki|Mi|Gi|Ti)?"
SGLANG_FLAGS = (  # '--' + field name with '-' for '_' (sglang/srt/arg_groups/arg_utils.py:288-290,327-328)
    _flag("serve", "(model: sglang serve MODEL)", "sglang/cli/serve.py:62-66 (a leading positional -> --model-path)",
          value_form=r"[^-]\S*", until_next_flag=True),
    _flag("--model-path", "(model)", f"{_F}/model.py:51-57", aliases=("--model",), value_form=r"\S+"),
    _flag("--context-length", "workload: longest prompt + output", f"{_F}/model.py:110-115", value_form=_SUFFIXED),
    _flag("--tp-size", "(hardware: GPU count)", f"{_F}/parallel.py:45-51; '--tp' is argparse's unique-prefix "
          "abbreviation (sglang/srt/server_args.py:679: allow_abbrev default)", aliases=("--tensor-parallel-size", "--tp")),
    _flag("--pp-size", "(refused above 1)", f"{_F}/parallel.py:59"),
    _flag("--dp-size", "(refused above 1)", f"{_F}/parallel.py:73"),
    _flag("--ep-size", "(refused above 1)", f"{_F}/parallel.py:281"),
    _flag("--device", "(cuda only)", f"{_F}/device.py:24", value_form=r"\S+"),
    _flag("--mem-fraction-static", "(weights + KV pool share of GPU memory)", f"{_F}/schedule.py:27-30",
          value_form=r"0?\.\d+|1(\.0+)?"),
    _flag("--max-running-requests", "batch_size", f"{_F}/schedule.py:31-34"),
    _flag("--max-total-tokens", "(KV pool tokens)", f"{_F}/schedule.py:39", value_form=_SUFFIXED),
    _flag("--chunked-prefill-size", "(prefill tokens per step)", f"{_F}/schedule.py:52-55"),
    _flag("--max-prefill-tokens", "(prefill tokens per batch)", f"{_F}/schedule.py:71-80", value_form=_SUFFIXED),
    _flag("--enable-paged-experts", "(refused)", f"{_F}/exec_.py:999-1007", values=0),
    _flag("--kt-weight-path", "(kTransformers on: CPU expert weights)", f"{_F}/exec_.py:1016-1019", value_form=r"\S+"),
    _flag("--kt-method", "(CPU expert kernel: BF16)", f"{_F}/exec_.py:1020-1022; kt_kernel/experts.py:33-49",
          value_form=r"[A-Za-z0-9_]+"),
    _flag("--kt-cpuinfer", "(hardware: CPU threads)", f"{_F}/exec_.py:1023-1025"),
    _flag("--kt-threadpool-count", "(NUMA nodes)", f"{_F}/exec_.py:1026-1029"),
    _flag("--kt-num-gpu-experts", "weights_gpu_ratio (experts 0..k-1 of every layer on the GPU)",
          f"{_F}/exec_.py:1030-1032; {_KT}:99-116,205-213"),
    _flag("--cpu-offload-gb", "(refused above 0: see --from vllm)", f"{_F}/exec_.py:1068-1071 (int)"),
    _flag("--offload-group-size", "(refused)", f"{_F}/exec_.py:1072-1075"),
)

SGLANG = EngineFlags(
    name="sglang", version=SGLANG_VERSION, programs=("python -m sglang.launch_server",),
    import_programs=("python3 -m sglang.launch_server", "sglang"),
    engines=("sglang",), hrm_engine=lambda policy: "sglang",
    description="SGLang + kTransformers: experts 0..k-1 of every layer on the GPU, the rest computed on the CPU",
    flags=SGLANG_FLAGS,
    passthrough={**HTTP_SERVER_FLAGS, "--trust-remote-code": 0, "--attention-backend": 1, "--served-model-name": 1,
                 "--dtype": 1, "--kv-cache-dtype": 1, "--enable-mixed-chunk": 0, "--disable-shared-experts-fusion": 0,
                 "--disable-cuda-graph": 0, "--log-level": 1, "--enable-torch-compile": 0, "--allow-auto-truncate": 0,
                 "--tool-call-parser": 1, "--reasoning-parser": 1, "--random-seed": 1, "--disable-radix-cache": 0,
                 "--enable-p2p-check": 0, "--page-size": 1, "--schedule-policy": 1, "--api-key": 1,
                 "--kt-max-deferred-experts-per-token": 1, "--tokenizer-path": 1, "--load-format": 1},
    caveats=("kTransformers with upstream sglang 0.5.23 calls KTMoEWrapper(num_gpu_experts=...) "
             f"({_KT}:216-231), which kt-kernel 0.7.2 no longer takes (kt_kernel/experts.py:125-148: "
             "gpu_experts_mask; kvcache-ai/ktransformers#1832): run it with sglang-kt 0.7.2, which takes the same "
             "flags (--kt-num-gpu-experts per layer, uniform placement: experts 0..k-1)",
             "--kt-method BF16 needs AVX512-BF16 or AVX2+FMA on the host (kt_kernel/utils/amx.py:648-655) and reads "
             "the model's Hugging Face checkpoint (--kt-weight-path MODEL)",
             "the CPU and GPU experts of a layer run concurrently and join at its end; HRM's sglang engine charges "
             "them one after the other (serial), an upper bound"),
    workload=command_workload, nearest=_nearest, render=_render, parse=_parse,
)
