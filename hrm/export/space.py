"""A target's policy space, read from the engine files of the HRM engines it is estimated
with (``hrm/data/engines/*.yaml``, their ``policy:`` blocks), and the ``hrm-search --fix``
pins that re-plan inside it."""

from __future__ import annotations

from ..engines.engine import PolicySpace, load_engine
from .target import EngineFlags

#: the ``--fix`` key (:func:`hrm.policy.parse_assignments`) of each policy field a space can
#: pin, in the order the pins are printed: each placement next to its ratio
PIN_KEYS = (("attn_on_gpu", "attn"), ("kv_gpu_ratio", "rc"), ("ffn_on_gpu", "ffn"), ("weights_gpu_ratio", "rw"),
            ("num_micro_batches", "n"))


def policy_space(target: EngineFlags) -> PolicySpace:
    """The union of the policy blocks of ``target``'s engines (a tier any of them runs, a value
    all of them fix), or the target's own space when no shipped engine describes it."""
    if target.policy is not None:
        return target.policy
    spaces = [load_engine(name).policy for name in target.engines]
    first, rest = spaces[0], spaces[1:]
    return PolicySpace(attention=tuple(dict.fromkeys(t for s in spaces for t in s.attention)),
                       ffn=tuple(dict.fromkeys(t for s in spaces for t in s.ffn)),
                       fixed={k: v for k, v in first.fixed.items() if all(s.fixed.get(k) == v for s in rest)})


def _pinned_values(space: PolicySpace) -> dict:
    """The policy fields ``space`` allows one value of, less those a policy rule already
    implies (:func:`hrm.policy.policy_refusal`: attn=cpu gives rc=0, ffn=cpu gives rw=0)."""
    values: dict = dict(space.fixed)
    for field, tiers, ratio in (("attn_on_gpu", space.attention, "kv_gpu_ratio"),
                                ("ffn_on_gpu", space.ffn, "weights_gpu_ratio")):
        if len(tiers) == 1:
            values[field] = tiers[0]
            if tiers[0] == "cpu" and values.get(ratio) == 0:
                del values[ratio]
    return values


def fix_pins(target: EngineFlags) -> str:
    """``target``'s policy space as ``hrm-search --fix`` pins (e.g. ``attn=gpu rc=1 n=1``)."""
    values = _pinned_values(policy_space(target))
    return " ".join(f"{key}={_pin_text(values[field])}" for field, key in PIN_KEYS if field in values)


def _pin_text(value) -> str:
    return value if isinstance(value, str) else f"{value:g}"  # a tier, or a number (n=1, rc=1)
