"""Add kernel curves measured now to committed profiles (add_elementwise.py, add_per_head.py): the
thread counts the profiles were measured at, and the write that swaps one kind of curve and keeps
the rest, each new curve's ``source.methods`` line saying when and by which script."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import yaml


def profile_threads(docs: dict[Path, dict]) -> list[int]:
    """The thread counts the profiles' ggml sections were measured at."""
    return sorted({int(pt["x"]) for d in docs.values() for pt in d["ggml_cpu"]["node_s_vs_threads"]})


def stamped(methods: dict[str, str], script: str) -> dict[str, str]:
    """``methods`` lines with when they were measured and which script added them."""
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return {key: f"{line}; measured {when} and added to this profile by {script}" for key, line in methods.items()}


def write_kernels(docs: dict[Path, dict], kernels: list[dict], methods: dict[str, str], ops: set[str]) -> None:
    """Each profile with its curves of ``ops`` replaced by ``kernels`` (profile YAML) and ``methods``
    added; its comment header kept, the rest as hrm profile writes it."""
    for path, doc in docs.items():
        section = doc["ggml_cpu"]
        section["kernels"] = [k for k in section["kernels"] if k["op"] not in ops] + kernels
        doc.setdefault("source", {}).setdefault("methods", {}).update(methods)
        lines = path.read_text().splitlines(keepends=True)
        head = "".join(lines[:next(i for i, line in enumerate(lines) if not line.startswith("#"))])
        path.write_text(head + yaml.safe_dump(doc, sort_keys=False))


def write_with_section(base_path: str, section, methods: dict[str, str], out: Path) -> None:
    """The profile at ``base_path`` with its ggml_cpu section replaced by a window's probe
    (``section``, and the probe's ``source.methods`` lines added), written to ``out``."""
    from hrm.machine.hardware import load_hardware
    from hrm_cli.profile import profile_yaml

    base = load_hardware(base_path)
    source = base.source.model_copy(update={"methods": {**base.source.methods, **methods}})
    out.write_text(profile_yaml(base.model_copy(update={"ggml_cpu": section, "source": source})))
