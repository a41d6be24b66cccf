"""Shared figure helpers: headless figures (no pyplot state), atomic PNG writes, units."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from matplotlib.figure import Figure

from ..errors import HRMError

TFLOPS = 1e12
#: colours of task kinds and tiers, close to the paper's Fig. 6 (attention orange, KV green)
KIND_COLORS = {
    "pre_attn": "#4c72b0", "post_attn": "#1f3b73", "attention": "#f28e2b", "experts": "#b07aa1",
    "qkv": "#9c9c9c", "hidden": "#76b7b2", "weights": "#e15759", "kv": "#59a14f", "head": "#bab0ac",
    "other": "#d3d3d3",
}
KIND_LABELS = {
    "pre_attn": "PreAttn (norm, QKV proj.)", "post_attn": "PostAttn (O proj., MoE FFN)",
    "attention": "attention core", "experts": "experts on CPU", "qkv": "D1 QKV GPU→CPU",
    "hidden": "D2 hidden states", "weights": "D3 weight pages", "kv": "D4 KV cache", "head": "lm_head",
    "other": "other",
}


def new_figure(width_in: float, height_in: float, rows: int = 1, cols: int = 1, **kw):
    """A figure and its axes without pyplot (works headless, no global state)."""
    fig = Figure(figsize=(width_in, height_in), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, **kw)
    return fig, axes


def save_png(fig: Figure, path: str | Path, dpi: int = 150) -> Path:
    """Write the figure atomically (temp file in the same folder, then rename)."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise HRMError(f"{path}: folder {folder} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=folder)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=dpi, format="png")
        os.replace(tmp, path)
    except (OSError, ValueError) as exc:
        Path(tmp).unlink(missing_ok=True)
        raise HRMError(f"{path}: cannot write ({exc})") from None
    return path


def si_rate(value: float, unit: str) -> str:
    """'312 TFLOP/s', '2.04 TB/s', '16 GB/s' (decimal prefixes)."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"
