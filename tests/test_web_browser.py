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
