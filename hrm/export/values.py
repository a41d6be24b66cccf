"""Helpers the targets share: policies from fields, flag values read against their ranges,
the model sizes flags are counted in, and the whole counts nearest a fraction."""

from __future__ import annotations

import math

from .. import bounds
from ..errors import HRMError
from ..policy import Policy, policy_refusal
from .target import Context

#: percent of a share; GiB of offloaded weights (per GPU)
PERCENT = bounds.Range(0, 100, "%", integer=True, why="a percentage")
OFFLOAD_GIB = bounds.Range(0.0, bounds.MAX_CPU_MEMORY_GIB, "GiB", why="weights offloaded per GPU")
EXPERTS = bounds.Range(0, 1 << 16, "experts", integer=True, why="experts of one layer")
LAYERS = bounds.Range(0, 1 << 16, "layers", integer=True, why="layers of one model")
CONTEXT = bounds.Range(0, bounds.MAX_CONTEXT_TOKENS * bounds.MAX_BATCH_SIZE, "tokens", integer=True)

#: the address an engine's HTTP server listens on (a value each): accepted, no policy field
HTTP_SERVER_FLAGS = {"--host": 1, "--port": 1}
#: characters of a user's word quoted in a one-line message (the rest elided: a message stays readable)
SHOWN_WORD_CHARS = 60


def shown_word(word: str) -> str:
    """A user's word for a message: its repr, of at most :data:`SHOWN_WORD_CHARS` characters of it."""
    return repr(word if len(word) <= SHOWN_WORD_CHARS else word[:SHOWN_WORD_CHARS] + "...")


def make_policy(**fields) -> Policy | None:
    """A Policy, or None when the fields break a policy rule (a candidate to drop)."""
    if policy_refusal(fields):
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
        raise HRMError(f"{flag} {shown_word(text)}: expected {what}") from None
    return rng.check(number, flag)


def moe_layers(ctx: Context) -> int:
    return max(int(ctx.model.num_moe_layers), 1)


def expert_bytes(ctx: Context) -> float:
    from ..cost.costs import total_expert_bytes

    return float(total_expert_bytes(ctx.model))


def context_tokens(ctx: Context) -> int:
    return int(ctx.workload.max_prompt_len + ctx.workload.gen_len)


def nearest_counts(exact: float) -> list[int]:
    """The whole counts next to ``exact`` (itself when whole), nearest first: rounding up
    may not fit memory, rounding down may be slower."""
    return sorted({math.floor(exact + 1e-9), math.ceil(exact - 1e-9)}, key=lambda c: abs(c - exact))


def server_notes(values: dict[str, list[str]], ctx: Context, *, engine: str, model: str | None,
                 unmodelled: dict[str, tuple[tuple[str, ...], str]], tp_flag: str, memory_flag: str) -> list[str]:
    """The checks vLLM and SGLang commands share: the served model is the planned one, flags of
    mechanisms HRM does not model are at their off values (``unmodelled``: flag -> (values that
    keep it off, why)), the tensor-parallel size is the machine's GPU count and the GPU memory
    share a fraction. Notes for what is read with a default."""
    notes = served_model_notes(model, ctx, engine, "model")
    for flag, (off, why) in unmodelled.items():
        if flag in values and not (values[flag] and values[flag][0] in off):
            raise HRMError(f"{engine}: {flag} {' '.join(values[flag])}: {why}, which HRM's {engine} engine does not model")
    tp = int_value(values, tp_flag, bounds.GPU_COUNT, 1)
    if tp != ctx.gpu_count:
        raise HRMError(f"{tp_flag} {tp}: the hardware profile has {ctx.gpu_count} GPU(s)")
    float_value(values, memory_flag, bounds.MEMORY_UTILIZATION)
    return notes


def suffixed_int(values: dict[str, list[str]], flag: str, multipliers: dict[str, int], rng: bounds.Range,
                 default=None, whole_only: tuple[str, ...] = ()) -> int | None:
    """A token count written with an engine's suffixes (vLLM's and SGLang's human-readable
    ints: each engine's own multiplier table); ``whole_only`` suffixes take no decimals."""
    if flag not in values:
        return default
    text = values[flag][0].strip()
    number, suffix = text, ""
    for key in sorted(multipliers, key=len, reverse=True):
        if text.endswith(key):
            number, suffix = text[:-len(key)], key
            break
    try:
        if suffix and "." in number and suffix in whole_only:
            raise ValueError
        count = int(float(number) * multipliers[suffix]) if suffix else int(number)
    except ValueError:
        raise HRMError(f"{flag} {text!r}: expected a whole number (suffixes: {', '.join(multipliers)})") from None
    return rng.check(count, flag)


def _bare(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def served_model_notes(named: str | None, ctx: Context, engine: str, flag: str) -> list[str]:
    """Refuse (one line) a model a server command names that is not the model being planned;
    a command's model matches when its last path part starts with the planned model's name
    or one of its catalog aliases (hyphens and underscores aside: a directory DeepSeekV3 is
    deepseek-v3), the longest catalog name that matches deciding."""
    from ..model.spec import ALIASES, list_catalog

    if named is None or named == "MODEL":
        return [] if named else [f"{engine}: no model in the command: read as {ctx.model.name}"]
    base = _bare(named.rstrip("/").split("/")[-1])
    own = ctx.model.name.lower()
    names = {name: name for name in list_catalog()} | dict(ALIASES) | {own: own}
    matches = sorted((key for key in names if base.startswith(_bare(key))), key=lambda k: len(_bare(k)), reverse=True)
    if matches and names[matches[0]] in (own, ALIASES.get(own, own)):
        return []
    raise HRMError(f"{engine}: {flag} {shown_word(named)} is not the model being planned ({ctx.model.name}); "
                   "give HRM's --model the same model")


def within_context(ctx: Context, limit: int | None, flag: str, engine: str):
    """The HRM workload a server bounded to ``limit`` tokens per sequence (prompt + output)
    serves: unchanged when its longest sequence fits, refused (one line) when it does not."""
    workload = ctx.workload
    longest = int(workload.max_prompt_len + workload.gen_len)
    if limit is not None and longest > limit:
        raise HRMError(f"{engine}: {flag} {limit} is below the workload's longest sequence, --max-prompt-len + "
                       f"--gen-len = {longest} tokens: the server rejects those requests; give a shorter "
                       f"workload or a larger {flag}")
    return workload
