"""vLLM (``vllm serve``): one forward pass per step over every running sequence, attention and
the KV cache on the GPU, the routed experts of the first layers offloaded to pinned host
memory (``--cpu-offload-gb`` with ``--cpu-offload-params experts``) and read over UVA in
every pass. Its policy space and mechanisms: the shipped ``vllm`` engine
(``hrm/data/engines/vllm.yaml``); the flags, defaults and start-up checks with their
file:line: ``docs/engines/vllm.md``."""

from __future__ import annotations

import math
from typing import Optional

from .. import bounds
from ..errors import HRMError
from ..policy import Policy
from ..units import GIB
from .target import Context, EngineFlags, FlagSpec
from .values import (HTTP_SERVER_FLAGS, OFFLOAD_GIB, context_tokens, expert_bytes, float_value, int_value, moe_layers,
                     nearest_counts, one_batch, server_notes, suffixed_int, within_context)

VLLM_VERSION = "vllm 0.33.0 (commit 4ba787ec9)"
_ARGS = "vllm/engine/arg_utils.py"
_SCHED = "vllm/config/scheduler.py"
_UVA = "vllm/model_executor/offloader/uva.py"

#: vllm/utils/argparse_utils.py:30-74 (human_readable_int): k m g t decimal, K M G T binary
#: (no decimals with a binary suffix)
VLLM_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
#: vllm/config/cache.py:215: --gpu-memory-utilization default
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
#: arg_utils.py:2970-3006 get_batch_defaults, OPENAI_API_SERVER context: (GiB of device memory
#: from which the tier applies, whether an A100 is excluded, max_num_batched_tokens, max_num_seqs)
BATCH_DEFAULT_TIERS = ((160.0, False, 16384, 1024), (70.0, True, 8192, 1024), (0.0, False, 2048, 256))
#: --cpu-offload-params segments that select routed-expert parameters only, and which of a
#: fused-MoE layer's two parameters (w13 = gate+up, then w2 = down) each selects
#: (config/offload.py:34-44: whole dotted segments of the parameter name)
EXPERT_SEGMENTS = {"experts": ("w13", "w2"), "experts.w13_weight": ("w13",), "w13_weight": ("w13",),
                   "experts.w2_weight": ("w2",), "w2_weight": ("w2",)}
#: share of a layer's expert bytes in w13 (gate and up) and w2 (down): three equal matrices
EXPERT_PARAM_SHARES = {"w13": 2 / 3, "w2": 1 / 3}
#: flags of mechanisms HRM's vllm engine does not model: the values that keep them off (each
#: flag's default) and why another value is refused
UNMODELLED = {
    "--pipeline-parallel-size": (("1",), "pipeline parallelism splits the layers between GPUs"),
    "--data-parallel-size": (("1",), "data parallelism runs one engine per GPU"),
    "--enable-expert-parallel": ((), "expert parallelism places whole experts per GPU"),
    "--offload-group-size": (("0",), "the prefetch offloader (groups of layers, async copies) is another mechanism"),
    "--offload-backend": (("auto", "uva"), "the prefetch offloader is another mechanism"),
    "--kv-offloading-size": ((), "a host KV cache tier is not modelled (the KV cache is on the GPU)"),
}


def _batch_defaults(ctx: Context) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM's server picks for the machine's GPU."""
    gpu = getattr(ctx.hardware, "gpu", None)
    memory_gib = float(gpu.memory_gib) if gpu is not None else 0.0
    is_a100 = gpu is not None and "a100" in gpu.name.lower()
    for floor_gib, not_a100, tokens, seqs in BATCH_DEFAULT_TIERS:
        if memory_gib >= floor_gib and not (not_a100 and is_a100):
            return tokens, seqs
    return BATCH_DEFAULT_TIERS[-1][2:]


def _layer_expert_bytes_per_gpu(ctx: Context) -> float:
    return expert_bytes(ctx) / moe_layers(ctx) / ctx.gpu_count


def offloaded_layers(policy: Policy, ctx: Context) -> int:
    """MoE layers whose experts a policy offloads, as the engine realises r_w (whole layers,
    ``int(L·r_w)`` on the GPU: hrm.engines.space.snap_weights_ratio)."""
    layers = moe_layers(ctx)
    return layers - (int(layers * policy.weights_gpu_ratio + 1e-9) if policy.ffn_on_gpu else 0)


def offload_gib(policy: Policy, ctx: Context) -> float:
    """--cpu-offload-gb for the policy: the experts of its offloaded layers per GPU, rounded
    down to 0.01 GiB. vLLM offloads whole parameters until the budget is reached
    (uva.py:84-94), so any budget above the bytes less the last layer's w2 offloads exactly
    these layers: rounding down by under 0.01 GiB keeps above that."""
    target = offloaded_layers(policy, ctx) * _layer_expert_bytes_per_gpu(ctx) / GIB
    return max(math.floor(round(target * 100, 6)) / 100, 0.01) if target > 0 else 0.0


def batched_tokens(policy: Policy, ctx: Context) -> int:
    """--max-num-batched-tokens for a plan of N sequences: the plan's prefill batch (N prompts
    of the workload's length, at least the longest: hrm.cost.memory.prefill_tokens) in one step,
    and never below N (scheduler.py:331: max_num_batched_tokens >= max_num_seqs)."""
    from ..cost.memory import prefill_tokens

    return max(policy.batch_size, int(math.ceil(float(prefill_tokens(ctx.workload, policy.batch_size)))))


def _refuse_cpu_attention(policy: Policy) -> None:
    if not policy.attn_on_gpu:
        raise HRMError("vllm cannot run attention on the CPU (attn=cpu): vLLM keeps attention and the KV cache "
                       "on the GPU; re-plan for it: hrm-search ... --engine vllm")


def _nearest(policy: Policy, ctx: Context) -> list[Policy]:
    _refuse_cpu_attention(policy)
    layers = moe_layers(ctx)
    counts = nearest_counts(layers * policy.weights_gpu_ratio if policy.ffn_on_gpu else 0.0)
    # whole layers of experts on the GPU, the rest read over UVA; one pass, the KV cache on the GPU
    candidates = [one_batch(policy, attn_on_gpu=True, kv_gpu_ratio=1.0, ffn_on_gpu=True, weights_gpu_ratio=c / layers)
                  for c in counts]
    return [p for p in candidates if p]


def _render(policy: Policy, ctx: Context) -> dict[str, list[str]]:
    _refuse_cpu_attention(policy)
    out = {"serve": ["MODEL"]}
    gib = offload_gib(policy, ctx)
    if gib > 0:
        out["--cpu-offload-gb"] = [f"{gib:.2f}"]
        out["--cpu-offload-params"] = ["experts"]
    out.update({"--max-num-seqs": [str(policy.batch_size)],
                "--max-num-batched-tokens": [str(batched_tokens(policy, ctx))],
                "--max-model-len": [str(context_tokens(ctx))],
                "--gpu-memory-utilization": [f"{ctx.gpu_memory_utilization:.2f}"],
                "-tp": [str(ctx.gpu_count)]})
    return out


def _max_model_len(values: dict[str, list[str]]) -> Optional[int]:
    """--max-model-len (None: absent or auto/-1, the model's own window or what fits)."""
    if "--max-model-len" not in values or values["--max-model-len"][0].strip().lower() in ("auto", "-1"):
        return None
    return suffixed_int(values, "--max-model-len", VLLM_SUFFIXES, bounds.TOKENS, whole_only=("K", "M", "G", "T"))


def scheduler_limits(values: dict[str, list[str]], ctx: Context) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) as vLLM resolves them (arg_utils.py:3151-3240),
    refused with vLLM's own start-up checks (scheduler.py:317-335)."""
    default_tokens, default_seqs = _batch_defaults(ctx)
    model_len = _max_model_len(values) or int(getattr(ctx.model, "max_context_len", None) or context_tokens(ctx))
    chunked = "--no-enable-chunked-prefill" not in values
    seqs = int_value(values, "--max-num-seqs", bounds.SEQUENCES)
    tokens = suffixed_int(values, "--max-num-batched-tokens", VLLM_SUFFIXES, bounds.SEQUENCES,
                          whole_only=("K", "M", "G", "T"))
    if tokens is None:
        tokens = default_tokens if chunked else max(model_len, default_tokens)
        tokens = min((seqs or default_seqs) * model_len, tokens)
    if seqs is None:
        seqs = min(default_seqs, tokens)
    if not chunked and tokens < model_len:
        raise HRMError(f"vllm: --max-num-batched-tokens {tokens} is smaller than --max-model-len {model_len} without "
                       f"chunked prefill: vLLM refuses to start ({_SCHED}:318-329)")
    if tokens < seqs:
        raise HRMError(f"vllm: --max-num-batched-tokens {tokens} is below --max-num-seqs {seqs}: vLLM refuses to "
                       f"start ({_SCHED}:331-335: max_num_batched_tokens must be >= max_num_seqs)")
    return seqs, tokens


def _expert_kinds(values: dict[str, list[str]]) -> tuple[str, ...] | None:
    """The fused-MoE parameters --cpu-offload-params selects (None: absent, every parameter)."""
    if "--cpu-offload-params" not in values:
        return None
    kinds: set[str] = set()
    for segment in values["--cpu-offload-params"]:
        if segment not in EXPERT_SEGMENTS:
            raise HRMError(f"vllm: --cpu-offload-params {segment}: HRM's vllm engine offloads routed experts only "
                           f"(give experts; {', '.join(EXPERT_SEGMENTS)} select expert parameters)")
        kinds |= set(EXPERT_SEGMENTS[segment])
    return tuple(k for k in EXPERT_PARAM_SHARES if k in kinds)


def offloaded_expert_bytes(gib: float, kinds: tuple[str, ...], ctx: Context) -> float:
    """Expert bytes per GPU vLLM offloads for a budget of ``gib`` GiB over the selected
    parameters: layer by layer, whole parameters, until the budget is reached (uva.py:84-125)."""
    budget, done = gib * GIB, 0.0
    layer = _layer_expert_bytes_per_gpu(ctx)
    for _ in range(moe_layers(ctx)):
        for kind in kinds:
            if done >= budget:
                return done
            done += EXPERT_PARAM_SHARES[kind] * layer
    return done


def _weights_ratio(values: dict[str, list[str]], ctx: Context) -> tuple[float, list[str]]:
    gib = float_value(values, "--cpu-offload-gb", OFFLOAD_GIB, 0.0)
    kinds = _expert_kinds(values)
    total = expert_bytes(ctx)
    if kinds is None:  # every parameter of the first layers, attention too: read as the same bytes of experts
        offloaded = gib * GIB * ctx.gpu_count
        if offloaded > total:
            raise HRMError(f"vllm: --cpu-offload-gb {gib:g} without --cpu-offload-params offloads more than the routed "
                           f"experts ({total / GIB / ctx.gpu_count:.2f} GiB per GPU): HRM's vllm engine streams "
                           "experts only; give --cpu-offload-params experts")
        notes = [f"--cpu-offload-gb {gib:g} without --cpu-offload-params offloads every parameter of the first layers "
                 f"in module order ({_UVA}:84-125); read as the same bytes of routed experts"] if gib else []
        return 1.0 - offloaded / total if total else 1.0, notes
    offloaded = offloaded_expert_bytes(gib, kinds, ctx) * ctx.gpu_count
    return max(0.0, 1.0 - offloaded / total) if total else 1.0, []


def _parse(values: dict[str, list[str]], ctx: Context) -> tuple[Policy, list[str]]:
    named = (values.get("serve") or values.get("--model") or [None])[0]
    notes = server_notes(values, ctx, engine="vllm", model=named, unmodelled=UNMODELLED, tp_flag="-tp",
                         memory_flag="--gpu-memory-utilization")
    seqs, _ = scheduler_limits(values, ctx)
    rw, offload_notes = _weights_ratio(values, ctx)
    policy = Policy(batch_size=seqs, micro_batch_size=seqs, num_micro_batches=1, attn_on_gpu=True, ffn_on_gpu=True,
                    weights_gpu_ratio=rw, kv_gpu_ratio=1.0)
    if "--max-num-seqs" not in values:
        notes.append(f"no --max-num-seqs: vLLM's default {seqs} for this GPU ({_ARGS}:2940-3039)")
    return policy, notes + offload_notes


def prefill_budget(values: dict[str, list[str]], ctx: Context) -> dict:
    """The engine field the command sets: its step's token budget bounds every prefill pass
    (config/scheduler.py:48,134: prompt chunks and decode tokens share max_num_batched_tokens;
    without chunked prefill whole prompts still fill at most the budget), so a command's
    prompts take ⌈N·s / budget⌉ passes, each reading the offloaded experts over UVA again."""
    _, tokens = scheduler_limits(values, ctx)
    return {"prefill.max_tokens_per_pass": tokens}


def command_workload(values: Optional[dict[str, list[str]]], ctx: Context):
    """The workload vLLM serves: the plan's (vLLM pads nothing); for a command, the HRM
    workload bounded by --max-model-len (prompt + output per sequence; longer requests are
    refused by the server): a workload whose longest sequence exceeds it is an error."""
    if values is None:
        return ctx.workload
    return within_context(ctx, _max_model_len(values), "--max-model-len", "vllm")


def _flag(flag: str, field: str, source: str, **kw) -> FlagSpec:
    return FlagSpec(flag=flag, policy_field=field, source=source, **kw)


_SUFFIXED = r"\d+(\.\d+)?[kmgtKMGT]?"
_FRACTION = r"0?\.\d+|1(\.0+)?"
VLLM_FLAGS = (  # vllm/engine/arg_utils.py (EngineArgs.add_cli_args) and entrypoints/common/cli_args.py
    _flag("serve", "(model: vllm serve MODEL)", "vllm/entrypoints/cli/serve.py:56-57,169; "
          "entrypoints/common/cli_args.py:438-443 (model_tag, nargs='?')", value_form=r"[^-]\S*", until_next_flag=True),
    _flag("--model", "(model)", f"{_ARGS}:969", value_form=r"\S+"),
    _flag("--max-model-len", "workload: longest prompt + output", f"{_ARGS}:991; vllm/config/model.py:249-261",
          value_form=rf"{_SUFFIXED}|auto|-1"),
    _flag("-tp", "(hardware: GPU count)", f"{_ARGS}:1209; vllm/config/parallel.py:142", aliases=("--tensor-parallel-size",)),
    _flag("--pipeline-parallel-size", "(refused above 1)", f"{_ARGS}:1170-1174", aliases=("-pp",)),
    _flag("--data-parallel-size", "(refused above 1)", f"{_ARGS}:1241", aliases=("-dp",)),
    _flag("--enable-expert-parallel", "(refused)", f"{_ARGS}:1304-1308", aliases=("-ep",), values=0),
    _flag("--gpu-memory-utilization", "(GPU memory fraction)", f"{_ARGS}:1388-1393; vllm/config/cache.py:215",
          aliases=("--device-memory-utilization",), value_form=_FRACTION),
    _flag("--kv-offloading-size", "(refused)", f"{_ARGS}:1452-1454", value_form=r"\S+"),
    _flag("--offload-backend", "(uva only)", f"{_ARGS}:1467-1469; vllm/config/offload.py:83-89",
          value_form=r"auto|uva|prefetch"),
    _flag("--cpu-offload-gb", "weights_gpu_ratio (GiB of expert weights per GPU in pinned memory)",
          f"{_ARGS}:1470; vllm/config/offload.py:23-32; {_UVA}:74-125", value_form=r"\d+(\.\d+)?"),
    _flag("--cpu-offload-params", "(which parameters: experts)", f"{_ARGS}:1471-1473; vllm/config/offload.py:34-44",
          value_form=r"[A-Za-z0-9_.]+", until_next_flag=True),
    _flag("--offload-group-size", "(refused)", f"{_ARGS}:1474-1477; vllm/config/offload.py:54-60"),
    _flag("--max-num-batched-tokens", "(tokens per step >= batch_size; chunked prefill)",
          f"{_ARGS}:1739-1745; {_SCHED}:48,331", value_form=_SUFFIXED),
    _flag("--max-num-seqs", "batch_size", f"{_ARGS}:1753-1759; {_SCHED}:62"),
    _flag("--enable-chunked-prefill", "(default on)", f"{_ARGS}:1784-1790; {_SCHED}:134", values=0),
    _flag("--no-enable-chunked-prefill", "(max_num_batched_tokens >= max_model_len)", f"{_ARGS}:1784-1790 "
          "(BooleanOptionalAction)", values=0),
)

VLLM = EngineFlags(
    name="vllm", version=VLLM_VERSION, programs=("vllm",),
    # vllm.entrypoints.api_server: the older demo server over the same engine arguments
    # (AsyncEngineArgs.add_cli_args)
    import_programs=("python -m vllm.entrypoints.openai.api_server", "python3 -m vllm.entrypoints.openai.api_server",
                     "python -m vllm.entrypoints.api_server"),
    engines=("vllm",), hrm_engine=lambda policy: "vllm", engine_fields=prefill_budget,
    description="vLLM serve: one forward pass per step, GPU attention, experts of the first layers read over UVA",
    flags=VLLM_FLAGS,
    passthrough={**HTTP_SERVER_FLAGS, "--dtype": 1, "--quantization": 1, "-q": 1, "--kv-cache-dtype": 1,
                 "--enforce-eager": 0, "--trust-remote-code": 0, "--served-model-name": 1, "--tokenizer": 1,
                 "--tokenizer-mode": 1, "--download-dir": 1, "--seed": 1, "--block-size": 1, "--disable-log-stats": 0,
                 "--api-key": 1, "--enable-prefix-caching": 0, "--no-enable-prefix-caching": 0,
                 "--uvicorn-log-level": 1, "--load-format": 1, "--revision": 1, "--chat-template": 1,
                 "--enable-auto-tool-choice": 0, "--tool-call-parser": 1, "--reasoning-parser": 1,
                 "--generation-config": 1, "--distributed-executor-backend": 1, "--disable-custom-all-reduce": 0},
    caveats=("vLLM prefills in chunks of --max-num-batched-tokens tokens per step, each step reading the offloaded "
             "experts again; HRM's prefill is one pass (printed: the plan's prefill batch as the budget)",
             "offloaded experts are read over UVA inside their layer's kernels: HRM's vllm engine charges the "
             "link time after the compute (serial), an upper bound"),
    workload=command_workload, nearest=_nearest, render=_render, parse=_parse,
)
