"""Every engine ``hrm export`` / ``hrm import`` speaks, by name: the one place targets are listed."""

from __future__ import annotations

from ..errors import HRMError
from .flexgen import FLEXGEN
from .llama_cpp import LLAMA_CPP
from .moe_lightning import MOE_LIGHTNING
from .sglang import SGLANG
from .target import EngineFlags
from .vllm import VLLM

#: every engine ``hrm export`` / ``hrm import`` speaks, by name
EXPORTERS: dict[str, EngineFlags] = {e.name: e for e in (FLEXGEN, MOE_LIGHTNING, LLAMA_CPP, VLLM, SGLANG)}


def get_exporter(name: str) -> EngineFlags:
    if name not in EXPORTERS:
        import difflib

        close = difflib.get_close_matches(name, list(EXPORTERS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise HRMError(f"unknown target engine '{name}' (one of {', '.join(EXPORTERS)}){hint}")
    return EXPORTERS[name]
