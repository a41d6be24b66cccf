"""The protocol every export target follows: its flag table and three small functions.

A target (:class:`EngineFlags`) is a table of the flags an engine takes (each with the policy
field it carries, the engine version it was checked against and the file:line of the
engine's argument parser), the policy fields its flags can set, the shipped HRM engines its
policies are re-estimated with (whose ``policy:`` blocks are its policy space:
:mod:`hrm.export.space`), and three functions — ``nearest`` (the policies the engine can
express near a wanted one), ``render`` (a policy as flag values) and ``parse`` (flag values
as a policy) — and optional hooks: ``workload`` (the workload a command or an export runs:
FlexGen pads, vLLM's --max-model-len bounds it) and ``notes`` (what one export should say).
One module per target (``flexgen.py`` ...) fills it in.
"""

from __future__ import annotations

from typing import Callable, Literal, Optional

from pydantic import BaseModel, ConfigDict, model_validator

from ..engines.engine import PolicySpace
from ..policy import Policy


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


class FlagSpec(Frozen):
    """One flag of an engine: its spellings, the policy field (or input) it carries, how many
    value tokens follow it, the documented form of each token (a regex), and where that form
    was read."""

    flag: str
    aliases: tuple[str, ...] = ()
    policy_field: str
    values: int = 1  # value tokens after the flag (0: a switch)
    value_form: str = r"-?\d+"  # documented form of each value token (full match)
    #: the engine version the row was read in (empty: the target's ``version``)
    checked_against: str = ""
    source: str
    #: argparse nargs="+": the value tokens run up to the next flag (``values`` is then unused)
    until_next_flag: bool = False
    #: may be given more than once, its values joined (llama.cpp's -ot)
    repeatable: bool = False

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.flag, *self.aliases)


class Context(Frozen):
    """What an engine's flags need besides the policy: the model, the workload, and the
    machine (GPU count, CPU memory bandwidth) and the GPU memory fraction."""

    model: object
    workload: object
    hardware: Optional[object] = None
    gpu_memory_utilization: float = 0.86
    #: what the policy's r_w is a share of: the routed experts (``ideal``, ``moe-lightning``:
    #: non-expert weights always on the GPU) or every layer weight (FlexGen's ``--percent``)
    rw_reads: Literal["experts", "all"] = "experts"

    @property
    def gpu_count(self) -> int:
        hw = self.hardware
        return int(hw.gpu.count) if hw is not None and getattr(hw, "gpu", None) is not None else 1


class EngineFlags(Frozen):
    """An engine's flag table and its policy mapping (one entry of
    :data:`hrm.export.registry.EXPORTERS`)."""

    name: str
    description: str
    #: the programs a run starts, with the placeholders the user fills in (MODEL ...)
    programs: tuple[str, ...]
    #: with two programs (a server + client pair): the flags that go to the second
    client_flags: tuple[str, ...] = ()
    version: str
    flags: tuple[FlagSpec, ...]
    #: flags of the engine that carry no policy field: accepted by import, value tokens each
    passthrough: dict[str, int] = {}
    #: the policy fields the engine's flags set (round trips compare these)
    expressed_fields: tuple[str, ...] = tuple(Policy.model_fields)
    #: the shipped HRM engines the target's policies are re-estimated with; their engine
    #: files' ``policy:`` blocks are the target's policy space
    engines: tuple[str, ...] = ()
    #: the policy space of a target no shipped HRM engine describes (then ``engines`` is empty)
    policy: Optional[PolicySpace] = None
    #: which of ``engines`` runs a policy (None, or returning None: the plan's engine)
    hrm_engine: Optional[Callable[[Policy], Optional[str]]] = None
    caveats: tuple[str, ...] = ()
    #: other programs whose flags import reads as this target's (e.g. a runner script that
    #: takes the same flags); export always prints ``programs``
    import_programs: tuple[str, ...] = ()
    #: programs of the engine that import recognises and refuses, each with why (llama.cpp's
    #: llama-cli runs one prompt, no server slots)
    refused_programs: dict[str, str] = {}
    #: the workload a command's own flags define (FlexGen's --prompt-len/--gen-len, padded),
    #: or the workload the engine runs for a plan's; None: the HRM workload unchanged
    workload: Optional[Callable[[Optional[dict[str, list[str]]], Context], object]] = None
    #: the engine's server chooses its own policy at launch (MoE-Lightning's optimizer): an
    #: export is the server's pick, never "the nearest" to the plan, and no --fix re-plans it
    server_picks_policy: bool = False
    #: what one export should say besides the caveats (ties in the server's pick, a GPU it does
    #: not recognise, requests it aborts); None: nothing
    notes: Optional[Callable[[Policy, Context], list[str]]] = None
    #: the HRM engine fields a command's flags set beside the policy (dotted path -> value:
    #: vLLM's --max-num-batched-tokens is ``prefill.max_tokens_per_pass``); None: none
    engine_fields: Optional[Callable[[dict[str, list[str]], Context], dict]] = None
    #: the model as the command stores its weights, with notes (SGLang's --kt-method: the CPU
    #: experts in a converted file of the same model); None: the model given
    stored_model: Optional[Callable[[dict[str, list[str]], Context], tuple[object, list[str]]]] = None
    #: the free GPU memory (bytes, all GPUs) the engine's own memory fit leaves when it places the
    #: weights for this command (llama.cpp's --fit with -ngl auto), None when the command places
    #: them: hrm import then estimates the placement that fit reaches; None hook: never
    fit_margins: Optional[Callable[[dict[str, list[str]], Context], Optional[float]]] = None
    #: the target's policy space where its HRM engines' files cannot say it: pin sets (``--fix``
    #: values) the re-plan searches one by one, keeping the best (FlexGen: r_w only at the
    #: shares its midpoint rule places, the cache on the CPU); None: one unpinned search
    replan_pins: Optional[Callable[[Context], list[dict]]] = None
    #: raises a one-line HRMError when the engine cannot run ``ctx``'s model on its machine at
    #: all (FlexGen: Mixtral on one GPU), whatever the policy: nothing to re-plan then
    check_runs: Optional[Callable[[Context], None]] = None
    nearest: Callable[[Policy, Context], list[Policy]]
    render: Callable[[Policy, Context], dict[str, list[str]]]
    parse: Callable[[dict[str, list[str]], Context], tuple[Policy, list[str]]]

    @model_validator(mode="before")
    @classmethod
    def _rows_checked_against_version(cls, data):
        """A flag row that names no other version was read in the target's own ``version``."""
        if isinstance(data, dict) and "version" in data:
            data = {**data, "flags": tuple(row if row.checked_against else
                                           row.model_copy(update={"checked_against": data["version"]})
                                           for row in data.get("flags", ()))}
        return data

    @model_validator(mode="after")
    def _one_policy_space(self):
        if bool(self.engines) == (self.policy is not None):
            raise ValueError(f"{self.name}: give the HRM engines (their policy space) or a policy space, one of them")
        return self

    def run_workload(self, values: Optional[dict[str, list[str]]], ctx: Context):
        """The workload a command's flags (``values``) or an export of a plan (None) runs on
        this engine: its ``workload`` hook, else ``ctx``'s workload unchanged."""
        return self.workload(values, ctx) if self.workload is not None else ctx.workload

    def export_notes(self, policy: Policy, ctx: Context) -> list[str]:
        """The ``notes`` hook's lines for exporting ``policy`` (none without the hook)."""
        return list(self.notes(policy, ctx)) if self.notes is not None else []

    def spec(self, flag: str) -> FlagSpec:
        for item in self.flags:
            if flag in item.spellings:
                return item
        raise KeyError(flag)


class Frontend(Frozen):
    """A tool ``hrm import`` reads that launches another target's engine with flags of its own
    making (ollama starts llama-server): its text (a Modelfile, options JSON ...) becomes that
    target's flag values as the tool itself builds them, which the target then reads. Import
    only: ``hrm export`` writes the engine's own command (one entry of
    :data:`hrm.export.registry.FRONTENDS`)."""

    name: str
    description: str
    version: str
    #: the target (a name in :data:`hrm.export.registry.EXPORTERS`) whose flags the tool builds
    target: str
    #: the settings the tool reads, each with the flag it becomes and where the tool does so
    options: tuple[FlagSpec, ...]
    #: (the target's canonical flag values, notes) for a pasted text and its context; a
    #: one-line HRMError for what the tool refuses or HRM cannot read
    translate: Callable[[str, Context], tuple[dict[str, list[str]], list[str]]]
