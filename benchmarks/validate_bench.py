"""Prediction accuracy of the HRM model against the reference runtime on this machine.

Runs ``hrm validate`` for each model (default tiny-mixtral and small-mixtral) with a hardware
profile (default: measure this machine with ``hrm profile --quick`` right before each model,
so that profile and runs see the same host load), and prints the per-policy table, MAPE of
the per-layer decode latency, Spearman rank correlation of the generation throughput, the
measured/predicted ratio of each resource term, and — on the same measurements — the scores
of the model without its dispatch-overhead and emulated-tier terms (ablations).

Run: python benchmarks/validate_bench.py [--hw PROFILE.yaml] [--models tiny-mixtral small-mixtral]
                                         [--policies 10] [--repeats 4] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.workload import make_workload
from runtime.validate import (render_report, rescore, run_validation, runtime_options, runtime_spec,
                              validation_policies, write_outputs)


def measured_profile(folder: Path, stem: str = "this-host") -> str:
    """Profile this machine (quick) into ``folder`` and return the YAML path."""
    path = folder / f"{stem}.yaml"
    subprocess.run([sys.executable, "-m", "hrm_cli", "profile", "--quick", "--no-disk", "--no-progress",
                    "--name", stem, "--out", str(path)], check=True)
    return str(path)


def profile_drift(before, after) -> dict[str, float]:
    """after / before of the emulated tier's copy rate, its matmul rate at M = 4 and the
    pre-attention dispatch α: how much the host's speed moved during the runs."""
    from hrm.machine.hardware import interpolate_curve

    out = {}
    if before.emulation and after.emulation:
        out["copy_gbps"] = after.emulation.copy_gbps / before.emulation.copy_gbps
        curve = lambda hw: float(interpolate_curve(hw.emulation.matmul_tflops_vs_m["fp32"], 4.0))  # noqa: E731
        out["matmul_m4"] = curve(after) / curve(before)
    if before.cpu.dispatch and after.cpu.dispatch:
        out["pre_attn_s"] = after.cpu.dispatch.pre_attn_s / before.cpu.dispatch.pre_attn_s
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hw", help="hardware profile (default: profile this machine now, --quick)")
    parser.add_argument("--models", nargs="+", default=["tiny-mixtral", "small-mixtral"])
    parser.add_argument("--policies", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=4, help="rounds of timed runs (every policy once per round)")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--gen-len", type=int, default=8)
    parser.add_argument("--out", help="folder for validation-<model>.{csv,png,json}")
    args = parser.parse_args()
    work = Path(args.out or tempfile.mkdtemp(prefix="hrm-validate-"))
    work.mkdir(parents=True, exist_ok=True)
    workload = make_workload(None, prompt_len=args.prompt_len, max_prompt_len=args.prompt_len, gen_len=args.gen_len)
    summary = Table(title="HRM prediction accuracy on this host (target: MAPE <= 10%, Spearman >= 0.9)")
    for col in ("model", "profile", "policies", "MAPE layer latency", "Spearman gen tok/s", "memory within +10%",
                "term ratios", "without dispatch / emulation / both (MAPE)", "profile after: MAPE, Spearman",
                "load avg"):
        summary.add_column(col)
    for name in args.models:
        hw = load_hardware(args.hw or measured_profile(work, f"this-host-{name}"))
        report = run_validation(hw, load_model(name), workload, validation_policies(args.policies), device="auto",
                                dtype="fp32", repeats=args.repeats,
                                progress=lambda line: print(line, file=sys.stderr, flush=True))
        render_report(report)
        folder = work / name
        folder.mkdir(exist_ok=True)
        write_outputs(report, folder)
        ratios = ", ".join(f"{k} x{v:.2f}" for k, v in report.term_ratios().items())
        ablations = " / ".join(f"{100 * s['mape']:.0f}%" for s in report.ablations.values())
        after = {}
        if not args.hw:  # the host again, after the runs: how far its speed drifted meanwhile
            hw_after = load_hardware(measured_profile(work, f"this-host-{name}-after"))
            after = rescore(hw_after, runtime_spec(load_model(name), "fp32"), workload, runtime_options("fp32"),
                            report.outcomes)
            after["drift"] = profile_drift(hw, hw_after)
        load = f"{report.load_average[0]:.1f}" if report.load_average else "-"
        after_text = f"{100 * after['mape']:.1f}%, {after['spearman']:.3f}" if after else "-"
        summary.add_row(name, hw.name, str(len(report.outcomes)), f"{100 * report.mape:.1f}%", f"{report.spearman:.3f}",
                        "yes" if report.memory_ok else "NO", ratios, ablations, after_text, load)
        print(json.dumps({"model": name, "profile": hw.name, "mape": report.mape, "spearman": report.spearman,
                          "memory_ok": report.memory_ok, "ablations": report.ablations, "profile_after": after,
                          "load_average": report.load_average}))
    Console(width=160).print(summary)
    print(f"outputs in {work}")


if __name__ == "__main__":
    main()
