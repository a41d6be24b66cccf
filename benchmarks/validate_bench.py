"""Prediction accuracy of the HRM model against the reference runtime on this machine.

Runs ``hrm validate`` for each model (default tiny-mixtral and small-mixtral) with a hardware
profile (default: measure this machine now with ``hrm profile --quick``), and prints the
per-policy table, MAPE of the per-layer decode latency, Spearman rank correlation of the
generation throughput, and the measured/predicted ratio of each resource term.

Run: python benchmarks/validate_bench.py [--hw PROFILE.yaml] [--models tiny-mixtral small-mixtral]
                                         [--policies 10] [--repeats 3] [--out DIR]
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

from hrm.hardware import load_hardware
from hrm.model import load_model
from hrm.workload import make_workload
from runtime.validate import render_report, run_validation, validation_policies, write_outputs


def measured_profile(folder: Path) -> str:
    """Profile this machine (quick) into ``folder`` and return the YAML path."""
    path = folder / "this-host.yaml"
    subprocess.run([sys.executable, "-m", "hrm.cli", "profile", "--quick", "--no-disk", "--no-progress",
                    "--name", "this-host", "--out", str(path)], check=True)
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hw", help="hardware profile (default: profile this machine now, --quick)")
    parser.add_argument("--models", nargs="+", default=["tiny-mixtral", "small-mixtral"])
    parser.add_argument("--policies", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--gen-len", type=int, default=8)
    parser.add_argument("--out", help="folder for validation-<model>.{csv,png,json}")
    args = parser.parse_args()
    work = Path(args.out or tempfile.mkdtemp(prefix="hrm-validate-"))
    work.mkdir(parents=True, exist_ok=True)
    hw = load_hardware(args.hw or measured_profile(work))
    workload = make_workload(None, prompt_len=args.prompt_len, max_prompt_len=args.prompt_len, gen_len=args.gen_len)
    summary = Table(title=f"HRM prediction accuracy on {hw.name} (target: MAPE <= 10%, Spearman >= 0.9)")
    for col in ("model", "policies", "MAPE layer latency", "Spearman gen tok/s", "memory within +10%", "term ratios"):
        summary.add_column(col)
    for name in args.models:
        report = run_validation(hw, load_model(name), workload, validation_policies(args.policies), "auto", "fp32",
                                args.repeats, progress=lambda line: print(line, file=sys.stderr, flush=True))
        render_report(report)
        folder = work / name
        folder.mkdir(exist_ok=True)
        write_outputs(report, folder)
        ratios = ", ".join(f"{k} x{v:.2f}" for k, v in report.term_ratios().items())
        summary.add_row(name, str(len(report.outcomes)), f"{100 * report.mape:.1f}%", f"{report.spearman:.3f}",
                        "yes" if report.memory_ok else "NO", ratios)
        print(json.dumps({"model": name, "mape": report.mape, "spearman": report.spearman}))
    Console(width=160).print(summary)
    print(f"outputs in {work}")


if __name__ == "__main__":
    main()
