"""``hrm estimate``: time, memory and throughput of one policy; ``hrm ops``: operator table."""

from __future__ import annotations

import json
from dataclasses import dataclass

from hrm import bounds
from hrm_cli.parser import ArgumentParser
from hrm_cli.common import (add_engine_args, add_memory_rows, add_machine_args, add_memory_args, add_routing_arg, add_workload_args,
                            compact, console, engine_from_args, gib, limits_from_args, machine_from_args,
                            options_from_args, policy_cell, routed_model, tpot_in_words, TPOT_LABEL,
                            workload_from_args)
from hrm.errors import InfeasibleError
from hrm.estimate import EstimateResult, estimate
from hrm.cost.memory import MemoryLimits, physical_limits
from hrm.pipelines import lane_label
from hrm.analysis.explain import explain
from hrm.policy import parse_policy


def fits_in_words(result: EstimateResult, physical: MemoryLimits | None):
    """Within the planning caps; above them but within physical memory less the engine's
    reserve (a warning: the search would not choose it); or not at all (a red rich Text)."""
    from rich.text import Text

    if result.feasible:
        return Text("yes")
    if physical is not None and result.fits(physical):
        return Text("yes, above the planning caps (--gpu-util/--cpu-util): within physical memory less the engine's "
                    "reserve (CUDA context, process)")
    return Text("NO: exceeds physical memory less the engine's reserve" if physical is not None else
                "NO: exceeds a memory limit", style="red")


def render_estimate(result: EstimateResult, title: str, physical: MemoryLimits | None = None) -> None:
    from rich.table import Table

    table = Table(title=title, show_header=True)
    table.add_column("quantity")
    table.add_column("value", justify="right", overflow="fold")
    table.add_row("policy", policy_cell(result.policy))
    table.add_row("engine", f"{result.engine} (schedule {result.schedule})")
    for name, seconds in result.resource_layer_s.items():
        share = result.utilization.get(name, 0.0)
        table.add_row(f"decode time/layer: {lane_label(name)}", f"{seconds * 1e3:.3f} ms ({share:.0%} busy)")
    table.add_row("decode layer latency", f"{result.decode_layer_latency_s * 1e3:.3f} ms")
    table.add_row("bottleneck", result.bottleneck)
    table.add_row("TTFT (prefill)", f"{result.prefill_latency_s:.3f} s")
    table.add_row(TPOT_LABEL, tpot_in_words(result.per_token_latency_s, result.policy.batch_size))
    table.add_row("decode throughput", f"{result.decode_throughput_tok_s:,.1f} tok/s")
    table.add_row("generation throughput", f"{result.generation_throughput_tok_s:,.1f} tok/s")
    add_memory_rows(table, result, "host memory (both tiers)")
    table.add_row("binding memory", result.binding_memory)
    table.add_row("fits", fits_in_words(result, physical))
    for note in result.notes:
        table.add_row("note", note)
    if result.defaulted:
        table.add_row("defaulted rates", ", ".join(result.defaulted) + " (hrm.machine.achieved.DEFAULTS has each source)")
    console().print(table)


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="hrm estimate", description="Predict one policy's time, memory and throughput.")
    add_machine_args(parser)
    add_workload_args(parser)
    add_memory_args(parser)
    parser.add_argument("--policy", required=True,
                        help="e.g. N=1152,mu=36,attn=cpu,ffn=gpu,rw=0,rc=0 (two of N, mu, n)")
    add_engine_args(parser)
    parser.add_argument("--explain", action="store_true",
                        help="each mechanism of the engine: its cost per layer and its share of the gap to ideal")
    parser.add_argument("--json", action="store_true", help="print the plan's estimate block and the policy")
    return parser


@dataclass
class EstimateRun:
    """What ``hrm estimate`` computes before it prints: the estimate, the --explain report,
    the physical limits, its inputs, and what --json prints (``json``)."""

    result: EstimateResult
    report: object
    physical: MemoryLimits
    hw: object
    model: object
    workload: object
    engine: object
    json: dict

    @property
    def fits_physical(self) -> bool:
        return self.result.fits(self.physical)

    def infeasible_line(self) -> str:
        """The one line ``hrm estimate`` exits 3 with when the policy does not fit."""
        return (f"the policy does not fit physical memory less engine {self.engine.name}'s reserve: "
                f"GPU {gib(self.result.gpu_peak_bytes)} of {gib(self.physical.gpu_bytes)}, "
                f"CPU {gib(self.result.cpu_peak_bytes)} of {gib(self.physical.cpu_bytes)}")


def run_estimate(args, machine=None) -> EstimateRun:
    """The estimate of parsed ``hrm estimate`` flags, nothing printed; ``machine`` = (hw, model)
    already loaded (the web planner's uploads), else --hw/--model are loaded."""
    hw, model = machine if machine is not None else machine_from_args(args)
    workload = workload_from_args(args)
    policy = parse_policy(args.policy)
    options = options_from_args(args)
    engine = engine_from_args(args, hw)
    limits = limits_from_args(hw, options, args)
    report = explain(hw, model, workload, policy, engine, options, limits) if args.explain else None
    result = report.engine_estimate if report else estimate(hw, model, workload, policy, options=options,
                                                              limits=limits, engine=engine)
    physical = physical_limits(hw, engine, getattr(args, "gpu_mem", None), getattr(args, "cpu_mem", None))
    out = {"policy": result.policy.model_dump(), "schedule": result.schedule, "engine": result.engine,
           "estimate": result.to_plan_estimate(), "feasible": result.feasible,
           "fits_physical_memory": result.fits(physical),
           "physical_limit_bytes": {"gpu": physical.gpu_bytes, "cpu": physical.cpu_bytes}}
    if report is not None:
        out["explain"] = report.as_dict()
    return EstimateRun(result, report, physical, hw, model, workload, engine, out)


def main(argv) -> int:
    args = build_parser().parse_args(argv)
    run = run_estimate(args)
    result, hw, model, workload = run.result, run.hw, run.model, run.workload
    if args.json:
        print(json.dumps(run.json, indent=2))
    else:
        render_estimate(result, f"{model.name} on {hw.name}, prompt {workload.effective_prompt_len}, gen {workload.gen_len}",
                        run.physical)
        if run.report is not None:
            console().print(run.report.table())
    if not run.fits_physical:  # it cannot run: the estimate is printed, then one line and exit 3
        raise InfeasibleError(run.infeasible_line())
    return 0


def ops_main(argv) -> int:
    """``hrm ops --model M [--mu 64 --context 512 --prompt-len 512]``: operator FLOPs/bytes."""
    from rich.table import Table

    from hrm.cost.costs import operator_table
    from hrm.model.spec import load_model

    parser = ArgumentParser(prog="hrm ops", description="Per-operator FLOPs, bytes and intensity of one layer.")
    parser.add_argument("--model", required=True)
    parser.add_argument("--mu", type=bounds.SEQUENCES.flag("--mu"), default=64, help="micro-batch size (sequences)")
    parser.add_argument("--context", type=bounds.TOKENS.flag("--context"), default=512, help="decode context length")
    parser.add_argument("--prompt-len", type=bounds.TOKENS.flag("--prompt-len"), default=512,
                        help="prefill prompt length")
    add_routing_arg(parser)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    frame = operator_table(routed_model(load_model(args.model), args.routing), args.mu, args.context, args.prompt_len)
    if args.json:
        print(frame.to_json(orient="records", indent=2))
        return 0
    table = Table(title=f"{args.model}: one layer, mu={args.mu}, context={args.context}, prompt={args.prompt_len}",
                  caption=OPS_LEGEND, caption_justify="left")
    for col in frame.columns:
        table.add_column(OPS_HEADERS.get(col, col), justify="right", overflow="fold")
    for row in frame.itertuples(index=False):
        table.add_row(row[0], row[1], *(compact(v) for v in row[2:]))
    console().print(table)
    return 0


#: short headers of ``hrm ops`` (hrm.cost.costs.operator_table's columns), so the table fits 80
#: columns; OPS_LEGEND under the table spells them out
OPS_HEADERS = {"flops": "FLOP", "weight_bytes": "weight B", "kv_bytes": "KV B", "act_bytes": "act B",
               "intensity_flop_per_byte": "FLOP/B"}
OPS_LEGEND = "FLOP: floating-point operations; B: bytes (weights, KV cache, activations) moved; FLOP/B: intensity"
