"""Which routed experts stay on the device tier (the plan's ``placement``).

r_w is realised in whole experts: round(r_w · L_moe · ne) experts, dealt round-robin over
the MoE layers (layer index fastest) so that every layer offloads about the same bytes —
the double buffer is sized by the layer with the most offloaded experts.
"""

from __future__ import annotations

from hrm.model import ModelSpec
from hrm.plan import LayerPlacement, Placement
from hrm.policy import Policy


def moe_layers(model: ModelSpec) -> list[int]:
    return list(range(model.first_dense_layers, model.num_layers))


def round_robin_placement(model: ModelSpec, policy: Policy) -> Placement:
    """Placement of ``policy`` for ``model`` (absolute layer indices; dense layers omitted)."""
    layers = moe_layers(model)
    total = static_expert_count(model, policy)
    chosen: dict[int, list[int]] = {i: [] for i in layers}
    for k in range(total):
        chosen[layers[k % len(layers)]].append(k // len(layers))
    realised = total / (len(layers) * model.num_experts) if layers else 0.0
    return Placement(
        layers=[LayerPlacement(layer=i, gpu_experts=sorted(chosen[i])) for i in layers],
        weight_pages=policy.num_micro_batches,
        weights_gpu_ratio_realised=realised,
    )


def static_expert_count(model: ModelSpec, policy: Policy) -> int:
    """round(r_w · L_moe · ne): r_w realised in whole experts (0 when experts run on the CPU)."""
    ratio = policy.weights_gpu_ratio if policy.ffn_on_gpu else 0.0
    return round(ratio * len(moe_layers(model)) * model.num_experts)


def make_placement(model: ModelSpec, policy: Policy) -> Placement:
    """The solver's placement (``solver.placement.make_placement``) when it is installed,
    else :func:`round_robin_placement` (the same scheme)."""
    try:
        from solver.placement import make_placement as solver_placement
    except ImportError:
        return round_robin_placement(model, policy)
    return solver_placement(model, static_expert_count(model, policy), policy.num_micro_batches)
