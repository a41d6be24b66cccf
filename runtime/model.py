"""A Mixtral-architecture decoder built from a :class:`hrm.model.spec.ModelSpec`, and the plain
single-device forward pass that every offloaded execution must reproduce (docs/model.md §8).

Architecture: token embedding; per layer RMSNorm → GQA attention with RoPE → residual →
RMSNorm → MoE (top-k softmax router with top-k renormalisation, SwiGLU experts, shared
experts with an optional sigmoid gate) or a dense SwiGLU MLP for DeepSeek's first
``first_dense_layers`` → residual; final RMSNorm and lm_head. MLA (DeepSeek-V2) is refused.

Weights are deterministic random numbers from a seed, or a safetensors checkpoint with the
Hugging Face Mixtral tensor names (:data:`HF_NAMES`).

Skewed router (a test option of random weights, ``router_skew`` S ≥ 0): random routers
spread tokens evenly over the experts, so expert-popularity skew — what hot-expert caches
and the planner's ``--routing`` distributions are about — would not exist. With S > 0 every
MoE layer gets a fixed logit bias b_e = −S·ln(e + 1) (a Zipf-like prior, expert 0 hottest),
added to the router logits before softmax/top-k. S = 0 adds no tensor: weights, expert ids
and outputs are bit-identical to a build without the option.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


import torch
import torch.nn.functional as F

from hrm.errors import HRMError
from hrm.model.spec import ModelSpec
from hrm.units import GIB

from . import ops

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype the runtime computes in for a spec dtype (int8/int4 are refused)."""
    if name not in TORCH_DTYPES:
        raise HRMError(f"the reference runtime computes in fp32/fp16/bf16, not {name} (use --weight-dtype fp32)")
    return TORCH_DTYPES[name]


def check_supported(spec: ModelSpec) -> None:
    """One-line refusal for architectures the runtime does not build."""
    if spec.is_mla:
        raise HRMError(f"{spec.name}: MLA attention (kv_lora_rank) is not supported by the reference runtime")
    if spec.head_dim % 2:
        raise HRMError(f"{spec.name}: RoPE needs an even head_dim, got {spec.head_dim}")


@dataclass
class Expert:
    """One SwiGLU expert in HF layout: w1 (gate) [h2, h], w2 (down) [h, h2], w3 (up) [h2, h]."""

    w1: torch.Tensor
    w2: torch.Tensor
    w3: torch.Tensor

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.w1, self.w2, self.w3

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


@dataclass
class LayerWeights:
    """Weights of one decoder layer. ``experts`` is empty for a dense layer (``mlp`` set)."""

    attn_norm: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    ffn_norm: torch.Tensor
    router: Optional[torch.Tensor] = None
    #: [ne] fp32 logit bias of the skewed test router (random weights only; not an HF tensor)
    router_bias: Optional[torch.Tensor] = None
    experts: list[Expert] = field(default_factory=list)
    shared: Optional[Expert] = None
    shared_gate: Optional[torch.Tensor] = None
    mlp: Optional[Expert] = None

    @property
    def is_moe(self) -> bool:
        return bool(self.experts)

    def static_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor except the routed experts (the part that always sits on the device tier)."""
        out = {"attn_norm": self.attn_norm, "wq": self.wq, "wk": self.wk, "wv": self.wv, "wo": self.wo,
               "ffn_norm": self.ffn_norm}
        if self.router is not None:
            out["router"] = self.router
        if self.router_bias is not None:
            out["router_bias"] = self.router_bias
        for prefix, exp in (("shared", self.shared), ("mlp", self.mlp)):
            if exp is not None:
                out.update({f"{prefix}.w1": exp.w1, f"{prefix}.w2": exp.w2, f"{prefix}.w3": exp.w3})
        if self.shared_gate is not None:
            out["shared_gate"] = self.shared_gate
        return out


@dataclass
class ModelWeights:
    embed: torch.Tensor
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head: torch.Tensor


# --- deterministic random weights -------------------------------------------------------

def _linear(gen, out_dim: int, in_dim: int, dtype) -> torch.Tensor:
    return (torch.randn(out_dim, in_dim, generator=gen) / in_dim ** 0.5).to(dtype)


def _norm(gen, dim: int, dtype) -> torch.Tensor:
    return (1.0 + 0.1 * torch.randn(dim, generator=gen)).to(dtype)


def _expert(gen, hidden: int, inter: int, dtype) -> Expert:
    return Expert(_linear(gen, inter, hidden, dtype), _linear(gen, hidden, inter, dtype), _linear(gen, inter, hidden, dtype))


def router_skew_bias(num_experts: int, skew: float) -> torch.Tensor:
    """Logit bias b_e = −S·ln(e + 1) of the skewed test router, fp32 [num_experts]: exp(b_e)
    = (e + 1)^−S, a Zipf prior on the router's choice (expert 0 hottest). Kept in fp32
    whatever the weight dtype, since the router's softmax is computed in fp32."""
    return -float(skew) * torch.log(torch.arange(1, num_experts + 1, dtype=torch.float32))


def check_router_skew(skew: float) -> float:
    """S as a float, or a one-line HRMError when it is outside :data:`hrm.bounds.ROUTER_SKEW`."""
    from hrm import bounds

    return bounds.ROUTER_SKEW.check(skew, "router skew")


def _random_layer(gen, spec: ModelSpec, index: int, dtype, router_skew: float = 0.0) -> LayerWeights:
    h = spec.hidden_size
    layer = LayerWeights(
        attn_norm=_norm(gen, h, dtype), wq=_linear(gen, spec.q_dim, h, dtype), wk=_linear(gen, spec.kv_dim, h, dtype),
        wv=_linear(gen, spec.kv_dim, h, dtype), wo=_linear(gen, h, spec.attn_out_dim, dtype), ffn_norm=_norm(gen, h, dtype),
    )
    if index < spec.first_dense_layers:
        layer.mlp = _expert(gen, h, spec.dense_intermediate_size, dtype)
        return layer
    if spec.num_experts > 1:  # a dense model is a one-expert MoE without a router
        # a router with a wide logit spread so that top-k choices are far from ties
        layer.router = (_linear(gen, spec.num_experts, h, torch.float32) * 4.0).to(dtype)
        if router_skew > 0:  # drawn from no generator: every other weight stays as with S = 0
            layer.router_bias = router_skew_bias(spec.num_experts, router_skew)
    layer.experts = [_expert(gen, h, spec.expert_intermediate_size, dtype) for _ in range(spec.num_experts)]
    if spec.shared_intermediate_size:
        layer.shared = _expert(gen, h, spec.shared_intermediate_size, dtype)
        if spec.shared_expert_gate:
            layer.shared_gate = _linear(gen, 1, h, dtype)
    return layer


def random_weights(spec: ModelSpec, seed: int = 0, dtype: Optional[torch.dtype] = None,
                   router_skew: float = 0.0) -> ModelWeights:
    """Deterministic random weights (CPU) for ``spec`` from ``seed``; dtype from the spec.
    ``router_skew`` S > 0 biases every router towards low expert ids (module docstring)."""
    check_supported(spec)
    router_skew = check_router_skew(router_skew)
    dtype = dtype or torch_dtype(spec.weight_dtype)
    gen = torch.Generator().manual_seed(seed)
    h, v = spec.hidden_size, spec.vocab_size
    embed = torch.randn(v, h, generator=gen).to(dtype)
    layers = [_random_layer(gen, spec, i, dtype, router_skew) for i in range(spec.num_layers)]
    final_norm = _norm(gen, h, dtype)
    lm_head = embed if spec.tie_embeddings else _linear(gen, v, h, dtype)
    return ModelWeights(embed, layers, final_norm, lm_head)


# --- safetensors (Hugging Face Mixtral names) --------------------------------------------

HF_NAMES = {
    "embed": "model.embed_tokens.weight",
    "final_norm": "model.norm.weight",
    "lm_head": "lm_head.weight",
    "attn_norm": "model.layers.{i}.input_layernorm.weight",
    "wq": "model.layers.{i}.self_attn.q_proj.weight",
    "wk": "model.layers.{i}.self_attn.k_proj.weight",
    "wv": "model.layers.{i}.self_attn.v_proj.weight",
    "wo": "model.layers.{i}.self_attn.o_proj.weight",
    "ffn_norm": "model.layers.{i}.post_attention_layernorm.weight",
    "router": "model.layers.{i}.block_sparse_moe.gate.weight",
    "expert": "model.layers.{i}.block_sparse_moe.experts.{e}.{w}.weight",
    "shared": "model.layers.{i}.mlp.shared_expert.{proj}.weight",
    "shared_gate": "model.layers.{i}.mlp.shared_expert_gate.weight",
    "mlp": "model.layers.{i}.mlp.{proj}.weight",
}
# accepted alternatives (Qwen-MoE / DeepSeek / OLMoE layouts)
HF_ALTERNATIVES = {
    "router": ["model.layers.{i}.mlp.gate.weight"],
    "shared": ["model.layers.{i}.mlp.shared_experts.{proj}.weight"],
}
PROJ = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}


def _expert_names(key: str, i: int, e: Optional[int] = None) -> dict[str, list[str]]:
    """Candidate tensor names for w1/w2/w3 of an expert-shaped MLP."""
    out = {}
    for w, proj in PROJ.items():
        if key == "expert":
            out[w] = [HF_NAMES["expert"].format(i=i, e=e, w=w), f"model.layers.{i}.mlp.experts.{e}.{proj}.weight"]
        else:
            out[w] = [n.format(i=i, proj=proj) for n in [HF_NAMES[key], *HF_ALTERNATIVES.get(key, [])]]
    return out


def to_state_dict(spec: ModelSpec, weights: ModelWeights) -> dict[str, torch.Tensor]:
    """Tensors under their Hugging Face Mixtral names (what :func:`load_safetensors` reads).
    Refuses weights with a skewed test router: its bias has no HF name, and a checkpoint
    without it would silently route like the unskewed model."""
    if any(layer.router_bias is not None for layer in weights.layers):
        raise HRMError("weights with a router skew (a test option of random weights) have no Hugging Face "
                       "checkpoint form: the router bias is not an HF tensor")
    sd = {HF_NAMES["embed"]: weights.embed, HF_NAMES["final_norm"]: weights.final_norm}
    if not spec.tie_embeddings:
        sd[HF_NAMES["lm_head"]] = weights.lm_head
    for i, layer in enumerate(weights.layers):
        for key in ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm"):
            sd[HF_NAMES[key].format(i=i)] = getattr(layer, key)
        if layer.router is not None:
            sd[HF_NAMES["router"].format(i=i)] = layer.router
        for e, exp in enumerate(layer.experts):
            for w in PROJ:
                sd[HF_NAMES["expert"].format(i=i, e=e, w=w)] = getattr(exp, w)
        for key, exp in (("shared", layer.shared), ("mlp", layer.mlp)):
            if exp is not None:
                for w, proj in PROJ.items():
                    sd[HF_NAMES[key].format(i=i, proj=proj)] = getattr(exp, w)
        if layer.shared_gate is not None:
            sd[HF_NAMES["shared_gate"].format(i=i)] = layer.shared_gate
    return {k: v.contiguous() for k, v in sd.items()}


def save_safetensors(spec: ModelSpec, weights: ModelWeights, path: str | Path) -> None:
    from safetensors.torch import save_file

    sd = to_state_dict(spec, weights)
    if spec.tie_embeddings:
        sd[HF_NAMES["embed"]] = sd[HF_NAMES["embed"]].clone()
    save_file(sd, str(path))


class _Checkpoint:
    """Reads named tensors from one safetensors file (or a folder of shards) with shape checks."""

    def __init__(self, path: str | Path, dtype):
        try:
            from safetensors import safe_open
        except ImportError:
            raise HRMError("loading a checkpoint needs safetensors (pip install safetensors)") from None
        path = Path(path)
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        if not files or not all(f.exists() for f in files):
            raise HRMError(f"{path}: no safetensors checkpoint found")
        self.dtype, self.index, self.path = dtype, {}, path
        for f in files:
            try:
                handle = safe_open(str(f), framework="pt")
            except Exception as exc:  # safetensors raises its own error types
                raise HRMError(f"{f}: not a safetensors file ({exc})") from None
            for name in handle.keys():
                self.index[name] = handle

    def get(self, names: list[str] | str, shape: tuple[int, ...]) -> torch.Tensor:
        names = [names] if isinstance(names, str) else names
        for name in names:
            if name in self.index:
                tensor = self.index[name].get_tensor(name)
                if tuple(tensor.shape) != tuple(shape):
                    raise HRMError(f"{self.path}: {name} has shape {tuple(tensor.shape)}, the spec needs {tuple(shape)}")
                return finite_tensor(tensor, tensor.to(self.dtype), f"{self.path}: {name}")
        raise HRMError(f"{self.path}: missing tensor {names[0]}")

    def has(self, names: list[str]) -> bool:
        return any(n in self.index for n in names)


def finite_tensor(stored: torch.Tensor, converted: torch.Tensor, what: str) -> torch.Tensor:
    """``converted`` (``stored`` in the compute dtype) when every value is finite; else a
    one-line HRMError naming ``what``: NaN or inf in the checkpoint (a run would turn every
    logit into NaN), or finite values beyond the compute dtype's range (fp16 overflows at 65504)."""
    if not converted.is_floating_point() or bool(torch.isfinite(converted).all()):
        return converted
    if stored.is_floating_point() and not bool(torch.isfinite(stored).all()):
        bad = int((~torch.isfinite(stored)).sum())
        kinds = "NaN" if bool(torch.isnan(stored).any()) else "inf"
        raise HRMError(f"{what}: {bad} of {stored.numel()} values are not finite ({kinds}); a corrupt checkpoint?")
    largest = float(stored.abs().max())
    raise HRMError(f"{what}: values up to {largest:.4g} overflow {str(converted.dtype).removeprefix('torch.')} "
                   f"(its largest is {torch.finfo(converted.dtype).max:.4g}); plan the model in fp32 (--weight-dtype fp32)")


def _load_expert(ckpt: _Checkpoint, names: dict[str, list[str]], h: int, inter: int) -> Expert:
    return Expert(ckpt.get(names["w1"], (inter, h)), ckpt.get(names["w2"], (h, inter)), ckpt.get(names["w3"], (inter, h)))


def load_safetensors(spec: ModelSpec, path: str | Path, dtype: Optional[torch.dtype] = None) -> ModelWeights:
    """Weights from a safetensors checkpoint with Hugging Face Mixtral tensor names."""
    check_supported(spec)
    dtype = dtype or torch_dtype(spec.weight_dtype)
    ckpt = _Checkpoint(path, dtype)
    h, v = spec.hidden_size, spec.vocab_size
    embed = ckpt.get(HF_NAMES["embed"], (v, h))
    layers = []
    for i in range(spec.num_layers):
        layer = LayerWeights(
            attn_norm=ckpt.get(HF_NAMES["attn_norm"].format(i=i), (h,)),
            wq=ckpt.get(HF_NAMES["wq"].format(i=i), (spec.q_dim, h)),
            wk=ckpt.get(HF_NAMES["wk"].format(i=i), (spec.kv_dim, h)),
            wv=ckpt.get(HF_NAMES["wv"].format(i=i), (spec.kv_dim, h)),
            wo=ckpt.get(HF_NAMES["wo"].format(i=i), (h, spec.attn_out_dim)),
            ffn_norm=ckpt.get(HF_NAMES["ffn_norm"].format(i=i), (h,)),
        )
        if i < spec.first_dense_layers:
            layer.mlp = _load_expert(ckpt, _expert_names("mlp", i), h, spec.dense_intermediate_size)
        else:
            router_names = [HF_NAMES["router"].format(i=i)] + [n.format(i=i) for n in HF_ALTERNATIVES["router"]]
            if spec.num_experts > 1:
                layer.router = ckpt.get(router_names, (spec.num_experts, h))
            layer.experts = [_load_expert(ckpt, _expert_names("expert", i, e), h, spec.expert_intermediate_size)
                             for e in range(spec.num_experts)]
            if spec.shared_intermediate_size:
                layer.shared = _load_expert(ckpt, _expert_names("shared", i), h, spec.shared_intermediate_size)
                if spec.shared_expert_gate:
                    layer.shared_gate = ckpt.get(HF_NAMES["shared_gate"].format(i=i), (1, h))
        layers.append(layer)
    final_norm = ckpt.get(HF_NAMES["final_norm"], (h,))
    lm_head = embed if spec.tie_embeddings else ckpt.get(HF_NAMES["lm_head"], (v, h))
    return ModelWeights(embed, layers, final_norm, lm_head)


def host_memory_bytes() -> Optional[int]:
    """Physical memory of this host (None where the OS does not say)."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits_host(spec: ModelSpec, fraction: float = 0.8) -> None:
    """Refuse (one line) a model whose weights alone would not fit in host memory."""
    from hrm.cost.costs import total_params

    need = total_params(spec) * torch.empty(0, dtype=torch_dtype(spec.weight_dtype)).element_size()
    have = host_memory_bytes()
    if have and need > fraction * have:
        raise HRMError(f"{spec.name}: its weights need {need / GIB:.1f} GiB of host memory, this host has "
                       f"{have / GIB:.1f} GiB; run a smaller model (e.g. tiny-mixtral, small-mixtral)")


def check_skew_source(checkpoint: Optional[str], router_skew: float) -> None:
    """Refuse a router skew with a checkpoint (one line) rather than ignore it: the skew is a
    bias of the random test router, a trained router has its own popularity."""
    if checkpoint and router_skew:
        raise HRMError("--router-skew is a test option of random weights; it cannot be used with --checkpoint")


def build_weights(spec: ModelSpec, checkpoint: Optional[str] = None, seed: int = 0,
                  router_skew: float = 0.0) -> ModelWeights:
    """Weights from ``checkpoint`` when given, else deterministic random from ``seed``
    (with ``router_skew``: random weights only, refused with a checkpoint)."""
    check_supported(spec)
    check_skew_source(checkpoint, router_skew)
    check_fits_host(spec)
    return load_safetensors(spec, checkpoint) if checkpoint else random_weights(spec, seed, router_skew=router_skew)


# --- the layer math, shared by the reference and the executor -----------------------------

def qkv(spec: ModelSpec, layer: LayerWeights, x: torch.Tensor, positions: torch.Tensor):
    """PreAttn: RMSNorm + Q/K/V projections + RoPE for tokens x [T, h] at ``positions`` [T].
    Returns q [T, nq, d], k [T, nkv, d], v [T, nkv, d]."""
    normed = ops.rms_norm(x, layer.attn_norm, spec.rms_norm_eps)
    t, d = x.shape[0], spec.head_dim
    q = F.linear(normed, layer.wq).view(t, spec.num_heads, d)
    k = F.linear(normed, layer.wk).view(t, spec.num_kv_heads, d)
    v = F.linear(normed, layer.wv).view(t, spec.num_kv_heads, d)
    cos, sin = ops.rope_cos_sin(positions, d, spec.rope_theta, x.dtype)
    return ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin), v


def post_attention_static(spec: ModelSpec, layer: LayerWeights, x: torch.Tensor, attn_out: torch.Tensor):
    """PostAttn up to the routed experts: O projection + residual, RMSNorm, router, shared
    experts / dense MLP. Returns (residual h, normed input of the FFN, partial FFN output,
    expert ids, expert weights); ids/weights are None for a dense layer (``layer.mlp`` set)."""
    h = x + F.linear(attn_out, layer.wo)
    normed = ops.rms_norm(h, layer.ffn_norm, spec.rms_norm_eps)
    if layer.mlp is not None:
        return h, normed, ops.swiglu(normed, *layer.mlp.tensors()), None, None
    if layer.router is None:  # one expert: every token goes to it with weight 1
        ids = torch.zeros(normed.shape[0], 1, dtype=torch.long, device=normed.device)
        weights = torch.ones(normed.shape[0], 1, dtype=normed.dtype, device=normed.device)
    else:
        ids, weights = ops.route(normed, layer.router, spec.top_k, bias=layer.router_bias)
    partial = torch.zeros_like(normed)
    if layer.shared is not None:
        partial = ops.shared_experts(normed, *layer.shared.tensors(), gate=layer.shared_gate)
    return h, normed, partial, ids, weights


def final_logits(spec: ModelSpec, weights: ModelWeights, x: torch.Tensor) -> torch.Tensor:
    """Final RMSNorm + lm_head, logits in fp32."""
    return F.linear(ops.rms_norm(x, weights.final_norm, spec.rms_norm_eps), weights.lm_head).float()


# --- the plain single-device forward pass (the reference) ----------------------------------

class ReferenceModel:
    """Plain forward: one request at a time, every weight on one device, a growing KV cache."""

    def __init__(self, spec: ModelSpec, weights: ModelWeights):
        check_supported(spec)
        self.spec, self.weights = spec, weights

    def _layer(self, layer: LayerWeights, x, positions, cache):
        q, k, v = qkv(self.spec, layer, x, positions)
        cache["k"] = k if cache.get("k") is None else torch.cat([cache["k"], k])
        cache["v"] = v if cache.get("v") is None else torch.cat([cache["v"], v])
        keys, values = cache["k"], cache["v"]
        t, s = x.shape[0], keys.shape[0]
        q_pos = positions[:, None]
        mask = (torch.arange(s)[None, :] <= q_pos)[None]
        out = ops.attend(q.permute(1, 0, 2)[None], keys.permute(1, 0, 2)[None], values.permute(1, 0, 2)[None], mask)
        attn_out = out[0].permute(1, 0, 2).reshape(t, -1)
        h, normed, partial, ids, wts = post_attention_static(self.spec, layer, x, attn_out)
        if ids is not None:
            partial = partial + ops.routed_experts(normed, ids, wts, lambda e: layer.experts[e].tensors())
        return h + partial

    def forward(self, tokens: torch.Tensor, start: int, caches: list[dict]) -> torch.Tensor:
        """Logits [T, V] of ``tokens`` [T] placed at positions start.. start+T-1."""
        x = self.weights.embed[tokens]
        positions = torch.arange(start, start + tokens.shape[0])
        for layer, cache in zip(self.weights.layers, caches):
            x = self._layer(layer, x, positions, cache)
        return final_logits(self.spec, self.weights, x)

    @torch.no_grad()
    def generate(self, prompt: list[int], gen_len: int) -> tuple[list[int], torch.Tensor]:
        """Greedy generation: ``gen_len`` tokens (the first from the prefill, then gen_len − 1
        decode steps) and their logits [gen_len, V]."""
        caches = [{} for _ in self.weights.layers]
        logits = self.forward(torch.tensor(prompt, dtype=torch.long), 0, caches)[-1:]
        steps, tokens = [logits[0]], [int(logits[0].argmax())]
        for t in range(1, gen_len):
            logits = self.forward(torch.tensor(tokens[-1:]), len(prompt) + t - 1, caches)
            steps.append(logits[0])
            tokens.append(int(logits[0].argmax()))
        return tokens, torch.stack(steps)
