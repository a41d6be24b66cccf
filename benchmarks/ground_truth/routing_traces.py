"""Which experts the ground-truth models' routers choose for the tokens the llama.cpp benchmarks
feed them (random token ids: llama-bench.cpp test_gen `std::rand() % n_vocab`, batched-bench.cpp
`get_token_rand`), as routing traces (hrm-routing-trace/1) the runs files name per run.

The models have random weights (make_models.py): their hidden states share a common direction
after a few layers, so a few experts take most tokens — far from the uniform routing a trained
model's load balancing aims at. The step model reads the weights those experts hold, so it needs
the routing the runs really had. Recorded with transformers on each model's saved f32 weights
(the GGUF's router, ffn_gate_inp, is kept in F32 by the converter and llama-quantize; the
quantized experts move the hidden states a little, which this does not follow).

    .ground/venv/bin/python benchmarks/ground_truth/routing_traces.py --models .ground/models/hf \
        --out docs/validation/runs/gguf
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

#: the benchmark shape the trace follows: sequences of NPP random prompt tokens, then NTG decode
#: steps of one random token each (llama_cpu_runs.py's batched points)
SEQUENCES, NPP, NTG = 16, 32, 16
SEED = 0


def hook_routers(model, top_k: int, record) -> None:
    """Call ``record(layer, chosen)`` with each MoE layer's chosen experts ([tokens, top_k]
    array) on every forward of ``model`` (a transformers Mixtral, Qwen3-MoE or DeepSeek-V2)."""
    import torch

    def hook_for(layer: int):
        def hook(_module, _inputs, out):
            if isinstance(out, tuple):  # DeepSeek-V2's gate returns (top-k indices, weights)
                chosen = out[0]
            else:  # a linear router's logits
                chosen = torch.topk(out.reshape(-1, out.shape[-1]), top_k, dim=-1).indices
            record(layer, chosen.reshape(-1, top_k).numpy())
        return hook

    for i, block in enumerate(model.model.layers):
        moe = getattr(block, "mlp", None) or getattr(block, "block_sparse_moe", None)
        gate = getattr(moe, "gate", None)
        if gate is not None and hasattr(moe, "experts"):
            gate.register_forward_hook(hook_for(i))


def trace(model_dir: Path) -> dict:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    cfg = model.config
    experts = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None) or cfg.n_routed_experts
    top_k = cfg.num_experts_per_tok
    picks: dict[int, list] = {}
    overlaps: dict[int, list] = {}
    hook_routers(model, top_k, lambda layer, chosen: picks.setdefault(layer, []).append(chosen))
    with torch.no_grad():
        for _ in range(SEQUENCES):
            out = model(torch.randint(0, cfg.vocab_size, (1, NPP)), use_cache=True)
            past, before = out.past_key_values, {k: len(v) for k, v in picks.items()}
            for _ in range(NTG):
                past = model(torch.randint(0, cfg.vocab_size, (1, 1)), past_key_values=past,
                             use_cache=True).past_key_values
            for layer, rows in picks.items():  # the decode steps' overlap with the step before
                steps = [set(r[0]) for r in rows[before[layer]:]]
                overlaps.setdefault(layer, []).extend(len(a & b) / top_k for a, b in zip(steps, steps[1:]))
    layers = []
    for layer in sorted(picks):
        chosen = np.concatenate(picks[layer])
        counts = np.bincount(chosen.ravel(), minlength=experts)
        layers.append({"layer": layer, "tokens": int(chosen.shape[0]), "expert_counts": [int(c) for c in counts],
                       "decode_next_step_overlap": round(float(np.mean(overlaps[layer])), 4)})
    return {"format": "hrm-routing-trace/1", "top_k": int(top_k), "num_experts": int(experts),
            "source": f"routing_traces.py: {SEQUENCES} sequences of {NPP} random prompt tokens and {NTG} random "
                      f"decode tokens, seed {SEED}, transformers on {model_dir.name}'s saved f32 weights",
            "layers": layers}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", required=True, type=Path, help="the folder of make_models.py's saved HF models")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    for name in ("gt-mixtral", "gt-qwen3moe", "gt-deepseekv2"):
        data = trace(args.models / name)
        path = args.out / f"{name}.routing.json"
        path.write_text(json.dumps(data, indent=1) + "\n")
        top = [sorted(layer["expert_counts"], reverse=True)[:data["top_k"]] for layer in data["layers"]]
        share = sum(sum(t) for t in top) / sum(layer["tokens"] * data["top_k"] for layer in data["layers"])
        print(f"{path}: {len(data['layers'])} MoE layers, {share:.0%} of picks in each layer's top-{data['top_k']} "
              f"(uniform {data['top_k'] / data['num_experts']:.0%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
