"""Screenshots of the web planner for the README: ``hrm serve`` on 127.0.0.1, headless
Debian ``chromium`` driven by Selenium (as tests/test_web_browser.py does), saved as
``docs/figures/web_*.png``.

    python benchmarks/web_screenshots.py            # writes docs/figures/web_planner.png, web_results.png
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from web_server import running_server  # noqa: E402

OUT = ROOT / "docs" / "figures"
#: the job shown: the README's main job, with a shorter generation to show the URL fields
QUERY = "hw=l4&model=mixtral&engine=moe-lightning&gen_len=128"


def main() -> int:
    from selenium.webdriver.support.ui import WebDriverWait

    from test_web_browser import WAIT_S, make_driver

    import httpx

    with running_server(workers=2) as url:
        for _ in range(2):  # both workers past their first search, as on a server that has been up a while
            httpx.post(f"{url}/api/view", json={"hw": "l4", "model": "mixtral"}, timeout=120)
        driver = make_driver()
        try:
            driver.set_window_size(1400, 1200)
            driver.get(f"{url}/?{QUERY}")
            WebDriverWait(driver, WAIT_S).until(lambda d: d.find_element("id", "status").get_attribute("class") == "done")
            for done in ("data-compared", "data-exported"):
                WebDriverWait(driver, WAIT_S).until(lambda d: d.find_element("tag name", "body").get_attribute(done))
            WebDriverWait(driver, WAIT_S).until(lambda d: all(d.execute_script(
                "const i = document.getElementById(arguments[0]); return i.complete && i.naturalWidth > 0;", name)
                for name in ("fig-roofline", "fig-timeline")))
            time.sleep(0.5)
            OUT.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(OUT / "web_planner.png"))  # the form and the best policy
            # the lower half: --compare, roofline and timeline, exports (the whole page, cropped)
            height = driver.execute_script("return document.documentElement.scrollHeight")
            driver.set_window_size(1400, height + 140)
            time.sleep(0.5)
            top = driver.execute_script("return document.getElementById('compare').previousElementSibling"
                                        ".getBoundingClientRect().top + window.scrollY")
            whole = OUT / "web_results.png"
            driver.save_screenshot(str(whole))
            from PIL import Image

            with Image.open(whole) as image:
                ratio = image.width / driver.execute_script("return window.innerWidth")
                image.crop((0, int((top - 8) * ratio), image.width, int(height * ratio))).save(whole)
        finally:
            driver.quit()
    for name in ("web_planner.png", "web_results.png"):
        print(f"wrote {OUT / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
