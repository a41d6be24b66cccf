"""Throughput vs CPU memory capacity per schedule (the paper's Fig. 1 idea): with GPU
memory and link fixed, more CPU memory holds the KV cache of a larger batch N, which
amortises each weight transfer over more tokens — until another resource binds.
Draws the table :func:`solver.sweep.cpu_memory_sweep` returns."""

from __future__ import annotations

from ._common import new_figure

SCHEDULE_STYLE = {
    "cgopipe": dict(color="#d62728", marker="o"), "flexgen": dict(color="#1f77b4", marker="s"),
    "flexgen-cpu-attn": dict(color="#ff7f0e", marker="^"), "sequential": dict(color="#7f7f7f", marker="v"),
}
SCHEDULE_NAMES = {
    "cgopipe": "CGOPipe (MoE-Lightning)", "flexgen": "FlexGen S4 (GPU attention)",
    "flexgen-cpu-attn": "FlexGen S3 (CPU attention)", "sequential": "no overlap",
}


def series(table, schedule: str, column: str = "generation_throughput_tok_s"):
    """(CPU memory GiB, throughput tok/s) of one schedule; infeasible points are NaN."""
    rows = table[table["schedule"] == schedule].sort_values("cpu_mem_gib")
    return rows["cpu_mem_gib"].to_numpy(float), rows[column].to_numpy(float)


def plot_cpu_memory(table, title: str = "", column: str = "generation_throughput_tok_s"):
    fig, axes = new_figure(9.5, 5.5)
    ax = axes[0][0]
    for schedule in table["schedule"].unique():
        xs, ys = series(table, schedule, column)
        ax.plot(xs, ys, lw=2, ms=6, label=SCHEDULE_NAMES.get(schedule, schedule), gid=f"schedule:{schedule}",
                **SCHEDULE_STYLE.get(schedule, {}))
    ax.set_xlabel("CPU memory capacity (GiB, before the utilisation headroom)")
    ax.set_ylabel("generation throughput (tok/s)" if column.startswith("generation") else "decode throughput (tok/s)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9, loc="upper left", title="schedule (best policy of each)", title_fontsize=9)
    if title:
        ax.set_title(title, fontsize=10)
    infeasible = table[~table["feasible"].astype(bool)]
    if len(infeasible):
        ax.annotate(f"{len(infeasible)} point(s) infeasible (not drawn)", (0.99, 0.02), xycoords="axes fraction",
                    ha="right", fontsize=8, color="grey")
    return fig

