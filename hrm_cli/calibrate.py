"""``hrm calibrate RUNS.yaml --out PROFILE.yaml``: fit a profile's achieved rates to the
user's own runs (hrm.analysis.calibrate; docs/calibrate.md)."""

from __future__ import annotations

import math
import sys

from hrm.analysis.calibrate import Calibration, calibrated_profile, fit, is_shipped_profile
from hrm.analysis.calibration_runs import load_runs, runs_model
from hrm.errors import HRMError
from hrm.machine.hardware import dump_hardware_yaml, load_hardware, parse_hardware
from hrm_cli.parser import ArgumentParser

HEADER = ("# Hardware profile calibrated by `hrm calibrate` to the user's own runs: source.methods names\n"
          "# each fitted field; the others are the base profile's.\n"
          "# Units: *_gib = 2^30 bytes, *_gbps = 1e9 bytes/s, *_tflops = 1e12 FLOP/s, *_s = seconds.\n")


def parse_args(argv):
    from hrm.analysis.calibration_fields import FIELDS

    parser = ArgumentParser(prog="hrm calibrate",
                            description="Fit a hardware profile's achieved rates (link, host copy and DRAM rates, GPU\n"
                                        "efficiencies, dispatch) to your own measured runs, each within a physical\n"
                                        "range; print measured vs predicted before and after the fit, and the\n"
                                        "leave-one-out error. docs/calibrate.md says what, why and how.")
    parser.add_argument("runs", metavar="RUNS.yaml", nargs="?",
                        help="hardware, model and runs (engine, workload, policy, measured); docs/calibrate.md")
    parser.add_argument("--llama-bench", metavar="OUT.json", action="append",
                        help="instead of RUNS.yaml: llama-bench's own output (-o json or -o jsonl; repeatable), each "
                             "pp or tg test one run of the CPU step model; with --hw and --gguf")
    parser.add_argument("--hw", help="with --llama-bench: the profile measured on the machine that ran it "
                                     "(hrm profile --llama-cpp DIR)")
    parser.add_argument("--gguf", metavar="FILE", help="with --llama-bench: the GGUF it ran (or its hrm tensor table)")
    parser.add_argument("--out", metavar="PROFILE.yaml", help="write the calibrated profile here (atomically); "
                                                              "without it nothing is written")
    parser.add_argument("--fields", metavar="A,B",
                        help=f"fit only these fields (default: every one the runs identify): {', '.join(FIELDS)}")
    parser.add_argument("--name", help="name of the calibrated profile (default: <base>@calibrated)")
    args = parser.parse_args(argv)
    if (args.runs is None) == (args.llama_bench is None):
        parser.error("give RUNS.yaml or --llama-bench OUT.json, one of the two")
    if args.llama_bench and not (args.hw and args.gguf):
        parser.error("--llama-bench needs --hw PROFILE.yaml and --gguf FILE (the machine and the model it ran)")
    if args.runs is not None and (args.hw or args.gguf):
        parser.error("--hw and --gguf go with --llama-bench (a runs file names its own)")
    return args


def field_list(text: str | None):
    if text is None:
        return None
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise HRMError("--fields: give one or more field names separated by commas")
    return names


def check_out(path: str | None, runs_path: str):
    """Fail before fitting when ``--out`` cannot be written, is a shipped profile (they never
    change) or is the runs file itself."""
    if path is None:
        return None
    from pathlib import Path

    from hrm.plan import check_output_path

    if is_shipped_profile(path):
        raise HRMError(f"--out {path}: shipped profiles never change; write the calibrated profile elsewhere")
    if Path(path).resolve() == Path(runs_path).resolve():
        raise HRMError(f"--out {path}: is the runs file; write the calibrated profile elsewhere")
    return check_output_path(path, "--out")


def _error(predicted: float | None, measured: float) -> str:
    """The relative error in few characters: +41%, -9.7%, +0.0%."""
    if predicted is None:
        return "n/a"
    percent = 100 * (predicted / measured - 1)
    return f"{percent:+.0f}%" if abs(percent) >= 9.95 else f"{percent:+.1f}%"


def _percent(rms: float | None) -> str:
    return "n/a" if rms is None else f"{100 * (math.exp(rms) - 1):.1f}%"


#: quantities printed in another unit than the runs file's (its key, hrm.analysis.calibration_runs.QUANTITIES):
#: the per-token latency in ms, as every view prints it (TTFT stays in s)
SHOWN_AS = {"tpot_s": ("TPOT ms", 1e3)}


def render(calibration: Calibration, console) -> None:
    """The per-run table (measured, before, after, leave-one-out error), the field table
    (fitted beside start and range) and the fields left as the profile has them."""
    from rich.table import Table

    from hrm.analysis.calibration_runs import QUANTITIES

    runs = Table(title=f"runs of {calibration.runs_path} on {calibration.base}: predicted before and after the "
                       f"fit, and leave-one-out (LOO: fitted without the run)", title_justify="left", box=None,
                 pad_edge=False, header_style="bold underline")
    for header, justify in (("run", "left"), ("quantity", "left"), ("measured", "right"), ("before", "right"),
                            ("after", "right"), ("LOO err", "right")):
        runs.add_column(header, justify=justify, overflow="fold", no_wrap=header != "run")
    previous = None
    for m in calibration.measurements:
        label, scale = SHOWN_AS.get(m.quantity, (QUANTITIES[m.quantity].label, 1.0))
        runs.add_row(m.run if m.run != previous else "", label, f"{m.measured * scale:.4g}",
                     f"{m.before * scale:.4g} {_error(m.before, m.measured)}",
                     f"{m.after * scale:.4g} {_error(m.after, m.measured)}", _error(m.loo, m.measured))
        previous = m.run
    console.print(runs)
    console.print()
    console.print(f"typical error (RMS of ln predicted/measured): before {_percent(calibration.rms_log_error('before'))}"
                  f", after {_percent(calibration.rms_log_error('after'))}, leave-one-out "
                  f"{_percent(calibration.rms_log_error('loo'))}", highlight=False)
    console.print()
    fields = Table(title="fitted fields, within their physical ranges", title_justify="left",
                   box=None, pad_edge=False, header_style="bold underline")
    for header, justify in (("field", "left"), ("profile", "right"), ("fitted", "right"), ("range", "right")):
        fields.add_column(header, justify=justify, overflow="fold", no_wrap=header != "field")
    for f in calibration.fields:
        if f.value is None:
            continue
        change = f"{100 * (f.value / f.start - 1):+.0f}%" if f.start > 0 else ""
        fields.add_row(f.name, f"{f.start:.4g}{'*' if f.defaulted else ''}",
                       f"{f.value:.4g} {change}{' at bound' if f.at_bound else ''}",
                       f"{f.lo:.3g}-{f.hi:.3g}{' ' + f.unit if f.unit else ''}")
    console.print(fields)
    if any(f.defaulted for f in calibration.fields):
        console.print("* the profile lacks it: the hrm.machine.achieved default", highlight=False)
    for f in calibration.left:
        console.print(f"left at the profile's value: {f.name} = {f.start:.4g}{'*' if f.defaulted else ''} "
                      f"({f.reason})", highlight=False)
    if any(f.at_bound for f in calibration.fields):
        console.print("a field ended on its range's bound: the runs ask for a value outside its physical range, so "
                      "something other than that rate is likely off (docs/calibrate.md)", highlight=False)


def main(argv) -> int:
    args = parse_args(argv)
    fields = field_list(args.fields)
    out = check_out(args.out, args.runs or args.llama_bench[0])
    if args.name is not None and (not args.name.strip() or not args.name.isprintable()):
        raise HRMError(f"--name: must be a non-empty printable name, got {args.name!r}")
    if args.llama_bench:
        return _calibrate_llama_cpu(args, out, _llama_bench_runs(args))
    if _llama_cpu_runs(args.runs):
        from hrm.analysis.validation import load_runs_file

        return _calibrate_llama_cpu(args, out, load_runs_file(args.runs))
    runs = load_runs(args.runs)
    try:
        hw = load_hardware(runs.hardware)
    except HRMError as exc:
        raise HRMError(f"{runs.path}: {exc}") from None
    model = runs_model(runs)
    calibration = fit(hw, model, runs, fields)
    profile = calibrated_profile(hw, calibration, args.name)
    text = HEADER + dump_hardware_yaml(profile)
    import yaml

    parse_hardware(yaml.safe_load(text), "the calibrated profile")  # it must read back through the schema

    from hrm_cli.common import console as make_console

    console = make_console()
    render(calibration, console)
    if out is None:
        console.print("no --out: nothing written", highlight=False)
        return 0
    from hrm.plan import write_atomic

    write_atomic(out, text)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _llama_cpu_runs(path: str) -> bool:
    """A runs file of llama.cpp CPU runs (each with ``from: llama.cpp``, a ``command`` and a
    ``gguf``): calibrated by hrm.analysis.validation on the CPU step model (docs/calibrate.md)."""
    from hrm.errors import read_yaml_mapping

    data = read_yaml_mapping(path, "a runs file", "hardware, model, runs")
    runs = data.get("runs")
    return isinstance(runs, list) and bool(runs) and all(
        isinstance(r, dict) and r.get("from") == "llama.cpp" and "command" in r and "gguf" in r for r in runs)


def _llama_bench_runs(args):
    """--llama-bench files as one runs file of the CPU step model (hrm.analysis.validation.runs_from_llama_bench)."""
    from pathlib import Path

    from hrm.analysis.validation import RunsFile, runs_from_llama_bench
    from hrm_cli.common import check_input_file

    check_input_file(args.gguf, "--gguf")
    runs = []
    for path in args.llama_bench:
        check_input_file(path, "--llama-bench")
        runs += runs_from_llama_bench(Path(path).read_text(errors="replace"), f"--llama-bench {path}", args.gguf)
    return RunsFile(Path(args.llama_bench[0]), load_hardware(args.hw), tuple(runs))


def _calibrate_llama_cpu(args, out, runs_file) -> int:
    from dataclasses import replace

    from hrm.analysis.validation import GGML_FIELDS, compare_runs, fit_ggml_scales, with_scales

    if args.fields is not None and set(field_list(args.fields)) - {f"ggml_cpu.{f}" for f in GGML_FIELDS}:
        raise HRMError(f"--fields: llama.cpp CPU runs fit {', '.join('ggml_cpu.' + f for f in GGML_FIELDS)} only")
    if runs_file.hardware.ggml_cpu is None:
        raise HRMError(f"{runs_file.hardware.name}: no ggml_cpu section (hrm profile --llama-cpp DIR on the machine)")
    cal = fit_ggml_scales(runs_file, tuple(range(len(runs_file.runs))))
    hw = with_scales(runs_file.hardware, cal.stream_scale, cal.compute_scale)
    name = args.name or f"{runs_file.hardware.name}@calibrated"
    of = args.runs or ", ".join(args.llama_bench)
    methods = {**hw.source.methods,
               "ggml_cpu.stream_scale": f"hrm calibrate on {len(runs_file.runs)} runs of {of}",
               "ggml_cpu.compute_scale": f"hrm calibrate on {len(runs_file.runs)} runs of {of}"}
    hw = hw.model_copy(update={"name": name, "source": hw.source.model_copy(update={"kind": "calibrated",
                                                                                    "methods": methods})})
    from hrm_cli.common import console as make_console

    console = make_console()
    after = compare_runs(replace(runs_file, hardware=hw))
    console.print(f"ggml_cpu.stream_scale = {cal.stream_scale:.4g}, ggml_cpu.compute_scale = {cal.compute_scale:.4g} "
                  f"(RMS of log predicted/measured {cal.rms_log_before:.3f} -> {cal.rms_log_after:.3f})",
                  highlight=False)
    for c in after:
        console.print(f"  {c.name}: " + ", ".join(f"{q} {c.measured[q]:.4g} s, predicted {c.predicted[q]:.4g} "
                                                  f"({c.ratio(q):.2f}x)" for q in c.measured), highlight=False)
    if out is None:
        console.print("no --out: nothing written", highlight=False)
        return 0
    from hrm.plan import write_atomic

    text = HEADER + dump_hardware_yaml(hw)
    import yaml

    parse_hardware(yaml.safe_load(text), "the calibrated profile")
    write_atomic(out, text)
    print(f"wrote {out}", file=sys.stderr)
    return 0
