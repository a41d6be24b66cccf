"""Helpers the targets share: policies from fields, flag values read against their ranges,
the model sizes flags are counted in, and the whole counts nearest a fraction."""

from __future__ import annotations

import math

from .. import bounds
from ..errors import HRMError
from ..policy import Policy, policy_problem
from ..units import GIB
from .target import Context

#: percent of a share; GiB of offloaded weights (per GPU)
PERCENT = bounds.Range(0, 100, "%", integer=True, why="a percentage")
OFFLOAD_GIB = bounds.Range(0.0, bounds.MAX_CPU_MEMORY_GIB, "GiB", why="weights offloaded per GPU")
EXPERTS = bounds.Range(0, 1 << 16, "experts", integer=True, why="experts of one layer")
LAYERS = bounds.Range(0, 1 << 16, "layers", integer=True, why="layers of one model")
CONTEXT = bounds.Range(0, bounds.MAX_CONTEXT_TOKENS * bounds.MAX_BATCH_SIZE, "tokens", integer=True)

#: the address an engine's HTTP server listens on (a value each): accepted, no policy field
HTTP_SERVER_FLAGS = {"--host": 1, "--port": 1}


def make_policy(**fields) -> Policy | None:
    """A Policy, or None when the fields break a policy rule (a candidate to drop)."""
    if policy_problem(fields):
        return None
    try:
        return Policy(**fields)
    except ValueError:
        return None


def with_fields(policy: Policy, **update) -> dict:
    return {**dict(policy), **update}


def one_batch(policy: Policy, **update) -> Policy | None:
    """The policy as an engine that runs the whole batch in one forward pass (n = 1)."""
    return make_policy(**with_fields(policy, micro_batch_size=policy.batch_size, num_micro_batches=1, **update))


def int_value(values: dict[str, list[str]], flag: str, rng: bounds.Range, default=None) -> int | None:
    return _number(values, flag, rng, default, int, "an integer")


def float_value(values: dict[str, list[str]], flag: str, rng: bounds.Range, default=None) -> float | None:
    return _number(values, flag, rng, default, float, "a number")


def _number(values: dict[str, list[str]], flag: str, rng: bounds.Range, default, kind, what: str):
    if flag not in values:
        return default
    text = values[flag][0]
    try:
        number = kind(text)
    except ValueError:
        raise HRMError(f"{flag} {text!r}: expected {what}") from None
    return rng.check(number, flag)


def moe_layers(ctx: Context) -> int:
    return max(int(ctx.model.num_moe_layers), 1)


def expert_bytes(ctx: Context) -> float:
    from ..costs import total_expert_bytes

    return float(total_expert_bytes(ctx.model))


def context_tokens(ctx: Context) -> int:
    return int(ctx.workload.max_prompt_len + ctx.workload.gen_len)


def nearest_counts(exact: float) -> list[int]:
    """The whole counts next to ``exact`` (itself when whole), nearest first: rounding up
    may not fit memory, rounding down may be slower."""
    return sorted({math.floor(exact + 1e-9), math.ceil(exact - 1e-9)}, key=lambda c: abs(c - exact))


def ratio_from_offload(gib: float, ctx: Context) -> float:
    """r_w of ``gib`` GiB of expert weights offloaded per GPU (vLLM's and SGLang's
    ``--cpu-offload-gb``)."""
    total = expert_bytes(ctx)
    return max(0.0, 1.0 - gib * GIB * ctx.gpu_count / total) if total else 1.0


def served_batch(values: dict[str, list[str]], ctx: Context, *, engine: str, batch_flag: str, tp_flag: str,
                 memory_flag: str) -> int:
    """The batch a serving engine's flags give (its running-sequence limit, required), after
    the checks vLLM and SGLang share: the tensor-parallel size is the machine's GPU count and
    the GPU memory share a fraction."""
    big = int_value(values, batch_flag, bounds.SEQUENCES)
    if big is None:
        raise HRMError(f"{engine}: give {batch_flag} (the batch size)")
    tp = int_value(values, tp_flag, bounds.GPU_COUNT, 1)
    if tp != ctx.gpu_count:
        raise HRMError(f"{tp_flag} {tp}: the hardware profile has {ctx.gpu_count} GPU(s)")
    float_value(values, memory_flag, bounds.MEMORY_UTILIZATION)
    return big


def streamed_offload(big: int, gib: float, ctx: Context) -> Policy:
    """``--cpu-offload-gb`` (vLLM; SGLang without kTransformers): GPU attention over a KV
    cache on the GPU, the batch in one forward pass, ``gib`` GiB of weights per GPU streamed."""
    return Policy(batch_size=big, micro_batch_size=big, num_micro_batches=1, attn_on_gpu=True, ffn_on_gpu=True,
                  weights_gpu_ratio=ratio_from_offload(gib, ctx), kv_gpu_ratio=1.0)
