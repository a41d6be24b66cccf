"""Transfer paths (paper §4.1: D1 QKV GPU→CPU, D2 hidden CPU→GPU, D3 weight pages CPU→GPU,
D4 KV cache CPU→GPU) as seconds per resource: the CPU↔GPU link's rate for pinned or
pageable copies, host DRAM's bandwidth and the DRAM bytes a copy costs, the engine's weight
path (pinned, driver-staged, staged by a copy team), the KV cache's store and load paths,
and tensor parallelism's all-reduces.
"""

from __future__ import annotations

import numpy as np

from ...engines.engine import IDEAL, Engine
from ...machine.achieved import COPY_DRAM_BYTES_PER_BYTE, NUMA_REMOTE_FRACTION, in_turn_rate
from ...machine.rates import Rates
from ...model.spec import ModelSpec
from ...units import dtype_bytes


def host_side_modelled(rates: Rates) -> bool:
    """Whether the host side of transfers is modelled: a real CPU↔GPU link with achieved
    rates (on a CPU-only host a "transfer" is the emulated tier's measured copy)."""
    return rates.achieved is not None and not rates.shared_unit


def dram_bytes_per_byte(pageable: bool) -> float:
    """Host DRAM bytes per byte a DMA moves: the DMA's own read or write, plus, for a
    pageable buffer, the staging copy's read + write + write-allocate."""
    return 1.0 + (COPY_DRAM_BYTES_PER_BYTE if pageable else 0.0)


def link_bytes_s(rates: Rates, engine: Engine, direction: str, pageable: bool = False) -> float:
    """Aggregate CPU↔GPU rate of all GPUs (``direction`` h2d or d2h) for pinned or pageable
    copies. Ranks that share a PCIe switch share its uplink when the engine's ranks share
    the host (``tensor_parallel.host_shared``); pinned buffers on the far socket of a
    NUMA host (an engine that is not NUMA-aware: a buffer lands on each node alike) copy
    at :data:`hrm.machine.achieved.NUMA_REMOTE_FRACTION` of the local rate."""
    pinned = rates.h2d_bytes_s if direction == "h2d" else rates.d2h_bytes_s
    if not host_side_modelled(rates):
        return pinned
    ach = rates.achieved
    per_gpu = pinned / rates.gpu_count
    if pageable:
        per_gpu = ach.h2d_pageable_bytes_s if direction == "h2d" else ach.d2h_pageable_bytes_s
    links = ach.host_uplinks(rates.gpu_count) if engine.tensor_parallel.host_shared else rates.gpu_count
    rate = per_gpu * links
    if not engine.numa_aware and ach.numa_nodes > 1 and not pageable:
        local = 1.0 / ach.numa_nodes
        rate = 1.0 / (local / rate + (1.0 - local) / (rate * NUMA_REMOTE_FRACTION))
    return rate


def dram_bytes_s(rates: Rates) -> float:
    """Host DRAM bandwidth of the host-DRAM lane (STREAM counting: every byte read or written
    counts): the profile's measured all-core DRAM traffic (``cpu.dram_gbps``), else its DRAM
    rate (:mod:`hrm.machine.achieved`); on a CPU-only host the tier's own bandwidth."""
    ach = rates.achieved
    if ach is None or rates.shared_unit or ach.dram_bytes_s <= 0:
        return rates.cpu_bandwidth_bytes_s
    return ach.dram_bytes_s


def relay_bytes_s(rates: Rates, engine: Engine, threads: int) -> float:
    """Rate of a pinned relay that copies, then DMAs, one after the other: each byte costs a
    ``threads``-thread host memcpy and a pinned transfer, 1 / (1/memcpy + 1/pinned) (the
    driver's own staging, :func:`hrm.machine.achieved.pageable_copy_gbps`, is the same rule
    with one thread)."""
    return in_turn_rate(rates.achieved.memcpy_bytes_s(threads), link_bytes_s(rates, engine, "h2d"))


def weight_transfer_s(rates: Rates, engine: Engine, path: str, weight_bytes) -> dict[str, np.ndarray | float]:
    """Seconds per resource to bring ``weight_bytes`` of offloaded weights to the GPU:

    - ``pinned``: DMA at the pinned rate; DRAM reads each byte once;
    - ``pageable-staged``: a CPU team of ``copy_threads`` threads copies pageable → pinned
      (the ``copy`` lane at the team's memcpy rate; the cores it holds, its share of the
      ``cpu`` lane), then DMA at the pinned rate; DRAM: read + write + write-allocate of the
      copy, then the DMA read;
    - ``pageable-relay``: a team of ``copy_threads`` copies a tensor pageable → pinned on the
      issuing thread, then it is DMA'd, and the next tensor's copy waits for that DMA (the
      engine's per-slot sync): copy and DMA in turn, at :func:`relay_bytes_s` on the link lane;
      the team's cores on the ``cpu`` lane, DRAM as for the staged path;
    - ``pageable-driver``: the driver stages the copy (pageable rate), on the issuing
      thread's core; DRAM as for the staged path."""
    ach = rates.achieved
    staged = path != "pinned" and host_side_modelled(rates)
    out: dict = {"h2d": weight_bytes / link_bytes_s(rates, engine, "h2d", pageable=path == "pageable-driver")}
    if staged and path == "pageable-relay":
        threads = min(engine.copy_threads or ach.cores, ach.cores)
        out["h2d"] = weight_bytes / relay_bytes_s(rates, engine, threads)
        out["cpu"] = weight_bytes / ach.memcpy_bytes_s(threads) * threads / ach.cores
    elif staged and path == "pageable-staged":
        threads = min(engine.copy_threads or ach.cores, ach.cores)
        out["copy"] = weight_bytes / ach.memcpy_bytes_s(threads)
        out["cpu"] = out["copy"] * threads / ach.cores
    elif staged:
        out["cpu"] = out["h2d"] / ach.cores
    out["dram"] = weight_bytes * dram_bytes_per_byte(staged) / dram_bytes_s(rates)
    return out


def kv_cache_s(rates: Rates, engine: Engine, path: str, kv_bytes) -> dict[str, np.ndarray | float]:
    """Seconds per resource to write ``kv_bytes`` of new KV cache to CPU memory: pinned
    (async DMA) or pageable (driver-staged: the pageable rate, 3 more DRAM bytes per byte)."""
    pageable = path == "pageable" and host_side_modelled(rates)
    return {"d2h": kv_bytes / link_bytes_s(rates, engine, "d2h", pageable=pageable),
            "dram": kv_bytes * dram_bytes_per_byte(pageable) / dram_bytes_s(rates)}


def kv_load_s(rates: Rates, engine: Engine, path: str, kv_bytes) -> dict[str, np.ndarray | float]:
    """Seconds per resource to bring ``kv_bytes`` of host-resident KV cache to the GPU: the
    cache's memory sets the path (pinned: DMA; pageable: driver-staged at the pageable rate,
    3 more DRAM bytes per byte)."""
    pageable = path == "pageable" and host_side_modelled(rates)
    return {"h2d": kv_bytes / link_bytes_s(rates, engine, "h2d", pageable=pageable),
            "dram": kv_bytes * dram_bytes_per_byte(pageable) / dram_bytes_s(rates)}


def allreduce_s(model: ModelSpec, rates: Rates, engine: Engine, tokens) -> dict[str, np.ndarray | float]:
    """Tensor parallelism: two ring all-reduces of the hidden states per layer (after the
    attention output projection and after the FFN), 2(p−1)/p of the bytes each per GPU, on
    the compute stream (the ``gpu`` lane waits for them). Over the GPU-to-GPU link
    (``gpu-link``; NCCL with peer-to-peer); NCCL without P2P stages through host memory:
    every GPU writes its share to the host and reads the others' back over its own link,
    so the traffic also loads the h2d/d2h lanes and host DRAM (write + read). The paper
    leaves this traffic out. Under a layer split (``gpu_split: layers``) there is no
    all-reduce: the hidden states hop to the next GPU instead (:func:`layer_hop_s`)."""
    if rates.layer_split_gpus > 1:
        return layer_hop_s(model, rates, tokens)
    p = rates.gpu_count
    if p <= 1:
        return {}
    payload = np.asarray(tokens, dtype=float) * model.hidden_size * dtype_bytes(model.activation_dtype)
    per_gpu = 2 * 2 * (p - 1) / p * payload
    ach = rates.achieved
    if engine.tensor_parallel.allreduce == "gpu-link" or ach is None or ach.p2p:
        return {"gpu": per_gpu / rates.g2g_bytes_s} if rates.g2g_bytes_s else {}
    d2h, h2d = link_bytes_s(rates, engine, "d2h"), link_bytes_s(rates, engine, "h2d")
    return {"gpu": per_gpu * p / d2h + per_gpu * p / h2d, "d2h": per_gpu * p / d2h, "h2d": per_gpu * p / h2d,
            "dram": 2 * per_gpu * p / dram_bytes_s(rates)}


def layer_hop_s(model: ModelSpec, rates: Rates, tokens) -> dict[str, np.ndarray | float]:
    """A layer split over G GPUs: a pass hands its hidden states from each GPU's last layer
    to the next GPU's first, G − 1 copies of tokens × hidden × activation bytes over the
    GPU-to-GPU link (llama.cpp: the next split's input is copied before it runs,
    ggml/src/ggml-backend.cpp:1686-1720, peer to peer, ggml-cuda/ggml-cuda.cu:2482-2520 at
    ggml-org/llama.cpp@0c1e5709). The GPUs wait for it; spread over the model's layers, so that
    a layer carries (G − 1) / L of them."""
    payload = np.asarray(tokens, dtype=float) * model.hidden_size * dtype_bytes(model.activation_dtype)
    hops_per_layer = (rates.layer_split_gpus - 1) / model.num_layers
    return {"gpu": hops_per_layer * payload / rates.g2g_bytes_s} if rates.g2g_bytes_s else {}


def allreduce_time_s(model: ModelSpec, rates: Rates, tokens, engine: Engine = IDEAL):
    """The compute stream's wait for the all-reduces of one layer (:func:`allreduce_s`)."""
    return allreduce_s(model, rates, engine, tokens).get("gpu", 0.0)
