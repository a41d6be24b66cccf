"""llama.cpp ``llama-server``: experts kept on the CPU per whole layer, the KV cache on the
GPU or (``-nkvo``) in host memory. Its policy space: the shipped ``llama.cpp`` and
``llama.cpp-nkvo`` engines."""

from __future__ import annotations

import re

from .. import bounds
from ..errors import HRMError
from ..policy import Policy
from .target import Context, EngineFlags, FlagSpec
from .values import (CONTEXT, HTTP_SERVER_FLAGS, LAYERS, context_tokens, int_value, make_policy, moe_layers,
                     nearest_counts, with_fields)

LLAMA_CPP_VERSION = "ggml-org/llama.cpp@0c1e5709 (vendored by llama-cpp-python 0.3.36)"
_ARG = "common/arg.cpp"
#: the tensors --n-cpu-moe / --cpu-moe match (common/common.h:1198): one layer's routed experts
LLAMA_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


def _cpu_moe_layers(policy: Policy, ctx: Context) -> int:
    """MoE layers whose experts stay on the CPU (whole layers: --n-cpu-moe)."""
    layers = moe_layers(ctx)
    return layers if not policy.ffn_on_gpu else round((1.0 - policy.weights_gpu_ratio) * layers)


def _engine_runs(num_micro_batches: int) -> bool:
    """HRM's ``llama.cpp`` / ``llama.cpp-nkvo`` engines run one ubatch per step; policies of
    several ubatches are estimated with the plan's engine."""
    return num_micro_batches == 1


def _hrm_engine(policy: Policy) -> str | None:
    """KV cache and attention on the GPU: ``llama.cpp``; -nkvo (in host memory): ``llama.cpp-nkvo``."""
    if not _engine_runs(policy.num_micro_batches):
        return None
    return "llama.cpp" if policy.attn_on_gpu else "llama.cpp-nkvo"


def _layers_policy(policy: Policy, ctx: Context, cpu_layers: int, attn_gpu: bool) -> Policy | None:
    layers = moe_layers(ctx)
    rw = (layers - cpu_layers) / layers
    fields = with_fields(policy, attn_on_gpu=attn_gpu, kv_gpu_ratio=1.0 if attn_gpu else 0.0, weights_gpu_ratio=rw)
    # the llama.cpp engine's ffn=gpu with r_w = share of GPU layers (r_w = 0: every layer's
    # experts computed on the CPU); elsewhere every layer on the CPU is ffn=cpu
    fields["ffn_on_gpu"] = rw > 0 or _engine_runs(fields["num_micro_batches"])
    return make_policy(**fields)


def _nearest(policy: Policy, ctx: Context) -> list[Policy]:
    # the KV cache is on the GPU whole (attention there) or, with -nkvo, in host memory
    # (attention on the CPU): rc is 1 or 0
    layers = moe_layers(ctx)
    counts = nearest_counts(layers if not policy.ffn_on_gpu else (1.0 - policy.weights_gpu_ratio) * layers)
    tiers = [True, False] if policy.attn_on_gpu and policy.kv_gpu_ratio < 1 else [policy.attn_on_gpu]
    return [p for p in (_layers_policy(policy, ctx, c, a) for a in tiers for c in counts) if p]


def _render(policy: Policy, ctx: Context) -> dict[str, list[str]]:
    cpu_layers = _cpu_moe_layers(policy, ctx)  # exact for a policy from _nearest
    # --n-cpu-moe N matches blk.0 .. blk.N-1: dense first layers (DeepSeek) count as blocks
    blocks = cpu_layers + int(ctx.model.first_dense_layers) if cpu_layers else 0
    out = {"-m": ["MODEL.gguf"],
           "-ngl": [str(int(ctx.model.num_layers) + 1)],  # every block and the output layer
           "--n-cpu-moe": [str(blocks)],
           "-np": [str(policy.batch_size)],
           "-ub": [str(policy.micro_batch_size)],
           "-c": [str(policy.batch_size * context_tokens(ctx))],  # the slots share -c
           "--fit": ["off"]}  # keep these values (--fit on would adjust unset ones to memory)
    if policy.micro_batch_size > 2048:  # -b (default 2048) must hold one ubatch
        out["-b"] = [str(policy.micro_batch_size)]
    if not policy.attn_on_gpu:
        out["-nkvo"] = []
    return out


def _ot_cpu_layers(patterns: list[str], ctx: Context) -> set[int]:
    """Blocks whose expert tensors an -ot pattern sends to the CPU: each pattern is matched
    (regex search, as llama.cpp does) against the expert tensor names of every block."""
    cpu = set()
    for text in patterns:
        for item in text.split(","):
            if "=" not in item:
                raise HRMError(f"-ot {item!r}: expected <tensor name pattern>=<buffer type>")
            pattern, buffer = item.rsplit("=", 1)
            try:
                regex = re.compile(pattern)
            except re.error as exc:
                raise HRMError(f"-ot {pattern!r}: not a regular expression ({exc})") from None
            if buffer.strip().upper() != "CPU":
                continue
            for block in range(int(ctx.model.num_layers)):
                if any(regex.search(f"blk.{block}.ffn_{part}_exps.weight") for part in ("up", "down", "gate")):
                    cpu.add(block)
    return cpu


def _check_all_layers_on_gpu(values: dict[str, list[str]], model) -> None:
    """-ngl below the layer count puts whole layers on the CPU: outside HRM's policy space."""
    if "-ngl" not in values:
        return
    text = values["-ngl"][0]
    if text == "auto":
        raise HRMError("-ngl auto: llama.cpp then fits the layers to memory itself; give a number or all")
    if text != "all":
        ngl = int_value(values, "-ngl", LAYERS)
        if ngl < model.num_layers:
            raise HRMError(f"-ngl {ngl}: {model.num_layers - ngl} whole layers on the CPU are outside HRM's "
                           f"policy space (give -ngl {model.num_layers + 1} or all)")


def _parse(values: dict[str, list[str]], ctx: Context) -> tuple[Policy, list[str]]:
    model = ctx.model
    _check_all_layers_on_gpu(values, model)
    big = int_value(values, "-np", bounds.SEQUENCES, 1)
    ub = min(int_value(values, "-ub", bounds.SEQUENCES, 512), big)  # -ub default 512 (arg.cpp:1676)
    if big % ub:
        raise HRMError(f"-np {big} is not a multiple of -ub {ub}: HRM's batch is N = mu x n micro-batches")
    int_value(values, "-c", CONTEXT)
    cpu_blocks = set(range(int(model.num_layers))) if "-cmoe" in values else set()
    if "--n-cpu-moe" in values:
        cpu_blocks |= set(range(int_value(values, "--n-cpu-moe", LAYERS)))
    cpu_blocks |= _ot_cpu_layers(values.get("-ot", []), ctx)
    moe_blocks = set(range(int(model.first_dense_layers), int(model.num_layers)))
    cpu_layers = len(cpu_blocks & moe_blocks)
    attn_gpu = "-nkvo" not in values
    policy = _layers_policy(Policy(batch_size=big, micro_batch_size=ub, num_micro_batches=big // ub), ctx,
                            cpu_layers, attn_gpu)
    return policy, []


LLAMA_CPP = EngineFlags(
    name="llama.cpp", version=LLAMA_CPP_VERSION, programs=("llama-server",),
    engines=("llama.cpp", "llama.cpp-nkvo"), hrm_engine=_hrm_engine,
    description="llama.cpp llama-server: experts kept on the CPU per whole layer, KV on the GPU or the host",
    flags=(
        FlagSpec(flag="-m", aliases=("--model",), policy_field="(model)", value_form=r"\S+",
                 source=f"{_ARG} (-m, --model)"),
        FlagSpec(flag="-ngl", aliases=("--gpu-layers", "--n-gpu-layers"), policy_field="(all layers on the GPU)",
                 value_form=r"\d+|all|auto", source=f"{_ARG}:2789-2801"),
        FlagSpec(flag="--n-cpu-moe", aliases=("-ncmoe",), policy_field="weights_gpu_ratio, ffn_on_gpu (whole layers)",
                 source=f"{_ARG}:2767-2774; common/common.h:1198-1217"),
        FlagSpec(flag="-cmoe", aliases=("--cpu-moe",), policy_field="ffn_on_gpu (all experts on the CPU)", values=0,
                 source=f"{_ARG}:2760-2765"),
        FlagSpec(flag="-ot", aliases=("--override-tensor",), policy_field="weights_gpu_ratio (expert tensors =CPU)",
                 value_form=r"[^=,]+=[A-Za-z0-9_]+(,[^=,]+=[A-Za-z0-9_]+)*", repeatable=True,
                 source=f"{_ARG}:2754-2758"),
        FlagSpec(flag="-nkvo", aliases=("--no-kv-offload",), values=0,
                 policy_field="attn_on_gpu, kv_gpu_ratio (KV in host memory)", source=f"{_ARG}:2414-2420"),
        FlagSpec(flag="-np", aliases=("--parallel",), policy_field="batch_size (server slots)",
                 source=f"{_ARG}:2544-2552"),
        FlagSpec(flag="-ub", aliases=("--ubatch-size",), policy_field="micro_batch_size", source=f"{_ARG}:1676-1682"),
        FlagSpec(flag="-b", aliases=("--batch-size",), policy_field="(logical batch >= -ub)",
                 source=f"{_ARG}:1669-1675"),
        FlagSpec(flag="-c", aliases=("--ctx-size",), policy_field="batch_size x (max prompt + gen) tokens",
                 source=f"{_ARG}:1639-1648"),
        FlagSpec(flag="--fit", aliases=("-fit",), policy_field="(off: keep the given values)", value_form=r"on|off",
                 source=f"{_ARG}:2868-2880"),
    ),
    passthrough={**HTTP_SERVER_FLAGS, "-fa": 1, "--flash-attn": 1, "-t": 1, "--threads": 1, "-ctk": 1, "-ctv": 1,
                 "--no-mmap": 0, "--mlock": 0, "-hf": 1, "--jinja": 0},
    caveats=("re-estimated with HRM's llama.cpp engine (llama.cpp-nkvo with -nkvo: experts of CPU layers run on the "
             "CPU below 32 tokens per ubatch, their used experts copied to the GPU above) when one ubatch holds "
             "the batch; several ubatches are estimated with the plan's engine",
             "-ub is also the prefill chunk: a small micro-batch slows the prompt phase"),
    nearest=_nearest, render=_render, parse=_parse,
)
