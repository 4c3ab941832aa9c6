"""index.html as a person sees it: Debian's chromium, driven by Playwright (no browser download), on the report
of a real small sweep with skipped rows. At 1400 and 800 px the page scrolls only downwards; the page copied
alone into an empty folder shows every plot and asks nothing of any other file or host; the speed table's
rows are one line each; clicking a column's header sorts the rows by it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TINY, run_sweep

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # the dev extra not installed
    sync_playwright = None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it with apt "
                                                "when root on Debian: apt-get install chromium)"),
    pytest.mark.skipif(sync_playwright is None, reason="playwright is not installed (pip install -e '.[dev]')"),
    pytest.mark.xdist_group("report_page"),  # one sweep and one browser for the whole file
]
WIDTHS = (1400, 800)


@pytest.fixture(scope="module")
def lone_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report page of a real sweep (two rounds; dp and apex_ddp skipped on a CPU machine), copied alone
    into an empty folder: what a colleague gets by mail. O1 runs on every host (amp.allow_emulated=true: a CPU
    without native bfloat16 would skip it, and the page would lose the rows whose layout this checks)."""
    sweep = tmp_path_factory.mktemp("sweep") / "sweep"
    proc = run_sweep("strategy=single,ddp,dp,apex_ddp", "amp=O0,O1", "amp.allow_emulated=true", *TINY,
                     "iterations=40", "repeat=2", sweep_dir=sweep)
    assert proc.returncode == 0, proc.stderr[-3000:]
    alone = tmp_path_factory.mktemp("alone")
    shutil.copy(sweep / "index.html", alone / "index.html")
    assert [p.name for p in alone.iterdir()] == ["index.html"]
    return alone / "index.html"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    assert sync_playwright is not None
    with sync_playwright() as p:
        # root in a container: chromium's sandbox needs user namespaces it may not have
        launched = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


def open_page(browser: Any, path: Path, width: int) -> tuple[Any, list[str]]:
    """The page at `width` px; every request it makes besides itself is listed (and refused)."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    asked: list[str] = []

    def route(request_route: Any) -> None:
        url = request_route.request.url
        if url == path.as_uri() or url.startswith("data:"):
            request_route.continue_()
        else:
            asked.append(url)
            request_route.abort()

    page.route("**/*", route)
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, asked


@pytest.mark.parametrize("width", WIDTHS)
def test_the_page_needs_no_sideways_scrolling_and_opens_with_the_verdict(browser, lone_page, width):
    page, asked = open_page(browser, lone_page, width)
    scroll, client = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert scroll == client, f"the page is {scroll} px wide in a {client} px window"
    boxes = page.evaluate("Array.from(document.querySelectorAll('.scroll')).map(b => [b.scrollWidth, b.clientWidth])")
    if width >= 1400:  # no table has columns off-screen; narrower, a table may scroll inside its own box
        assert all(inner <= box for inner, box in boxes), f"tables wider than their boxes: {boxes}"
    first = page.evaluate("document.body.querySelector('h1').nextElementSibling.textContent")
    assert first.startswith("Verdict:")
    assert page.evaluate("document.querySelector('.verdict').getBoundingClientRect().top") < \
        page.evaluate("document.querySelector('table').getBoundingClientRect().top")
    # no table holds a row of a combination that did not run: they are one list, grouped by reason
    tabled = set(page.evaluate("Array.from(document.querySelectorAll('tbody tr')).map(r => r.cells[0].innerText)"))
    assert tabled == {"single O0", "single O1", "ddp O0", "ddp O1"}, tabled
    missing = page.evaluate("document.querySelector('#not_run').innerText")
    assert "apex_ddp O0" in missing and "dp O1" in missing and missing.count("skipped") <= 3
    assert asked == []
    page.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_every_plot_shows_in_the_page_sent_alone(browser, lone_page, width):
    page, asked = open_page(browser, lone_page, width)
    images = page.evaluate("Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth, "
                           "i.getBoundingClientRect().width])")
    assert len(images) >= 3, images
    for alt, complete, natural, shown in images:
        assert complete and natural > 0, f"{alt} did not decode"
        assert 0 < shown <= width, f"{alt} is {shown} px wide at {width}"
    assert asked == [], f"the page asked for other files or hosts: {asked}"
    page.close()


def test_the_speed_tables_rows_are_one_line_and_columns_sort_on_click(browser, lone_page):
    page, _ = open_page(browser, lone_page, 1400)
    cells = page.evaluate("""() => {
        const table = document.querySelector('#speed table');
        const line = parseFloat(getComputedStyle(table.querySelector('td')).lineHeight)
            || 1.2 * parseFloat(getComputedStyle(table.querySelector('td')).fontSize);
        return {line: line, heights: Array.from(table.tBodies[0].rows).map(r => r.getBoundingClientRect().height),
                columns: table.tHead.rows[0].cells.length};
    }""")
    assert cells["columns"] <= 10
    assert cells["heights"] and max(cells["heights"]) <= 2 * cells["line"] + 10, cells  # + the cell's padding

    def column(header: str) -> list[float]:
        return page.evaluate("""(header) => {
            const table = document.querySelector('#speed table');
            const i = Array.from(table.tHead.rows[0].cells).findIndex(th => th.textContent.startsWith(header));
            return Array.from(table.tBodies[0].rows).map(r => parseFloat(r.cells[i].dataset.v));
        }""", header)

    page.click("#speed th:text-matches('^img/s')")
    ascending = column("img/s")
    assert ascending == sorted(ascending) and len(set(ascending)) > 1
    page.click("#speed th:text-matches('^img/s')")
    assert column("img/s") == sorted(ascending, reverse=True)
    page.close()
