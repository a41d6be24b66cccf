"""FlexGen's CPU attention (``--cpu-cache-compute``) as its source runs it in each (layer,
micro-batch) slot of a decode step (engine field ``cpu_attention: fp32-workspace``): not one
roofline pass over the fp16 cache but host-memory passes over a float32 copy of the whole KV
prefix, one of them into freshly allocated memory (docs/engines/flexgen.md §11).

Lines are of lynnliu030/FlexGen@a80c8d15 (branch moe). Per slot, for μ sequences, c cached
tokens, n_kv KV heads of d elements and g = n_head / n_kv query heads per KV head:

1. widen (flex_moe.py:404-412 ``load_cache`` path 1, ``general_copy`` →
   moe_pytorch_backend.py:892-896 ``dst.copy_(src)``): the c cached rows of K and of V, fp16
   (the home cache, :318-322) into the preallocated fp32 workspace (:233-252);
2. expand (moe_pytorch_backend.py:449-453): ``unsqueeze(2).expand(...).reshape(c + 1, μ·n_head, d)``
   of K and of V cannot be a view, so each is copied g-fold into a new tensor — fresh pages
   every slot;
3. the two ``torch.bmm`` (:513-529, after the permutes of :456 and :458, which are views:
   ``reshape`` to the shape ``permute`` already has) read the expanded K and V once each;
   each is a batch of μ·n_head (1 × d)·(d × (c + 1)) products: one row (M = 1) — the GQA
   expansion gives every query head its own copy instead of stacking the group's heads.

The passes run on torch's intra-op thread team; each is charged its read + written bytes at
the profile's all-thread host memcpy rate, counted as read + write (``cpu.memcpy_all_threads_gbps``
is bytes copied per second, each byte read once and written once). The products are charged
as a roofline of their FLOPs at the CPU's M = 1 matmul rate and their reads at that rate.

The expanded copies are new tensors of g·(c + 1)·μ·n_kv·d·4 bytes each, far above glibc's
largest mmap threshold for the micro-batches FlexGen runs (32 MiB: ``DEFAULT_MMAP_THRESHOLD_MAX``
= 4 MiB · sizeof(long), glibc malloc/malloc.c), so each is a new mapping whose every page the
kernel faults in and zero-fills on first touch and unmaps on ``free``. That page service is
charged at one thread's memcpy rate (``cpu.memcpy_one_thread_gbps``): assumption — the faults
of one process's threads contend on the process's and the page allocator's shared state and
the unmap runs on the freeing (main) thread, so they are taken not to scale with the team
(docs/engines/flexgen.md §11 says how it was checked and what measures it next). Smaller
copies, which glibc may recycle from its heap, are charged the same (an over-count there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...machine.rates import Rates
from ...model.spec import ModelSpec
from ..costs import OpCost
from .ops import op_time_s

#: bytes of one element of FlexGen's host KV cache: np.float16 (moe_pytorch_backend.py:321-322)
HOME_KV_BYTES = 2
#: bytes of one element of the attention workspace: np.float32 (moe_pytorch_backend.py:250-251)
WORKSPACE_BYTES = 4


@dataclass(frozen=True)
class WorkspacePasses:
    """The host-memory passes of one (layer, micro-batch) slot's CPU attention (arrays over
    μ and c): bytes each pass reads and writes, the products' FLOPs, and the bytes written
    into freshly mapped pages."""

    widen_read_bytes: np.ndarray
    widen_written_bytes: np.ndarray
    expand_read_bytes: np.ndarray
    expand_written_bytes: np.ndarray
    matmul_read_bytes: np.ndarray
    matmul_flops: np.ndarray
    fresh_bytes: np.ndarray

    @property
    def copy_traffic_bytes(self) -> np.ndarray:
        """Bytes the two copy passes read plus write."""
        return self.widen_read_bytes + self.widen_written_bytes + self.expand_read_bytes + self.expand_written_bytes

    @property
    def dram_bytes(self) -> np.ndarray:
        """Host DRAM traffic of the slot: both copies' reads and writes, the products' reads."""
        return self.copy_traffic_bytes + self.matmul_read_bytes


def workspace_passes(model: ModelSpec, micro_batch, context) -> WorkspacePasses:
    """The :class:`WorkspacePasses` of one slot for ``micro_batch`` sequences with ``context``
    tokens cached before the step (the step attends ``context`` + 1, its own token included:
    ``src_s`` of moe_pytorch_backend.py:414)."""
    mu = np.asarray(micro_batch, dtype=float)
    cached = np.asarray(context, dtype=float)
    group = model.num_heads // model.num_kv_heads
    row = mu * model.num_kv_heads * model.head_dim  # elements of one token's K (or V) over the micro-batch
    widened = 2 * cached * row                       # K and V, c rows each (flex_moe.py:407-412)
    attended = 2 * (cached + 1) * row                # K and V after the new token's row (:446-447)
    expanded = group * attended                      # the g-fold copies (:449-453)
    return WorkspacePasses(
        widen_read_bytes=widened * HOME_KV_BYTES, widen_written_bytes=widened * WORKSPACE_BYTES,
        expand_read_bytes=attended * WORKSPACE_BYTES, expand_written_bytes=expanded * WORKSPACE_BYTES,
        matmul_read_bytes=expanded * WORKSPACE_BYTES,
        matmul_flops=2 * expanded,                   # one multiply-add per expanded K and V element
        fresh_bytes=expanded * WORKSPACE_BYTES)


def workspace_attention_s(model: ModelSpec, rates: Rates, micro_batch, context):
    """Seconds of one slot's CPU attention (:func:`workspace_passes`): the copies at the
    all-thread memcpy rate (read + write), the products' roofline at the CPU's one-row matmul
    rate and that read rate, the fresh pages at one thread's memcpy rate. A profile without
    achieved rates (a datasheet): every pass at the CPU's memory bandwidth."""
    passes = workspace_passes(model, micro_batch, context)
    ach = rates.achieved
    stream = 2 * ach.memcpy_all_threads_bytes_s if ach is not None else rates.cpu_bandwidth_bytes_s
    faults = ach.memcpy_one_thread_bytes_s if ach is not None else rates.cpu_bandwidth_bytes_s
    products = OpCost("cpu_attention_products", flops=passes.matmul_flops, weight_bytes=0.0,
                      act_bytes=0.0, kv_bytes=passes.matmul_read_bytes)
    return (passes.copy_traffic_bytes / stream + op_time_s(products, rates.cpu_flops(1.0), stream)
            + passes.fresh_bytes / faults)
