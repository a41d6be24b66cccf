"""Every engine at its own best policy (``hrm-search --compare``): throughput and per-token
latency side by side, so the throughput/latency trade between engines reads at a glance.
Draws the table :func:`compare_table` makes from the search results."""

from __future__ import annotations

import numpy as np

from ._common import new_figure

COLUMNS = ["engine", "policy", "generation_throughput_tok_s", "decode_throughput_tok_s", "per_token_latency_s",
           "prefill_latency_s", "bottleneck", "reason"]


def compare_table(rows):
    """A pandas table of the engines of ``solver.analyses.compare_engines`` (each with a
    ``label``, and its search ``result`` or the ``refusal`` why it has no policy): one row per
    engine in the given order; an engine without a policy keeps its reason."""
    import pandas as pd

    out = []
    for row in rows:
        label, result = row.label, row.result
        if result is None:
            out.append({"engine": label, "policy": "", "generation_throughput_tok_s": np.nan,
                        "decode_throughput_tok_s": np.nan, "per_token_latency_s": np.nan, "prefill_latency_s": np.nan,
                        "bottleneck": "", "reason": row.refusal})
            continue
        est = result.best.estimate
        out.append({"engine": label, "policy": result.best.policy.short(),
                    "generation_throughput_tok_s": est.generation_throughput_tok_s,
                    "decode_throughput_tok_s": est.decode_throughput_tok_s,
                    "per_token_latency_s": est.per_token_latency_s, "prefill_latency_s": est.prefill_latency_s,
                    "bottleneck": est.bottleneck, "reason": ""})
    return pd.DataFrame(out, columns=COLUMNS)


def plot_compare(table, title: str = ""):
    """Two panels over the engines: best generation throughput (tok/s) and the per-token
    latency of that policy (ms, log scale); engines without a policy are marked."""
    fig, axes = new_figure(11, 0.45 * len(table) + 1.8, 1, 2, sharey=True)
    throughput_ax, latency_ax = axes[0]
    ys = np.arange(len(table))[::-1]
    feasible = table["reason"] == ""
    tput = table["generation_throughput_tok_s"].to_numpy(float)
    tpot_ms = table["per_token_latency_s"].to_numpy(float) * 1e3
    throughput_ax.barh(ys[feasible], tput[feasible], color="#4c72b0", gid="compare:throughput")
    latency_ax.barh(ys[feasible], tpot_ms[feasible], color="#dd8452", gid="compare:tpot")
    for y, value, ok in zip(ys, tput, feasible):
        throughput_ax.annotate(f"{value:,.1f}" if ok else "no policy", (value if ok else 0, y), xytext=(3, 0),
                               textcoords="offset points", va="center", fontsize=8)
    for y, value, ok in zip(ys, tpot_ms, feasible):
        if ok:
            latency_ax.annotate(f"{value:,.0f}" if value >= 100 else f"{value:.3g}", (value, y), xytext=(3, 0), textcoords="offset points", va="center",
                                fontsize=8)
    throughput_ax.set_yticks(ys, table["engine"])
    throughput_ax.set_xlabel("generation throughput (tok/s), best policy of each engine")
    latency_ax.set_xlabel("per-token latency of that policy (ms)")
    if np.any(feasible):
        latency_ax.set_xscale("log")
        latency_ax.set_xlim(np.nanmin(tpot_ms[feasible]) / 1.5, np.nanmax(tpot_ms[feasible]) * 2.0)
        throughput_ax.set_xlim(0, np.nanmax(tput[feasible]) * 1.2)
    for ax in (throughput_ax, latency_ax):
        ax.grid(True, axis="x", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
