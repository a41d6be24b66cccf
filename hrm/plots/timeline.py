"""Gantt chart of decode layers: one row per resource (GPU, CPU, CPU→GPU, GPU→CPU), one box
per micro-batch task (paper Fig. 6). From the model (:func:`hrm.pipelines.decode_timeline`)
and, when given, from a runtime Chrome trace (``hrm run --trace``) for the same policy."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from matplotlib.patches import Patch

from ..errors import HRMError
from ..cost.latency.lane import RESOURCES
from ..pipelines.list_scheduler import Timeline
from ._common import KIND_COLORS, KIND_LABELS, new_figure

RESOURCE_LABELS = {"gpu": "GPU", "cpu": "CPU", "h2d": "CPU→GPU", "d2h": "GPU→CPU"}
#: runtime task names (runtime/executor.py) → kinds of the model's timeline
TRACE_KINDS = (
    ("PreAttn", "pre_attn"), ("OffloadQKV", "qkv"), ("CPUAttn", "attention"), ("LoadH", "hidden"),
    ("W_PintoG", "weights"), ("PostAttn", "post_attn"), ("LoadKV", "kv"), ("StoreKV", "kv"),
    ("Layer", "post_attn"), ("FFNInToCPU", "hidden"), ("CPUExperts", "experts"), ("FFNOutToGPU", "hidden"),
    ("Merge", "post_attn"), ("Head", "head"), ("Collect", "hidden"), ("Prefill", "post_attn"),
)


@dataclass(frozen=True)
class Box:
    resource: str
    kind: str
    start_s: float
    end_s: float
    label: str = ""


def model_boxes(timeline: Timeline, first_layer: int = 1, last_layer: int | None = None):
    """Boxes of the tasks that run while layers ``first_layer..last_layer`` execute (the
    steady-state middle of the simulated layers), shifted so the window starts at 0."""
    last = len(timeline.layer_end_s) - 2 if last_layer is None else last_layer
    start, _ = timeline.window(first_layer)
    _, end = timeline.window(last)
    boxes = [Box(t.resource, t.kind, t.start_s - start, t.end_s - start, t.name)
             for t in timeline.tasks if t.end_s > start and t.start_s < end]
    return boxes, end - start


def _read_trace(path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
        data["traceEvents"]
        return data
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HRMError(f"{path}: not a Chrome trace written by hrm run --trace ({exc})") from None


def trace_policy(path) -> str | None:
    """The policy string ``hrm run --trace`` records in the trace's metadata (None if absent)."""
    meta = _read_trace(path).get("metadata") or {}
    return meta.get("policy") if isinstance(meta, dict) else None


def trace_boxes(path: str | Path, step: int | None = None, layer: int | None = None):
    """Boxes of one decode layer of a runtime Chrome trace: every task that overlaps the
    window of (step, layer) (default: the middle decode step, the middle layer)."""
    events = _read_trace(path)["traceEvents"]
    lanes = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    tasks = [e for e in events if e.get("ph") == "X"]
    decode = [e for e in tasks if e.get("args", {}).get("phase") == "decode" and "step" in e.get("args", {})]
    if not decode:
        raise HRMError(f"{path}: the trace has no decode tasks")
    steps = sorted({e["args"]["step"] for e in decode})
    step = steps[len(steps) // 2] if step is None else step
    layers = sorted({e["args"]["layer"] for e in decode if e["args"]["step"] == step})
    if not layers:
        raise HRMError(f"{path}: no decode step {step} in the trace (steps {steps[0]}..{steps[-1]})")
    layer = layers[len(layers) // 2] if layer is None else layer
    mine = [e for e in decode if e["args"]["step"] == step and e["args"].get("layer") == layer]
    if not mine:
        raise HRMError(f"{path}: no layer {layer} in decode step {step}")
    start_us = min(e["ts"] for e in mine)
    end_us = max(e["ts"] + e["dur"] for e in mine)
    boxes = []
    for e in tasks:
        if e["ts"] + e["dur"] <= start_us or e["ts"] >= end_us:
            continue
        kind = next((k for prefix, k in TRACE_KINDS if e["name"].startswith(prefix)), "other")
        boxes.append(Box(lanes.get(e["tid"], "other"), kind, (e["ts"] - start_us) * 1e-6,
                         (e["ts"] + e["dur"] - start_us) * 1e-6, e["name"]))
    return boxes, (end_us - start_us) * 1e-6, (step, layer)


def draw_boxes(ax, boxes, window_s: float, title: str, boundaries_s=()):
    """One row per resource; boxes coloured by task kind; time in ms."""
    rows = list(RESOURCES)
    for box in boxes:
        if box.resource not in rows:
            rows.append(box.resource)
    kinds = []
    for y, resource in enumerate(rows):
        mine = [b for b in boxes if b.resource == resource]
        for box in mine:
            if box.kind not in kinds:
                kinds.append(box.kind)
        ax.broken_barh([(b.start_s * 1e3, (b.end_s - b.start_s) * 1e3) for b in mine], (y - 0.38, 0.76),
                       facecolors=[KIND_COLORS.get(b.kind, KIND_COLORS["other"]) for b in mine],
                       edgecolor="white", linewidth=0.4, gid=f"lane:{resource}")
    ax.axvline(0, color="black", lw=0.8, ls=":")
    ax.axvline(window_s * 1e3, color="black", lw=0.8, ls=":")
    for t in boundaries_s:
        ax.axvline(t * 1e3, color="black", lw=0.6, ls=(0, (1, 4)))
    ax.set_yticks(range(len(rows)), [RESOURCE_LABELS.get(r, r) for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(handles=[Patch(color=KIND_COLORS[k], label=KIND_LABELS[k]) for k in kinds if k in KIND_LABELS],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0)
    return kinds


def plot_timeline(timeline: Timeline, description: str = "", trace: str | Path | None = None,
                  trace_step: int | None = None, trace_layer: int | None = None):
    """The model's timeline of the middle layers (and a runtime trace's layer below it)."""
    fig, axes = new_figure(12.0, 6.5 if trace else 3.6, 2 if trace else 1, 1)
    boxes, window = model_boxes(timeline)
    layers = len(timeline.layer_end_s) - 2
    start = timeline.window(1)[0]
    inner = [end - start for end in timeline.layer_end_s[1:layers]]
    head = (f"model ({timeline.schedule}): {description}\nlist-scheduled layer period "
            f"{timeline.layer_period_s * 1e3:.3g} ms; eq. 12 (perfect overlap) {timeline.lane_bound_s * 1e3:.3g} ms"
            f" — {layers} steady-state layer(s) between the dotted lines")
    draw_boxes(axes[0][0], boxes, window, head, inner)
    if trace:
        tboxes, twindow, (step, layer) = trace_boxes(trace, trace_step, trace_layer)
        draw_boxes(axes[1][0], tboxes, twindow,
                   f"measured (runtime trace {Path(trace).name}): decode step {step}, layer {layer}, "
                   f"{twindow * 1e3:.3g} ms")
    return fig
