"""``hrm show plan.json``: re-print a plan file."""

from __future__ import annotations

from hrm_cli.common import console, policy_cell
from hrm_cli.parser import ArgumentParser
from hrm.plan import load_plan
from hrm.units import GIB


def main(argv) -> int:
    from rich.table import Table

    parser = ArgumentParser(prog="hrm show", description="Re-print a plan file.")
    parser.add_argument("plan")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    plan = load_plan(args.plan)
    if args.json:
        print(plan.model_dump_json(indent=2))
        return 0
    table = Table(title=f"plan {args.plan} (schema {plan.schema_version})", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value", overflow="fold")
    table.add_row("hardware", f"{plan.hardware.name} ({plan.hardware.sha256[:12]})")
    table.add_row("model", f"{plan.model.name} ({plan.model.sha256[:12]})")
    w = plan.workload
    table.add_row("workload", f"prompt {w.prompt_len} (max {w.max_prompt_len}), gen {w.gen_len}, padding {w.padding}")
    table.add_row("routing", plan.routing.label() if plan.routing is not None else "uniform")
    table.add_row("policy", policy_cell(plan.policy))
    table.add_row("schedule", plan.schedule)
    e = plan.estimate
    table.add_row("generation throughput", f"{e.generation_throughput_tok_s:,.1f} tok/s")
    table.add_row("decode throughput", f"{e.decode_throughput_tok_s:,.1f} tok/s")
    table.add_row("decode layer latency", f"{e.decode_layer_latency_s * 1e3:.3f} ms")
    table.add_row("TTFT (prefill)", f"{e.prefill_latency_s:.2f} s")
    table.add_row("bottleneck", e.bottleneck)
    table.add_row("GPU / CPU peak", f"{e.gpu_peak_bytes / GIB:.2f} GiB / {e.cpu_peak_bytes / GIB:.2f} GiB")
    gpu_experts = sum(len(layer.gpu_experts) for layer in plan.placement.layers)
    table.add_row("placement", f"{gpu_experts} experts static on GPU over {len(plan.placement.layers)} layers "
                               f"(r_w {plan.placement.weights_gpu_ratio_realised:.4f}), {plan.placement.weight_pages} pages")
    table.add_row("solver", f"{plan.solver.name}, {plan.solver.seconds:.2f} s, optimal={plan.solver.optimal}")
    table.add_row("created by", plan.created_by)
    console().print(table)
    return 0
