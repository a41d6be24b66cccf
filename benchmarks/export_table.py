"""Every export target on the paper's machines and two MoE models (issue 25's must-show table).

For each hardware × model, the main job's plan for the ideal machine (``hrm-search --engine
ideal``) is exported to every target with ``hrm export PLAN --to TARGET`` (re-planned inside
the target's space: :mod:`solver.retarget`). Each row: the printed command; whether it reads
back through the target's flag table (every flag, type and form with its file:line, and the
start-up limits: ``hrm import`` raises on -np > 256, --max-num-seqs > --max-num-batched-tokens
...) to the exported policy; whether the policy fits memory as the target's HRM engine counts
it; the target engine's predicted tok/s — or the refusal, in one line.

No engine's own argument parser runs here: none of FlexGen's fork, the MoE-Lightning
artifact, llama-server, vLLM or SGLang installs on a CPU-only test machine, so the check is
against the facts tables (docs/engines/*.md).

Run: python benchmarks/export_table.py [--md] [--hw l4,t4] [--models mixtral]
"""

from __future__ import annotations

import argparse
import time

from hrm.errors import HRMError, InfeasibleError
from hrm.export import EXPORTERS, read_command
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.workload import make_workload
from solver.retarget import export_for_target
from solver.search import search

MACHINES = ("l4", "t4", "2xt4", "a100-80g")
MODELS = ("mixtral", "deepseek-v2-lite")


def reads_back(target: str, export, model, hw) -> str:
    """'yes' when every printed command reads back through the target's flag table to the
    exported policy's batch and placement, else why not."""
    try:
        imported = read_command(target, "\n".join(export.commands) if len(export.commands) > 1 else export.commands[0],
                                model, export.workload, hardware=hw)
    except HRMError as exc:
        return f"no: {exc}"
    got, want = imported.policy, export.exported_policy
    same = (got.batch_size == want.batch_size and got.attn_on_gpu == want.attn_on_gpu
            and abs(got.weights_gpu_ratio - want.weights_gpu_ratio) < 1e-6)
    return "yes" if same else f"no: reads back as {got.short()}"


def row(hw_name: str, model_name: str, target: str, plan) -> dict:
    hw, model = load_hardware(hw_name), load_model(model_name)
    try:
        done = export_for_target(plan, target)
    except InfeasibleError as exc:
        return {"outcome": "refused (exit 3)", "why": str(exc)}
    except HRMError as exc:
        return {"outcome": "refused (exit 2)", "why": str(exc)}
    export = done.export
    return {"outcome": "re-planned" if done.replanned else ("server's pick" if export.server_picks_policy else "as planned"),
            "command": " && ".join(export.commands), "policy": export.exported_policy.short(),
            "reads_back": reads_back(target, export, model, hw),
            "fits": {True: "yes", False: "no", None: "?"}[export.exported_feasible],
            "tok_s": export.exported_throughput_tok_s, "engine": export.estimate_engine}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hw", default=",".join(MACHINES))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--md", action="store_true", help="print markdown tables")
    args = parser.parse_args()
    start = time.perf_counter()
    rows = []
    for model_name in args.models.split(","):
        for hw_name in args.hw.split(","):
            plan = search(load_hardware(hw_name), load_model(model_name), make_workload(), engine="ideal", top=0,
                          hw_name=hw_name, model_name=model_name).plan
            for target in EXPORTERS:
                rows.append((model_name, hw_name, target, plan.estimate.generation_throughput_tok_s,
                             row(hw_name, model_name, target, plan)))
    if args.md:
        print("| model | hw | target | outcome | command | reads back (facts table) | fits | predicted tok/s "
              "(engine) |\n|---|---|---|---|---|---|---|---|")
        for model_name, hw_name, target, ideal, r in rows:
            if "command" not in r:
                print(f"| {model_name} | {hw_name} | {target} | {r['outcome']} | {r['why']} | - | - | - |")
                continue
            print(f"| {model_name} | {hw_name} | {target} | {r['outcome']} | `{r['command']}` | {r['reads_back']} | "
                  f"{r['fits']} | {r['tok_s']:,.1f} ({r['engine']}) |")
    else:
        for model_name, hw_name, target, ideal, r in rows:
            what = (f"{r['policy']:<52} {r['tok_s']:>8,.1f} tok/s fits={r['fits']} reads_back={r['reads_back'][:40]}"
                    if "command" in r else f"{r['outcome']}: {r['why'][:120]}")
            print(f"{model_name:<17} {hw_name:<9} {target:<14} {what}")
    print(f"\n{len(rows)} exports in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
