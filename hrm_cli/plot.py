"""``hrm plot KIND ... --out F.png``: roofline, policy-map, cpu-memory, timeline.

A thin layer: it builds the data with the API (:mod:`hrm.plots`, :mod:`solver.sweep`) and
draws it. Sweeps can also write their table (``--csv``).
"""

from __future__ import annotations

import sys

from hrm_cli import ArgumentParser
from hrm_cli.common import (add_machine_args, add_memory_args, add_workload_args, limits_from_args,
                          machine_from_args, options_from_args, workload_from_args)
from hrm.errors import HRMError
from hrm.latency import SCHEDULES
from hrm.units import DTYPES
from hrm.workload import PRESETS, make_workload
from hrm.plots._common import save_png

KINDS = ("roofline", "policy-map", "cpu-memory", "timeline")
FIG10 = {"hw": "2xa100-80g", "model": "mixtral", "prompt_len": 512, "gen_len": 32,
         "bandwidths": "100,200,300,400,500", "cpu_scales": "1,2,3,4,5"}


def _floats(text: str, flag: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise HRMError(f"{flag}: expected comma-separated numbers, got '{text}'") from None
    if not values or any(v <= 0 for v in values):
        raise HRMError(f"{flag}: expected positive numbers, got '{text}'")
    return values


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="hrm plot", description="Draw HRM figures (PNG, headless).")
    sub = parser.add_subparsers(dest="kind", metavar="KIND", parser_class=ArgumentParser)
    sub.required = True

    roof = sub.add_parser("roofline", help="HRM roofline of one operator (paper Fig. 4/5)")
    add_machine_args(roof)
    roof.add_argument("--op", default="moe-ffn", choices=["moe-ffn", "attention"], help="operator (default moe-ffn)")
    roof.add_argument("--context", type=int, default=512, help="attention context length (tokens, default 512)")
    roof.add_argument("--micro-batch", type=int, default=128, help="MoE FFN kernel micro-batch μ (default 128)")
    roof.add_argument("--batch-sizes", default="16,64,256,1024,4096", help="batch sizes N drawn for the MoE FFN")
    roof.add_argument("--kv-dtypes", default="fp16,int4", help="KV dtypes drawn for attention")

    pmap = sub.add_parser("policy-map", help="best policy over link bandwidth × CPU scaling (paper Fig. 10)")
    pmap.add_argument("--hw", default=FIG10["hw"], help=f"hardware profile (default {FIG10['hw']})")
    pmap.add_argument("--model", default=FIG10["model"], help=f"model (default {FIG10['model']})")
    pmap.add_argument("--weight-dtype", choices=list(DTYPES))
    pmap.add_argument("--kv-dtype", choices=list(DTYPES))
    pmap.add_argument("--workload", choices=list(PRESETS), help="workload preset (default: prompt 512, gen 32)")
    pmap.add_argument("--prompt-len", type=int)
    pmap.add_argument("--max-prompt-len", type=int)
    pmap.add_argument("--gen-len", type=int)
    pmap.add_argument("--padding", action="store_true")
    pmap.add_argument("--bandwidths", default=FIG10["bandwidths"], help="CPU→GPU GB/s values (comma-separated)")
    pmap.add_argument("--cpu-scales", default=FIG10["cpu_scales"], help="CPU scaling ratios (comma-separated)")
    pmap.add_argument("--schedule", choices=SCHEDULES, help="lane structure of --engine ideal (default cgopipe)")
    pmap.add_argument("--engine", default="ideal", help="engine name or YAML file (default ideal)")
    pmap.add_argument("--objective", default="generation", choices=["generation", "decode"])
    pmap.add_argument("--csv", help="also write the table of best policies")

    mem = sub.add_parser("cpu-memory", help="throughput vs CPU memory per schedule (paper Fig. 1)")
    add_machine_args(mem)
    add_workload_args(mem)
    mem.add_argument("--cpu-mems", help="CPU memory capacities in GiB (default: 0.4× to 2× the profile's)")
    mem.add_argument("--schedules", default=",".join(SCHEDULES),
                     help="schedules of engine ideal and/or engine names to compare (comma-separated)")
    mem.add_argument("--objective", default="generation", choices=["generation", "decode"])
    mem.add_argument("--csv", help="also write the table")

    tl = sub.add_parser("timeline", help="Gantt chart of decode layers (model; runtime trace if given)")
    add_machine_args(tl)
    add_workload_args(tl)
    add_memory_args(tl)
    tl.add_argument("--plan", help="plan file (hrm-search --out); its policy and schedule are drawn")
    tl.add_argument("--policy", help="policy, e.g. 'N=2496,mu=192,rw=0.11' (default: the trace's policy when "
                    "--trace is given, else the searched optimum)")
    tl.add_argument("--schedule", choices=SCHEDULES, help="schedule (default: the plan's, else cgopipe)")
    tl.add_argument("--engine", help="engine name or YAML file (default: the plan's, else ideal)")
    tl.add_argument("--context", type=float, help="cached tokens (default: the mean over the decode steps)")
    tl.add_argument("--trace", help="Chrome trace from 'hrm run --trace' to draw below the model")
    tl.add_argument("--trace-step", type=int, help="decode step of the trace to draw (default: the middle one)")
    tl.add_argument("--trace-layer", type=int, help="layer of the trace to draw (default: the middle one)")
    for p in (roof, pmap, mem, tl):
        p.add_argument("--out", required=True, help="PNG file to write (atomically)")
        p.add_argument("--dpi", type=int, default=150)
    return parser


def _progress(label: str):
    """A rich progress bar on stderr for sweeps (silent when not a terminal)."""
    from rich.progress import Progress

    progress = Progress(transient=True, disable=not sys.stderr.isatty())
    task = progress.add_task(label, total=None)

    def update(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    return progress, update


def _roofline(args):
    from hrm.plots.roofline import plot_roofline, roofline_data

    hw, model = machine_from_args(args)
    sizes = [int(v) for v in _floats(args.batch_sizes, "--batch-sizes")]
    data = roofline_data(hw, model, args.op, args.context, args.micro_batch, sizes,
                         [d.strip() for d in args.kv_dtypes.split(",") if d.strip()])
    for point in data.points:
        print(f"{point.label}  ({point.flops / 1e12:.3g} TFLOP/s)")
    return plot_roofline(data)


def _policy_map(args):
    from solver.sweep import policy_map

    from hrm.plots.policy_map import plot_policy_map

    hw, model = machine_from_args(args)
    if args.workload or args.prompt_len or args.gen_len:
        workload = make_workload(args.workload, args.prompt_len, args.max_prompt_len, args.gen_len, args.padding)
    else:
        workload = make_workload(None, FIG10["prompt_len"], args.max_prompt_len, FIG10["gen_len"], args.padding)
    bandwidths, scales = _floats(args.bandwidths, "--bandwidths"), _floats(args.cpu_scales, "--cpu-scales")
    progress, update = _progress("policy map")
    with progress:
        table = policy_map(hw, model, workload, bandwidths, scales, args.schedule, args.objective, progress=update,
                           engine=args.engine)
    _write_csv(table, args.csv)
    title = (f"best policy ({args.objective} throughput, {args.engine}/{args.schedule or 'cgopipe'}): {model.name} on {hw.name} with the "
             f"link and CPU varied; prompt {workload.prompt_len}, gen {workload.gen_len}")
    return plot_policy_map(table, title)


def _cpu_memory(args):
    from solver.sweep import cpu_memory_sweep

    from hrm.plots.cpu_memory import plot_cpu_memory

    hw, model = machine_from_args(args)
    workload = workload_from_args(args)
    if args.cpu_mems:
        capacities = _floats(args.cpu_mems, "--cpu-mems")
    else:
        base = hw.cpu.memory_gib
        capacities = [round(base * f) for f in (0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0)]
    schedules = [s.strip() for s in args.schedules.split(",") if s.strip()]
    from hrm.engine import list_engines

    unknown = [s for s in schedules if s not in SCHEDULES and s not in list_engines()]
    if unknown:
        raise HRMError(f"--schedules: unknown {', '.join(unknown)} (schedules {', '.join(SCHEDULES)}; "
                       f"engines {', '.join(list_engines())})")
    progress, update = _progress("cpu-memory sweep")
    with progress:
        table = cpu_memory_sweep(hw, model, workload, capacities, schedules, args.objective, progress=update)
    _write_csv(table, args.csv)
    title = (f"{model.name} on {hw.name}: best policy per schedule vs CPU memory "
             f"(prompt {workload.prompt_len}, gen {workload.gen_len})")
    column = "generation_throughput_tok_s" if args.objective == "generation" else "decode_throughput_tok_s"
    return plot_cpu_memory(table, title, column)


def _timeline(args):
    from hrm.plan import load_plan
    from hrm.policy import parse_policy
    from hrm.rates import rates_from_profile
    from hrm.timeline import decode_timeline, mid_context
    from hrm.plots.timeline import plot_timeline, trace_policy

    hw, model = machine_from_args(args)
    options = options_from_args(args)
    workload = workload_from_args(args)
    from hrm.engine import resolve_engine

    schedule, engine_name = args.schedule, args.engine
    if args.plan:
        plan = load_plan(args.plan)
        policy, workload = plan.policy, plan.workload
        engine_name = engine_name or plan.engine
        schedule = schedule or (plan.schedule if engine_name == "ideal" else None)
    engine = resolve_engine(engine_name, schedule)
    if args.plan:
        pass
    elif args.policy or (args.trace and trace_policy(args.trace)):
        policy = parse_policy(args.policy or trace_policy(args.trace))
    else:
        from solver.search import search

        result = search(hw, model, workload, engine=engine, options=options,
                        limits=limits_from_args(hw, options, args), top=0)
        policy = result.best.policy
    context = args.context or mid_context(workload.effective_prompt_len, workload.gen_len)
    timeline = decode_timeline(model, rates_from_profile(hw, options.for_model(model)), policy, engine, context)
    print(f"layer period {timeline.layer_period_s * 1e3:.4g} ms (list-scheduled), "
          f"eq. 12 bound {timeline.lane_bound_s * 1e3:.4g} ms")
    return plot_timeline(timeline, f"{model.name} on {hw.name}, {policy.short()}, context {context:.0f}",
                         args.trace, args.trace_step, args.trace_layer)


def _write_csv(table, path) -> None:
    if path:
        from hrm.plan import write_atomic

        write_atomic(path, table.to_csv(index=False))
        print(f"wrote {path}")


def main(argv) -> int:
    args = build_parser().parse_args(argv)
    if args.dpi <= 0:
        raise HRMError(f"--dpi must be positive, got {args.dpi}")
    from pathlib import Path

    folder = Path(args.out).parent
    if not folder.is_dir():  # fail before a long sweep, not after it
        raise HRMError(f"{args.out}: folder {folder} does not exist")
    draw = {"roofline": _roofline, "policy-map": _policy_map, "cpu-memory": _cpu_memory, "timeline": _timeline}
    fig = draw[args.kind](args)
    save_png(fig, args.out, args.dpi)
    print(f"wrote {args.out}")
    return 0
