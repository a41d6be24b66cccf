"""FlexGen's weight placement for MoE models, as pure functions of a :class:`~hrm.model.spec.ModelSpec`.

FlexGen's MoE entry point is ``python -m flexgen.flex_moe`` of the FlexGen fork the
MoE-Lightning authors ran their FlexGen baseline with (``lynnliu030/FlexGen``, branch ``moe``;
the artifact's runners ``caoshiyi/artifacts benchmarks/flexgen/mtbench/mtbench_run_moe.py``
import it); upstream FlexLLMGen's ``flex_opt`` runs OPT names only. Facts and their sources:
``docs/engines/flexgen.md``.

``--percent wg wc ...`` does not split every tensor: each FlexGen layer (an attention block,
an MoE block, the input and the output embedding: ``sep_layer``) places *whole tensors*, each
on the tier where the midpoint of its cumulative size falls in the list ``[disk, cpu, gpu]``
of percents (``init_weight_list``/``init_weight_list_moe`` and ``get_choice``, flex_moe.py
:79-169). A Mixtral MoE block is three tensors (router, w1|w3 stacked, w2), so the GPU share of
its experts takes three values only; the functions below give the bytes each ``--percent``
places, the shares the search may use, and the smallest ``--percent`` for a wanted share.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal, Optional

from ..errors import HRMError
from ..model.spec import ModelSpec

#: the fork and file every fact here was read in (docs/engines/flexgen.md)
FLEX_MOE = "lynnliu030/FlexGen@a80c8d15 flexgen/flex_moe.py"
#: FlexGen casts every weight to fp16 ("hack dtype", flex_moe.py:613-614; moe_config.py:42)
FLEXGEN_WEIGHT_BYTES = 2
#: the tiers of get_choice's list, in its order (flex_moe.py:90-91)
TIERS = ("disk", "cpu", "gpu")
#: what a share is of: the routed experts (a plan of ideal/moe-lightning) or every layer weight
Reads = Literal["experts", "layers"]
#: tensors of an MoE block that hold routed experts (the router is not one)
EXPERT_TENSORS = ("block_sparse_moe.ws", "block_sparse_moe.w2s")
_SHARE_TOL = 1e-12


def flex_moe_refusal(model: ModelSpec) -> Optional[str]:
    """Why ``flexgen.flex_moe`` cannot run ``model`` (None: it can). It builds a Mixtral
    model (MixtralLM, flex_moe.py:605-631: every layer attention + MoEMLP, config fields
    ``num_local_experts``/``intermediate_size``, q (h, h) and k, v (h·nkv/nq, h) at :313-333,
    checkpoint names ``block_sparse_moe.experts.{e}.w1/w2/w3`` at :508-518)."""
    arch = _catalog_model_type(model.name)
    if arch is not None and arch != "mixtral":
        return f"{model.name}: config.json model_type {arch!r}, not 'mixtral'"
    if model.is_mla or model.shared_intermediate_size or model.first_dense_layers or model.num_experts < 2:
        return f"{model.name} is not a Mixtral-layout model (MLA, shared experts, dense layers or one expert)"
    if model.num_heads * model.head_dim != model.hidden_size:
        return (f"{model.name}: heads x head_dim ({model.num_heads} x {model.head_dim}) != hidden size "
                f"{model.hidden_size}, but flex_moe.py:314-330 shapes q as (h, h)")
    return None


def _catalog_model_type(name: str) -> Optional[str]:
    """config.json's ``model_type`` of a catalog model (None for a model not in the catalog:
    then only its layout is checked)."""
    import json

    from ..model.spec import CATALOG_DIR, list_catalog

    if name.lower() not in list_catalog():
        return None
    return json.loads((CATALOG_DIR / f"{name.lower()}.json").read_text()).get("model_type")


def _attention_shapes(model: ModelSpec) -> list[tuple[str, tuple[int, ...]]]:
    """SelfAttention.init_weight's list (flex_moe.py:313-333), in its order."""
    h = model.hidden_size
    h_kv = h // (model.num_heads // model.num_kv_heads)
    return [("input_layernorm", (h,)), ("self_attn.q_proj", (h, h)), ("self_attn.k_proj", (h_kv, h)),
            ("self_attn.v_proj", (h_kv, h)), ("self_attn.o_proj", (h, h)), ("post_attention_layernorm", (h,))]


def _moe_shapes(model: ModelSpec) -> list[tuple[str, tuple[int, ...]]]:
    """MoEMLP.init_weight's list (flex_moe.py:508-518): the router, then w1 and w3 of every
    expert stacked in one tensor, then every expert's w2 in one tensor."""
    h, h2, e = model.hidden_size, model.expert_intermediate_size, model.num_experts
    return [("block_sparse_moe.gate", (e, h)), ("block_sparse_moe.ws", (e, 2 * h2, h)),
            ("block_sparse_moe.w2s", (e, h, h2))]


def _embedding_lists(model: ModelSpec) -> list[list[tuple[str, tuple[int, ...]]]]:
    """InputEmbed's list (flex_moe.py:186-193) and OutputEmbed's (:247-257), each placed alone."""
    h, v = model.hidden_size, model.vocab_size
    return [[("embed_tokens", (v, h))], [("norm", (h,)), ("lm_head", (v, h))]]


def _bytes(shape: tuple[int, ...]) -> int:
    return math.prod(shape) * FLEXGEN_WEIGHT_BYTES


def layer_tensors(model: ModelSpec) -> list[tuple[str, int]]:
    """(name, bytes) of one decoder layer's weights in FlexGen's order: the attention block's
    list, then the MoE block's (MixtralLM appends SelfAttention then MoEMLP per layer,
    flex_moe.py:625-628; TransformerLayer without sep_layer keeps the two lists, :570-574)."""
    return [(name, _bytes(shape)) for name, shape in _attention_shapes(model) + _moe_shapes(model)]


def tensor_tier(mid_percent: float, weight_gpu_percent: int, weight_cpu_percent: int) -> str:
    """The tier of a tensor whose cumulative-size midpoint is ``mid_percent`` (get_choice,
    flex_moe.py:79-86, over [disk, cpu, gpu] = [100 − wg − wc, wc, wg], :67-68 and :90-91):
    the first tier whose cumulative percent exceeds the midpoint (strictly), else the GPU."""
    disk = 100 - weight_gpu_percent - weight_cpu_percent
    if mid_percent < disk:
        return "disk"
    if mid_percent < disk + weight_cpu_percent:
        return "cpu"
    return "gpu"


def place_list(shapes: list[tuple[str, tuple[int, ...]]], weight_gpu_percent: int,
               weight_cpu_percent: int) -> list[tuple[str, int, str]]:
    """(name, bytes, tier) of one FlexGen layer's list: each whole tensor on the tier of its
    midpoint, (cumsum_i − size_i/2)/cumsum_last·100 (init_weight_list, flex_moe.py:93-98, in
    element counts and float64 as there)."""
    sizes = [math.prod(shape) for _, shape in shapes]
    total, running, out = sum(sizes), 0, []
    for (name, shape), size in zip(shapes, sizes):
        running += size
        mid_percent = (running - size / 2) / total * 100
        out.append((name, _bytes(shape), tensor_tier(mid_percent, weight_gpu_percent, weight_cpu_percent)))
    return out


def _checked(percent_weights) -> tuple[int, int]:
    """(wg, wc): whole percents, each 0..100, at most 100 together (the rest is disk)."""
    wg, wc = (int(p) for p in percent_weights)
    if not (0 <= wg <= 100 and 0 <= wc <= 100 and wg + wc <= 100):
        raise HRMError(f"--percent {wg} {wc}: the weight shares must be 0..100 and sum to at most 100")
    return wg, wc


def _tier_bytes(placed) -> dict[str, int]:
    out = dict.fromkeys(TIERS, 0)
    for _, size, tier in placed:
        out[tier] += size
    return out


def placed_bytes(model: ModelSpec, percent_weights) -> dict[str, dict[str, int]]:
    """Bytes per tier (disk, cpu, gpu) that ``--percent wg wc`` (``percent_weights``) places:
    ``layer`` (one decoder layer: its attention and MoE lists, each by the midpoint rule,
    flex_moe.py:89-169), ``layers`` (all decoder layers, every one placed alike),
    ``embeddings`` (InputEmbed and OutputEmbed, :186-257) and ``model`` (their sum)."""
    wg, wc = _checked(percent_weights)
    layer = _tier_bytes(place_list(_attention_shapes(model), wg, wc) + place_list(_moe_shapes(model), wg, wc))
    embed = _tier_bytes([t for shapes in _embedding_lists(model) for t in place_list(shapes, wg, wc)])
    layers = {tier: model.num_layers * size for tier, size in layer.items()}
    return {"layer": layer, "layers": layers, "embeddings": embed,
            "model": {tier: layers[tier] + embed[tier] for tier in TIERS}}


def expert_gpu_share(model: ModelSpec, weight_gpu_percent: int) -> float:
    """The realised GPU share of the routed-expert bytes under ``--percent wg …``: the
    expert tensors (w1|w3, w2) whose midpoint falls in the GPU's last wg percent of the MoE
    block's list (flex_moe.py:130-139). Only wg matters for the GPU (the GPU is the last tier
    of get_choice's list, :90)."""
    placed = place_list(_moe_shapes(model), *_checked((weight_gpu_percent, 100 - weight_gpu_percent)))
    experts = [(size, tier) for name, size, tier in placed if name in EXPERT_TENSORS]
    return sum(size for size, tier in experts if tier == "gpu") / sum(size for size, _ in experts)


def layer_gpu_share(model: ModelSpec, weight_gpu_percent: int) -> float:
    """The realised GPU share of one decoder layer's bytes (attention and MoE lists) under
    ``--percent wg …``: r_w as HRM's ``offloaded_weights: all`` engines read it."""
    placed = placed_bytes(model, (weight_gpu_percent, 100 - weight_gpu_percent))["layer"]
    return placed["gpu"] / sum(placed.values())


@dataclass(frozen=True)
class Level:
    """One placement FlexGen realises: the smallest ``--percent`` wg giving it and the GPU
    shares of the experts and of all layer bytes it places."""

    percent: int
    expert_share: float
    layer_share: float

    def share(self, reads: Reads) -> float:
        return self.expert_share if reads == "experts" else self.layer_share


def realised_levels(model: ModelSpec) -> tuple[Level, ...]:
    """Every distinct decoder-layer placement of wg = 0..100, each with the smallest wg that
    gives it (the fewest embedding bytes on the GPU: InputEmbed/OutputEmbed move at ~50),
    by increasing GPU share."""
    levels: dict[float, Level] = {}
    for wg in range(101):
        share = layer_gpu_share(model, wg)
        if share not in levels:
            levels[share] = Level(wg, expert_gpu_share(model, wg), share)
    return tuple(sorted(levels.values(), key=lambda lv: lv.layer_share))


def realisable_shares(model: ModelSpec, reads: Reads = "layers") -> tuple[float, ...]:
    """The GPU shares (of the experts, or of all layer bytes) FlexGen can realise for
    ``model``: the only r_w values a search for FlexGen should consider."""
    return tuple(sorted({lv.share(reads) for lv in realised_levels(model)}))


def percent_for_share(model: ModelSpec, share: float, reads: Reads = "layers") -> Optional[int]:
    """The smallest ``--percent`` wg whose realised GPU share (of the experts or of all layer
    bytes) is ``share``; None when FlexGen cannot realise it (:func:`nearest_levels`)."""
    for wg in range(101):
        got = expert_gpu_share(model, wg) if reads == "experts" else layer_gpu_share(model, wg)
        if math.isclose(got, share, rel_tol=0.0, abs_tol=_SHARE_TOL):
            return wg
    return None


def nearest_levels(model: ModelSpec, share: float, reads: Reads = "layers") -> list[Level]:
    """The realised placement equal to ``share`` (one level), else the nearest below and the
    nearest above it (below first: fewer GPU bytes)."""
    levels = realised_levels(model)
    exact = [lv for lv in levels if math.isclose(lv.share(reads), share, rel_tol=0.0, abs_tol=_SHARE_TOL)]
    if exact:
        return exact[:1]
    below = [lv for lv in levels if lv.share(reads) < share]
    above = [lv for lv in levels if lv.share(reads) > share]
    below_best = max(below, key=lambda lv: (lv.share(reads), -lv.layer_share), default=None)
    above_best = min(above, key=lambda lv: (lv.share(reads), lv.layer_share), default=None)
    return [lv for lv in (below_best, above_best) if lv is not None]


def disk_percent_for_spill(model: ModelSpec, weight_gpu_percent: int, spill_bytes: float) -> Optional[int]:
    """The smallest disk share d = 100 − wg − wc whose whole tensors hold ``spill_bytes``
    of the decoder layers' weights (the minimal spill of docs/model.md §4.9) beside
    ``--percent wg``: 0 when nothing spills; None when even wc = 0 leaves too few bytes on
    disk. The GPU's tensors depend on wg alone (the GPU is the last tier of get_choice's
    list, flex_moe.py:79-86, :90-91), so a disk share moves only CPU tensors to disk."""
    if spill_bytes <= 0:
        return 0
    for disk in range(1, 101 - weight_gpu_percent):
        placed = placed_bytes(model, (weight_gpu_percent, 100 - weight_gpu_percent - disk))["layers"]
        if placed["disk"] >= spill_bytes:
            return disk
    return None


def cache_gpu_rows(model: ModelSpec, micro_batch: int, cache_gpu_percent: int) -> int:
    """Rows (sequence × KV head) of one micro-batch's KV cache on the GPU under ``--percent
    … cg cc …``: all for cg = 100, none for cc = 100 (flex_moe.py:352-357), else
    int(rows·cg/100) rounded down to a multiple of the *query* head count
    (TorchMixedDevice.init_cache_one_gpu_batch, moe_pytorch_backend.py:783-794)."""
    return _rows_on_gpu(micro_batch * model.num_kv_heads, model.num_heads, cache_gpu_percent)


def _rows_on_gpu(rows: int, heads: int, cache_gpu_percent: int) -> int:
    if cache_gpu_percent >= 100:
        return rows
    return int(rows * cache_gpu_percent / 100) // heads * heads


def cache_gpu_share(model: ModelSpec, micro_batch: int, cache_gpu_percent: int) -> float:
    """The realised share of the KV cache on the GPU (HRM's r_c) for ``cg`` (the rest on the CPU)."""
    return cache_gpu_rows(model, micro_batch, cache_gpu_percent) / (micro_batch * model.num_kv_heads)


def cache_percent_for_share(model: ModelSpec, micro_batch: int, share: float) -> list[tuple[int, float]]:
    """(cg, realised r_c): the smallest cg realising ``share``, else the nearest below and above."""
    seen: dict[float, int] = {}
    for cg in range(101):
        seen.setdefault(cache_gpu_share(model, micro_batch, cg), cg)
    exact = [(cg, s) for s, cg in seen.items() if math.isclose(s, share, rel_tol=0.0, abs_tol=_SHARE_TOL)]
    if exact:
        return exact
    below = max(((cg, s) for s, cg in seen.items() if s < share), key=lambda p: p[1], default=None)
    above = min(((cg, s) for s, cg in seen.items() if s > share), key=lambda p: p[1], default=None)
    return [p for p in (below, above) if p is not None]


def realisable_cache_shares(model: ModelSpec, micro_batch: int) -> tuple[float, ...]:
    """The GPU shares of one micro-batch's KV cache (HRM's r_c) that some ``--percent … cg``
    realises: int(rows·cg/100) rounded down to a multiple of the query heads, every cg of
    0..100 (:func:`cache_gpu_share`), increasing."""
    return _realisable_shares(int(model.num_kv_heads), int(model.num_heads), int(micro_batch))


@functools.lru_cache(maxsize=4096)
def _realisable_shares(kv_heads: int, heads: int, micro_batch: int) -> tuple[float, ...]:
    # a search asks for the same (heads, μ) tens of thousands of times: each is 101 divisions
    rows = micro_batch * kv_heads
    return tuple(sorted({_rows_on_gpu(rows, heads, cg) / rows for cg in range(101)}))


def padded_workload(workload):
    """The workload FlexGen runs: every prompt padded to ``--prompt-len``, the longest one
    (get_test_inputs pads to max_length, flex_moe.py:1207-1211; the artifact's runner pads
    to the longest tokenised prompt, mtbench_run_moe.py:51-54; one prompt_len per task,
    :869-889)."""
    return workload if workload.padding else workload.model_copy(update={"padding": True})
