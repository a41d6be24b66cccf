"""``hrm run --plan plan.json``: execute a plan in the reference runtime, print measured vs
predicted side by side, optionally write a Chrome trace of every task."""

from __future__ import annotations

import json

from hrm import bounds
from hrm_cli import ArgumentParser
from hrm_cli.common import check_input_file
from hrm.errors import HRMError, InfeasibleError
from hrm.plan import Plan, check_output_path, load_plan, plan_problem, resolve_plan_engine

from runtime.report import comparison_rows, render_comparison


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="hrm run", description="Execute a plan in the reference runtime and measure it.")
    parser.add_argument("--plan", required=True, help="plan JSON written by hrm search --out")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                        help="device tier: a CUDA GPU, or emulated on the CPU (default: CUDA when available)")
    parser.add_argument("--lanes", default="auto", choices=["auto", "exclusive", "concurrent"],
                        help="emulated tier: exclusive = one task at a time on all cores (what the model assumes "
                             "for a CPU-only host), concurrent = a thread per lane (default: exclusive on a CPU-only "
                             "host, concurrent streams on CUDA)")
    parser.add_argument("--requests", type=bounds.SEQUENCES.flag("--requests"),
                        help="number of requests (default: the plan's batch size N)")
    parser.add_argument("--trace", metavar="FILE", help="write a Chrome trace (chrome://tracing, Perfetto) of every task")
    parser.add_argument("--hw", help="hardware profile to check the plan against (default: the plan's)")
    parser.add_argument("--model", help="model to run (default: the plan's); its hash must match the plan's")
    parser.add_argument("--checkpoint", help="safetensors checkpoint (HF Mixtral names); default: random weights")
    parser.add_argument("--seed", type=bounds.SEED.flag("--seed"), default=0, help="seed of the random weights and prompts")
    parser.add_argument("--no-warmup", action="store_true", help="skip the warm-up (one full untimed run) before the timed run")
    parser.add_argument("--json", action="store_true", help="print measured and predicted numbers as JSON")
    return parser


def run_plan(plan: Plan, args):
    """Resolve hardware/model (hash-checked), build weights and requests, run. Returns
    (hardware, model, result)."""
    import torch

    from runtime.executor import PlanExecutor
    from runtime.model import build_weights
    from runtime.requests import synthetic_requests
    from runtime.resolve import plan_hardware, plan_model

    hw = plan_hardware(plan, args.hw)
    spec = plan_model(plan, args.model)
    check_executable(plan, hw, spec)
    torch.manual_seed(args.seed)
    weights = build_weights(spec, args.checkpoint, args.seed)
    count = args.requests or plan.policy.batch_size
    requests = synthetic_requests(plan.workload, count, spec.vocab_size, args.seed)
    # memory tracking costs time on every task: the peak comes from its own run, which also
    # warms the process (allocator, kernels); the timed run is untracked
    with PlanExecutor(spec, weights, plan.policy, plan.workload, plan.placement, args.device,
                      track_memory=True, keep_logits=False, lanes=args.lanes) as ex:
        peak = ex.run(requests).peak_device_bytes
    with PlanExecutor(spec, weights, plan.policy, plan.workload, plan.placement, args.device,
                      track_memory=False, keep_logits=False, lanes=args.lanes) as ex:
        if not args.no_warmup:
            ex.run(requests)
            ex.tier.tracer.clear()
        result = ex.run(requests)
    result.peak_device_bytes = peak
    return hw, spec, result


def check_executable(plan: Plan, hw, spec) -> None:
    """Refuse, before weights are built, a plan the reference runtime cannot execute: a
    model it does not support (MLA, quantised dtypes, odd head_dim), a placement that does
    not fit the model or the policy, a stale estimate, or a policy over its hardware's memory."""
    from runtime.model import check_supported

    from hrm.estimate import estimate
    from hrm.options import ModelOptions

    check_supported(spec)
    problem = plan_problem(plan, hw, spec)
    if problem:
        raise HRMError(f"plan: {problem}")
    whole = ModelOptions(gpu_memory_utilization=1.0, cpu_memory_utilization=1.0)  # the capacity, no headroom
    result = estimate(hw, spec, plan.workload, plan.policy, options=whole, engine=resolve_plan_engine(plan))
    if not result.feasible:
        raise InfeasibleError(f"plan: the policy needs more memory than {hw.name} has ({result.binding_memory})")


def main(argv) -> int:
    args = build_parser().parse_args(argv)
    if args.trace is not None:
        check_output_path(args.trace, "--trace")
    check_input_file(args.checkpoint, "--checkpoint", allow_dir=True)
    plan = load_plan(args.plan)
    hw, spec, result = run_plan(plan, args)
    if args.trace:
        from runtime.trace import write_chrome_trace

        meta = {"plan": str(args.plan), "policy": plan.policy.short(), "model": spec.name, "hardware": hw.name,
                "device": result.device_kind}
        write_chrome_trace(args.trace, result.records, meta)
    rows = comparison_rows(plan.estimate, result)
    if args.json:
        print(json.dumps({"policy": plan.policy.model_dump(), "device": result.device_kind,
                          "measured": result.summary(), "predicted": plan.estimate.model_dump(),
                          "rows": rows}, indent=2))
        return 0
    note = None
    if result.device_kind == "emulated" and not hw.cpu_only:
        note = (f"device tier emulated on this CPU: the predictions are for {hw.name}'s GPU, "
                "so measured and predicted are not comparable here")
    render_comparison(rows, f"{spec.name} on {hw.name}: {plan.policy.short()} ({result.sequences} requests, "
                            f"device {result.device_kind})", note)
    if args.trace:
        print(f"wrote {args.trace}")
    return 0
