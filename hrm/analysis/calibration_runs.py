"""The runs file of ``hrm calibrate`` (docs/calibrate.md): a profile, a model and runs, each
an engine, a workload, a policy and what the user measured (throughput, TPOT, TTFT), with
the run's provenance. Read and validated whole: every refusal is one HRMError line naming
the file and the field.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict

from ..engines.engine import Engine, list_engines, load_engine
from ..errors import HRMError, read_input_text, read_yaml_mapping
from ..policy import Policy, parse_policy
from ..units import FLOAT_DTYPES
from ..workload import PRESETS, Workload, make_workload

@dataclass(frozen=True)
class Quantity:
    """A measurable quantity: the :class:`hrm.estimate.EstimateResult` attribute that
    predicts it, its unit, and what it is."""

    attribute: str
    unit: str
    label: str


QUANTITIES: dict[str, Quantity] = {
    "generation_throughput_tok_s": Quantity("generation_throughput_tok_s", "tok/s", "gen tok/s"),
    "decode_throughput_tok_s": Quantity("decode_throughput_tok_s", "tok/s", "dec tok/s"),
    "tpot_s": Quantity("per_token_latency_s", "s", "TPOT s"),
    "ttft_s": Quantity("prefill_latency_s", "s", "TTFT s"),
    # an engine's own timers (FlexGen's write_benchmark_log, flexgen/utils.py:263-281): for a
    # batch engine prefill_s is the TTFT, and total_s = prefill_s + decode_s
    "prefill_s": Quantity("prefill_latency_s", "s", "prefill s"),
    "decode_s": Quantity("decode_time_s", "s", "decode s"),
    "total_s": Quantity("total_time_s", "s", "total s"),
}
#: what a run records besides what is fitted: the command as run, the ``hrm import --from``
#: target that reads it, the engine's version, and the spread of repeated measurements
PROVENANCE_KEYS = ("command", "from", "engine_version", "spread")
RUN_KEYS = ("name", "engine", "workload", "policy", "gpu_mem_gib", "cpu_mem_gib", "measured", "harness_fields",
            *PROVENANCE_KEYS)
WORKLOAD_KEYS = ("preset", "prompt_len", "max_prompt_len", "gen_len", "padding")


class Measurement(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    quantity: str
    value: float


class Run(BaseModel):
    """One measured run: engine, workload, policy, memory overrides and what was measured."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    label: str
    engine: Engine
    workload: Workload
    policy: Policy
    gpu_mem_gib: Optional[float] = None
    cpu_mem_gib: Optional[float] = None
    measured: tuple[Measurement, ...]
    #: the runs file's ``dtype``: every tensor held and computed in it (the reference runtime's
    #: ``--dtype``, which ``hrm validate --runs-out`` writes); None: the model's own dtypes
    dtype: Optional[str] = None
    #: provenance (:data:`PROVENANCE_KEYS`), None where the file gives none: the engine's
    #: command as run, the ``hrm import --from`` target that reads it, the engine's version,
    #: and per quantity the (min, max) of ``spread_n`` repeats whose median is measured
    command: Optional[str] = None
    source: Optional[str] = None
    engine_version: Optional[str] = None
    spread_n: Optional[int] = None
    spread: tuple[tuple[str, float, float], ...] = ()
    #: engine fields the measuring harness changed, not the engine's command (FlexGen's vLLM ops
    #: run as the harness's torch/Triton stand-ins: docs/engines/flexgen.md §10), as (dotted
    #: field, value); applied over the engine, the one the command sets included
    harness_fields: tuple[tuple[str, float], ...] = ()


class Runs(BaseModel):
    """A runs file: the profile and model it names (resolved against the file's folder),
    its runs, and its sha256."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    sha256: str
    hardware: str
    model: str
    runs: tuple[Run, ...]
    #: the file's ``routing`` (``--routing`` syntax, a trace's path resolved beside the file): which
    #: experts the measured runs' tokens chose, when that is known (FlexGen's dummy weights send
    #: every token to experts 0 and 1); None: the model's own (uniform)
    routing: Optional[str] = None


def _resolve_beside(value: str, folder: Path) -> str:
    """A relative path (a folder in it, or a file suffix) that exists beside the runs file,
    else ``value`` unchanged (a shipped name, or a path from the working folder)."""
    path_like = "/" in value or value.endswith((".yaml", ".yml", ".json"))
    candidate = folder / value
    return str(candidate) if path_like and not Path(value).is_absolute() and candidate.exists() else value


def _text(data: dict, key: str, where: str) -> str:
    if key not in data:
        raise HRMError(f"{where}: missing key '{key}'")
    value = data[key]
    if not isinstance(value, str) or not value.strip():
        raise HRMError(f"{where}.{key}: expected a non-empty string, got {type(value).__name__}")
    return value.strip()


def _unknown_keys(data: dict, known: tuple[str, ...], where: str) -> None:
    extra = [str(k) for k in data if k not in known]
    if extra:
        raise HRMError(f"{where}: unknown key '{extra[0]}' (keys: {', '.join(known)})")


def _engine(text: str, folder: Path, where: str) -> Engine:
    path = Path(_resolve_beside(text, folder))
    if text != "ideal" and text not in list_engines() and not (path.suffix in (".yaml", ".yml") and path.is_file()):
        raise HRMError(f"{where}: unknown engine '{text}' (shipped: {', '.join(list_engines())}; or a YAML file)")
    try:
        return load_engine(str(path) if path.suffix in (".yaml", ".yml") else text)
    except HRMError as exc:
        raise HRMError(f"{where}: {exc}") from None


def _workload(value, where: str) -> Workload:
    """A preset name, or a mapping of prompt_len, max_prompt_len, gen_len, padding (and an
    optional preset the others override)."""
    if isinstance(value, str):
        value = {"preset": value}
    if not isinstance(value, dict):
        raise HRMError(f"{where}: expected a preset name ({', '.join(PRESETS)}) or a mapping of "
                       f"{', '.join(WORKLOAD_KEYS)}")
    _unknown_keys(value, WORKLOAD_KEYS, where)
    numbers = {k: value.get(k) for k in ("prompt_len", "max_prompt_len", "gen_len")}
    for key, number in numbers.items():
        if number is not None and (isinstance(number, bool) or not isinstance(number, int)):
            raise HRMError(f"{where}.{key}: expected a whole number of tokens, got {number!r}")
    padding = value.get("padding", False)
    if not isinstance(padding, bool):
        raise HRMError(f"{where}.padding: expected true or false, got {padding!r}")
    try:
        return make_workload(value.get("preset"), numbers["prompt_len"], numbers["max_prompt_len"],
                             numbers["gen_len"], padding)
    except HRMError as exc:
        raise HRMError(f"{where}: {exc}") from None


def _positive_number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise HRMError(f"{where}: expected a finite positive number, got {value!r}")
    return float(value)


def _measured(value, where: str) -> tuple[Measurement, ...]:
    if not isinstance(value, dict) or not value:
        raise HRMError(f"{where}: expected a mapping of one or more of {', '.join(QUANTITIES)}")
    out = []
    for key, number in value.items():
        if key not in QUANTITIES:
            raise HRMError(f"{where}: unknown quantity '{key}' (one of {', '.join(QUANTITIES)})")
        out.append(Measurement(quantity=key, value=_positive_number(number, f"{where}.{key}")))
    return tuple(out)


def _spread(value, measured: tuple[Measurement, ...], where: str) -> tuple[Optional[int], tuple]:
    """``spread: {n: N, QUANTITY: [min, max], ...}``: N ≥ 2 repeats, each quantity one of the
    run's measured ones, min ≤ measured ≤ max."""
    if value is None:
        return None, ()
    if not isinstance(value, dict):
        raise HRMError(f"{where}: expected a mapping of n and [min, max] per measured quantity")
    n = value.get("n")
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise HRMError(f"{where}.n: expected the number of repeats (2 or more), got {n!r}")
    shown = {m.quantity: m.value for m in measured}
    out = []
    for key, pair in value.items():
        if key == "n":
            continue
        if key not in shown:
            raise HRMError(f"{where}: '{key}' is not one of the run's measured quantities ({', '.join(shown)})")
        if not isinstance(pair, list) or len(pair) != 2:
            raise HRMError(f"{where}.{key}: expected [min, max], got {pair!r}")
        lo, hi = (_positive_number(x, f"{where}.{key}") for x in pair)
        if not lo <= shown[key] <= hi:
            raise HRMError(f"{where}.{key}: measured {shown[key]} lies outside [{lo}, {hi}]")
        out.append((key, lo, hi))
    return n, tuple(out)


def _optional_text(data: dict, key: str, where: str) -> Optional[str]:
    return None if data.get(key) is None else _text(data, key, where)


def _source(data: dict, where: str) -> Optional[str]:
    """``from``: an ``hrm import --from`` target (it reads ``command``)."""
    from ..export import EXPORTERS

    name = _optional_text(data, "from", where)
    if name is not None and name not in EXPORTERS:
        raise HRMError(f"{where}.from: unknown import target '{name}' (one of {', '.join(EXPORTERS)})")
    if name is not None and data.get("command") is None:
        raise HRMError(f"{where}: 'from' names the target that reads 'command': give the command")
    return name


def _memory(data: dict, key: str, where: str) -> Optional[float]:
    return None if data.get(key) is None else _positive_number(data[key], f"{where}.{key}")


def _harness_fields(value, engine: Engine, where: str) -> tuple[tuple[str, float], ...]:
    """``harness_fields: {dotted engine field: number}``, each a field ``engine`` has (checked
    by setting it)."""
    if value is None:
        return ()
    if not isinstance(value, dict) or not value:
        raise HRMError(f"{where}: expected a mapping of dotted engine fields to numbers")
    fields = tuple((str(k), _positive_number(v, f"{where}.{k}")) for k, v in value.items())
    try:
        with_harness(engine, fields)
    except (KeyError, TypeError, ValueError) as exc:
        raise HRMError(f"{where}: not a field of engine {engine.name}: {str(exc).splitlines()[0]}") from None
    return fields


def with_harness(engine: Engine, fields: tuple[tuple[str, float], ...]) -> Engine:
    """``engine`` with the harness's fields set (unchanged without any)."""
    from ..engines.mechanisms import with_fields

    return with_fields(engine, dict(fields)) if fields else engine


def parse_run(data, index: int, folder: Path, source: str, dtype: Optional[str] = None) -> Run:
    """One entry of ``runs:``; HRMError naming ``source`` and the entry's field."""
    where = f"{source}: runs[{index}]"
    if not isinstance(data, dict):
        raise HRMError(f"{where}: expected a mapping of {', '.join(RUN_KEYS)}")
    _unknown_keys(data, RUN_KEYS, where)
    engine = _engine(_text(data, "engine", where), folder, f"{where}.engine")
    for key in ("workload", "measured"):
        if key not in data:
            raise HRMError(f"{where}: missing key '{key}'")
    workload = _workload(data["workload"], f"{where}.workload")
    policy = parse_policy(_text(data, "policy", where), f"{where}.policy")
    label = data.get("name")
    label = str(label) if label is not None else f"#{index + 1} {engine.name}"
    measured = _measured(data["measured"], f"{where}.measured")
    spread_n, spread = _spread(data.get("spread"), measured, f"{where}.spread")
    harness = _harness_fields(data.get("harness_fields"), engine, f"{where}.harness_fields")
    return Run(label=label, engine=with_harness(engine, harness), harness_fields=harness, workload=workload, policy=policy,
               gpu_mem_gib=_memory(data, "gpu_mem_gib", where), cpu_mem_gib=_memory(data, "cpu_mem_gib", where),
               measured=measured, dtype=dtype, command=_optional_text(data, "command", where),
               source=_source(data, where), engine_version=_optional_text(data, "engine_version", where),
               spread_n=spread_n, spread=spread)


def load_runs(path: str | Path) -> Runs:
    """Read a runs file (YAML through the project's safe reader); HRMError, one line naming
    the file and the field, for anything missing, unknown or not a finite positive number."""
    data = read_yaml_mapping(path, "a runs YAML file", "hardware, model and runs")
    source = str(path)
    _unknown_keys(data, ("hardware", "model", "dtype", "routing", "runs"), source)
    dtype = data.get("dtype")
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise HRMError(f"{source}: dtype: expected one of {', '.join(FLOAT_DTYPES)}, got {dtype!r}")
    folder = Path(path).parent
    hardware = _resolve_beside(_text(data, "hardware", source), folder)
    model = _resolve_beside(_text(data, "model", source), folder)
    entries = data.get("runs")
    if not isinstance(entries, list) or not entries:
        raise HRMError(f"{source}: runs: expected a list of one or more runs")
    runs = tuple(parse_run(entry, i, folder, source, dtype) for i, entry in enumerate(entries))
    digest = hashlib.sha256(read_input_text(path, "a runs YAML file").encode()).hexdigest()
    routing = _optional_text(data, "routing", source)
    if routing is not None and routing.startswith("trace:"):
        routing = "trace:" + _resolve_beside(routing[len("trace:"):], folder)
    return Runs(path=source, sha256=digest, hardware=hardware, model=model, runs=runs, routing=routing)


def runs_model(runs: Runs):
    """The runs file's model, routed as its ``routing`` says (HRMError naming the file)."""
    from ..model.routing import parse_routing
    from ..model.spec import load_model

    try:
        model = load_model(runs.model)
        if runs.routing is None:
            return model
        routing = parse_routing(runs.routing, model.num_experts, model.top_k, model.name)
        return model.model_copy(update={"routing": routing})
    except HRMError as exc:
        raise HRMError(f"{runs.path}: {exc}") from None


def run_as_commanded(run: Run, hardware, model) -> Run:
    """``run`` with its engine set as its ``command`` sets it (what ``hrm import --from`` reads:
    ``--pin-weight 1`` makes FlexGen's weights pinned, ``-t 2`` llama.cpp's threads), so that a
    run is predicted with the mechanisms it ran, not the engine file's defaults. A run without
    a command, or whose engine is not one of the import target's, is returned as it is."""
    if run.source is None or run.command is None:
        return run
    from ..export.importing import imported_engine, read_command

    imported = read_command(run.source, run.command, model, run.workload, hardware)
    engine = with_harness(imported_engine(run.source, imported, run.engine.name), run.harness_fields)
    return run if engine == run.engine else run.model_copy(update={"engine": engine})

