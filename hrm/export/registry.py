"""Every engine ``hrm export`` / ``hrm import`` speaks, by name: the one place targets are listed."""

from __future__ import annotations

from typing import Optional

from ..errors import HRMError
from .flexgen import FLEXGEN
from .llama_cpp import LLAMA_CPP
from .moe_lightning import MOE_LIGHTNING
from .ollama import OLLAMA
from .sglang import SGLANG
from .target import EngineFlags, Frontend
from .vllm import VLLM

#: every engine ``hrm export`` / ``hrm import`` speaks, by name
EXPORTERS: dict[str, EngineFlags] = {e.name: e for e in (FLEXGEN, MOE_LIGHTNING, LLAMA_CPP, VLLM, SGLANG)}
#: tools ``hrm import`` reads that launch one of EXPORTERS' engines with flags of their own making
FRONTENDS: dict[str, Frontend] = {f.name: f for f in (OLLAMA,)}
#: every name ``hrm import --from`` takes
IMPORT_SOURCES: tuple[str, ...] = (*EXPORTERS, *FRONTENDS)


def _unknown(name: str, names) -> HRMError:
    import difflib

    close = difflib.get_close_matches(name, list(names), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return HRMError(f"unknown target engine '{name}' (one of {', '.join(names)}){hint}")


def get_exporter(name: str) -> EngineFlags:
    if name not in EXPORTERS:
        raise _unknown(name, EXPORTERS)
    return EXPORTERS[name]


def import_source(name: str) -> tuple[Optional[Frontend], EngineFlags]:
    """(the frontend, or None; the target whose flags are read) of an ``hrm import --from`` name."""
    if name in FRONTENDS:
        return FRONTENDS[name], EXPORTERS[FRONTENDS[name].target]
    if name not in EXPORTERS:
        raise _unknown(name, IMPORT_SOURCES)
    return None, EXPORTERS[name]
