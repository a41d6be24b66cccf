"""Policy (SPEC §3; paper Table 1 plus n): N, μ, n = N/μ, A_g, F_g, r_w, r_c."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .errors import HRMError


class Policy(BaseModel):
    """An offloading policy. ``batch_size`` N counts sequences (tokens per decode pass of the
    whole model); ``micro_batch_size`` μ is one GPU kernel's batch; ``num_micro_batches``
    n = N/μ. ``weights_gpu_ratio`` r_w is the fraction of routed-expert weights kept on the
    GPU statically; ``kv_gpu_ratio`` r_c the fraction of the KV cache kept on the GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_size: int = Field(gt=0)
    micro_batch_size: int = Field(gt=0)
    num_micro_batches: int = Field(gt=0)
    attn_on_gpu: bool = False
    ffn_on_gpu: bool = True
    weights_gpu_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    kv_gpu_ratio: float = Field(default=0.0, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _n_times_mu(self):
        if self.batch_size != self.micro_batch_size * self.num_micro_batches:
            raise ValueError(
                f"batch_size ({self.batch_size}) != micro_batch_size ({self.micro_batch_size})"
                f" x num_micro_batches ({self.num_micro_batches})"
            )
        return self

    def short(self) -> str:
        """The policy in the string form :func:`parse_policy` reads."""
        return (
            f"N={self.batch_size},mu={self.micro_batch_size},n={self.num_micro_batches},"
            f"attn={'gpu' if self.attn_on_gpu else 'cpu'},ffn={'gpu' if self.ffn_on_gpu else 'cpu'},"
            f"rw={self.weights_gpu_ratio:.4g},rc={self.kv_gpu_ratio:.4g}"
        )


POLICY_KEYS = {
    "n": "num_micro_batches", "mu": "micro_batch_size", "μ": "micro_batch_size",
    "rw": "weights_gpu_ratio", "rc": "kv_gpu_ratio", "attn": "attn_on_gpu", "ffn": "ffn_on_gpu",
}
POLICY_KEYS.update({v: v for v in set(POLICY_KEYS.values()) | {"batch_size"}})
TIERS = {"gpu": True, "cpu": False, "1": True, "0": False, "true": True, "false": False}


def parse_assignments(text: str, what: str = "policy") -> dict:
    """Parse ``N=512,mu=64,attn=cpu,rw=0.1`` (commas or spaces) into Policy field names.

    ``N`` is the batch size and ``n`` the number of micro-batches (case matters for these).
    """
    out: dict = {}
    for item in text.replace(",", " ").split():
        if "=" not in item:
            raise HRMError(f"{what}: '{item}' is not KEY=VALUE (keys: N, mu, n, attn, ffn, rw, rc)")
        key, value = (s.strip() for s in item.split("=", 1))
        field = "batch_size" if key == "N" else POLICY_KEYS.get(key if key == "n" else key.lower())
        if field is None:
            import difflib

            close = difflib.get_close_matches(key, ["N", "mu", "n", "attn", "ffn", "rw", "rc"], n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise HRMError(f"{what}: unknown key '{key}' (keys: N, mu, n, attn, ffn, rw, rc){hint}")
        try:
            if field in ("attn_on_gpu", "ffn_on_gpu"):
                if value.lower() not in TIERS:
                    raise ValueError
                out[field] = TIERS[value.lower()]
            elif field in ("weights_gpu_ratio", "kv_gpu_ratio"):
                out[field] = float(value)
                if not 0.0 <= out[field] <= 1.0:
                    raise HRMError(f"{what}: {key}={value} must lie in [0, 1]")
            else:
                out[field] = int(value)
                if out[field] <= 0:
                    raise HRMError(f"{what}: {key}={value} must be a positive integer")
        except ValueError:
            kind = "gpu or cpu" if field in ("attn_on_gpu", "ffn_on_gpu") else "a number"
            raise HRMError(f"{what}: {key}={value!r} is not {kind}") from None
    return out


def parse_policy(text: str) -> Policy:
    """A full Policy from a string; two of N, mu, n are enough (the third is derived)."""
    fields = parse_assignments(text)
    big, mu, n = (fields.get(k) for k in ("batch_size", "micro_batch_size", "num_micro_batches"))
    if mu is None and big is not None and n is not None:
        if big % n:
            raise HRMError(f"policy: N={big} is not a multiple of n={n}")
        fields["micro_batch_size"] = big // n
    elif n is None and big is not None and mu is not None:
        if big % mu:
            raise HRMError(f"policy: N={big} is not a multiple of mu={mu}")
        fields["num_micro_batches"] = big // mu
    elif big is None and mu is not None and n is not None:
        fields["batch_size"] = mu * n
    elif big is None or mu is None or n is None:
        raise HRMError("policy: give two of N (batch size), mu (micro-batch size), n (micro-batches)")
    if not fields.get("attn_on_gpu", False) and fields.get("kv_gpu_ratio", 0.0) > 0:
        raise HRMError("policy: rc > 0 needs attn=gpu (CPU attention reads the KV cache in CPU memory)")
    if not fields.get("ffn_on_gpu", True) and fields.get("weights_gpu_ratio", 0.0) > 0:
        raise HRMError("policy: rw > 0 needs ffn=gpu (CPU experts read their weights in CPU memory)")
    try:
        return Policy(**fields)
    except Exception as exc:  # pydantic ValidationError: one line
        from .errors import pydantic_message

        raise HRMError(pydantic_message("policy", exc)) from None
