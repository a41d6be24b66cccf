"""Concrete placement (SPEC §6): which experts of which layers are static on the GPU."""

from __future__ import annotations

from hrm.model import ModelSpec
from hrm.plan import LayerPlacement, Placement


def make_placement(model: ModelSpec, gpu_experts: int, num_micro_batches: int) -> Placement:
    """Spread ``gpu_experts`` whole experts over the MoE layers round-robin (layer-major:
    every layer gets ⌊m/L⌋ experts, the first m mod L layers one more), lowest expert ids
    first. r_w realised = m / (L·ne). Dense first layers have no routed experts."""
    moe_layers = list(range(model.first_dense_layers, model.num_layers))
    per_layer, extra = divmod(gpu_experts, len(moe_layers))
    layers = [
        LayerPlacement(layer=layer, gpu_experts=list(range(min(model.num_experts, per_layer + (1 if i < extra else 0)))))
        for i, layer in enumerate(moe_layers)
    ]
    slots = len(moe_layers) * model.num_experts
    return Placement(layers=layers, weight_pages=num_micro_batches, weights_gpu_ratio_realised=gpu_experts / slots)
