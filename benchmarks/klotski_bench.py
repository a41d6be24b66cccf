"""Klotski's pipeline step by step (paper §4) and its own choice of n (§7, inequalities
4-7), from the cost model on the expert-level list scheduler (:mod:`hrm.pipelines.expert_level_tasks`); then the
engine ``klotski`` as the search plans it: its best policy beside the one with Klotski's own
n at the same μ and placement.

Run: python benchmarks/klotski_bench.py [--hw rtx3090] [--model mixtral] [--mu 16] [--context 512]
"""

from __future__ import annotations

import argparse

from hrm.machine.hardware import load_hardware
from hrm.pipelines.expert_level_tasks import klotski_batches, klotski_layer, pipeline_steps
from hrm.model.spec import load_model
from hrm.model.options import DEFAULT_OPTIONS
from hrm.machine.rates import rates_from_profile
from hrm.model.routing import parse_routing


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hw", default="rtx3090")
    parser.add_argument("--model", default="mixtral")
    parser.add_argument("--mu", type=int, default=16, help="sequences per batch (the paper's example: 16)")
    parser.add_argument("--context", type=float, default=512.0)
    parser.add_argument("--routings", default="uniform,zipf:1.2")
    parser.add_argument("--engine-hw", default="rtx3090,a100-80g", help="profiles of the engine table")
    args = parser.parse_args()
    model, hw = load_model(args.model), load_hardware(args.hw)
    rates = rates_from_profile(hw, DEFAULT_OPTIONS.for_model(model))
    for text in args.routings.split(","):
        routing = parse_routing(text, model.num_experts, model.top_k)
        n = klotski_batches(model, rates, args.mu, args.context, routing)
        one = klotski_layer(model, rates, args.mu, args.context, 1, routing)
        print(f"\n### {model.name} on {hw.name}, mu={args.mu}, context {args.context:g}, routing {text}\n")
        print(f"per batch: attention {one.attention_s * 1e3:.3f} ms, gate {one.gate_s * 1e3:.4f} ms; loads: expert "
              f"{one.expert_load_s * 1e3:.2f} ms, gate {one.gate_load_s * 1e3:.3f} ms, attention weights "
              f"{one.attention_load_s * 1e3:.2f} ms. Klotski's n (inequalities 4-7): {n}\n")
        if n is None:
            continue
        print("| step | n | layer period ms | lane bound ms | bubble ms | decode tok/s | vs simple |")
        print("|---|---|---|---|---|---|---|")
        steps = pipeline_steps(model, rates, args.mu, args.context, n, routing)
        for s in steps:
            sched = s.schedule
            print(f"| {s.step.name} | {s.num_batches} | {sched.period_s * 1e3:,.2f} | {sched.lane_bound_s * 1e3:,.2f} | "
                  f"{sched.bubble_s * 1e3:,.2f} | {s.decode_tok_s:,.2f} | {s.decode_tok_s / steps[0].decode_tok_s:,.1f}x |")
    engine_table(args)


def engine_table(args) -> None:
    """The engine's best policy (generation objective, mtbench) against Klotski's own n at the
    same μ, r_w and r_c (when that n fits memory)."""
    import time

    from hrm.engines.engine import load_engine
    from hrm.errors import HRMError
    from hrm.estimate import estimate
    from hrm.pipelines.expert_level import klotski_own_batches
    from hrm.cost.memory import memory_limits
    from hrm.workload import make_workload
    from solver.search import search

    engine, workload = load_engine("klotski"), make_workload("mtbench")
    print("\n### engine klotski: the search's best policy and Klotski's own n (mtbench, generation objective)\n")
    print("| hardware | model | CPU GiB | routing | best policy | gen tok/s | TPOT s | Klotski's n | gen tok/s at its n "
          "| solve s | scheduled / candidates |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for hw_name in args.engine_hw.split(","):
        for model_name, cpu in (("mixtral-8x7b", None), ("mixtral-8x22b", 512.0)):
            for text in args.routings.split(","):
                hw, model = load_hardware(hw_name), load_model(model_name)
                model = model.model_copy(update={"routing": parse_routing(text, model.num_experts, model.top_k)})
                options = DEFAULT_OPTIONS.for_model(model)
                limits = memory_limits(hw, options, cpu_mem_gib=cpu)
                start = time.perf_counter()
                try:
                    result = search(hw, model, workload, engine=engine, limits=limits)
                except HRMError as exc:
                    print(f"| {hw_name} | {model_name} | {cpu or '-'} | {text} | {exc} | - | - | - | - | - | - |")
                    continue
                seconds = time.perf_counter() - start
                best, policy = result.best.estimate, result.best.policy
                own = klotski_own_batches(model, rates_from_profile(hw, options), workload, policy, engine)
                at_own = "-"
                if own is not None:
                    theirs = policy.model_copy(update={"num_micro_batches": own, "batch_size": own * policy.micro_batch_size})
                    est = estimate(hw, model, workload, theirs, engine=engine, limits=limits)
                    at_own = f"{est.generation_throughput_tok_s:,.1f}" + ("" if est.feasible else " (does not fit)")
                print(f"| {hw_name} | {model_name} | {cpu or '-'} | {text} | {policy.short()} | "
                      f"{best.generation_throughput_tok_s:,.1f} | {best.per_token_latency_s:,.2f} | {own} | {at_own} | "
                      f"{seconds:.2f} | {result.stats.candidates_evaluated} / {result.stats.modes_total:,} |")


if __name__ == "__main__":
    main()
