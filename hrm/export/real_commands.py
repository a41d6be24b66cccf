"""Real command lines users posted (``tests/data/real_commands.yaml``), read the way ``hrm
import`` reads them: the policy each imports, or its one-line refusal. One function serves
the table's test (tests/test_real_commands.py) and its page (benchmarks/import_table.py ->
docs/engines/imports.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict

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


class RealCommand(_Frozen):
    engine: str
    hw: str
    model: str
    command: str
    source: str
    expect: Expectation
    note: str = ""
    #: the host memory the command's machine had, when the shipped profile's differs
    host_cpu_gib: Optional[float] = None
    #: the machine as the poster described it
    posted_on: str = ""


def load_real_commands(path: str | Path) -> list[RealCommand]:
    """The table's entries: a YAML list of :class:`RealCommand`."""
    from hrm.errors import strict_yaml_load

    data = strict_yaml_load(read_input_text(path, "a list of commands"))
    if not isinstance(data, list):
        raise HRMError(f"{path}: a list of commands expected")
    return [RealCommand.model_validate(item) for item in data]


def read_real_command(entry: RealCommand):
    """(policy, notes, None) as ``hrm import`` reads ``entry``, or (None, (), refusal)."""
    from ..machine.hardware import load_hardware
    from ..model.spec import load_model
    from ..workload import make_workload

    hw = load_hardware(entry.hw)
    if entry.host_cpu_gib is not None:
        hw = hw.model_copy(update={"cpu": hw.cpu.model_copy(update={"memory_gib": entry.host_cpu_gib})})
    try:
        imported = read_command(entry.engine, entry.command, load_model(entry.model), make_workload(), hw)
    except HRMError as exc:
        return None, (), str(exc)
    return imported.policy, imported.notes, None
