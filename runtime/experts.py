"""Expert weights under a placement (MoE-Lightning appendix A.1, weights paging).

- Experts listed in the placement stay **static** on the device tier.
- The others of a layer live in one flat host buffer (pinned on CUDA): the layer's
  offloaded part W_L, cut into ``n`` equal **pages** (n = number of micro-batches).
- The device tier holds a **double buffer** of 2 × max_layer sizeof(W_L): while layer i
  computes from one slot, the pages of the next layer stream into the other (Algorithm 1,
  W_PintoG). An expert is addressed through its offset in the slot (the page table).
"""

from __future__ import annotations

import torch

from hrm.errors import HRMError
from hrm.model.spec import ModelSpec
from hrm.plan import Placement

from .device import DeviceTier
from .model import Expert, ModelWeights


def _flatten(experts: list[Expert]) -> torch.Tensor:
    parts = [t.reshape(-1) for exp in experts for t in exp.tensors()]
    return torch.cat(parts) if parts else torch.zeros(0)


class ExpertStore:
    """Static device experts, offloaded host pages, and the device double buffer."""

    def __init__(self, spec: ModelSpec, weights: ModelWeights, placement: Placement, tier: DeviceTier,
                 on_device: bool):
        self.spec, self.tier, self.on_device = spec, tier, on_device
        self.pages = max(1, placement.weight_pages)
        h, h2 = spec.hidden_size, spec.expert_intermediate_size
        self.shapes = [(h2, h), (h, h2), (h2, h)]
        self.expert_numel = 3 * h * h2
        self.host_experts = {i: layer.experts for i, layer in enumerate(weights.layers) if layer.is_moe}
        wanted = {lp.layer: set(lp.gpu_experts) for lp in placement.layers}
        self.static: dict[int, dict[int, Expert]] = {}
        self.offloaded: dict[int, list[int]] = {}
        self.host_pages: dict[int, torch.Tensor] = {}
        for i, experts in self.host_experts.items():
            gpu = sorted(wanted.get(i, set()))
            if any(e >= len(experts) or e < 0 for e in gpu):
                raise HRMError(f"placement: layer {i} names expert {max(gpu)} but the model has {len(experts)}")
            if gpu and not on_device:
                raise HRMError("placement keeps experts on the GPU but the policy runs the FFN on the CPU (ffn=cpu)")
            self.static[i] = {e: Expert(*(tier.alloc(t) for t in experts[e].tensors())) for e in gpu}
            self.offloaded[i] = [e for e in range(len(experts)) if e not in self.static[i]]
            if on_device:
                self.host_pages[i] = tier.pin(_flatten([experts[e] for e in self.offloaded[i]]))
        extra = set(wanted) - set(self.host_experts)
        if extra:
            raise HRMError(f"placement names layer {min(extra)}, which is not an MoE layer of {spec.name}")
        self.slot_numel = max((len(v) * self.expert_numel for v in self.offloaded.values()), default=0)
        dtype = next(iter(self.host_experts.values()))[0].w1.dtype if self.host_experts else torch.float32
        self.buffer = (tier.empty((2, self.slot_numel), dtype)
                       if on_device and self.slot_numel else None)

    # --- paging ---------------------------------------------------------------------
    def page_range(self, layer: int, page: int) -> tuple[int, int]:
        """Element range [start, end) of ``page`` of ``layer``'s offloaded part."""
        total = len(self.offloaded.get(layer, ())) * self.expert_numel
        size = -(-total // self.pages)
        return min(page * size, total), min((page + 1) * size, total)

    def has_pages(self, layer: int) -> bool:
        return self.on_device and bool(self.offloaded.get(layer))

    def copy_page(self, layer: int, page: int, slot: int) -> int:
        """W_PintoG: host page → device slot (run on the h2d lane). Returns the bytes moved."""
        start, end = self.page_range(layer, page)
        if end <= start:
            return 0
        src = self.host_pages[layer][start:end]
        self.tier.to_device(src, out=self.buffer[slot, start:end])
        return (end - start) * src.element_size()

    def page_bytes(self, layer: int, page: int) -> int:
        start, end = self.page_range(layer, page)
        return max(end - start, 0) * self.host_pages[layer].element_size() if layer in self.host_pages else 0

    # --- lookup (the page table) -----------------------------------------------------------
    def device_expert(self, layer: int, slot: int, e: int) -> tuple[torch.Tensor, ...]:
        """(w1, w2, w3) of expert ``e`` on the device tier: static, or a view into ``slot``."""
        if e in self.static[layer]:
            return self.static[layer][e].tensors()
        base = self.offloaded[layer].index(e) * self.expert_numel
        out, offset = [], base
        for shape in self.shapes:
            numel = shape[0] * shape[1]
            out.append(self.buffer[slot, offset: offset + numel].view(shape))
            offset += numel
        return tuple(out)

    def host_expert(self, layer: int, e: int) -> tuple[torch.Tensor, ...]:
        """(w1, w2, w3) in host memory (CPU experts when ffn runs on the CPU)."""
        return self.host_experts[layer][e].tensors()
