"""The web planner (``hrm serve``, :mod:`hrm_cli.web`): the JSON API answers what the CLI's
``--json`` prints (the README's main job and 5 other cases; estimate, compare, export); bad
input is a 400 with one line (infeasible: 422 naming the binding limit), never a 500 or a
traceback; uploads instead of server paths; bounded bodies; a real uvicorn server on
127.0.0.1 answers 20 parallel requests. The browser tests are in test_web_browser.py."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the web planner needs the [web] extra (fastapi, uvicorn, jinja2)")
pytest.importorskip("httpx", reason="FastAPI's TestClient needs httpx (the [test] extra)")

from fastapi.testclient import TestClient  # noqa: E402

from hrm_cli import main as hrm_main  # noqa: E402
from hrm_cli.web.app import create_app  # noqa: E402
from hrm_cli.web.inputs import MAX_BODY_BYTES, MAX_UPLOAD_BYTES  # noqa: E402
from web_server import running_server  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

#: (API fields, the same job as hrm-search flags): the README's main job first
SEARCH_CASES = [
    ({"hw": "l4.yaml", "model": "mixtral"}, ["--hw", "l4.yaml", "--model", "mixtral"]),
    ({"hw": "t4", "model": "mixtral", "engine": "flexgen", "workload": "summarization"},
     ["--hw", "t4", "--model", "mixtral", "--engine", "flexgen", "--workload", "summarization"]),
    ({"hw": "a100-80g", "model": "dbrx", "engine": "ideal", "gen_len": 64, "padding": True},
     ["--hw", "a100-80g", "--model", "dbrx", "--engine", "ideal", "--gen-len", "64", "--padding"]),
    ({"hw": "l4", "model": "mixtral", "fix": "N=64 attn=cpu"}, ["--hw", "l4", "--model", "mixtral", "--fix", "N=64",
                                                                "attn=cpu"]),
    ({"hw": "l4", "model": "mixtral", "engine": "ideal", "objective": "decode", "max_tpot_ms": 2000},
     ["--hw", "l4", "--model", "mixtral", "--engine", "ideal", "--objective", "decode", "--max-tpot-ms", "2000"]),
    ({"hw": "h100", "model": "deepseek-v2-lite", "engine": "llama.cpp", "cpu_mem": 64, "max_ttft_s": 30,
      "prompt_len": 256, "max_prompt_len": 512, "gen_len": 32, "routing": "zipf:1.2"},
     ["--hw", "h100", "--model", "deepseek-v2-lite", "--engine", "llama.cpp", "--cpu-mem", "64", "--max-ttft-s", "30",
      "--prompt-len", "256", "--max-prompt-len", "512", "--gen-len", "32", "--routing", "zipf:1.2"]),
]


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(workers=2, timeout_s=120)) as test_client:
        yield test_client


def cli_json(capsys, *argv) -> dict:
    """What the CLI prints with --json, run in-process (its exit code checked)."""
    capsys.readouterr()
    assert hrm_main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def steady(data):
    """``data`` without the solve times (wall clock: the one field two runs differ in)."""
    if isinstance(data, dict):
        return {k: steady(v) for k, v in data.items() if k != "seconds"}
    if isinstance(data, list):
        return [steady(v) for v in data]
    return data


def one_line_error(response, status: int = 400) -> str:
    assert response.status_code == status, (response.status_code, response.text[:500])
    body = response.json()
    assert set(body) >= {"error"} and isinstance(body["error"], str), body
    assert "\n" not in body["error"] and "Traceback" not in body["error"] and body["error"], body
    return body["error"]


# --- the API answers what the CLI prints ---------------------------------------------------
@pytest.mark.parametrize("fields, argv", SEARCH_CASES, ids=[" ".join(a[1::2][:3]) for _, a in SEARCH_CASES])
def test_search_equals_hrm_search_json(client, capsys, fields, argv):
    response = client.post("/api/search", json=fields)
    assert response.status_code == 200, response.text
    assert steady(response.json()) == steady(cli_json(capsys, "search", *argv))


def test_search_takes_a_form_as_the_json_body(client, capsys):
    form = {"hw": "l4", "model": "mixtral", "gen_len": "64", "padding": "true"}
    response = client.post("/api/search", data=form)
    assert response.status_code == 200, response.text
    want = cli_json(capsys, "search", "--hw", "l4", "--model", "mixtral", "--gen-len", "64", "--padding")
    assert steady(response.json()) == steady(want)


def test_estimate_equals_hrm_estimate_json(client, capsys):
    policy = "N=64,mu=32,attn=cpu,ffn=gpu,rw=0,rc=0"
    response = client.post("/api/estimate", json={"hw": "l4", "model": "mixtral", "engine": "moe-lightning",
                                                   "policy": policy, "explain": True})
    assert response.status_code == 200, response.text
    want = cli_json(capsys, "estimate", "--hw", "l4", "--model", "mixtral", "--engine", "moe-lightning", "--policy",
                    policy, "--explain")
    assert response.json() == want


def test_compare_equals_hrm_search_compare_json(client, capsys):
    response = client.post("/api/compare", json={"hw": "l4", "model": "mixtral", "gen_len": 64})
    assert response.status_code == 200, response.text
    want = cli_json(capsys, "search", "--hw", "l4", "--model", "mixtral", "--gen-len", "64", "--compare")
    assert list(response.json()) == list(want)  # the same ranking
    assert steady(response.json()) == steady(want)


@pytest.mark.parametrize("target", ["flexgen", "vllm"])
def test_export_equals_hrm_search_export_json(client, capsys, target):
    response = client.post("/api/export", json={"hw": "l4", "model": "mixtral", "export": target})
    assert response.status_code == 200, response.text
    want = cli_json(capsys, "search", "--hw", "l4", "--model", "mixtral", "--export", target)
    assert steady(response.json()) == steady(want)
    assert response.json()["export"]["commands"]


def test_view_carries_the_plan_explain_and_memory_and_exports_every_target(client, capsys):
    response = client.post("/api/view", json={"hw": "l4", "model": "mixtral"})
    assert response.status_code == 200, response.text
    view = response.json()
    assert steady(view["plan"]) == steady(cli_json(capsys, "search", "--hw", "l4", "--model", "mixtral"))
    assert [m["tier"] for m in view["memory"]] == ["GPU", "CPU"]
    assert all(0 < m["used_bytes"] <= m["capacity_bytes"] for m in view["memory"])
    assert view["explain"]["engine"] == "moe-lightning" and view["explain"]["mechanisms"]
    from hrm.export import EXPORTERS

    exports = client.post("/api/exports", json={"hw": "l4", "model": "mixtral"})
    assert exports.status_code == 200 and set(exports.json()) == set(EXPORTERS)
    flexgen = client.post("/api/export", json={"hw": "l4", "model": "mixtral", "export": "flexgen"}).json()
    assert exports.json()["flexgen"]["commands"] == flexgen["export"]["commands"]


def test_shipped_names_never_read_the_servers_working_folder(client, tmp_path, monkeypatch):
    """A file named like a shipped profile or model in the folder the server runs in is not read."""
    (tmp_path / "l4.yaml").write_text("not: a profile\n")
    (tmp_path / "mixtral").mkdir()
    (tmp_path / "mixtral" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    from hrm_cli.web import work
    from hrm_cli.web.inputs import parse_request

    status, body = work.answer(parse_request("search", {"hw": "l4.yaml", "model": "mixtral"}))
    assert status == 200, body
    assert body["hardware"]["name"] == "l4.yaml" and body["model"]["name"] == "mixtral"


def test_a_request_past_its_time_bound_is_504():
    with TestClient(create_app(workers=1, timeout_s=0.001)) as slow:
        message = one_line_error(slow.post("/api/compare", json={"hw": "l4", "model": "mixtral"}), 504)
    assert "no answer within" in message


def test_what_if_sliders_change_the_machine(client):
    base = client.post("/api/search", json={"hw": "l4", "model": "mixtral"}).json()
    fast = client.post("/api/search", json={"hw": "l4", "model": "mixtral", "link_gbps": 64}).json()
    assert fast["hardware"]["name"] == "l4@link64GBps"
    assert fast["estimate"]["generation_throughput_tok_s"] > base["estimate"]["generation_throughput_tok_s"]
    scaled = client.post("/api/search", json={"hw": "l4", "model": "mixtral", "cpu_scale": 2}).json()
    assert scaled["hardware"]["name"].startswith("l4@cpu")


@pytest.mark.parametrize("kind", ["roofline", "timeline"])
def test_figures_are_svg_from_hrm_plots(client, kind):
    response = client.get(f"/plot/{kind}.svg", params={"hw": "l4", "model": "mixtral", "gen_len": 64})
    assert response.status_code == 200, response.text[:300]
    assert response.headers["content-type"].startswith("image/svg+xml")
    assert response.text.lstrip().startswith("<?xml") and "<svg" in response.text
    one_line_error(client.get(f"/plot/{kind}.svg", params={"hw": "/etc/passwd", "model": "mixtral"}))


# --- uploads -------------------------------------------------------------------------------
def test_uploaded_profile_and_config_plan_as_the_shipped_files(client, capsys):
    profile = (ROOT / "hardware_profiles" / "l4.yaml").read_text()
    config = (ROOT / "hrm" / "data" / "models" / "mixtral-8x7b.json").read_text()
    files = {"hw_file": ("my-l4.yaml", profile, "application/x-yaml"),
             "model_file": ("mixtral-8x7b.json", config, "application/json")}
    response = client.post("/api/search", files=files, data={"gen_len": "64"})
    assert response.status_code == 200, response.text
    got = response.json()
    want = cli_json(capsys, "search", "--hw", "l4", "--model", "mixtral-8x7b", "--gen-len", "64")
    assert got["hardware"] == {**want["hardware"], "name": "upload:my-l4"}
    assert got["model"]["sha256"] == want["model"]["sha256"]
    assert got["policy"] == want["policy"] and got["estimate"] == want["estimate"]
    # the same as JSON text fields
    response = client.post("/api/search", json={"hw_yaml": profile, "hw_name": "my-l4.yaml", "model": "mixtral-8x7b",
                                                "gen_len": 64})
    assert response.status_code == 200 and response.json()["policy"] == want["policy"]


@pytest.mark.parametrize("text, needle", [
    ("gpu: [1, 2\n", "malformed YAML"),
    ("name: x\nname: y\n", "duplicate"),
    ("- just\n- a list\n", "upload"),
])
def test_a_malformed_profile_upload_is_400(client, text, needle):
    message = one_line_error(client.post("/api/search", json={"hw_yaml": text, "model": "mixtral"}))
    assert needle in message and "/tmp" not in message and "hrm-web-" not in message


def test_a_malformed_config_upload_is_400(client):
    one_line_error(client.post("/api/search", json={"hw": "l4", "model_config": "{not json"}))
    one_line_error(client.post("/api/search", json={"hw": "l4", "model_config": '{"model_type": "llama"}'}))


def test_oversized_body_and_upload_are_400(client):
    message = one_line_error(client.post("/api/search", content=b" " * (MAX_BODY_BYTES + 10),
                                         headers={"content-type": "application/json"}))
    assert "larger than" in message
    message = one_line_error(client.post("/api/search", json={"hw_yaml": "#" * (MAX_UPLOAD_BYTES + 1),
                                                              "model": "mixtral"}))
    assert "larger than" in message
    files = {"hw_file": ("big.yaml", b"#" * (MAX_UPLOAD_BYTES + 1), "application/x-yaml")}
    assert "larger than" in one_line_error(client.post("/api/search", files=files, data={"model": "mixtral"}))


# --- bad input: 400 with one line, never a 500 ---------------------------------------------
BAD = [
    ({"hw": "no-such-machine", "model": "mixtral"}, "unknown"),
    ({"hw": "/etc/passwd", "model": "mixtral"}, "path"),
    ({"hw": "../hardware_profiles/l4.yaml", "model": "mixtral"}, "path"),
    ({"hw": "setup.py", "model": "mixtral"}, "unknown"),
    ({"hw": "l4", "model": "/work/config.json"}, "path"),
    ({"hw": "l4", "model": "C:\\models\\config.json"}, "path"),
    ({"hw": "l4", "model": "mixtral", "engine": "/tmp/engine.yaml"}, "engine"),
    ({"hw": "l4", "model": "mixtral", "routing": "trace:/etc/passwd"}, "routing"),
    ({"hw": "l4", "model": "mixtral", "gen_len": -5}, "--gen-len"),
    ({"hw": "l4", "model": "mixtral", "gen_len": "1_000"}, "--gen-len"),
    ({"hw": "l4", "model": "mixtral", "gen_len": 1.5}, "--gen-len"),
    ({"hw": "l4", "model": "mixtral", "gen_len": True}, "gen_len"),
    ({"hw": "l4", "model": "mixtral", "gpu_mem": -1}, "--gpu-mem"),
    ({"hw": "l4", "model": "mixtral", "cpu_mem": "nan"}, "--cpu-mem"),
    ({"hw": "l4", "model": "mixtral", "max_tpot_ms": "inf"}, "--max-tpot-ms"),
    ({"hw": "l4", "model": "mixtral", "max_ttft_s": 0}, "--max-ttft-s"),
    ({"hw": "l4", "model": "mixtral", "link_gbps": 0}, "link_gbps"),
    ({"hw": "l4", "model": "mixtral", "cpu_scale": -2}, "cpu_scale"),
    ({"hw": "l4", "model": "mixtral", "objective": "fastest"}, "--objective"),
    ({"hw": "l4", "model": "mixtral", "workload": "chat"}, "--workload"),
    ({"hw": "l4", "model": "mixtral", "fix": "N=abc"}, "fix"),
    ({"hw": "l4", "model": "mixtral", "fix": "--json"}, "fix"),
    ({"hw": "l4", "model": "mixtral", "verify": True}, "unknown field"),
    ({"hw": "l4", "model": "mixtral", "gen_len": {"a": 1}}, "gen_len"),
    ({"hw": "l4", "model": "mixtral", "prompt_len": "12\n"}, "control"),
    ({"hw": "l4"}, "--model"),
    ({}, "--hw"),
]


@pytest.mark.parametrize("fields, needle", BAD, ids=[json.dumps(f)[:60] for f, _ in BAD])
def test_bad_input_is_400_with_one_line(client, fields, needle):
    assert needle in one_line_error(client.post("/api/search", json=fields))


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b'"text"', b'{"hw": NaN}', b'{"gen_len": Infinity}',
                                  b"\xff\xfe", b"[" * 100000])
def test_a_body_that_is_not_a_json_object_is_400(client, body):
    one_line_error(client.post("/api/search", content=body, headers={"content-type": "application/json"}))


def test_python_nan_in_json_is_400(client):
    body = json.dumps({"hw": "l4", "model": "mixtral", "gpu_mem": float("nan")})
    assert "finite" in one_line_error(client.post("/api/search", content=body,
                                                  headers={"content-type": "application/json"}))


def test_estimate_and_export_refuse_bad_input(client):
    one_line_error(client.post("/api/estimate", json={"hw": "l4", "model": "mixtral"}))  # no policy
    one_line_error(client.post("/api/estimate", json={"hw": "l4", "model": "mixtral", "policy": "N=0"}))
    assert "export" in one_line_error(client.post("/api/export", json={"hw": "l4", "model": "mixtral"}))
    one_line_error(client.post("/api/export", json={"hw": "l4", "model": "mixtral", "export": "tgi"}))


def test_infeasible_is_422_naming_the_binding_limit(client, capsys):
    """Our choice: infeasible inputs (exit 3 on the CLI) are HTTP 422, the CLI's one line."""
    fields = {"hw": "l4", "model": "mixtral", "gpu_mem": 1, "cpu_mem": 8}
    message = one_line_error(client.post("/api/search", json=fields), 422)
    capsys.readouterr()
    assert hrm_main(["search", "--hw", "l4", "--model", "mixtral", "--gpu-mem", "1", "--cpu-mem", "8"]) == 3
    assert capsys.readouterr().err.strip() == f"error: {message}"
    policy = "N=100000,mu=1000,n=100,attn=gpu,ffn=gpu,rw=1,rc=1"
    response = client.post("/api/estimate", json={"hw": "l4", "model": "mixtral", "engine": "ideal", "policy": policy})
    assert "physical memory" in one_line_error(response, 422)
    assert response.json()["estimate"]["fits_physical_memory"] is False


def test_unknown_route_and_method_answer_json_errors(client):
    one_line_error(client.get("/api/nothing"), 404)
    one_line_error(client.get("/api/search"), 405)


# --- the page ------------------------------------------------------------------------------
def test_the_page_lists_the_inputs_and_ships_its_script(client):
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    for element in ('id="hw"', 'id="model"', 'id="engine"', 'id="gen_len"', 'id="fix"', 'id="link_gbps"',
                    'id="cpu_scale"', 'id="gpu_mem"', 'id="cpu_mem"', 'id="hw_file"', 'id="model_file"',
                    'value="moe-lightning"', 'value="summarization"'):
        assert element in page.text, element
    script = client.get("/static/planner.js")
    assert script.status_code == 200 and "/api/view" in script.text
    assert client.get("/static/planner.css").status_code == 200
    # offline: nothing is loaded from another host
    for text in (page.text, script.text):
        assert "http://" not in text.replace("http://127.0.0.1", "") and "https://" not in text


def test_the_shareable_url_prefills_the_form(client):
    page = client.get("/", params={"hw": "t4", "model": "mixtral", "engine": "flexgen", "gen_len": "64"})
    assert 'data-autorun="yes"' in page.text
    assert '<option value="t4" selected>' in page.text and '<option value="flexgen" selected>' in page.text
    assert 'value="64"' in page.text
    bad = client.get("/", params={"hw": "/etc/passwd"})
    assert bad.status_code == 200 and 'data-autorun="no"' in bad.text and "looks like a path" in bad.text
    assert "&lt;script&gt;" in client.get("/", params={"hw": "<script>"}).text  # escaped, never run


def test_healthz(client):
    assert client.get("/healthz").json()["status"] == "ok"


# --- the CLI and CI ------------------------------------------------------------------------
def test_serve_binds_loopback_by_default():
    from hrm_cli.serve import build_parser

    args = build_parser().parse_args([])
    assert (args.host, args.port) == ("127.0.0.1", 8000)


def test_serve_refuses_a_port_in_use_with_one_line(capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert hrm_main(["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot listen on 127.0.0.1:") and "\n" not in err


def test_ci_runs_the_readme_test_command_after_installing_chromium():
    readme = (ROOT / "README.md").read_text()
    command = next(line for line in readme.splitlines() if line.endswith("-m pytest -q"))
    assert "web]'" in command
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    runs = [i for i, line in enumerate(lines) if line.endswith("-m pytest -q")]
    assert len(runs) == 1 and lines[runs[0]] == command
    install = next(i for i, line in enumerate(lines) if "apt-get install" in line)
    assert install < runs[0] and "chromium chromium-driver" in lines[install]


# --- a real server: 20 parallel requests ---------------------------------------------------
@pytest.fixture(scope="module")
def server():
    """``hrm serve`` in a subprocess on 127.0.0.1 and a free port; its base URL."""
    with running_server(workers=2) as url:
        yield url


def test_twenty_parallel_requests_are_all_answered(server):
    import httpx

    fields = [{"hw": "l4", "model": "mixtral", "gen_len": 32 + i} for i in range(20)]

    def post(body):
        return httpx.post(f"{server}/api/search", json=body, timeout=120)

    with ThreadPoolExecutor(20) as pool:
        responses = list(pool.map(post, fields))
    assert [r.status_code for r in responses] == [200] * 20
    assert [r.json()["workload"]["gen_len"] for r in responses] == [32 + i for i in range(20)]
    # the event loop stays free while the workers search
    assert httpx.get(f"{server}/healthz", timeout=5).status_code == 200


# --- issue 35: one name for an upload, and a URL that says it held one ------------------------
@pytest.mark.parametrize("file_name, name_or_path, name", [
    ("config.json", "some-org/My-Tiny-MoE", "My-Tiny-MoE"),   # config.json: the config's own name
    ("my-moe.json", "some-org/My-Tiny-MoE", "my-moe"),        # a file with a name: that name
    ("config.json", None, "uploaded-model"),                  # neither says more
])
def test_an_uploaded_config_has_one_name(client, file_name, name_or_path, name):
    config = json.loads((ROOT / "hrm" / "data" / "models" / "tiny-mixtral.json").read_text())
    config.pop("_name_or_path", None)
    if name_or_path:
        config["_name_or_path"] = name_or_path
    files = {"model_file": (file_name, json.dumps(config), "application/json")}
    view = client.post("/api/view", files=files, data={"hw": "l4"})
    assert view.status_code == 200, view.text
    data = view.json()
    assert data["plan"]["model"]["name"] == f"upload:{name}" and data["uploads"] == {"model": f"upload:{name}"}
    assert data["title"].startswith(f"upload:{name} on l4:")


def test_a_url_that_held_an_upload_asks_for_the_file(client):
    page = client.get("/", params={"hw": "l4", "model": "upload:My-Tiny-MoE"})
    assert page.status_code == 200
    assert "this URL was made with an uploaded config.json (My-Tiny-MoE)" in page.text
    assert 'data-autorun="no"' in page.text


def test_the_page_and_the_api_plan_for_the_one_default_engine(client):
    """Issue 35: the page's engine select offers hrm.engines.engine.DEFAULT_ENGINE as its default, and
    a search without an engine plans for it, as hrm-search and the API do."""
    from hrm.engines.engine import DEFAULT_ENGINE

    page = client.get("/", params={"hw": "l4", "model": "mixtral"}).text
    assert f'<option value="">default ({DEFAULT_ENGINE})</option>' in page
    data = client.post("/api/search", json={"hw": "l4", "model": "mixtral"}).json()
    assert data["engine"] == DEFAULT_ENGINE  # the body is the plan, as hrm-search --json prints it


# --- issue 34: hrm fit's page (/fit, /api/fit) -------------------------------------------------
#: the README's hrm fit example (parts from the catalog, a catalog model quantized) at a shorter
#: context (fewer -ub values to search: a faster test)
FIT_PARTS = {"gpu": "rtx-4090", "cpu": "ryzen-9-7950x", "ram": 64, "model": "mixtral", "weight_dtype": "int4",
             "weight_format": "q4_k_m", "context": 1024}
FIT_PARTS_ARGV = ["--gpu", "rtx-4090", "--cpu", "ryzen-9-7950x", "--ram", "64", "--model", "mixtral", "--weight-dtype",
                  "int4", "--weight-format", "q4_k_m", "--context", "1024"]


def cli_fit(capsys, *argv) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``hrm fit ARGV`` in-process (usage errors exit 2 by SystemExit)."""
    capsys.readouterr()
    try:
        code = hrm_main(["fit", *argv])
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def same_candidate(got: dict, want):
    """An API candidate and a :class:`hrm.analysis.fit.Candidate`: the same command and numbers."""
    assert got["args"] == want.args()
    assert (got["decode_tok_s"], got["prefill_tok_s"], got["total_s"]) == \
        (want.decode_tok_s, want.prefill_tok_s, want.total_s)
    assert got["memory_bytes"] == want.memory_bytes


def test_fit_equals_hrm_analysis_fit_and_prints_what_the_cli_prints(client, capsys):
    from hrm.analysis.fit import fit_gpu, fit_json
    from hrm.machine.parts import compose_profile
    from hrm.model.spec import load_model

    response = client.post("/api/fit", json=FIT_PARTS)
    assert response.status_code == 200, response.text
    got = response.json()
    hw = compose_profile("rtx-4090", "ryzen-9-7950x", 64)
    want = fit_gpu(hw, load_model("mixtral", weight_dtype="int4").with_weight_format("q4_k_m"), 1024)
    same_candidate(got["best"], want.best)
    for api, direct in zip(got["runners_up"], want.runners_up, strict=True):
        same_candidate(api, direct)
    assert got["hardware"] == hw.name and got["command"] == "llama-cli -m MODEL.gguf " + want.best.args()
    # its JSON is what hrm fit --json prints (hrm.analysis.fit.fit_json), its lines those hrm fit prints
    assert {k: v for k, v in got.items() if k not in ("report", "uploads")} == fit_json(want, hw.name)
    assert got["uploads"] == {}
    code, out, err = cli_fit(capsys, *FIT_PARTS_ARGV)
    report = got["report"]
    assert code == 0 and out.splitlines() == [report["heading"], f"  {report['command']}", f"  {report['predicted']}",
                                               f"  {report['memory']}", "why:", *(f"  - {w}" for w in report["why"]),
                                               "runners-up:", *(f"  {r}" for r in report["runners_up"]), *report["ollama"],
                                               *report["servers"]]
    assert report["ollama"][0].startswith("ollama: ")  # a GPU machine: ollama's form of the answer
    # then vLLM's and SGLang's answers (here each one line: the Q4_K_M GGUF is neither's format)
    assert [line.split(":")[0] for line in report["servers"]] == ["vllm", "sglang"]
    assert err.splitlines() == [f"note: {n}" for n in report["notes"]] and report["notes"]


def test_fit_takes_a_profile_as_a_form(client):
    from hrm.analysis.fit import fit_gpu
    from hrm.machine.hardware import load_hardware
    from hrm.model.spec import load_model

    response = client.post("/api/fit", data={"hw": "l4", "model": "deepseek-v2-lite", "context": "2048"})
    assert response.status_code == 200, response.text
    same_candidate(response.json()["best"], fit_gpu(load_hardware("l4"), load_model("deepseek-v2-lite"), 2048).best)


def test_fit_reads_an_uploaded_gguf_head(client, tmp_path):
    """A GGUF's first bytes (the page sends no more) plan as the whole file does; the command
    names the file, and the URL names the upload."""
    from hrm.analysis.fit import fit_gpu
    from hrm.machine.hardware import load_hardware
    from hrm.model.spec import load_model
    from test_gguf_types import _tiny_moe

    path = tmp_path / "tiny-UD-Q2_K_XL.gguf"
    _tiny_moe(path)
    head = path.read_bytes()[:4096]
    files = {"model_file": (path.name, head, "application/octet-stream")}
    response = client.post("/api/fit", files=files, data={"hw": "l4", "context": "1024"})
    assert response.status_code == 200, response.text
    got = response.json()
    same_candidate(got["best"], fit_gpu(load_hardware("l4"), load_model(str(path)), 1024).best)
    assert got["command"].startswith("llama-cli -m tiny-UD-Q2_K_XL.gguf -ngl ")
    assert got["uploads"] == {"model": "upload:tiny-UD-Q2_K_XL"}
    files = {"model_file": ("cut.gguf", head[:40], "application/octet-stream")}
    message = one_line_error(client.post("/api/fit", files=files, data={"hw": "l4", "context": "1024"}))
    assert message.startswith("upload cut.gguf: not a readable GGUF file") and "hrm-web-" not in message


#: (API fields, hrm fit's flags): bad input the CLI refuses, in the CLI's own line
FIT_BAD = [
    ({"hw": "l4", "model": "mixtral", "context": "1_000"}, ["--hw", "l4", "--model", "mixtral", "--context", "1_000"]),
    ({"hw": "l4", "model": "mixtral"}, ["--hw", "l4", "--model", "mixtral"]),
    ({"hw": "l4", "context": 4096}, ["--hw", "l4", "--context", "4096"]),
    ({"gpu": "rtx-4091", "cpu": "ryzen-9-7950x", "ram": 64, "model": "mixtral", "context": 4096},
     ["--gpu", "rtx-4091", "--cpu", "ryzen-9-7950x", "--ram", "64", "--model", "mixtral", "--context", "4096"]),
    ({"hw": "l4", "gpu": "rtx-4090", "model": "mixtral", "context": 4096},
     ["--hw", "l4", "--gpu", "rtx-4090", "--model", "mixtral", "--context", "4096"]),
    ({"gpu": "rtx-4090", "cpu": "ryzen-9-7950x", "ram": -3, "model": "mixtral", "context": 4096},
     ["--gpu", "rtx-4090", "--cpu", "ryzen-9-7950x", "--ram", "-3", "--model", "mixtral", "--context", "4096"]),
    ({"hw": "cpu-only", "model": "mixtral", "context": 4096}, ["--hw", "cpu-only", "--model", "mixtral", "--context", "4096"]),
    ({"hw": "l4", "model": "mixtral", "weight_format": "q9", "context": 4096},
     ["--hw", "l4", "--model", "mixtral", "--weight-format", "q9", "--context", "4096"]),
]


@pytest.mark.parametrize("fields, argv", FIT_BAD, ids=[" ".join(a)[:50] for _, a in FIT_BAD])
def test_fit_bad_input_is_the_clis_one_line(client, capsys, fields, argv):
    from hrm_cli.web.inputs import one_line

    message = one_line_error(client.post("/api/fit", json=fields))
    code, _, err = cli_fit(capsys, *argv)
    line = err.strip().splitlines()[-1]
    assert code == 2 and line.startswith("error: ")
    assert message == one_line(line[len("error: "):])  # the web's lines stop at 300 characters


def test_fit_infeasible_is_422_with_the_clis_line(client, capsys):
    fields = {"gpu": "rtx-3060-12gb", "cpu": "ryzen-7-5800x", "ram": 8, "model": "mixtral", "context": 256}
    message = one_line_error(client.post("/api/fit", json=fields), 422)
    code, _, err = cli_fit(capsys, "--gpu", "rtx-3060-12gb", "--cpu", "ryzen-7-5800x", "--ram", "8", "--model",
                           "mixtral", "--context", "256")
    assert code == 3 and err.strip().splitlines()[-1] == f"error: {message}"


@pytest.mark.parametrize("fields, needle", [
    ({"hw": "/etc/passwd", "model": "mixtral", "context": 64}, "looks like a path"),
    ({"hw": "l4", "model": "../config.json", "context": 64}, "looks like a path"),
    ({"hw": "l4", "model": "mixtral", "context": 64, "engine": "ideal"}, "unknown field 'engine'"),
    ({"hw": "l4", "model_gguf": "GGUF...", "context": 64}, "uploaded as a file"),
])
def test_fit_refuses_what_the_web_does_not_take(client, fields, needle):
    assert needle in one_line_error(client.post("/api/fit", json=fields))


def test_fit_refuses_a_file_that_is_not_a_gguf_head_or_too_long(client):
    from hrm_cli.web.inputs import MAX_GGUF_HEAD_BYTES

    files = {"model_file": ("big.gguf", b"GGUF" + bytes(MAX_GGUF_HEAD_BYTES), "application/octet-stream")}
    assert "larger than" in one_line_error(client.post("/api/fit", files=files, data={"hw": "l4", "context": "64"}))
    files = {"model_file": ("weights.bin", b"\x00\xff" * 100, "application/octet-stream")}
    assert "not UTF-8" in one_line_error(client.post("/api/fit", files=files, data={"hw": "l4", "context": "64"}))


def test_fit_for_parallel_users_is_the_clis(client, capsys):
    """The fit page's parallel users and generated tokens are hrm fit's --users and --gen: the same
    pick and JSON (a KV stream per user, never -kvu), and the page prefills them from its URL."""
    from hrm.analysis.fit import fit_gpu, fit_json
    from hrm.machine.parts import compose_profile
    from hrm.model.spec import load_model

    response = client.post("/api/fit", json={**FIT_PARTS, "users": 4, "gen": 64})
    assert response.status_code == 200, response.text
    got = response.json()
    hw = compose_profile("rtx-4090", "ryzen-9-7950x", 64)
    want = fit_gpu(hw, load_model("mixtral", weight_dtype="int4").with_weight_format("q4_k_m"), 1024, 64, 4)
    assert {k: v for k, v in got.items() if k not in ("report", "uploads")} == fit_json(want, hw.name)
    assert "-np 4" in got["command"] and "-kvu" not in got["command"]
    code, out, _ = cli_fit(capsys, *FIT_PARTS_ARGV, "--users", "4", "--gen", "64")
    assert code == 0 and out.splitlines()[1] == f"  {got['report']['command']}"
    page = client.get("/fit", params={"hw": "t4", "model": "mixtral", "context": "2048", "users": "8", "gen": "32"}).text
    assert 'id="users" inputmode="numeric" placeholder="1" value="8"' in page
    assert 'id="gen" inputmode="numeric" placeholder="128" value="32"' in page
    bad = client.post("/api/fit", json={**FIT_PARTS, "users": 0})
    assert bad.status_code == 400 and "--users" in bad.json()["error"]


def test_fit_for_a_servers_load_is_the_clis(client, tmp_path, capsys):
    """A CPU-only profile and a GGUF's head uploaded, a load (requests per second, how many): the
    llama-server command hrm fit --rate-per-s picks (hrm_cli.fit.run_load_fit), its JSON and its lines;
    the rate without the count is the CLI's refusal."""
    from hrm.analysis.fit_load import fit_cpu_load, load_fit_json, load_fit_lines
    from hrm.cost.ggml_server import poisson
    from hrm.machine.hardware import load_hardware
    from hrm.model.gguf import read_inventory
    from test_gguf_types import _tiny_moe

    gguf = tmp_path / "tiny.gguf"
    _tiny_moe(gguf)
    profile = ROOT / "docs" / "validation" / "runs" / "this-host-load-poisson.yaml"
    files = {"hw_file": ("host.yaml", profile.read_bytes(), "application/x-yaml"),
             "model_file": (gguf.name, gguf.read_bytes(), "application/octet-stream")}
    load = {"context": "129", "gen": "32", "rate_per_s": "3", "requests": "24"}
    response = client.post("/api/fit", files=files, data=load)
    assert response.status_code == 200, response.text
    got = response.json()
    hw = load_hardware(str(profile))
    want = fit_cpu_load(hw, read_inventory(str(gguf)), poisson(3, 24, 129 - 32, 32, seed=0))
    assert {k: v for k, v in got.items() if k not in ("report", "uploads")} == load_fit_json(want, hw.name, "tiny.gguf")
    assert got["report"]["lines"] == load_fit_lines(want, hw.name, "tiny.gguf")
    assert got["best"]["command"].startswith("llama-server -m tiny.gguf ")
    code, out, _ = cli_fit(capsys, "--hw", str(profile), "--gguf", str(gguf), "--context", "129", "--gen", "32",
                           "--rate-per-s", "3", "--requests", "24")
    assert code == 0 and out.splitlines() == load_fit_lines(want, hw.name, str(gguf))
    half = dict(load, requests="")
    message = one_line_error(client.post("/api/fit", files=files, data={k: v for k, v in half.items() if v}))
    assert message == "--rate-per-s and --requests go together (how fast requests arrive, and how many)"


def test_the_fit_page_is_prefilled_from_its_url_and_linked_from_the_planner(client):
    page = client.get("/fit")
    assert page.status_code == 200 and 'data-autorun="no"' in page.text
    for element in ('id="hw"', 'id="gpu"', 'id="cpu"', 'id="ram"', 'id="model"', 'id="model_file"', 'id="context"',
                    '<option value="rtx-4090" selected>', '<option value="ryzen-9-7950x" selected>', 'value="4096"'):
        assert element in page.text, element
    shared = client.get("/fit", params={"hw": "t4", "model": "deepseek-v2-lite", "context": "2048"}).text
    assert 'data-autorun="yes"' in shared and '<option value="t4" selected>' in shared
    assert 'id="machine-profile" checked' in shared and 'value="2048"' in shared
    bad = client.get("/fit", params={"hw": "l4", "model": "mixtral", "context": "x"}).text
    assert 'data-autorun="no"' in bad and "error: hrm fit: argument --context: expected an integer" in bad
    assert "unknown URL field" in client.get("/fit", params={"model_gguf": "x"}).text
    assert 'href="/fit"' in client.get("/").text
    script = client.get("/static/fit.js").text
    assert "/api/fit" in script and "http://" not in script and "https://" not in script
    assert client.get("/static/requests.js").status_code == 200
