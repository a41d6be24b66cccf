"""The elementwise nodes of llama.cpp's layer graphs on its CPU backend (docs/model.md §4.10):
the norms, residual adds, rope, K/V store, router softmax, expert activation, weighting and sum
between a layer's matmuls. Each costs its output elements × the probe's measured seconds per
element for that kind of op (``hrm profile --llama-cpp``: ``ew:KIND`` in
profiler/ggml_kernels.cpp), less the one graph-node cost the step already charges for it.

At one token a step these are a node's fixed cost; over a prompt ubatch of hundreds of tokens
they were 4-7% of llama.cpp's prefill on this project's CPU (perf, docs/validation/ground_truth.md
§1.6), the one part of a prefill the matmul and attention probes do not see.

The nodes each weight implies are read from the GGUF's own tensor list, by the graph code that
uses the weight (ggml-org/llama.cpp@0c1e5709): src/models/llama.cpp, qwen3moe.cpp, deepseek2.cpp
and src/llama-graph.cpp build_moe_ffn / build_ffn / build_attn. Views, permutes and the
router's top-k bookkeeping (k of E values a token) are not counted.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..machine.hardware import GgmlCpu
from ..model.gguf import TensorInventory

#: the kinds the probe measures (profiler/ggml_kernels.cpp ``ew:KIND``), each a ggml op of the
#: layer graphs: RMS_NORM×weight (fused), ADD, MUL by the router weights (a broadcast per row),
#: SWIGLU, SET_ROWS into the f16 cache, ROPE, SOFT_MAX, CONCAT (MLA's Q and K)
ELEMENTWISE_KINDS = ("norm", "add", "mulw", "glu", "kv16", "rope", "softmax", "concat")


@dataclass(frozen=True)
class LayerElementwise:
    """One layer's elementwise nodes: (kind, output elements per token) for the part every token
    runs (attention) and the FFN part, which the last layer runs on the output rows only."""

    attention: tuple[tuple[str, int], ...]
    ffn: tuple[tuple[str, int], ...]


@functools.lru_cache(maxsize=16)
def _shapes(inventory: TensorInventory) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape by name (one pass; a step asks for every layer's weights)."""
    return {t.name: t.shape for t in inventory.tensors}


def layer_elementwise(inventory: TensorInventory, layer: int) -> LayerElementwise:
    """The nodes layer ``layer`` runs, from the weights it has (each weight's graph code)."""
    blk = f"blk.{layer}."
    shapes = _shapes(inventory)

    def shape(name):
        return shapes.get(blk + name + ".weight")

    arch = inventory.attention
    heads = arch.query_heads
    norm = shape("attn_norm")
    n_embd = int(norm[0]) if norm else 0
    mla = arch.kv_heads == 1 and shape("attn_kv_a_mqa") is not None
    att: list[tuple[str, int]] = []
    for weight, count in (("attn_norm", 1), ("attn_q_a_norm", 1), ("attn_kv_a_norm", 1),
                          ("attn_q_norm", heads), ("attn_k_norm", arch.kv_heads)):
        s = shape(weight)
        if s:  # RMS_NORM then MUL by the weight, per head for Qwen3's q/k norms (qwen3moe.cpp)
            att.append(("norm", int(s[0]) * count))
    if mla:
        # deepseek2.cpp: rope of q_pe (every head) and k_pe (one), Q = concat(absorbed q_nope, q_pe)
        # per head and K = concat(kv_cmpr, k_pe); the cache stores K only (V is a view of it)
        rope = arch.k_width - arch.v_width
        att += [("rope", (heads + 1) * rope), ("concat", (heads + 1) * arch.k_width), ("kv16", arch.k_width)]
    else:
        # llama.cpp / qwen3moe.cpp: rope of Q and K over the head, K and V stored (set_rows)
        att += [("rope", (heads + arch.kv_heads) * arch.k_width),
                ("kv16", arch.kv_heads * (arch.k_width + arch.v_width))]
    att.append(("add", n_embd))  # the attention residual

    ffn: list[tuple[str, int]] = []
    if shape("ffn_norm"):
        ffn.append(("norm", int(shape("ffn_norm")[0])))
    gate_exps, router = shape("ffn_gate_exps"), shape("ffn_gate_inp")
    if gate_exps:
        k = inventory.top_k
        # build_moe_ffn: softmax of the router logits, SWIGLU of each chosen expert's gate and up,
        # MUL by its router weight, the k outputs summed by k - 1 ADDs
        ffn += [("softmax", int(router[1]) if router else inventory.num_experts),
                ("glu", int(gate_exps[1]) * k), ("mulw", n_embd * k), *[("add", n_embd)] * (k - 1)]
    shared = shape("ffn_gate_shexp")
    if shared:  # the shared experts' FFN (build_ffn) and its ADD to the routed output
        ffn += [("glu", int(shared[1])), ("add", n_embd)]
    dense = shape("ffn_gate")
    if dense:  # a dense layer's FFN (build_ffn, SWIGLU)
        ffn.append(("glu", int(dense[1])))
    ffn.append(("add", n_embd))  # the FFN residual
    return LayerElementwise(tuple(att), tuple(ffn))


@functools.lru_cache(maxsize=16)
def _layers(inventory: TensorInventory) -> tuple[LayerElementwise, ...]:
    return tuple(layer_elementwise(inventory, layer) for layer in range(inventory.attention.layers))


def elementwise_kernel_s(section: GgmlCpu, kind: str, threads: int, rows: float):
    """The probe's seconds per output element of ``kind`` at ``threads`` and ``rows`` tokens
    (linear between measured rows, flat past either end: an elementwise op's cost per element
    stops falling once its rows cover the node's fixed cost); None when not measured."""
    kernel = section.kernel("f32", kind, threads)
    if kernel is None:
        return None
    points = sorted(kernel.s_per_elem_vs_rows, key=lambda p: p.x)
    return float(np.interp(rows, [p.x for p in points], [p.y for p in points]))


def elementwise_by_kind_s(inventory: TensorInventory, section: GgmlCpu, threads: int, tokens: int,
                          outputs: int) -> dict[str, float]:
    """Every layer's elementwise nodes for a step of ``tokens`` tokens, ``outputs`` of them with
    logits (the last layer's FFN runs on those only: deepseek2.cpp:636-639, qwen3moe.cpp:123-126,
    llama.cpp:174-177), in seconds per kind. A node costs its elements × the kind's rate at its
    rows, less ``node_s`` (the step charges every node that once); empty for a profile measured
    before the probe had these kinds (its steps then cost the matmuls, attention and nodes only)."""
    node = section.node_s(threads) or 0.0
    last = inventory.attention.layers - 1
    rates: dict = {}
    by_kind: dict[str, float] = {}
    for layer, parts in enumerate(_layers(inventory)):
        for part, rows in ((parts.attention, tokens), (parts.ffn, outputs if layer == last else tokens)):
            for kind, per_token in part:
                if rows <= 0 or per_token <= 0:
                    continue
                if (kind, rows) not in rates:
                    rates[(kind, rows)] = elementwise_kernel_s(section, kind, threads, rows)
                if rates[(kind, rows)] is None:
                    return {}
                by_kind[kind] = by_kind.get(kind, 0.0) + max(0.0, per_token * rows * rates[(kind, rows)] - node)
    return by_kind


def elementwise_s(inventory: TensorInventory, section: GgmlCpu, threads: int, tokens: int, outputs: int) -> float:
    """:func:`elementwise_by_kind_s`, summed: the step's elementwise seconds."""
    return sum(elementwise_by_kind_s(inventory, section, threads, tokens, outputs).values())


__all__ = ["ELEMENTWISE_KINDS", "LayerElementwise", "layer_elementwise", "elementwise_kernel_s", "elementwise_by_kind_s",
           "elementwise_s"]
