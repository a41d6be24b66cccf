"""Klotski's pipeline step by step (paper §4) and its own choice of n (§6.2, inequalities
4-7), from the cost model on the expert-level list scheduler (:mod:`hrm.klotski`).

Run: python benchmarks/klotski_bench.py [--hw rtx3090] [--model mixtral] [--mu 16] [--context 512]
"""

from __future__ import annotations

import argparse

from hrm.hardware import load_hardware
from hrm.klotski import klotski_batches, klotski_layer, pipeline_steps
from hrm.model import load_model
from hrm.options import DEFAULT_OPTIONS
from hrm.rates import rates_from_profile
from hrm.routing import parse_routing


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hw", default="rtx3090")
    parser.add_argument("--model", default="mixtral")
    parser.add_argument("--mu", type=int, default=16, help="sequences per batch (the paper's example: 16)")
    parser.add_argument("--context", type=float, default=512.0)
    parser.add_argument("--routings", default="uniform,zipf:1.2")
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


if __name__ == "__main__":
    main()
