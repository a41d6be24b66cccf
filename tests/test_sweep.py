"""hrm sweep (issue 15): the grid, its cells, the backends, Parquet output and resume.

Rows are checked against independent searches (a cell is one hrm-search on the what-if
machine); the local pool and Ray must give identical tables on a grid of >= 500 cells.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pandas as pd

import pytest
from conftest import call
import yaml

from hrm.errors import HRMError
from hrm.machine.hardware import load_hardware
from hrm.cost.memory import memory_limits
from hrm.model.spec import load_model
from hrm.machine.whatif import with_cpu_scaled, with_link_bandwidth
from hrm.workload import make_workload
from solver import sweep as sweep_mod
from solver.grid import SweepGrid, grid_cells, read_grid
from solver.search import search
from solver.sweep import COLUMNS, MEASURED_COLUMNS, read_sweep, run_sweep

ROOT = Path(__file__).resolve().parents[1]

SMALL = {"hardware": ["l4", "cpu-only"], "models": ["mixtral"],
         "workloads": ["mtbench", {"prompt_len": 64, "gen_len": 16}], "engines": ["ideal", "moe-lightning"],
         "what_if": {"h2d_gbps": [None, 8.0], "cpu_scale": [1, 2]}}


def write_grid(folder: Path, data: dict, name: str = "grid.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(data))
    return path


def without_measured(table: pd.DataFrame) -> pd.DataFrame:
    return table.drop(columns=list(MEASURED_COLUMNS)).reset_index(drop=True)


# --- the grid ----------------------------------------------------------------------------
def test_grid_expands_every_combination_in_order():
    cells = grid_cells(SweepGrid.model_validate(SMALL))
    assert len(cells) == 2 * 1 * 2 * 2 * 2 * 2
    first, last = cells[0], cells[-1]
    assert (first.hardware_name, first.workload_name, first.engine.name, first.h2d_gbps, first.cpu_scale) == \
        ("l4", "mtbench", "ideal", None, 1.0)
    assert (last.hardware_name, last.workload_name, last.engine.name, last.h2d_gbps, last.cpu_scale) == \
        ("cpu-only", "p64/64-g16", "moe-lightning", 8.0, 2.0)
    assert len({c.key() for c in cells}) == len(cells)


def test_cell_key_names_the_inputs_not_the_order(tmp_path):
    grid = SweepGrid.model_validate(SMALL)
    swapped = SweepGrid.model_validate({**SMALL, "hardware": ["cpu-only", "l4"], "engines": ["moe-lightning", "ideal"]})
    assert {c.key() for c in grid_cells(grid)} == {c.key() for c in grid_cells(swapped)}
    # a changed profile file (same name) is a different cell: a resumed sweep re-runs it
    data = yaml.safe_load((ROOT / "hardware_profiles" / "l4.yaml").read_text())
    data["link"]["h2d_gbps"] = 20.0
    (tmp_path / "l4.yaml").write_text(yaml.safe_dump(data))
    mine = grid_cells(SweepGrid.model_validate({**SMALL, "hardware": ["l4.yaml"]}), tmp_path / "grid.yaml")
    shipped = grid_cells(SweepGrid.model_validate({**SMALL, "hardware": ["l4"]}))
    assert mine[0].hardware_name == "l4.yaml" and mine[0].hardware.link.h2d_gbps == 20.0
    assert not {c.key() for c in mine} & {c.key() for c in shipped}


def test_paths_are_relative_to_the_grid_file(tmp_path):
    engine = yaml.safe_load((ROOT / "hrm" / "data" / "engines" / "moe-lightning.yaml").read_text())
    engine["name"] = "my-engine"
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "mine.yaml").write_text(yaml.safe_dump(engine))
    grid = write_grid(tmp_path / "sub", {"hardware": ["l4"], "models": ["tiny-mixtral"],
                                         "engines": ["mine.yaml", "ideal/flexgen"]})
    cells = grid_cells(read_grid(grid), grid)
    assert [c.engine.name for c in cells] == ["my-engine", "ideal"]
    assert cells[1].engine.schedule == "flexgen"


BAD_GRIDS = [
    ({"models": ["mixtral"]}, "hardware: Field required"),
    ({**SMALL, "hardware": []}, "hardware: List should have at least 1 item"),
    ({**SMALL, "hardware": ["l4", "l4"]}, "'l4' is listed twice in hardware"),
    ({**SMALL, "colour": 1}, "colour: Extra inputs are not permitted"),
    ({**SMALL, "workloads": ["nope"]}, "unknown preset 'nope'"),
    ({**SMALL, "workloads": [{"prompt_len": 0, "gen_len": 8}]}, "workloads.0.prompt_len: 0 tokens must be at least 1"),
    ({**SMALL, "workloads": [{"prompt_len": 64}]}, "workloads.0: missing gen_len"),
    ({**SMALL, "workloads": ["mtbench", {"preset": "mtbench"}]}, "listed twice in workloads"),
    ({**SMALL, "what_if": {"h2d_gbps": [16000000]}}, "what_if.h2d_gbps.0: 16000000 GB/s is above the plausible maximum"),
    ({**SMALL, "what_if": {"cpu_scale": [0]}}, "what_if.cpu_scale.0"),
    ({**SMALL, "what_if": {"cpu_scale": [1, 1.0]}}, "listed twice in cpu_scale"),
    ({**SMALL, "what_if": {"gpu_mem_gib": ["lots"]}}, "what_if.gpu_mem_gib.0"),
    ({**SMALL, "what_if": {"speed": [1]}}, "what_if.speed: Extra inputs"),
    ({**SMALL, "objective": "latency"}, "objective"),
    ({**SMALL, "max_batch": 0}, "max_batch"),
    ({**SMALL, "what_if": {"cpu_scale": [1 + i / 1000 for i in range(999)],
                           "h2d_gbps": [1 + i for i in range(999)], "cpu_mem_gib": [1 + i for i in range(10)]}},
     "cells is above the plausible maximum"),
]


@pytest.mark.parametrize("data,needle", BAD_GRIDS)
def test_bad_grid_refused_with_file_and_field(tmp_path, capsys, data, needle):
    grid = write_grid(tmp_path, data)
    code, out, err = call(capsys, "sweep", grid, "--out", tmp_path / "r.parquet")
    assert code == 2 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {grid}") and needle in lines[0], err
    assert not (tmp_path / "r.parquet").exists()


@pytest.mark.parametrize("field,value,needle", [
    ("hardware", ["l4", "nowhere"], "hardware[1] 'nowhere': hardware profile 'nowhere' not found"),
    ("models", ["nope"], "models[0] 'nope': unknown model"),
    ("engines", ["ideal", "warp"], "engines[1] 'warp'"),
    ("engines", ["ideal/warp"], "engines[0] 'ideal/warp': --schedule: unknown 'warp'"),
])
def test_unresolvable_name_refused(tmp_path, capsys, field, value, needle):
    grid = write_grid(tmp_path, {**SMALL, field: value})
    code, _, err = call(capsys, "sweep", grid, "--out", tmp_path / "r.parquet")
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("content,needle", [("hardware: [l4\n", "malformed YAML"), ("- l4\n", "expected a mapping")])
def test_grid_file_refused(tmp_path, capsys, content, needle):
    (tmp_path / "g.yaml").write_text(content)
    code, _, err = call(capsys, "sweep", tmp_path / "g.yaml", "--out", tmp_path / "r.parquet")
    assert code == 2 and needle in err, err


def test_out_refused_before_work(tmp_path, capsys):
    grid = write_grid(tmp_path, SMALL)
    assert call(capsys, "sweep", grid, "--out", tmp_path / "r.csv")[0] == 2
    assert call(capsys, "sweep", grid, "--out", tmp_path / "nofolder" / "r.parquet")[0] == 2
    assert call(capsys, "sweep", tmp_path / "missing.yaml", "--out", tmp_path / "r.parquet")[0] == 2
    (tmp_path / "other.parquet").write_bytes(b"not parquet")
    code, _, err = call(capsys, "sweep", grid, "--out", tmp_path / "other.parquet")
    assert code == 2 and "not a Parquet file" in err
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1]}), tmp_path / "foreign.parquet")
    code, _, err = call(capsys, "sweep", grid, "--out", tmp_path / "foreign.parquet")
    assert code == 2 and "not a sweep output" in err


# --- rows equal independent searches ----------------------------------------------------
@pytest.mark.slow
def test_rows_equal_hrm_search_on_the_what_if_machine():
    table = run_sweep(grid_cells(SweepGrid.model_validate(SMALL)), backend="inline")
    assert list(table.columns) == list(COLUMNS) and len(table) == 32
    model = load_model("mixtral")
    for _, row in table[table["hardware"] == "l4"].iterrows():
        hw = load_hardware("l4")
        if row["cpu_scale"] != 1:
            hw = with_cpu_scaled(hw, row["cpu_scale"])
        hw = with_link_bandwidth(hw, row["h2d_gbps"]) if row["h2d_gbps"] != load_hardware("l4").link.h2d_gbps else hw
        workload = make_workload("mtbench") if row["workload"] == "mtbench" else make_workload(None, 64, None, 16)
        best = search(hw, model, workload, top=0, engine=row["engine"]).best
        assert row["status"] == "ok" and row["feasible"]
        assert row["generation_throughput_tok_s"] == best.estimate.generation_throughput_tok_s
        assert (row["batch_size"], row["micro_batch_size"], row["attn_on_gpu"]) == \
            (best.policy.batch_size, best.policy.micro_batch_size, best.policy.attn_on_gpu)
        assert row["bottleneck"] == best.estimate.bottleneck and row["binding_memory"] == best.estimate.binding_memory
    cpu = table[table["hardware"] == "cpu-only"]
    # no link to change on a CPU-only host: refused with the reason; as profiled: searched,
    # and Mixtral's 87 GiB do not fit its memory even doubled
    as_profiled = cpu[cpu["h2d_gbps"].isna()]
    assert set(as_profiled["status"]) == {"infeasible"} and len(as_profiled) == 8
    assert as_profiled["reason"].str.contains("exceed usable host memory").all()
    linked = cpu[cpu["reason"].str.contains("no CPU-GPU link")]
    assert len(linked) == 8 and set(linked["status"]) == {"refused"}
    assert linked["generation_throughput_tok_s"].isna().all() and linked["batch_size"].isna().all()


def test_memory_what_if_equals_cpu_mem_flag():
    hw, model, workload = load_hardware("l4"), load_model("mixtral"), make_workload("mtbench")
    grid = SweepGrid.model_validate({"hardware": ["l4"], "models": ["mixtral"], "engines": ["ideal"],
                                     "what_if": {"cpu_mem_gib": [48, 1000], "gpu_mem_gib": [None, 48]}})
    table = run_sweep(grid_cells(grid), backend="inline")
    for _, row in table.iterrows():
        gpu = None if row["gpu_mem_gib"] == hw.gpu.memory_gib else row["gpu_mem_gib"]
        limits = memory_limits(hw, gpu_mem_gib=gpu, cpu_mem_gib=row["cpu_mem_gib"])
        try:
            expected = search(hw, model, workload, limits=limits, top=0, engine="ideal").best.estimate.generation_throughput_tok_s
        except HRMError:
            assert row["status"] == "infeasible"
            continue
        assert row["generation_throughput_tok_s"] == expected
    assert set(table["status"]) == {"ok", "infeasible"}  # 48 GiB of CPU memory cannot hold Mixtral


# --- resume -----------------------------------------------------------------------------
def test_resume_runs_only_missing_cells_and_matches_a_fresh_sweep(tmp_path, monkeypatch):
    cells = grid_cells(SweepGrid.model_validate(SMALL))
    out = tmp_path / "r.parquet"
    fresh = run_sweep(cells, backend="inline")
    ran = []
    real = sweep_mod.run_cell
    monkeypatch.setattr(sweep_mod, "run_cell", lambda cell: ran.append(cell.key()) or real(cell))

    def stop_after(count):
        def progress(done, total):
            if done >= count:
                raise KeyboardInterrupt
        return progress

    with pytest.raises(KeyboardInterrupt):  # Ctrl-C after 10 cells: those 10 are saved
        run_sweep(cells, backend="inline", out=out, progress=stop_after(10))
    assert len(read_sweep(out)) == 10 and len(ran) == 10
    ran.clear()
    resumed = run_sweep(cells, backend="inline", out=out)
    assert len(ran) == len(cells) - 10 and not set(ran) & {c.key() for c in cells[:10]}
    pd.testing.assert_frame_equal(without_measured(resumed), without_measured(fresh))
    pd.testing.assert_frame_equal(read_sweep(out), resumed)
    ran.clear()
    again = run_sweep(cells, backend="inline", out=out)
    assert ran == [] and again.equals(resumed)
    # a smaller grid on the same file keeps the other rows after its own
    part = run_sweep(cells[5:8], backend="inline", out=out)
    assert ran == [] and list(part["cell_key"][:3]) == [c.key() for c in cells[5:8]] and len(part) == len(cells)


def test_periodic_saves_are_whole_files(tmp_path, monkeypatch):
    cells = grid_cells(SweepGrid.model_validate(SMALL))[:6]
    out = tmp_path / "r.parquet"
    sizes = []
    run_sweep(cells, backend="inline", out=out, save_every_s=0.0,
              progress=lambda done, total: sizes.append(len(read_sweep(out)) if out.exists() else 0))
    assert sizes == [0, 0, 1, 2, 3, 4, 5]  # saved after each cell (the first call is before any)
    assert len(read_sweep(out)) == 6


# --- the CLI ----------------------------------------------------------------------------
def test_cli_sweep_dry_run_run_and_resume(tmp_path, capsys):
    grid = write_grid(tmp_path, SMALL)
    out = tmp_path / "r.parquet"
    code, text, _ = call(capsys, "sweep", grid, "--out", out, "--dry-run")
    assert code == 0 and "32 cells (32 distinct), 0 already" in text and not out.exists()
    code, text, err = call(capsys, "sweep", grid, "--out", out, "--workers", "2")
    assert code == 0, err
    assert "32 rows; this grid: 16 ok, 8 infeasible, 8 refused" in text
    table = pd.read_parquet(out)
    assert len(table) == 32 and table["cell_key"].is_unique
    code, text, _ = call(capsys, "sweep", grid, "--out", out, "--dry-run")
    assert code == 0 and "32 cells (32 distinct), 32 already in" in text and "0 to run" in text
    code, text, _ = call(capsys, "sweep", grid, "--out", out)
    assert code == 0 and "32 already in" in text and "0 to run" in text


def test_dry_run_counts_done_cells_as_the_keys_do(tmp_path, capsys):
    """A wider grid over a partial output: the done count is the grid's keys found in the
    file (by expanding the grid here), the distinct count sees two names of one profile."""
    from hrm.machine.hardware import resolve_profile_path

    half = {**SMALL, "hardware": ["l4"], "what_if": {"h2d_gbps": [8.0]}}
    out = tmp_path / "r.parquet"
    run_sweep(grid_cells(SweepGrid.model_validate(half)), backend="inline", out=out)
    wide = {**SMALL, "hardware": ["l4", str(resolve_profile_path("l4")), "t4"],
            "what_if": {"h2d_gbps": [None, 8.0, 16.0], "cpu_scale": [1, 2]}}
    grid = write_grid(tmp_path, wide)
    cells = grid_cells(SweepGrid.model_validate(wide), grid)
    keys = {c.key() for c in cells}
    done = len(keys & set(read_sweep(out)["cell_key"]))
    assert 0 < done < len(keys) < len(cells)
    code, text, _ = call(capsys, "sweep", grid, "--out", out, "--dry-run")
    assert code == 0 and f"{len(cells)} cells ({len(keys)} distinct), {done} already in" in text, text
    assert f"{len(keys) - done} to run" in text


def test_dry_run_at_the_cell_cap_is_arithmetic(tmp_path, capsys):
    """4 Mi cells (the cap): counted in well under a second, never expanded."""
    from solver.grid import MAX_SWEEP_CELLS

    big = {"hardware": ["l4", "t4"], "models": ["mixtral", "mixtral-8x22b"],
           "workloads": ["mtbench", "summarization"], "engines": ["ideal", "moe-lightning"],
           "batch_sizes": [None] + [2 ** i for i in range(7)],
           "what_if": {"h2d_gbps": [4.0 + i for i in range(32)], "cpu_scale": [1 + i / 16 for i in range(16)],
                       "gpu_mem_gib": [16.0 + i for i in range(8)], "cpu_mem_gib": [64.0 + i for i in range(8)]}}
    grid = write_grid(tmp_path, big)
    start = time.perf_counter()
    code, text, _ = call(capsys, "sweep", grid, "--out", tmp_path / "r.parquet", "--dry-run")
    took = time.perf_counter() - start
    assert code == 0 and f"{MAX_SWEEP_CELLS} cells ({MAX_SWEEP_CELLS} distinct), 0 already in" in text, text
    assert took < 1.0, took


def test_sweep_help_documents_the_grid(capsys):
    code, text, _ = call(capsys, "sweep", "--help")
    assert code == 0 and "what_if:" in text and "ideal/SCHEDULE" in text and "exit codes:" in text


# --- backends: the same table from the pool and from Ray ------------------------------------
# 576 cells whose searches are quick (llama.cpp, not FlexGen: FlexGen's two attention tiers made
# 80% of the grid's 88 s, a cost this test of the backends does not need)
BIG = {"hardware": ["l4", "t4", "rtx3090", "a100-40g"], "models": ["mixtral", "mixtral-8x22b"],
       "workloads": ["mtbench", "synthetic-reasoning", "summarization"], "engines": ["ideal", "moe-lightning", "llama.cpp"],
       "what_if": {"h2d_gbps": [None, 32], "cpu_scale": [1, 2], "cpu_mem_gib": [None, 64]}}


@pytest.mark.slow
def test_big_grid_pool_and_ray_identical(tmp_path):
    ray = pytest.importorskip("ray")
    cells = grid_cells(SweepGrid.model_validate(BIG))
    assert len(cells) >= 500
    pool = run_sweep(cells, backend="local", workers=2, out=tmp_path / "pool.parquet")
    assert not ray.is_initialized()
    on_ray = run_sweep(cells, backend="ray", workers=2, out=tmp_path / "ray.parquet")
    assert not ray.is_initialized()  # the test's local Ray was started and stopped by the sweep
    pd.testing.assert_frame_equal(without_measured(read_sweep(tmp_path / "pool.parquet")),
                                  without_measured(read_sweep(tmp_path / "ray.parquet")))
    pd.testing.assert_frame_equal(without_measured(pool), without_measured(on_ray))
    assert list(pool["cell_key"]) == [c.key() for c in cells]
    counts = pool["status"].value_counts()
    assert counts["ok"] > 150 and counts["infeasible"] > 150 and not math.isnan(pool["solve_s"].sum())
    # and the serial run agrees with both on a sample
    sample = cells[::37]
    serial = run_sweep(sample, backend="inline")
    pd.testing.assert_frame_equal(without_measured(serial),
                                  without_measured(pool.iloc[::37]))


def test_routing_axis(tmp_path):
    grid = SweepGrid.model_validate({"hardware": ["l4"], "models": ["mixtral"], "engines": ["ideal"], "routings": ["uniform", "zipf:1.5"],
                                     "workloads": [{"prompt_len": 64, "gen_len": 8}]})
    table = run_sweep(grid_cells(grid), backend="inline")
    assert list(table["routing"]) == ["uniform", "zipf:1.5"] and table["model_sha256"].nunique() == 2
    uniform_tok_s, zipf_tok_s = table["generation_throughput_tok_s"]
    assert zipf_tok_s >= uniform_tok_s
    with pytest.raises(HRMError, match=r"routings\[0\] 'zipf:q'"):
        grid_cells(SweepGrid.model_validate({**SMALL, "routings": ["zipf:q"]}))


def test_batch_axis_pins_n_like_fix():
    grid = SweepGrid.model_validate({"hardware": ["l4"], "models": ["mixtral"], "engines": ["ideal"], "batch_sizes": [1, 16],
                                     "workloads": [{"prompt_len": 64, "gen_len": 8}], "objective": "latency"})
    table = run_sweep(grid_cells(grid), backend="inline")
    hw, model, wl = load_hardware("l4"), load_model("mixtral"), make_workload(None, 64, None, 8)
    for _, row in table.iterrows():
        best = search(hw, model, wl, objective="latency", fixed={"batch_size": int(row["pinned_batch_size"])},
                      top=0, engine="ideal").best
        assert row["batch_size"] == row["pinned_batch_size"] == best.policy.batch_size
        assert row["per_token_latency_s"] == best.estimate.per_token_latency_s
    with pytest.raises(Exception, match="batch_sizes must all be numbers"):
        SweepGrid.model_validate({**SMALL, "objective": "latency"})
    free = run_sweep(grid_cells(SweepGrid.model_validate({"hardware": ["l4"], "models": ["mixtral"], "engines": ["ideal"],
                                                          "batch_sizes": [None]})), backend="inline")
    assert free["pinned_batch_size"].isna().all()


def test_damaged_sweep_output_refused_and_left_untouched(tmp_path, capsys):
    """Issue 24: a file marked as a sweep output but without cell_key, or with a column of
    another type, is refused in one line; its bytes are not changed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    grid = write_grid(tmp_path, SMALL)
    rows = sweep_mod.rows_to_table([])
    for name, table in (("nokey", rows.drop(["cell_key"])),
                        ("badtype", rows.set_column(rows.schema.get_field_index("batch_size"), "batch_size",
                                                    pa.array([], pa.string())))):
        path = tmp_path / f"{name}.parquet"
        pq.write_table(table.replace_schema_metadata(rows.schema.metadata), path)
        before = path.read_bytes()
        code, out, err = call(capsys, "sweep", grid, "--out", path)
        assert code == 2 and "damaged sweep output" in err and len(err.strip().splitlines()) == 1, err
        assert path.read_bytes() == before


def test_a_cell_that_raises_is_an_error_row_and_the_sweep_goes_on(monkeypatch):
    import solver.search as search_mod

    cells = grid_cells(SweepGrid.model_validate(SMALL))[:3]

    calls = []
    original = search_mod.search

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise ZeroDivisionError("a worker's bug")
        return original(*args, **kwargs)

    monkeypatch.setattr(search_mod, "search", flaky)
    table = run_sweep(cells, backend="inline")
    assert list(table["status"])[1] == "error" and "ZeroDivisionError: a worker's bug" in table["reason"][1]
    assert list(table["status"])[0] != "error" and list(table["status"])[2] != "error"
