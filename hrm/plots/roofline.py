"""The HRM plot of one operator (paper §3.3: Fig. 4 attention, Fig. 5 MoE FFN).

:func:`roofline_data` computes everything drawn — roofs, operator points, turning points —
from :mod:`hrm.cost.roofline` and :mod:`hrm.cost.costs`; :func:`plot_roofline` only draws it. Tests
compare the drawn lines with the data and the data with the profile.

Intensities (FLOP/byte) follow the paper's general operational intensity I_x^i:
- attention (decode, KV cache on the CPU): FLOPs over the bytes of the cache it reads,
  the same with respect to CPU memory and to the CPU→GPU link;
- MoE FFN on the GPU at micro-batch μ: I^gpu(μ) = FLOPs / bytes of the experts μ tokens
  touch in HBM; with respect to the CPU (weights paged in once per layer for the whole
  batch N): I^cpu(N) = FLOPs of N tokens / bytes of all the layer's routed experts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cost import costs
from ..machine.hardware import HardwareProfile
from ..model.spec import ModelSpec
from ..model.options import DEFAULT_OPTIONS, ModelOptions
from ..cost.roofline import attainable, balance_point, hrm_from_profile, turning_point_p1, turning_point_p2
from ..units import TFLOPS
from ._common import new_figure, si_rate

OPERATORS = ("attention", "moe-ffn")
DEFAULT_BATCH_SIZES = (16, 64, 256, 1024, 4096)


@dataclass(frozen=True)
class Roof:
    key: str            # gid of the drawn line, e.g. "roof:gpu-compute"
    label: str
    kind: str           # "compute" (FLOP/s) or "memory" (bytes/s)
    value: float        # FLOP/s or bytes/s
    cap_flops: float    # a memory roof rises until this compute roof


@dataclass(frozen=True)
class OperatorLine:
    """A vertical operator line at ``intensity`` with its attainable performance on tiers."""

    key: str
    label: str
    intensity: float
    cpu_flops: float                  # computing on the CPU, data in CPU memory
    gpu_flops: float                  # computing on the GPU, data fetched from CPU memory


@dataclass(frozen=True)
class Point:
    key: str
    label: str
    intensity: float
    flops: float


@dataclass(frozen=True)
class RooflineData:
    title: str
    operator: str
    roofs: list[Roof]
    lines: list[OperatorLine]
    points: list[Point]                   # P1, P2 (eq. 11's balance point named in P2's label)
    kernel_flops: float | None = None     # MoE FFN kernel at μ on the GPU (Fig. 5's orange line)
    kernel_label: str = ""
    x_range: tuple[float, float] = (1e-2, 1e4)


def _roofs(hw: HardwareProfile, options: ModelOptions) -> tuple[list[Roof], object]:
    hrm = hrm_from_profile(hw, options)
    gpu, cpu = hrm.level("gpu"), hrm.level("cpu")
    link = hrm.cross_bandwidth[("cpu", "gpu")]
    device = "device tier (emulated on CPU)" if hw.gpu is None else ("GPU" if hw.gpu_count == 1 else f"{hw.gpu_count}×GPU")
    device_flops = hw.gpu.tflops if hw.gpu else (hw.emulation.tflops if hw.emulation and options.use_emulation
                                                 else hw.cpu.tflops)
    roofs = [
        Roof("roof:gpu-compute", f"{device} {device_flops.dtype_used(options.gpu_compute_dtype)} peak: "
             f"{si_rate(gpu.peak_flops, 'FLOP/s')}", "compute", gpu.peak_flops, gpu.peak_flops),
        Roof("roof:cpu-compute", f"CPU {hw.cpu.tflops.dtype_used(options.cpu_compute_dtype)} peak: "
             f"{si_rate(cpu.peak_flops, 'FLOP/s')}", "compute", cpu.peak_flops, cpu.peak_flops),
        Roof("roof:gpu-memory", f"{device} memory: {si_rate(gpu.bandwidth_bytes_s, 'B/s')}",
             "memory", gpu.bandwidth_bytes_s, gpu.peak_flops),
        Roof("roof:cpu-memory", f"CPU memory: {si_rate(cpu.bandwidth_bytes_s, 'B/s')}",
             "memory", cpu.bandwidth_bytes_s, cpu.peak_flops),
        Roof("roof:cpu-gpu-link", f"CPU→GPU link: {si_rate(link, 'B/s')}", "memory", link, gpu.peak_flops),
    ]
    return roofs, hrm


def roofline_data(hw: HardwareProfile, model: ModelSpec, operator: str = "moe-ffn", context: int = 512,
                  micro_batch: int = 128, batch_sizes=DEFAULT_BATCH_SIZES, kv_dtypes=("fp16", "int4"),
                  options: ModelOptions = DEFAULT_OPTIONS) -> RooflineData:
    """Roofs, operator lines and turning points for ``operator`` ('attention' or 'moe-ffn')."""
    from ..errors import HRMError

    if operator not in OPERATORS:
        raise HRMError(f"unknown operator '{operator}' (one of {', '.join(OPERATORS)})")
    options = options.for_model(model)
    roofs, hrm = _roofs(hw, options)
    link = hrm.cross_bandwidth[("cpu", "gpu")]
    if operator == "attention":
        lines, points = [], []
        for dtype in kv_dtypes:
            spec = model.model_copy(update={"kv_dtype": dtype})
            op = costs.decode_attention(spec, 1, context)
            i = float(op.flops / op.kv_bytes)
            lines.append(OperatorLine(f"op:attention-{dtype}", f"attention, KV {dtype} (I = {i:.2g})", i,
                                      float(attainable(hrm, "cpu", i)), float(attainable(hrm, "gpu", i, "cpu", i))))
            # eq. 9: below P1 moving the KV cache to the GPU cannot beat attention on the CPU
            p1 = float(turning_point_p1(hrm, "gpu", "cpu", i))
            points.append(Point(f"point:p1-{dtype}", f"P1 (KV {dtype}): I = {p1:.3g}", p1, p1 * link))
        title = f"HRM: {model.name} decode attention (GQA core, KV on CPU), context {context}, on {hw.name}"
        xs = [line.intensity for line in lines] + [p.intensity for p in points]
        return RooflineData(title, operator, roofs, lines, points, x_range=_x_range(roofs, xs))
    if model.num_experts <= 1:
        raise HRMError(f"{model.name} has no routed experts; plot the attention operator instead")
    kernel_op = costs.routed_experts(model, micro_batch)
    i_gpu = float(kernel_op.intensity())
    kernel = float(attainable(hrm, "gpu", i_gpu))
    lines = []
    for batch_size in batch_sizes:
        flops = float(costs.routed_experts(model, batch_size).flops)
        i_cpu = flops / costs.layer_expert_bytes(model)
        cpu_i = float(costs.routed_experts(model, batch_size).intensity())
        lines.append(OperatorLine(f"op:ffn-N{batch_size}", f"N={batch_size}", i_cpu, float(attainable(hrm, "cpu", cpu_i)),
                                  float(attainable(hrm, "gpu", i_gpu, "cpu", i_cpu))))
    cpu_peak = hrm.level("cpu").peak_flops
    # eq. 9 at the intensity where the link roof meets what the CPU attains itself
    p1 = float(turning_point_p1(hrm, "gpu", "cpu", cpu_peak / link))
    p2 = float(turning_point_p2(hrm, "gpu", "cpu", i_gpu))            # eq. 10
    balance = float(balance_point(hrm, "gpu", "cpu", i_gpu))           # eq. 11
    # eq. 11's balance point equals P2 when the kernel is memory-bound; a compute-bound kernel
    # puts it above the compute roof, where nothing is attained: name it in P2's label
    same = np.isclose(balance, p2, rtol=1e-6)
    p2_label = (f"P2 = balance point (μ={micro_batch}): I = {p2:.3g}" if same else
                f"P2 (μ={micro_batch}, compute-bound kernel; eq. 11 balance at I = {balance:.3g}): I = {p2:.3g}")
    points = [Point("point:p1", f"P1: I = {p1:.3g}", p1, p1 * link), Point("point:p2", p2_label, p2, p2 * link)]
    title = f"HRM: {model.name} MoE FFN (decode), μ={micro_batch}, on {hw.name}"
    xs = [line.intensity for line in lines] + [p.intensity for p in points] + [i_gpu]
    return RooflineData(title, operator, roofs, lines, points, kernel,
                        f"MoE FFN kernel on GPU, μ={micro_batch}: {si_rate(kernel, 'FLOP/s')}", _x_range(roofs, xs))


def _x_range(roofs: list[Roof], intensities) -> tuple[float, float]:
    ridges = [r.cap_flops / r.value for r in roofs if r.kind == "memory"]
    values = [v for v in [*ridges, *intensities] if v > 0]
    return min(values) / 8, max(values) * 8


ROOF_STYLE = {
    "roof:gpu-compute": dict(color="#1f77b4", ls="-"), "roof:cpu-compute": dict(color="#d62728", ls="-"),
    "roof:gpu-memory": dict(color="#1f77b4", ls="--"), "roof:cpu-memory": dict(color="#d62728", ls="--"),
    "roof:cpu-gpu-link": dict(color="#2ca02c", ls="-."),
}


def plot_roofline(data: RooflineData, ax=None):
    """Draw :class:`RooflineData` on ``ax`` (a new figure when None); returns the figure."""
    if ax is None:
        fig, axes = new_figure(11.5, 6.0)
        ax = axes[0][0]
    fig = ax.figure
    lo, hi = data.x_range
    xs = np.geomspace(lo, hi, 400)
    for roof in data.roofs:
        style = ROOF_STYLE.get(roof.key, {})
        if roof.kind == "compute":
            ax.plot([lo, hi], [roof.value / TFLOPS] * 2, lw=2, label=roof.label, gid=roof.key, **style)
        else:
            x = xs[roof.value * xs <= roof.cap_flops * (1 + 1e-9)]
            x = np.append(x, roof.cap_flops / roof.value)
            ax.plot(x, roof.value * x / TFLOPS, lw=2, label=roof.label, gid=roof.key, **style)
    if data.kernel_flops is not None:
        ax.plot([lo, hi], [data.kernel_flops / TFLOPS] * 2, color="#ff7f0e", lw=1.5, ls=":",
                label=data.kernel_label, gid="op:kernel")
    y_lo = min(r.value * lo for r in data.roofs if r.kind == "memory") / TFLOPS
    y_hi = max(r.value for r in data.roofs if r.kind == "compute") / TFLOPS * 30
    line_colors = ["#8c564b", "#9467bd", "#7f7f7f", "#bcbd22", "#17becf", "#e377c2", "#000000"]
    for k, line in enumerate(data.lines):
        color = line_colors[k % len(line_colors)]
        ax.plot([line.intensity] * 2, [y_lo, y_hi], color=color, lw=1, ls=(0, (4, 3)), gid=line.key)
        ax.plot([line.intensity], [line.cpu_flops / TFLOPS], marker="s", color=color, ms=6, ls="none",
                gid=line.key + ":cpu")
        ax.plot([line.intensity], [line.gpu_flops / TFLOPS], marker="o", color=color, ms=6, ls="none",
                gid=line.key + ":gpu")
        # label at the top, on a white box so that no roof line runs through it
        ax.annotate(line.label, (line.intensity, y_hi), xytext=(2, -4), textcoords="offset points",
                    rotation=90, fontsize=8, color=color, va="top", ha="left",
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85))
    markers = {"point:p1": "*", "point:p2": "P"}
    fills = ["gold", "white", "orange", "cyan"]
    for k, point in enumerate(data.points):
        marker = next((m for key, m in markers.items() if point.key.startswith(key)), "*")
        ax.plot([point.intensity], [point.flops / TFLOPS], marker=marker, ms=13, color="black",
                markerfacecolor=fills[k % len(fills)], ls="none", label=point.label, gid=point.key, zorder=5)
    ax.plot([], [], marker="s", color="grey", ls="none", label="operator on CPU (data in CPU memory)")
    ax.plot([], [], marker="o", color="grey", ls="none", label="operator on GPU (data from CPU memory)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(y_lo, y_hi)
    ax.set_xlabel("operational intensity (FLOP/byte)")
    ax.set_ylabel("attainable performance (TFLOP/s)")
    ax.set_title(data.title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig
