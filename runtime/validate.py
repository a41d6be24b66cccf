"""Validation of the performance model against the reference runtime (docs/model.md §8, §9).

For each of a set of diverse policies (μ, n, r_w, attention tier, FFN tier, r_c): predict
with :func:`hrm.estimate.estimate` (never fitted to these runs), execute with
:class:`runtime.executor.PlanExecutor`, and compare per-layer decode latency, throughput and
peak device-tier memory. Summary: MAPE of the per-layer decode latency, Spearman rank
correlation of policies by predicted vs measured generation throughput, and — to say which
term of the model is off — the ratio measured/predicted of each resource's per-layer time
(gpu, cpu, h2d, d2h lanes).
"""

from __future__ import annotations

import csv
import io
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from hrm.errors import HRMError
from hrm.estimate import EstimateResult, estimate
from hrm.machine.hardware import HardwareProfile
from hrm.model.spec import ModelSpec
from hrm.model.options import ModelOptions
from hrm.model.options import options_in_dtype as runtime_options  # noqa: F401 (the runtime's names)
from hrm.model.options import spec_in_dtype as runtime_spec  # noqa: F401
from hrm.policy import Policy
from hrm.workload import Workload

#: the engine file that describes what this runtime does (hrm/data/engines/hrm-runtime.yaml)
RUNTIME_ENGINE = "hrm-runtime"

MEMORY_TOLERANCE = 0.10  # measured device peak may exceed the model's GPU peak by this much
RESOURCES = ("gpu", "cpu", "h2d", "d2h")

# (μ, n, r_w, attn_on_gpu, ffn_on_gpu, r_c): spans micro-batch size, pipeline depth, static
# weight share, both attention tiers, CPU experts and GPU-resident KV.
POLICY_GRID = [
    (8, 2, 0.0, False, True, 0.0),
    (8, 4, 0.5, False, True, 0.0),
    (16, 1, 1.0, False, True, 0.0),
    (4, 4, 0.0, False, True, 0.0),
    (8, 2, 0.0, True, True, 0.0),
    (16, 2, 0.5, True, True, 0.5),
    (32, 1, 0.0, False, True, 0.0),
    (8, 2, 0.0, False, False, 0.0),
    (4, 2, 1.0, True, True, 1.0),
    (32, 2, 0.5, False, True, 0.0),
    (16, 4, 0.0, False, True, 0.0),
    (2, 8, 0.0, False, True, 0.0),
    (16, 2, 0.0, True, False, 0.0),
    (32, 1, 1.0, True, True, 0.0),
]


def validation_policies(count: int = 10) -> list[Policy]:
    """``count`` (≥ 8) diverse policies: the hand-picked grid first, then more μ/n/r_w mixes."""
    if count < 8:
        raise HRMError(f"--policies must be at least 8 (diverse μ, n, r_w, attention tier), got {count}")
    grid = list(POLICY_GRID)
    extra = [(mu, n, rw, False, True, 0.0) for mu in (2, 4, 8, 16, 32) for n in (1, 2, 4, 8) for rw in (0.0, 0.25, 0.75)]
    for item in extra:
        if len(grid) >= count:
            break
        if item not in grid:
            grid.append(item)
    return [Policy(batch_size=mu * n, micro_batch_size=mu, num_micro_batches=n, weights_gpu_ratio=rw,
                   attn_on_gpu=attn, ffn_on_gpu=ffn, kv_gpu_ratio=rc) for mu, n, rw, attn, ffn, rc in grid[:count]]


# Model variants re-scored on the same measurements, to show what each mechanism is worth:
# option overrides of hrm.model.options.ModelOptions (all on = the model as validated).
ABLATIONS = {
    "without dispatch overhead": {"use_dispatch_overhead": False},
    "cpu-section rates instead of the emulated tier": {"use_emulation": False},
    "neither (roofline with the cpu section only)": {"use_dispatch_overhead": False, "use_emulation": False},
}


def ablation_scores(hw: HardwareProfile, spec: ModelSpec, workload: Workload, options: ModelOptions,
                    outcomes: list["PolicyOutcome"]) -> dict[str, dict[str, float]]:
    """MAPE and Spearman of each :data:`ABLATIONS` variant against the same measurements."""
    return {name: rescore(hw, spec, workload, options.model_copy(update=update), outcomes)
            for name, update in ABLATIONS.items()}


def rescore(hw: HardwareProfile, spec: ModelSpec, workload: Workload, options: ModelOptions,
            outcomes: list["PolicyOutcome"]) -> dict[str, float]:
    """MAPE and Spearman of predictions from ``hw`` / ``options`` against the measurements
    of ``outcomes`` (e.g. a model variant, or a second profile of the same host)."""
    preds = [estimate(hw, spec, workload, o.policy, options=options, engine=RUNTIME_ENGINE) for o in outcomes]
    mape = statistics.fmean(abs(p.decode_layer_latency_s - o.layer_latency_s) / o.layer_latency_s
                            for p, o in zip(preds, outcomes))
    rank = _spearman([p.generation_throughput_tok_s for p in preds], [o.generation_throughput_tok_s for o in outcomes])
    return {"mape": mape, "spearman": rank}


@dataclass
class PolicyOutcome:
    policy: Policy
    predicted: EstimateResult
    layer_latency_s: float  # median over repeats
    decode_throughput_tok_s: float
    generation_throughput_tok_s: float
    prefill_s: float
    peak_device_bytes: int
    lane_layer_s: dict[str, float]  # measured busy seconds per layer per lane (decode, lm_head excluded)
    repeats: list[float] = field(default_factory=list)

    @property
    def latency_error(self) -> float:
        return (self.predicted.decode_layer_latency_s - self.layer_latency_s) / self.layer_latency_s

    @property
    def overlap_ratio(self) -> float:
        """Measured layer time over the sum of the lanes' busy time: 1 = lanes ran one after
        another (what the model assumes on a CPU-only host), < 1 = they overlapped."""
        total = sum(self.lane_layer_s.values())
        return self.layer_latency_s / total if total else float("nan")

    @property
    def memory_ratio(self) -> float:
        return self.peak_device_bytes / self.predicted.gpu_peak_bytes if self.predicted.gpu_peak_bytes else float("inf")

    @property
    def memory_ok(self) -> bool:
        return self.memory_ratio <= 1.0 + MEMORY_TOLERANCE

    def row(self) -> dict:
        p, est = self.policy, self.predicted
        out = {
            "policy": p.short(), "mu": p.micro_batch_size, "n": p.num_micro_batches, "N": p.batch_size,
            "attn": "gpu" if p.attn_on_gpu else "cpu", "ffn": "gpu" if p.ffn_on_gpu else "cpu",
            "rw": p.weights_gpu_ratio, "rc": p.kv_gpu_ratio,
            "pred_layer_ms": est.decode_layer_latency_s * 1e3, "meas_layer_ms": self.layer_latency_s * 1e3,
            "layer_error": self.latency_error,
            "pred_decode_tok_s": est.decode_throughput_tok_s, "meas_decode_tok_s": self.decode_throughput_tok_s,
            "pred_gen_tok_s": est.generation_throughput_tok_s, "meas_gen_tok_s": self.generation_throughput_tok_s,
            "pred_prefill_s": est.prefill_latency_s, "meas_prefill_s": self.prefill_s,
            "pred_gpu_peak_bytes": est.gpu_peak_bytes, "meas_device_peak_bytes": self.peak_device_bytes,
            "memory_ratio": self.memory_ratio, "memory_ok": self.memory_ok, "bottleneck": est.bottleneck,
            "overlap_ratio": self.overlap_ratio,
        }
        for r in RESOURCES:
            out[f"pred_{r}_ms"] = est.resource_layer_s.get(r, 0.0) * 1e3
            out[f"meas_{r}_ms"] = self.lane_layer_s.get(r, 0.0) * 1e3
        return out


@dataclass
class ValidationReport:
    hardware: str
    model: str
    workload: Workload
    device: str
    outcomes: list[PolicyOutcome]
    load_average: Optional[tuple[float, float, float]] = None
    ablations: dict[str, dict[str, float]] = field(default_factory=dict)
    lanes: str = "auto"

    @property
    def mape(self) -> float:
        """Mean |predicted − measured| / measured of the per-layer decode latency."""
        return statistics.fmean(abs(o.latency_error) for o in self.outcomes)

    @property
    def spearman(self) -> float:
        """Rank correlation of policies by predicted vs measured generation throughput."""
        return _spearman([o.predicted.generation_throughput_tok_s for o in self.outcomes],
                         [o.generation_throughput_tok_s for o in self.outcomes])

    @property
    def spearman_decode(self) -> float:
        return _spearman([o.predicted.decode_throughput_tok_s for o in self.outcomes],
                         [o.decode_throughput_tok_s for o in self.outcomes])

    @property
    def memory_ok(self) -> bool:
        return all(o.memory_ok for o in self.outcomes)

    def term_ratios(self) -> dict[str, float]:
        """Median over policies of measured/predicted per-layer time of each resource lane
        (where the model predicts a non-negligible time): > 1 means the model's term is too
        optimistic, < 1 too pessimistic."""
        out = {}
        for r in RESOURCES:
            ratios = [o.lane_layer_s.get(r, 0.0) / o.predicted.resource_layer_s[r] for o in self.outcomes
                      if o.predicted.resource_layer_s.get(r, 0.0) > 0.02 * o.predicted.decode_layer_latency_s]
            if ratios:
                out[r] = statistics.median(ratios)
        return out

    @property
    def mape_if_overlapped(self) -> float:
        """MAPE if the model took the max over its resource terms (eq. 12, as on a GPU host)
        instead of their sum — the same terms, only the composition differs."""
        return statistics.fmean(abs(max(o.predicted.resource_layer_s.values()) - o.layer_latency_s) / o.layer_latency_s
                                for o in self.outcomes)

    @property
    def median_overlap_ratio(self) -> float:
        return statistics.median(o.overlap_ratio for o in self.outcomes)

    def diagnosis(self) -> str:
        """One paragraph: target met or not, by how much, and which term is off the most."""
        ratios = self.term_ratios()
        worst = max(ratios, key=lambda r: abs(_log(ratios[r]))) if ratios else None
        mape_gap = "met" if self.mape <= 0.10 else f"missed by {100 * (self.mape - 0.10):.1f} points"
        rank_gap = "met" if self.spearman >= 0.9 else f"missed by {0.9 - self.spearman:.3f}"
        parts = [f"MAPE {100 * self.mape:.1f}% (target <= 10%: {mape_gap})",
                 f"Spearman {self.spearman:.3f} (target >= 0.9: {rank_gap})"]
        if worst is not None:
            parts.append(f"term furthest off: {worst} lane, measured/predicted per-layer time x{ratios[worst]:.2f} "
                         "(median over policies)")
        if self.median_overlap_ratio < 0.9:
            parts.append(f"lanes overlapped (measured layer = {self.median_overlap_ratio:.2f} x sum of lane busy time, "
                         f"median); with the max of the terms instead of their sum MAPE would be "
                         f"{100 * self.mape_if_overlapped:.1f}%")
        if self.load_average and self.load_average[0] > 1.5:
            parts.append(f"host load average {self.load_average[0]:.1f} during the run (other processes share the cores)")
        return "; ".join(parts)

    def to_json(self) -> dict:
        return {
            "mape": self.mape, "spearman": self.spearman, "spearman_decode": self.spearman_decode,
            "memory_ok": self.memory_ok, "term_ratios": self.term_ratios(), "diagnosis": self.diagnosis(),
            "mape_if_overlapped": self.mape_if_overlapped, "median_overlap_ratio": self.median_overlap_ratio,
            "hardware": self.hardware, "model": self.model, "device": self.device,
            "workload": self.workload.model_dump(), "load_average": self.load_average,
            "lanes": self.lanes, "ablations": self.ablations,
            "policies": [o.row() for o in self.outcomes],
        }


def _log(x: float) -> float:
    import math

    return math.log(max(x, 1e-12))


def _spearman(a: list[float], b: list[float]) -> float:
    from scipy.stats import spearmanr

    if len(a) < 2:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def _lane_layer_s(result, runs: int) -> dict[str, float]:
    """Busy seconds per lane per layer during decode, without the lm_head (the model's
    per-layer resource times leave it out too)."""
    busy: dict[str, float] = {}
    for rec in result.records:
        if rec.args.get("phase") != "decode" or rec.name.startswith(("Head", "Collect")):
            continue
        busy[rec.lane] = busy.get(rec.lane, 0.0) + rec.duration_s
    return {k: v / runs for k, v in busy.items()} if runs else {}


def tracked_peak_bytes(spec: ModelSpec, weights, workload: Workload, policy: Policy, requests, device: str = "auto",
                       lanes: str = "auto") -> int:
    """Peak device-tier bytes of one run with memory tracking (not timed). On CUDA a throwaway
    executor runs first: it sets up what the process keeps afterwards (a cuBLAS workspace per lane
    stream, 32 MiB each on Hopper), so the measured executor's peak is the plan's own."""
    from .device import resolve_device
    from .executor import PlanExecutor

    if resolve_device(device) == "cuda":
        with PlanExecutor(spec, weights, policy, workload, device=device, track_memory=False, keep_logits=False,
                          lanes=lanes) as ex:
            ex.run(requests)
    with PlanExecutor(spec, weights, policy, workload, device=device, track_memory=True, keep_logits=False,
                      lanes=lanes) as ex:
        return ex.run(requests).peak_device_bytes


def timed_run(spec: ModelSpec, weights, workload: Workload, policy: Policy, requests, device: str = "auto",
              lanes: str = "auto"):
    """One timed run in a fresh executor, after an untracked warm-up run (allocator and
    caches in the state of a timed run)."""
    from .executor import PlanExecutor

    with PlanExecutor(spec, weights, policy, workload, device=device, track_memory=False, keep_logits=False,
                      lanes=lanes) as ex:
        ex.run(requests)
        ex.tier.tracer.clear()
        return ex.run(requests)


def outcome_of(policy: Policy, predicted: EstimateResult, peak: int, timed: list, num_layers: int) -> PolicyOutcome:
    """Medians over the timed runs; lane busy times of the median run."""
    layer = [r.decode_layer_latency_s for r in timed]
    mid = sorted(range(len(timed)), key=lambda k: layer[k])[len(timed) // 2]
    best = timed[mid]
    return PolicyOutcome(
        policy=policy, predicted=predicted, layer_latency_s=layer[mid],
        decode_throughput_tok_s=statistics.median(r.decode_throughput_tok_s for r in timed),
        generation_throughput_tok_s=statistics.median(r.generation_throughput_tok_s for r in timed),
        prefill_s=statistics.median(r.prefill_s for r in timed), peak_device_bytes=peak,
        lane_layer_s=_lane_layer_s(best, best.decode_steps * num_layers), repeats=layer,
    )


def measure_policy(hw: HardwareProfile, spec: ModelSpec, weights, workload: Workload, policy: Policy,
                   options: ModelOptions, *, device: str = "auto", repeats: int = 3, seed: int = 0,
                   lanes: str = "auto") -> PolicyOutcome:
    """Predict, then run once with memory tracking and ``repeats`` times for timing (medians)."""
    from .requests import synthetic_requests

    predicted = estimate(hw, spec, workload, policy, options=options, engine=RUNTIME_ENGINE)
    requests = synthetic_requests(workload, policy.batch_size, spec.vocab_size, seed)
    peak = tracked_peak_bytes(spec, weights, workload, policy, requests, device, lanes)
    timed = [timed_run(spec, weights, workload, policy, requests, device, lanes) for _ in range(max(repeats, 1))]
    return outcome_of(policy, predicted, peak, timed, spec.num_layers)


def run_validation(hw: HardwareProfile, spec: ModelSpec, workload: Workload, policies: list[Policy], *,
                   device: str = "auto", dtype: str = "fp32", repeats: int = 3, seed: int = 0,
                   progress: Optional[Callable[[str], None]] = None, lanes: str = "auto") -> ValidationReport:
    """Predicted vs measured for every policy (same weights, requests and workload). The
    timed runs go in rounds — every policy once per round — so that a slow drift of the
    host's speed (other processes, a shared VM) spreads over all policies instead of
    landing on the few measured while it lasts."""
    from .device import resolve_device
    from .model import build_weights
    from .requests import synthetic_requests

    spec = runtime_spec(spec, dtype)
    options = runtime_options(dtype)
    weights = build_weights(spec, None, seed)
    requests = [synthetic_requests(workload, p.batch_size, spec.vocab_size, seed) for p in policies]
    predicted = [estimate(hw, spec, workload, p, options=options, engine=RUNTIME_ENGINE) for p in policies]
    peaks = [tracked_peak_bytes(spec, weights, workload, p, r, device, lanes) for p, r in zip(policies, requests)]
    timed: list[list] = [[] for _ in policies]
    for round_index in range(max(repeats, 1)):
        for runs, policy, reqs in zip(timed, policies, requests):
            runs.append(timed_run(spec, weights, workload, policy, reqs, device, lanes))
        if progress:
            progress(f"round {round_index + 1}/{max(repeats, 1)} of {len(policies)} policies done")
    outcomes = [outcome_of(p, est, peak, runs, spec.num_layers) for p, est, peak, runs in zip(policies, predicted, peaks, timed)]
    for k, outcome in enumerate(outcomes, 1):
        if progress:
            progress(f"[{k}/{len(policies)}] {outcome.policy.short()}: predicted "
                     f"{outcome.predicted.decode_layer_latency_s * 1e3:.3f} ms/layer, measured "
                     f"{outcome.layer_latency_s * 1e3:.3f} ms/layer ({100 * outcome.latency_error:+.0f}%)")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    kind = "cuda" if resolve_device(device) == "cuda" else "emulated"
    ablations = ablation_scores(hw, spec, workload, options, outcomes)
    return ValidationReport(hw.name, spec.name, workload, kind, outcomes, load, ablations, lanes)


# --- outputs ----------------------------------------------------------------------------

def csv_text(report: ValidationReport) -> str:
    rows = [o.row() for o in report.outcomes]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def write_outputs(report: ValidationReport, out_dir: str | Path) -> list[Path]:
    """validation.csv, validation.png and validation.json in ``out_dir``, made where missing:
    all three or none (:func:`hrm.plan.write_files_atomic`)."""
    import json

    from hrm.plan import write_files_atomic

    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)  # the CLI checks it can be made before the runs
    png = io.BytesIO()
    plot_validation(report).savefig(png, dpi=110, format="png")
    files = [(folder / "validation.csv", csv_text(report)), (folder / "validation.png", png.getvalue()),
             (folder / "validation.json", json.dumps(report.to_json(), indent=2) + "\n")]
    write_files_atomic(files)
    return [path for path, _ in files]


def runs_document(hardware: str, model: str, dtype: str, workload: Workload,
                  measured: list[tuple[str, float, float]]) -> dict:
    """A runs file for ``hrm calibrate`` (docs/calibrate.md) of validation measurements:
    ``measured`` holds (policy text, decode tok/s, prefill s) per policy, run by this runtime
    (engine :data:`RUNTIME_ENGINE`) in ``dtype``; ``hardware`` and ``model`` as the runs file
    names them (a shipped name, or a path: relative ones resolve beside the runs file)."""
    return {
        "hardware": hardware, "model": model, "dtype": dtype,
        "runs": [{"name": policy, "engine": RUNTIME_ENGINE,
                  "workload": {"prompt_len": workload.prompt_len, "max_prompt_len": workload.max_prompt_len,
                               "gen_len": workload.gen_len, "padding": workload.padding},
                  "policy": policy,
                  "measured": {"decode_throughput_tok_s": float(decode_tok_s), "ttft_s": float(prefill_s)}}
                 for policy, decode_tok_s, prefill_s in measured],
    }


def report_measurements(report: ValidationReport) -> list[tuple[str, float, float]]:
    """(policy text, decode tok/s, prefill s) of each policy of ``report``, for :func:`runs_document`."""
    return [(o.policy.short(), o.decode_throughput_tok_s, o.prefill_s) for o in report.outcomes]


def write_plot(report: ValidationReport, path: str | Path) -> None:
    from hrm.plots import save_png

    save_png(plot_validation(report), path, dpi=110)


def plot_validation(report: ValidationReport):
    """Predicted vs measured scatter (per-layer decode latency; generation throughput), y = x."""
    from matplotlib.ticker import FuncFormatter

    from hrm.plots import new_figure

    fig, grid = new_figure(11, 4.8, 1, 2)
    axes = grid[0]
    pairs = [
        ([o.layer_latency_s * 1e3 for o in report.outcomes], [o.predicted.decode_layer_latency_s * 1e3 for o in report.outcomes],
         "per-layer decode latency (ms)", f"MAPE {100 * report.mape:.1f}%"),
        ([o.generation_throughput_tok_s for o in report.outcomes],
         [o.predicted.generation_throughput_tok_s for o in report.outcomes],
         "generation throughput (tok/s)", f"Spearman {report.spearman:.2f}"),
    ]
    for ax, (meas, pred, label, stat) in zip(axes, pairs):
        colors = ["tab:orange" if o.policy.attn_on_gpu else "tab:blue" for o in report.outcomes]
        ax.scatter(meas, pred, c=colors)
        for o, x, y in zip(report.outcomes, meas, pred):
            ax.annotate(_label(o.policy), (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
        lo = min(min(meas), min(pred)) * 0.8
        hi = max(max(meas), max(pred)) * 1.25
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="y = x")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):  # plain numbers, not 2×10^1
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel(f"measured {label}")
        ax.set_ylabel(f"predicted {label}")
        ax.set_title(stat)
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(f"{report.model} on {report.hardware} (device tier: {report.device}); "
                 f"blue = CPU attention, orange = device attention", fontsize=9)
    return fig


def _label(p: Policy) -> str:
    tiers = ("" if not p.attn_on_gpu else f" attnG rc{p.kv_gpu_ratio:g}") + ("" if p.ffn_on_gpu else " ffnC")
    return f"μ{p.micro_batch_size} n{p.num_micro_batches} rw{p.weights_gpu_ratio:g}{tiers}"


def render_report(report: ValidationReport, file=None) -> None:
    from rich.console import Console
    from rich.table import Table

    from rich.text import Text

    # names come from the user's files: plain text, never markup
    table = Table(title=Text(f"{report.model} on {report.hardware}: predicted vs measured (device tier "
                             f"{report.device}, prompt {report.workload.prompt_len}, gen {report.workload.gen_len})"))
    for col in ("policy", "pred ms/layer", "meas ms/layer", "error", "pred gen tok/s", "meas gen tok/s",
                "device peak / model", "largest measured lane"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for o in report.outcomes:
        lane = max(o.lane_layer_s, key=o.lane_layer_s.get) if o.lane_layer_s else "-"
        mem = f"{100 * o.memory_ratio:.0f}%" + ("" if o.memory_ok else " [red]OVER[/red]")
        table.add_row(_label(o.policy), f"{o.predicted.decode_layer_latency_s * 1e3:.3f}", f"{o.layer_latency_s * 1e3:.3f}",
                      f"{100 * o.latency_error:+.0f}%", f"{o.predicted.generation_throughput_tok_s:,.0f}",
                      f"{o.generation_throughput_tok_s:,.0f}", mem, lane)
    console = Console(file=file or sys.stdout, width=140)
    console.print(table)
    ratios = report.term_ratios()
    if ratios:
        console.print("measured/predicted per-layer time by resource (median): "
                      + ", ".join(f"{k} x{v:.2f}" for k, v in ratios.items()))
    if report.ablations:
        console.print("same measurements, model variants: " + "; ".join(
            f"{name}: MAPE {100 * s['mape']:.1f}%, Spearman {s['spearman']:.3f}" for name, s in report.ablations.items()))
    console.print(report.diagnosis())
