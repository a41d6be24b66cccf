"""Kernels shared by the plain forward pass and the plan executor.

Every function is pure torch on whatever device its inputs live on, so the reference
model (:mod:`runtime.model`) and the offloaded executor (:mod:`runtime.executor`) compute
the same math; only *where* and *in which order* differs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm (Mixtral): x / sqrt(mean(x²) + eps) · weight, computed in fp32."""
    x32 = x.float()
    out = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (out * weight.float()).to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [T, head_dim] for integer ``positions`` [T] (HF rotate-half layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim))
    freqs = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [T, heads, d] by per-token cos/sin [T, d] (rotate_half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked GQA attention. q [B, nq, Tq, d]; k, v [B, nkv, Tk, d]; mask [B, Tq, Tk] (True =
    attend). Returns [B, nq, Tq, d]. Softmax in fp32; query heads grouped per KV head."""
    b, nq, tq, d = q.shape
    nkv = k.shape[1]
    group = nq // nkv
    qg = q.reshape(b, nkv, group * tq, d)
    scores = torch.matmul(qg.float(), k.float().transpose(-1, -2)) / (d ** 0.5)
    scores = scores.reshape(b, nkv, group, tq, -1)
    scores = scores.masked_fill(~mask[:, None, None, :, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).reshape(b, nkv, group * tq, -1)
    out = torch.matmul(probs, v.float())
    return out.reshape(b, nq, tq, d).to(q.dtype)


def swiglu(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor) -> torch.Tensor:
    """SwiGLU MLP: w2 · (silu(w1 · x) ⊙ w3 · x); weights in HF [out, in] layout."""
    return F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2)


def route(x: torch.Tensor, router: torch.Tensor, top_k: int,
          bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k softmax router with top-k renormalisation (Mixtral). ``bias`` [ne] (fp32) is
    added to the logits before softmax/top-k (the skewed test router of random weights,
    :func:`runtime.model.router_skew_bias`). Returns (expert ids [T, k] int64, weights
    [T, k] in x's dtype)."""
    logits = F.linear(x, router).float()
    if bias is not None:  # None keeps the unbiased router bit-identical (no extra op at all)
        logits = logits + bias.float()
    probs = torch.softmax(logits, dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids, weights.to(x.dtype)


def routed_experts(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, expert, experts=None) -> torch.Tensor:
    """Σ_k weight·expert_k(x) per token. ``expert(e)`` returns (w1, w2, w3) of expert e;
    ``experts`` restricts the loop to a subset (the rest contribute nothing here)."""
    out = torch.zeros_like(x)
    wanted = None if experts is None else set(int(e) for e in experts)
    for e in torch.unique(ids).tolist():
        if wanted is not None and e not in wanted:
            continue
        token_idx, slot = torch.nonzero(ids == e, as_tuple=True)
        y = swiglu(x[token_idx], *expert(e))
        out.index_add_(0, token_idx, y * weights[token_idx, slot, None])
    return out


def shared_experts(x: torch.Tensor, w1, w2, w3, gate=None) -> torch.Tensor:
    """Shared (always-on) experts, optionally scaled by sigmoid(gate · x) (Qwen2-MoE)."""
    y = swiglu(x, w1, w2, w3)
    if gate is not None:
        y = torch.sigmoid(F.linear(x, gate)) * y
    return y
