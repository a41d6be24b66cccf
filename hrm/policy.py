"""Policy (docs/model.md §3.4; paper Table 1 plus n): N, μ, n = N/μ, A_g, F_g, r_w, r_c."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, model_validator

from . import bounds
from .bounds import Flag
from .errors import HRMError


def policy_refusal(fields: dict) -> str | None:
    """The policy rules, in one place: N = mu x n; rc > 0 needs attn=gpu; rw > 0 needs
    ffn=gpu. ``fields`` (Policy field names) may be partial — ``hrm-search --fix`` pins part
    of a policy — and then only the rules whose fields are all given apply."""
    batch_size, mu, n = (fields.get(k) for k in ("batch_size", "micro_batch_size", "num_micro_batches"))
    if batch_size is not None and mu is not None and n is not None:
        if batch_size != mu * n:
            return f"N={batch_size} != mu={mu} x n={n} (N is the batch, mu the micro-batch, n the micro-batches)"
    elif batch_size is not None and mu is not None and batch_size % mu:
        return f"N={batch_size} is not a multiple of mu={mu}"
    elif batch_size is not None and n is not None and batch_size % n:
        return f"N={batch_size} is not a multiple of n={n}"
    if fields.get("attn_on_gpu") is False and (fields.get("kv_gpu_ratio") or 0) > 0:
        return "rc > 0 needs attn=gpu (CPU attention reads the KV cache in CPU memory)"
    if fields.get("ffn_on_gpu") is False and (fields.get("weights_gpu_ratio") or 0) > 0:
        return "rw > 0 needs ffn=gpu (CPU experts read their weights in CPU memory)"
    return None


class Policy(BaseModel):
    """An offloading policy. ``batch_size`` N counts sequences (tokens per decode pass of the
    whole model); ``micro_batch_size`` μ is one GPU kernel's batch; ``num_micro_batches``
    n = N/μ. ``weights_gpu_ratio`` r_w is the fraction of routed-expert weights kept on the
    GPU statically; ``kv_gpu_ratio`` r_c the fraction of the KV cache kept on the GPU.
    Ranges: :mod:`hrm.bounds`; rules (N = μ·n, r_c needs GPU attention, r_w GPU experts):
    :func:`policy_refusal`, checked on every construction."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_size: bounds.SEQUENCES.type
    micro_batch_size: bounds.SEQUENCES.type
    num_micro_batches: bounds.SEQUENCES.type
    attn_on_gpu: Flag = False
    ffn_on_gpu: Flag = True
    weights_gpu_ratio: bounds.FRACTION.type = 0.0
    kv_gpu_ratio: bounds.FRACTION.type = 0.0

    @model_validator(mode="after")
    def _rules(self):
        refusal = policy_refusal(dict(self))
        if refusal:
            raise ValueError(refusal)
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
    Values are checked against :mod:`hrm.bounds`; a key given twice (``mu=36 mu=48``) is refused.
    """
    out: dict = {}
    given: dict = {}
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
        if field in given:
            raise HRMError(f"{what}: {key} given twice ({given[field]} and {item}); give each key once")
        given[field] = item
        if field in ("attn_on_gpu", "ffn_on_gpu"):
            if value.lower() not in TIERS:
                raise HRMError(f"{what}: {key}={value!r} is not gpu or cpu")
            out[field] = TIERS[value.lower()]
            continue
        rng = bounds.FRACTION if field in ("weights_gpu_ratio", "kv_gpu_ratio") else bounds.SEQUENCES
        try:
            number = bounds.parse_number(value, integer=rng is not bounds.FRACTION)
        except ValueError:
            kind = "a number" if rng is bounds.FRACTION else "an integer"
            raise HRMError(f"{what}: {key}={value!r} is not {kind}") from None
        out[field] = rng.check(number, f"{what}: {key}")
    return out


def parse_policy(text: str, what: str = "policy") -> Policy:
    """A full Policy from a string; two of N, mu, n are enough (the third is derived)."""
    fields = parse_assignments(text, what)
    batch_size, mu, n = (fields.get(k) for k in ("batch_size", "micro_batch_size", "num_micro_batches"))
    if (batch_size is None) + (mu is None) + (n is None) > 1:
        raise HRMError(f"{what}: give two of N (batch size), mu (micro-batch size), n (micro-batches)")
    refusal = policy_refusal(fields)
    if refusal:
        raise HRMError(f"{what}: {refusal}")
    if mu is None:
        fields["micro_batch_size"] = batch_size // n
    elif n is None:
        fields["num_micro_batches"] = batch_size // mu
    elif batch_size is None:
        fields["batch_size"] = bounds.SEQUENCES.check(mu * n, f"{what}: N = mu x n")
    return validate_policy(fields, what)


def validate_policy(fields: dict, what: str = "policy") -> Policy:
    """``Policy(**fields)`` with a one-line HRMError naming ``what`` and the field."""
    from pydantic import ValidationError

    from .errors import pydantic_message

    try:
        return Policy(**fields)
    except ValidationError as exc:
        raise HRMError(pydantic_message(what, exc)) from None
