"""The checked reading of one ``config.json`` value: a config view that names its file and key in
every refusal, the type-and-range checkers, and the plausible ranges they hold a value to.
:mod:`hrm.model.hf_config` and the per-family readers (:mod:`hrm.model.hf_llama4`) share them.
"""

from __future__ import annotations

import math

from ..bounds import MAX_CONTEXT_TOKENS
from ..errors import HRMError, shown_key, shown_value, value_kind

# Plausible ranges: generous, but finite; a value beyond one is a typo or a unit slip.
MAX_HIDDEN_SIZE = 1 << 17  # 131072: the widest published decoders have hidden sizes of ~16-25K
MAX_INTERMEDIATE_SIZE = 1 << 20  # 1M: the widest published FFNs are ~53K (Llama-3.1-405B)
MAX_HEADS = 1024  # the most attention heads published are 128 (DeepSeek-V3)
MAX_HEAD_DIM = 4096  # published head dims are 64-256
MAX_VOCAB = 1 << 24  # 16.7M: the largest published vocabularies are ~260K tokens
# MAX_LAYERS and MAX_EXPERTS: hrm.model.routing (routing traces are checked against them too)
MAX_LORA_RANK = MAX_HIDDEN_SIZE  # MLA ranks compress the hidden state, so never wider than it
MAX_ROPE_THETA = 1e12  # published RoPE bases are at most ~1e8
MAX_NORM_EPS = 1.0  # an RMSNorm epsilon is a tiny guard (1e-6..1e-5); 1 or more swamps the signal
MAX_CONTEXT_WINDOW = MAX_CONTEXT_TOKENS  # the longest published context windows are 10M tokens


class ConfigView:
    """A config mapping plus the prefix its keys carry in messages (``text_config.``)."""

    def __init__(self, data: dict, source: str, prefix: str = ""):
        self.data, self.source, self.prefix = data, source, prefix

    def refuse(self, key: str, reason: str):
        raise HRMError(f"{self.source}: {self.prefix}{shown_key(key)}: {reason}")

    def raw(self, path: str):
        """Value at dotted ``path`` (``ffn_config.moe_top_k``); None if absent or null.
        A non-object on the way (``ffn_config: 3``) is refused."""
        node, parts = self.data, path.split(".")
        for depth, part in enumerate(parts):
            if depth:
                if not isinstance(node, dict):
                    self.refuse(".".join(parts[:depth]), f"must be an object, got {shown_value(node)}")
            node = node.get(part)
            if node is None:
                return None
        return node

    def pick(self, paths, check):
        """(key, checked value) of the present key among alias ``paths``; None if none.
        Aliases present with different values are refused as contradictory."""
        hits = [(path, check(self, path, raw)) for path in paths if (raw := self.raw(path)) is not None]
        for path, value in hits[1:]:
            if value != hits[0][1]:
                first, shown = hits[0][0], shown_value(self.raw(hits[0][0]))
                self.refuse(path, f"{shown_value(self.raw(path))} contradicts {self.prefix}{first} = {shown}")
        return hits[0] if hits else None


def int_check(lo: int, hi: int, why: str = ""):
    """Checker: an integer (not a bool, float or string) in [lo, hi]."""

    def check(cfg: ConfigView, key: str, value) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            cfg.refuse(key, f"must be an integer, got {value_kind(value)}")
        if value < lo:
            cfg.refuse(key, f"must be at least {lo}, got {shown_value(value)}")
        if value > hi:
            cfg.refuse(key, f"must be at most {hi}{why}, got {shown_value(value)}")
        return value

    return check


def number_check(hi: float):
    """Checker: a finite real number in (0, hi]."""

    def check(cfg: ConfigView, key: str, value) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            cfg.refuse(key, f"must be a number, got {value_kind(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            cfg.refuse(key, f"must be finite, got {shown_value(value)}")
        if not 0 < value <= hi:
            cfg.refuse(key, f"must lie in (0, {hi:g}], got {shown_value(value)}")
        return value

    return check


def bool_check(cfg: ConfigView, key: str, value) -> bool:
    if not isinstance(value, bool):
        cfg.refuse(key, f"must be true or false, got {value_kind(value)}")
    return value


def string_check(cfg: ConfigView, key: str, value) -> str:
    if not isinstance(value, str):
        cfg.refuse(key, f"must be a string, got {value_kind(value)}")
    return value


def strings_check(cfg: ConfigView, key: str, value) -> tuple:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        cfg.refuse(key, f"must be a list of strings, got {value_kind(value)}")
    return tuple(value)
