"""The reference runtime's CUDA path (device tensors, pinned host copies, a CUDA stream per
lane): the offloaded run equals the plain forward pass computed on the CPU, under the same
policies as tests/test_runtime.py. Skipped where no CUDA GPU is visible (CI); run on a lent GPU
(docs/validation/gpu.md records where and when)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible: the runtime's CUDA path is checked on a lent GPU "
                "(docs/validation/gpu.md)", allow_module_level=True)

from runtime.requests import synthetic_requests  # noqa: E402
from hrm.policy import parse_policy  # noqa: E402

from test_runtime import CASES, check_offloaded_run, fp32, model_and_reference  # noqa: E402

# A GPU reduction sums in another order than the CPU's: fp32 logits agree to ~1e-5 relative, not
# bit for bit (cuBLAS without TF32, torch.backends.cuda.matmul.allow_tf32 is False by default).
CUDA_TOLERANCE = 1e-3


@pytest.mark.parametrize("name,policy_text,workload,count", CASES,
                         ids=[f"{c[0]}:{c[1]}:{'pad' if c[2].padding else 'var'}" for c in CASES])
def test_cuda_offloaded_run_matches_cpu_forward(name, policy_text, workload, count):
    assert not torch.backends.cuda.matmul.allow_tf32
    _, _, result = check_offloaded_run(name, policy_text, workload, count, "cuda", CUDA_TOLERANCE)
    assert result.decode_steps == workload.gen_len - 1
    assert result.peak_device_bytes > 0
    assert {r.lane for r in result.records} >= {"gpu"}


def test_cuda_peak_is_the_plans_own_and_does_not_grow_over_executors():
    """Successive executors of one plan report the same peak, and close leaves no device memory
    behind beyond the first's process-wide set-up (the lane streams' cuBLAS workspaces)."""
    import gc

    from runtime.validate import tracked_peak_bytes
    spec = fp32("tiny-mixtral")
    policy = parse_policy("N=8,mu=4,attn=cpu,rw=0.5")
    weights, _, _ = model_and_reference(spec)
    workload = CASES[0][2]
    requests = synthetic_requests(workload, 8, spec.vocab_size, seed=7)
    peaks, live = [], []
    for _ in range(4):
        peaks.append(tracked_peak_bytes(spec, weights, workload, policy, requests, device="cuda"))
        gc.collect()
        live.append(torch.cuda.memory_allocated())
    assert max(peaks) - min(peaks) <= 0.01 * max(peaks), peaks
    assert live[3] == live[1], live
