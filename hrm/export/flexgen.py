"""FlexGen (FlexLLMGen ``flex_opt.py``): zig-zag blocks, ``--percent`` splits every weight.

Its policy space: the shipped ``flexgen`` (GPU attention) and ``flexgen-cpu-attn``
(``--cpu-cache-compute``) engines."""

from __future__ import annotations

import math

from .. import bounds
from ..errors import HRMError
from ..policy import Policy
from .target import Context, EngineFlags, FlagSpec
from .values import PERCENT, expert_bytes, int_value, make_policy, with_fields

FLEXGEN_VERSION = "FMInference/FlexLLMGen@004ffef8"
_FLEX = "flexllmgen/flex_opt.py"


def all_weights_ratio(policy: Policy, ctx: Context) -> float:
    """The policy's GPU share of every layer weight (FlexGen's wg): r_w itself when it already
    reads so, else the same offloaded bytes, (1 − r_w)·experts, as a share of all the layers'
    offloadable weights (:func:`hrm.latency.offloaded_layer_bytes` under ``--percent``)."""
    rw = policy.weights_gpu_ratio if policy.ffn_on_gpu else 0.0
    if ctx.rw_reads == "all":
        return rw
    from ..engine import load_engine
    from ..latency import layer_kinds, offloaded_layer_bytes

    every = load_engine("flexgen")  # offloaded_weights: all
    all_bytes = sum(count * float(offloaded_layer_bytes(ctx.model, every, moe))
                    for moe, count in layer_kinds(ctx.model))
    return max(0.0, 1.0 - (1.0 - rw) * expert_bytes(ctx) / all_bytes) if all_bytes > 0 else rw


def _nearest(policy: Policy, ctx: Context) -> list[Policy]:
    # --percent is whole percent of every weight (flex_opt.py:1291-1299), so r_w is first
    # re-read as a share of all layer weights; the experts always run on the GPU (FlexGen has
    # no CPU MLP); with --cpu-cache-compute the cache is on the CPU
    rws = _percent_neighbours(all_weights_ratio(policy, ctx))
    rcs = _percent_neighbours(policy.kv_gpu_ratio) if policy.attn_on_gpu else [0.0]
    out = [make_policy(**with_fields(policy, ffn_on_gpu=True, weights_gpu_ratio=rw, kv_gpu_ratio=rc))
           for rw in rws for rc in rcs]
    return [p for p in out if p]


def _percent_neighbours(ratio: float) -> list[float]:
    """The whole percents next to ``ratio`` (itself when whole): rounding up may not fit memory."""
    low, high = math.floor(100 * ratio + 1e-9), math.ceil(100 * ratio - 1e-9)
    return sorted({low / 100, high / 100}, key=lambda r: abs(r - ratio))


def _render(policy: Policy, ctx: Context) -> dict[str, list[str]]:
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


def _percent_shares(values: dict[str, list[str]]) -> list[int]:
    """--percent's six shares (wg wc cg cc hg hc), each pair summing to 100."""
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
    return shares


def _parse(values: dict[str, list[str]], ctx: Context) -> tuple[Policy, list[str]]:
    mu = int_value(values, "--gpu-batch-size", bounds.SEQUENCES, 4)  # defaults: flex_opt.py:1289-1290
    n = int_value(values, "--num-gpu-batches", bounds.SEQUENCES, 1)
    shares = _percent_shares(values)
    attn_cpu = "--cpu-cache-compute" in values
    if attn_cpu and shares[2]:
        raise HRMError(f"--percent cg {shares[2]} with --cpu-cache-compute: CPU attention reads the cache in CPU "
                       "memory (give cg 0)")
    notes = [] if shares[4] == 100 else [f"--percent hg {shares[4]}: activations on the CPU are not modelled "
                                         "(HRM keeps hidden states on the GPU)"]
    big = bounds.SEQUENCES.check(mu * n, "--gpu-batch-size x --num-gpu-batches")
    policy = make_policy(batch_size=big, micro_batch_size=mu, num_micro_batches=n, attn_on_gpu=not attn_cpu,
                         ffn_on_gpu=True, weights_gpu_ratio=shares[0] / 100, kv_gpu_ratio=shares[2] / 100)
    return policy, notes


FLEXGEN = EngineFlags(
    name="flexgen", version=FLEXGEN_VERSION, programs=("python -m flexllmgen.flex_opt",),
    engines=("flexgen", "flexgen-cpu-attn"), hrm_engine=lambda p: "flexgen" if p.attn_on_gpu else "flexgen-cpu-attn",
    description="FlexGen (FlexLLMGen flex_opt.py): zig-zag blocks, --percent splits every weight",
    flags=(
        FlagSpec(flag="--gpu-batch-size", policy_field="micro_batch_size", source=f"{_FLEX}:1289"),
        FlagSpec(flag="--num-gpu-batches", policy_field="num_micro_batches", source=f"{_FLEX}:1290"),
        FlagSpec(flag="--percent", policy_field="weights_gpu_ratio, kv_gpu_ratio (wg wc cg cc hg hc)", values=6,
                 value_form=r"\d{1,3}", until_next_flag=True, source=f"{_FLEX}:1291-1299,1325"),
        FlagSpec(flag="--cpu-cache-compute", policy_field="attn_on_gpu (present: attention on the CPU)", values=0,
                 source=f"{_FLEX}:1304,273-274"),
        FlagSpec(flag="--pin-weight", policy_field="(engine mechanism: pinned weights)", value_form=r"0|1|true|false",
                 source=f"{_FLEX}:1302-1303"),
        FlagSpec(flag="--prompt-len", policy_field="workload.max_prompt_len (padded)", source=f"{_FLEX}:1283"),
        FlagSpec(flag="--gen-len", policy_field="workload.gen_len", source=f"{_FLEX}:1284"),
        FlagSpec(flag="--model", policy_field="(model)", value_form=r"\S+", source=f"{_FLEX}:1276"),
    ),
    passthrough={"--path": 1, "--offload-dir": 1, "--cut-gen-len": 1, "--log-file": 1, "--no-log": 0,
                 "--verbose": 1, "--overlap": 1, "--sep-layer": 1},
    caveats=("FlexLLMGen's flex_opt.py runs OPT models; MoE models run through the MoE-Lightning artifact's "
             "FlexGen port (benchmarks/flexgen), which takes the same flags",
             "--percent splits every weight of a layer, not only the routed experts: a plan's r_w (a share of "
             "the routed experts) is exported as the same offloaded bytes' share of all layer weights"),
    nearest=_nearest, render=_render, parse=_parse,
)
