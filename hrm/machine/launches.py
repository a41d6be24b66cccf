"""Per-operator framework overhead (kernel launch + Python dispatch) of an eager engine.

An eager PyTorch engine's host thread issues every operator: Python argument parsing, the
ATen dispatcher, then the kernel launch (or the op itself, on CPU tensors). The GPU runs
the kernels asynchronously, so the host's issue time is a lane of its own beside the GPU's
(the layer takes at least the host's time to issue it: at small batches a token costs its
launches, not its FLOPs), and each host-blocking wait (a sync) empties the GPU's queue,
which then idles while the host issues the next kernel: one launch latency per sync.

Counts are data on the engine (:class:`Launches`, from each engine's source:
docs/engines/op_counts.md); the per-op costs are a profile's own measurement (``gpu.eager_op_s``,
``gpu.sync_bubble_s``, ``cpu.eager_op_s``: ``hrm profile`` measures them with torch on a GPU
host) or else the defaults below (:data:`EAGER_GPU_OP_S`, :data:`EAGER_CPU_OP_S`,
:data:`SYNC_BUBBLE_S`; a Triton launch from Python: :data:`TRITON_LAUNCH_S`), and
:class:`hrm.model.options.ModelOptions` overrides both. They are charged
on a GPU host to every engine that counts its ops, unless the profile's measured ``gpu.dispatch``
belongs to that engine (the reference runtime's own per-task costs, ``dispatch.owner``,
:func:`hrm.machine.rates.dispatch_owner`); on a CPU-only host the emulated tier's dispatch is measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
from pydantic import BaseModel, ConfigDict

from .. import bounds

#: host time to issue one eager CUDA op from Python (argument parsing, dispatcher, launch):
#: about 8 us per tiny op (x.add_(1) and x + 1 on a 16-element CUDA tensor, 2,000 in a row,
#: median of 5) on the lent H100 80GB VM (Xeon, 16 vCPU; torch 2.11+cu130), measured with
#: ../shared/gpu/launch_bench.py and reported in issue 32 ("a tiny eager op cost about 8 us");
#: its raw output is not committed. (The 4 us of pytorch/pytorch#82793 was a remark about
#: profiler overhead, not a launch measurement.) A profile's gpu.eager_op_s replaces it
EAGER_GPU_OP_S = 8e-6
#: host time of one eager op on small CPU tensors: ≈ 2 us per op without autograd, about half
#: of it Python argument parsing (pytorch/pytorch#41383, ngimel's comment of 2020-07-14)
EAGER_CPU_OP_S = 2e-6
#: the GPU's idle time one host sync costs beyond the host's issue of the ops (which the host
#: lane charges): the same run as EAGER_GPU_OP_S timed x.add_(1).sum().item() (two eager ops,
#: a scalar D2H copy and the host's wait) at about 36 us per iteration (issue 32: "an op plus
#: .item() about 36 us"), so the sync's round trip is 36 - 2 x 8 = 20 us, during which the
#: GPU's queue is empty. A profile's gpu.sync_bubble_s replaces it
SYNC_BUBBLE_S = 20e-6
#: host time of one Triton kernel launch from Python (JITFunction.run: binding and specialising
#: the arguments, the cached kernel's lookup, the launcher), beyond the eager ops around it.
#: Derived from ../shared/gpu/flexgen/gpu_check.py's timings on the lent H100 box (triton 3.6,
#: docs/validation/runs/flexgen-h100.gpu_check.json, host_ms of 20 or 5 back-to-back calls): one
#: call of FlexGen's fused_moe issues 2 Triton launches, 6 eager kernels and 9 torch.empty
#: (lynnliu030/FlexGen@a80c8d15 flexgen/fused_moe.py:166-325) plus the three vLLM ops, whose
#: harness stand-ins gpu_check times apart; at the decode sizes M = 64 and 256 the call's host
#: time less those three is 0.2758 and 0.2772 ms, so a launch is (0.2765 ms - 15 x 6.33 us,
#: the box's profiled eager op) / 2 = 91 us (M = 8, one 5-call sample, gives 0.4332 ms: left out)
TRITON_LAUNCH_S = 91e-6


class Launches(BaseModel):
    """Host-side operator calls of one layer as the engine's source issues them (counted in
    docs/engines/op_counts.md; views and in-place no-ops count 0). Per micro-batch unless
    named ``layer_*`` (once per layer per decode step: weight fetches):

    - ``gpu_ops``: GPU kernels of the attention block, router and fixed MoE part;
    - ``allocations``: ``torch.empty`` calls (an op's Python parsing and dispatch without its
      launch: charged as an eager op, an upper estimate);
    - ``triton_launches``: Triton kernels launched from Python (:data:`TRITON_LAUNCH_S` each);
    - ``custom_ops``: compiled-extension ops (vLLM's ``_C``/``_moe_C``), one CUDA kernel each,
      charged as eager ops unless ``custom_ops_host_s`` gives their measured host seconds per
      micro-batch (a harness's stand-ins: docs/engines/flexgen.md §10);
    - ``cpu_ops``: framework ops on CPU tensors (CPU attention), issued by the thread that
      computes it;
    - ``copies``: explicit copies issued by the host;
    - ``syncs``: host-blocking waits (``.tolist()``, ``.cpu()``, ``nonzero``, synchronize);
    - ``expert_*``: the same per touched expert (an expert loop; 0 for a fused kernel);
    - ``layer_copies`` / ``layer_syncs``: per layer per decode step, whatever the
      micro-batches (FlexGen's weight loads, ZeRO-3's fetches of the non-expert weights);
    - ``step_gpu_ops`` / ``step_copies`` / ``step_syncs``: per micro-batch per decode step
      outside the layers (embedding, logits and sampling, the token's round trip to the host).

    A sync blocks the host thread too: the host lane pays its round trip as the GPU does."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_ops: bounds.LAYER_OPS.type
    cpu_ops: bounds.LAYER_OPS.type = 0.0
    copies: bounds.LAYER_OPS.type = 0.0
    syncs: bounds.LAYER_OPS.type = 0.0
    expert_gpu_ops: bounds.LAYER_OPS.type = 0.0
    expert_copies: bounds.LAYER_OPS.type = 0.0
    expert_syncs: bounds.LAYER_OPS.type = 0.0
    layer_copies: bounds.LAYER_OPS.type = 0.0
    layer_syncs: bounds.LAYER_OPS.type = 0.0
    allocations: bounds.LAYER_OPS.type = 0.0
    triton_launches: bounds.LAYER_OPS.type = 0.0
    custom_ops: bounds.LAYER_OPS.type = 0.0
    custom_ops_host_s: Optional[bounds.DISPATCH_S.type] = None
    step_gpu_ops: bounds.LAYER_OPS.type = 0.0
    step_copies: bounds.LAYER_OPS.type = 0.0
    step_syncs: bounds.LAYER_OPS.type = 0.0
    source: str = ""


@dataclass(frozen=True)
class OpCosts:
    """Seconds per host operator call on a machine (:data:`EAGER_GPU_OP_S` and friends by
    default; ``ModelOptions`` overrides them)."""

    gpu_op_s: float = EAGER_GPU_OP_S
    cpu_op_s: float = EAGER_CPU_OP_S
    sync_bubble_s: float = SYNC_BUBBLE_S
    triton_launch_s: float = TRITON_LAUNCH_S


def custom_ops_s(launches: Launches, op: OpCosts) -> float:
    """Host seconds of one micro-batch's compiled-extension ops: measured where a harness
    replaced them (``custom_ops_host_s``), else one eager op each."""
    if launches.custom_ops_host_s is not None:
        return launches.custom_ops_host_s
    return op.gpu_op_s * launches.custom_ops


def host_issue_s(launches: Launches, op: OpCosts, distinct_experts):
    """Host thread's time for one micro-batch of a layer: issuing its GPU kernels, allocations,
    copies, Triton launches and extension ops, per touched expert too (``distinct_experts``, an
    array), and waiting out its syncs."""
    d = np.asarray(distinct_experts, dtype=float)
    calls = launches.gpu_ops + launches.allocations + launches.copies
    return (op.gpu_op_s * (calls + d * (launches.expert_gpu_ops + launches.expert_copies))
            + op.triton_launch_s * launches.triton_launches + custom_ops_s(launches, op)
            + sync_bubbles_s(launches, op, d))


def cpu_issue_s(launches: Launches, op: OpCosts) -> float:
    """Dispatch of the framework ops on CPU tensors of one micro-batch (the CPU-attention
    thread pays it beside its compute)."""
    return op.cpu_op_s * launches.cpu_ops


def sync_bubbles_s(launches: Launches, op: OpCosts, distinct_experts):
    """GPU idle time of one micro-batch's host syncs (one launch latency each)."""
    d = np.asarray(distinct_experts, dtype=float)
    return op.sync_bubble_s * (launches.syncs + d * launches.expert_syncs)


def layer_host_issue_s(launches: Launches, op: OpCosts) -> float:
    """Host time of a layer's once-per-step copies (weight fetches) and syncs."""
    return op.gpu_op_s * launches.layer_copies + layer_sync_bubbles_s(launches, op)


def step_host_s(launches: Launches, op: OpCosts) -> float:
    """Host time of one micro-batch's work outside the layers in a decode step: its eager
    ops and copies, and the round trip of its syncs."""
    return op.gpu_op_s * (launches.step_gpu_ops + launches.step_copies) + op.sync_bubble_s * launches.step_syncs


def layer_sync_bubbles_s(launches: Launches, op: OpCosts) -> float:
    """GPU idle time of a layer's once-per-step syncs."""
    return op.sync_bubble_s * launches.layer_syncs


def charged(launches: Optional[Launches], op: Optional[OpCosts]) -> bool:
    """Whether per-op costs apply: the engine counts its ops and the machine charges them
    (:attr:`hrm.machine.rates.Rates.op_costs` is set only on a GPU host without a measured dispatch)."""
    return launches is not None and op is not None
