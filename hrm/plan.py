"""The plan (docs/model.md §6): the contract between solver, CLI, runtime and notebooks.

Key names are stable; ``hrm/data/plan.schema.json`` is generated from :class:`Plan`
(``python -m hrm.plan > hrm/data/plan.schema.json``) so other tools can validate plans.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Annotated, Optional

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints,
                      WithJsonSchema, field_validator, model_validator)

from . import bounds
from .bounds import Flag
from .engines.engine import Engine
from .errors import HRMError, file_kind, read_json_object, validated
from .policy import Policy
from .model.routing import Routing
from .workload import Workload

SCHEMA_VERSION = "1.0"
#: plan schema versions this code reads (a plan from a newer tool is refused, not guessed at)
KNOWN_SCHEMA_VERSIONS = ("1.0",)
SCHEMA_PATH = Path(__file__).resolve().parent / "data" / "plan.schema.json"
#: relative tolerance of the estimate re-check on load (a plan's numbers vs a recomputation)
ESTIMATE_RTOL = 1e-6
#: the estimate fields re-checked on load (the rest of the block depends on memory limits)
CHECKED_ESTIMATE_FIELDS = ("decode_layer_latency_s", "prefill_latency_s", "decode_throughput_tok_s",
                           "generation_throughput_tok_s", "gpu_peak_bytes", "cpu_peak_bytes", "disk_bytes")

#: characters of one line of free text in a plan (a solver's description, a note, why a server
#: picks no policy) or of a file path a name may be: PATH_MAX of Linux (4096); real ones are a
#: few hundred (the plan schema is generated from it: python -m hrm.plan)
MAX_TEXT_CHARS = 4096
_ONE_LINE = r"^[^\x00-\x1f\x7f]+$"


def _one_line(text):
    """One line of printable text, not blank, at most :data:`MAX_TEXT_CHARS` (Unicode's
    non-printable characters too: U+2028 line separator, U+202E bidi override, C1 controls);
    hrm.bounds.name_refusal's rule with room for a path."""
    if not isinstance(text, str):
        raise ValueError(f"expected text, got {bounds.kind_of(text)}")
    if not text.strip():
        raise ValueError("empty text")
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(f"{len(text)} characters (at most MAX_TEXT_CHARS = {MAX_TEXT_CHARS})")
    if not text.isprintable():
        bad = next(c for c in text if not c.isprintable())
        raise ValueError(f"control character {bad!r} in {text[:40]!r} (one line of printable text)")
    return text


#: one printable line of at most MAX_TEXT_CHARS: free text, or a hardware, model or engine
#: name as the user gave it (--hw, --model and --engine also take file paths)
Label = Annotated[str, BeforeValidator(_one_line), WithJsonSchema({"type": "string", "minLength": 1,
                                                                   "maxLength": MAX_TEXT_CHARS, "pattern": _ONE_LINE})]
#: a name the tool itself writes (created_by, the objective, a bottleneck, a server's optimizer):
#: hrm.bounds.Label, one printable line of at most bounds.MAX_NAME_CHARS
Name = Annotated[bounds.Label, WithJsonSchema({"type": "string", "minLength": 1,
                                               "maxLength": bounds.MAX_NAME_CHARS, "pattern": _ONE_LINE})]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Amount = bounds.NON_NEGATIVE.type


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SpecRef(_Frozen):
    """A hardware profile or model spec by name (as the user gave it) and content hash."""

    name: Label
    sha256: Sha256


class Estimate(_Frozen):
    decode_layer_latency_s: Amount
    prefill_latency_s: Amount
    decode_throughput_tok_s: Amount
    generation_throughput_tok_s: Amount
    gpu_peak_bytes: Amount
    cpu_peak_bytes: Amount
    #: weights spilled beyond host memory to disk (docs/model.md §4.9); 0 without a disk tier
    disk_bytes: Amount = 0.0
    bottleneck: Name
    breakdown: dict = Field(default_factory=dict)

    @field_validator("breakdown")
    @classmethod
    def _finite_breakdown(cls, breakdown):
        """Diagnostics (free-form): every number in it finite, nesting at most 4 deep."""

        def walk(node, where: str, depth: int):
            if depth > 4:
                raise ValueError(f"{where}: nested too deeply")
            items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
            for key, value in items:
                if isinstance(value, float) and not math.isfinite(value):
                    raise ValueError(f"{where}.{key}: {value} is not a finite number")
                walk(value, f"{where}.{key}", depth + 1)

        walk(breakdown, "breakdown", 0)
        return breakdown


class LayerPlacement(_Frozen):
    layer: bounds.INDEX.type
    gpu_experts: list[bounds.INDEX.type]

    @field_validator("gpu_experts")
    @classmethod
    def _no_duplicates(cls, experts):
        seen = set()
        for expert in experts:
            if expert in seen:
                raise ValueError(f"expert {expert} listed twice")
            seen.add(expert)
        return experts


class Placement(_Frozen):
    """Which routed experts of which layers stay on the GPU (r_w realised in whole experts),
    and how the offloaded rest of a layer is cut into ``weight_pages`` (= n) pages."""

    layers: list[LayerPlacement]
    weight_pages: bounds.SEQUENCES.type
    weights_gpu_ratio_realised: bounds.FRACTION.type

    @field_validator("layers")
    @classmethod
    def _layers_once(cls, layers):
        seen = set()
        for entry in layers:
            if entry.layer in seen:
                raise ValueError(f"layer {entry.layer} listed twice")
            seen.add(entry.layer)
        return layers

    @property
    def gpu_expert_count(self) -> int:
        return sum(len(entry.gpu_experts) for entry in self.layers)


class SolverInfo(_Frozen):
    name: Label
    seconds: bounds.SECONDS.type
    optimal: Flag
    candidates_evaluated: bounds.COUNT.type


class SearchSettings(_Frozen):
    """What the search that made a plan was asked for beside the hardware, model and
    workload: the objective, the latency limits, the batch cap and the memory it planned in.
    ``hrm export --to TARGET`` re-plans inside another engine's space with these."""

    objective: Name = "generation"
    max_tpot_s: Optional[bounds.BUDGET_S.type] = None
    max_ttft_s: Optional[bounds.BUDGET_S.type] = None
    #: the batch cap asked for (each engine's own limit applies on top)
    max_batch: bounds.SEARCH_BATCH.type
    gpu_limit_bytes: Amount
    cpu_limit_bytes: Amount
    #: a CPU-only host: both tiers in one memory (:class:`hrm.cost.memory.MemoryLimits`)
    shared_memory: Flag = False


class ServerPick(_Frozen):
    """The policy an engine that picks its own (``policy.chosen_by``) will run on the plan's
    machine, model and workload, estimated as the plan's policy is (same engine, options and
    memory caps); or, in ``unavailable``, the one line why it picks none (no GPU, a model it
    cannot serve). The plan's ``policy`` stays the search's best in the engine's space."""

    chosen_by: Name
    #: the command whose launch makes the pick
    program: Label
    policy: Optional[Policy] = None
    generation_throughput_tok_s: Optional[Amount] = None
    decode_throughput_tok_s: Optional[Amount] = None
    notes: tuple[Label, ...] = ()
    unavailable: Optional[Label] = None

    @model_validator(mode="after")
    def _pick_or_reason(self):
        picked = (self.policy, self.generation_throughput_tok_s, self.decode_throughput_tok_s)
        if self.unavailable is None and any(v is None for v in picked):
            raise ValueError("server_pick: give policy, generation_throughput_tok_s and decode_throughput_tok_s, "
                             "or unavailable")
        if self.unavailable is not None and any(v is not None for v in picked):
            raise ValueError("server_pick: unavailable has no policy nor throughputs")
        return self


class Plan(_Frozen):
    """A plan (docs/model.md §6). Validated whole: known schema version and schedule, the policy's
    placement one the schedule runs, ``weight_pages`` = n, no GPU experts when the experts
    run on the CPU. What needs the model or the hardware (layers and experts of the model,
    the realised ratio, a recomputed estimate) is :func:`plan_refusal`, run by :func:`load_plan`."""

    schema_version: str = SCHEMA_VERSION
    hardware: SpecRef
    model: SpecRef
    workload: Workload
    policy: Policy
    schedule: str
    engine: Label = "ideal"
    #: the engine's definition when it is not a shipped one (``--engine FILE.yaml``, or a file
    #: that reuses a shipped name with other values): the plan then loads without the file
    engine_definition: Optional[Engine] = None
    #: the routing distribution the plan was made for (``--routing``); None: uniform
    routing: Optional[Routing] = None
    estimate: Estimate
    placement: Placement
    solver: SolverInfo
    created_by: Name
    #: the search's settings (None: a plan written before they were recorded, or not searched)
    search: Optional[SearchSettings] = None
    #: the policy the engine picks itself at launch (its ``policy.chosen_by``) beside the
    #: search's best; None: the engine runs the policy it is given (or not recorded)
    server_pick: Optional[ServerPick] = None

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, version):
        if version not in KNOWN_SCHEMA_VERSIONS:
            raise ValueError(f"unknown plan schema version {version!r} (this hrm reads {', '.join(KNOWN_SCHEMA_VERSIONS)})")
        return version

    @field_validator("schedule")
    @classmethod
    def _known_schedule(cls, schedule):
        from .engines.schedules import SCHEDULES

        if schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r} (one of {', '.join(SCHEDULES)})")
        return schedule

    @model_validator(mode="after")
    def _consistent(self):
        from .engines.schedules import SCHEDULES

        policy, placement = self.policy, self.placement
        refusal = SCHEDULES[self.schedule].refusal(policy.attn_on_gpu, policy.ffn_on_gpu)
        if refusal:
            raise ValueError(f"schedule: {refusal}, but the policy has {policy.short()}")
        if placement.weight_pages != policy.num_micro_batches:
            raise ValueError(f"placement.weight_pages ({placement.weight_pages}) != the policy's n "
                             f"({policy.num_micro_batches})")
        if not policy.ffn_on_gpu and (placement.gpu_expert_count or placement.weights_gpu_ratio_realised):
            raise ValueError("placement keeps experts on the GPU but the policy runs the experts on the CPU (ffn=cpu)")
        if self.engine_definition is not None and self.engine_definition.name != self.engine:
            raise ValueError(f"engine_definition.name ({self.engine_definition.name!r}) != engine ({self.engine!r})")
        return self


def plan_schema() -> dict:
    return Plan.model_json_schema()


# --- output files -----------------------------------------------------------------------
def check_output_path(path: str | Path, flag: str = "--out") -> Path:
    """Fail fast (before long work) when ``path`` cannot be written as a file: empty,
    a directory, a FIFO or device, a missing folder, or a folder where no file can be made
    (probed by creating and removing a temp file). One-line HRMError naming ``flag``."""
    text = str(path)
    if not text.strip():
        raise HRMError(f"{flag}: empty path")
    if "\0" in text:
        raise HRMError(f"{flag}: the path contains a NUL byte")
    path = Path(text)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise HRMError(f"{flag} {text}: cannot write there ({exc.strerror or exc})") from None
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise HRMError(f"{flag} {text}: is a directory, give a file name")
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise HRMError(f"{flag} {text}: {file_kind(info.st_mode)}, not a regular file")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise HRMError(f"{flag} {text}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise HRMError(f"{flag} {text}: folder {folder} is not writable")
    try:  # os.access cannot see a read-only file system (nor does it bind root): make a file
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise HRMError(f"{flag} {text}: cannot write in {folder} ({exc.strerror or exc})") from None
    return path


def check_output_folder(path: str | Path, flag: str = "--out") -> Path:
    """Fail fast when ``path`` is not an existing folder where files can be made."""
    text = str(path)
    if not text.strip():
        raise HRMError(f"{flag}: empty path")
    folder = Path(text)
    if not folder.is_dir():
        raise HRMError(f"{flag} {text}: not a folder" + (" (it does not exist)" if not folder.exists() else ""))
    if not os.access(folder, os.W_OK | os.X_OK):
        raise HRMError(f"{flag} {text}: folder is not writable")
    try:
        fd, probe = tempfile.mkstemp(prefix=".hrm-probe.", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise HRMError(f"{flag} {text}: cannot write in this folder ({exc.strerror or exc})") from None
    return folder


def write_files_atomic(items) -> None:
    """Write every ``(path, content)`` or none: each goes to a temp file in its folder first;
    only when all are written are they renamed into place. On a failure the temp files are
    removed (and files this call created are removed again if a rename fails), so a reader
    never sees half a file nor half of a set. Files are readable by all (0644)."""
    items = [(Path(path), content) for path, content in items]
    temps: list[tuple[str, Path]] = []
    current = items[0][0] if items else Path(".")
    try:
        for path, content in items:
            current = path
            folder = path.parent if str(path.parent) else Path(".")
            if not folder.is_dir():
                raise HRMError(f"{path}: folder {folder} does not exist")
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
            temps.append((tmp, path))
            with os.fdopen(fd, "wb" if isinstance(content, bytes) else "w") as handle:
                handle.write(content)
            os.chmod(tmp, 0o644)  # mkstemp creates 0600
    except (OSError, HRMError) as exc:
        for tmp, _ in temps:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, HRMError):
            raise
        raise HRMError(f"{current}: cannot write ({exc.strerror or exc})") from None
    created: list[Path] = []
    for index, (tmp, path) in enumerate(temps):
        existed = os.path.lexists(path)
        try:
            os.replace(tmp, path)
        except OSError as exc:
            for other, _ in temps[index:]:
                Path(other).unlink(missing_ok=True)
            for new in created:
                new.unlink(missing_ok=True)
            raise HRMError(f"{path}: cannot write ({exc.strerror or exc})") from None
        if not existed:
            created.append(path)


def write_atomic(path: str | Path, content: str | bytes) -> None:
    """Write ``content`` to ``path`` via a temp file in the same folder and a rename, so a
    reader never sees half a file. The result is readable by all (0644), as open() makes."""
    write_files_atomic([(path, content)])


def save_plan(plan: Plan, path: str | Path) -> None:
    write_atomic(path, plan.model_dump_json(indent=2) + "\n")


# --- reading and checking plans ---------------------------------------------------------
def resolve_plan_engine(plan: Plan):
    """The plan's engine (its embedded definition, a shipped name, or an engine YAML path),
    with the plan's schedule."""
    from .engines.engine import list_engines, load_engine

    name = plan.engine
    if plan.engine_definition is not None:
        if plan.engine_definition.schedule != plan.schedule:
            raise HRMError(f"schedule: {plan.schedule!r}, but engine {name} runs {plan.engine_definition.schedule!r}")
        return plan.engine_definition
    if name != "ideal" and name not in list_engines() and not (Path(name).suffix.lower() in (".yaml", ".yml")
                                                               and Path(name).is_file()):
        raise HRMError(f"engine: unknown engine {name!r} (shipped: {', '.join(list_engines())}; or an engine YAML path)")
    engine = load_engine(name)
    if engine.name == "ideal":
        return engine.with_schedule(plan.schedule)
    if engine.schedule != plan.schedule:
        raise HRMError(f"schedule: {plan.schedule!r}, but engine {engine.name} runs {engine.schedule!r}")
    return engine


def resolve_plan_hardware(plan: Plan, name: str | None = None):
    """The hardware profile ``name`` (default: the plan's) if it loads and its hash is the
    plan's, else None."""
    from .machine.hardware import load_hardware

    try:
        hw = load_hardware(name or plan.hardware.name)
    except HRMError:
        return None
    return hw if hw.sha256() == plan.hardware.sha256 else None


def resolve_plan_model(plan: Plan, name: str | None = None):
    """The model ``name`` (default: the plan's) in the dtypes whose hash the plan recorded,
    or None (the name does not load, or no dtype choice reproduces the hash). Warnings of
    the loader are muted."""
    from itertools import product

    from .model.spec import load_model
    from .units import DTYPES, FLOAT_DTYPES

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            base = load_model(name or plan.model.name)
    except HRMError:
        return None
    if plan.routing is not None:
        try:
            base = base.with_routing(plan.routing)
        except ValueError:  # the routing is over another expert count than the model's
            return None
    if base.sha256() == plan.model.sha256:
        return base
    from .model.quantized import WEIGHT_FORMATS

    for wd, kd, ad in product(DTYPES, DTYPES, DTYPES):
        spec = base.model_copy(update={"weight_dtype": wd, "kv_dtype": kd, "activation_dtype": ad})
        if spec.sha256() == plan.model.sha256:
            return spec
        for fmt in WEIGHT_FORMATS if wd not in FLOAT_DTYPES else ():  # quantized weights in a stored format
            stored = spec.model_copy(update={"weight_format": fmt})
            if stored.sha256() == plan.model.sha256:
                return stored
    return None


def placement_refusal(plan: Plan, model) -> Optional[str]:
    """Why the plan's placement does not fit ``model`` and its policy (None if it does):
    layers must be MoE layers of the model, experts below its expert count, the realised
    ratio the placement's count / slots and the policy's r_w in whole experts."""
    layers = model.moe_layer_indices
    valid = set(layers)
    for entry in plan.placement.layers:
        if entry.layer not in valid:
            return (f"placement: layer {entry.layer} is not an MoE layer of {model.name} "
                    f"(MoE layers {layers[0]}..{layers[-1]})" if layers else f"placement: {model.name} has no MoE layer")
        if entry.gpu_experts and max(entry.gpu_experts) >= model.num_experts:
            return (f"placement: layer {entry.layer} names expert {max(entry.gpu_experts)}, "
                    f"but {model.name} has {model.num_experts} (0..{model.num_experts - 1})")
    slots = len(layers) * model.num_experts
    count = plan.placement.gpu_expert_count
    ratio = count / slots if slots else 0.0
    realised = plan.placement.weights_gpu_ratio_realised
    if not math.isclose(realised, ratio, rel_tol=ESTIMATE_RTOL, abs_tol=1e-12):
        return (f"placement.weights_gpu_ratio_realised is {realised:.6g}, but the placement keeps {count} of "
                f"{slots} experts on the GPU ({ratio:.6g})")
    rw = plan.policy.weights_gpu_ratio if plan.policy.ffn_on_gpu else 0.0
    if slots and abs(ratio - rw) > 0.5 / slots + 1e-9 and abs(ratio - _snapped(model, plan, rw)) > 0.5 / slots + 1e-9:
        return (f"placement keeps {count} of {slots} experts on the GPU (r_w {ratio:.4g}), but the policy has "
                f"rw={rw:.4g} ({round(rw * slots)} experts)")
    return None


def _snapped(model, plan: Plan, rw: float) -> float:
    from .engines.space import snap_weights_ratio

    try:
        return snap_weights_ratio(model, resolve_plan_engine(plan), rw)
    except HRMError:
        return rw


def estimate_refusal(plan: Plan, hw, model, engine) -> Optional[str]:
    """Why the plan's estimate is stale (None if a recomputation matches it within
    :data:`ESTIMATE_RTOL`): names the first field that differs."""
    from .estimate import estimate
    from .cost.memory import MemoryLimits

    # the memory the plan was made in: a spill to disk (and so the times) depends on it
    settings = plan.search
    limits = (MemoryLimits(settings.gpu_limit_bytes, settings.cpu_limit_bytes, settings.shared_memory)
              if settings is not None else None)
    try:
        fresh = estimate(hw, model, plan.workload, plan.policy, engine=engine, limits=limits).to_plan_estimate()
    except HRMError as exc:
        return f"policy: {exc}"
    for key in CHECKED_ESTIMATE_FIELDS:
        old, new = float(getattr(plan.estimate, key)), float(fresh[key])
        if not math.isclose(old, new, rel_tol=ESTIMATE_RTOL, abs_tol=0.0):
            return (f"estimate.{key} is {old:.7g}, but the plan's hardware, model, workload and policy give "
                    f"{new:.7g}: a stale estimate (edited plan?); re-plan with hrm search")
    if plan.estimate.bottleneck != fresh["bottleneck"]:
        return (f"estimate.bottleneck is {plan.estimate.bottleneck!r}, but a recomputation gives "
                f"{fresh['bottleneck']!r}: a stale estimate; re-plan with hrm search")
    return None


def plan_refusal(plan: Plan, hw=None, model=None) -> Optional[str]:
    """What :func:`load_plan` checks beyond the schema: the engine is known and runs the
    plan's schedule; with the model (given, or resolved from the plan's name and hash) the
    placement fits it; with the hardware too, the estimate equals a recomputation. Checks
    that need a model or hardware that cannot be resolved are skipped."""
    try:
        engine = resolve_plan_engine(plan)
    except HRMError as exc:
        return str(exc)
    model = model if model is not None else resolve_plan_model(plan)
    if model is None:
        return None
    refusal = placement_refusal(plan, model)
    if refusal:
        return refusal
    hw = hw if hw is not None else resolve_plan_hardware(plan)
    if hw is None:
        return None
    return estimate_refusal(plan, hw, model, engine)


def load_plan(path: str | Path, check: bool = True) -> Plan:
    """Read, parse and validate a plan file whole (schema, then :func:`plan_refusal` when
    ``check``); one-line HRMError naming the file and the field otherwise."""
    data = read_json_object(path, "a plan JSON file", top_level="(a plan)")
    plan = validated(Plan, data, str(path))
    if check:
        refusal = plan_refusal(plan)
        if refusal:
            raise HRMError(f"{path}: {refusal}")
    return plan


if __name__ == "__main__":  # regenerate the committed schema
    print(json.dumps(plan_schema(), indent=2))
