"""``hrm export PLAN.json --to ENGINE``: a plan as another engine's command line."""

from __future__ import annotations

import json
import sys

from hrm_cli.parser import ArgumentParser
from hrm.export import EXPORTERS, Export, fix_pins, get_exporter
from hrm.plan import load_plan
from solver.retarget import Retargeted, export_for_target


def _throughputs(export: Export) -> str:
    """': planned -> exported tok/s (engine E)' when both were estimated, else ''."""
    if export.exported_throughput_tok_s is None or export.planned_throughput_tok_s is None:
        return ""
    return (f": {export.planned_throughput_tok_s:,.1f} -> {export.exported_throughput_tok_s:,.1f} tok/s "
            f"(engine {export.estimate_engine})")


def _server_pick_lines(export: Export) -> list[str]:
    """A target whose server picks its own policy: what it runs instead of the plan (no
    "nearest", no --fix: no flag makes it run another policy)."""
    lines = []
    if not export.exact:
        lines.append(f"note: {export.engine}'s server picks its own policy at launch and runs "
                     f"{export.exported_policy.short()}, not the plan's {export.planned_policy.short()} "
                     f"({', '.join(export.differences)}){_throughputs(export)}")
    if export.exported_feasible is False:
        lines.append(f"warning: the server's pick exceeds physical memory less the engine's fixed costs as HRM's "
                     f"engine {export.estimate_engine} counts it: the server checks only its own planning caps at "
                     "launch and may run out of memory")
    lines += _cap_lines(export)
    return lines


def _cap_lines(export: Export) -> list[str]:
    """A policy that fits physical memory but not the planning caps: said, not refused."""
    if export.exported_feasible and export.exported_within_caps is False:
        return [f"warning: the exported policy fits physical memory less {export.estimate_engine}'s fixed costs "
                "but is above HRM's planning caps (--gpu-util/--cpu-util): little headroom"]
    return []


def _nearest_lines(export: Export) -> list[str]:
    """A target that runs the flags' policy: the nearest it can express, and a re-plan when
    that exceeds memory."""
    lines = []
    if not export.exact:
        lines.append(f"note: {export.engine} cannot express {export.planned_policy.short()} exactly; exported the "
                     f"nearest {export.exported_policy.short()} ({', '.join(export.differences)}){_throughputs(export)}")
    if export.exported_feasible is False:
        lines.append(f"warning: the exported policy exceeds physical memory under engine {export.estimate_engine}; "
                     f"re-plan inside {export.engine}'s policy space: hrm-search ... --fix "
                     f"{fix_pins(get_exporter(export.engine))}")
    return lines + _cap_lines(export)


def _replan_lines(export: Export) -> list[str]:
    """A plan re-planned inside the target's space: what the target's search found, beside
    the plan as it was made."""
    planned = (f"{export.planned_throughput_tok_s:,.1f} tok/s" if export.planned_throughput_tok_s is not None
               else "not estimated")
    return [*_cap_lines(export), f"note: re-planned inside {export.engine}'s policy space (engine {export.estimate_engine}): "
            f"{export.exported_policy.short()}, {export.exported_throughput_tok_s:,.1f} tok/s; the plan (engine "
            f"{export.planned_engine}) was {export.planned_policy.short()}, {planned}"]


def report_differences(export: Export, stream=None) -> None:
    """What the target runs other than the plan, its notes and caveats, on ``stream``
    (stderr): one line each."""
    stream = stream or sys.stderr
    lines = (_replan_lines(export) if export.replanned else
             _server_pick_lines(export) if export.server_picks_policy else _nearest_lines(export))
    for line in [*lines, *(f"note: {note}" for note in (*export.notes, *export.caveats))]:
        print(line, file=stream)


def print_export(retargeted: Retargeted, fmt: str) -> None:
    export = retargeted.export
    if fmt == "json":
        data = export.to_json()
        if retargeted.replanned:
            data["replan"] = {"reason": retargeted.reason,
                              "searched": [{"engine": name, "result": what} for name, what in retargeted.searched]}
        print(json.dumps(data, indent=2))
        return
    for command in export.commands:
        print(command)
    if retargeted.replanned:
        print(f"note: why re-planned: {retargeted.reason}", file=sys.stderr)
    report_differences(export)


def main(argv) -> int:
    parser = ArgumentParser(prog="hrm export", description=(
        "Print a plan as another engine's command line (text) or its flag mapping (json: each flag, its value, "
        "the policy field it carries, the engine version it was checked against and the source file:line). "
        "A plan the engine cannot express exactly is exported with the nearest policy it can, re-estimated on the "
        "workload the engine runs (FlexGen pads prompts); a server that picks its own policy (moe-lightning) is "
        "exported with its pick; the difference goes to stderr (text) or the json fields. A plan the engine cannot "
        "run is refused in one line (exit 2; 3 when no placement it makes fits)."))
    parser.add_argument("plan", help="a plan file (hrm-search --out)")
    parser.add_argument("--to", required=True, choices=list(EXPORTERS), help="target engine")
    parser.add_argument("--format", default="text", choices=["text", "json"],
                        help="text: the command line(s); json: the flag mapping and the policy difference")
    args = parser.parse_args(argv)
    print_export(export_for_target(load_plan(args.plan), args.to), args.format)
    return 0
