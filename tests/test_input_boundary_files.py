"""The non-YAML inputs users hand us, at the boundary: routing traces (``--routing trace:FILE``),
checkpoints (``hrm run --checkpoint``), plans, model config.json files and ``hrm import``
command lines. Every bad one is refused with exit 2 and one ``error:`` line naming the file
and the field (or flag), never a traceback; in-process through :func:`hrm_cli.main` (fast),
one end-to-end subprocess.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import call

from hrm.errors import HRMError
from hrm.model.routing import MAX_LAYERS, MAX_TRACE_COUNTS, TRACE_FORMAT

ROOT = Path(__file__).resolve().parents[1]
#: mixtral-8x7b: 32 MoE layers, 8 experts, top-2 (its config.json in the catalog)
MIXTRAL = ["--hw", "l4", "--model", "mixtral"]
MIXTRAL_LAYERS, MIXTRAL_EXPERTS, MIXTRAL_TOP_K = 32, 8, 2


def refused(capsys, *args, needle: str, code: int = 2) -> str:
    rc, _, err = call(capsys, *args)
    lines = err.strip().splitlines()
    assert "Traceback" not in err and rc == code, (rc, err)
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], err
    return lines[0]


def trace_text(layers=MIXTRAL_LAYERS, experts=MIXTRAL_EXPERTS, top_k=MIXTRAL_TOP_K, tokens=8, counts=None,
               top_k_text=None) -> str:
    """A trace as hrm run writes it: every layer's counts add up to top_k x tokens
    (``counts``: one layer's, repeated; ``top_k_text``: the raw JSON of the top_k field)."""
    counts = counts if counts is not None else [top_k * tokens // experts] * experts
    body = json.dumps({"format": TRACE_FORMAT, "top_k": top_k,
                       "layers": [{"layer": i, "tokens": tokens, "expert_counts": counts} for i in range(layers)]})
    return body if top_k_text is None else body.replace(f'"top_k": {top_k}', f'"top_k": {top_k_text}', 1)


def write(tmp_path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- routing traces ----------------------------------------------------------------------------
@pytest.mark.parametrize("text,needle", [
    (trace_text(top_k_text='"2"'), "top_k: expected a number, got the string '2'"),
    (trace_text(top_k_text="2.5"), "top_k: expected an integer, got 2.5"),
    (trace_text(top_k_text="Infinity"), "Infinity is not a finite number"),
    (trace_text(top_k_text="NaN"), "NaN is not a finite number"),
    (trace_text(top_k_text="true"), "top_k: expected an integer, got a boolean"),
    (trace_text(top_k=1, counts=[1] * 8), "the trace has 8 experts, top-1; the model has 8, top-2"),
    (trace_text(counts=["2"] * 8), "layers.0.expert_counts.0: expected a number, got the string '2'"),
    (trace_text(counts=[4, -2, 2, 2, 2, 2, 2, 2]), "layers.0.expert_counts.1: -2 must be at least 0"),
    (trace_text().replace('"expert_counts": [2, 2', '"expert_counts": [Infinity, 2', 1), "Infinity is not a finite"),
    (trace_text(counts=[9, 0, 0, 0, 0, 0, 3, 4]), "layers.0.expert_counts: expert 0 has 9 activations of 8 tokens"),
    (trace_text(counts=[2, 2, 2, 2, 2, 2, 2, 3]), "layers.0.expert_counts: must sum to top_k x tokens = 16"),
    (trace_text().replace('"tokens": 8', '"tokens": "8"', 1), "layers.0.tokens: expected a number, got the string"),
    (trace_text(layers=3), "routing: the trace has 3 MoE layers; mixtral-8x7b has 32"),
    (trace_text(experts=16, counts=[1] * 16), "the trace has 16 experts, top-2; the model has 8, top-2"),
])
def test_bad_trace_refused_naming_the_field(tmp_path, capsys, text, needle):
    path = write(tmp_path, "trace.json", text)
    line = refused(capsys, "search", *MIXTRAL, "--routing", f"trace:{path}", needle=needle)
    assert str(path) in line


def test_trace_size_caps_come_before_any_layer_is_read(tmp_path, capsys):
    """Layers that are not even mappings: the cap's refusal, not theirs, shows it ran first."""
    path = write(tmp_path, "deep.json", json.dumps({"format": TRACE_FORMAT, "top_k": 2,
                                                    "layers": ["x"] * (MAX_LAYERS + 1)}))
    refused(capsys, "search", *MIXTRAL, "--routing", f"trace:{path}",
            needle=f"layers: {MAX_LAYERS + 1} layers (at most MAX_LAYERS")
    wide = MAX_TRACE_COUNTS // 16 + 1  # 16 layers of this many experts: just above the cap
    path = write(tmp_path, "wide.json", json.dumps({"format": TRACE_FORMAT, "top_k": 2,
                                                    "layers": [{"tokens": "x", "expert_counts": [0] * wide}] * 16}))
    refused(capsys, "search", *MIXTRAL, "--routing", f"trace:{path}",
            needle=f"{16 * wide} expert counts in all (at most MAX_TRACE_COUNTS")


def test_estimate_reads_a_trace_or_refuses_it(tmp_path, capsys):
    policy = ["--policy", "N=8,mu=4,attn=gpu,rw=0"]
    good = write(tmp_path, "good.json", trace_text())
    rc, out, err = call(capsys, "estimate", "--engine", "ideal", *MIXTRAL, *policy, "--routing", f"trace:{good}", "--json")
    assert rc == 0 and "Traceback" not in err, err
    assert json.loads(out)
    refused(capsys, "estimate", "--engine", "ideal", *MIXTRAL, *policy, "--routing", f"trace:{write(tmp_path, 'nan.json', trace_text(top_k_text='NaN'))}",
            needle="NaN is not a finite number")


def test_routing_reach_says_which_costs_routing_changes():
    from hrm.engines.engine import load_engine
    from hrm.model.routing import routing_reach

    streamed = load_engine("moe-lightning")
    assert streamed.decode.offloaded_experts == "streamed" and not streamed.moe_reads_all_experts
    reach = routing_reach(streamed, 8, 2)
    assert reach.can_change_plan and len(reach.costs) == 1 and "whole layers" in reach.reason
    # a kernel that reads every expert and whole-layer streaming: nothing depends on routing
    blind = streamed.model_copy(update={"moe_reads_all_experts": True})
    assert not routing_reach(blind, 8, 2).can_change_plan
    cached = load_engine("moe-infinity")
    assert cached.decode.offloaded_experts in ("cached", "cached-cpu")
    assert any("cache misses" in cost for cost in routing_reach(cached, 8, 2).costs)
    # every token uses every expert: top_k = num_experts, or a dense model
    assert not routing_reach(streamed, 8, 8).can_change_plan and not routing_reach(streamed, 1, 1).can_change_plan


# --- plans -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_plan(tmp_path_factory) -> Path:
    from hrm_cli import main

    path = tmp_path_factory.mktemp("plan") / "plan.json"
    assert main(["search", "--hw", "l4", "--model", "tiny-mixtral", "--gen-len", "4", "--weight-dtype", "fp32",
                 "--out", str(path)]) == 0
    return path


#: a plan's names: those the tool writes (at most hrm.bounds.MAX_NAME_CHARS), and the user's
#: hardware, model and engine as given, which may be file paths (at most PATH_MAX)
TOOL_NAMES = ["created_by", "search.objective", "server_pick.chosen_by"]
USER_NAMES = ["engine", "hardware.name", "model.name"]
CONTROL = [("hrm\nsearch", "control character '\\n'"), ("hrm\u202esearch", "control character '\\u202e'"),
           ("hrm\x1b[31m", "control character '\\x1b'"), ("hrm\x85", "control character '\\x85'")]


def refused_plan(tmp_path, capsys, plan: Path, field: str, value, needle: str) -> None:
    data = json.loads(plan.read_text())
    node, key = (data, field) if "." not in field else (data[field.split(".")[0]], field.split(".")[1])
    node[key] = value
    refused(capsys, "show", write(tmp_path, "bad.json", json.dumps(data)), needle=f"{field}: {needle}")


@pytest.mark.parametrize("field", TOOL_NAMES)
@pytest.mark.parametrize("value,needle", [*CONTROL, ("", "empty name"), ("   ", "empty name"), (3, "expected a name (text), got the number 3"),
                                          ("x" * 300, "a name of 300 characters (at most 255)")])
def test_plan_tool_names_are_plain_short_text(tmp_path, capsys, tiny_plan, field, value, needle):
    refused_plan(tmp_path, capsys, tiny_plan, field, value, needle)


@pytest.mark.parametrize("field", USER_NAMES)
@pytest.mark.parametrize("value,needle", [*CONTROL, ("", "empty text"), ("   ", "empty text"),
                                          ("x" * 5000, "5000 characters (at most MAX_TEXT_CHARS = 4096)")])
def test_plan_user_names_are_plain_text(tmp_path, capsys, tiny_plan, field, value, needle):
    refused_plan(tmp_path, capsys, tiny_plan, field, value, needle)


def test_a_long_model_path_is_recorded(tmp_path, capsys):
    """A --model path longer than a name (NAME_MAX, 255) is a valid plan name: its plan is written and read."""
    folder = tmp_path / ("d" * 120) / ("e" * 120)
    folder.mkdir(parents=True)
    config = write(folder, "tiny.json", json.dumps(tiny_config()))
    assert len(str(config)) > 255
    rc, _, err = call(capsys, "search", "--hw", "l4", "--model", config, "--gen-len", "4", "--out", folder / "p.json")
    assert rc == 0, err
    assert call(capsys, "show", folder / "p.json")[0] == 0


def test_plan_path_with_markup_is_printed_as_it_is(tmp_path, capsys, tiny_plan):
    marked = tmp_path / "[bold]plan.json"
    shutil.copy(tiny_plan, marked)
    rc, out, err = call(capsys, "show", marked)
    assert rc == 0 and not err.strip(), err
    bad = write(tmp_path, "[red]bad.json", "{")
    line = refused(capsys, "show", bad, needle="malformed JSON")
    assert "[red]bad.json" in line


# --- checkpoints -------------------------------------------------------------------------------------
@pytest.mark.parametrize("value,needle", [(float("nan"), "not finite (NaN)"), (float("inf"), "not finite (inf)")])
def test_checkpoint_with_non_finite_weights_refused(tmp_path, capsys, tiny_plan, value, needle):
    torch = pytest.importorskip("torch")
    safetensors = pytest.importorskip("safetensors.torch")
    from hrm.model.spec import load_model
    from runtime.model import random_weights, save_safetensors

    spec = load_model("tiny-mixtral")
    save_safetensors(spec, random_weights(spec, 0), tmp_path / "good.safetensors")
    tensors = safetensors.load_file(str(tmp_path / "good.safetensors"))
    name = "model.layers.1.block_sparse_moe.experts.2.w1.weight"
    tensors[name] = tensors[name].clone()
    tensors[name][0, 3] = value
    (tmp_path / "ckpt").mkdir()
    safetensors.save_file(tensors, str(tmp_path / "ckpt" / "model.safetensors"))
    assert not torch.isfinite(tensors[name]).all()
    refused(capsys, "run", "--plan", tiny_plan, "--device", "cpu", "--no-warmup", "--checkpoint", tmp_path / "ckpt",
            needle=f"{name}: 1 of {tensors[name].numel()} values are {needle}")


def test_finite_weights_that_overflow_the_compute_dtype_refused():
    torch = pytest.importorskip("torch")
    from runtime.model import finite_tensor

    stored = torch.tensor([1.0, 7.0e4])  # fp16's largest finite value is 65504
    with pytest.raises(HRMError, match="values up to 7e\\+04 overflow float16"):
        finite_tensor(stored, stored.to(torch.float16), "w")
    assert finite_tensor(stored, stored.to(torch.float32), "w") is not None


# --- model config.json -------------------------------------------------------------------------------
def tiny_config() -> dict:
    from hrm.model.spec import CATALOG_DIR

    return json.loads((CATALOG_DIR / "tiny-mixtral.json").read_text())


def test_model_name_is_plain_text(tmp_path, capsys):
    folder = tmp_path / "bad\nname"
    folder.mkdir()
    write(folder, "config.json", json.dumps(tiny_config()))
    refused(capsys, "search", "--hw", "l4", "--model", folder, needle="name: control character '\\n'")
    path = write(tmp_path, "long.json", json.dumps({**tiny_config(), "_hrm_name": "m" * 300}))
    refused(capsys, "search", "--hw", "l4", "--model", path, needle="name: a name of 300 characters")


def test_model_config_numbers_finite_and_size_capped(tmp_path, capsys, monkeypatch):
    import hrm.model.spec

    config = {k: v for k, v in tiny_config().items() if k != "rope_theta"}
    path = write(tmp_path, "nan.json", json.dumps(config)[:-1] + ', "rope_theta": NaN}')
    refused(capsys, "search", "--hw", "l4", "--model", path, needle="rope_theta: must be finite")
    monkeypatch.setattr(hrm.model.spec, "MAX_CONFIG_BYTES", 64)  # the cap is read before the JSON is parsed
    big = write(tmp_path, "big.json", "{" + " " * 100 + "not json")
    refused(capsys, "search", "--hw", "l4", "--model", big, needle="expected a config.json (at most MAX_CONFIG_BYTES)")


# --- hrm import -----------------------------------------------------------------------------------------
IMPORT = ["import", "--hw", "l4", "--model", "mixtral"]


@pytest.mark.parametrize("engine", ["llama.cpp", "vllm", "sglang", "flexgen", "moe-lightning"])
@pytest.mark.parametrize("command", ["", "   ", ";", "cd /tmp && A=1"])
def test_import_empty_command_refused(capsys, engine, command):
    refused(capsys, *IMPORT, "--from", engine, "--", command, needle=f"{engine} flags: empty command")


@pytest.mark.parametrize("command,needle", [
    ("-np", "-np needs 1 value(s)"),
    ("-np 4 -ot '(a|a)*x=CPU'", "a repeated group that holds a repetition or an alternation"),
    ("-np 4 -ot '(a?){30}x=CPU'", "a repeated group that holds a repetition or an alternation"),
    ("-np 4 -ot '.*.*.*.*x=CPU'", "4 unbounded repetitions (at most MAX_PATTERN_REPEATS"),
    ("-np 4 -ot '" + "a=" * 50_000 + "'", "at most MAX_COMMAND_CHARS"),
    ("-np " + "x" * 1000, "-np '" + "x" * 60 + "...' is not of the form"),  # a long word is shown shortened
    ("-np " + "1" * 1000, "-np '" + "1" * 60 + "...': llama.cpp refuses more than 256 slots"),
])
def test_import_single_flag_hostile_patterns_and_long_commands_refused(capsys, command, needle):
    refused(capsys, *IMPORT, "--from", "llama.cpp", "--", command, needle=needle)


def test_import_reads_real_override_patterns_and_python_options(capsys):
    from hrm.export.llama_overrides import check_pattern

    for pattern in (r"blk\.[0-4]\.ffn.*", r"blk\.(1[0-9]|2[0-9])\.ffn_.*_exps", r"\.ffn_(up|down|gate)_exps", "[(]+x"):
        assert check_pattern(pattern).pattern == pattern
    # python's leading options are dropped; the same option after -m MODULE is the engine's (unknown)
    rc, _, err = call(capsys, *IMPORT, "--from", "flexgen", "--", "python -u -O -m flexgen.flex_moe --gpu-batch-size 4")
    assert rc in (0, 3) and "unknown flag" not in err, err
    refused(capsys, *IMPORT, "--from", "flexgen", "--", "python -u -m flexgen.flex_moe -u", needle="unknown flag '-u'")


def test_import_without_context_on_a_model_that_states_none(capsys):
    """tiny-mixtral's config has no max_position_embeddings: llama.cpp's default -c (the
    training context) is unknown, so the command needs -c."""
    refused(capsys, "import", "--hw", "l4", "--model", "tiny-mixtral", "--from", "llama.cpp", "--", "llama-server -np 4",
            needle="llama.cpp: no -c (or -c 0) runs the model's training context")


def test_one_line_end_to_end_in_a_subprocess(tmp_path):
    path = write(tmp_path, "trace.json", trace_text(top_k_text="Infinity"))
    proc = subprocess.run([sys.executable, "-m", "hrm_cli", "estimate", "--engine", "ideal", *MIXTRAL, "--policy", "N=8,mu=4,attn=gpu,rw=0",
                           "--routing", f"trace:{path}"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: {path}: malformed JSON (Infinity is not a finite number)")
