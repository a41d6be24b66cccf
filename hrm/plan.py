"""The plan (SPEC §6): the contract between solver, CLI, runtime and notebooks.

Key names are stable; ``hrm/data/plan.schema.json`` is generated from :class:`Plan`
(``python -m hrm.plan > hrm/data/plan.schema.json``) so other tools can validate plans.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import HRMError, pydantic_message
from .policy import Policy
from .workload import Workload

SCHEMA_VERSION = "1.0"
SCHEMA_PATH = Path(__file__).resolve().parent / "data" / "plan.schema.json"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SpecRef(_Frozen):
    """A hardware profile or model spec by name (as the user gave it) and content hash."""

    name: str
    sha256: str


class Estimate(_Frozen):
    decode_layer_latency_s: float
    prefill_latency_s: float
    decode_throughput_tok_s: float
    generation_throughput_tok_s: float
    gpu_peak_bytes: float
    cpu_peak_bytes: float
    bottleneck: str
    breakdown: dict = Field(default_factory=dict)


class LayerPlacement(_Frozen):
    layer: int
    gpu_experts: list[int]


class Placement(_Frozen):
    """Which routed experts of which layers stay on the GPU (r_w realised in whole experts),
    and how the offloaded rest of a layer is cut into ``weight_pages`` (= n) pages."""

    layers: list[LayerPlacement]
    weight_pages: int
    weights_gpu_ratio_realised: float


class SolverInfo(_Frozen):
    name: str
    seconds: float
    optimal: bool
    candidates_evaluated: int


class Plan(_Frozen):
    schema_version: str = SCHEMA_VERSION
    hardware: SpecRef
    model: SpecRef
    workload: Workload
    policy: Policy
    schedule: str
    engine: str = "ideal"
    estimate: Estimate
    placement: Placement
    solver: SolverInfo
    created_by: str


def plan_schema() -> dict:
    return Plan.model_json_schema()


def write_atomic(path: str | Path, content: str | bytes) -> None:
    """Write ``content`` to ``path`` via a temp file in the same folder and a rename, so a
    reader never sees half a file. The result is readable by all (0644), as open() makes."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise HRMError(f"{path}: folder {folder} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    except OSError as exc:
        raise HRMError(f"{path}: cannot write ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "wb" if isinstance(content, bytes) else "w") as handle:
            handle.write(content)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise HRMError(f"{path}: cannot write ({exc.strerror})") from None


def save_plan(plan: Plan, path: str | Path) -> None:
    write_atomic(path, plan.model_dump_json(indent=2) + "\n")


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise HRMError(f"{path}: cannot read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise HRMError(f"{path}: malformed JSON (line {exc.lineno}: {exc.msg})") from None
    try:
        return Plan.model_validate(data)
    except ValidationError as exc:
        raise HRMError(pydantic_message(str(path), exc)) from None


if __name__ == "__main__":  # regenerate the committed schema
    print(json.dumps(plan_schema(), indent=2))
