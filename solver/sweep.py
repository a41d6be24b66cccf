"""Run the cells of a sweep (:mod:`solver.grid`) on a backend, one row per cell, as Parquet.

- :func:`run_cell`: one cell → one row (inputs, policy, throughputs, bottleneck, binding
  memory, solve time; an infeasible cell keeps its reason, a cell whose inputs do not apply
  — a link what-if on a CPU-only profile, a workload past the model's context — is
  ``refused`` with the reason);
- :data:`BACKENDS`: where cells run — ``inline`` (this process), ``local`` (a process pool,
  the default) and ``ray`` (Ray tasks on a cluster, local Ray when no address);
- :func:`run_sweep`: cells → table in grid order; with ``out`` it skips cells whose key the
  file already holds (resume), saves atomically every ``save_every_s`` and on Ctrl-C;
- :func:`policy_map` and :func:`cpu_memory_sweep`: the paper's Fig. 10 and Fig. 1 grids.

Every cell is one :func:`solver.search.search` call, so a row equals what ``hrm-search``
prints for that machine. Rows do not depend on the backend or the worker count; only
``solve_s`` (a measured time) differs between runs.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Iterable, Iterator, Optional

import pandas as pd

from hrm.errors import HRMError, InfeasibleError
from hrm.problem import Problem

from .grid import Cell, WhatIf, effective_inputs, make_cells

#: written into the Parquet file's metadata; a file of another version is not resumed
SWEEP_FORMAT = "hrm-sweep/1"
#: default seconds between atomic saves of a running sweep's output (what a crash can lose)
SAVE_EVERY_S = 30.0
#: cells per task sent to a worker: few enough to balance, enough to amortise the IPC
MAX_CELLS_PER_TASK = 8

INPUT_COLUMNS = {
    "cell_key": "string", "hardware": "string", "hardware_sha256": "string", "model": "string",
    "model_sha256": "string", "routing": "string", "workload": "string", "prompt_len": "int64", "max_prompt_len": "int64",
    "gen_len": "int64", "padding": "bool", "engine": "string", "schedule": "string", "pinned_batch_size": "int64",
    "h2d_gbps": "float64",
    "cpu_scale": "float64", "gpu_mem_gib": "float64", "cpu_mem_gib": "float64", "objective": "string",
    "max_batch": "int64", "gpu_memory_utilization": "float64", "cpu_memory_utilization": "float64",
}
RESULT_COLUMNS = {
    "status": "string", "feasible": "bool", "reason": "string", "batch_size": "int64", "micro_batch_size": "int64",
    "num_micro_batches": "int64", "attn_on_gpu": "bool", "ffn_on_gpu": "bool", "weights_gpu_ratio": "float64",
    "kv_gpu_ratio": "float64", "weights_offloaded": "float64", "kv_offloaded": "float64",
    "generation_throughput_tok_s": "float64", "decode_throughput_tok_s": "float64", "per_token_latency_s": "float64",
    "prefill_latency_s": "float64", "bottleneck": "string", "binding_memory": "string", "gpu_peak_bytes": "float64",
    "cpu_peak_bytes": "float64", "gpu_limit_bytes": "float64", "cpu_limit_bytes": "float64", "solve_s": "float64",
}
#: one row per cell; every column typed (Parquet, pandas and DuckDB read the same types)
COLUMNS = {**INPUT_COLUMNS, **RESULT_COLUMNS}
#: columns that depend on the machine the sweep ran on, not on the cell
MEASURED_COLUMNS = ("solve_s",)


def run_cell(cell: Cell) -> dict:
    """One cell's search as a row (:data:`COLUMNS`)."""
    from hrm.cost.memory import memory_limits

    from .search import search

    start = time.perf_counter()
    row = dict.fromkeys(RESULT_COLUMNS)
    row.update(effective_inputs(cell))
    try:
        machine = cell.machine()
        limits = memory_limits(machine, cell.options, cell.gpu_mem_gib, cell.cpu_mem_gib)
        fixed = {"batch_size": cell.batch_size} if cell.batch_size is not None else None
        result = search(machine, cell.model, cell.workload, objective=cell.objective, max_batch=cell.max_batch,
                        options=cell.options, limits=limits, top=0, engine=cell.engine, fixed=fixed)
    except InfeasibleError as exc:
        row.update(status="infeasible", feasible=False, reason=" ".join(str(exc).split()))
    except HRMError as exc:
        row.update(status="refused", feasible=False, reason=" ".join(str(exc).split()))
    except Exception as exc:  # noqa: BLE001 - one cell's failure is its row's status; the sweep goes on
        row.update(status="error", feasible=False, reason=f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:500])
    else:
        p, e = result.best.policy, result.best.estimate
        row.update(
            status="ok", feasible=True, reason="", batch_size=p.batch_size, micro_batch_size=p.micro_batch_size,
            num_micro_batches=p.num_micro_batches, attn_on_gpu=p.attn_on_gpu, ffn_on_gpu=p.ffn_on_gpu,
            weights_gpu_ratio=p.weights_gpu_ratio, kv_gpu_ratio=p.kv_gpu_ratio,
            weights_offloaded=1.0 - p.weights_gpu_ratio, kv_offloaded=1.0 - p.kv_gpu_ratio,
            generation_throughput_tok_s=e.generation_throughput_tok_s,
            decode_throughput_tok_s=e.decode_throughput_tok_s, per_token_latency_s=e.per_token_latency_s,
            prefill_latency_s=e.prefill_latency_s, bottleneck=e.bottleneck, binding_memory=e.binding_memory,
            gpu_peak_bytes=e.gpu_peak_bytes, cpu_peak_bytes=e.cpu_peak_bytes, gpu_limit_bytes=e.gpu_limit_bytes,
            cpu_limit_bytes=e.cpu_limit_bytes)
    row["solve_s"] = time.perf_counter() - start
    return row


def run_cells(cells: list[Cell]) -> list[dict]:
    """A task: several cells, in order (what a worker runs)."""
    return [run_cell(cell) for cell in cells]


# --- backends: where cells run ----------------------------------------------------------
Backend = Callable[[list[Cell], int, Optional[str]], Iterator[tuple[list[int], list[dict]]]]


def _tasks(count: int, workers: int) -> list[list[int]]:
    """Cell indices split into tasks: about 4 per worker, at most MAX_CELLS_PER_TASK each."""
    size = max(1, min(MAX_CELLS_PER_TASK, count // max(1, 4 * workers)))
    return [list(range(i, min(i + size, count))) for i in range(0, count, size)]


def _inline(cells: list[Cell], workers: int, address: str | None):
    for index, cell in enumerate(cells):
        yield [index], [run_cell(cell)]


def _ignore_sigint() -> None:
    """Pool workers leave Ctrl-C to the parent, which saves what is done and stops them."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _local_pool(cells: list[Cell], workers: int, address: str | None):
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    if workers <= 1 or len(cells) <= 1:
        yield from _inline(cells, workers, address)
        return
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_ignore_sigint)
    try:
        pending = {pool.submit(run_cells, [cells[i] for i in task]): task for task in _tasks(len(cells), workers)}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield pending.pop(future), future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


#: Ray's switch between "this node is part of a cluster" (its address as others see it) and
#: "a machine on its own" (the loopback address); off, every server of a local Ray binds 127.0.0.1
RAY_CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: the only address a local Ray started here listens on: nothing of ours is reachable from the network
LOOPBACK = "127.0.0.1"


def start_local_ray(workers: int) -> None:
    """A local Ray with ``workers`` CPUs whose servers (GCS, raylet, workers, runtime-env
    agent) listen on :data:`LOOPBACK` only, without dashboard. ``ray.init(_node_ip_address=
    "127.0.0.1")`` alone is not enough: on Linux Ray replaces a loopback address by the
    machine's network address unless its cluster mode is off (:data:`RAY_CLUSTER_ENV`, read
    by this process at import and by the processes Ray starts)."""
    import logging

    import ray
    from ray._private import ray_constants

    saved_env, saved_flag = os.environ.get(RAY_CLUSTER_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[RAY_CLUSTER_ENV] = "0"  # inherited by the GCS, the raylet and its workers
    ray_constants.ENABLE_RAY_CLUSTER = False  # this process imported Ray before the variable was set
    try:
        ray.init(num_cpus=workers, include_dashboard=False, _node_ip_address=LOOPBACK,
                 logging_level=logging.ERROR, log_to_driver=False)
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(RAY_CLUSTER_ENV, None)
        else:
            os.environ[RAY_CLUSTER_ENV] = saved_env


def _connect_ray(workers: int, address: str | None) -> None:
    """A local Ray (no address; loopback only, :func:`start_local_ray`) or the cluster at
    ``address`` ("auto", "ray://host:port": needs Ray Client, the ``[ray]`` extra's
    ``ray[client]``; without it Ray raises ValueError naming the package)."""
    import logging

    import ray

    try:
        if address in (None, "", "local"):
            start_local_ray(workers)
        else:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise HRMError(f"--ray {address}: cannot connect ({' '.join(str(exc).split())[:200]})") from None


def _ray(cells: list[Cell], workers: int, address: str | None):
    try:
        import ray
    except ImportError:
        raise HRMError("--ray needs Ray: pip install 'hrm-moe[ray]'") from None

    started = not ray.is_initialized()
    if started:
        _connect_ray(workers, address)
    try:
        task = ray.remote(num_cpus=1)(run_cells)
        pending = {task.remote([cells[i] for i in indices]): indices
                   for indices in _tasks(len(cells), max(1, int(ray.cluster_resources().get("CPU", workers))))}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                yield pending.pop(ref), ray.get(ref)
    finally:
        if started:
            ray.shutdown()


#: where cells run: name → generator of (cell indices, their rows) as tasks complete
BACKENDS: dict[str, Backend] = {"inline": _inline, "local": _local_pool, "ray": _ray}


# --- the table --------------------------------------------------------------------------
def _arrow_schema():
    import pyarrow as pa

    types = {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_()}
    return pa.schema([(name, types[kind]) for name, kind in COLUMNS.items()],
                     metadata={"hrm_sweep_format": SWEEP_FORMAT})


def rows_to_table(rows: list[dict]):
    """A pyarrow Table of :data:`COLUMNS` (None → null)."""
    import pyarrow as pa

    return pa.Table.from_pylist(rows, schema=_arrow_schema())


def to_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows as pandas, typed as a saved sweep reads back (nullable ints/bools, NaN floats)."""
    return rows_to_table(rows).to_pandas(types_mapper=_pandas_types)


def _pandas_types(arrow_type):
    import pyarrow as pa

    return {pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype(), pa.string(): pd.StringDtype()}.get(arrow_type)


def parquet_bytes(rows: list[dict]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(rows_to_table(rows), sink)
    return sink.getvalue().to_pybytes()


def read_rows(path: str | os.PathLike) -> list[dict]:
    """The rows of a sweep output; HRMError when the file is not one of this format."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise HRMError(f"--out {path}: exists but is not a Parquet file ({' '.join(str(exc).split())[:160]}); "
                       f"give another --out or delete it") from None
    found = (table.schema.metadata or {}).get(b"hrm_sweep_format", b"").decode()
    if found != SWEEP_FORMAT:
        raise HRMError(f"--out {path}: not a sweep output of format {SWEEP_FORMAT} (found {found or 'none'}); "
                       f"give another --out or delete it")
    want = _arrow_schema()
    wrong = [f"{f.name} ({'missing' if f.name not in table.schema.names else table.schema.field(f.name).type})"
             for f in want if f.name not in table.schema.names or table.schema.field(f.name).type != f.type]
    if wrong:  # marked as a sweep output but damaged: resuming into it would lose or mix rows
        raise HRMError(f"--out {path}: a damaged sweep output, columns {', '.join(wrong[:4])} are not of format "
                       f"{SWEEP_FORMAT}; give another --out or delete it")
    return table.to_pylist()


def read_sweep(path: str | os.PathLike) -> pd.DataFrame:
    """A sweep output as pandas (the types :func:`to_frame` gives)."""
    return to_frame(read_rows(path))


def run_sweep(cells: list[Cell], backend: str = "local", workers: int | None = None, address: str | None = None,
              out: str | os.PathLike | None = None, save_every_s: float = SAVE_EVERY_S,
              progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """Every cell's row, in cell order (cells already in ``out`` are read, not re-run; rows
    of ``out`` that are not cells of this list are kept after them). With ``out`` the table
    is saved atomically every ``save_every_s`` seconds, at the end and on Ctrl-C."""
    from hrm.plan import write_atomic

    if backend not in BACKENDS:
        raise HRMError(f"unknown sweep backend '{backend}' (one of {', '.join(BACKENDS)})")
    workers = max(1, workers or os.cpu_count() or 1)
    keys = [cell.key() for cell in cells]
    old = read_rows(out) if out is not None and os.path.exists(out) else []
    have = {row["cell_key"]: row for row in old}
    todo = [i for i, key in enumerate(keys) if key not in have]
    rows: dict[int, dict] = {}
    wanted = set(keys)
    extra = [row for row in old if row["cell_key"] not in wanted]

    def table() -> list[dict]:
        ordered = [rows.get(i) or have.get(key) for i, key in enumerate(keys)]
        return [row for row in ordered if row is not None] + extra

    def save() -> None:
        if out is not None:
            write_atomic(out, parquet_bytes(table()))

    done, total = len(cells) - len(todo), len(cells)
    if progress:
        progress(done, total)
    last_save = time.monotonic()
    try:
        for indices, results in BACKENDS[backend]([cells[i] for i in todo], workers, address):
            for local, row in zip(indices, results):
                rows[todo[local]] = row
            done += len(indices)
            if progress:
                progress(done, total)
            if out is not None and time.monotonic() - last_save >= save_every_s:
                save()
                last_save = time.monotonic()
    except KeyboardInterrupt:
        save()  # what is done survives; a rerun resumes from it
        raise
    save()
    return to_frame(table())


# --- the paper's figures as grids ---------------------------------------------------------
def _problem_cells(problem: Problem, engines: list, what_if: WhatIf, objective: str) -> list[Cell]:
    """The cells of ``problem``'s machine, model, workload and options under ``engines`` and
    the what-ifs."""
    hw, model = problem.hw, problem.model
    return make_cells([(hw.name, hw)], [(model.name, model)], [("workload", problem.workload)], engines, what_if,
                      objective, options=problem.options)


def policy_map(problem: Problem, h2d_gbps: Iterable[float], cpu_scales: Iterable[float],
               objective: str = "generation", backend: str = "local", workers: int | None = None,
               progress=None) -> pd.DataFrame:
    """Best policy of ``problem``'s engine per (link bandwidth, CPU scaling ratio) cell
    (MoE-Lightning §6.3, Fig. 10: Mixtral-8x7B on 2×A100-80G, prompt 512, gen 32); one row
    per cell."""
    hw = problem.hw
    if hw.gpu is None:
        raise HRMError(f"{hw.name}: a policy map varies the CPU→GPU link; this profile has no GPU")
    axes = WhatIf(h2d_gbps=list(h2d_gbps), cpu_scale=list(cpu_scales))
    return run_sweep(_problem_cells(problem, [problem.engine], axes, objective), backend, workers, progress=progress)


def cpu_memory_sweep(problem: Problem, cpu_mem_gib: Iterable[float],
                     schedules: Iterable[str] = ("cgopipe", "flexgen", "flexgen-cpu-attn", "sequential"),
                     objective: str = "generation", backend: str = "local", workers: int | None = None,
                     progress=None) -> pd.DataFrame:
    """Best policy of each schedule (a schedule of engine ideal, or an engine name; they
    replace ``problem``'s engine) for each CPU memory capacity (GiB, before the utilisation
    headroom, as ``hrm-search --cpu-mem``), the paper's Fig. 1; column ``schedule`` holds the
    schedule or engine name as given."""
    from hrm.engines.engine import as_engine

    schedules = list(schedules)
    cells = _problem_cells(problem, [as_engine(s) for s in schedules], WhatIf(cpu_mem_gib=list(cpu_mem_gib)),
                           objective)
    table = run_sweep(cells, backend, workers, progress=progress)
    per_engine = len(table) // len(schedules)
    table["schedule"] = pd.array([s for s in schedules for _ in range(per_engine)], dtype="string")
    return table
