"""A kernel's floor inside a replayed CUDA graph, on a lent GPU (the mechanism llama.cpp's batch-1
decode on a GPU rests on: it replays each GPU split as a CUDA graph, ggml-cuda.cu:4422-4492, so a
token costs its kernels' own times plus whatever each kernel costs beyond its bytes).

Three chains of N kernels, each captured once and replayed (torch.cuda.CUDAGraph), timed with CUDA
events: a tiny in-place add (the per-kernel floor), a fp16 matrix-vector product over a weight of
W MiB (a decode matmul: bytes / time is its achieved rate), and the same product run alone eagerly
(its time without the graph's back-to-back issue). Prints one JSON line; on a host without CUDA it
prints {"skipped": ...} and exits 0 (benchmarks/ground_truth/flexgen_gpu.sh runs it as a micro).

    python benchmarks/ground_truth/graph_floor.py [N] [W_MIB]
"""

from __future__ import annotations

import json
import statistics
import sys


def replay_us(torch, fn, n: int, reps: int = 5) -> float:
    """Microseconds per kernel of ``n`` calls of ``fn`` captured in one graph, median of ``reps`` replays."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()  # warm-up outside the capture (cuBLAS workspaces, lazy init)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            fn()
    times = []
    for _ in range(reps + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / n)
    return statistics.median(times[1:])


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 1000
    w_mib = float(argv[1]) if len(argv) > 1 else 32.0
    try:
        import torch
    except ImportError:
        print(json.dumps({"skipped": "no torch"}))
        return 0
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device"}))
        return 0
    x = torch.zeros(16, device="cuda")
    k = 4096
    rows = int(w_mib * 2**20 / (2 * k))
    w = torch.randn(rows, k, device="cuda", dtype=torch.float16)
    v = torch.randn(k, 1, device="cuda", dtype=torch.float16)
    out = torch.empty(rows, 1, device="cuda", dtype=torch.float16)
    tiny = replay_us(torch, lambda: x.add_(1), n)
    matvec = replay_us(torch, lambda: torch.matmul(w, v, out=out), max(50, n // 20))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    alone = []
    for _ in range(20):
        torch.cuda.synchronize()
        start.record()
        torch.matmul(w, v, out=out)
        end.record()
        torch.cuda.synchronize()
        alone.append(start.elapsed_time(end) * 1000)
    weight_bytes = rows * k * 2
    print(json.dumps({
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "kernels": n,
        "tiny_add_in_graph_us": round(tiny, 3),
        "matvec_weight_mib": w_mib, "matvec_in_graph_us": round(matvec, 3),
        "matvec_in_graph_gbps": round(weight_bytes / (matvec * 1e-6) / 1e9, 1),
        "matvec_alone_us": round(statistics.median(alone[5:]), 3),
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
