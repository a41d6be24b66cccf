"""Plans as other engines' command lines, and back (issue 15).

``export_plan(plan, "llama.cpp")`` turns a plan into the flags that make a real engine run
its policy; ``import_flags("llama.cpp", "-np 64 -ub 16 --n-cpu-moe 20", model, ...)`` reads
such flags back into a :class:`~hrm.policy.Policy`. Each engine is one entry of
:data:`EXPORTERS`: a table of the flags it takes (each with the policy field it carries, the
engine version it was checked against and the file:line of the engine's argument parser),
the policy fields its flags can set, the closest shipped HRM engine to re-estimate with, and
three small functions — ``nearest`` (the policies the engine can express near a wanted one),
``render`` (a policy as flag values) and ``parse`` (flag values as a policy).

An engine can express only part of HRM's policy space (FlexGen's ``--percent`` is whole
percent; llama.cpp keeps experts on the CPU per whole layer; vLLM has no CPU attention). A
plan it cannot express exactly is exported with the nearest policy it can, re-estimated,
and the difference stated (:class:`Export`).
"""

from __future__ import annotations

import math
import re
import shlex
from typing import Callable, Literal, Optional

from pydantic import BaseModel, ConfigDict

from . import bounds
from .errors import HRMError
from .policy import Policy, policy_problem
from .units import GIB

# --- the mapping tables -------------------------------------------------------------------


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


class FlagSpec(_Frozen):
    """One flag of an engine: its spellings, the policy field (or input) it carries, how many
    value tokens follow it, the documented form of each token (a regex), and where that form
    was read."""

    flag: str
    aliases: tuple[str, ...] = ()
    policy_field: str
    values: int = 1  # value tokens after the flag (0: a switch)
    value_form: str = r"-?\d+"  # documented form of each value token (full match)
    checked_against: str
    source: str

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.flag, *self.aliases)


class Context(_Frozen):
    """What an engine's flags need besides the policy: the model, the workload, and the
    machine (GPU count, CPU memory bandwidth) and the GPU memory fraction."""

    model: object
    workload: object
    hardware: Optional[object] = None
    gpu_memory_utilization: float = 0.86
    #: what the policy's r_w is a share of: the routed experts (``ideal``, ``moe-lightning``:
    #: non-expert weights always on the GPU) or every layer weight (FlexGen's ``--percent``)
    rw_reads: Literal["experts", "all"] = "experts"

    @property
    def gpu_count(self) -> int:
        hw = self.hardware
        return int(hw.gpu.count) if hw is not None and getattr(hw, "gpu", None) is not None else 1


class EngineFlags(_Frozen):
    """An engine's flag table and its policy mapping (one entry of :data:`EXPORTERS`)."""

    name: str
    description: str
    #: the programs a run starts, with the placeholders the user fills in (MODEL ...)
    programs: tuple[str, ...]
    version: str
    flags: tuple[FlagSpec, ...]
    #: flags of the engine that carry no policy field: accepted by import, value tokens each
    passthrough: dict[str, int] = {}
    #: the policy fields the engine's flags set (round trips compare these)
    expressed_fields: tuple[str, ...]
    #: the shipped HRM engine closest to how it runs a policy (None, or returning None: the plan's engine)
    hrm_engine: Optional[Callable[[Policy], Optional[str]]] = None
    caveats: tuple[str, ...] = ()
    #: ``hrm-search --fix`` pins that keep a search inside the engine's policy space
    search_fix: str = ""
    nearest: Callable[[Policy, Context], list[Policy]]
    render: Callable[[Policy, Context], dict[str, list[str]]]
    parse: Callable[[dict[str, list[str]], Context], tuple[Policy, list[str]]]

    def spec(self, flag: str) -> FlagSpec:
        for item in self.flags:
            if flag in item.spellings:
                return item
        raise KeyError(flag)


class FlagValue(_Frozen):
    flag: str
    value: str
    policy_field: str
    checked_against: str
    source: str


class Export(_Frozen):
    """A plan as an engine's command lines, with the policy they express."""

    engine: str
    version: str
    commands: tuple[str, ...]
    flags: tuple[FlagValue, ...]
    planned_policy: Policy
    exported_policy: Policy
    exact: bool
    differences: tuple[str, ...]
    #: the HRM engine both policies were re-estimated with (None: not re-estimated)
    estimate_engine: Optional[str] = None
    planned_throughput_tok_s: Optional[float] = None
    exported_throughput_tok_s: Optional[float] = None
    exported_feasible: Optional[bool] = None
    caveats: tuple[str, ...] = ()
    search_fix: str = ""

    def to_json(self) -> dict:
        data = self.model_dump(mode="json")
        data["planned_policy"] = self.planned_policy.short()
        data["exported_policy"] = self.exported_policy.short()
        return data


# --- small helpers ----------------------------------------------------------------------


def _policy(**fields) -> Policy | None:
    """A Policy, or None when the fields break a policy rule (a candidate to drop)."""
    if policy_problem(fields):
        return None
    try:
        return Policy(**fields)
    except ValueError:
        return None


def _fields(policy: Policy, **update) -> dict:
    return {**dict(policy), **update}


def _one_batch(policy: Policy, **update) -> Policy | None:
    """The policy as an engine that runs the whole batch in one forward pass (n = 1)."""
    return _policy(**_fields(policy, micro_batch_size=policy.batch_size, num_micro_batches=1, **update))


def _int_value(values: dict[str, list[str]], flag: str, rng: bounds.Range, default=None) -> int | None:
    if flag not in values:
        return default
    text = values[flag][0]
    try:
        number = int(text)
    except ValueError:
        raise HRMError(f"{flag} {text!r}: expected an integer") from None
    return rng.check(number, flag)


def _float_value(values: dict[str, list[str]], flag: str, rng: bounds.Range, default=None) -> float | None:
    if flag not in values:
        return default
    text = values[flag][0]
    try:
        number = float(text)
    except ValueError:
        raise HRMError(f"{flag} {text!r}: expected a number") from None
    return rng.check(number, flag)


def _moe_layers(ctx: Context) -> int:
    return max(int(ctx.model.num_moe_layers), 1)


def _expert_bytes(ctx: Context) -> float:
    from .costs import total_expert_bytes

    return float(total_expert_bytes(ctx.model))


def _context_tokens(ctx: Context) -> int:
    return int(ctx.workload.max_prompt_len + ctx.workload.gen_len)


#: percent of a share; GiB of offloaded weights (per GPU)
PERCENT = bounds.Range(0, 100, "%", integer=True, why="a percentage")
OFFLOAD_GIB = bounds.Range(0.0, bounds.MAX_CPU_MEMORY_GIB, "GiB", why="weights offloaded per GPU")
EXPERTS = bounds.Range(0, 1 << 16, "experts", integer=True, why="experts of one layer")
LAYERS = bounds.Range(0, 1 << 16, "layers", integer=True, why="layers of one model")
CONTEXT = bounds.Range(0, bounds.MAX_CONTEXT_TOKENS * bounds.MAX_BATCH_SIZE, "tokens", integer=True)

# --- FlexGen (FlexLLMGen flex_opt.py) -----------------------------------------------------

FLEXGEN_VERSION = "FMInference/FlexLLMGen@004ffef8"
_FLEX = "flexllmgen/flex_opt.py"


def all_weights_ratio(policy: Policy, ctx: Context) -> float:
    """The policy's GPU share of every layer weight (FlexGen's wg): r_w itself when it already
    reads so, else the same offloaded bytes, (1 − r_w)·experts, as a share of all the layers'
    offloadable weights (:func:`hrm.latency.offloaded_layer_bytes` under ``--percent``)."""
    rw = policy.weights_gpu_ratio if policy.ffn_on_gpu else 0.0
    if ctx.rw_reads == "all":
        return rw
    from .engine import load_engine
    from .latency import layer_kinds, offloaded_layer_bytes

    every = load_engine("flexgen")  # offloaded_weights: all
    all_bytes = sum(count * float(offloaded_layer_bytes(ctx.model, every, moe)) for moe, count in layer_kinds(ctx.model))
    return max(0.0, 1.0 - (1.0 - rw) * _expert_bytes(ctx) / all_bytes) if all_bytes > 0 else rw


def _flexgen_nearest(policy: Policy, ctx: Context) -> list[Policy]:
    # --percent is whole percent of every weight (flex_opt.py:1291-1299), so r_w is first
    # re-read as a share of all layer weights; the experts always run on the GPU (FlexGen has
    # no CPU MLP); with --cpu-cache-compute the cache is on the CPU
    rws = _percent_neighbours(all_weights_ratio(policy, ctx))
    rcs = _percent_neighbours(policy.kv_gpu_ratio) if policy.attn_on_gpu else [0.0]
    out = [_policy(**_fields(policy, ffn_on_gpu=True, weights_gpu_ratio=rw, kv_gpu_ratio=rc)) for rw in rws for rc in rcs]
    return [p for p in out if p]


def _percent_neighbours(ratio: float) -> list[float]:
    """The whole percents next to ``ratio`` (itself when whole): rounding up may not fit memory."""
    low, high = math.floor(100 * ratio + 1e-9), math.ceil(100 * ratio - 1e-9)
    return sorted({low / 100, high / 100}, key=lambda r: abs(r - ratio))


def _flexgen_render(policy: Policy, ctx: Context) -> dict[str, list[str]]:
    wg, cg = round(100 * policy.weights_gpu_ratio), round(100 * policy.kv_gpu_ratio)
    out = {
        "--model": ["MODEL"],
        "--gpu-batch-size": [str(policy.micro_batch_size)],
        "--num-gpu-batches": [str(policy.num_micro_batches)],
        # activations stay on the GPU (hg=100): HRM keeps hidden states in GPU memory
        "--percent": [str(wg), str(100 - wg), str(cg), str(100 - cg), "100", "0"],
        # FlexGen pads every prompt to the longest (its --prompt-len is one length)
        "--prompt-len": [str(ctx.workload.max_prompt_len)],
        "--gen-len": [str(ctx.workload.gen_len)],
        # unpinned weights, as the shipped flexgen engine models them (the artifact's MoE runs)
        "--pin-weight": ["0"],
    }
    if not policy.attn_on_gpu:
        out["--cpu-cache-compute"] = []
    return out


def _flexgen_parse(values: dict[str, list[str]], ctx: Context) -> tuple[Policy, list[str]]:
    mu = _int_value(values, "--gpu-batch-size", bounds.SEQUENCES, 4)  # defaults: flex_opt.py:1289-1290
    n = _int_value(values, "--num-gpu-batches", bounds.SEQUENCES, 1)
    tokens = values.get("--percent", ["100", "0", "100", "0", "100", "0"])
    if len(tokens) != 6:
        raise HRMError(f"--percent: expected six integers (wg wc cg cc hg hc), got {len(tokens)}")
    shares = []
    for name, text in zip(("wg", "wc", "cg", "cc", "hg", "hc"), tokens):
        try:
            shares.append(PERCENT.check(int(text), f"--percent {name}"))
        except ValueError:
            raise HRMError(f"--percent {name} {text!r}: expected an integer") from None
    for (a, b), what in zip(((0, 1), (2, 3), (4, 5)), ("weights", "cache", "activations")):
        if shares[a] + shares[b] != 100:
            raise HRMError(f"--percent: the {what} shares {shares[a]} + {shares[b]} do not sum to 100 "
                           "(FlexGen's disk tier is outside HRM's policy space)")
    attn_cpu = "--cpu-cache-compute" in values
    if attn_cpu and shares[2]:
        raise HRMError(f"--percent cg {shares[2]} with --cpu-cache-compute: CPU attention reads the cache in CPU "
                       "memory (give cg 0)")
    notes = [] if shares[4] == 100 else [f"--percent hg {shares[4]}: activations on the CPU are not modelled "
                                         "(HRM keeps hidden states on the GPU)"]
    big = bounds.SEQUENCES.check(mu * n, "--gpu-batch-size x --num-gpu-batches")
    policy = _policy(batch_size=big, micro_batch_size=mu, num_micro_batches=n, attn_on_gpu=not attn_cpu,
                     ffn_on_gpu=True, weights_gpu_ratio=shares[0] / 100, kv_gpu_ratio=shares[2] / 100)
    return policy, notes


FLEXGEN = EngineFlags(
    search_fix="ffn=gpu",
    name="flexgen",
    description="FlexGen (FlexLLMGen flex_opt.py): zig-zag blocks, --percent splits every weight",
    programs=("python -m flexllmgen.flex_opt",),
    version=FLEXGEN_VERSION,
    flags=(
        FlagSpec(flag="--gpu-batch-size", policy_field="micro_batch_size", checked_against=FLEXGEN_VERSION,
                 source=f"{_FLEX}:1289"),
        FlagSpec(flag="--num-gpu-batches", policy_field="num_micro_batches", checked_against=FLEXGEN_VERSION,
                 source=f"{_FLEX}:1290"),
        FlagSpec(flag="--percent", policy_field="weights_gpu_ratio, kv_gpu_ratio (wg wc cg cc hg hc)", values=6,
                 value_form=r"\d{1,3}", checked_against=FLEXGEN_VERSION, source=f"{_FLEX}:1291-1299,1325"),
        FlagSpec(flag="--cpu-cache-compute", policy_field="attn_on_gpu (present: attention on the CPU)", values=0,
                 checked_against=FLEXGEN_VERSION, source=f"{_FLEX}:1304,273-274"),
        FlagSpec(flag="--pin-weight", policy_field="(engine mechanism: pinned weights)", value_form=r"0|1|true|false",
                 checked_against=FLEXGEN_VERSION, source=f"{_FLEX}:1302-1303"),
        FlagSpec(flag="--prompt-len", policy_field="workload.max_prompt_len (padded)", checked_against=FLEXGEN_VERSION,
                 source=f"{_FLEX}:1283"),
        FlagSpec(flag="--gen-len", policy_field="workload.gen_len", checked_against=FLEXGEN_VERSION,
                 source=f"{_FLEX}:1284"),
        FlagSpec(flag="--model", policy_field="(model)", value_form=r"\S+", checked_against=FLEXGEN_VERSION,
                 source=f"{_FLEX}:1276"),
    ),
    passthrough={"--path": 1, "--offload-dir": 1, "--cut-gen-len": 1, "--log-file": 1, "--no-log": 0,
                 "--verbose": 1, "--overlap": 1, "--sep-layer": 1},
    expressed_fields=("batch_size", "micro_batch_size", "num_micro_batches", "attn_on_gpu", "ffn_on_gpu",
                      "weights_gpu_ratio", "kv_gpu_ratio"),
    hrm_engine=lambda p: "flexgen" if p.attn_on_gpu else "flexgen-cpu-attn",
    caveats=("FlexLLMGen's flex_opt.py runs OPT models; MoE models run through the MoE-Lightning artifact's "
             "FlexGen port (benchmarks/flexgen), which takes the same flags",
             "--percent splits every weight of a layer, not only the routed experts: a plan's r_w (a share of "
             "the routed experts) is exported as the same offloaded bytes' share of all layer weights"),
    nearest=_flexgen_nearest,
    render=_flexgen_render,
    parse=_flexgen_parse,
)

# --- MoE-Lightning (caoshiyi/artifacts fastmoe) -------------------------------------------

MOE_LIGHTNING_VERSION = "caoshiyi/artifacts@6bc86009 (branch asplos25)"
_FM_ARGS = "fastmoe/serve/server_args.py"
_FM_BENCH = "benchmarks/mtbench/bench.py"


def _moe_lightning_nearest(policy: Policy, ctx: Context) -> list[Policy]:
    # the artifact's optimizer fixes gattn = 0 (fastmoe/backend/optimizer.py:17): attention on
    # the CPU, the KV cache in CPU memory; experts on the GPU (fused Triton MoE), whole experts
    # per layer (execution_engine.py:513: int(num_local_experts * wg))
    experts = max(int(ctx.model.num_experts), 1)
    rw = 0.0 if not policy.ffn_on_gpu else int(experts * policy.weights_gpu_ratio + 1e-9) / experts
    return [p for p in [_policy(**_fields(policy, attn_on_gpu=False, ffn_on_gpu=True, kv_gpu_ratio=0.0,
                                          weights_gpu_ratio=rw))] if p]


def _moe_lightning_render(policy: Policy, ctx: Context) -> dict[str, list[str]]:
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


def _moe_lightning_parse(values: dict[str, list[str]], ctx: Context) -> tuple[Policy, list[str]]:
    if "--ubs" not in values or "--n-ub" not in values:
        raise HRMError("moe-lightning: give --ubs and --n-ub (the micro-batch size and count of bench.py)")
    mu = _int_value(values, "--ubs", bounds.SEQUENCES)
    n = _int_value(values, "--n-ub", bounds.SEQUENCES)
    _float_value(values, "--cpu-mem-bdw", bounds.BANDWIDTH_GBPS)
    big = bounds.SEQUENCES.check(mu * n, "--ubs x --n-ub")
    notes = ["moe-lightning: r_w is picked by the artifact's optimizer at launch (no flag sets it); "
             "imported as rw=0"]
    return _policy(batch_size=big, micro_batch_size=mu, num_micro_batches=n, attn_on_gpu=False, ffn_on_gpu=True,
                   weights_gpu_ratio=0.0, kv_gpu_ratio=0.0), notes


MOE_LIGHTNING = EngineFlags(
    search_fix="attn=cpu rc=0 ffn=gpu",
    name="moe-lightning",
    description="MoE-Lightning artifact (fastmoe): server, then the mtbench client with the batch",
    programs=("python -m fastmoe.serve.launch_server", "python benchmarks/mtbench/bench.py"),
    version=MOE_LIGHTNING_VERSION,
    flags=(
        FlagSpec(flag="--model-path", policy_field="(model)", value_form=r"\S+", checked_against=MOE_LIGHTNING_VERSION,
                 source=f"{_FM_ARGS}:50"),
        FlagSpec(flag="--avg-prompt-len", policy_field="workload.prompt_len", checked_against=MOE_LIGHTNING_VERSION,
                 source=f"{_FM_ARGS}:114"),
        FlagSpec(flag="--gen-len", policy_field="workload.gen_len", checked_against=MOE_LIGHTNING_VERSION,
                 source=f"{_FM_ARGS}:120"),
        FlagSpec(flag="--cpu-mem-bdw", policy_field="(hardware: CPU memory bandwidth, GiB/s)",
                 value_form=r"\d+(\.\d+)?", checked_against=MOE_LIGHTNING_VERSION,
                 source=f"{_FM_ARGS}:108; fastmoe/backend/utils.py:7,44 (x 2^30)"),
        FlagSpec(flag="--tp-size", policy_field="(hardware: GPU count)", checked_against=MOE_LIGHTNING_VERSION,
                 source=f"{_FM_ARGS}:138"),
        FlagSpec(flag="--max-new-tokens", policy_field="workload.gen_len", checked_against=MOE_LIGHTNING_VERSION,
                 source=f"{_FM_BENCH}:11"),
        FlagSpec(flag="--ubs", policy_field="micro_batch_size", checked_against=MOE_LIGHTNING_VERSION,
                 source=f"{_FM_BENCH}:12"),
        FlagSpec(flag="--n-ub", policy_field="num_micro_batches", checked_against=MOE_LIGHTNING_VERSION,
                 source=f"{_FM_BENCH}:13"),
    ),
    passthrough={"--port": 1, "--host": 1, "--mem-fraction-static": 1, "--tokenizer-path": 1,
                 "--trust-remote-code": 0},
    expressed_fields=("batch_size", "micro_batch_size", "num_micro_batches", "attn_on_gpu", "ffn_on_gpu",
                      "kv_gpu_ratio"),
    hrm_engine=lambda p: "moe-lightning",
    caveats=("the server picks its own policy with its optimizer at launch (fastmoe/backend/execution_engine.py:488); "
             "the flags set the workload it optimises for and the batch the client sends (ubs x n_ub requests); "
             "r_w is the optimizer's, not settable",
             "attention runs on the CPU (fastmoe/backend/optimizer.py:17: gattn = 0)"),
    nearest=_moe_lightning_nearest,
    render=_moe_lightning_render,
    parse=_moe_lightning_parse,
)

# --- llama.cpp (llama-server) -------------------------------------------------------------

LLAMA_CPP_VERSION = "ggml-org/llama.cpp@0c1e5709 (vendored by llama-cpp-python 0.3.36)"
_ARG = "common/arg.cpp"
#: the tensors --n-cpu-moe / --cpu-moe match (common/common.h:1198): one layer's routed experts
LLAMA_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


def _llama_cpu_moe_layers(policy: Policy, ctx: Context) -> int:
    """MoE layers whose experts stay on the CPU (whole layers: --n-cpu-moe)."""
    layers = _moe_layers(ctx)
    return layers if not policy.ffn_on_gpu else round((1.0 - policy.weights_gpu_ratio) * layers)


def _llama_engine_runs(num_micro_batches: int) -> bool:
    """HRM's ``llama.cpp`` / ``llama.cpp-nkvo`` engines run one ubatch per step; policies of
    several ubatches are estimated with the plan's engine."""
    return num_micro_batches == 1


def _llama_engine(policy: Policy) -> str | None:
    """KV cache and attention on the GPU: ``llama.cpp``; -nkvo (in host memory): ``llama.cpp-nkvo``."""
    if not _llama_engine_runs(policy.num_micro_batches):
        return None
    return "llama.cpp" if policy.attn_on_gpu else "llama.cpp-nkvo"


def _llama_policy(policy: Policy, ctx: Context, cpu_layers: int, attn_gpu: bool) -> Policy | None:
    layers = _moe_layers(ctx)
    rw = (layers - cpu_layers) / layers
    fields = _fields(policy, attn_on_gpu=attn_gpu, kv_gpu_ratio=1.0 if attn_gpu else 0.0, weights_gpu_ratio=rw)
    # the llama.cpp engine's ffn=gpu with r_w = share of GPU layers (r_w = 0: every layer's
    # experts computed on the CPU); elsewhere every layer on the CPU is ffn=cpu
    fields["ffn_on_gpu"] = rw > 0 or _llama_engine_runs(fields["num_micro_batches"])
    return _policy(**fields)


def _llama_nearest(policy: Policy, ctx: Context) -> list[Policy]:
    # the KV cache is on the GPU whole (attention there) or, with -nkvo, in host memory
    # (attention on the CPU): rc is 1 or 0
    layers = _moe_layers(ctx)
    exact = layers if not policy.ffn_on_gpu else (1.0 - policy.weights_gpu_ratio) * layers
    counts = sorted({math.floor(exact + 1e-9), math.ceil(exact - 1e-9)}, key=lambda c: abs(c - exact))
    tiers = [True, False] if policy.attn_on_gpu and policy.kv_gpu_ratio < 1 else [policy.attn_on_gpu]
    return [p for p in (_llama_policy(policy, ctx, c, a) for a in tiers for c in counts) if p]


def _llama_render(policy: Policy, ctx: Context) -> dict[str, list[str]]:
    cpu_layers = _llama_cpu_moe_layers(policy, ctx)  # exact for a policy from _llama_nearest
    # --n-cpu-moe N matches blk.0 .. blk.N-1: dense first layers (DeepSeek) count as blocks
    blocks = cpu_layers + int(ctx.model.first_dense_layers) if cpu_layers else 0
    out = {"-m": ["MODEL.gguf"],
           "-ngl": [str(int(ctx.model.num_layers) + 1)],  # every block and the output layer
           "--n-cpu-moe": [str(blocks)],
           "-np": [str(policy.batch_size)],
           "-ub": [str(policy.micro_batch_size)],
           "-c": [str(policy.batch_size * _context_tokens(ctx))],  # the slots share -c
           "--fit": ["off"]}  # keep these values (--fit on would adjust unset ones to memory)
    if policy.micro_batch_size > 2048:  # -b (default 2048) must hold one ubatch
        out["-b"] = [str(policy.micro_batch_size)]
    if not policy.attn_on_gpu:
        out["-nkvo"] = []
    return out


def _llama_ot_cpu_layers(patterns: list[str], ctx: Context) -> set[int]:
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


def _llama_parse(values: dict[str, list[str]], ctx: Context) -> tuple[Policy, list[str]]:
    model = ctx.model
    if "-ngl" in values:
        text = values["-ngl"][0]
        if text == "auto":
            raise HRMError("-ngl auto: llama.cpp then fits the layers to memory itself; give a number or all")
        if text != "all":
            ngl = _int_value(values, "-ngl", LAYERS)
            if ngl < model.num_layers:
                raise HRMError(f"-ngl {ngl}: {model.num_layers - ngl} whole layers on the CPU are outside HRM's "
                               f"policy space (give -ngl {model.num_layers + 1} or all)")
    big = _int_value(values, "-np", bounds.SEQUENCES, 1)
    ub = min(_int_value(values, "-ub", bounds.SEQUENCES, 512), big)  # -ub default 512 (arg.cpp:1676)
    if big % ub:
        raise HRMError(f"-np {big} is not a multiple of -ub {ub}: HRM's batch is N = mu x n micro-batches")
    _int_value(values, "-c", CONTEXT)
    cpu_blocks = set(range(int(model.num_layers))) if "-cmoe" in values else set()
    if "--n-cpu-moe" in values:
        cpu_blocks |= set(range(_int_value(values, "--n-cpu-moe", LAYERS)))
    cpu_blocks |= _llama_ot_cpu_layers(values.get("-ot", []), ctx)
    moe_blocks = set(range(int(model.first_dense_layers), int(model.num_layers)))
    cpu_layers = len(cpu_blocks & moe_blocks)
    attn_gpu = "-nkvo" not in values
    policy = _llama_policy(Policy(batch_size=big, micro_batch_size=ub, num_micro_batches=big // ub), ctx,
                           cpu_layers, attn_gpu)
    return policy, []


LLAMA_CPP = EngineFlags(
    search_fix="attn=cpu",
    name="llama.cpp",
    description="llama.cpp llama-server: experts kept on the CPU per whole layer, KV on the GPU or the host",
    programs=("llama-server",),
    version=LLAMA_CPP_VERSION,
    flags=(
        FlagSpec(flag="-m", aliases=("--model",), policy_field="(model)", value_form=r"\S+",
                 checked_against=LLAMA_CPP_VERSION, source=f"{_ARG} (-m, --model)"),
        FlagSpec(flag="-ngl", aliases=("--gpu-layers", "--n-gpu-layers"), policy_field="(all layers on the GPU)",
                 value_form=r"\d+|all|auto", checked_against=LLAMA_CPP_VERSION, source=f"{_ARG}:2789-2801"),
        FlagSpec(flag="--n-cpu-moe", aliases=("-ncmoe",), policy_field="weights_gpu_ratio, ffn_on_gpu (whole layers)",
                 checked_against=LLAMA_CPP_VERSION, source=f"{_ARG}:2767-2774; common/common.h:1198-1217"),
        FlagSpec(flag="-cmoe", aliases=("--cpu-moe",), policy_field="ffn_on_gpu (all experts on the CPU)", values=0,
                 checked_against=LLAMA_CPP_VERSION, source=f"{_ARG}:2760-2765"),
        FlagSpec(flag="-ot", aliases=("--override-tensor",), policy_field="weights_gpu_ratio (expert tensors =CPU)",
                 value_form=r"[^=,]+=[A-Za-z0-9_]+(,[^=,]+=[A-Za-z0-9_]+)*", checked_against=LLAMA_CPP_VERSION,
                 source=f"{_ARG}:2754-2758"),
        FlagSpec(flag="-nkvo", aliases=("--no-kv-offload",), policy_field="attn_on_gpu, kv_gpu_ratio (KV in host memory)",
                 values=0, checked_against=LLAMA_CPP_VERSION, source=f"{_ARG}:2414-2420"),
        FlagSpec(flag="-np", aliases=("--parallel",), policy_field="batch_size (server slots)",
                 checked_against=LLAMA_CPP_VERSION, source=f"{_ARG}:2544-2552"),
        FlagSpec(flag="-ub", aliases=("--ubatch-size",), policy_field="micro_batch_size",
                 checked_against=LLAMA_CPP_VERSION, source=f"{_ARG}:1676-1682"),
        FlagSpec(flag="-b", aliases=("--batch-size",), policy_field="(logical batch >= -ub)",
                 checked_against=LLAMA_CPP_VERSION, source=f"{_ARG}:1669-1675"),
        FlagSpec(flag="-c", aliases=("--ctx-size",), policy_field="batch_size x (max prompt + gen) tokens",
                 checked_against=LLAMA_CPP_VERSION, source=f"{_ARG}:1639-1648"),
        FlagSpec(flag="--fit", aliases=("-fit",), policy_field="(off: keep the given values)", value_form=r"on|off",
                 checked_against=LLAMA_CPP_VERSION, source=f"{_ARG}:2868-2880"),
    ),
    passthrough={"--host": 1, "--port": 1, "-fa": 1, "--flash-attn": 1, "-t": 1, "--threads": 1, "-ctk": 1,
                 "-ctv": 1, "--no-mmap": 0, "--mlock": 0, "-hf": 1, "--jinja": 0},
    expressed_fields=("batch_size", "micro_batch_size", "num_micro_batches", "attn_on_gpu", "ffn_on_gpu",
                      "weights_gpu_ratio", "kv_gpu_ratio"),
    hrm_engine=_llama_engine,
    caveats=("re-estimated with HRM's llama.cpp engine (llama.cpp-nkvo with -nkvo: experts of CPU layers run on the "
             "CPU below 32 tokens per ubatch, their used experts copied to the GPU above) when one ubatch holds "
             "the batch; several ubatches are estimated with the plan's engine",
             "-ub is also the prefill chunk: a small micro-batch slows the prompt phase"),
    nearest=_llama_nearest,
    render=_llama_render,
    parse=_llama_parse,
)

# --- vLLM ---------------------------------------------------------------------------------

VLLM_VERSION = "vllm 0.33.0"
_VARGS = "vllm/engine/arg_utils.py"


def _offload_gib(policy: Policy, ctx: Context) -> float:
    """GiB of expert weights to offload per GPU, rounded up to 0.01 GiB (the flag's text)."""
    offload = (1.0 - (policy.weights_gpu_ratio if policy.ffn_on_gpu else 0.0)) * _expert_bytes(ctx)
    return math.ceil(round(offload / GIB / ctx.gpu_count * 100, 6)) / 100


def _ratio_from_offload(gib: float, ctx: Context) -> float:
    total = _expert_bytes(ctx)
    return max(0.0, 1.0 - gib * GIB * ctx.gpu_count / total) if total else 1.0


def _gpu_only_nearest(policy: Policy, ctx: Context, rw: float) -> list[Policy]:
    # GPU attention with the whole KV cache on the GPU, one forward pass for the batch
    return [p for p in [_one_batch(policy, attn_on_gpu=True, kv_gpu_ratio=1.0, ffn_on_gpu=True,
                                   weights_gpu_ratio=rw)] if p]


def _vllm_nearest(policy: Policy, ctx: Context) -> list[Policy]:
    return _gpu_only_nearest(policy, ctx, _ratio_from_offload(_offload_gib(policy, ctx), ctx))


def _vllm_render(policy: Policy, ctx: Context) -> dict[str, list[str]]:
    return {"serve": ["MODEL"], "--cpu-offload-gb": [f"{_offload_gib(policy, ctx):.2f}"],
            "--max-num-seqs": [str(policy.batch_size)],
            "--max-model-len": [str(_context_tokens(ctx))],
            "--gpu-memory-utilization": [f"{ctx.gpu_memory_utilization:.2f}"],
            "-tp": [str(ctx.gpu_count)]}


def _vllm_parse(values: dict[str, list[str]], ctx: Context) -> tuple[Policy, list[str]]:
    big = _int_value(values, "--max-num-seqs", bounds.SEQUENCES)
    if big is None:
        raise HRMError("vllm: give --max-num-seqs (the batch size)")
    tp = _int_value(values, "-tp", bounds.GPU_COUNT, 1)
    if tp != ctx.gpu_count:
        raise HRMError(f"-tp {tp}: the hardware profile has {ctx.gpu_count} GPU(s)")
    _float_value(values, "--gpu-memory-utilization", bounds.MEMORY_UTILIZATION)
    _int_value(values, "--max-model-len", bounds.TOKENS)
    gib = _float_value(values, "--cpu-offload-gb", OFFLOAD_GIB, 0.0)
    rw = _ratio_from_offload(gib, ctx)
    return Policy(batch_size=big, micro_batch_size=big, num_micro_batches=1, attn_on_gpu=True, ffn_on_gpu=True,
                  weights_gpu_ratio=rw, kv_gpu_ratio=1.0), []


VLLM = EngineFlags(
    search_fix="attn=gpu rc=1 n=1",
    name="vllm",
    description="vLLM: weights offloaded by GiB (UVA, read every forward pass), GPU attention",
    programs=("vllm",),
    version=VLLM_VERSION,
    flags=(
        FlagSpec(flag="serve", policy_field="(model: vllm serve MODEL)", value_form=r"\S+", checked_against=VLLM_VERSION,
                 source="vllm serve MODEL (the subcommand's positional model)"),
        FlagSpec(flag="--cpu-offload-gb", policy_field="weights_gpu_ratio (GiB of weights per GPU on the CPU)",
                 value_form=r"\d+(\.\d+)?", checked_against=VLLM_VERSION,
                 source=f"{_VARGS}:1470; vllm/config/offload.py:23-38"),
        FlagSpec(flag="--max-num-seqs", policy_field="batch_size", checked_against=VLLM_VERSION,
                 source=f"{_VARGS}:1754-1758"),
        FlagSpec(flag="--max-model-len", policy_field="workload: max prompt + gen", checked_against=VLLM_VERSION,
                 source=f"{_VARGS}:991"),
        FlagSpec(flag="--gpu-memory-utilization", aliases=("--device-memory-utilization",),
                 policy_field="(GPU memory fraction)", value_form=r"0?\.\d+|1(\.0+)?", checked_against=VLLM_VERSION,
                 source=f"{_VARGS}:1388-1393; vllm/config/cache.py:215"),
        FlagSpec(flag="-tp", aliases=("--tensor-parallel-size",), policy_field="(hardware: GPU count)",
                 checked_against=VLLM_VERSION, source=f"{_VARGS}:1209"),
    ),
    passthrough={"--host": 1, "--port": 1, "--dtype": 1, "--enforce-eager": 0, "--trust-remote-code": 0,
                 "--quantization": 1, "--kv-cache-dtype": 1},
    expressed_fields=("batch_size", "micro_batch_size", "num_micro_batches", "attn_on_gpu", "ffn_on_gpu",
                      "weights_gpu_ratio", "kv_gpu_ratio"),
    caveats=("--cpu-offload-gb offloads whole parameters in module order until the budget is reached "
             "(vllm/config/offload.py:38), not only routed experts",
             "vLLM has no CPU attention; it schedules the batch as one forward pass (n = 1)"),
    nearest=_vllm_nearest,
    render=_vllm_render,
    parse=_vllm_parse,
)

# --- SGLang with kTransformers ------------------------------------------------------------

SGLANG_VERSION = "sglang 0.5.23"
_SGF = "sglang/srt/arg_groups/fields"


def _kt_gpu_experts(policy: Policy, ctx: Context) -> int:
    experts = int(ctx.model.num_experts)
    return round(experts * policy.weights_gpu_ratio) if policy.ffn_on_gpu else 0


def _sglang_policy(policy: Policy, ctx: Context, gpu_experts: int) -> Policy | None:
    rw = gpu_experts / max(int(ctx.model.num_experts), 1)
    # no GPU expert: kTransformers computes every expert on the CPU (ffn=cpu)
    return _one_batch(policy, attn_on_gpu=True, kv_gpu_ratio=1.0, ffn_on_gpu=rw > 0, weights_gpu_ratio=rw)


def _sglang_nearest(policy: Policy, ctx: Context) -> list[Policy]:
    exact = int(ctx.model.num_experts) * policy.weights_gpu_ratio if policy.ffn_on_gpu else 0.0
    counts = sorted({math.floor(exact + 1e-9), math.ceil(exact - 1e-9)}, key=lambda c: abs(c - exact))
    return [p for p in (_sglang_policy(policy, ctx, c) for c in counts) if p]


def _sglang_render(policy: Policy, ctx: Context) -> dict[str, list[str]]:
    out = {"--model-path": ["MODEL"], "--kt-weight-path": ["KT_WEIGHTS"],
           "--kt-num-gpu-experts": [str(_kt_gpu_experts(policy, ctx))],
           "--max-running-requests": [str(policy.batch_size)],
           "--mem-fraction-static": [f"{ctx.gpu_memory_utilization:.2f}"],
           "--tp-size": [str(ctx.gpu_count)]}
    if ctx.hardware is not None:
        out["--kt-cpuinfer"] = [str(int(ctx.hardware.cpu.cores))]
    return out


def _sglang_parse(values: dict[str, list[str]], ctx: Context) -> tuple[Policy, list[str]]:
    big = _int_value(values, "--max-running-requests", bounds.SEQUENCES)
    if big is None:
        raise HRMError("sglang: give --max-running-requests (the batch size)")
    tp = _int_value(values, "--tp-size", bounds.GPU_COUNT, 1)
    if tp != ctx.gpu_count:
        raise HRMError(f"--tp-size {tp}: the hardware profile has {ctx.gpu_count} GPU(s)")
    _float_value(values, "--mem-fraction-static", bounds.MEMORY_UTILIZATION)
    _int_value(values, "--kt-cpuinfer", bounds.CORES)
    experts = int(ctx.model.num_experts)
    if "--kt-num-gpu-experts" in values:
        gpu_experts = _int_value(values, "--kt-num-gpu-experts", EXPERTS)
        if gpu_experts > experts:
            raise HRMError(f"--kt-num-gpu-experts {gpu_experts}: {ctx.model.name} has {experts} experts per layer")
        if _float_value(values, "--cpu-offload-gb", OFFLOAD_GIB, 0.0):
            raise HRMError("--cpu-offload-gb with --kt-num-gpu-experts: give one way of offloading the experts")
        return _sglang_policy(Policy(batch_size=big, micro_batch_size=big, num_micro_batches=1), ctx, gpu_experts), []
    # no kTransformers: --cpu-offload-gb streams weights like vLLM's
    rw = _ratio_from_offload(_float_value(values, "--cpu-offload-gb", OFFLOAD_GIB, 0.0), ctx)
    return Policy(batch_size=big, micro_batch_size=big, num_micro_batches=1, attn_on_gpu=True, ffn_on_gpu=True,
                  weights_gpu_ratio=rw, kv_gpu_ratio=1.0), []


SGLANG = EngineFlags(
    search_fix="attn=gpu rc=1 n=1",
    name="sglang",
    description="SGLang with kTransformers: the first k experts of every layer on the GPU, the rest on the CPU",
    programs=("python -m sglang.launch_server",),
    version=SGLANG_VERSION,
    flags=(
        FlagSpec(flag="--model-path", aliases=("--model",), policy_field="(model)", value_form=r"\S+",
                 checked_against=SGLANG_VERSION, source="sglang/srt/arg_groups/fields (model_path)"),
        FlagSpec(flag="--kt-weight-path", policy_field="(kTransformers CPU expert weights)", value_form=r"\S+",
                 checked_against=SGLANG_VERSION, source=f"{_SGF}/exec_.py:1016"),
        FlagSpec(flag="--kt-num-gpu-experts", policy_field="weights_gpu_ratio, ffn_on_gpu (whole experts per layer)",
                 checked_against=SGLANG_VERSION,
                 source=f"{_SGF}/exec_.py:1030; sglang/srt/layers/moe/kt_ep_wrapper.py:99-113"),
        FlagSpec(flag="--kt-cpuinfer", policy_field="(hardware: CPU threads)", checked_against=SGLANG_VERSION,
                 source=f"{_SGF}/exec_.py:1023"),
        FlagSpec(flag="--cpu-offload-gb", policy_field="weights_gpu_ratio (without kTransformers)",
                 checked_against=SGLANG_VERSION, source=f"{_SGF}/exec_.py:1068"),
        FlagSpec(flag="--max-running-requests", policy_field="batch_size", checked_against=SGLANG_VERSION,
                 source=f"{_SGF}/schedule.py:31"),
        FlagSpec(flag="--mem-fraction-static", policy_field="(GPU memory fraction)", value_form=r"0?\.\d+|1(\.0+)?",
                 checked_against=SGLANG_VERSION, source=f"{_SGF}/schedule.py:27"),
        FlagSpec(flag="--tp-size", aliases=("--tensor-parallel-size",), policy_field="(hardware: GPU count)",
                 checked_against=SGLANG_VERSION, source=f"{_SGF}/parallel.py:45-51"),
    ),
    passthrough={"--host": 1, "--port": 1, "--kt-method": 1, "--kt-threadpool-count": 1, "--trust-remote-code": 0,
                 "--attention-backend": 1, "--kt-max-deferred-experts-per-token": 1},
    expressed_fields=("batch_size", "micro_batch_size", "num_micro_batches", "attn_on_gpu", "ffn_on_gpu",
                      "weights_gpu_ratio", "kv_gpu_ratio"),
    caveats=("kTransformers computes the experts it keeps on the CPU there (AMX/AVX kernels), where HRM's ffn=gpu "
             "streams them: the estimate is of the HRM policy",
             "flag names: '--' + field name with '-' for '_' (sglang/srt/arg_groups/arg_utils.py:290)"),
    nearest=_sglang_nearest,
    render=_sglang_render,
    parse=_sglang_parse,
)

#: every engine ``hrm export`` / ``hrm import`` speaks, by name
EXPORTERS: dict[str, EngineFlags] = {e.name: e for e in (FLEXGEN, MOE_LIGHTNING, LLAMA_CPP, VLLM, SGLANG)}


def get_exporter(name: str) -> EngineFlags:
    if name not in EXPORTERS:
        import difflib

        close = difflib.get_close_matches(name, list(EXPORTERS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise HRMError(f"unknown target engine '{name}' (one of {', '.join(EXPORTERS)}){hint}")
    return EXPORTERS[name]


# --- export -------------------------------------------------------------------------------


def _estimate(hw, model, workload, policy: Policy, engine, options=None):
    """(throughput, feasible) of ``policy`` under ``engine``, or None when it cannot run it."""
    from .estimate import estimate

    try:
        kwargs = {"options": options} if options is not None else {}
        result = estimate(hw, model, workload, policy, engine=engine, **kwargs)
    except HRMError:
        return None
    return result.generation_throughput_tok_s, result.feasible


def _estimate_engine(target: EngineFlags, policy: Policy, plan_engine):
    """The HRM engine to re-estimate with: the target's closest shipped one, else the plan's."""
    from .engine import load_engine

    name = target.hrm_engine(policy) if target.hrm_engine else None
    return load_engine(name) if name else plan_engine


def choose_nearest(target: EngineFlags, policy: Policy, ctx: Context, estimate_with=None) -> Policy:
    """The policy ``target`` runs for ``policy``: itself when expressible, else the best
    (feasible first, then fastest by ``estimate_with(policy)``) of the nearest ones."""
    candidates = target.nearest(policy, ctx)
    if not candidates:
        raise HRMError(f"{target.name} cannot express {policy.short()}")
    if policy in candidates or len(candidates) == 1 or estimate_with is None:
        return policy if policy in candidates else candidates[0]
    scored = [(estimate_with(p), i, p) for i, p in enumerate(candidates)]
    ranked = sorted(scored, key=lambda s: (s[0] is None, not (s[0] and s[0][1]), -(s[0][0] if s[0] else 0), s[1]))
    return ranked[0][2]


def _differences(old: Policy, new: Policy) -> list[str]:
    names = {"batch_size": "N", "micro_batch_size": "mu", "num_micro_batches": "n", "attn_on_gpu": "attn",
             "ffn_on_gpu": "ffn", "weights_gpu_ratio": "rw", "kv_gpu_ratio": "rc"}

    def show(value):
        return ("gpu" if value else "cpu") if isinstance(value, bool) else f"{value:.4g}"

    return [f"{names[k]} {show(getattr(old, k))} -> {show(getattr(new, k))}" for k in names
            if getattr(old, k) != getattr(new, k) and not (isinstance(getattr(old, k), float)
                                                          and math.isclose(getattr(old, k), getattr(new, k),
                                                                           abs_tol=1e-9))]


def command_lines(target: EngineFlags, values: dict[str, list[str]]) -> tuple[str, ...]:
    """The programs' command lines (flags split by program for a server + client pair)."""
    if len(target.programs) == 1:
        groups = [values]
    else:  # moe-lightning: the client's flags are the bench.py ones
        client = {"--max-new-tokens", "--ubs", "--n-ub"}
        groups = [{k: v for k, v in values.items() if k not in client}, {k: v for k, v in values.items() if k in client}]
    lines = []
    for program, group in zip(target.programs, groups):
        tokens = [program]
        for flag, args in group.items():
            tokens += ([flag] if flag != "serve" else ["serve"]) + [shlex.quote(a) for a in args]
        lines.append(" ".join(tokens))
    return tuple(lines)


def export_policy(target_name: str, policy: Policy, ctx: Context, hw=None, plan_engine=None, options=None,
                  planned_throughput: float | None = None) -> Export:
    """``policy`` as ``target_name``'s flags (the nearest expressible policy when needed),
    both policies re-estimated with the target's closest HRM engine when ``hw`` is given."""
    from .engine import load_engine

    target = get_exporter(target_name)
    plan_engine = plan_engine if plan_engine is not None else load_engine("ideal")
    ctx = ctx.model_copy(update={"rw_reads": plan_engine.offloaded_weights})

    def estimate_with(p: Policy):
        return _estimate(hw, ctx.model, ctx.workload, p, _estimate_engine(target, p, plan_engine), options)

    exported = choose_nearest(target, policy, ctx, estimate_with if hw is not None else None)
    values = target.render(exported, ctx)
    flags = []
    for flag, args in values.items():
        spec = target.spec(flag)
        flags.append(FlagValue(flag=flag, value=" ".join(args), policy_field=spec.policy_field,
                               checked_against=spec.checked_against, source=spec.source))
    differences = _differences(policy, exported)
    engine_name = old_tput = new_tput = feasible = None
    if hw is not None:
        engine = _estimate_engine(target, exported, plan_engine)
        engine_name = engine.name
        new = _estimate(hw, ctx.model, ctx.workload, exported, engine, options)
        old = _estimate(hw, ctx.model, ctx.workload, policy, engine, options)
        new_tput, feasible = (new if new else (None, None))
        old_tput = old[0] if old else planned_throughput
    return Export(engine=target.name, version=target.version, commands=command_lines(target, values),
                  flags=tuple(flags), planned_policy=policy, exported_policy=exported, exact=not differences,
                  differences=tuple(differences), estimate_engine=engine_name, planned_throughput_tok_s=old_tput,
                  exported_throughput_tok_s=new_tput, exported_feasible=feasible, caveats=target.caveats,
                  search_fix=target.search_fix)


def export_plan(plan, engine_name: str, options=None) -> Export:
    """A plan (:class:`hrm.plan.Plan`) as ``engine_name``'s command lines. The model and the
    hardware are resolved from the plan's names and hashes; without them the export is not
    re-estimated (and the model's layer and expert counts are needed: an HRMError then)."""
    from .options import DEFAULT_OPTIONS
    from .plan import resolve_plan_engine, resolve_plan_hardware, resolve_plan_model

    model = resolve_plan_model(plan)
    if model is None:
        raise HRMError(f"plan: model {plan.model.name!r} with the plan's hash does not load here; "
                       "export needs its layers and experts")
    hw = resolve_plan_hardware(plan)
    options = options or DEFAULT_OPTIONS
    ctx = Context(model=model, workload=plan.workload, hardware=hw,
                  gpu_memory_utilization=options.gpu_memory_utilization)
    return export_policy(engine_name, plan.policy, ctx, hw=hw, plan_engine=resolve_plan_engine(plan),
                         options=options, planned_throughput=plan.estimate.generation_throughput_tok_s)


# --- import -------------------------------------------------------------------------------


def split_flags(target: EngineFlags, text: str) -> dict[str, list[str]]:
    """Engine flags (shell words, ``--flag=value`` too) as {canonical flag: value tokens}.
    A leading program name (``llama-server``, ``vllm serve`` ...) is skipped. One-line
    HRMError for an unknown flag, a missing value, or a flag given twice (except -ot)."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise HRMError(f"{target.name} flags: {exc}") from None
    for program in target.programs:  # skip the program words when pasted with the command
        prog = program.split()
        if words[:len(prog)] == prog:
            words = words[len(prog):]
            break
    spell = {s: spec for spec in target.flags for s in spec.spellings}
    out: dict[str, list[str]] = {}
    i = 0
    while i < len(words):
        word = words[i]
        inline = None
        if word.startswith("--") and "=" in word:
            word, inline = word.split("=", 1)
        spec = spell.get(word)
        if spec is None and word not in target.passthrough:
            import difflib

            close = difflib.get_close_matches(word, list(spell) + list(target.passthrough), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            what = "unknown flag" if word.startswith("-") or word == "serve" else "unexpected word"
            raise HRMError(f"{target.name}: {what} '{word}'{hint}")
        arity = spec.values if spec is not None else target.passthrough[word]
        if spec is not None and spec.flag == "--percent" and inline is None:  # nargs="+": up to the next flag
            j = i + 1
            while j < len(words) and not words[j].startswith("-"):
                j += 1
            args = words[i + 1:j]
        elif inline is not None:
            args = [inline]
        else:
            args = words[i + 1:i + 1 + arity]
            if len(args) < arity or any(a.startswith("-") and not re.fullmatch(r"-\d+", a) for a in args):
                raise HRMError(f"{target.name}: {word} needs {arity} value(s)")
        if spec is not None and args and spec.value_form:
            for arg in args:
                if not re.fullmatch(spec.value_form, arg):
                    raise HRMError(f"{target.name}: {word} {arg!r} is not of the form {spec.value_form}")
        key = spec.flag if spec is not None else word
        if key in out and key != "-ot":
            raise HRMError(f"{target.name}: {word} given twice")
        out[key] = out.get(key, []) + args
        i += 1 + (len(args) if inline is None else 0)
    return out


def import_command(engine_name: str, text: str, model, workload, hardware=None,
                   gpu_memory_utilization: float = 0.86) -> tuple[Policy, list[str]]:
    """An engine's flags as the HRM policy they run, with notes on what HRM does not model."""
    target = get_exporter(engine_name)
    ctx = Context(model=model, workload=workload, hardware=hardware, gpu_memory_utilization=gpu_memory_utilization)
    policy, notes = target.parse(split_flags(target, text), ctx)
    if policy is None:
        raise HRMError(f"{target.name}: the flags give no valid policy")
    return policy, notes


def import_flags(engine_name: str, text: str, model, workload=None, hardware=None) -> Policy:
    """An engine's flags as a :class:`~hrm.policy.Policy` (see :func:`import_command`)."""
    from .workload import make_workload

    return import_command(engine_name, text, model, workload or make_workload(), hardware)[0]
