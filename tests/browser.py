"""A real headless Chromium for the report tests (Debian's chromium and chromium-driver,
installed by scripts/setup.sh; Selenium drives that executable, it downloads nothing).

The browser test must run in CI, not skip: a missing browser is a failure that says how to
install it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")


@dataclass
class Chart:
    name: str
    width: float
    height: float
    marks: int
    """Data marks drawn with a nonzero box: elements whose id is ``<chart>-mark-<k>``
    (sandfleet.plotting gives every line, bar and collection one), not axes or ticks."""


@dataclass
class Page:
    charts: dict[str, Chart]
    errors: list[str]
    text: str


def _find(names: tuple[str, ...]) -> str | None:
    for n in names:
        found = shutil.which(n)
        if found:
            return found
    return None


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = _find(CHROMIUM), _find(("chromedriver",))
    if binary is None or driver is None:
        pytest.fail("the report test needs chromium and chromedriver: run scripts/setup.sh "
                    "(apt-get install chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-extensions", "--no-first-run", "--window-size=1400,1000"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(driver), options=opts)
    try:
        yield d
    finally:
        d.quit()


def open_report(browser: Any, path: Path) -> Page:
    """Load an HTML report from disk; its charts (``figure[data-chart]``) with their size and
    marks, and every console message at level SEVERE (errors, failed loads, bad SVG)."""
    browser.get_log("browser")  # drop what an earlier page left
    browser.get(path.resolve().as_uri())
    rows = browser.execute_script(
        "return [...document.querySelectorAll('figure[data-chart]')].map(f => {"
        "  const s = f.querySelector('svg'); const r = (s || f).getBoundingClientRect();"
        "  const marks = s ? [...s.querySelectorAll('[id^=\"' + f.dataset.chart + '-mark-\"]')]"
        "    .filter(m => { const b = m.getBBox(); return b.width > 0 || b.height > 0; }).length : 0;"
        "  return [f.dataset.chart, r.width, r.height, marks];"
        "})"
    )
    errors = [e["message"] for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
    text = browser.execute_script("return document.body.innerText")
    charts = {}
    for name, w, h, marks in rows:
        assert name not in charts, f"{path.name}: chart {name!r} appears twice"
        charts[name] = Chart(name, float(w), float(h), int(marks))
    return Page(charts, errors, text)


def check_report(browser: Any, path: Path, expected: list[str], *, min_marks: int = 1) -> Page:
    """Every expected chart is there with a nonzero size and data marks; no console errors."""
    page = open_report(browser, path)
    assert not page.errors, f"{path.name}: console errors: {page.errors}"
    missing = [n for n in expected if n not in page.charts]
    assert not missing, f"{path.name}: missing charts {missing}; found {sorted(page.charts)}"
    for name in expected:
        c = page.charts[name]
        assert c.width > 50 and c.height > 50, f"{path.name}: chart {name} is {c.width}x{c.height}"
        assert c.marks >= min_marks, f"{path.name}: chart {name} has {c.marks} marks, no data drawn"
    return page
