"""llama.cpp on its CPU backend (docs/model.md §4.10): the time of one graph step, and of the
prefill and decode of a llama-bench or llama-batched-bench run, from the model's own weight
tensors and the host's measured ggml kernels.

A step of ``n`` tokens runs the model's graph once on ``threads`` threads, one op after another,
each op split over the threads with a barrier after it (ggml/src/ggml-cpu/ggml-cpu.c
ggml_graph_compute_thread). Its time is the sum of

- every weight matrix's matmul: elements × the kernel's measured seconds per element for the
  tensor's ggml type, op and thread count at its rows (:class:`hrm.machine.hardware.GgmlKernel`):
  ``n`` rows for a dense weight (MUL_MAT), and for a layer's expert tensor (MUL_MAT_ID) the
  expected distinct experts touched × their elements at ``n·k / touched`` rows each
  (:func:`hrm.cost.costs.expected_distinct_experts`); each at the rate the probe measured for weights
  whose reuse distance is the tensor's own (:func:`reuse_distances_mib`: the bytes the steps read
  between two reads of it; the probe cycles a pool, so every byte's reuse distance is the pool);
- the output head, and the last layer's FFN, at one row per token whose logits are asked for
  (the graph keeps only those rows after the last attention);
- flash attention per sequence: query rows × heads × cached tokens × (d_k + d_v) at the probe's
  FLASH_ATTN_EXT rate (one row at a time, or the tiled kernel from 64 rows of one sequence);
- one node barrier (``GgmlCpu.node_s``) per graph node;
- the elementwise nodes between the matmuls (norms, adds, rope, K/V store, activations) at the
  probe's per-element rates, beyond their node cost (:mod:`hrm.cost.ggml_elementwise`).

Nothing here is fitted to a run: every rate is the probe's (``hrm profile --llama-cpp``), every
size is the GGUF's own tensor list (:mod:`hrm.model.gguf`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .costs import uniform_distinct_experts
from .ggml_cells import FA_TILE_QUERIES, SharedCells, causal_tiled_pairs
from .ggml_elementwise import elementwise_s
from ..errors import HRMError
from ..model.gguf import MatmulGroup, TensorInventory, bits_per_element
from ..machine.hardware import GgmlCpu, GgmlKernel

#: assumption: compute nodes of one transformer layer of llama.cpp's MoE graphs, a count by
#: reading src/models/llama.cpp and src/llama-graph.cpp build_moe_ffn at ggml-org/llama.cpp@0c1e5709
#: (norm, its scale, q/k/v, two ropes, two KV stores, attention, output, residual, norm, scale,
#: router, softmax, top-k, weights, three expert matmuls, activation, weighting, expert sum,
#: residual; views cost nothing), not a count of a built graph. Its weight is small: 8 layers x 28
#: x 0.38 us (node_s at 2 threads here) is 85 us of a 3-50 ms step. Override: reassign.
NODES_PER_LAYER = 28
#: llama.cpp's default logical batch and micro-batch (-b, -ub: common/common.h:454-455)
DEFAULT_N_BATCH, DEFAULT_N_UBATCH = 2048, 512
#: the cached K/V are f16 unless -ctk/-ctv say otherwise (common/common.h cache_type_k/v)
KV_ELEMENT_TYPE = "f16"
#: a step's attention loops over the cache's used cells padded to this many
#: (src/llama-kv-cache.cpp:1265-1270 get_n_kv: max(n_pad, 256), and at least that many)
KV_CELL_PAD = 256
#: a step of one token over at least this many cells splits the cells among the threads, each
#: thread all query heads over its contiguous chunk of ceil(cells / threads) cells
#: (ggml/src/ggml-cpu/ops.cpp:9490-9500 use_split_kv_path: neq1 == 1 && nek1 >= 512)
SPLIT_KV_MIN_CELLS = 512


@dataclass(frozen=True)
class StepTime:
    """One graph step: seconds per part (``dense_s``: every non-expert weight, router and output
    head included; ``experts_s``: the MUL_MAT_ID of routed experts; ``attention_s``; ``nodes_s``;
    ``elementwise_s``: the norms, adds, rope, K/V store, activations between them beyond their
    node cost, :mod:`hrm.cost.ggml_elementwise`)."""

    tokens: int
    dense_s: float
    experts_s: float
    attention_s: float
    nodes_s: float
    elementwise_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.dense_s + self.experts_s + self.attention_s + self.nodes_s + self.elementwise_s


@dataclass(frozen=True)
class RunTimes:
    """A run's predicted prefill (all prompt tokens of all sequences) and decode (every
    generation step) seconds, and the steps they are made of."""

    prefill_s: float
    decode_s: float
    prompt_tokens: int
    decode_steps: int
    sequences: int
    steps: tuple[StepTime, ...] = field(default=(), repr=False)

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def tpot_s(self) -> float:
        """Mean seconds per decode step (one token for every sequence)."""
        return self.decode_s / self.decode_steps if self.decode_steps else 0.0

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.sequences * self.decode_steps / self.decode_s if self.decode_s else 0.0


def probe_type(ggml_type: str) -> str:
    """A GGUF tensor type (``Q4_K``, ``F16``) as ggml_type_name writes it (``q4_K``, ``f16``)."""
    name = ggml_type.lower()
    return name[:-2] + "_K" if name.endswith("_k") else name


def _missing(section: GgmlCpu, ggml_type: str, op: str, threads: int) -> HRMError:
    measured = sorted({k.threads for k in section.kernels})
    return HRMError(f"ggml_cpu: no {op} kernel for {probe_type(ggml_type)} at {threads} threads in this profile "
                    f"(measured threads: {measured}); run hrm profile --llama-cpp DIR on this machine")


def curve_value(kernel: GgmlKernel, rows: float) -> float:
    """The kernel's seconds per element at ``rows`` (:meth:`hrm.machine.hardware.GgmlKernel.value`)."""
    return kernel.value(rows)


#: rows from which a matmul counts as compute-bound for hrm calibrate's two scales (the probe's
#: curves turn linear in the rows from about 16 on this project's CPU: docs/validation/ground_truth.md)
COMPUTE_BOUND_ROWS = 16.0


def calibration_factor(section: GgmlCpu, rows: float) -> float:
    """``stream_scale`` at one row, ``compute_scale`` from COMPUTE_BOUND_ROWS on, geometric in
    log rows between (1 when the profile is not calibrated)."""
    if section.stream_scale == 1.0 and section.compute_scale == 1.0:
        return 1.0
    w = min(max(np.log2(max(rows, 1.0)) / np.log2(COMPUTE_BOUND_ROWS), 0.0), 1.0)
    return float(section.stream_scale ** (1 - w) * section.compute_scale ** w)


def seconds_per_element(section: GgmlCpu, ggml_type: str, op: str, threads: int, rows: float,
                        working_set_mib=None, buffer: str | None = None, head_shape: str | None = None) -> float:
    """:func:`measured_seconds_per_element` × the calibration's factor at ``rows``."""
    return measured_seconds_per_element(section, ggml_type, op, threads, rows, working_set_mib, buffer, head_shape) * \
        calibration_factor(section, rows)


#: the buffer llama.cpp keeps CPU weights in beside a GPU: the GPU's pinned host buffer, whose
#: tensors the CPU backend multiplies with its plain kernels (src/llama-model.cpp make_cpu_buft_list:
#: ACCEL, GPU host, CPU extra, CPU); a CPU-only llama.cpp repacks the types it can
HOST_BUFFER = "CPU"


def placed_kernels(kernels: list[GgmlKernel], buffer: str | None) -> list[GgmlKernel]:
    """The kernels of ``buffer`` where measured; else (or ``buffer`` None: a CPU-only llama.cpp) the
    buffer the probe placed the weights in as a CPU-only llama.cpp does (a repack buffer where there
    is one)."""
    if buffer is not None and any(k.buffer == buffer for k in kernels):
        return [k for k in kernels if k.buffer == buffer]
    repacked = [k for k in kernels if k.buffer != HOST_BUFFER]
    return repacked or kernels


def pool_weights(pools_mib: list[float], reuse_mib: np.ndarray, prob: np.ndarray) -> np.ndarray:
    """Each measured pool's share of weights whose reuse distances are ``reuse_mib`` with
    probabilities ``prob``: a distance between two pools splits linearly in log size, one
    outside them goes to the nearest (so the expected rate is exact for the interpolated curve)."""
    if len(pools_mib) == 1:
        return np.array([float(np.sum(prob))])
    lp = np.log2(np.asarray(pools_mib, dtype=float))
    x = np.clip(np.log2(np.maximum(reuse_mib, 1e-9)), lp[0], lp[-1])
    i = np.clip(np.searchsorted(lp, x, side="right") - 1, 0, len(lp) - 2)
    t = (x - lp[i]) / (lp[i + 1] - lp[i])
    w = np.zeros(len(lp))
    np.add.at(w, i, prob * (1 - t))
    np.add.at(w, i + 1, prob * t)
    return w


def measured_seconds_per_element(section: GgmlCpu, ggml_type: str, op: str, threads: int, rows: float,
                                 working_set_mib=None, buffer: str | None = None,
                                 head_shape: str | None = None) -> float:
    """The measured matmul's seconds per weight element at ``rows`` rows for weights whose reuse
    distance is ``working_set_mib`` (MiB, or ``(distances, probabilities)`` from
    :func:`reuse_distances_mib`): between the curves of the pools measured just below and above
    it (linear in log pool size: the probe cycles its pool, so the pool is its weights' reuse
    distance), the nearest pool's curve outside them; a curve measured over fewer rows gives way
    to the others past its last point. None: the largest pool's curve. ``buffer``: the weights'
    buffer (:func:`placed_kernels`). ``head_shape`` "K:N:HEADS": a per-head weight
    (``GgufTensor.per_head_shape``), at the per-head curve nearest it (:func:`per_head_kernel`)
    where the profile has one, else as the dense matmul ``op``."""
    per_head = per_head_kernel(section, ggml_type, threads, head_shape) if head_shape is not None else None
    if per_head is not None:
        return curve_value(per_head, rows)
    kernels = placed_kernels(section.kernels_of(probe_type(ggml_type), op, threads), buffer)
    if not kernels:
        raise _missing(section, ggml_type, op, threads)
    by_pool = sorted(kernels, key=lambda k: k.pool_mib or section.pool_mib)
    usable = [k for k in by_pool if rows <= k.last_rows] or by_pool[-1:]
    if working_set_mib is None:
        return curve_value(usable[-1], rows)
    mib, prob = (working_set_mib if isinstance(working_set_mib, tuple)
                 else (np.array([float(working_set_mib)]), np.array([1.0])))
    w = pool_weights([k.pool_mib or section.pool_mib for k in usable], mib, prob)
    return float(sum(wk * curve_value(k, rows) for wk, k in zip(w, usable) if wk > 0))


def per_head_kernel(section: GgmlCpu, ggml_type: str, threads: int, shape: str) -> GgmlKernel | None:
    """The per-head matmul (op ``mmh``, profiler.ggml_cpu.measure_per_head) measured at the shape
    nearest ``shape`` "K:N:HEADS" (least summed |log ratio| of K, N and heads), of the tensor's type
    at ``threads``; None where the profile has none (the dense curve then stands in)."""
    kernels = [k for k in section.kernels_of(probe_type(ggml_type), "mmh", threads) if k.head_shape]
    if not kernels:
        return None
    want = np.log([float(x) for x in shape.split(":")])
    return min(kernels, key=lambda k: float(np.abs(np.log(np.array(k.head_shape[:3], dtype=float)) - want).sum()))


def attention_kernel(section: GgmlCpu, op: str, threads: int, k_width: int, v_width: int, mla: bool) -> GgmlKernel:
    """The flash-attention kernel measured at the head shape nearest the model's: the same kind
    (MLA: one KV head; else grouped), then the nearest d_k + d_v."""
    kernels = section.kernels_of(KV_ELEMENT_TYPE, op, threads)
    if not kernels:
        raise _missing(section, KV_ELEMENT_TYPE, op, threads)

    def distance(k: GgmlKernel):
        shape = k.head_shape or (128, 128, 16, 4)
        return (shape[3] == 1) != mla, abs(shape[0] + shape[1] - k_width - v_width)
    return min(kernels, key=distance)


def _dense_s(group: MatmulGroup, rate: Callable[..., float], rows: float) -> float:
    return group.elements * rate(group.ggml_type, "mm", rows, group.per_head_shape)


def _experts_s(group: MatmulGroup, rate: Callable[[str, str, float], float], tokens: int, experts: int,
               top_k: int) -> float:
    if tokens <= 0:
        return 0.0
    touched = float(uniform_distinct_experts(experts, top_k, tokens))
    rows = tokens * top_k / touched
    per_expert = group.elements / experts
    return touched * per_expert * rate(group.ggml_type, "mmid", rows)


def kv_cells(used_cells: float) -> int:
    """The cells a step's attention loops over: the used ones padded to KV_CELL_PAD (the
    masked cells past the used ones are skipped, ops.cpp one_chunk: mv == -INFINITY)."""
    return max(KV_CELL_PAD, int(np.ceil(used_cells / KV_CELL_PAD)) * KV_CELL_PAD)


def split_kv_cells(threads: int, kv_tokens: float) -> float:
    """The cached tokens a one-token step's attention costs, counted as an even split would:
    in the split path every thread takes ceil(cells / threads) of the padded cells, the last
    ones masked, so the step waits for the thread with the most used cells, min(chunk, used),
    and costs threads × that (the probe measures unpadded caches, split evenly). Below
    SPLIT_KV_MIN_CELLS the heads are split instead, and the step costs its used cells."""
    cells = kv_cells(kv_tokens)
    if threads <= 1 or cells < SPLIT_KV_MIN_CELLS:
        return float(kv_tokens)
    return threads * min(float(np.ceil(cells / threads)), float(kv_tokens))


def first_query_tokens(query_tokens: int, kv_tokens: float) -> int:
    """The tokens the first of ``query_tokens`` consecutive queries attends when they attend
    ``kv_tokens`` on average (:func:`causal_mean_tokens`' inverse)."""
    return round(kv_tokens - (query_tokens - 1) / 2.0)


def tiled_cells(query_tokens: int, kv_tokens: float, heads: int = 1, threads: int = 1) -> float:
    """The cached tokens a causal run of ``query_tokens`` queries of one sequence (mean
    ``kv_tokens`` attended) costs a query in the tiled kernel (:func:`causal_tiled_pairs`)."""
    return causal_tiled_pairs(query_tokens, [first_query_tokens(query_tokens, kv_tokens)], heads, threads) / query_tokens


def attention_s(inventory: TensorInventory, section: GgmlCpu, threads: int, query_tokens: int,
                kv_tokens: float, step_tokens: int | None = None) -> float:
    """Flash attention of ``query_tokens`` tokens of one sequence over its ``kv_tokens`` cached
    tokens, all layers: (query rows × heads × cached tokens × (d_k + d_v)) elements at the
    probe's FLASH_ATTN_EXT rate, the tiled kernel's when a sequence brings FA_TILE_QUERIES rows
    or more (ggml-cpu/ops.cpp use_tiled: neq1 >= GGML_FA_TILE_Q), else one row at a time. The
    cached tokens charged are the cells the kernel computes: a step of one token (``step_tokens``,
    default ``query_tokens``) costs :func:`split_kv_cells`, a step of one sequence on the tiled
    path :func:`tiled_cells`, any other step its used cells; the rate is read at ``kv_tokens``."""
    op = "fat" if query_tokens >= FA_TILE_QUERIES else "fa1"
    one_token_step = (query_tokens if step_tokens is None else step_tokens) == 1
    one_sequence = step_tokens is None or step_tokens == query_tokens
    cost_tokens = (split_kv_cells(threads, kv_tokens) if one_token_step else
                   tiled_cells(query_tokens, kv_tokens, inventory.attention.query_heads, threads)
                   if op == "fat" and one_sequence else kv_tokens)
    return _flash_attention_s(inventory, section, threads, op, query_tokens * cost_tokens, kv_tokens)


def _flash_attention_s(inventory: TensorInventory, section: GgmlCpu, threads: int, op: str, pairs: float,
                       kv_tokens: float) -> float:
    """``pairs`` (query row, cached cell) products of every head and layer, (d_k + d_v) elements
    each, at the probe's ``op`` rate read at ``kv_tokens``."""
    arch = inventory.attention
    kernel = attention_kernel(section, op, threads, arch.k_width, arch.v_width, arch.kv_heads == 1)
    return arch.layers * inventory.attention.query_heads * pairs * (arch.k_width + arch.v_width) * curve_value(kernel, kv_tokens)


def shared_stream_tiled_s(inventory: TensorInventory, section: GgmlCpu, threads: int, pairs: float,
                          tokens: int) -> float:
    """A micro-batch of ``tokens`` >= FA_TILE_QUERIES rows in one KV stream that several sequences
    share (a unified cache, ``-kvu``): the tiled kernel computes ``pairs`` (query row, cell)
    products — every KV tile in which some row of a query tile sees a cell, whoever's rows they
    are (ops.cpp flash_attn_ext_tiled skips a KV tile only when every row's mask is -inf), so
    where the sequences' cells interleave each row pays for the others' cells too."""
    return _flash_attention_s(inventory, section, threads, "fat", pairs, pairs / tokens)


@dataclass(frozen=True)
class StepTraffic:
    """The bytes one step reads, for the reuse distance of each: ``dense_bytes`` (every
    non-expert weight, read every step), ``expert_bytes`` (all routed experts' weights),
    ``touched`` (the chance a given expert is read in a step) and ``kv_bytes`` (the cached K/V
    its attention reads)."""

    dense_bytes: float
    expert_bytes: float
    touched: float
    kv_bytes: float


def kv_bytes_per_token(inventory: TensorInventory) -> float:
    """The cache's bytes per token over all layers, at KV_ELEMENT_TYPE. MLA caches the latent
    once: V is a view of K (src/llama-graph.cpp build_attn_mha with v_mla), so only d_k counts."""
    arch = inventory.attention
    width = arch.k_width if arch.kv_heads == 1 else arch.k_width + arch.v_width
    return arch.layers * arch.kv_heads * width * bits_per_element(KV_ELEMENT_TYPE.upper()) / 8


def _weight_bytes(inventory: TensorInventory) -> tuple[float, float]:
    """(dense, routed experts) bytes of the weights a step multiplies by."""
    dense = expert = 0.0
    for group in inventory.matmul_groups:
        b = group.elements * bits_per_element(group.ggml_type) / 8
        if group.is_expert:
            expert += b
        else:
            dense += b
    return dense, expert


def step_traffic(inventory: TensorInventory, tokens: int, sequences: list[tuple[int, float]]) -> StepTraffic:
    """What a step of ``tokens`` tokens reads (uniform, independent routing, as the FFN times)."""
    dense, expert = _weight_bytes(inventory)
    e = inventory.num_experts
    touched = float(uniform_distinct_experts(e, inventory.top_k, tokens)) / e if e else 1.0
    kv = kv_bytes_per_token(inventory) * sum(kv for _, kv in sequences)
    return StepTraffic(dense, expert, min(touched, 1.0), kv)


#: an expert's next read is summed over this many steps at most; the chance of a later first
#: reuse is charged at the last step's distance (its rate is the largest pool's by then)
REUSE_STEPS = 512


def reuse_distances_mib(traffic: StepTraffic, expert: bool) -> tuple[np.ndarray, np.ndarray]:
    """The reuse distances (MiB) of a weight byte and their probabilities, for an LRU-like
    last-level cache: the distinct bytes read between two reads of it (Mattson's stack distance).
    A dense weight is read every step: its distance is the step's bytes, dense + KV + the experts
    it touches. An expert read in one step is read again ``g`` steps later with chance
    p(1-p)^(g-1) (p = ``touched``); between, the steps read the dense weights and KV once and
    a 1-(1-p)^g share of all experts."""
    fixed = traffic.dense_bytes + traffic.kv_bytes
    p = traffic.touched
    if not expert or p >= 1.0:
        return np.array([(fixed + traffic.expert_bytes * p) / 2**20]), np.array([1.0])
    g = np.arange(1, REUSE_STEPS + 1, dtype=float)
    prob = p * (1 - p) ** (g - 1)
    prob[-1] += (1 - p) ** REUSE_STEPS
    return (fixed + traffic.expert_bytes * (1 - (1 - p) ** g)) / 2**20, prob


def step_time(inventory: TensorInventory, section: GgmlCpu, threads: int, tokens: int, outputs: int,
              sequences: list[tuple[int, float]], buffer: str | None = None, kv_unified: bool = False,
              shared_tiled_pairs: float | None = None) -> StepTime:
    """One graph step of ``tokens`` tokens, ``outputs`` of them with logits, and attention per
    sequence ``(query tokens, cached tokens they attend over)``; the weights' matmuls in ``buffer``'s
    kernels (:func:`placed_kernels`: None, where a CPU-only llama.cpp places them; ``HOST_BUFFER``
    with ``--no-repack``). ``kv_unified``: one KV stream for all sequences (``-kvu``); else a stream
    per sequence (common/common.h:575 ``kv_unified = false``; src/llama-kv-cache.cpp:84), and the
    per-stream weights (:attr:`GgufTensor.is_per_stream`) multiply each sequence's rows apart.
    ``shared_tiled_pairs``: the step's attention is the tiled kernel over one shared stream
    (:func:`shared_stream_tiled_s`), given the (row, cell) products its cell layout makes."""
    dense = experts = 0.0
    traffic = step_traffic(inventory, tokens, sequences)
    reuse = {"mm": reuse_distances_mib(traffic, False), "mmid": reuse_distances_mib(traffic, True)}

    @functools.cache  # a step's layers repeat a few (type, op, rows, shape): each rate read once per step
    def rate(ggml_type: str, op: str, rows: float, head_shape: str | None = None) -> float:
        return seconds_per_element(section, ggml_type, op, threads, rows, reuse[op], buffer, head_shape)

    for group in inventory.matmul_groups:  # the last layer's FFN and the head: the output rows only
        rows = outputs if group.output_rows else tokens
        if group.is_expert:
            experts += _experts_s(group, rate, rows, inventory.num_experts, inventory.top_k)
        elif group.is_per_stream and not kv_unified:
            # a stream per sequence: one product per sequence, at its own tokens (its query rows)
            dense += sum(_dense_s(group, rate, q) for q, _ in sequences)
        else:
            dense += _dense_s(group, rate, rows)
    queries = {q for q, _ in sequences}
    if shared_tiled_pairs is not None:
        attn = shared_stream_tiled_s(inventory, section, threads, shared_tiled_pairs, tokens)
    elif len(sequences) > 1 and not kv_unified and len(queries) == 1 and min(queries) >= FA_TILE_QUERIES:
        # a stream per sequence, each bringing the same rows (split_equal): one tiled op over all
        q = min(queries)
        pairs = causal_tiled_pairs(q, [first_query_tokens(q, kv) for _, kv in sequences], inventory.attention.query_heads, threads)
        attn = _flash_attention_s(inventory, section, threads, "fat", pairs, float(np.mean([kv for _, kv in sequences])))
    else:
        attn = sum(attention_s(inventory, section, threads, q, kv, tokens) for q, kv in sequences)
    node = section.node_s(threads)
    if node is None:
        raise HRMError(f"ggml_cpu: no node cost at {threads} threads in this profile; run hrm profile --llama-cpp DIR")
    nodes = NODES_PER_LAYER * inventory.attention.layers * node
    return StepTime(tokens, dense, experts, attn, nodes, elementwise_s(inventory, section, threads, tokens, outputs))


def causal_mean_tokens(cached: float, queries: int) -> float:
    """The mean tokens ``queries`` consecutive queries attend after ``cached`` cached ones: the
    query at cached + j sees cached + j tokens, j = 1 .. queries."""
    return cached + (queries + 1) / 2.0


def step_threads(tokens: int, threads: int, threads_batch: int) -> int:
    """The threads a graph step runs on: ``threads`` for one token, ``threads_batch`` otherwise
    (src/llama-context.cpp:2609, graph_compute's ``batched``)."""
    return threads if tokens == 1 else threads_batch


def resident_bytes(inventory: TensorInventory, kv_tokens: float) -> float:
    """What llama.cpp holds in host memory for a CPU-only run: the weights and a KV cache of
    ``kv_tokens`` (compute buffers not counted)."""
    return inventory.weight_bytes + kv_bytes_per_token(inventory) * kv_tokens


def prefill_steps(sequences: int, prompt_len: int, depth: int, n_batch: int, n_ubatch: int) -> list[tuple[int, int, list]]:
    """The prefill as llama.cpp splits it: every sequence's prompt in one batch, cut into
    logical batches of ``n_batch`` and those into micro-batches of ``n_ubatch`` tokens
    (src/llama-context.cpp decode; the batch sequences' tokens in order). Each micro-batch is
    (tokens, outputs, [(query tokens, attended tokens) per sequence in it]); a sequence's last
    prompt token is its one output."""
    steps = []
    per_batch = min(n_batch, n_ubatch)
    total = sequences * prompt_len
    start = 0
    while start < total:
        end = min(total, start + per_batch)
        seqs, outputs = [], 0
        for s in range(start // prompt_len, (end - 1) // prompt_len + 1):
            lo, hi = max(start, s * prompt_len) - s * prompt_len, min(end, (s + 1) * prompt_len) - s * prompt_len
            # causal: the queries lo..hi-1 see depth + lo .. depth + hi - 1 tokens; their mean
            seqs.append((hi - lo, causal_mean_tokens(depth + lo, hi - lo)))
            outputs += hi == prompt_len
        steps.append((end - start, outputs, seqs))
        start = end
    return steps


def run_times(inventory: TensorInventory, section: GgmlCpu, threads: int, sequences: int, prompt_len: int,
              gen_len: int, depth: int = 0, n_batch: int = DEFAULT_N_BATCH, n_ubatch: int = DEFAULT_N_UBATCH,
              threads_batch: int | None = None, buffer: str | None = None, kv_unified: bool = False) -> RunTimes:
    """Prefill ``sequences`` prompts of ``prompt_len`` tokens (after ``depth`` cached tokens)
    and decode ``gen_len`` steps of one token per sequence. A step of one token runs on
    ``threads``, larger ones on ``threads_batch`` (src/llama-context.cpp: n_threads for a
    one-token ubatch, n_threads_batch otherwise). ``buffer``: :func:`step_time`'s.
    ``kv_unified`` (``-kvu``): the sequences share one KV stream, their cells laid out as
    :class:`hrm.cost.ggml_cells.SharedCells` places them (each prompt in turn, then the decode
    tokens interleaved), and a step of FA_TILE_QUERIES rows or more — a prompt micro-batch, or a
    decode step of that many sequences — runs the tiled kernel over that one stream."""
    if section.prior:  # the prior holds the experts' kernels only (hrm.machine.ggml_prior)
        raise HRMError("ggml_cpu: this machine's llama.cpp kernels are a catalog prior (the CPU experts beside a GPU), "
                       "not a measurement; a CPU-only llama.cpp run needs hrm profile --llama-cpp DIR on the machine")
    tb = threads if threads_batch is None else threads_batch
    shared = SharedCells(sequences * (depth + prompt_len + gen_len)) if kv_unified and sequences > 1 else None
    cached = [depth] * sequences
    if shared is not None and depth:
        for s in range(sequences):
            shared.place(s, 0, depth)

    def step(tokens: int, outputs: int, seqs: list, placed: list[tuple[int, int]]) -> StepTime:
        """``placed``: (sequence, query tokens) in the step's order."""
        t = step_threads(tokens, threads, tb)
        pairs = (shared.place_step([(s, cached[s], q) for s, q in placed], inventory.attention.query_heads, t)
                 if shared is not None else None)
        for s, q in placed:
            cached[s] += q
        return step_time(inventory, section, t, tokens, outputs, seqs, buffer, kv_unified, pairs)

    steps, prefill, start = [], 0.0, 0
    if prompt_len > 0:
        for tokens, outputs, seqs in prefill_steps(sequences, prompt_len, depth, n_batch, n_ubatch):
            first = start // prompt_len
            st = step(tokens, outputs, seqs, [(first + j, q) for j, (q, _) in enumerate(seqs)])
            start += tokens
            steps.append(st)
            prefill += st.total_s
    decode = 0.0
    for i in range(gen_len):
        kv = depth + prompt_len + i + 1
        st = step(sequences, sequences, [(1, kv)] * sequences, [(s, 1) for s in range(sequences)])
        steps.append(st)
        decode += st.total_s
    return RunTimes(prefill, decode, sequences * prompt_len, gen_len, sequences, tuple(steps))


__all__ = ["NODES_PER_LAYER", "REUSE_STEPS", "StepTraffic", "step_traffic", "reuse_distances_mib", "pool_weights", "kv_bytes_per_token", "StepTime", "RunTimes", "probe_type", "seconds_per_element", "attention_s",
           "kv_cells", "split_kv_cells", "per_head_kernel", "tiled_cells", "first_query_tokens", "KV_CELL_PAD", "SPLIT_KV_MIN_CELLS",
           "step_time", "shared_stream_tiled_s", "causal_mean_tokens", "step_threads", "resident_bytes", "prefill_steps", "run_times", "calibration_factor", "ggml_type_of", "nearest_threads"]


#: the ggml type an HRM weight format or dtype runs as (a Q4_K_M file is mostly q4_K)
_TYPE_OF_FORMAT = {"q4_0": "q4_0", "q8_0": "q8_0", "q4_k": "q4_K", "q5_k": "q5_K", "q6_k": "q6_K", "q4_k_m": "q4_K"}
_TYPE_OF_DTYPE = {"fp16": "f16", "bf16": "f16", "fp32": "f32", "int8": "q8_0", "int4": "q4_0"}


def ggml_type_of(model) -> str:
    """The ggml type of a model spec's expert weights: its GGUF format (a per-tensor mix: the
    type holding the most weights; a format that is a ggml type: that type), else its dtype."""
    from ..model.quantized import GGML_BLOCKS, MIX_PREFIX

    fmt = getattr(model, "weight_format", None)
    if isinstance(fmt, str) and fmt.startswith(MIX_PREFIX):
        counts = [item.partition("*") for item in fmt[len(MIX_PREFIX):].split(",")]
        fmt = max(counts, key=lambda c: int(c[2]))[0]
    if fmt in _TYPE_OF_FORMAT:
        return _TYPE_OF_FORMAT[fmt]
    if isinstance(fmt, str) and fmt.upper() in GGML_BLOCKS:
        return probe_type(fmt)
    return _TYPE_OF_DTYPE.get(model.weight_dtype, "f16")


def nearest_threads(section: GgmlCpu, threads: int) -> int:
    """The measured thread count nearest ``threads`` (the larger one on a tie)."""
    measured = sorted({k.threads for k in section.kernels})
    if not measured:
        raise HRMError("ggml_cpu: the section has no kernels")
    return min(measured, key=lambda t: (abs(t - threads), -t))
