"""``hrm fit``'s answer for a serving engine HRM exports to (vLLM, SGLang + kTransformers): the
same search as the llama.cpp pick, inside that engine's own policy space, read from the export
target (:mod:`hrm.export`) and its shipped HRM engine files rather than restated here:

- the placements and fixed fields: :func:`hrm.export.space.policy_space` of the target (the
  ``policy:`` blocks of ``hrm/data/engines/<engine>.yaml``: attention and the KV cache on the
  GPU, one forward pass per step);
- the shares of routed experts the GPU can hold: every step of the engine's ``static_experts``
  granularity (:func:`hrm.engines.space.static_expert_step`: whole layers for vLLM's
  ``--cpu-offload-gb``, k experts of every layer for ``--kt-num-gpu-experts``);
- each candidate's command: the target's own ``render`` (what ``hrm export`` prints), and the
  engine fields that command sets (``engine_fields``: vLLM's ``--max-num-batched-tokens`` is the
  prefill pass), so the predicted rates are what ``hrm import`` of that command estimates;
- memory: within the planning caps the command itself states (``--gpu-memory-utilization``,
  ``--mem-fraction-static``: :data:`hrm.model.options.DEFAULT_OPTIONS`).

An engine that cannot run the model on the machine at all gets one line saying why
(:class:`ServerAnswer` with ``command`` None); the engine's own module says which facts rule
it out (:mod:`hrm.analysis.fit_vllm`, :mod:`hrm.analysis.fit_sglang`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional

from ..errors import HRMError
from ..units import GIB


@dataclass(frozen=True)
class ServerPick:
    """One candidate of an engine's search: its policy, the share of experts it keeps on the
    GPU in the engine's units, and its predicted rates and memory."""

    policy: object
    gpu_units: int
    units: int
    prefill_tok_s: float
    decode_tok_s: float
    total_s: float
    memory_bytes: dict
    fits: bool
    bottleneck: str


@dataclass(frozen=True)
class ServerAnswer:
    """An engine's answer: its best command (None where it cannot run the model: ``line`` says
    why), the policy it runs, its predicted rates and memory, how many commands were searched,
    and notes."""

    engine: str
    line: str
    command: Optional[str] = None
    #: the HRM policy the command runs (what ``hrm import`` reads it as)
    policy: Optional[object] = None
    prefill_tok_s: Optional[float] = None
    decode_tok_s: Optional[float] = None
    total_s: Optional[float] = None
    memory_bytes: Optional[dict] = None
    searched: int = 0
    infeasible: int = 0
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"engine": self.engine, "line": self.line, "command": self.command,
                "policy": self.policy.short() if self.policy is not None else None,
                "prefill_tok_s": self.prefill_tok_s, "decode_tok_s": self.decode_tok_s, "total_s": self.total_s,
                "memory_bytes": self.memory_bytes, "searched": self.searched, "infeasible": self.infeasible,
                "notes": list(self.notes)}

    def lines(self) -> tuple[str, ...]:
        """What ``hrm fit`` prints for this engine, in the ollama lines' style."""
        if self.command is None:
            return (f"{self.engine}: {self.line}",)
        memory = ", ".join(f"{dev} {v / GIB:.2f} GiB" for dev, v in self.memory_bytes.items())
        return (f"{self.engine}: {self.line}", f"  {self.command}",
                f"  predicted: prefill {self.prefill_tok_s:,.1f} tok/s, decode {self.decode_tok_s:,.2f} tok/s, "
                f"request {self.total_s:.2f} s", f"  memory: {memory}")


def refused(engine: str, why: str) -> ServerAnswer:
    """The answer of an engine that cannot run the model here: one line."""
    return ServerAnswer(engine=engine, line=f"cannot run it here: {why}")


def server_policy(target, gpu_units: int, units: int, users: int):
    """The policy of ``gpu_units`` of ``units`` expert shares on the GPU in ``target``'s space
    (its fixed fields and single tiers: :func:`hrm.export.space.policy_space`)."""
    from ..export.space import policy_space
    from ..policy import Policy

    space = policy_space(target)
    fields = {"batch_size": users, "micro_batch_size": users, "num_micro_batches": 1,
              "attn_on_gpu": space.attention == ("gpu",), "ffn_on_gpu": space.ffn != ("cpu",),
              "weights_gpu_ratio": gpu_units / units, "kv_gpu_ratio": 1.0 if space.attention == ("gpu",) else 0.0}
    fields.update({k: v for k, v in space.fixed.items() if k in fields and k != "weights_gpu_ratio"})
    fields["micro_batch_size"] = users // int(fields["num_micro_batches"])
    return Policy(**fields)


def command_engine(target, engine, values: dict, ctx):
    """``engine`` with the fields ``values`` (a command's flags) set, as ``hrm import`` reads
    them (:func:`hrm.export.importing.imported_engine`)."""
    from ..engines.mechanisms import with_fields

    fields = target.engine_fields(values, ctx) if target.engine_fields else {}
    return with_fields(engine, fields) if fields else engine


def _pick(target, engine, hw, model, ctx, policy, gpu_units: int, units: int, prefill_tokens: int) -> ServerPick:
    from ..estimate import estimate
    from ..model.options import DEFAULT_OPTIONS

    run = command_engine(target, engine, target.render(policy, ctx), ctx)
    r = estimate(hw, model, ctx.workload, policy, options=DEFAULT_OPTIONS, engine=run)
    prefill = prefill_tokens / r.prefill_latency_s if r.prefill_latency_s else 0.0
    return ServerPick(policy, gpu_units, units, prefill, r.decode_throughput_tok_s, r.total_time_s,
                      {"gpu": r.gpu_peak_bytes, "cpu": r.cpu_peak_bytes}, r.feasible, r.bottleneck)


def _score(pick: ServerPick, objective: str) -> float:
    """Smaller is better (as :func:`hrm.analysis.fit._score`)."""
    return {"decode": -pick.decode_tok_s, "prefill": -pick.prefill_tok_s}.get(objective, pick.total_s)


def search(target_name: str, hw, model, workload, users: int, objective: str,
           allowed: Callable[[int, int], bool] = lambda gpu_units, units: True) -> tuple[list[ServerPick], object]:
    """(every candidate, best first among those that fit; the context) of ``target_name``'s space:
    each share of routed experts its HRM engine's granularity realises that ``allowed`` admits."""
    from ..engines.engine import load_engine
    from ..engines.space import static_expert_step
    from ..export.registry import get_exporter
    from ..export.target import Context
    from ..model.options import DEFAULT_OPTIONS

    target = get_exporter(target_name)
    engine = load_engine(target.engines[0])
    ctx = Context(model=model, workload=workload, hardware=hw,
                  gpu_memory_utilization=DEFAULT_OPTIONS.gpu_memory_utilization)
    units = int(model.num_moe_layers) * int(model.num_experts) // static_expert_step(model, engine)
    prefill_tokens = users * workload.prompt_len
    picks = [_pick(target, engine, hw, model, ctx, server_policy(target, k, units, users), k, units, prefill_tokens)
             for k in range(units + 1) if allowed(k, units)]
    return sorted(picks, key=lambda p: (not p.fits, _score(p, objective), -p.gpu_units)), ctx


def answer(target_name: str, picks: list[ServerPick], ctx, describe: Callable[[ServerPick], str],
           none_fit: str, notes: tuple[str, ...] = ()) -> ServerAnswer:
    """The best fitting pick as the target's command (``hrm export``'s), or one line where none fits."""
    from ..export.exporting import export_policy

    fitting = [p for p in picks if p.fits]
    if not fitting:
        return replace(refused(target_name, none_fit), searched=len(picks), infeasible=len(picks))
    best = fitting[0]
    try:
        exported = export_policy(target_name, best.policy, ctx)
    except HRMError as exc:  # the exporter's own refusal (a format its flags cannot state), in its words
        return replace(refused(target_name, str(exc)), searched=len(picks), infeasible=len(picks) - len(fitting))
    return ServerAnswer(engine=target_name, line=describe(best), command=exported.commands[0],
                        policy=best.policy, prefill_tok_s=best.prefill_tok_s, decode_tok_s=best.decode_tok_s,
                        total_s=best.total_s, memory_bytes=best.memory_bytes, searched=len(picks),
                        infeasible=len(picks) - len(fitting), notes=tuple(notes) + tuple(exported.caveats))
