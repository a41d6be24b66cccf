"""MoE-Lightning artifact (caoshiyi/artifacts ``fastmoe``): a server, then the mtbench client
with the batch. Its policy space: the shipped ``moe-lightning`` engine."""

from __future__ import annotations


from .. import bounds
from ..errors import HRMError
from ..policy import Policy
from ..units import GIB
from .target import Context, EngineFlags, FlagSpec
from .values import HTTP_SERVER_FLAGS, float_value, int_value, make_policy, with_fields

MOE_LIGHTNING_VERSION = "caoshiyi/artifacts@6bc86009 (branch asplos25)"
_FM_ARGS = "fastmoe/serve/server_args.py"
_FM_BENCH = "benchmarks/mtbench/bench.py"


def _nearest(policy: Policy, ctx: Context) -> list[Policy]:
    # the artifact's optimizer fixes gattn = 0 (fastmoe/backend/optimizer.py:17): attention on
    # the CPU, the KV cache in CPU memory; experts on the GPU (fused Triton MoE), whole experts
    # per layer (execution_engine.py:513: int(num_local_experts * wg))
    experts = max(int(ctx.model.num_experts), 1)
    rw = 0.0 if not policy.ffn_on_gpu else int(experts * policy.weights_gpu_ratio + 1e-9) / experts
    return [p for p in [make_policy(**with_fields(policy, attn_on_gpu=False, ffn_on_gpu=True, kv_gpu_ratio=0.0,
                                                  weights_gpu_ratio=rw))] if p]


def _render(policy: Policy, ctx: Context) -> dict[str, list[str]]:
    out = {"--model-path": ["MODEL"], "--avg-prompt-len": [str(ctx.workload.prompt_len)],
           "--gen-len": [str(ctx.workload.gen_len)]}
    hw = ctx.hardware
    if hw is not None:
        # the artifact multiplies --cpu-mem-bdw by GB = 1 << 30 (fastmoe/backend/utils.py:7,44)
        out["--cpu-mem-bdw"] = [f"{hw.cpu.memory_bandwidth_gbps * 1e9 / GIB:.1f}"]
    if ctx.gpu_count > 1:
        out["--tp-size"] = [str(ctx.gpu_count)]
    out.update({"--max-new-tokens": [str(ctx.workload.gen_len)], "--ubs": [str(policy.micro_batch_size)],
                "--n-ub": [str(policy.num_micro_batches)]})
    return out


def _parse(values: dict[str, list[str]], ctx: Context) -> tuple[Policy, list[str]]:
    if "--ubs" not in values or "--n-ub" not in values:
        raise HRMError("moe-lightning: give --ubs and --n-ub (the micro-batch size and count of bench.py)")
    mu = int_value(values, "--ubs", bounds.SEQUENCES)
    n = int_value(values, "--n-ub", bounds.SEQUENCES)
    float_value(values, "--cpu-mem-bdw", bounds.BANDWIDTH_GBPS)
    big = bounds.SEQUENCES.check(mu * n, "--ubs x --n-ub")
    notes = ["moe-lightning: r_w is picked by the artifact's optimizer at launch (no flag sets it); "
             "imported as rw=0"]
    return make_policy(batch_size=big, micro_batch_size=mu, num_micro_batches=n, attn_on_gpu=False, ffn_on_gpu=True,
                       weights_gpu_ratio=0.0, kv_gpu_ratio=0.0), notes


MOE_LIGHTNING = EngineFlags(
    name="moe-lightning", version=MOE_LIGHTNING_VERSION,
    engines=("moe-lightning",), hrm_engine=lambda p: "moe-lightning",
    description="MoE-Lightning artifact (fastmoe): server, then the mtbench client with the batch",
    programs=("python -m fastmoe.serve.launch_server", "python benchmarks/mtbench/bench.py"),
    client_flags=("--max-new-tokens", "--ubs", "--n-ub"),  # bench.py's (benchmarks/mtbench/bench.py:11-13)
    flags=(
        FlagSpec(flag="--model-path", policy_field="(model)", value_form=r"\S+", source=f"{_FM_ARGS}:50"),
        FlagSpec(flag="--avg-prompt-len", policy_field="workload.prompt_len", source=f"{_FM_ARGS}:114"),
        FlagSpec(flag="--gen-len", policy_field="workload.gen_len", source=f"{_FM_ARGS}:120"),
        FlagSpec(flag="--cpu-mem-bdw", policy_field="(hardware: CPU memory bandwidth, GiB/s)",
                 value_form=r"\d+(\.\d+)?", source=f"{_FM_ARGS}:108; fastmoe/backend/utils.py:7,44 (x 2^30)"),
        FlagSpec(flag="--tp-size", policy_field="(hardware: GPU count)", source=f"{_FM_ARGS}:138"),
        FlagSpec(flag="--max-new-tokens", policy_field="workload.gen_len", source=f"{_FM_BENCH}:11"),
        FlagSpec(flag="--ubs", policy_field="micro_batch_size", source=f"{_FM_BENCH}:12"),
        FlagSpec(flag="--n-ub", policy_field="num_micro_batches", source=f"{_FM_BENCH}:13"),
    ),
    passthrough={**HTTP_SERVER_FLAGS, "--mem-fraction-static": 1, "--tokenizer-path": 1, "--trust-remote-code": 0},
    # r_w is the artifact optimizer's: no flag carries it
    expressed_fields=("batch_size", "micro_batch_size", "num_micro_batches", "attn_on_gpu", "ffn_on_gpu",
                      "kv_gpu_ratio"),
    caveats=("the server picks its own policy with its optimizer at launch (fastmoe/backend/execution_engine.py:488); "
             "the flags set the workload it optimises for and the batch the client sends (ubs x n_ub requests); "
             "r_w is the optimizer's, not settable",
             "attention runs on the CPU (fastmoe/backend/optimizer.py:17: gattn = 0)"),
    nearest=_nearest, render=_render, parse=_parse,
)
