"""Concrete placement (docs/model.md §6): which routed experts of which layers are static on the GPU.

r_w is realised in whole experts: m = round(r_w · L_moe · ne), dealt round-robin over the
MoE layers (layer index fastest, lowest expert ids first) so that every layer offloads
about the same bytes — the double buffer is sized by the layer with the most offloaded
experts. One scheme for the solver's plans and the runtime's default.
"""

from __future__ import annotations

from .model.spec import ModelSpec
from .plan import LayerPlacement, Placement
from .policy import Policy


def moe_layers(model: ModelSpec) -> list[int]:
    """Absolute indices of the layers with routed experts (dense first layers excluded)."""
    return model.moe_layer_indices


def static_expert_count(model: ModelSpec, policy: Policy) -> int:
    """round(r_w · L_moe · ne): r_w realised in whole experts (0 when experts run on the CPU)."""
    ratio = policy.weights_gpu_ratio if policy.ffn_on_gpu else 0.0
    return round(ratio * len(moe_layers(model)) * model.num_experts)


def make_placement(model: ModelSpec, gpu_experts: int, num_micro_batches: int, whole_layers: bool = False) -> Placement:
    """Spread ``gpu_experts`` whole experts over the MoE layers round-robin: every layer gets
    ⌊m/L⌋ experts, the first m mod L layers one more. ``whole_layers`` (llama.cpp's
    ``--n-cpu-moe N``: the first N layers' experts stay on the CPU): the last ⌊m/ne⌋ layers
    hold all their experts, the others none. r_w realised = m / (L·ne)."""
    layers = moe_layers(model)
    slots = len(layers) * model.num_experts
    if whole_layers:
        on_gpu = gpu_experts // model.num_experts
        counts = [model.num_experts if i >= len(layers) - on_gpu else 0 for i in range(len(layers))]
    else:
        per_layer, extra = divmod(gpu_experts, len(layers)) if layers else (0, 0)
        counts = [min(model.num_experts, per_layer + (1 if i < extra else 0)) for i in range(len(layers))]
    return Placement(
        layers=[LayerPlacement(layer=layer, gpu_experts=list(range(count))) for layer, count in zip(layers, counts)],
        weight_pages=num_micro_batches,
        weights_gpu_ratio_realised=gpu_experts / slots if slots else 0.0,
    )


def policy_placement(model: ModelSpec, policy: Policy) -> Placement:
    """The placement of ``policy`` (the runtime's default when a plan gives none)."""
    return make_placement(model, static_expert_count(model, policy), policy.num_micro_batches)
