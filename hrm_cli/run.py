"""``hrm run --plan plan.json``: execute a plan in the reference runtime, print measured vs
predicted side by side, optionally write a Chrome trace of every task and an expert
activation trace (``--routing-trace``, read by ``--routing trace:FILE``). ``--router-skew``
gives random weights a skewed router, so that expert-popularity skew exists to measure."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from pathlib import Path

from hrm import bounds
from hrm_cli.parser import ArgumentParser
from hrm_cli.common import check_input_file
from hrm.errors import HRMError, InfeasibleError
from hrm.plan import Plan, check_output_path, load_plan, plan_refusal, resolve_plan_engine

from runtime.report import comparison_rows, render_comparison


#: seconds between two looks of the progress reporter at the runtime's tasks (it reports at
#: most every hrm.progress.PROGRESS_EVERY_S; a look is a few attribute reads, not a scan)
PROGRESS_POLL_S = 0.5


#: --router-skew S: logit bias −S·ln(e+1); at S = 100 expert 1 is already e^−69 ≈ 1e−30 times as likely
#: as expert 0 a priori, so larger S means nothing more


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
    parser.add_argument("--router-skew", type=bounds.ROUTER_SKEW.flag("--router-skew"), default=0.0, metavar="S",
                        help="test option of random weights: expert e's router logit gets -S*ln(e+1) (a Zipf-like "
                             "prior, expert 0 hottest), so that expert-popularity skew exists (default 0: none)")
    parser.add_argument("--routing-trace", metavar="FILE",
                        help="write the expert activation trace of the timed run (JSON, hrm-routing-trace/1: "
                             "per-layer counts, every router call, per-request matrix); read by --routing trace:FILE")
    parser.add_argument("--no-warmup", action="store_true", help="skip the warm-up (one full untimed run) before the timed run")
    parser.add_argument("--json", action="store_true", help="print measured and predicted numbers as JSON")
    return parser


def run_plan(plan: Plan, args):
    """Resolve hardware/model (hash-checked), build weights and requests, run. Returns
    (hardware, model, result, routing trace or None)."""
    import torch

    from runtime.executor import PlanExecutor
    from runtime.model import build_weights
    from runtime.requests import synthetic_requests
    from runtime.resolve import plan_hardware, plan_model
    from runtime.routing_trace import RoutingRecorder

    hw = plan_hardware(plan, args.hw)
    spec = plan_model(plan, args.model)
    check_executable(plan, hw, spec)
    check_routing_flags(spec, args)
    torch.manual_seed(args.seed)
    weights = build_weights(spec, args.checkpoint, args.seed, router_skew=args.router_skew)
    count = args.requests or plan.policy.batch_size
    requests = synthetic_requests(plan.workload, count, spec.vocab_size, args.seed)
    # memory tracking costs time on every task: the peak comes from its own run, which also
    # warms the process (allocator, kernels); the timed run is untracked
    runs = 2 if args.no_warmup else 3
    with PlanExecutor(spec, weights, plan.policy, plan.workload, placement=plan.placement, device=args.device,
                      track_memory=True, keep_logits=False, lanes=args.lanes) as ex:
        with run_progress(f"hrm run 1/{runs} (device memory)", ex):
            peak = ex.run(requests).peak_device_bytes
    with PlanExecutor(spec, weights, plan.policy, plan.workload, placement=plan.placement, device=args.device,
                      track_memory=False, keep_logits=False, lanes=args.lanes) as ex:
        if not args.no_warmup:
            with run_progress(f"hrm run 2/{runs} (warm-up)", ex):
                ex.run(requests)
            ex.tier.tracer.clear()
        recorder = RoutingRecorder(spec.num_experts, spec.top_k) if args.routing_trace else None
        with run_progress(f"hrm run {runs}/{runs} (timed)", ex):
            result = ex.run(requests, recorder)  # only the timed run is recorded
    result.peak_device_bytes = peak
    routing = recorder.trace(spec.name, args.router_skew) if recorder else None
    return hw, spec, result, routing


class TaskCounter:
    """Tasks done of the phase an executor is running (prefill or decode of one round): a
    cursor over its task list in launch order, which moves on while the next task is done,
    so each look costs what finished since the last one."""

    def __init__(self, executor):
        self.executor, self.tasks, self.cursor = executor, None, 0

    def __call__(self) -> tuple[int, int, str]:
        """(done, queued so far, phase name) of the current phase."""
        tasks = getattr(self.executor, "submitted", None) or []
        if tasks is not self.tasks:  # a new phase
            self.tasks, self.cursor = tasks, 0
        count = len(tasks)
        while self.cursor < count and tasks[self.cursor].done.is_set():
            self.cursor += 1
        phase = tasks[0].args.get("phase", "") if count else ""
        return self.cursor, count, phase


@contextmanager
def run_progress(stage: str, executor):
    """Progress of one run of the runtime on stderr (:mod:`hrm.progress`: after a second, on
    a terminal or with HRM_PROGRESS=1): the tasks done in the current phase and round."""
    from hrm.progress import Progress

    with Progress(stage) as report:
        if not report.enabled:
            yield
            return
        stop, count = threading.Event(), TaskCounter(executor)

        def poll() -> None:
            while not stop.wait(PROGRESS_POLL_S):
                done, queued, phase = count()
                round_index = getattr(executor, "round", 0) + 1
                report(None, f"round {round_index}, {phase or 'starting'}: {done:,}/{queued:,} tasks")

        thread = threading.Thread(target=poll, name="hrm-run-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def check_routing_flags(spec, args) -> None:
    """--router-skew and --routing-trace need a model with a router (more than one expert)."""
    if spec.num_experts > 1:
        return
    for flag, used in (("--router-skew", args.router_skew > 0), ("--routing-trace", args.routing_trace)):
        if used:
            raise HRMError(f"{flag}: {spec.name} has one expert per layer and no router")


def check_executable(plan: Plan, hw, spec) -> None:
    """Refuse, before weights are built, a plan the reference runtime cannot execute: a
    model it does not support (MLA, quantised dtypes, odd head_dim), a placement that does
    not fit the model or the policy, a stale estimate, or a policy over its hardware's memory."""
    from runtime.model import check_supported

    from hrm.estimate import estimate
    from hrm.model.options import ModelOptions

    check_supported(spec)
    refusal = plan_refusal(plan, hw, spec)
    if refusal:
        raise HRMError(f"plan: {refusal}")
    whole = ModelOptions(gpu_memory_utilization=1.0, cpu_memory_utilization=1.0)  # the capacity, no headroom
    result = estimate(hw, spec, plan.workload, plan.policy, options=whole, engine=resolve_plan_engine(plan))
    if not result.feasible:
        raise InfeasibleError(f"plan: the policy needs more memory than {hw.name} has ({result.binding_memory})")
    if result.disk_bytes > 0:  # docs/model.md §4.9: the runtime has no disk tier
        raise InfeasibleError(f"plan: the policy keeps {result.disk_bytes / 2**30:.2f} GiB of weights on disk beyond "
                              f"{hw.name}'s host memory; the reference runtime holds every offloaded weight in host "
                              f"memory (no disk tier)")


def main(argv) -> int:
    args = build_parser().parse_args(argv)
    if args.trace is not None:
        check_output_path(args.trace, "--trace")
    if args.routing_trace is not None:
        check_output_path(args.routing_trace, "--routing-trace")
    if args.trace and args.routing_trace and Path(args.trace).resolve() == Path(args.routing_trace).resolve():
        raise HRMError(f"--routing-trace {args.routing_trace}: the same file as --trace")
    from runtime.model import check_skew_source

    check_skew_source(args.checkpoint, args.router_skew)  # before the plan is read and weights built
    check_input_file(args.checkpoint, "--checkpoint", allow_dir=True)
    plan = load_plan(args.plan)
    hw, spec, result, routing = run_plan(plan, args)
    if routing is not None:
        from runtime.routing_trace import write_routing_trace

        write_routing_trace(args.routing_trace, routing)
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
    for path in (args.trace, args.routing_trace):
        if path:
            print(f"wrote {path}")
    return 0
