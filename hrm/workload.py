"""Workload (docs/model.md §3.3) and the MoE-Lightning paper's workload presets."""

from __future__ import annotations

from typing import Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from . import bounds
from .bounds import Flag
from .errors import HRMError, pydantic_message


class Workload(BaseModel):
    """Average and maximum prompt length, tokens generated per request, and whether prompts
    are padded to the maximum (FlexGen) or batched by length (MoE-Lightning Algorithm 2).
    Lengths are whole tokens in :data:`hrm.bounds.TOKENS` (generation:
    :data:`hrm.bounds.GEN_TOKENS`); a sequence (the longest prompt plus
    the generated tokens) holds at most :data:`hrm.bounds.MAX_CONTEXT_TOKENS`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_len: bounds.TOKENS.type
    max_prompt_len: bounds.TOKENS.type
    gen_len: bounds.GEN_TOKENS.type
    padding: Flag = False

    @model_validator(mode="after")
    def _max_at_least_avg(self):
        if self.max_prompt_len < self.prompt_len:
            raise ValueError(f"max_prompt_len ({self.max_prompt_len}) < prompt_len ({self.prompt_len})")
        if self.max_prompt_len + self.gen_len > bounds.MAX_CONTEXT_TOKENS:
            raise ValueError(f"max_prompt_len + gen_len = {self.max_prompt_len + self.gen_len} tokens is above the "
                             f"plausible maximum {bounds.MAX_CONTEXT_TOKENS} tokens of one sequence (MAX_CONTEXT_TOKENS)")
        return self

    @property
    def effective_prompt_len(self) -> int:
        """Tokens per prompt the machine actually processes: the max when padding."""
        return self.max_prompt_len if self.padding else self.prompt_len

    @property
    def max_context_len(self) -> int:
        """KV-cache tokens one sequence may hold at the end of generation (memory sizing)."""
        return (self.max_prompt_len if self.padding else self.effective_prompt_len) + self.gen_len


def decode_contexts(prompt_len: int, gen_len: int) -> np.ndarray:
    """Cached tokens before each decode step: the prompt plus the tokens generated so far.
    Prefill yields the first token; decode steps t = 1..gen−1 see s + t − 1 cached tokens."""
    return prompt_len + np.arange(gen_len - 1, dtype=float)


def mean_decode_context(workload: Workload) -> float:
    """The mean context over the decode steps (the prompt's when there are none): where
    single-context views (timelines, the expert-level pipeline's periods) take decode."""
    contexts = decode_contexts(workload.effective_prompt_len, workload.gen_len)
    return float(np.mean(contexts)) if len(contexts) else float(workload.effective_prompt_len)


def check_context_window(model, workload: Workload) -> None:
    """Refuse (HRMError naming the flags) a workload whose longest sequence — the longest
    prompt plus the generated tokens — exceeds the model's context window (config.json
    max_position_embeddings or an alias; models that state none are bounded only by
    :data:`hrm.bounds.MAX_CONTEXT_TOKENS`)."""
    window = getattr(model, "max_context_len", None)
    longest = workload.max_prompt_len + workload.gen_len
    if window is not None and longest > window:
        raise HRMError(f"--max-prompt-len + --gen-len = {workload.max_prompt_len} + {workload.gen_len} = {longest} "
                       f"tokens exceeds the context window of model {model.name} ({window} tokens, "
                       f"max_position_embeddings); at most --gen-len {max(window - workload.max_prompt_len, 0)} "
                       f"with these prompts")


# Paper Table (workloads): MTBench avg 77 / max 418 (gen 32-256), synthetic reasoning
# avg 242 / max 256 (gen 50), summarization avg 1693 / max 1984 (gen 64).
PRESETS: dict[str, dict] = {
    "mtbench": {"prompt_len": 77, "max_prompt_len": 418, "gen_len": 128},
    "synthetic-reasoning": {"prompt_len": 242, "max_prompt_len": 256, "gen_len": 50},
    "summarization": {"prompt_len": 1693, "max_prompt_len": 1984, "gen_len": 64},
}
DEFAULT_PRESET = "mtbench"


def make_workload(
    preset: Optional[str] = DEFAULT_PRESET,
    prompt_len: Optional[int] = None,
    max_prompt_len: Optional[int] = None,
    gen_len: Optional[int] = None,
    padding: bool = False,
) -> Workload:
    """A preset with optional overrides (``preset=None`` needs prompt_len and gen_len)."""
    if preset is not None and preset not in PRESETS:
        raise HRMError(f"unknown workload '{preset}' (presets: {', '.join(PRESETS)})")
    base = dict(PRESETS[preset]) if preset else {}
    if prompt_len is not None:
        base["prompt_len"] = prompt_len
        if max_prompt_len is None and (not preset or base.get("max_prompt_len", 0) < prompt_len):
            base["max_prompt_len"] = prompt_len
    if max_prompt_len is not None:
        base["max_prompt_len"] = max_prompt_len
    if gen_len is not None:
        base["gen_len"] = gen_len
    missing = [k for k in ("prompt_len", "gen_len") if k not in base]
    if missing:
        raise HRMError(f"workload: missing {', '.join(missing)} (give a preset or --prompt-len/--gen-len)")
    base.setdefault("max_prompt_len", base["prompt_len"])
    try:
        return Workload(padding=padding, **base)
    except ValidationError as exc:
        raise HRMError(pydantic_message("workload", exc)) from None
