"""Measured vs predicted, as rows and as a rich table (``hrm run``)."""

from __future__ import annotations

from typing import Optional

from hrm.plan import Estimate
from hrm.units import MIB

from .measure import RunResult


def _err(pred: float, meas: float) -> Optional[float]:
    return (pred - meas) / meas if meas else None


def comparison_rows(est: Estimate, res: RunResult) -> list[dict]:
    """One row per quantity: name, unit, predicted, measured, relative error of the prediction."""
    busy = max(res.lane_busy_s, key=res.lane_busy_s.get) if res.lane_busy_s else "-"
    rows = [
        ("decode layer latency", "ms", est.decode_layer_latency_s * 1e3, res.decode_layer_latency_s * 1e3),
        ("prefill time", "s", est.prefill_latency_s, res.prefill_s / max(res.rounds, 1)),
        ("decode throughput", "tok/s", est.decode_throughput_tok_s, res.decode_throughput_tok_s),
        ("generation throughput", "tok/s", est.generation_throughput_tok_s, res.generation_throughput_tok_s),
        ("device-tier peak memory", "MiB", est.gpu_peak_bytes / MIB, res.peak_device_bytes / MIB),
    ]
    out = [{"quantity": q, "unit": u, "predicted": p, "measured": m, "error": _err(p, m)} for q, u, p, m in rows]
    out.append({"quantity": "bottleneck / busiest lane", "unit": "", "predicted": est.bottleneck, "measured": busy,
                "error": None})
    return out


def _fmt(value) -> str:
    if isinstance(value, str):
        return value
    return f"{value:,.4g}"


def render_comparison(rows: list[dict], title: str, note: Optional[str] = None) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # rich Text, never markup: the title names the user's model, profile and plan
    table = Table(title=Text(title))
    for col, justify in (("quantity", "left"), ("predicted", "right"), ("measured", "right"), ("error", "right")):
        table.add_column(col, justify=justify)
    for row in rows:
        unit = f" {row['unit']}" if row["unit"] else ""
        err = "" if row["error"] is None else f"{100 * row['error']:+.1f}%"
        table.add_row(*(Text(cell) for cell in (row["quantity"], _fmt(row["predicted"]) + unit,
                                                 _fmt(row["measured"]) + unit, err)))
    console = Console()
    console.print(table)
    if note:
        console.print(Text.assemble(("note:", "yellow"), " ", note))
