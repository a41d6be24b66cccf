"""One strict boundary for the YAML files users hand us (hardware profiles, engine files,
sweep grids, calibrate runs files): the loader (hrm.errors.StrictLoader) and the strict
types of the models. Every refusal is exit 2 with one line naming the file's field.
"""

from __future__ import annotations

import copy
import tracemalloc
from pathlib import Path

import pytest
import yaml
from conftest import call

from hrm import bounds
from hrm.engines.engine import ENGINES_DIR, engine_path, list_engines, load_engine
from hrm.errors import MAX_YAML_ALIASES, MAX_YAML_DEPTH, HRMError, read_yaml_mapping, strict_yaml_load
from hrm.machine.hardware import CHECKOUT_PROFILES_DIR, list_profiles, load_hardware
from solver.grid import MAX_SWEEP_CELLS, read_grid

ROOT = Path(__file__).resolve().parents[1]
L4 = yaml.safe_load((CHECKOUT_PROFILES_DIR / "l4.yaml").read_text())
CPU_ONLY = yaml.safe_load((CHECKOUT_PROFILES_DIR / "cpu-only.yaml").read_text())
KLOTSKI = yaml.safe_load((ENGINES_DIR / "klotski.yaml").read_text())
ESTIMATE = ["--model", "tiny-mixtral", "--policy", "N=8,mu=4"]


def refused(capsys, *args, needle: str) -> str:
    """``hrm ARGS`` exits 2 with exactly one line ``error: ...`` that contains ``needle``."""
    rc, _, err = call(capsys, *args)
    lines = err.strip().splitlines()
    assert "Traceback" not in err, err
    assert rc == 2, (rc, err)
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert needle in lines[0], (needle, lines[0])
    return lines[0]


def write(tmp_path, name: str, data) -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def with_field(base: dict, dotted: str, value) -> dict:
    data = copy.deepcopy(base)
    node = data
    *parents, last = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return data


def lines_yaml(data: dict, extra: str) -> str:
    """``data`` as YAML with ``extra`` (raw YAML text) appended: for values safe_dump would quote."""
    return yaml.safe_dump(data, sort_keys=False) + extra


# --- the loader ------------------------------------------------------------------------
def test_duplicate_key_refused_with_its_lines():
    with pytest.raises(yaml.YAMLError) as exc:
        strict_yaml_load("name: a\ncpu:\n  cores: 2\n  cores: 4\n")
    assert "duplicate key 'cores'" in exc.value.problem and "line 3" in exc.value.problem
    assert exc.value.problem_mark.line + 1 == 4


def test_duplicate_key_after_quoting_or_as_another_number_form():
    for text in ('a: 1\n"a": 2\n', "{1: a, 0x1: b}\n"):
        with pytest.raises(yaml.YAMLError, match="duplicate key"):
            strict_yaml_load(text)


def test_merge_key_may_be_overridden():
    assert strict_yaml_load("a: &x {k: 1, j: 2}\nb: {<<: *x, k: 3}\n")["b"] == {"k": 3, "j": 2}


def test_alias_use_budget():
    def text(uses):
        return "a: &x 1\nb: [" + ", ".join(["*x"] * uses) + "]\n"

    assert strict_yaml_load(text(MAX_YAML_ALIASES))["b"] == [1] * MAX_YAML_ALIASES
    with pytest.raises(yaml.YAMLError, match=f"more than {MAX_YAML_ALIASES} alias uses"):
        strict_yaml_load(text(MAX_YAML_ALIASES + 1))


def billion_laughs(levels: int = 9, width: int = 9) -> str:
    """The classic bomb: ``levels`` lists of ``width`` aliases to the previous one
    (levels x width alias uses, width^levels strings once expanded)."""
    rows = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    rows += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(rows) + "\n"


def test_billion_laughs_refused_before_expansion():
    text = billion_laughs()
    assert 8 * 9 <= MAX_YAML_ALIASES  # under the use budget: the expansion budget must catch it
    tracemalloc.start()
    try:
        with pytest.raises(yaml.YAMLError, match="alias bomb"):
            strict_yaml_load(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20  # 9^9 strings would be GiBs of references


def test_alias_to_its_own_node_refused():
    with pytest.raises(yaml.YAMLError, match="refers to a node that holds it"):
        strict_yaml_load("a: &a [1, *a]\n")


def test_depth_limit():
    def nested(depth):  # a root sequence holding sequences: ``depth`` levels in all
        return "[" * depth + "]" * depth

    strict_yaml_load(nested(MAX_YAML_DEPTH))
    with pytest.raises(yaml.YAMLError, match=f"deeper than {MAX_YAML_DEPTH}"):
        strict_yaml_load(nested(MAX_YAML_DEPTH + 1))


def test_depth_limit_counts_expanded_aliases():
    half = MAX_YAML_DEPTH // 2 + 1
    text = f"a: &x {'[' * half}{']' * half}\nb: {'[' * half}*x{']' * half}\n"
    with pytest.raises(yaml.YAMLError, match="once its aliases are expanded"):
        strict_yaml_load(text)


@pytest.mark.parametrize("word", ["yes", "no", "on", "off", "y", "n", "Yes", "NO", "On", "OFF", "tRUE"])
def test_yaml11_booleans_stay_text(word):
    assert strict_yaml_load(f"a: {word}\n") == {"a": word}


@pytest.mark.parametrize("word,value", [("true", True), ("True", True), ("TRUE", True),
                                        ("false", False), ("False", False), ("FALSE", False)])
def test_yaml12_booleans(word, value):
    assert strict_yaml_load(f"a: {word}\n")["a"] is value


@pytest.mark.parametrize("text,value", [
    ("1_000", "1_000"), ("1_000.5", "1_000.5"), ("0b101", "0b101"), ("190:20:30", "190:20:30"), ("1e3", "1e3"),
    ("010", 10), ("0o17", 15), ("0x1F", 31), ("-7", -7), ("1.0e3", 1000.0), ("1.5e+2", 150.0), (".5", 0.5),
])
def test_numbers_as_yaml12_without_separators(text, value):
    got = strict_yaml_load(f"a: {text}\n")["a"]
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("text", ["!!int 1_000", "!!bool yes", "!!float 1_0.5"])
def test_explicit_tags_follow_the_same_rules(text):
    with pytest.raises(yaml.YAMLError):
        strict_yaml_load(f"a: {text}\n")


def test_size_cap_still_applies_before_parsing(tmp_path):
    from hrm.errors import read_input_text

    path = write(tmp_path, "big.yaml", "a: [" + "x, " * 1024 + "\n")  # not even YAML: refused by size first
    with pytest.raises(HRMError, match="larger than"):
        read_input_text(path, max_bytes=1024)


# --- the loader through the CLI: one line naming the file -------------------------------
@pytest.mark.parametrize("text,needle", [
    (lines_yaml(L4, "name: again\n"), "duplicate key 'name'"),
    (billion_laughs() + lines_yaml(L4, ""), "alias bomb"),
    ("name: x\ncpu: " + "[" * 100 + "]" * 100 + "\n", "deeper than"),
])
def test_loader_refusals_in_a_profile(tmp_path, capsys, text, needle):
    path = write(tmp_path, "hw.yaml", text)
    line = refused(capsys, "estimate", "--engine", "ideal", "--hw", path, *ESTIMATE, needle=needle)
    assert str(path) in line


# --- strict types ----------------------------------------------------------------------
@pytest.mark.parametrize("extra,needle", [
    ("  p2p: yes\n", "link.p2p"), ("  p2p: 1\n", "link.p2p"), ("  p2p: on\n", "link.p2p"),
])
def test_profile_boolean_is_strict(tmp_path, capsys, extra, needle):
    path = write(tmp_path, "hw.yaml", lines_yaml(L4, extra))  # appended under the last section, link
    refused(capsys, "estimate", "--engine", "ideal", "--hw", path, *ESTIMATE, needle=needle)


def test_digit_separator_refused_in_a_numeric_field(tmp_path, capsys):
    text = yaml.safe_dump(L4, sort_keys=False).replace("cores: 24", "cores: 2_4")
    line = refused(capsys, "estimate", "--engine", "ideal", "--hw", write(tmp_path, "hw.yaml", text), *ESTIMATE, needle="cpu.cores")
    assert "'2_4'" in line


@pytest.mark.parametrize("field,extra", [
    ("host_dram", "host_dram: 1\n"), ("host_dram", "host_dram: yes\n"), ("numa_aware", "numa_aware: off\n"),
    ("memory.cpu_holds_all_experts", "memory: {cpu_holds_all_experts: 0}\n"),
    ("prefill.hidden_round_trip", "prefill: {hidden_round_trip: 'true'}\n"),
    ("memory.gpu_reserved_gib", "memory: {gpu_reserved_gib: .nan}\n"),
    ("offload_min_tokens_per_expert", "offload_min_tokens_per_expert: .inf\n"),
])
def test_engine_fields_strict(tmp_path, capsys, field, extra):
    path = write(tmp_path, "e.yaml", "name: mine\n" + extra)
    refused(capsys, "estimate", "--hw", "l4", "--engine", path, *ESTIMATE, needle=field)


# --- hardware leftovers ----------------------------------------------------------------
def curves(**by_dtype):
    return {"gpu_matmul_tflops_vs_m": {d: [{"x": x, "y": y} for x, y in pts] for d, pts in by_dtype.items()}}


@pytest.mark.parametrize("efficiency,needle", [
    (curves(fp16=[(1, 10), (1, 20)]), "appears twice"),
    (curves(fp16=[]), "empty curve"),
    (curves(fp16=[(1, 10), (64, L4["gpu"]["tflops"]["fp16"] * 1.5)]), "above the fp16 peak"),
    (curves(fp8=[(1, 10)]), "gpu_matmul_tflops_vs_m.fp8"),
    ({"cpu_matmul_tflops_vs_m": {"fp16": [{"x": 1, "y": 0.1}]}}, "no fp16 peak"),
])
def test_efficiency_curves(tmp_path, capsys, efficiency, needle):
    path = write(tmp_path, "hw.yaml", {**L4, "efficiency": efficiency})
    line = refused(capsys, "estimate", "--engine", "ideal", "--hw", path, *ESTIMATE, needle=needle)
    assert "efficiency" in line


def test_curve_up_to_the_peak_accepted(tmp_path):
    peak = L4["gpu"]["tflops"]["fp16"]
    hw = load_hardware(str(write(tmp_path, "hw.yaml", {**L4, "efficiency": curves(fp16=[(1, 5), (512, peak)])})))
    assert hw.efficiency.gpu_matmul_tflops_vs_m["fp16"][-1].y == peak


def test_gpu_curves_on_a_cpu_only_profile(tmp_path, capsys):
    path = write(tmp_path, "hw.yaml", {**CPU_ONLY, "efficiency": curves(fp32=[(1, 0.01)])})
    refused(capsys, "estimate", "--engine", "ideal", "--hw", path, *ESTIMATE, needle="efficiency.gpu_matmul_tflops_vs_m")


@pytest.mark.parametrize("field,value", [
    ("link.h2d_gbps", L4["link"]["h2d_gbps"] / 1000),  # MB/s written as GB/s
    ("link.d2h_gbps", bounds.MIN_LINK_GBPS / 2),
    ("link.h2d_gbps", L4["gpu"]["memory_bandwidth_gbps"] * 2),  # faster than the GPU's HBM
    ("link.h2d_pageable_gbps", L4["gpu"]["memory_bandwidth_gbps"] + 1),
])
def test_implausible_link(tmp_path, capsys, field, value):
    path = write(tmp_path, "hw.yaml", with_field(L4, field, value))
    refused(capsys, "estimate", "--engine", "ideal", "--hw", path, *ESTIMATE, needle=field)


# --- names -----------------------------------------------------------------------------
BAD_NAMES = ["../../x", "a/b", "a\nb", "a\x01b", "", "   ", "x" * 5000, ".hidden", "a\\b"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_profile_name(tmp_path, capsys, name):
    path = write(tmp_path, "hw.yaml", {**L4, "name": name})
    refused(capsys, "estimate", "--engine", "ideal", "--hw", path, *ESTIMATE, needle="name:")


@pytest.mark.parametrize("name", ["a\nb", "x" * 5000, ""])
def test_device_name(tmp_path, capsys, name):
    path = write(tmp_path, "hw.yaml", with_field(L4, "gpu.name", name))
    refused(capsys, "estimate", "--engine", "ideal", "--hw", path, *ESTIMATE, needle="gpu.name")


@pytest.mark.parametrize("name", BAD_NAMES)
def test_engine_name(tmp_path, capsys, name):
    path = write(tmp_path, "e.yaml", {"name": name})
    refused(capsys, "estimate", "--hw", "l4", "--engine", path, *ESTIMATE, needle="name:")


@pytest.mark.parametrize("name", ["l4", "2xa100-80g", "llama.cpp-nkvo", "l4@cpu×2", "l4@link32GBps",
                                  "measured-host-1", "NVIDIA A100-SXM4-80GB"])
def test_plain_names_accepted(name):
    assert bounds.name_refusal(name, identifier=True) is None


def test_name_bound_is_the_named_constant():
    assert bounds.name_refusal("x" * bounds.MAX_NAME_CHARS) is None
    assert "at most" in bounds.name_refusal("x" * (bounds.MAX_NAME_CHARS + 1))


# --- engine leftovers ------------------------------------------------------------------
def test_zero_buffer_with_streamed_experts(tmp_path, capsys):
    path = write(tmp_path, "e.yaml", {"name": "mine", "memory": {"gpu_weight_buffer_layers": 0}})
    refused(capsys, "estimate", "--hw", "l4", "--engine", path, *ESTIMATE, needle="memory.gpu_weight_buffer_layers")


def test_zero_buffer_allowed_where_nothing_is_prefetched(tmp_path):
    # the serial schedule reads offloaded weights in place (vLLM's UVA), as the shipped vllm does
    assert load_engine("vllm").memory.gpu_weight_buffer_layers == 0
    data = {"name": "mine", "schedule": "sequential", "memory": {"gpu_weight_buffer_layers": 0}}
    assert load_engine(str(write(tmp_path, "e.yaml", data))).name == "mine"
    data = {"name": "mine", "decode": {"offloaded_experts": "cpu"}, "prefill": {"offloaded_experts": "cpu"},
            "policy": {"fixed": {"num_micro_batches": 1}},
            "memory": {"gpu_weight_buffer_layers": 0}}
    assert load_engine(str(write(tmp_path, "e2.yaml", data))).name == "mine"


@pytest.mark.parametrize("field,value,needle", [
    ("policy.attention", ["cpu"], "policy.attention"),
    ("policy.attention", ["gpu", "cpu"], "policy.attention"),
    ("policy.ffn", ["cpu", "gpu"], "policy.ffn"),
    ("decode.offloaded_experts", "cpu", "decode.offloaded_experts"),  # a mechanism Klotski's pipeline ignores
    ("tensor_parallel.allreduce", "nccl", "tensor_parallel.allreduce"),
])
def test_klotski_refuses_what_it_cannot_run(tmp_path, capsys, field, value, needle):
    data = with_field(KLOTSKI, field, value)
    data["policy"].setdefault("fixed", {})["num_micro_batches"] = 1
    path = write(tmp_path, "k.yaml", data)
    line = refused(capsys, "estimate", "--hw", "l4", "--engine", path, *ESTIMATE, needle=needle)
    assert str(path) in line


def test_ideal_keeps_every_schedule():
    for schedule in ("flexgen", "flexgen-cpu-attn", "klotski", "sequential"):
        assert load_engine("ideal").with_schedule(schedule).schedule == schedule


# --- --engine FILE --------------------------------------------------------------------
@pytest.mark.parametrize("filename", ["E.YAML", "e.Yml", "engine-without-suffix"])
def test_engine_file_any_suffix_is_a_file(tmp_path, filename):
    path = write(tmp_path, filename, {"name": "mine", "host_dram": True})
    assert engine_path(str(path)) == path
    assert load_engine(str(path)).host_dram is True


def test_engine_file_with_upper_case_suffix_on_the_cli(tmp_path, capsys):
    path = write(tmp_path, "E.YAML", {"name": "mine", "host_dram": 1})
    refused(capsys, "estimate", "--hw", "l4", "--engine", path, *ESTIMATE, needle=f"{path}: host_dram")


def test_missing_engine_path_named_as_a_path(tmp_path, capsys):
    path = tmp_path / "nope.YAML"
    refused(capsys, "estimate", "--hw", "l4", "--engine", path, *ESTIMATE, needle=f"{path}: cannot read")


@pytest.mark.parametrize("text", ["../klotski", "no-such-engine"])
def test_engine_names_are_not_paths_into_the_registry(capsys, text):
    refused(capsys, "estimate", "--hw", "l4", "--engine", text, *ESTIMATE, needle=text)


# --- sweep grids ------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["weight_dtype", "kv_dtype"])
def test_grid_dtype_refused_at_load(tmp_path, capsys, field):
    grid = write(tmp_path, "grid.yaml", {"hardware": ["l4"], "models": ["tiny-mixtral"], field: "fp17"})
    refused(capsys, "sweep", grid, "--out", tmp_path / "out.parquet", "--dry-run", needle=field)
    assert not (tmp_path / "out.parquet").exists()


def test_grid_over_the_cell_cap_refused_naming_the_count(tmp_path, capsys):
    side = 2 ** 6  # what-if values only: nothing is resolved before the count is checked
    axis = [float(i + 1) for i in range(side)]
    what_if = {"cpu_scale": [v / side for v in axis], "h2d_gbps": axis, "cpu_mem_gib": axis, "gpu_mem_gib": axis}
    count = side ** 4
    assert count > MAX_SWEEP_CELLS
    grid = write(tmp_path, "grid.yaml", {"hardware": ["l4"], "models": ["tiny-mixtral"], "what_if": what_if})
    refused(capsys, "sweep", grid, "--out", tmp_path / "out.parquet", "--dry-run", needle=f"{count} cells")


def test_grid_what_if_link_uses_the_link_range(tmp_path, capsys):
    grid = write(tmp_path, "grid.yaml", {"hardware": ["l4"], "models": ["tiny-mixtral"],
                                         "what_if": {"h2d_gbps": [bounds.MIN_LINK_GBPS / 10]}})
    refused(capsys, "sweep", grid, "--out", tmp_path / "out.parquet", "--dry-run", needle="what_if.h2d_gbps")


# --- everything shipped still loads, and reads as it did -----------------------------------
SHIPPED_YAML = sorted([*CHECKOUT_PROFILES_DIR.glob("*.yaml"), *ENGINES_DIR.glob("*.yaml"), ROOT / "examples/grid.yaml",
                       *(ROOT / "benchmarks").glob("*.yaml")])


@pytest.mark.parametrize("path", SHIPPED_YAML, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shipped_yaml_reads_as_before(path):
    text = path.read_text()
    assert read_yaml_mapping(path, "a shipped file", "fields") == yaml.safe_load(text)


def test_shipped_files_load():
    assert all(load_hardware(name).name == name for name in list_profiles())
    assert all(load_engine(name).name == name for name in list_engines())
    grids = [ROOT / "examples/grid.yaml", *(ROOT / "benchmarks").glob("*.yaml")]
    assert all(read_grid(path).hardware for path in grids)


# --- calibrate runs files go through the same loader -------------------------------------
@pytest.mark.parametrize("text,needle", [
    ("hardware: l4\nmodel: mixtral\nhardware: t4\nruns: []\n", "duplicate key 'hardware'"),
    (billion_laughs() + "hardware: l4\nmodel: mixtral\nruns: []\n", "alias bomb"),
])
def test_calibrate_runs_file(tmp_path, capsys, text, needle):
    path = write(tmp_path, "runs.yaml", text)
    line = refused(capsys, "calibrate", path, needle=needle)
    assert str(path) in line
