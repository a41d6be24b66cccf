"""Real command lines users posted (``tests/data/real_commands.yaml``), read the way ``hrm
import`` reads them: the policy each imports, or its one-line refusal. One function serves
the table's test (tests/test_real_commands.py) and its page (benchmarks/import_table.py ->
docs/engines/imports.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, model_validator

from ..errors import HRMError, read_input_text
from .importing import read_command


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Expectation(_Frozen):
    """What HRM must make of a command: the policy (short form, or some of its fields), or a
    text its one-line refusal contains."""

    policy: Optional[str] = None
    batch_size: Optional[int] = None
    micro_batch_size: Optional[int] = None
    weights_gpu_ratio: Optional[float] = None
    attn_on_gpu: Optional[bool] = None
    refused: Optional[str] = None


class Parts(_Frozen):
    """The poster's machine from the parts catalog (hrm.machine.parts.compose_profile)."""

    gpu: Optional[str] = None
    gpus: int = 1
    cpu: str
    #: CPU sockets (hrm.machine.parts.compose_profile: one NUMA node each)
    sockets: int = 1
    ram_gib: float
    #: what of the machine the post does not state (the part assumed in its place)
    assumed: str = ""

    @property
    def label(self) -> str:
        cpu = f"{self.sockets}x{self.cpu}" if self.sockets > 1 else self.cpu
        return f"{f'{self.gpus}x{self.gpu} + ' if self.gpu else ''}{cpu}, {self.ram_gib:g} GiB"


class RealCommand(_Frozen):
    engine: str
    #: a shipped hardware profile, or ``parts`` (one of them)
    hw: Optional[str] = None
    parts: Optional[Parts] = None
    model: str
    command: str
    source: str
    expect: Expectation
    note: str = ""
    #: the host memory the command's machine had, when the shipped profile's differs
    host_cpu_gib: Optional[float] = None
    #: the machine as the poster described it
    posted_on: str = ""

    @model_validator(mode="after")
    def _one_machine(self):
        if (self.hw is None) == (self.parts is None):
            raise ValueError("give hw (a profile) or parts (the poster's machine from the catalog), one of them")
        return self

    @property
    def machine_label(self) -> str:
        return self.hw if self.hw is not None else self.parts.label

    def hardware(self):
        """The machine the command is read for: the profile, or the parts composed."""
        from ..machine.hardware import load_hardware
        from ..machine.parts import compose_profile

        if self.parts is not None:
            p = self.parts
            return compose_profile(p.gpu, p.cpu, p.ram_gib, p.gpus, p.sockets)
        return load_hardware(self.hw)


def load_real_commands(path: str | Path) -> list[RealCommand]:
    """The table's entries: a YAML list of :class:`RealCommand`."""
    from hrm.errors import strict_yaml_load

    data = strict_yaml_load(read_input_text(path, "a list of commands"))
    if not isinstance(data, list):
        raise HRMError(f"{path}: a list of commands expected")
    return [RealCommand.model_validate(item) for item in data]


def policy_counts(entries: list[RealCommand]) -> dict[str, tuple[int, int]]:
    """{engine: (commands read to a policy, commands)} as the table expects them."""
    out: dict[str, tuple[int, int]] = {}
    for e in entries:
        read, total = out.get(e.engine, (0, 0))
        out[e.engine] = (read + (e.expect.refused is None), total + 1)
    return out


#: the engines that keep experts on the CPU per layer or per expert on a consumer machine
#: (issue 34's count): llama.cpp, ollama, and kTransformers as SGLang's --kt-* flags run it
CPU_EXPERT_ENGINES = ("llama.cpp", "ollama", "ktransformers (sglang --kt)")


def cpu_expert_engine(entry: RealCommand) -> str | None:
    """The :data:`CPU_EXPERT_ENGINES` name of an entry's engine, or None for the others."""
    if entry.engine in ("llama.cpp", "ollama"):
        return entry.engine
    if entry.engine == "sglang" and "--kt-" in entry.command:
        return CPU_EXPERT_ENGINES[2]
    return None


def cpu_expert_counts(entries: list[RealCommand]) -> dict[str, tuple[int, int]]:
    """{:data:`CPU_EXPERT_ENGINES` name: (entries read to a policy, entries)}."""
    out = {name: (0, 0) for name in CPU_EXPERT_ENGINES}
    for e in entries:
        name = cpu_expert_engine(e)
        if name is not None:
            read, total = out[name]
            out[name] = (read + (e.expect.refused is None), total + 1)
    return out


def cpu_expert_read_count(entries: list[RealCommand]) -> int:
    """Entries of :data:`CPU_EXPERT_ENGINES` read to a policy (not refused)."""
    return sum(e.expect.refused is None and cpu_expert_engine(e) is not None for e in entries)


def read_real_command(entry: RealCommand):
    """(policy, notes, None) as ``hrm import`` reads ``entry``, or (None, (), refusal)."""
    from ..model.spec import load_model
    from ..workload import make_workload

    hw = entry.hardware()
    if entry.host_cpu_gib is not None:
        hw = hw.model_copy(update={"cpu": hw.cpu.model_copy(update={"memory_gib": entry.host_cpu_gib})})
    try:
        imported = read_command(entry.engine, entry.command, load_model(entry.model), make_workload(), hw)
    except HRMError as exc:
        return None, (), str(exc)
    return imported.policy, imported.notes, None
