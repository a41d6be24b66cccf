"""Every engine at batch 1, 16, 64 and 256 (``engines_by_batch.yaml``, run as an ``hrm sweep``):
the best generation throughput at that batch, the per-token latency (TPOT) and TTFT of that
policy, and the policy. Prints one table per (hardware, model).

Run: python benchmarks/engines_by_batch.py [--grid benchmarks/engines_by_batch.yaml] [--markdown]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from solver.grid import grid_cells, read_grid
from solver.sweep import run_sweep

HERE = Path(__file__).resolve().parent


def policy_text(row) -> str:
    if row["status"] != "ok":
        return row["status"]
    return (f"mu={int(row['micro_batch_size'])} n={int(row['num_micro_batches'])} "
            f"attn={'gpu' if row['attn_on_gpu'] else 'cpu'} ffn={'gpu' if row['ffn_on_gpu'] else 'cpu'} "
            f"rw={row['weights_gpu_ratio']:.3f} rc={row['kv_gpu_ratio']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--grid", default=str(HERE / "engines_by_batch.yaml"))
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    args = parser.parse_args()
    table = run_sweep(grid_cells(read_grid(args.grid), args.grid))
    table["label"] = [e if e != "ideal" or s == "cgopipe" else f"ideal/{s}" for e, s in zip(table["engine"], table["schedule"])]
    for (hw, model, cpu_mem, routing), part in table.groupby(["hardware", "model", "cpu_mem_gib", "routing"], sort=False):
        print(f"\n### {model} on {hw}, {cpu_mem:g} GiB CPU memory, routing {routing} (mtbench, gen 128)\n")
        print("| engine | N | gen tok/s | TPOT ms | TTFT s | policy |")
        print("|---|---|---|---|---|---|")
        for _, row in part.iterrows():
            ok = row["status"] == "ok"
            print(f"| {row['label']} | {int(row['pinned_batch_size'])} | "
                  f"{row['generation_throughput_tok_s']:,.2f} | " if ok else f"| {row['label']} | {int(row['pinned_batch_size'])} | - | ",
                  end="")
            if ok:
                print(f"{row['per_token_latency_s'] * 1e3:,.1f} | {row['prefill_latency_s']:,.2f} | {policy_text(row)} |")
            else:
                print(f"- | - | {row['status']}: {row['reason'][:80]} |")


if __name__ == "__main__":
    main()
