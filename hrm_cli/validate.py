"""``hrm validate --hw PROFILE --model tiny-mixtral``: run ≥ 8 diverse policies in the
reference runtime and compare with the model: per-policy error, MAPE, Spearman; CSV + PNG."""

from __future__ import annotations

import json
import sys

from hrm import bounds
from hrm_cli.parser import ArgumentParser
from hrm.errors import HRMError
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.workload import make_workload


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="hrm validate", description="Measured vs predicted over several policies.")
    parser.add_argument("--hw", required=True, help="hardware profile of this machine (e.g. one from hrm profile)")
    parser.add_argument("--model", default="tiny-mixtral", help="model (default tiny-mixtral; small-mixtral for "
                        "compute-bound numbers); MLA models are not supported")
    parser.add_argument("--policies", type=bounds.POLICIES.flag("--policies"), default=10,
                        help="number of policies, at least 8 (default 10)")
    parser.add_argument("--prompt-len", type=bounds.VALIDATE_PROMPT_TOKENS.flag("--prompt-len"), default=32,
                        help="prompt length of every request (default 32)")
    parser.add_argument("--gen-len", type=bounds.VALIDATE_GEN_TOKENS.flag("--gen-len"), default=16,
                        help="tokens generated per request (default 16)")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"],
                        help="dtype the runtime computes in; predictions use the same (default fp32)")
    parser.add_argument("--repeats", type=bounds.REPEATS.flag("--repeats"), default=3,
                        help="timed runs per policy, median taken (default 3)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--lanes", default="auto", choices=["auto", "exclusive", "concurrent"],
                        help="emulated tier: exclusive = one task at a time (the CPU-only machine the model sums; "
                             "default there), concurrent = a thread per lane")
    parser.add_argument("--seed", type=bounds.SEED.flag("--seed"), default=0)
    parser.add_argument("--out", metavar="DIR", help="write validation.csv, validation.png, validation.json here "
                        "(all three or none; the folder is checked before the runs)")
    parser.add_argument("--runs-out", metavar="FILE", help="also write the measurements as a runs file for "
                        "`hrm calibrate FILE` (docs/calibrate.md)")
    parser.add_argument("--json", action="store_true", help='print {"mape", "spearman", "policies": [...]} only')
    return parser


def main(argv) -> int:
    from runtime.validate import render_report, run_validation, validation_policies, write_outputs

    args = build_parser().parse_args(argv)
    if args.out is not None:
        check_out_dir(args.out)
    if args.runs_out is not None:
        from hrm.plan import check_output_path

        check_output_path(args.runs_out, "--runs-out")
    hw = load_hardware(args.hw)
    spec = load_model(args.model)
    if spec.is_mla:
        raise HRMError(f"{spec.name}: MLA attention is not supported by the reference runtime")
    policies = validation_policies(args.policies)
    workload = make_workload(None, prompt_len=args.prompt_len, max_prompt_len=args.prompt_len, gen_len=args.gen_len)
    progress = None if args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    report = run_validation(hw, spec, workload, policies, device=args.device, dtype=args.dtype, repeats=args.repeats,
                            seed=args.seed, progress=progress, lanes=args.lanes)
    written = write_outputs(report, args.out) if args.out is not None else []
    if args.runs_out is not None:
        written.append(write_runs(report, args))
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        render_report(report)
        for path in written:
            print(f"wrote {path}")
    return 0


def check_out_dir(path: str) -> None:
    """Before the runs: ``path`` is a writable folder, or a folder that can be made there (its
    nearest existing ancestor is a writable folder). It is made only when the outputs are
    written, so a failed run leaves nothing behind."""
    from pathlib import Path

    from hrm.plan import check_output_folder

    if not path.strip():
        raise HRMError("--out: empty path")
    folder = Path(path)
    if folder.exists() or folder.is_symlink():
        check_output_folder(folder, "--out")
        return
    ancestor = folder.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    try:
        check_output_folder(ancestor, "--out")
    except HRMError as exc:
        raise HRMError(f"--out {path}: cannot be made ({str(exc).removeprefix('--out ')})") from None


def input_reference(value: str) -> str:
    """A shipped name as given; a file as its absolute path (a runs file resolves relative
    paths beside itself, not beside the folder this command ran in)."""
    from pathlib import Path

    return str(Path(value).resolve()) if Path(value).is_file() else value


def write_runs(report, args) -> str:
    """The runs file of ``--runs-out`` (:func:`runtime.validate.runs_document`)."""
    import yaml

    from runtime.validate import report_measurements, runs_document

    from hrm.plan import write_atomic

    document = runs_document(input_reference(args.hw), input_reference(args.model), args.dtype, report.workload,
                             report_measurements(report))
    write_atomic(args.runs_out, yaml.safe_dump(document, sort_keys=False))
    return args.runs_out

