"""Bad input: one line naming the problem, exit code 2, no traceback."""

import json
import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run([sys.executable, "-m", "hrm_cli", *args], capture_output=True, text=True)


def one_line_error(out, code=2, needle=""):
    assert out.returncode == code, (out.returncode, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert needle in lines[0], lines[0]


GOOD = "N=512,mu=64,attn=cpu,ffn=gpu,rw=0,rc=0"


def write_profile(tmp_path, text):
    path = tmp_path / "hw.yaml"
    path.write_text(text)
    return str(path)


def test_malformed_yaml(tmp_path):
    path = write_profile(tmp_path, "name: x\ncpu: [unclosed\n")
    one_line_error(run("estimate", "--engine", "ideal", "--hw", path, "--model", "mixtral", "--policy", GOOD), needle="malformed YAML")


def test_negative_bandwidth(tmp_path):
    path = write_profile(tmp_path, "name: x\ncpu: {name: c, cores: 2, memory_gib: 8, memory_bandwidth_gbps: -5, tflops: {fp32: 1}}\n")
    one_line_error(run("estimate", "--engine", "ideal", "--hw", path, "--model", "tiny-mixtral", "--policy", GOOD), needle="memory_bandwidth_gbps")


def test_missing_bandwidth(tmp_path):
    path = write_profile(tmp_path, "name: x\ncpu: {name: c, cores: 2, memory_gib: 8, tflops: {fp32: 1}}\n")
    one_line_error(run("estimate", "--engine", "ideal", "--hw", path, "--model", "tiny-mixtral", "--policy", GOOD), needle="memory_bandwidth_gbps")


def test_unknown_profile_name():
    one_line_error(run("estimate", "--engine", "ideal", "--hw", "l5", "--model", "mixtral", "--policy", GOOD), needle="not found")


def test_unknown_model_suggests():
    one_line_error(run("estimate", "--engine", "ideal", "--hw", "l4", "--model", "mixtrall", "--policy", GOOD), needle="did you mean mixtral")


def test_config_json_missing_keys(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10}))
    one_line_error(run("estimate", "--engine", "ideal", "--hw", "l4", "--model", str(path), "--policy", GOOD), needle="num_hidden_layers")


def test_config_json_is_read(tmp_path):
    cfg = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": 100, "intermediate_size": 128, "num_local_experts": 4, "num_experts_per_tok": 2}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    out = run("estimate", "--engine", "ideal", "--hw", "l4", "--model", str(tmp_path), "--policy", GOOD, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["estimate"]["generation_throughput_tok_s"] > 0


@pytest.mark.parametrize("policy,needle", [
    ("N=512,mux=64", "did you mean 'mu'"),
    ("N=512,mu=64,attn=gpx", "attn"),
    ("N=512,mu=64,rw=1.5", "rw"),
    ("N=500,mu=64", "multiple"),
    ("mu=64", "two of N"),
    ("N=512 mu", "KEY=VALUE"),
])
def test_policy_typos(policy, needle):
    one_line_error(run("estimate", "--engine", "ideal", "--hw", "l4", "--model", "mixtral", "--policy", policy), needle=needle)


def test_unknown_subcommand_and_flag():
    one_line_error(run("estimat"), needle="did you mean 'estimate'")
    one_line_error(run("estimate", "--engine", "ideal", "--hw", "l4", "--model", "mixtral", "--policy", GOOD, "--bogus"), needle="bogus")


def test_estimate_json_has_plan_names():
    out = run("estimate", "--engine", "ideal", "--hw", "l4.yaml", "--model", "mixtral", "--workload", "mtbench", "--gen-len", "128",
              "--policy", GOOD, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    for key in ("decode_layer_latency_s", "prefill_latency_s", "decode_throughput_tok_s",
                "generation_throughput_tok_s", "gpu_peak_bytes", "cpu_peak_bytes", "bottleneck", "breakdown"):
        assert key in data["estimate"]
    assert data["policy"]["micro_batch_size"] == 64


def test_bad_out_path():
    one_line_error(run("search", "--hw", "t4", "--model", "mixtral", "--gen-len", "8", "--out", "/nonexistent/dir/p.json"),
                   needle="does not exist")
