"""Shared figure helpers: headless figures (no pyplot state), atomic PNG writes, units."""

from __future__ import annotations

import io
from pathlib import Path

from matplotlib.figure import Figure

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
    """Write the figure as PNG atomically (:func:`hrm.plan.write_atomic`)."""
    from ..plan import write_atomic

    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=dpi, format="png")
    write_atomic(path, buffer.getvalue())
    return Path(path)


def si_rate(value: float, unit: str) -> str:
    """'312 TFLOP/s', '2.04 TB/s', '16 GB/s' (decimal prefixes)."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"
