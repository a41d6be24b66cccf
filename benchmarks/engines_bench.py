"""Every engine at its own best policy on the MoE-Lightning paper's machines.

For t4, l4, 2xt4, 4xt4 × every shipped engine × (mtbench gen 32/128/256, summarization):
predicted generation throughput, the policy, the bottleneck and the per-mechanism breakdown
(``hrm estimate --explain``: each mechanism switched off in turn, its share of the gap to
ideal on that policy). Mixtral-8x7B, as in the paper. Prints a table (and, with ``--md``,
markdown for the README).

Run: python benchmarks/engines_bench.py [--md] [--hw t4,l4] [--engines moe-lightning,flexgen]
"""

from __future__ import annotations

import argparse
import time

from hrm.engines.engine import list_engines, load_engine
from hrm.errors import HRMError
from hrm.analysis.explain import explain
from hrm.machine.hardware import load_hardware
from hrm.cost.memory import memory_limits
from hrm.model.spec import load_model
from hrm.model.options import ModelOptions
from hrm.workload import make_workload
from solver.search import search

MACHINES = ("t4", "l4", "2xt4", "4xt4")
WORKLOADS = (("mtbench", 32), ("mtbench", 128), ("mtbench", 256), ("summarization", 64))
ORDER = ("ideal", "hrm-runtime", "moe-lightning", "flexgen", "flexgen-cpu-attn", "deepspeed-zero")
SHORT = {"decode weight path": "dec-W", "decode host-KV path (pinned/pageable)": "dec-KV",
         "host DRAM shared by copies, DMA and CPU attention": "DRAM", "achieved GPU memory/GEMM rates": "GPU-eff",
         "MoE kernel efficiency": "kernel", "MoE kernel reads every resident expert": "all-exp",
         "host synchronisation (pipeline drains)": "sync", "prefill weight path": "pre-W",
         "prefill weight-load overlap": "pre-ovl", "prefill KV write-back path": "pre-KV",
         "prefill writes reserved KV slots": "pre-slots", "prefill hidden-state round trip": "pre-hid",
         "staging-copy thread team": "copy-team", "NUMA placement of pinned buffers": "NUMA",
         "ranks share host PCIe uplinks": "PCIe-share", "all-reduce path": "allreduce",
         "every layer weight offloaded, not only experts": "all-W", "static experts kept in whole units (r_w snapped)":
         "whole-units", "CPU-kept experts copied to the GPU from a token count": "op-offload",
         "missed experts copied to the GPU from tokens per expert": "miss-copy",
         "GPU weight buffer (layers)": "W-buffer", "pinned CPU staging buffer (layers)": "pinned-buf",
         "CPU tensor holds every expert": "cpu-all-exp", "every prompt padded to the longest": "pad",
         "chunked prefill (each pass re-reads offloaded weights)": "chunk"}


#: engines shown under another name: the reference runtime is not a serving engine
LABELS = {"hrm-runtime": "hrm-runtime (reference runtime)"}


def breakdown(report, top: int = 3) -> str:
    """The largest additive shares of the gap (hrm.analysis.explain: they add up to 100%)."""
    costs = sorted((c for c in report.costs if c.share_of_gap >= 0.005), key=lambda c: -c.share_of_gap)[:top]
    return ", ".join(f"{SHORT.get(c.label, c.label)} {c.share_of_gap:.0%}" for c in costs) or "-"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hw", default=",".join(MACHINES))
    parser.add_argument("--engines", default=",".join(e for e in ORDER if e in list_engines()))
    parser.add_argument("--model", default="mixtral")
    parser.add_argument("--md", action="store_true", help="print a markdown table")
    args = parser.parse_args()
    model = load_model(args.model)
    rows = []
    start = time.perf_counter()
    for hw_name in args.hw.split(","):
        hw = load_hardware(hw_name)
        limits = memory_limits(hw)
        for preset, gen in WORKLOADS:
            wl = make_workload(preset, gen_len=gen)
            ideal_tput = None
            for name in args.engines.split(","):
                engine = load_engine(name)
                try:
                    res = search(hw, model, wl, engine=engine, top=0)
                except HRMError as exc:
                    rows.append((hw_name, f"{preset}/{gen}", LABELS.get(name, name), "-", "-", "-", str(exc)[:60], "-"))
                    continue
                est = res.best.estimate
                if name == "ideal":
                    ideal_tput = est.generation_throughput_tok_s
                report = explain(hw, model, wl, res.best.policy, engine, ModelOptions(), limits)
                ratio = f"{ideal_tput / est.generation_throughput_tok_s:.2f}x" if ideal_tput else "-"
                rows.append((hw_name, f"{preset}/{gen}", LABELS.get(name, name), f"{est.generation_throughput_tok_s:,.1f}",
                             ratio,
                             res.best.policy.short(), est.bottleneck, breakdown(report)))
    elapsed = time.perf_counter() - start
    header = ("hw", "workload", "engine", "gen tok/s", "ideal/engine", "policy", "bottleneck",
              "largest mechanisms (additive share of the gap to ideal, same policy)")
    if args.md:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(str(c).replace("|", "/") for c in row) + " |")
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{model.name}: every engine at its own best policy")
        for col in header:
            table.add_column(col)
        for row in rows:
            table.add_row(*map(str, row))
        Console(width=250).print(table)
    print(f"\n{len(rows)} searches + explanations in {elapsed:.1f} s")


if __name__ == "__main__":
    main()
