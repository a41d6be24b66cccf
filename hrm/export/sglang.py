"""SGLang with kTransformers CPU experts (``--kt-weight-path``, ``--kt-num-gpu-experts k``,
``--kt-method``): k experts of every layer on the GPU, the others computed on the CPU by
kt-kernel in --kt-method's format, one forward pass per step, attention and the KV pool on the
GPU. Its policy space and mechanisms: the shipped ``sglang`` engine
(``hrm/data/engines/sglang.yaml``); the ``--kt-*`` flags read: :mod:`hrm.export.sglang_kt`; the
flags, defaults and start-up requirements with their file:line: ``docs/engines/sglang.md``."""

from __future__ import annotations

import math
from typing import Optional

from .. import bounds
from ..errors import HRMError
from ..policy import Policy
from .sglang_kt import (SGLANG_KT, gpu_expert_share, method_for, placement_notes, prefill_threshold_fields,
                        stored_model, thread_notes)
from .target import Context, EngineFlags, FlagSpec
from .values import (HTTP_SERVER_FLAGS, context_tokens, int_value, nearest_counts, one_batch,
                     server_notes, suffixed_int, within_context)
from .vllm import batched_tokens

SGLANG_VERSION = "sglang 0.5.23; --kt-* flags: kTransformers' sglang-kt (kvcache-ai/sglang@04653fa8) and kt-kernel " \
                 "(kvcache-ai/ktransformers@95009ea6)"
_F = "sglang/srt/arg_groups/fields"
_KT = "sglang/srt/layers/moe/kt_ep_wrapper.py"

#: sglang/srt/utils/common.py:3394-3424 (human_readable_int): SI k M G T, IEC Ki Mi Gi Ti
#: (no decimals with an IEC suffix)
SGLANG_SUFFIXES = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
                   "Ti": 2**40}
#: --kt-weight-path for an AMXINT8/AMXINT4 export: weights converted by kt-kernel's
#: scripts/convert_cpu_weights.py (kt-kernel/README.md "Prepare Weights"), not the checkpoint
CONVERTED_WEIGHTS = "CPU_WEIGHTS"
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
        method = method_for(ctx.model)
        path = CONVERTED_WEIGHTS if method.startswith("AMX") else "MODEL"
        out.update({"--kt-weight-path": [path], "--kt-method": [method], "--kt-num-gpu-experts": [str(count)]})
    if hw is not None and "--kt-weight-path" in out:
        out["--kt-cpuinfer"] = [str(int(hw.cpu.cores))]
        out["--kt-threadpool-count"] = [str(int(getattr(hw.cpu, "numa_nodes", None) or 1))]
    out.update({"--max-running-requests": [str(policy.batch_size)], "--chunked-prefill-size": [tokens],
                "--max-prefill-tokens": [tokens], "--context-length": [str(context_tokens(ctx))],
                "--mem-fraction-static": [f"{static_fraction(policy, ctx):.2f}"],
                "--tp-size": [str(ctx.gpu_count)]})
    return out


def _kt_share(values: dict[str, list[str]], ctx: Context) -> tuple[float, list[str]]:
    """(r_w, notes): every expert on the GPU without --kt-weight-path (no layer is wrapped),
    else the --kt-* flags' share (:func:`hrm.export.sglang_kt.gpu_expert_share`)."""
    share, notes = gpu_expert_share(values, ctx)  # malformed values refused, whether or not kTransformers is on
    if "--kt-weight-path" not in values:
        kt = [flag for flag in values if flag.startswith("--kt-")]
        return 1.0, [f"{', '.join(kt)} without --kt-weight-path: kTransformers is off (kvcache-ai/sglang@04653fa8 "
                     "python/sglang/srt/layers/moe/kt_ep_wrapper.py:2104-2105), every expert on the GPU"] if kt else []
    return share, notes + placement_notes(values) + thread_notes(values, ctx)


def _parse(values: dict[str, list[str]], ctx: Context) -> tuple[Policy, list[str]]:
    named = (values.get("serve") or values.get("--model-path") or [None])[0]
    notes = server_notes(values, ctx, engine="sglang", model=named, unmodelled=UNMODELLED, tp_flag="--tp-size",
                         memory_flag="--mem-fraction-static")
    big = int_value(values, "--max-running-requests", bounds.SEQUENCES)
    if big is None:
        raise HRMError("sglang: give --max-running-requests (without it SGLang admits as many requests as its KV pool "
                       "holds, at least 2048 slots: srt/mem_cache/kv_cache_configurator.py:3119-3132)")
    share, kt_notes = _kt_share(values, ctx)
    policy = one_batch(Policy(batch_size=big, micro_batch_size=big, num_micro_batches=1), attn_on_gpu=True,
                       kv_gpu_ratio=1.0, ffn_on_gpu=True, weights_gpu_ratio=share)
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


_KTW = "python/sglang/srt/layers/moe/kt_ep_wrapper.py"


def _kt(flag: str, field: str, lines: str, **kw) -> FlagSpec:
    """A --kt-* flag as kTransformers' sglang-kt registers it (server_args.py:``lines``)."""
    return FlagSpec(flag=flag, policy_field=field, source=f"{SGLANG_KT} python/sglang/srt/server_args.py:{lines}", **kw)


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
    _kt("--kt-weight-path", "(kTransformers on: the CPU experts' file)", "4829-4833", value_form=r"\S+"),
    _kt("--kt-method", "(the CPU experts' format: hrm.export.sglang_kt.KT_FORMATS)", "4834-4839; kvcache-ai/"
        "ktransformers@95009ea6 kt-kernel/python/experts.py:33-48", value_form=r"[A-Za-z0-9_]+"),
    _kt("--kt-cpuinfer", "(kt-kernel's CPU threads: noted against the machine's cores)", "4840-4844"),
    _kt("--kt-threadpool-count", "(one thread pool per NUMA node: noted against the machine's)", "4845-4850"),
    _kt("--kt-num-gpu-experts", "weights_gpu_ratio = k/E (k experts of every MoE layer on the GPU)",
        f"4859-4865; {_KTW}:1935-1941"),
    _kt("--kt-gpu-experts-ratio", "weights_gpu_ratio = int(L·E·f)/(L·E) (overrides --kt-num-gpu-experts)",
        f"4866-4872; {_KTW}:1918-1934", value_form=r"\d*\.?\d+"),
    _kt("--kt-expert-placement-strategy", "(which experts, not how many: noted)", f"4896-4906; {_KTW}:1952-2042",
        value_form=r"[a-z-]+"),
    _kt("--kt-gpu-prefill-token-threshold", "engine op_offload_min_tokens (passes of T tokens or more compute the "
        "layer's experts on the GPU)", f"4879-4884; {_KTW}:2954-2958"),
    _kt("--kt-enable-dynamic-expert-update", "(which experts, not how many: noted)", "4890-4895", values=0),
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
             "--kt-method BF16, FP8, GPTQ_INT4 and MXFP4 read the model's own checkpoint (--kt-weight-path MODEL); "
             "AMXINT8/AMXINT4 read weights converted by kt-kernel's scripts/convert_cpu_weights.py (CPU_WEIGHTS) and "
             "need AVX512F+BW (kvcache-ai/ktransformers@95009ea6 kt-kernel/python/utils/amx.py:294-305); HRM's CPU "
             "experts run at the machine's memory rate and FP32 peak, not AMX's int8/bf16 tile rate",
             "the CPU and GPU experts of a layer run concurrently and join at its end; HRM's sglang engine charges "
             "them one after the other (serial), an upper bound"),
    workload=command_workload, nearest=_nearest, render=_render, parse=_parse,
    engine_fields=prefill_threshold_fields, stored_model=stored_model,
)
