"""FlexGen for MoE models (``python -m flexgen.flex_moe``): zig-zag blocks, ``--percent``
places whole tensors by their cumulative-size midpoint, every prompt padded to ``--prompt-len``.

FlexGen's MoE entry point is the fork the MoE-Lightning authors ran (lynnliu030/FlexGen,
branch ``moe``; upstream FlexLLMGen's ``flex_opt`` refuses non-OPT names: "Invalid model
name", opt_config.py:123). It runs Mixtral models on one GPU; the placement rule, the padding
and every flag are facts of ``docs/engines/flexgen.md``, the rule as functions in
:mod:`hrm.engines.flexgen`. Its policy space: the shipped ``flexgen`` (GPU attention) and
``flexgen-cpu-attn`` (``--cpu-cache-compute``) engines, r_w read as a share of every layer
weight (``offloaded_weights: all``)."""

from __future__ import annotations

from typing import Optional

from pydantic import ValidationError

from .. import bounds
from ..errors import HRMError, InfeasibleError, pydantic_message
from ..engines.flexgen import (EXPERT_TENSORS, cache_gpu_share, cache_percent_for_share, disk_percent_for_spill,
    expert_gpu_share, flex_moe_refusal, layer_gpu_share, placed_bytes, layer_tensors, nearest_levels, padded_workload,
    percent_for_share, realisable_shares, realised_levels)
from ..policy import Policy
from ..units import GIB
from .target import Context, EngineFlags, FlagSpec
from .values import PERCENT, int_value, make_policy, with_fields

FLEXGEN_VERSION = "lynnliu030/FlexGen@a80c8d15"
_MOE = "flexgen/flex_moe.py"
_RUNNER = "caoshiyi/artifacts@6bc86009 benchmarks/flexgen/mtbench/mtbench_run_moe.py"
#: str2bool's spellings (flexgen/utils.py:226-234)
_BOOL = r"(?i:yes|true|t|y|1|no|false|f|n|0)"
_TRUE = {"yes", "true", "t", "y", "1"}
#: the checkpoints the artifact ran (mtbench_run_moe.py:152; run_script_mtbench_t4_22b_dist_1x2.sh)
HF_CHECKPOINTS = {"mixtral-8x7b": "mistralai/Mixtral-8x7B-Instruct-v0.1",
                  "mixtral-8x22b": "mistralai/Mixtral-8x22B-Instruct-v0.1"}
#: flex_moe's defaults for absent flags (flex_moe.py:1351-1352, 1357-1358)
DEFAULT_GEN_LEN, DEFAULT_GPU_BATCH_SIZE, DEFAULT_NUM_GPU_BATCHES = 32, 4, 1
#: the weight dtypes FlexGen loads (it converts every checkpoint to fp16: moe_config.py:42)
_SIXTEEN_BIT = ("fp16", "bf16")


def check_runs(ctx: Context) -> None:
    """One-line HRMError when ``flexgen.flex_moe`` cannot run ``ctx``'s model on its machine."""
    why = flex_moe_refusal(ctx.model)
    if why:
        raise HRMError(f"flexgen: python -m flexgen.flex_moe runs Mixtral models only ({_MOE}:605-631); {why}")
    if ctx.model.weight_dtype not in _SIXTEEN_BIT or ctx.model.kv_dtype not in _SIXTEEN_BIT:
        raise HRMError(f"flexgen: FlexGen keeps weights and KV cache in fp16 ({_MOE}:613-614); the model has "
                       f"weights {ctx.model.weight_dtype}, KV {ctx.model.kv_dtype}")
    if ctx.hardware is not None and getattr(ctx.hardware, "gpu", None) is None:
        raise HRMError(f"flexgen: FlexGen computes on one CUDA GPU (TorchDevice(\"cuda:0\"), {_MOE}:1259); "
                       f"the hardware profile {ctx.hardware.name} has none")
    if ctx.gpu_count > 1:
        raise HRMError(f"flexgen: {ctx.gpu_count} GPUs: FlexGen's multi-GPU launch (mpirun ... python -m "
                       "flexgen.dist_flex_moe --head-ip IP --port PORT --use-mpi, dist_flex_moe.py:706-734) splits the "
                       "layers between the GPUs (pipeline parallel, :68-86), which HRM's flexgen engines do not model; "
                       "plan for one GPU")


def all_weights_ratio(policy: Policy, ctx: Context) -> float:
    """The policy's GPU share of one decoder layer's bytes (FlexGen's reading of r_w): r_w
    itself when it already reads so, else the same GPU bytes, r_w·experts + every non-expert
    weight, as a share of the layer (:func:`hrm.engines.flexgen.layer_tensors`)."""
    rw = policy.weights_gpu_ratio if policy.ffn_on_gpu else 0.0
    if ctx.rw_reads == "all":
        return rw
    tensors = layer_tensors(ctx.model)
    total = sum(size for _, size in tensors)
    experts = sum(size for name, size in tensors if name in EXPERT_TENSORS)
    return (total - (1.0 - rw) * experts) / total


def _candidates(policy: Policy, ctx: Context) -> list[Policy]:
    """The policies FlexGen realises next to ``policy``: r_w at a placement the midpoint rule
    produces (:func:`hrm.engines.flexgen.nearest_levels`), r_c at a cache split it produces."""
    levels = nearest_levels(ctx.model, all_weights_ratio(policy, ctx), "layers")
    mu = policy.micro_batch_size
    rcs = [rc for _, rc in cache_percent_for_share(ctx.model, mu, policy.kv_gpu_ratio)] if policy.attn_on_gpu else [0.0]
    out = [make_policy(**with_fields(policy, ffn_on_gpu=True, weights_gpu_ratio=lv.layer_share, kv_gpu_ratio=rc))
           for lv in levels for rc in rcs]
    return [p for p in out if p]


def replan_pins(ctx: Context) -> list[dict]:
    """FlexGen's policy space for a re-plan: r_w (a share of every layer weight: its engines'
    ``offloaded_weights: all``) only at the placements the midpoint rule produces
    (:func:`hrm.engines.flexgen.realisable_shares`), and the KV cache on the CPU (``--percent .. 0
    100``: a GPU cache share is cut per micro-batch row, which a continuous r_c misses)."""
    return [{"weights_gpu_ratio": share, "kv_gpu_ratio": 0.0} for share in realisable_shares(ctx.model, "layers")]


def _padded_estimate(policy: Policy, ctx: Context):
    """The estimate of ``policy`` under the FlexGen engine that runs it, prompts padded."""
    from ..engines.engine import load_engine
    from ..estimate import estimate
    from ..model.options import DEFAULT_OPTIONS

    options = DEFAULT_OPTIONS.model_copy(update={"gpu_memory_utilization": ctx.gpu_memory_utilization})
    engine = load_engine("flexgen" if policy.attn_on_gpu else "flexgen-cpu-attn")
    return estimate(ctx.hardware, ctx.model, padded_workload(ctx.workload), policy, options=options, engine=engine)


def _nearest(policy: Policy, ctx: Context) -> list[Policy]:
    # the experts always run on the GPU (FlexGen has no CPU MLP); with --cpu-cache-compute the
    # cache is on the CPU; with a machine, only placements that fit with padded prompts
    check_runs(ctx)
    candidates = _candidates(policy, ctx)
    if ctx.hardware is None or not candidates:
        return candidates
    estimates = [(p, _padded_estimate(p, ctx)) for p in candidates]
    fitting = [p for p, result in estimates if result.feasible]
    if not fitting:
        needs = ", ".join(f"rw={p.weights_gpu_ratio:.4g} rc={p.kv_gpu_ratio:.4g} needs {r.binding_memory}"
                          for p, r in estimates)
        shares = " ".join(f"{s:.4g}" for s in realisable_shares(ctx.model))
        raise InfeasibleError(f"flexgen: with every prompt padded to --prompt-len {ctx.workload.max_prompt_len} "
                              f"({_MOE}:1207-1211) no placement FlexGen makes near {policy.short()} fits ({needs}); "
                              f"plan with --padding --engine flexgen and rw one of {shares}")
    return fitting


def _cache_percent(policy: Policy, ctx: Context) -> int:
    if not policy.attn_on_gpu:
        return 0
    found = cache_percent_for_share(ctx.model, policy.micro_batch_size, policy.kv_gpu_ratio)
    if len(found) != 1:
        raise HRMError(f"flexgen: rc={policy.kv_gpu_ratio:.4g} is no cache split FlexGen makes for "
                       f"--gpu-batch-size {policy.micro_batch_size} (moe_pytorch_backend.py:783-794)")
    return found[0][0]


def _weight_percent(policy: Policy, ctx: Context) -> int:
    wg = percent_for_share(ctx.model, policy.weights_gpu_ratio, "layers")
    if wg is None:
        shares = ", ".join(f"{lv.layer_share:.4g}" for lv in realised_levels(ctx.model))
        raise HRMError(f"flexgen: rw={policy.weights_gpu_ratio:.4g} is no placement FlexGen makes for "
                       f"{ctx.model.name} (whole tensors by midpoint, {_MOE}:89-169; it makes {shares})")
    return wg


def _spill_bytes(policy: Policy, ctx: Context) -> float:
    """The weights the policy spills beyond host memory on the plan's machine (the padded
    estimate's ``disk_bytes``, docs/model.md §4.9); 0 without a machine."""
    return _padded_estimate(policy, ctx).disk_bytes if ctx.hardware is not None else 0.0


def _disk_percent(policy: Policy, ctx: Context, wg: int) -> int:
    """The disk share of ``--percent`` (100 − wg − wc): the fewest whole tensors that hold
    the policy's spill (:func:`hrm.engines.flexgen.disk_percent_for_spill`); 0 when nothing spills."""
    spill = _spill_bytes(policy, ctx)
    disk = disk_percent_for_spill(ctx.model, wg, spill)
    if disk is None:
        raise InfeasibleError(f"flexgen: {spill / GIB:.2f} GiB of weights must go to disk, more than --percent {wg} "
                              f"leaves off the GPU ({_MOE}:79-86)")
    return disk


def _notes(policy: Policy, ctx: Context) -> list[str]:
    """A spilling policy: how much FlexGen's whole tensors put on disk beside the planned spill."""
    spill = _spill_bytes(policy, ctx)
    if spill <= 0:
        return []
    wg = _weight_percent(policy, ctx)
    disk = _disk_percent(policy, ctx, wg)
    placed = placed_bytes(ctx.model, (wg, 100 - wg - disk))["layers"]["disk"]
    return [f"--percent disk share {disk}% ({_MOE}:66-68): {placed / GIB:.2f} GiB of whole tensors on disk for the "
            f"{spill / GIB:.2f} GiB of weights host memory cannot hold; the estimate reads only the latter from disk "
            f"per pass, so where the disk binds FlexGen runs up to {placed / spill:.2f}x slower than estimated"]


def _render(policy: Policy, ctx: Context) -> dict[str, list[str]]:
    wg, cg = _weight_percent(policy, ctx), _cache_percent(policy, ctx)
    disk = _disk_percent(policy, ctx, wg)
    out = {
        "--model": [HF_CHECKPOINTS.get(ctx.model.name, "MODEL")],
        "--gpu-batch-size": [str(policy.micro_batch_size)],
        "--num-gpu-batches": [str(policy.num_micro_batches)],
        # weights beyond host memory on disk (wd = 100 - wg - wc); activations stay on the GPU
        # (hg=100): HRM keeps hidden states in GPU memory
        "--percent": [str(wg), str(100 - wg - disk), str(cg), str(100 - cg), "100", "0"],
        # FlexGen pads every prompt to --prompt-len: the workload's longest
        "--prompt-len": [str(ctx.workload.max_prompt_len)],
        "--gen-len": [str(ctx.workload.gen_len)],
        # unpinned weights, as the shipped flexgen engine models them (flex_moe.py's default)
        "--pin-weight": ["0"],
    }
    if not policy.attn_on_gpu:
        out["--cpu-cache-compute"] = []
    return out


def _percent_shares(values: dict[str, list[str]]) -> list[int]:
    """--percent's six shares (wg wc cg cc hg hc): weights summing to at most 100 (the rest on
    disk, docs/model.md §4.9), the cache to 100 (no cache on disk), one activation share 100
    (FlexGen raises otherwise, flex_moe.py:636-643)."""
    tokens = values.get("--percent", ["100", "0", "100", "0", "100", "0"])
    if len(tokens) != 6:  # flex_moe.py:1393 asserts six
        raise HRMError(f"--percent: expected six integers (wg wc cg cc hg hc), got {len(tokens)}")
    shares = []
    for name, text in zip(("wg", "wc", "cg", "cc", "hg", "hc"), tokens):
        try:
            shares.append(PERCENT.check(int(text), f"--percent {name}"))
        except ValueError:
            raise HRMError(f"--percent {name} {text!r}: expected an integer") from None
    if shares[0] + shares[1] > 100:
        raise HRMError(f"--percent: the weight shares {shares[0]} + {shares[1]} exceed 100")
    if shares[2] + shares[3] != 100:
        raise HRMError(f"--percent: the cache shares {shares[2]} + {shares[3]} do not sum to 100 "
                       "(a KV cache on disk is outside HRM's policy space)")
    if 100 not in (shares[4], shares[5]):
        raise HRMError(f"--percent: activations {shares[4]} {shares[5]}: FlexGen keeps them on one tier "
                       f"(hg or hc 100; {_MOE}:636-643)")
    return shares


def _model_notes(values: dict[str, list[str]], ctx: Context) -> list[str]:
    """Refuse a --model that is not ``ctx``'s model (one line); notes otherwise."""
    named = values.get("--model", [None])[0]
    if named is None:
        return [f"no --model: read as {ctx.model.name} (flex_moe's default facebook/opt-6.7b, {_MOE}:1344, "
                "is no MoE model)"]
    base = named.rstrip("/").split("/")[-1].lower()
    own = ctx.model.name.lower()
    if named == "MODEL" or base.startswith(own) or named == HF_CHECKPOINTS.get(own):
        return []
    what = "a Mixtral checkpoint" if "mixtral" in base else "no Mixtral checkpoint (flex_moe runs Mixtral only)"
    raise HRMError(f"flexgen: --model {named} is {what}, not the model being planned ({ctx.model.name}); "
                   "give HRM's --model the same model")


def _switch_notes(values: dict[str, list[str]], ctx: Context) -> list[str]:
    for flag in ("--compress-weight", "--compress-cache"):
        if flag in values:
            raise HRMError(f"flexgen: {flag}: FlexGen's 4-bit group-wise compression ({_MOE}:1271-1275) is not "
                           "modelled; import the command without it")
    engine, fields = _flag_engine(values)
    return [f"{flag} {word}: {engine.flags[flag].source.split(';')[0]}; estimated with "
            f"{', '.join(f'{k}: {v}' for k, v in engine.flags[flag].fields(word).items())} (engine {engine.name}'s flags)"
            for flag, word in _mechanism_words(values, engine).items() if engine.flags[flag].fields(word)]


def _mechanism_words(values: dict[str, list[str]], engine) -> dict[str, str]:
    """The command's flags that choose a mechanism (the engine file's ``flags``), each as its
    canonical word: a bare str2bool flag is True (``const=True``, :1368-1385), a word is read by
    str2bool's spellings (utils.py:226-234)."""
    words = {}
    for flag in engine.flags:
        if flag in values:
            given = values[flag]
            words[flag] = "true" if not given or given[0].lower() in _TRUE else "false"
    return words


def _flag_engine(values: dict[str, list[str]]):
    """The shipped FlexGen engine the command runs (``--cpu-cache-compute``: flexgen-cpu-attn)
    and the engine fields its mechanism flags set (:func:`hrm.engines.mechanisms.flag_engine`)."""
    from ..engines.engine import load_engine
    from ..engines.mechanisms import flag_engine

    engine = load_engine("flexgen-cpu-attn" if "--cpu-cache-compute" in values else "flexgen")
    _, fields = flag_engine(engine, _mechanism_words(values, engine))
    return engine, fields


def engine_fields(values: dict[str, list[str]], ctx: Context) -> dict:
    """The engine fields a command's mechanism flags set (``--pin-weight``, ``--overlap``,
    ``--sep-layer``: the ``flags`` of engines flexgen and flexgen-cpu-attn), so that the
    estimate runs the mechanism the command runs."""
    return _flag_engine(values)[1]


def _parse(values: dict[str, list[str]], ctx: Context) -> tuple[Policy, list[str]]:
    check_runs(ctx)
    notes = _model_notes(values, ctx) + _switch_notes(values, ctx)
    mu = int_value(values, "--gpu-batch-size", bounds.SEQUENCES, DEFAULT_GPU_BATCH_SIZE)
    n = int_value(values, "--num-gpu-batches", bounds.SEQUENCES, DEFAULT_NUM_GPU_BATCHES)
    wg, wc, cg, _, hg, _ = _percent_shares(values)
    attn_cpu = "--cpu-cache-compute" in values
    if attn_cpu and cg:
        raise HRMError(f"--percent cg {cg} with --cpu-cache-compute: CPU attention reads the cache in CPU "
                       "memory (give cg 0)")
    if hg != 100:
        notes.append(f"--percent hg {hg}: hidden states between layers on the CPU are not modelled "
                     "(HRM keeps them on the GPU)")
    if wg + wc < 100:
        notes.append(f"--percent {wg} {wc}: {100 - wg - wc}% of the weights on disk; HRM spills only what host "
                     "memory cannot hold (docs/model.md §4.9), with engines flexgen/flexgen-cpu-attn on a profile "
                     "with a disk section")
    rw = layer_gpu_share(ctx.model, wg)
    notes.append(f"--percent {wg}: FlexGen places {100 * expert_gpu_share(ctx.model, wg):.4g}% of the experts and "
                 f"{100 * rw:.4g}% of every layer's bytes on the GPU (whole tensors, {_MOE}:89-169)")
    big = bounds.SEQUENCES.check(mu * n, "--gpu-batch-size x --num-gpu-batches")
    policy = make_policy(batch_size=big, micro_batch_size=mu, num_micro_batches=n, attn_on_gpu=not attn_cpu,
                         ffn_on_gpu=True, weights_gpu_ratio=rw,
                         kv_gpu_ratio=0.0 if attn_cpu else cache_gpu_share(ctx.model, mu, cg))
    return policy, notes


def command_workload(values: Optional[dict[str, list[str]]], ctx: Context):
    """The workload FlexGen runs: for a plan (``values`` None) the plan's, padded; for a
    command, --prompt-len (every prompt padded to it; absent: the HRM workload's longest
    prompt, as the artifact's runner pads to its data's longest) and --gen-len (absent: 32)."""
    base = ctx.workload
    if values is None:
        return padded_workload(base)
    prompt = int_value(values, "--prompt-len", bounds.TOKENS, base.max_prompt_len)
    gen = int_value(values, "--gen-len", bounds.GEN_TOKENS, DEFAULT_GEN_LEN)
    fields = {**dict(base), "prompt_len": min(base.prompt_len, prompt), "max_prompt_len": prompt, "gen_len": gen,
              "padding": True}
    try:
        return type(base)(**fields)
    except ValidationError as exc:
        raise HRMError(pydantic_message("--prompt-len/--gen-len", exc)) from None


def _str2bool_spec(flag: str, field: str, lines: str) -> FlagSpec:
    """A ``type=str2bool, nargs='?'`` flag: bare (True) or one str2bool word."""
    return FlagSpec(flag=flag, policy_field=field, value_form=_BOOL, until_next_flag=True, source=f"{_MOE}:{lines}")


FLEXGEN = EngineFlags(
    name="flexgen", version=FLEXGEN_VERSION, programs=("python -m flexgen.flex_moe",),
    import_programs=("python3 -m flexgen.flex_moe", "python mtbench_run_moe.py", "python3 mtbench_run_moe.py"),
    engines=("flexgen", "flexgen-cpu-attn"), hrm_engine=lambda p: "flexgen" if p.attn_on_gpu else "flexgen-cpu-attn",
    description="FlexGen (flexgen.flex_moe): zig-zag blocks, --percent places whole tensors by midpoint, prompts padded",
    flags=(
        FlagSpec(flag="--gpu-batch-size", aliases=("--gbs",), policy_field="micro_batch_size",
                 source=f"{_MOE}:1357; --gbs: {_RUNNER}:150"),
        FlagSpec(flag="--num-gpu-batches", aliases=("--num-gb",), policy_field="num_micro_batches",
                 source=f"{_MOE}:1358; --num-gb: {_RUNNER}:151"),
        FlagSpec(flag="--percent", policy_field="weights_gpu_ratio (midpoint rule), kv_gpu_ratio (wg wc cg cc hg hc)",
                 values=6, value_form=r"\d{1,3}", until_next_flag=True, source=f"{_MOE}:1359-1367,1393"),
        FlagSpec(flag="--cpu-cache-compute", policy_field="attn_on_gpu (present: attention on the CPU)", values=0,
                 source=f"{_MOE}:1372,305-306"),
        _str2bool_spec("--pin-weight", "(engine mechanism: weight path pinned, flags of the engine file)", "1370-1371"),
        FlagSpec(flag="--prompt-len", policy_field="workload.max_prompt_len (every prompt padded to it)",
                 source=f"{_MOE}:1351"),
        FlagSpec(flag="--gen-len", policy_field="workload.gen_len", source=f"{_MOE}:1352"),
        FlagSpec(flag="--model", policy_field="(model: a Mixtral checkpoint)", value_form=r"\S+", source=f"{_MOE}:1344"),
        FlagSpec(flag="--compress-weight", policy_field="(refused: 4-bit weights not modelled)", values=0,
                 source=f"{_MOE}:1374"),
        FlagSpec(flag="--compress-cache", policy_field="(refused: 4-bit cache not modelled)", values=0,
                 source=f"{_MOE}:1376"),
        _str2bool_spec("--sep-layer", "(engine mechanism: syncs and weight buffer per block, flags of the engine file)",
                       "1368-1369"),
        _str2bool_spec("--overlap", "(engine mechanism: overlap False is the sequential schedule, flags of the "
                       "engine file)", "1384-1385"),
    ),
    passthrough={"--path": 1, "--offload-dir": 1, "--cut-gen-len": 1, "--debug-mode": 1, "--attn-sparsity": 1,
                 "--log-file": 1, "--no-log": 0, "--verbose": 1},
    caveats=("FlexGen's MoE entry is the fork lynnliu030/FlexGen (branch moe) that the MoE-Lightning artifact's "
             "FlexGen runs import; upstream FlexLLMGen's flex_opt runs OPT models only",
             "--percent places whole tensors, each where its cumulative-size midpoint falls: a Mixtral layer's "
             "experts are all, a third (w2) or none on the GPU",
             "every prompt is padded to --prompt-len (the workload's longest): KV cache and prefill sized by it"),
    workload=command_workload, check_runs=check_runs, replan_pins=replan_pins, nearest=_nearest, render=_render,
    parse=_parse, notes=_notes, engine_fields=engine_fields,
)
