"""Policy map (paper §6.3, Fig. 10): the best policy on a grid of CPU→GPU bandwidth × CPU
scaling ratio. Draws the table :func:`solver.sweep.policy_map` returns; four panels —
throughput, attention placement (with N, μ), offloaded weights, offloaded KV cache."""

from __future__ import annotations

import numpy as np
from matplotlib.colors import ListedColormap

from ._common import new_figure

PANELS = (
    ("generation_throughput_tok_s", "generation throughput (tok/s)", "viridis"),
    ("attn_on_gpu", "attention placement", None),
    ("weights_offloaded", "expert weights offloaded to CPU (1 − r_w)", "Reds"),
    ("kv_offloaded", "KV cache offloaded to CPU (1 − r_c)", "Greens"),
)


def grid(table, column: str):
    """(x values, y values, 2-D array [y, x]) of ``column``; infeasible cells are NaN."""
    xs = np.sort(table["h2d_gbps"].unique())
    ys = np.sort(table["cpu_scale"].unique())
    values = np.full((len(ys), len(xs)), np.nan)
    for _, row in table.iterrows():
        if not row["feasible"]:
            continue
        i, j = int(np.searchsorted(ys, row["cpu_scale"])), int(np.searchsorted(xs, row["h2d_gbps"]))
        values[i, j] = float(row[column])
    return xs, ys, values


def _cell_text(column: str, value: float, row) -> str:
    if np.isnan(value):
        return "infeasible"
    if column == "generation_throughput_tok_s":
        return f"{value:,.0f}"
    if column == "attn_on_gpu":
        return f"{'GPU' if value else 'CPU'}\nN={int(row['batch_size'])}\nμ={int(row['micro_batch_size'])}"
    return f"{100 * value:.0f}%"


def plot_policy_map(table, title: str = ""):
    """Four heat maps of the best policy per cell; every cell carries its value as text."""
    fig, axes = new_figure(12.0, 9.0, 2, 2)
    for ax, (column, label, cmap) in zip(axes.flat, PANELS):
        xs, ys, values = grid(table, column)
        if column == "attn_on_gpu":
            colormap, vmin, vmax = ListedColormap(["#f28e2b", "#4c72b0"]), 0, 1
        else:
            colormap = cmap
            vmin, vmax = (0, 1) if column != "generation_throughput_tok_s" else (np.nanmin(values), np.nanmax(values))
        mesh = ax.imshow(values, origin="lower", aspect="auto", cmap=colormap, vmin=vmin, vmax=vmax, gid=f"map:{column}")
        rows = {(float(r["cpu_scale"]), float(r["h2d_gbps"])): r for _, r in table.iterrows()}
        for i, y in enumerate(ys):
            for j, x in enumerate(xs):
                value = values[i, j]
                shade = (value - vmin) / (vmax - vmin) if np.isfinite(value) and vmax > vmin else 0.0
                dark = column == "attn_on_gpu" or (cmap == "viridis" and shade < 0.6) or (cmap != "viridis" and shade > 0.6)
                ax.text(j, i, _cell_text(column, value, rows[(float(y), float(x))]), ha="center", va="center",
                        fontsize=7.5 if column == "attn_on_gpu" else 8.5, color="white" if dark else "black")
        ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs])
        ax.set_yticks(range(len(ys)), [f"{y:g}×" for y in ys])
        ax.set_xlabel("CPU→GPU bandwidth (GB/s)")
        ax.set_ylabel("CPU scaling ratio (FLOP/s, bandwidth, capacity)")
        ax.set_title(label, fontsize=10)
        bar = fig.colorbar(mesh, ax=ax, shrink=0.9)
        if column == "attn_on_gpu":
            bar.set_ticks([0.25, 0.75], labels=["attention\non CPU", "attention\non GPU"])
    if title:
        fig.suptitle(title, fontsize=11)
    return fig
