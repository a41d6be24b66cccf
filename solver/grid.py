"""A sweep grid: hardware × model × workload × engine × what-if axes, and its cells.

A grid (``hrm sweep GRID.yaml``, or :class:`SweepGrid` in code) names lists; every
combination is one :class:`Cell`, one ``hrm-search`` on the machine the what-ifs make.
Cells carry the resolved profile, model and engine (not file names), so a worker process
or a Ray node needs the package but none of the grid's files. Each cell has a key — a
hash of everything its result depends on, the profile's and the model's sha256 included —
so a resumed sweep skips exactly the cells whose answer it already has and re-runs a cell
whose profile file changed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hrm import bounds
from hrm.engines.engine import DEFAULT_ENGINE, Engine, is_shipped, resolve_engine
from hrm.errors import HRMError, pydantic_message
from hrm.machine.hardware import HardwareProfile, load_hardware
from hrm.model.spec import ModelSpec, load_model
from hrm.model.options import ModelOptions
from hrm.units import DTYPES, GIB
from hrm.workload import PRESETS, Workload, make_workload

from .lanes.terms import DEFAULT_MAX_BATCH

#: bumped when a cell's result for the same inputs may change meaning (it is in every key)
CELL_FORMAT = 1
#: plausible number of cells of one grid (4 Mi: a week on 2 cores at the median 0.1 s/search)
MAX_SWEEP_CELLS = 1 << 22
SWEEP_CELLS = bounds.Range(1, MAX_SWEEP_CELLS, "cells", integer=True, why="cells of one grid")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkloadSpec(_Strict):
    """One workload of the grid: a preset with optional overrides (as the CLI flags)."""

    preset: Optional[Literal[tuple(PRESETS)]] = None  # type: ignore[valid-type]
    prompt_len: Optional[bounds.TOKENS.type] = None
    max_prompt_len: Optional[bounds.TOKENS.type] = None
    gen_len: Optional[bounds.GEN_TOKENS.type] = None
    padding: bounds.Flag = False

    @model_validator(mode="after")
    def _complete(self):
        try:
            self.resolve()
        except HRMError as exc:
            raise ValueError(str(exc).removeprefix("workload: ")) from None
        return self

    def resolve(self) -> Workload:
        return make_workload(self.preset, self.prompt_len, self.max_prompt_len, self.gen_len, self.padding)

    def label(self) -> str:
        """The preset's name when nothing is overridden, else the lengths in short."""
        w = self.resolve()
        if self.preset and (self.prompt_len, self.max_prompt_len, self.gen_len) == (None, None, None):
            return self.preset + ("+pad" if self.padding else "")
        return f"p{w.prompt_len}/{w.max_prompt_len}-g{w.gen_len}" + ("+pad" if w.padding else "")


def _unique(values: list, what: str) -> list:
    seen = set()
    for value in values:
        key = json.dumps(value, sort_keys=True, default=str) if not isinstance(value, (str, float, int)) else value
        if key in seen:
            raise ValueError(f"{value!r} is listed twice in {what}")
        seen.add(key)
    return values


class WhatIf(_Strict):
    """What-if axes (``hrm.machine.whatif`` and ``--gpu-mem/--cpu-mem``); ``null`` in a list means
    the profile as measured (the default, one value)."""

    h2d_gbps: list[Optional[bounds.LINK_GBPS.type]] = Field(default=[None], min_length=1)
    cpu_scale: list[bounds.SCALE.type] = Field(default=[1.0], min_length=1)
    gpu_mem_gib: list[Optional[bounds.TOTAL_GPU_MEMORY_GIB.type]] = Field(default=[None], min_length=1)
    cpu_mem_gib: list[Optional[bounds.CPU_MEMORY_GIB.type]] = Field(default=[None], min_length=1)

    @field_validator("h2d_gbps", "cpu_scale", "gpu_mem_gib", "cpu_mem_gib")
    @classmethod
    def _no_repeats(cls, values, info):
        return _unique(values, info.field_name)


class SweepGrid(_Strict):
    """The GRID.yaml of ``hrm sweep`` (every list non-empty, no entry twice).

    - ``hardware``: shipped profile names or profile YAML paths (relative to the grid file);
    - ``models``: catalog names or config.json paths;
    - ``workloads``: preset names or mappings ``{preset, prompt_len, max_prompt_len, gen_len, padding}``;
    - ``engines``: engine names, engine YAML paths, or ``ideal/SCHEDULE`` (default: ``DEFAULT_ENGINE``);
    - ``routings``: ``uniform``, ``zipf:S`` or ``trace:FILE`` (``--routing``), applied to every model;
    - ``batch_sizes``: batch sizes N to pin (``null``: searched, the default), as ``--fix N=``;
    - ``what_if``: :class:`WhatIf` axes; ``objective``, ``max_batch``, ``gpu_util``,
      ``cpu_util``, ``weight_dtype``, ``kv_dtype`` as the ``hrm-search`` flags.
    """

    hardware: list[str] = Field(min_length=1)
    models: list[str] = Field(min_length=1)
    workloads: list[WorkloadSpec] = Field(default_factory=lambda: [WorkloadSpec(preset="mtbench")], min_length=1)
    # default: the one default engine (hrm.engines.engine.DEFAULT_ENGINE); a cell's hardware is not
    # known when the list resolves, so a CPU-only profile's grid names ``ideal`` itself
    engines: list[str] = Field(default_factory=lambda: [DEFAULT_ENGINE], min_length=1)
    routings: list[str] = Field(default=["uniform"], min_length=1)
    batch_sizes: list[Optional[bounds.SEARCH_BATCH.type]] = Field(default=[None], min_length=1)
    what_if: WhatIf = Field(default_factory=WhatIf)
    objective: Literal["generation", "decode", "latency"] = "generation"
    max_batch: bounds.SEARCH_BATCH.type = DEFAULT_MAX_BATCH
    gpu_util: Optional[bounds.MEMORY_UTILIZATION.type] = None
    cpu_util: Optional[bounds.MEMORY_UTILIZATION.type] = None
    # the --weight-dtype/--kv-dtype choices: checked here, once, not by every cell
    weight_dtype: Optional[Literal[DTYPES]] = None  # type: ignore[valid-type]
    kv_dtype: Optional[Literal[DTYPES]] = None  # type: ignore[valid-type]

    @field_validator("hardware", "models", "engines", "routings")
    @classmethod
    def _names(cls, values, info):
        for value in values:
            if not value.strip():
                raise ValueError(f"an empty name in {info.field_name}")
        return _unique(values, info.field_name)

    @field_validator("batch_sizes")
    @classmethod
    def _batches(cls, values):
        return _unique(values, "batch_sizes")

    @field_validator("workloads", mode="before")
    @classmethod
    def _presets(cls, values):
        """A bare string is a preset name."""
        if isinstance(values, list):
            for value in values:
                if isinstance(value, str) and value not in PRESETS:
                    raise ValueError(f"unknown preset '{value}' (one of {', '.join(PRESETS)}; or a mapping of lengths)")
            return [{"preset": v} if isinstance(v, str) else v for v in values]
        return values

    @field_validator("workloads")
    @classmethod
    def _workloads(cls, values):
        _unique([s.model_dump() for s in values], "workloads")
        return values

    @model_validator(mode="after")
    def _size(self):
        count = self.cell_count()
        refusal = SWEEP_CELLS.refusal(count)
        if refusal:
            raise ValueError(f"the grid's lists multiply to {count} cells: {refusal}")
        if self.objective == "latency" and None in self.batch_sizes:
            raise ValueError("objective latency minimises the per-token latency at a given batch: "
                             "batch_sizes must all be numbers")
        return self

    def cell_count(self) -> int:
        w = self.what_if
        return math.prod(map(len, (self.hardware, self.models, self.routings, self.workloads, self.engines, self.batch_sizes,
                                   w.h2d_gbps, w.cpu_scale, w.gpu_mem_gib, w.cpu_mem_gib)))

    def options(self) -> ModelOptions:
        given = {"gpu_memory_utilization": self.gpu_util, "cpu_memory_utilization": self.cpu_util}
        return ModelOptions(**{k: v for k, v in given.items() if v is not None})


def read_grid(path: str | Path) -> SweepGrid:
    """A grid from a YAML file; HRMError (one line naming the file and field) otherwise."""
    from hrm.errors import read_yaml_mapping, validated

    fields = "grid fields (hardware, models, workloads, engines, what_if, ...)"
    return validated(SweepGrid, read_yaml_mapping(path, "a sweep grid YAML file", fields), str(path))


@dataclass(frozen=True)
class Cell:
    """One search of a sweep: the measured machine, the what-ifs to apply to it, the model,
    the workload and the engine, resolved. :meth:`key` names it across runs."""

    hardware_name: str
    hardware: HardwareProfile
    hardware_sha256: str
    model_name: str
    model: ModelSpec
    model_sha256: str
    workload_name: str
    workload: Workload
    engine: Engine
    engine_sha256: str
    batch_size: Optional[int] = None
    h2d_gbps: Optional[float] = None
    cpu_scale: float = 1.0
    gpu_mem_gib: Optional[float] = None
    cpu_mem_gib: Optional[float] = None
    objective: str = "generation"
    max_batch: int = DEFAULT_MAX_BATCH
    options: ModelOptions = ModelOptions()

    def key(self) -> str:
        """sha256 (hex, 16 digits) of everything the cell's result depends on."""
        return cell_key(self.hardware_sha256, self.model_sha256, self.workload, self.engine_sha256, self.batch_size,
                        self.h2d_gbps, self.cpu_scale, self.gpu_mem_gib, self.cpu_mem_gib, self.objective,
                        self.max_batch, self.options)

    def machine(self) -> HardwareProfile:
        """The profile with this cell's what-ifs (CPU scaled first, then the link set, as the
        paper's Fig. 10 axes); HRMError when a what-if does not apply or leaves the bounds."""
        from hrm.machine.whatif import with_cpu_scaled, with_link_bandwidth

        hw = self.hardware
        try:
            if self.cpu_scale != 1.0:
                hw = with_cpu_scaled(hw, self.cpu_scale)
            if self.h2d_gbps is not None:
                hw = with_link_bandwidth(hw, self.h2d_gbps)
        except ValidationError as exc:
            raise HRMError(pydantic_message(f"the what-if machine {hw.name}", exc)) from None
        return hw


def cell_key(hardware_sha256: str, model_sha256: str, workload: Workload, engine_sha256: str,
             batch_size: Optional[int], h2d_gbps: Optional[float], cpu_scale: float, gpu_mem_gib: Optional[float],
             cpu_mem_gib: Optional[float], objective: str, max_batch: int, options: ModelOptions) -> str:
    """:meth:`Cell.key` from the cell's parts (so a grid's keys can be matched without its cells)."""
    inputs = {"format": CELL_FORMAT, "hardware": hardware_sha256, "model": model_sha256,
              "workload": workload.model_dump(), "engine": engine_sha256, "h2d_gbps": h2d_gbps,
              **({"batch_size": batch_size} if batch_size is not None else {}),
              "cpu_scale": cpu_scale, "gpu_mem_gib": gpu_mem_gib, "cpu_mem_gib": cpu_mem_gib,
              "objective": objective, "max_batch": max_batch, "options": options.model_dump()}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def engine_sha256(engine: Engine) -> str:
    """Shipped engines by name (and schedule); others by their whole definition."""
    text = f"{engine.name}/{engine.schedule}" if is_shipped(engine) else engine.model_dump_json()
    return hashlib.sha256(text.encode()).hexdigest()


def _engine(spec: str, base: Path | None) -> Engine:
    """``NAME``, ``FILE.yaml`` (relative to the grid file) or ``ideal/SCHEDULE``."""
    name, _, schedule = spec.partition("/") if spec.startswith("ideal/") else (spec, "", "")
    return resolve_engine(_relative(name, base), schedule or None)


def _relative(name: str, base: Path | None) -> str:
    """A path relative to the grid file's folder when that file exists; else as given
    (a shipped name, or a path relative to the working folder)."""
    if base is not None and not Path(name).is_absolute() and (base / name).is_file():
        return str(base / name)
    return name


def _routing(text: str, model: ModelSpec, base: Path | None):
    """``--routing`` text for ``model``; a trace path relative to the grid file."""
    from hrm.model.routing import parse_routing

    kind, _, arg = text.partition(":")
    return parse_routing(f"trace:{_relative(arg, base)}" if kind == "trace" and arg else text, model.num_experts,
                         model.top_k, model.name)


def make_cells(hardware: Iterable[tuple[str, HardwareProfile]], models: Iterable[tuple[str, ModelSpec]],
               workloads: Iterable[tuple[str, Workload]], engines: Iterable[Engine], what_if: WhatIf = WhatIf(),
               objective: str = "generation", max_batch: int = DEFAULT_MAX_BATCH,
               options: ModelOptions = ModelOptions(), batch_sizes: Iterable[Optional[int]] = (None,)) -> list[Cell]:
    """Every combination, in grid order (hardware slowest, CPU memory fastest)."""
    hardware = [(name, hw, hw.sha256()) for name, hw in hardware]
    models = [(name, m, m.sha256()) for name, m in models]
    engines = [(e, engine_sha256(e)) for e in engines]
    axes = (hardware, models, list(workloads), engines, list(batch_sizes), what_if.h2d_gbps, what_if.cpu_scale,
            what_if.gpu_mem_gib, what_if.cpu_mem_gib)
    return [Cell(hw_name, hw, hw_sha, model_name, model, model_sha, workload_name, workload, engine, eng_sha,
                 batch, h2d, scale, gpu_mem, cpu_mem, objective, max_batch, options)
            for (hw_name, hw, hw_sha), (model_name, model, model_sha), (workload_name, workload), (engine, eng_sha),
            batch, h2d, scale, gpu_mem, cpu_mem in itertools.product(*axes)]


def _resolve(grid: SweepGrid, source: str | Path | None):
    """The grid's hardware, (model, routing), workload and engine lists, resolved."""
    base = Path(source).parent if source is not None else None
    where = str(source) if source is not None else "grid"

    def each(field: str, names, load):
        out = []
        for index, name in enumerate(names):
            try:
                out.append(load(name))
            except HRMError as exc:
                raise HRMError(f"{where}: {field}[{index}] {name!r}: {exc}") from None
        return out

    hardware = each("hardware", grid.hardware, lambda n: (n, load_hardware(_relative(n, base))))
    models = each("models", grid.models, lambda n: (n, load_model(_relative(n, base), grid.weight_dtype, grid.kv_dtype)))
    models = [(name, model.with_routing(routing))
              for name, model in models
              for routing in each("routings", grid.routings, lambda r: _routing(r, model, base))]
    workloads = each("workloads", grid.workloads, lambda s: (s.label(), s.resolve()))
    engines = each("engines", grid.engines, lambda n: _engine(n, base))
    return hardware, models, workloads, engines


def grid_cells(grid: SweepGrid, source: str | Path | None = None) -> list[Cell]:
    """Resolve every name of ``grid`` (paths relative to the folder of ``source``, the grid
    file) and expand it; HRMError naming the grid field on a name that does not resolve."""
    hardware, models, workloads, engines = _resolve(grid, source)
    return make_cells(hardware, models, workloads, engines, grid.what_if, grid.objective, grid.max_batch,
                      grid.options(), grid.batch_sizes)


@dataclass(frozen=True)
class CellCount:
    """What ``hrm sweep --dry-run`` prints: cells, distinct keys, and keys already done."""

    cells: int
    distinct: int
    done: int


def count_cells(grid: SweepGrid, source: str | Path | None = None, rows: Iterable[dict] = ()) -> CellCount:
    """The grid's cells counted without expanding them: the product of the axes' lengths,
    the product of the axes' distinct key parts (two names of one profile are one key), and
    how many of the grid's keys are among ``rows`` (a sweep output's rows: each row's inputs
    give the few grid cells it can be, whose keys are compared with its ``cell_key``). Time
    in the number of rows and axis values, not cells: milliseconds at :data:`MAX_SWEEP_CELLS`."""
    hardware, models, workloads, engines = _resolve(grid, source)
    w = grid.what_if
    hw_sha = [hw.sha256() for _, hw in hardware]
    model_sha = [m.sha256() for _, m in models]
    engine_sha = [engine_sha256(e) for e in engines]
    work = [wl for _, wl in workloads]
    parts = (hw_sha, model_sha, [json.dumps(wl.model_dump(), sort_keys=True) for wl in work], engine_sha,
             grid.batch_sizes, w.h2d_gbps, w.cpu_scale, w.gpu_mem_gib, w.cpu_mem_gib)
    cells = math.prod(len(p) for p in parts)
    distinct = math.prod(len(set(p)) for p in parts)
    options = grid.options()

    def same(value, stored) -> bool:
        if value is None or stored is None or (isinstance(stored, float) and math.isnan(stored)):
            return False
        return math.isclose(float(value), float(stored), rel_tol=1e-12)

    def maybe(values, stored):
        """The grid values a stored (effective) what-if can come from: None (as profiled) or an equal value."""
        return [v for v in values if v is None or same(v, stored)]

    found: set[str] = set()
    for row in rows:
        key = row.get("cell_key")
        batch = row.get("pinned_batch_size")
        batch = None if batch is None or (isinstance(batch, float) and math.isnan(batch)) else int(batch)
        candidates = itertools.product(
            sorted({s for s in hw_sha if s == row.get("hardware_sha256")}),
            sorted({s for s in model_sha if s == row.get("model_sha256")}),
            [wl for wl in dict.fromkeys(work) if (wl.prompt_len, wl.max_prompt_len, wl.gen_len, bool(wl.padding)) ==
             (row.get("prompt_len"), row.get("max_prompt_len"), row.get("gen_len"), bool(row.get("padding")))],
            sorted({sha for e, sha in zip(engines, engine_sha)
                    if e.name == row.get("engine") and e.schedule == row.get("schedule")}),
            [b for b in grid.batch_sizes if b == batch],
            maybe(w.h2d_gbps, row.get("h2d_gbps")), [v for v in w.cpu_scale if same(v, row.get("cpu_scale"))],
            maybe(w.gpu_mem_gib, row.get("gpu_mem_gib")), maybe(w.cpu_mem_gib, row.get("cpu_mem_gib")))
        for hw, model, wl, eng, b, h2d, scale, gpu, cpu in candidates:
            if cell_key(hw, model, wl, eng, b, h2d, scale, gpu, cpu, grid.objective, grid.max_batch, options) == key:
                found.add(key)
                break
    return CellCount(cells, distinct, len(found))


def effective_inputs(cell: Cell) -> dict:
    """The input columns of a cell's row: names, hashes, the workload's lengths, and the
    what-if values in effect (the machine's link and capacities, the requested ones or the
    profile's; NaN where the machine has no such part)."""
    hw = cell.hardware
    link = cell.h2d_gbps if cell.h2d_gbps is not None else (hw.link.h2d_gbps if hw.link else math.nan)
    if cell.gpu_mem_gib is not None:
        gpu_mem = cell.gpu_mem_gib
    else:
        gpu_mem = hw.gpu.memory_bytes * hw.gpu.count / GIB if hw.gpu else math.nan
    cpu_mem = cell.cpu_mem_gib if cell.cpu_mem_gib is not None else hw.cpu.memory_bytes * cell.cpu_scale / GIB
    w = cell.workload
    return {
        "cell_key": cell.key(), "hardware": cell.hardware_name, "hardware_sha256": cell.hardware_sha256,
        "model": cell.model_name, "model_sha256": cell.model_sha256,
        "routing": cell.model.routing.label() if cell.model.routing is not None else "uniform",
        "workload": cell.workload_name,
        "prompt_len": w.prompt_len, "max_prompt_len": w.max_prompt_len, "gen_len": w.gen_len, "padding": w.padding,
        "engine": cell.engine.name, "schedule": cell.engine.schedule,
        "pinned_batch_size": cell.batch_size if cell.batch_size is not None else None, "h2d_gbps": float(link),
        "cpu_scale": float(cell.cpu_scale), "gpu_mem_gib": float(gpu_mem), "cpu_mem_gib": float(cpu_mem),
        "objective": cell.objective, "max_batch": cell.max_batch,
        "gpu_memory_utilization": cell.options.gpu_memory_utilization,
        "cpu_memory_utilization": cell.options.cpu_memory_utilization,
    }
