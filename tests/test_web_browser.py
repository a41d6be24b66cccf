"""The web planner in a real browser: Selenium drives Debian's headless ``chromium`` through
``chromium-driver`` against ``hrm serve`` on 127.0.0.1. It loads the page, changes inputs,
plans, and reads the displayed throughput and policy, which must be the CLI's; the
shareable URL must reproduce them. Where no browser is installed (``.ci/run`` installs
one) every test here is skipped and says why."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("fastapi", reason="the web planner needs the [web] extra (fastapi, uvicorn, jinja2)")
pytest.importorskip("httpx", reason="the server fixture polls /healthz with httpx (the [test] extra)")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the [test] extra)")

from web_server import running_server  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="no real browser here: install Debian's chromium and chromium-driver (.ci/run does) to run the "
           f"browser tests (chromium: {CHROMIUM or 'missing'}, chromedriver: {CHROMEDRIVER or 'missing'})")

#: seconds the page may take to plan (a search, its explain and every export, on 2 shared cores)
WAIT_S = 90


def make_driver():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1800", "--no-proxy-server"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@pytest.fixture(scope="module")
def server():
    with running_server(workers=2) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    try:
        driver = make_driver()
    except Exception as exc:  # noqa: BLE001 - a browser that cannot start: skip, saying why
        pytest.skip(f"chromium did not start under chromedriver: {' '.join(str(exc).split())[:300]}")
    try:
        yield driver
    finally:
        driver.quit()


def wait_for_plan(driver):
    """The status after a plan: 'planned in ...' (or the error line)."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, WAIT_S).until(
        lambda d: d.find_element("id", "status").get_attribute("class") in ("done", "error"))
    return driver.find_element("id", "status").text


def shown(driver) -> tuple[float, str]:
    """(generation throughput, policy) as the page shows them."""
    value = driver.find_element("id", "out-throughput")
    return float(value.get_attribute("data-value")), driver.find_element("id", "out-policy").text


def cli_plan(capsys, *argv) -> dict:
    from hrm_cli import main

    capsys.readouterr()
    assert main(["search", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def policy_text(plan: dict) -> str:
    from hrm.policy import Policy

    return Policy(**plan["policy"]).short()


def test_change_inputs_and_plan_as_the_cli(server, browser, capsys):
    from selenium.webdriver.support.ui import Select

    browser.get(f"{server}/")
    assert browser.find_element("id", "hw").get_attribute("value") == "l4"
    Select(browser.find_element("id", "engine")).select_by_value("flexgen")
    gen = browser.find_element("id", "gen_len")
    gen.clear()
    gen.send_keys("64")
    browser.find_element("id", "run").click()
    assert wait_for_plan(browser).startswith("planned in")
    want = cli_plan(capsys, "--hw", "l4", "--model", "mixtral", "--engine", "flexgen", "--gen-len", "64")
    throughput, policy = shown(browser)
    assert throughput == pytest.approx(want["estimate"]["generation_throughput_tok_s"], rel=1e-12)
    assert policy == policy_text(want)
    displayed = browser.find_element("id", "out-throughput").text
    assert displayed == f"{want['estimate']['generation_throughput_tok_s']:,.1f}"  # as hrm-search prints it
    share = browser.find_element("id", "share-url").get_attribute("href")
    assert "hw=l4" in share and "engine=flexgen" in share and "gen_len=64" in share


@pytest.mark.slow  # a real browser, two plans (seconds each): the full suite runs it
def test_the_shareable_url_reproduces_the_plan(server, browser, capsys):
    from selenium.webdriver.support.ui import WebDriverWait

    url = f"{server}/?hw=t4&model=mixtral&engine=moe-lightning&gen_len=128&workload=summarization"
    browser.get(url)
    assert wait_for_plan(browser).startswith("planned in")
    want = cli_plan(capsys, "--hw", "t4", "--model", "mixtral", "--engine", "moe-lightning", "--gen-len", "128",
                    "--workload", "summarization")
    throughput, policy = shown(browser)
    assert throughput == pytest.approx(want["estimate"]["generation_throughput_tok_s"], rel=1e-12)
    assert policy == policy_text(want)
    # the rest of the page: the ranked --compare table and both figures
    WebDriverWait(browser, WAIT_S).until(lambda d: d.find_element("tag name", "body").get_attribute("data-compared"))
    rows = browser.find_elements("css selector", "#compare tbody tr")
    assert len(rows) >= 5 and rows[0].find_elements("tag name", "td")[0].text == "1"
    WebDriverWait(browser, WAIT_S).until(lambda d: all(d.execute_script(
        "const i = document.getElementById(arguments[0]); return i.complete && i.naturalWidth > 0;", name)
        for name in ("fig-roofline", "fig-timeline")))
    assert browser.find_elements("css selector", "#memory .tier")
    WebDriverWait(browser, WAIT_S).until(lambda d: d.find_element("tag name", "body").get_attribute("data-exported"))
    assert "--gpu-batch-size" in browser.find_element("id", "exports").text


def test_bad_input_shows_one_line(server, browser):
    browser.get(f"{server}/")
    gen = browser.find_element("id", "gen_len")
    gen.clear()
    gen.send_keys("1_000")
    browser.find_element("id", "run").click()
    status = wait_for_plan(browser)
    assert status.startswith("error:") and "--gen-len" in status and "\n" not in status


# --- issue 35: only the answer to the latest request ------------------------------------------
#: wraps the page's fetch: a request whose body holds SLOW answers DELAY_MS late (a slow
#: network or a busy server), so that an earlier plan's replies arrive after a later plan's
DELAY_FETCH = """
const slow = arguments[0], delay = arguments[1], original = window.fetch;
window.fetch = async (url, options) => {
  const answer = original(url, options);
  if (options && String(options.body || "").includes(slow)) {
    await new Promise((resolve) => setTimeout(resolve, delay));
  }
  return answer;
};
"""


def wait_body(driver, name: str, value: str):
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, WAIT_S).until(lambda d: d.find_element("tag name", "body").get_attribute(name) == value)


@pytest.mark.slow  # a real browser, two plans (seconds each): the full suite runs it
def test_two_plans_in_quick_succession_show_only_the_second(server, browser, capsys):
    """Plan on l4, then at once on t4; l4's replies are held back 4 s. The page shows t4's plan,
    and t4's compare table, and nothing of l4's arrives later."""
    import time

    from selenium.webdriver.support.ui import Select

    browser.get(f"{server}/")
    browser.execute_script(DELAY_FETCH, '"hw":"l4"', 4000)
    browser.find_element("id", "run").click()                       # plan 1: l4 (held back)
    Select(browser.find_element("id", "hw")).select_by_value("t4")
    browser.find_element("id", "run").click()                       # plan 2: t4
    assert wait_for_plan(browser).startswith("planned in")
    wait_body(browser, "data-planned", "2")
    wait_body(browser, "data-compared", "2")
    wait_body(browser, "data-exported", "2")
    time.sleep(5)  # past l4's delay: a stale reply would have landed by now
    want = cli_plan(capsys, "--hw", "t4", "--model", "mixtral")
    throughput, policy = shown(browser)
    assert throughput == pytest.approx(want["estimate"]["generation_throughput_tok_s"], rel=1e-12)
    assert policy == policy_text(want)
    assert " on t4:" in browser.find_element("id", "out-title").text
    assert "hw=t4" in browser.find_element("id", "share-url").get_attribute("href")
    # the compare table is t4's: its row of the planned engine is the plan shown above
    rows = [[td.text for td in row.find_elements("tag name", "td")]
            for row in browser.find_elements("css selector", "#compare tbody tr")]
    engine_row = next(r for r in rows if r[1] == want["engine"])
    assert engine_row[3] == f"{want['estimate']['generation_throughput_tok_s']:,.1f}", rows


@pytest.mark.slow  # a real browser, two plans (seconds each): the full suite runs it
def test_an_error_after_a_success_clears_the_page(server, browser):
    browser.get(f"{server}/?hw=l4&model=mixtral")
    assert wait_for_plan(browser).startswith("planned in")
    wait_body(browser, "data-compared", "1")
    gen = browser.find_element("id", "gen_len")
    gen.clear()
    gen.send_keys("1_000")
    browser.find_element("id", "run").click()
    status = wait_for_plan(browser)
    assert status.startswith("error:") and "--gen-len" in status
    assert not browser.find_element("id", "results").is_displayed()
    assert browser.find_element("id", "out-throughput").get_attribute("data-value") is None
    assert browser.find_element("id", "out-policy").get_attribute("textContent") == ""
    assert not browser.find_elements("css selector", "#compare tbody tr, #explain tbody tr, #exports *, #memory *")
    for name in ("fig-roofline", "fig-timeline"):
        figure = browser.find_element("id", name)
        assert figure.get_attribute("src") in (None, "") and figure.get_attribute("data-loading") == "yes"


def test_an_upload_is_named_one_way_and_its_url_says_so(server, browser, tmp_path):
    """A config.json named by its _name_or_path: the title, the plan and the URL say
    upload:NAME; opening the URL asks for the file again instead of planning another model."""
    import json as json_mod
    from pathlib import Path

    config = json_mod.loads((Path(__file__).resolve().parents[1] / "hrm" / "data" / "models" /
                             "tiny-mixtral.json").read_text())
    config["_name_or_path"] = "some-org/My-Tiny-MoE"
    path = tmp_path / "config.json"
    path.write_text(json_mod.dumps(config))
    browser.get(f"{server}/")
    browser.find_element("id", "model_file").send_keys(str(path))
    browser.find_element("id", "run").click()
    assert wait_for_plan(browser).startswith("planned in")
    assert browser.find_element("id", "out-title").text.startswith("upload:My-Tiny-MoE on l4:")
    first, _ = shown(browser)
    share = browser.find_element("id", "share-url")
    url = share.get_attribute("href")
    assert "model=upload%3AMy-Tiny-MoE" in url and "upload:My-Tiny-MoE" in share.text
    assert browser.current_url == url  # the address bar holds the same
    plan = json_mod.loads(browser.execute_script(
        "return fetch(document.getElementById('download-plan').href).then((r) => r.text());"))
    assert plan["model"]["name"] == "upload:My-Tiny-MoE"
    # the shared URL: it cannot carry the file, so it says so and does not plan
    browser.get(url)
    status = browser.find_element("id", "status").text
    assert status.startswith("error: model: this URL was made with an uploaded config.json (My-Tiny-MoE)"), status
    assert not browser.find_element("id", "results").is_displayed()
    browser.find_element("id", "model_file").send_keys(str(path))
    browser.find_element("id", "run").click()
    assert wait_for_plan(browser).startswith("planned in")
    assert shown(browser)[0] == first


# --- issue 34: hrm fit's page --------------------------------------------------------------
def test_fit_page_shows_the_clis_command_and_clears_on_an_error(server, browser):
    """/fit: pick a profile, a model and a context, Fit: the command and the predicted tok/s are
    hrm.analysis.fit's (as hrm fit prints them), the URL holds the inputs; then a bad context
    answers the CLI's line and clears the answer."""
    from selenium.webdriver.support.ui import Select, WebDriverWait

    from hrm.analysis.fit import fit_gpu, fit_report
    from hrm.machine.hardware import load_hardware
    from hrm.model.spec import load_model

    browser.get(f"{server}/fit")
    Select(browser.find_element("id", "hw")).select_by_value("l4")  # a profile: its radio is picked
    assert browser.find_element("id", "machine-profile").is_selected()
    Select(browser.find_element("id", "model")).select_by_value("deepseek-v2-lite")
    for name in ("weight_dtype", "weight_format"):
        Select(browser.find_element("id", name)).select_by_value("")
    context = browser.find_element("id", "context")
    context.clear()
    context.send_keys("2048")
    browser.find_element("id", "run").click()
    assert wait_for_plan(browser).startswith("fitted in")
    hw = load_hardware("l4")
    want = fit_gpu(hw, load_model("deepseek-v2-lite"), 2048)
    report = fit_report(want, hw.name)
    assert browser.find_element("id", "fit-command").text == report.command
    predicted = browser.find_element("id", "fit-predicted")
    assert predicted.text == report.predicted and "tok/s" in predicted.text
    assert float(predicted.get_attribute("data-decode")) == want.best.decode_tok_s
    assert float(predicted.get_attribute("data-prefill")) == want.best.prefill_tok_s
    assert browser.find_element("id", "fit-memory").text == report.memory
    assert len(browser.find_elements("css selector", "#fit-runners li")) == len(want.runners_up)
    # vLLM's and SGLang's answers: the lines hrm fit prints for them, one item each
    servers = browser.find_elements("css selector", "#fit-servers li")
    assert [li.get_attribute("textContent") for li in servers] == list(report.servers) and report.servers
    share = browser.find_element("id", "share-url").get_attribute("href")
    assert share.endswith("/fit?hw=l4&model=deepseek-v2-lite&context=2048") and browser.current_url == share
    context.clear()
    context.send_keys("1_000")
    browser.find_element("id", "run").click()
    WebDriverWait(browser, WAIT_S).until(lambda d: d.find_element("id", "status").get_attribute("class") == "error")
    status = browser.find_element("id", "status").text
    assert status == "error: hrm fit: argument --context: expected an integer, got '1_000'"
    assert not browser.find_element("id", "results").is_displayed()
    assert browser.find_element("id", "fit-command").get_attribute("textContent") == ""
    assert browser.find_element("id", "fit-predicted").get_attribute("data-decode") is None
    assert not browser.find_elements("css selector", "#fit-why li, #fit-runners li, #fit-servers li")
    # parallel users: hrm fit --users 2 (a KV stream each), and the URL holds them
    context.clear()
    context.send_keys("2048")
    browser.find_element("id", "users").send_keys("2")
    browser.find_element("id", "run").click()
    assert wait_for_plan(browser).startswith("fitted in")
    two = fit_report(fit_gpu(hw, load_model("deepseek-v2-lite"), 2048, users=2), hw.name)
    assert browser.find_element("id", "fit-command").text == two.command and "-np 2" in two.command
    assert browser.find_element("id", "share-url").get_attribute("href").endswith(
        "/fit?hw=l4&model=deepseek-v2-lite&context=2048&users=2")


def test_fit_page_fits_a_servers_load(server, browser, tmp_path):
    """/fit with a CPU-only profile and a GGUF uploaded and a load (requests per second, how many):
    the page shows hrm fit --rate-per-s's command and lines (hrm.analysis.fit_load.load_fit_lines)."""
    from pathlib import Path

    from hrm.analysis.fit_load import fit_cpu_load, load_fit_lines
    from hrm.cost.ggml_server import poisson
    from hrm.machine.hardware import load_hardware
    from hrm.model.gguf import read_inventory
    from test_gguf_types import _tiny_moe

    gguf = tmp_path / "tiny.gguf"
    _tiny_moe(gguf)
    profile = Path(__file__).resolve().parents[1] / "docs" / "validation" / "runs" / "this-host-load-poisson.yaml"
    browser.get(f"{server}/fit")
    browser.find_element("id", "hw_file").send_keys(str(profile))  # an upload picks the profile radio
    assert browser.find_element("id", "machine-profile").is_selected()
    browser.find_element("id", "model_file").send_keys(str(gguf))
    for name, value in (("context", "129"), ("gen", "32"), ("rate_per_s", "3"), ("requests", "24")):
        field = browser.find_element("id", name)
        field.clear()
        field.send_keys(value)
    browser.find_element("id", "run").click()
    assert wait_for_plan(browser).startswith("fitted in")
    hw = load_hardware(str(profile))
    want = fit_cpu_load(hw, read_inventory(str(gguf)), poisson(3, 24, 97, 32, seed=0))
    lines = load_fit_lines(want, hw.name, "tiny.gguf")
    assert browser.find_element("id", "fit-heading").text == lines[0]
    command = browser.find_element("id", "fit-command").text
    assert command.startswith("llama-server -m tiny.gguf ") and lines[1].strip().startswith(command + ": ")
    runners = [li.get_attribute("textContent") for li in browser.find_elements("css selector", "#fit-runners li")]
    assert runners == [line.strip() for line in lines[lines.index("runners-up:") + 1:]]
