"""benchmarks/ground_truth/graph_floor.py, the lent GPU's CUDA-graph micro (flexgen_gpu.sh): on a host
without CUDA it says so in its one JSON line and exits 0, so the device script records it and goes on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_without_cuda_it_skips_in_one_json_line():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ground_truth" / "graph_floor.py"), "10", "1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(line) == {"skipped"} or {"tiny_add_in_graph_us", "matvec_in_graph_gbps"} <= set(line)
    assert "micro graph" in (ROOT / "benchmarks" / "ground_truth" / "flexgen_gpu.sh").read_text()
