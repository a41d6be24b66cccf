"""``hrm import --from ENGINE "FLAGS"``: another engine's command line as a policy, estimated."""

from __future__ import annotations

import json
import sys

from hrm_cli.parser import ArgumentParser
from hrm_cli.common import (add_machine_args, check_rate_and_requests, add_memory_args, add_workload_args, limits_from_args, machine_from_args,
                            options_from_args, workload_from_args)
from hrm import bounds
from hrm.engines.engine import list_engines
from hrm.errors import InfeasibleError
from hrm.estimate import estimate
from hrm.cost.memory import physical_limits
from hrm.export import read_command
from hrm.export.importing import fitted_policy, imported_engine
from hrm.export.registry import IMPORT_SOURCES, import_source
from hrm.export.importing import WORKLOAD_FLAGS
from hrm.workload import DEFAULT_PRESET, PRESETS


def given_fields(args) -> tuple[str, ...]:
    """The workload fields the user set on ``hrm import``: every length of a preset named with
    --workload, and --prompt-len, --max-prompt-len, --gen-len, --padding when given."""
    named = tuple(PRESETS[args.workload]) if args.workload is not None else ()
    flags = tuple(field for field in WORKLOAD_FLAGS if getattr(args, field) not in (None, False))
    return tuple(dict.fromkeys(named + flags))


def parse_args(parser: ArgumentParser, argv):
    """The options, and the engine's flags as one string: the words after ``--``, the
    positional string(s), or, where the flags start with ``-`` and no ``--`` is given, the
    words this parser does not know (an engine flag is never one of hrm import's)."""
    argv = list(argv)
    after: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, after = argv[:cut], argv[cut + 1:]
    args, unknown = parser.parse_known_args(argv)
    words = list(args.flags) + unknown + after
    if not words:  # an empty string is given: the engine's reader refuses it, naming the engine
        parser.error("the engine's flags are required (one string, or the words after --)")
    args.flags = " ".join(words)
    return args


def build_parser() -> ArgumentParser:
    """``hrm import``'s parser (--model is optional: a benchmark tool's command needs none)."""
    parser = ArgumentParser(prog="hrm import", description=(
        "Read another engine's flags (one shell string) as the HRM policy they run and print its estimate: "
        "what does my current command reach? The command's own workload flags (and the engine's defaults where "
        "absent) define the workload estimated; a workload flag given here that differs from them is an error. "
        "Unknown or malformed flags are refused in one line (exit 2). On a --hw without a GPU, a llama-server / "
        "llama-cli / llama-completion command is the run it serves on the CPU step model (its -m GGUF, or --gguf)."))
    parser.add_argument("--from", dest="source", required=True, choices=list(IMPORT_SOURCES),
                        help="the engine the flags are for (ollama: a Modelfile's PARAMETER lines, /set parameter lines or a "
                             "request's options JSON, read as the llama-server command ollama launches)")
    parser.add_argument("flags", nargs="*", metavar="FLAGS",
                        help='the engine\'s flags: one string, e.g. "-ngl 99 -c 40960 -np 64 -ub 64 --n-cpu-moe 28", or '
                             'several words after --, e.g. -- -ngl 99 -c 40960 -np 64 -ub 64 --n-cpu-moe 28 -nkvo; a string that starts with - is read too '
                             '("--n-cpu-moe=28")')
    add_machine_args(parser)
    add_workload_args(parser)
    parser.set_defaults(workload=None)  # None: no preset named (mtbench is used), so none to check
    add_memory_args(parser)
    parser.add_argument("--engine", choices=list(list_engines()),
                        help="HRM engine to estimate with (default: the closest shipped one, else ideal)")
    parser.add_argument("--json", action="store_true", help="print the policy and its estimate as JSON")
    parser.add_argument("--gguf", metavar="FILE", help="llama-bench / llama-batched-bench commands, and llama-server / "
                        "llama-cli on a --hw without a GPU: the GGUF (or an hrm tensor table) whose tensors the CPU "
                        "prediction reads, when the command's -m is not here")
    load = parser.add_argument_group("a load of requests (a llama-server command on a --hw without a GPU)")
    load.add_argument("--rate-per-s", type=bounds.REQUEST_RATE_PER_S.flag("--rate-per-s"),
                      help="requests arriving per second, each of the workload's prompt and generated tokens; with --requests")
    load.add_argument("--requests", type=bounds.LOAD_REQUESTS.flag("--requests"), help="how many requests arrive")
    load.add_argument("--arrivals", choices=("poisson", "even"), default="poisson",
                      help="Poisson arrivals (exponential gaps, as serving benchmarks send them; default) or evenly spaced")
    load.add_argument("--seed", type=bounds.SEED.flag("--seed"), default=0, help="seed of the Poisson arrivals (default 0)")
    load.add_argument("--load", metavar="FILE", help="the requests as a file: JSON Lines or CSV with arrival_s, "
                      "prompt_tokens, gen_tokens per request")
    # --model is the catalog model the estimate plans; a llama-bench / llama-batched-bench
    # command is predicted from its GGUF's own tensors and needs none
    next(a for a in parser._actions if "--model" in a.option_strings).required = False
    return parser


def _bench_main(args) -> int:
    """A llama.cpp benchmark tool's command (llama-bench, llama-batched-bench): HRM's llama.cpp
    engine per point on a GPU machine with --model, else the CPU step model."""
    from hrm_cli import import_bench
    from hrm.machine.hardware import load_hardware

    hw = load_hardware(args.hw)
    if hw.gpu is not None and args.model is not None:  # a GPU machine: HRM's llama.cpp engine per point
        _, model = machine_from_args(args)
        model, named_note = _with_named_format(args, model)  # -m ...-Q4_K_M.gguf: its weights
        return import_bench.gpu_main(args.flags, hw, model, args.json, (named_note,) if named_note else ())
    return import_bench.main(args.flags, hw, args.gguf, args.json)


def _with_named_format(args, model):
    """(model, note): a llama.cpp command whose model file's name says its weights (and no
    --weight-dtype / --weight-format given) estimates those; note says so (None otherwise)."""
    if args.source != "llama.cpp" or args.weight_dtype is not None or args.weight_format is not None:
        return model, None
    from hrm.export.llama_cpp import gguf_name_format

    named_format = gguf_name_format(args.flags)
    if named_format is None:
        return model, None
    return (model.with_stored_format(named_format[2]),
            f"the model file's name says {named_format[0]}: estimated as --weight-dtype {named_format[1]} "
            f"--weight-format {named_format[2]} (give either flag to override)")


def _check_load_flags(parser, args) -> bool:
    """Whether a load was asked for; the flags' combinations checked (exit 2)."""
    if args.load is not None and (args.rate_per_s is not None or args.requests is not None):
        parser.error("--load FILE gives the requests itself: drop --rate-per-s / --requests")
    if args.load is None:
        check_rate_and_requests(parser, args)
    return args.load is not None or args.rate_per_s is not None


_LOAD_ONLY = ("--rate-per-s / --requests / --load: a load of requests is predicted for a llama-server command "
              "(or ollama's) on a --hw without a GPU, on the CPU step model (a profile measured with hrm profile "
              "--llama-cpp DIR and the command's GGUF)")


def main(argv) -> int:
    """``hrm import``: the engine's flags as a policy, estimated and printed (or the benchmark
    tool's prediction); exit 3 when the policy does not fit physical memory."""
    parser = build_parser()
    args = parse_args(parser, argv)
    from hrm.export.llama_tools import tool_of

    load_asked = _check_load_flags(parser, args)
    if args.source == "llama.cpp" and tool_of(args.flags):  # a benchmark tool: the CPU step model
        if load_asked:
            parser.error(_LOAD_ONLY)
        return _bench_main(args)
    from hrm_cli import import_bench

    here = import_bench.command_gguf(args.flags) if args.source == "llama.cpp" else None
    if args.model is None:
        if here is None:
            parser.error("the following arguments are required: --model (or a command whose -m names a GGUF file here)")
        args.model = str(here)  # the file the command runs is the model: its header says what it is
    fields = given_fields(args)
    args.workload = args.workload or DEFAULT_PRESET
    hw, model = machine_from_args(args)
    gguf = args.gguf or here
    if (args.source in ("llama.cpp", "ollama") and hw.gpu is None and hw.ggml_cpu is not None
            and not hw.ggml_cpu.prior and gguf is not None and args.engine is None):
        # no GPU: llama.cpp runs every layer on the CPU backend, which the CPU step model prices from
        # the GGUF's own tensors and this machine's measured kernels (docs/validation/ground_truth.md)
        if load_asked:
            return import_bench.load_main(args.source, args.flags, hw, model, workload_from_args(args), gguf,
                                          args, args.json)
        return import_bench.cpu_only_main(args.source, args.flags, hw, model, workload_from_args(args), gguf,
                                          args.json)
    if load_asked:
        parser.error(_LOAD_ONLY)
    model, named_note = _with_named_format(args, model)
    options = options_from_args(args)
    limits = limits_from_args(hw, options, args)
    asked = workload_from_args(args)
    imported = read_command(args.source, args.flags, model, asked, hw, options.gpu_memory_utilization,
                            {field: getattr(asked, field) for field in fields})
    policy, notes, workload = imported.policy, list(imported.notes), imported.workload
    if args.source in ("llama.cpp", "ollama") and hw.gpu is None and args.engine is None:
        missing = ("a measured ggml_cpu section (hrm profile --llama-cpp DIR)"
                   if hw.ggml_cpu is None or hw.ggml_cpu.prior else "the GGUF (-m a file here, or --gguf FILE)")
        notes.append(f"no GPU in {hw.name}: with {missing} this command is predicted on the CPU step model that real "
                     "llama.cpp runs hold (docs/validation/ground_truth.md §1.10); this estimate is HRM's llama.cpp "
                     "engine with the host as its device")
    model = imported.model or model  # as the command stores it (SGLang's --kt-method: the CPU experts' format)
    if named_note is not None:
        notes.append(named_note)
    engine = imported_engine(args.source, imported, args.engine)
    # a command's policy is pinned: it must fit physical memory less the engine's fixed costs
    # (hrm.cost.memory.physical_limits), as hrm estimate checks; above the planning caps it is said
    physical = physical_limits(hw, engine, args.gpu_mem, args.cpu_mem)
    # -ngl auto: llama.cpp's --fit moves experts to the CPU until the rest fits; that placement is estimated
    fitted, _ = fitted_policy(imported, hw, model, engine, physical,
                              lambda p: estimate(hw, model, workload, p, options=options, limits=limits, engine=engine))
    if fitted is not imported:
        policy, notes = fitted.policy, notes + [fitted.notes[-1]]
    result = estimate(hw, model, workload, policy, options=options, limits=limits, engine=engine)
    fits_physical = result.fits(physical)
    if args.json:
        print(json.dumps({"source": args.source, "policy": result.policy.model_dump(), "policy_short": policy.short(),
                          "engine": result.engine, "workload": workload.model_dump(),
                          "estimate": result.to_plan_estimate(), "feasible": result.feasible,
                          "fits_physical_memory": fits_physical, "notes": notes + list(import_source(args.source)[1].caveats)}, indent=2))
    else:
        from hrm_cli.estimate import render_estimate

        render_estimate(result, f"{args.source} flags as an HRM policy: {model.name} on {hw.name}, "
                                f"prompt {workload.effective_prompt_len}, gen {workload.gen_len}", physical)
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    if not fits_physical:
        raise InfeasibleError(f"{policy.short()} does not fit physical memory less engine {engine.name}'s reserve "
                              f"({result.binding_memory} of the planning caps)")
    return 0
