"""A micro-batch's sequences laid out in KV-cache slots, and its KV cache per layer.

Slot layout of sequence i: its prompt occupies slots [0, P_i) — P_i is the padded length
(left padding, pad slots masked) or the prompt length (variable-length batching) — and the
input token of decode step s (1..gen−1) goes to slot P_i + s − 1. RoPE positions count real
tokens only, so a padded or packed sequence sees exactly the positions of a lone request.

KV cache of one (layer, micro-batch): slots [0, D) on the device tier, [D, cap) in host
memory, D = round(r_c · cap) (r_c = kv_gpu_ratio; 0 with CPU attention). Layout
[b, slot, nkv, d] so that a sequence's run of slots is one contiguous block.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hrm.model.spec import ModelSpec

from .device import DeviceTier
from .requests import Request

PAD_TOKEN = 0


@dataclass
class MicroBatch:
    index: int
    requests: list[Request]
    prompt_lens: torch.Tensor  # [b] real prompt tokens
    slots: torch.Tensor  # [b] P_i: prompt slots (padded or real length)
    pads: torch.Tensor  # [b] leading pad slots
    capacity: int  # slots needed: max P_i + gen_len − 1
    valid: torch.Tensor  # [b, capacity] bool: a slot holds a real token once written
    tokens: torch.Tensor  # packed prompt tokens [Σ P_i] (pads included)
    positions: torch.Tensor  # packed RoPE positions [Σ P_i]
    offsets: list[int]  # start of each sequence in the packed tokens
    device: dict = field(default_factory=dict)  # device-tier copies of small index tensors

    @property
    def size(self) -> int:
        return len(self.requests)

    @property
    def prompt_tokens(self) -> int:
        return int(self.slots.sum())

    def decode_slots(self, step: int) -> torch.Tensor:
        """Slot of each sequence's input token at decode step ``step`` (1-based)."""
        return self.slots + (step - 1)

    def decode_positions(self, step: int) -> torch.Tensor:
        return self.prompt_lens + (step - 1)


def make_micro_batch(index: int, requests: list[Request], gen_len: int, pad_to: int | None) -> MicroBatch:
    """Lay out ``requests``; ``pad_to`` = max_prompt_len when padding, else None (packed)."""
    lens = [r.input_len for r in requests]
    slots = [pad_to if pad_to else n for n in lens]
    pads = [s - n for s, n in zip(slots, lens)]
    cap = max(slots) + max(gen_len - 1, 0)
    valid = torch.ones(len(requests), max(cap, 1), dtype=torch.bool)
    tokens, positions, offsets, start = [], [], [], 0
    for i, (req, pad, slot) in enumerate(zip(requests, pads, slots)):
        valid[i, :pad] = False
        tokens += [PAD_TOKEN] * pad + list(req.prompt)
        positions += [0] * pad + list(range(req.input_len))
        offsets.append(start)
        start += slot
    return MicroBatch(index, list(requests), torch.tensor(lens), torch.tensor(slots), torch.tensor(pads), cap, valid,
                      torch.tensor(tokens, dtype=torch.long), torch.tensor(positions, dtype=torch.long), offsets)


def to_device(mb: MicroBatch, tier: DeviceTier) -> None:
    """Device-tier copies of the index tensors the device tasks read (persistent, tiny)."""
    for name in ("prompt_lens", "slots", "valid"):
        mb.device[name] = tier.alloc(getattr(mb, name))


class KVCache:
    """K and V of one layer for one micro-batch, split at slot D between the tiers."""

    def __init__(self, spec: ModelSpec, mb: MicroBatch, kv_gpu_ratio: float, dtype, tier: DeviceTier):
        self.device_slots = int(round(kv_gpu_ratio * mb.capacity))
        shape = (mb.size, spec.num_kv_heads, spec.head_dim)
        host = (mb.size, mb.capacity - self.device_slots, *shape[1:])
        self.host_k = tier.pin(torch.zeros(host, dtype=dtype))
        self.host_v = tier.pin(torch.zeros(host, dtype=dtype))
        dev = (mb.size, self.device_slots, *shape[1:])
        self.dev_k = tier.empty(dev, dtype) if self.device_slots else None
        self.dev_v = tier.empty(dev, dtype) if self.device_slots else None

    def release(self, tier: DeviceTier) -> None:
        tier.free(self.dev_k)
        tier.free(self.dev_v)
        self.dev_k = self.dev_v = None
