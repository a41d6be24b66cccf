"""``hrm plot KIND ... --out F.png``: roofline, policy-map, cpu-memory, timeline.

A thin layer: it builds the data with the API (:mod:`hrm.plots`, :mod:`solver.sweep`) and
draws it. Sweeps can also write their table (``--csv``).
"""

from __future__ import annotations


from hrm import bounds
from hrm_cli.parser import ArgumentParser
from hrm_cli.common import (add_machine_args, engine_default_help, add_memory_args, add_workload_args, check_input_file, limits_from_args,
                            machine_from_args, options_from_args, workload_from_args)
from hrm_cli.sweep import sweep_progress
from hrm.errors import HRMError
from hrm.engines.schedules import SCHEDULES
from hrm.units import DTYPES
from hrm.workload import PRESETS, make_workload

KINDS = ("roofline", "policy-map", "cpu-memory", "timeline")
FIG10 = {"hw": "2xa100-80g", "model": "mixtral", "prompt_len": 512, "gen_len": 32,
         "bandwidths": "100,200,300,400,500", "cpu_scales": "1,2,3,4,5"}


def _floats(text: str, flag: str, rng: bounds.Range = bounds.NON_NEGATIVE) -> list[float]:
    """Comma-separated numbers, each in ``rng`` (hrm.bounds), at most 64 of them."""
    items = [v.strip() for v in text.split(",") if v.strip()]
    if not items:
        raise HRMError(f"{flag}: expected comma-separated numbers, got {text!r}")
    if len(items) > 64:
        raise HRMError(f"{flag}: at most 64 values, got {len(items)}")
    values = []
    for item in items:
        try:
            value = int(item) if rng.integer else float(item)
        except ValueError:
            kind = "integers" if rng.integer else "numbers"
            raise HRMError(f"{flag}: expected comma-separated {kind}, got {item!r}") from None
        values.append(rng.check(value, flag))
    if len(set(values)) != len(values):
        raise HRMError(f"{flag}: a value is given twice ({text})")
    return values


def build_parser() -> ArgumentParser:
    """``hrm plot``'s parser: one subcommand per figure, each with --out and --dpi."""
    parser = ArgumentParser(prog="hrm plot", description="Draw HRM figures (PNG, headless).")
    sub = parser.add_subparsers(dest="kind", metavar="KIND", parser_class=ArgumentParser)
    sub.required = True
    figures = (_add_roofline_parser(sub), _add_policy_map_parser(sub), _add_cpu_memory_parser(sub),
               _add_timeline_parser(sub))
    for p in figures:
        p.add_argument("--out", required=True, help="PNG file to write (atomically, with --csv: both or neither)")
        p.add_argument("--dpi", type=bounds.DPI.flag("--dpi"), default=150, help=f"resolution {bounds.DPI.describe()}")
    return parser


def _add_roofline_parser(sub) -> ArgumentParser:
    """``hrm plot roofline``: the HRM roofline of one operator."""
    roof = sub.add_parser("roofline", help="HRM roofline of one operator (paper Fig. 4/5)")
    add_machine_args(roof)
    roof.add_argument("--op", default="moe-ffn", choices=["moe-ffn", "attention"], help="operator (default moe-ffn)")
    roof.add_argument("--context", type=bounds.TOKENS.flag("--context"), default=512,
                      help="attention context length (tokens, default 512)")
    roof.add_argument("--micro-batch", type=bounds.SEQUENCES.flag("--micro-batch"), default=128,
                      help="MoE FFN kernel micro-batch μ (default 128)")
    roof.add_argument("--batch-sizes", default="16,64,256,1024,4096", help="batch sizes N drawn for the MoE FFN")
    roof.add_argument("--kv-dtypes", default="fp16,int4", help="KV dtypes drawn for attention")
    return roof


def _add_policy_map_parser(sub) -> ArgumentParser:
    """``hrm plot policy-map``: the best policy over link bandwidth × CPU scaling."""
    pmap = sub.add_parser("policy-map", help="best policy over link bandwidth × CPU scaling (paper Fig. 10)")
    pmap.add_argument("--hw", default=FIG10["hw"], help=f"hardware profile (default {FIG10['hw']})")
    pmap.add_argument("--model", default=FIG10["model"], help=f"model (default {FIG10['model']})")
    pmap.add_argument("--weight-dtype", choices=list(DTYPES))
    pmap.add_argument("--kv-dtype", choices=list(DTYPES))
    pmap.add_argument("--workload", choices=list(PRESETS), help="workload preset (default: prompt 512, gen 32)")
    pmap.add_argument("--prompt-len", type=bounds.TOKENS.flag("--prompt-len"))
    pmap.add_argument("--max-prompt-len", type=bounds.TOKENS.flag("--max-prompt-len"))
    pmap.add_argument("--gen-len", type=bounds.GEN_TOKENS.flag("--gen-len"))
    pmap.add_argument("--padding", action="store_true")
    pmap.add_argument("--bandwidths", default=FIG10["bandwidths"], help="CPU→GPU GB/s values (comma-separated)")
    pmap.add_argument("--cpu-scales", default=FIG10["cpu_scales"], help="CPU scaling ratios (comma-separated)")
    pmap.add_argument("--schedule", choices=list(SCHEDULES), help="lane structure of --engine ideal (default cgopipe)")
    pmap.add_argument("--engine", help=f"engine name or YAML file ({engine_default_help()})")
    pmap.add_argument("--objective", default="generation", choices=["generation", "decode"])
    pmap.add_argument("--csv", help="also write the table of best policies")
    return pmap


def _add_cpu_memory_parser(sub) -> ArgumentParser:
    """``hrm plot cpu-memory``: throughput against CPU memory per schedule."""
    mem = sub.add_parser("cpu-memory", help="throughput vs CPU memory per schedule (paper Fig. 1)")
    add_machine_args(mem)
    add_workload_args(mem)
    mem.add_argument("--cpu-mems", help="CPU memory capacities in GiB (default: 0.4× to 2× the profile's)")
    mem.add_argument("--schedules", default=",".join(SCHEDULES),
                     help="schedules of engine ideal and/or engine names to compare (comma-separated)")
    mem.add_argument("--objective", default="generation", choices=["generation", "decode"])
    mem.add_argument("--csv", help="also write the table")
    return mem


def _add_timeline_parser(sub) -> ArgumentParser:
    """``hrm plot timeline``: the Gantt chart of decode layers."""
    tl = sub.add_parser("timeline", help="Gantt chart of decode layers (model; runtime trace if given)")
    add_machine_args(tl, hw_required=False)  # --plan names its own hardware and model
    add_workload_args(tl)
    add_memory_args(tl)
    tl.add_argument("--plan", help="plan file (hrm-search --out); its policy and schedule are drawn")
    tl.add_argument("--policy", help="policy, e.g. 'N=2496,mu=192,rw=0.11' (default: the trace's policy when "
                    "--trace is given, else the searched optimum)")
    tl.add_argument("--schedule", choices=list(SCHEDULES), help="schedule (default: the plan's, else cgopipe)")
    tl.add_argument("--engine", help=f"engine name or YAML file (default: the plan's, else {engine_default_help()})")
    tl.add_argument("--context", type=bounds.CONTEXT_TOKENS.flag("--context"),
                    help="cached tokens (default: the mean over the decode steps)")
    tl.add_argument("--trace", help="Chrome trace from 'hrm run --trace' to draw below the model")
    tl.add_argument("--trace-step", type=bounds.INDEX.flag("--trace-step"),
                    help="decode step of the trace to draw (default: the middle one)")
    tl.add_argument("--trace-layer", type=bounds.INDEX.flag("--trace-layer"),
                    help="layer of the trace to draw (default: the middle one)")
    return tl


def _roofline(args):
    from hrm.plots.roofline import plot_roofline, roofline_data

    hw, model = machine_from_args(args)
    sizes = _floats(args.batch_sizes, "--batch-sizes", bounds.SEQUENCES)
    kv_dtypes = [d.strip() for d in args.kv_dtypes.split(",") if d.strip()]
    unknown = [d for d in kv_dtypes if d not in DTYPES]
    if unknown or not kv_dtypes:
        raise HRMError(f"--kv-dtypes: unknown dtype {', '.join(unknown) or '(none given)'} (of {', '.join(DTYPES)})")
    data = roofline_data(hw, model, args.op, args.context, args.micro_batch, sizes, kv_dtypes)
    for point in data.points:
        print(f"{point.label}  ({point.flops / 1e12:.3g} TFLOP/s)")
    return plot_roofline(data)


def _policy_map(args):
    from solver.sweep import policy_map

    from hrm.engines.engine import resolve_engine
    from hrm.plots.policy_map import plot_policy_map
    from hrm.problem import make_problem

    hw, model = machine_from_args(args)
    if args.workload or args.prompt_len or args.gen_len:
        workload = make_workload(args.workload, args.prompt_len, args.max_prompt_len, args.gen_len, args.padding)
    else:
        workload = make_workload(None, FIG10["prompt_len"], args.max_prompt_len, FIG10["gen_len"], args.padding)
    bandwidths = _floats(args.bandwidths, "--bandwidths", bounds.LINK_GBPS)
    scales = _floats(args.cpu_scales, "--cpu-scales", bounds.SCALE)
    check_what_if(hw, bandwidths, scales)
    progress, update = sweep_progress("policy map")
    engine = resolve_engine(args.engine, args.schedule, hw)
    with progress:
        table = policy_map(make_problem(hw, model, workload, engine), bandwidths, scales, args.objective, progress=update)
    title = (f"best policy ({args.objective} throughput, {engine.name}/{engine.schedule}): {model.name} on {hw.name} with the "
             f"link and CPU varied; prompt {workload.prompt_len}, gen {workload.gen_len}")
    return plot_policy_map(table, title), table


def check_what_if(hw, bandwidths, scales) -> None:
    """Every scaled machine of the sweep must itself be a plausible profile (hrm.bounds):
    refuse, before the sweep, a scale that takes a field out of its range."""
    from pydantic import ValidationError

    from hrm.errors import pydantic_message
    from hrm.machine.whatif import with_cpu_scaled, with_link_bandwidth

    for scale in (min(scales), max(scales)):
        try:
            with_cpu_scaled(hw, scale)
        except ValidationError as exc:
            raise HRMError(pydantic_message(f"--cpu-scales {scale:g} on {hw.name}", exc)) from None
    if hw.link is not None:
        for bandwidth in (min(bandwidths), max(bandwidths)):
            try:
                with_link_bandwidth(hw, bandwidth)
            except ValidationError as exc:
                raise HRMError(pydantic_message(f"--bandwidths {bandwidth:g} on {hw.name}", exc)) from None


def _cpu_memory(args):
    from solver.sweep import cpu_memory_sweep

    from hrm.plots.cpu_memory import plot_cpu_memory
    from hrm.problem import make_problem

    hw, model = machine_from_args(args)
    workload = workload_from_args(args)
    if args.cpu_mems:
        capacities = _floats(args.cpu_mems, "--cpu-mems", bounds.CPU_MEMORY_GIB)
    else:
        base = hw.cpu.memory_gib
        capacities = [round(base * f) for f in (0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0)]
    schedules = [s.strip() for s in args.schedules.split(",") if s.strip()]
    if not schedules:
        raise HRMError(f"--schedules: expected comma-separated schedules or engine names, got {args.schedules!r}")
    from hrm.engines.engine import list_engines

    unknown = [s for s in schedules if s not in SCHEDULES and s not in list_engines()]
    if unknown:
        raise HRMError(f"--schedules: unknown {', '.join(unknown)} (schedules {', '.join(SCHEDULES)}; "
                       f"engines {', '.join(list_engines())})")
    progress, update = sweep_progress("cpu-memory sweep")
    with progress:
        table = cpu_memory_sweep(make_problem(hw, model, workload), capacities, schedules, args.objective,
                                 progress=update)
    title = (f"{model.name} on {hw.name}: best policy per schedule vs CPU memory "
             f"(prompt {workload.prompt_len}, gen {workload.gen_len})")
    column = "generation_throughput_tok_s" if args.objective == "generation" else "decode_throughput_tok_s"
    return plot_cpu_memory(table, title, column), table


def _timeline(args):
    from hrm.plan import load_plan, resolve_plan_engine
    from hrm.policy import parse_policy
    from hrm.pipelines import decode_timeline
    from hrm.problem import make_problem
    from hrm.workload import mean_decode_context
    from hrm.plots.timeline import plot_timeline, trace_policy

    plan = load_plan(args.plan) if args.plan else None
    hw, model = timeline_machine(args, plan)
    options = options_from_args(args)
    workload = workload_from_args(args)
    from hrm.engines.engine import resolve_engine

    schedule, engine_name = args.schedule, args.engine
    plan_engine = None
    if plan is not None:
        policy, workload = plan.policy, plan.workload
        if engine_name is None and schedule is None:
            plan_engine = resolve_plan_engine(plan)  # its embedded definition, if any
        engine_name = engine_name or plan.engine
        schedule = schedule or (plan.schedule if engine_name == "ideal" else None)
    engine = plan_engine or resolve_engine(engine_name, schedule, hw)
    if args.plan:
        pass
    elif args.policy or (args.trace and trace_policy(args.trace)):
        policy = parse_policy(args.policy or trace_policy(args.trace))
    else:
        from solver.search import search

        result = search(hw, model, workload, engine=engine, options=options,
                        limits=limits_from_args(hw, options, args), top=0)
        policy = result.best.policy
    context = args.context or mean_decode_context(workload)
    timeline = decode_timeline(make_problem(hw, model, workload, engine, options), policy, context=context)
    print(f"layer period {timeline.layer_period_s * 1e3:.4g} ms (list-scheduled), "
          f"eq. 12 bound {timeline.lane_bound_s * 1e3:.4g} ms")
    return plot_timeline(timeline, f"{model.name} on {hw.name}, {policy.short()}, context {context:.0f}",
                         args.trace, args.trace_step, args.trace_layer)


def timeline_machine(args, plan):
    """(hardware, model) of a timeline: --hw/--model, or the plan's where --plan is given
    (hash-checked against the plan, as ``hrm run`` does)."""
    if plan is None:
        missing = [flag for flag, value in (("--hw", args.hw), ("--model", args.model)) if not value]
        if missing:
            raise HRMError(f"{' and '.join(missing)}: required without --plan")
        return machine_from_args(args)
    from runtime.resolve import plan_hardware, plan_model

    if args.routing or args.weight_dtype or args.kv_dtype:
        raise HRMError("--plan: the plan fixes the routing and dtypes; drop --routing/--weight-dtype/--kv-dtype")
    return plan_hardware(plan, args.hw), plan_model(plan, args.model)


def check_trace(path: str) -> None:
    """Refuse (one line naming the event and field) a --trace file that is not the Chrome
    trace ``hrm run --trace`` writes: the fields the timeline reads must have their types."""
    import json
    import math

    from hrm.errors import read_input_text

    text = read_input_text(path, "a Chrome trace JSON (hrm run --trace)")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise HRMError(f"--trace {path}: malformed JSON ({' '.join(str(exc).split())[:80]})") from None
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise HRMError(f"--trace {path}: not a Chrome trace (no traceEvents list)")
    meta = data.get("metadata")
    if meta is not None and (not isinstance(meta, dict) or not isinstance(meta.get("policy", ""), str)):
        raise HRMError(f"--trace {path}: metadata.policy must be a policy string")

    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0

    for i, event in enumerate(events):
        where = f"--trace {path}: traceEvents[{i}]"
        if not isinstance(event, dict):
            raise HRMError(f"{where}: expected an event object")
        args = event.get("args", {})
        if not isinstance(args, dict):
            raise HRMError(f"{where}.args: expected an object")
        if event.get("ph") == "M" and event.get("name") == "thread_name" and not isinstance(args.get("name"), str):
            raise HRMError(f"{where}.args.name: expected a lane name")
        if event.get("ph") != "X":
            continue
        if not isinstance(event.get("name"), str):
            raise HRMError(f"{where}.name: expected a task name")
        for key in ("ts", "dur"):
            if not number(event.get(key)):
                raise HRMError(f"{where}.{key}: expected a finite non-negative number")
        for key in ("step", "layer"):
            value = args.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise HRMError(f"{where}.args.{key}: expected a non-negative integer")
        if args.get("phase") == "decode" and "step" in args and "layer" not in args:
            raise HRMError(f"{where}.args.layer: missing on a decode task")
        try:
            hash(event.get("tid"))
        except TypeError:
            raise HRMError(f"{where}.tid: expected a thread id") from None


def png_bytes(fig, dpi: int) -> bytes:
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=dpi, format="png")
    return buffer.getvalue()


def main(argv) -> int:
    from pathlib import Path

    from hrm.plan import check_output_path, write_files_atomic

    args = build_parser().parse_args(argv)
    # every output target is checked before a long sweep, not after it
    targets = [("--out", args.out)] + ([("--csv", args.csv)] if getattr(args, "csv", None) is not None else [])
    for flag, path in targets:
        check_output_path(path, flag)
    if len(targets) == 2 and Path(args.out).resolve() == Path(args.csv).resolve():
        raise HRMError(f"--csv {args.csv}: the same file as --out")
    if args.kind == "timeline" and args.trace is not None:
        check_input_file(args.trace, "--trace")
        check_trace(args.trace)
    draw = {"roofline": _roofline, "policy-map": _policy_map, "cpu-memory": _cpu_memory, "timeline": _timeline}
    drawn = draw[args.kind](args)
    fig, table = drawn if isinstance(drawn, tuple) else (drawn, None)
    files = [(args.out, png_bytes(fig, args.dpi))]
    if getattr(args, "csv", None) is not None:
        files.append((args.csv, table.to_csv(index=False)))
    write_files_atomic(files)  # all or nothing
    for path, _ in reversed(files):
        print(f"wrote {path}")
    return 0
