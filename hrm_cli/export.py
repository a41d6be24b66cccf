"""``hrm export PLAN.json --to ENGINE``: a plan as another engine's command line."""

from __future__ import annotations

import json
import sys

from hrm_cli.parser import ArgumentParser
from hrm.export import EXPORTERS, Export, export_plan, fix_pins, get_exporter
from hrm.plan import load_plan


def report_differences(export: Export, stream=None) -> None:
    """What the target could not express, on ``stream`` (stderr): one line each."""
    stream = stream or sys.stderr
    if not export.exact:
        line = (f"note: {export.engine} cannot express {export.planned_policy.short()} exactly; exported the nearest "
                f"{export.exported_policy.short()} ({', '.join(export.differences)})")
        if export.exported_throughput_tok_s is not None and export.planned_throughput_tok_s is not None:
            line += (f": {export.planned_throughput_tok_s:,.1f} -> {export.exported_throughput_tok_s:,.1f} tok/s "
                     f"(engine {export.estimate_engine})")
        print(line, file=stream)
    if export.exported_feasible is False:
        print(f"warning: the exported policy exceeds a memory limit under engine {export.estimate_engine}; "
              f"re-plan inside {export.engine}'s policy space: hrm-search ... --fix "
              f"{fix_pins(get_exporter(export.engine))}", file=stream)
    for caveat in export.caveats:
        print(f"note: {caveat}", file=stream)


def print_export(export: Export, fmt: str) -> None:
    if fmt == "json":
        print(json.dumps(export.to_json(), indent=2))
        return
    for command in export.commands:
        print(command)
    report_differences(export)


def main(argv) -> int:
    parser = ArgumentParser(prog="hrm export", description=(
        "Print a plan as another engine's command line (text) or its flag mapping (json: each flag, its value, "
        "the policy field it carries, the engine version it was checked against and the source file:line). "
        "A plan the engine cannot express exactly is exported with the nearest policy it can, re-estimated; "
        "the difference goes to stderr (text) or the json fields."))
    parser.add_argument("plan", help="a plan file (hrm-search --out)")
    parser.add_argument("--to", required=True, choices=list(EXPORTERS), help="target engine")
    parser.add_argument("--format", default="text", choices=["text", "json"],
                        help="text: the command line(s); json: the flag mapping and the policy difference")
    args = parser.parse_args(argv)
    export = export_plan(load_plan(args.plan), args.to)
    print_export(export, args.format)
    return 0
