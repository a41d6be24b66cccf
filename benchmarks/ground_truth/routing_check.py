"""Does llama.cpp route the ground-truth models' tokens as routing_traces.py's transformers run
does? llama.cpp's own `llama-eval-callback` (examples/eval-callback: the graph callback prints
every tensor, the first and last 3 rows) runs a prompt through each GGUF; its `ffn_moe_topk-L`
tensors are the experts each token chose in layer L. The same token ids (the tool prints them)
go through the saved f32 transformers model. For both: the share of a token's experts the next
token chose too, over the printed pairs (0-1, 1-2 and the last three tokens').

    .ground/venv/bin/python benchmarks/ground_truth/routing_check.py --llama-cpp $LC \
        --models .ground/models --out docs/validation/runs/routing-check.json
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

PROMPTS = ("the quick brown fox jumps over the lazy dog and then runs far away into the forest",
           "in the beginning there was only water and the wind moved over the face of the deep",
           "prices rose sharply in the third quarter as supply chains struggled to keep up with demand",
           "she opened the old wooden box and found a letter written by her grandmother long ago",
           "numbers such as seven eleven and thirteen are prime while nine and fifteen are not")
FORMATS = ("f16", "q4_k_m")
_ROW = re.compile(r"\[\s*([-\d.,\s]+)\]")


def llama_routing(tool: Path, gguf: Path, prompt: str) -> tuple[list[int], dict[int, list[list[int]]]]:
    """(token ids, {layer: the printed rows of ffn_moe_topk-layer}) from one llama-eval-callback run."""
    out = subprocess.run([str(tool), "-m", str(gguf), "-p", prompt, "-t", "2", "-c", "512"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300).stdout
    if "ffn_moe_topk" not in out:
        raise SystemExit(f"{gguf}: no ffn_moe_topk in llama-eval-callback's output")
    lines = out.splitlines()
    ids, layers = [], {}
    for i, line in enumerate(lines):
        if "number of input tokens" in line:
            n = int(line.rsplit("=", 1)[1])
            ids = [int(lines[i + 1 + j].split()[-1]) for j in range(n)]
        m = re.search(r"ffn_moe_topk-(\d+) = ", line)
        if m:
            rows = []
            for row_line in lines[i + 1:i + 12]:
                r = _ROW.search(row_line)
                if r and "," in r.group(1):
                    rows.append([int(float(v)) for v in r.group(1).split(",") if v.strip()])
            layers[int(m.group(1))] = rows
    return ids, layers


def pairs_overlap(rows: list[list[int]], k: int) -> list[float]:
    """The printed rows are tokens 0, 1, 2 and n-3, n-2, n-1: their four consecutive pairs."""
    first, last = rows[:3], rows[3:6]
    return [len(set(a) & set(b)) / k for block in (first, last) for a, b in zip(block, block[1:])]


def hf_routing(model_dir: Path, ids: list[int]) -> dict[int, list[list[int]]]:
    """The transformers model's chosen experts for ``ids``, per MoE layer, rows as llama.cpp's
    tool prints them (the first and last 3 tokens)."""
    import torch
    from transformers import AutoModelForCausalLM

    from routing_traces import hook_routers

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    picks: dict[int, list[list[int]]] = {}

    def record(layer, chosen):
        rows = chosen.tolist()
        picks[layer] = rows[:3] + rows[-3:]
    hook_routers(model, model.config.num_experts_per_tok, record)
    with torch.no_grad():
        model(torch.tensor([ids]))
    return picks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", required=True, type=Path)
    ap.add_argument("--models", required=True, type=Path, help="make_models.py's folder (GGUFs, hf/)")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    tool = args.llama_cpp / "build" / "bin" / "llama-eval-callback"
    result = {"source": "benchmarks/ground_truth/routing_check.py: llama-eval-callback (ggml-org/llama.cpp@0c1e5709) "
                        "and transformers on the same token ids; overlap = share of a token's experts the next "
                        "token chose too, over the printed consecutive pairs of every prompt and MoE layer",
              "prompts": list(PROMPTS), "models": {}}
    for name in ("gt-mixtral", "gt-qwen3moe", "gt-deepseekv2"):
        config = json.loads((args.models / "hf" / name / "config.json").read_text())
        k = config["num_experts_per_tok"]
        experts = config.get("num_local_experts") or config.get("num_experts") or config["n_routed_experts"]
        row: dict = {"independent": round(k / experts, 4)}
        for fmt in FORMATS:
            overlaps, hf_overlaps, agree = [], [], []
            for prompt in PROMPTS:
                ids, layers = llama_routing(tool, args.models / f"{name}-{fmt}.gguf", prompt)
                hf = hf_routing(args.models / "hf" / name, ids)
                for layer, rows in layers.items():
                    overlaps += pairs_overlap(rows, k)
                    hf_overlaps += pairs_overlap(hf[layer], k)
                    agree += [len(set(a) & set(b)) / k for a, b in zip(rows, hf[layer])]
            row[fmt] = {"next_token_overlap": round(sum(overlaps) / len(overlaps), 4), "pairs": len(overlaps),
                        "same_experts_as_hf_f32": round(sum(agree) / len(agree), 4)}
            row["hf_f32"] = {"next_token_overlap": round(sum(hf_overlaps) / len(hf_overlaps), 4),
                             "pairs": len(hf_overlaps)}
        result["models"][name] = row
        print(name, json.dumps(row))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
