"""index.html as a person sees it: Debian's chromium, driven by Playwright (no browser download), on the report
of a real small sweep with skipped rows, and on a page whose rows carry every feature's columns at their widest
(built from Rows: no sweep). At 1400 and 800 px the page scrolls only downwards, and at 1400 (and
1000) every table fits its box; the page copied alone into an empty folder shows every plot and asks nothing of
any other file or host; the speed table's rows are one line each; clicking a column's header sorts the rows."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.core.results import SCHEMA, from_dict
from harness.memory.report import DeviceUse, MemorySection
from harness.parity.report import ParitySection
from harness.prediction.report import PredictionSection
from harness.profile.report import ProfileSection
from harness.report.rows import Row
from tests.conftest import TINY, run_sweep

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # the dev extra not installed
    sync_playwright = None

pytestmark = [
    pytest.mark.slow,  # a browser is a process of its own
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it with apt "
                                                "when root on Debian: apt-get install chromium)"),
    pytest.mark.skipif(sync_playwright is None, reason="playwright is not installed (pip install -e '.[dev]')"),
    pytest.mark.xdist_group("report_page"),  # one sweep and one browser for the whole file
]
WIDTHS = (1400, 800)
TABLES = """Array.from(document.querySelectorAll('table')).map(t => [t.closest('section').id, t.scrollWidth,
    t.parentElement.clientWidth])"""  # each table's width beside its box's (a .scroll div, or its section)


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


def every_feature_rows() -> list[Row]:
    """Rows carrying every feature's columns at their widest: eight GPUs each held by five runs' PIDs, parameters
    per rank, predictions with their bands, parity, the profiled breakdown, compile, MFU, energy, tokens/s,
    variants (compile, grad_accum, a communication hook, a swept optimizer), a busy row whose prediction is far
    off, a row racing stopped, and rows that did not run."""
    def row(label: str, strategy: str, amp: str, devices: int, rate: float, parity: str = "agrees",
            time_error: float = 0.0826, **figures: Any) -> Row:
        names = [f"cuda:{i}" for i in range(devices)]
        seconds = 20 * 256 * devices / rate
        run = from_dict({"schema": SCHEMA, "status": "ok", "strategy": strategy, "amp": amp, "model": "gpt",
                         "startup_seconds": 123.4, "compile_seconds": 456.7, "mfu": 0.4321, "data_wait_share": 0.0123,
                         "energy_j_per_image": 1.234})
        made = Row(label=label, strategy=strategy, amp=amp, model="gpt", devices=names, processes=devices,
                   global_batch=256 * devices, status="ok", reason=None, runs=5, ok_runs=5, s_per_20=seconds,
                   s_per_20_lo=0.93 * seconds, s_per_20_hi=1.08 * seconds, throughput=rate,
                   throughput_lo=0.93 * rate, throughput_hi=1.08 * rate, spread_known=True, tokens_per_sample=1024,
                   model_sample="tokens", run_throughputs=[(n, rate) for n in range(5)],
                   cumulative=[(20 * i, 123.45 * i) for i in range(1, 31)], speedup=rate / 1234.5,
                   speedup_lo=0.95 * rate / 1234.5, speedup_hi=1.05 * rate / 1234.5, speedup_word="faster",
                   efficiency=0.876, final_loss=6.54321, records=(run,),
                   memory=MemorySection(sources=("nvml",), params_rank_mib=23456.78, theory_mib=12345.6,
                                        per_device=tuple(DeviceUse(n, 81234.0 - 100 * i,
                                                                   tuple(1234560 + 10 * i + k for k in range(5)))
                                                         for i, n in enumerate(names)),
                                        max_mib=81234.0, max_lo=80123.0, max_hi=81999.0, min_mib=79876.0,
                                        imbalance_pct=12.0),
                   profile=ProfileSection(breakdown={"compute": 0.41, "communication": 0.35, "data_wait": 0.19,
                                                     "optimizer": 0.02, "other": 0.03},
                                          comm_overlapped_share=0.87, view="device"),
                   prediction=PredictionSection(predicted_peak_mib=78901.2, predicted_peak_band=(70123.4, 88765.4),
                                                measured_peak_mib=80123.4, peak_error=0.0152, predicted_s_per_it=1.2345,
                                                measured_s_per_it=1.3456, time_error=time_error),
                   parity=ParitySection(parity, reference="single O0", max_abs=1.2e-6, max_rel=3.4e-6,
                                        loss_diff=5.6e-7,
                                        note="equal within float32's rounding over the steps compared"))
        for name, value in figures.items():
            setattr(made, name, value)
        return made

    return [
        row("single O0", "single", "O0", 1, 1234.5, speedup_word=None, parity="reference", efficiency=None),
        row("ddp O2 comm_hook=fp16 compile=true grad_accum=4 optim=adamw", "ddp", "O2", 8, 9876.5),
        row("fsdp O1 compile=true grad_accum=8 strategy.reshard_after_forward=false", "fsdp", "O1", 8, 8765.4,
            speedup_word="equivalent", parity="mixed precision"),
        row("zero O2 grad_accum=2 optim=adamw", "zero", "O2", 8, 7654.3, busy="other processes used 1.9 of 2 cores "
            "during its windows", spread_known=False, throughput_lo=None, throughput_hi=None, run_throughputs=[],
            busy_runs=5, speedup=None, speedup_lo=None, speedup_hi=None, speedup_word=None, efficiency=None,
            time_error=-26.264),
        row("allreduce O3 compile=true", "allreduce", "O3", 8, 6543.2, stopped_early=3, busy_runs=2,
            speedup_word="slower", parity="DIFFERS"),
        Row(label="dp O1", strategy="dp", amp="O1", model="gpt", devices=[], processes=None, global_batch=None,
            status="skipped", reason="strategy=dp: needs two or more CUDA GPUs", runs=1, ok_runs=0),
    ]


def every_feature_page(folder: Path) -> Path:
    """index.html of `every_feature_rows`, its plots inside, with the header, a search's answer and a
    projection: every table the page can hold, each at its widest."""
    from harness.report.findings import of_rows
    from harness.report.page import to_html
    from harness.report.plots import write_plots
    from harness.report.rows import Context
    from harness.search.answer import SearchAnswer

    rows = every_feature_rows()
    report = of_rows(rows, "single O0")
    report.context = Context(runs=26, first_started=1.7e9, last_finished=1.7e9 + 7200,
                             machine="AMD EPYC 9654 96-Core Processor (AVX512), 8× NVIDIA H100 80GB HBM3 "
                                     "(driver 550.54.15)", versions="torch 2.5.1, python 3.12.3",
                             commands=["python run.py -m strategy=single,ddp,fsdp,zero,allreduce,dp amp=O0,O1,O2,O3 "
                                       "compile=true,false grad_accum=1,2,4,8 parity=true profile=true"],
                             commits=["0123456789abcdef0123456789abcdef01234567"],
                             kernels="cudnn.benchmark on, channels_last on, float32 matmul precision high")
    report.search = SearchAnswer(sentence="ddp O2 comm_hook=fp16 compile=true grad_accum=4 optim=adamw is the "
                                 "fastest", best=rows[1].label, decided="winner",
                                 command="python run.py strategy=ddp amp=O2 compile=true grad_accum=4 optim=adamw",
                                 pruned=[("fsdp O0 grad_accum=1", "predicted 93 GiB per rank, over 80 GiB")],
                                 failed=[("dp O1", "skipped: needs two or more CUDA GPUs")], cost="26 runs, 41 min")
    report.projected = [{"label": r.label, "strategy": r.strategy, "amp": r.amp, "hardware": "h100x16-ib",
                         "devices": 16, "global_batch": 4096, "status": "predicted", "reason": None,
                         "throughput_img_s": 12345.6, "throughput_band": (10987.6, 14567.8), "mfu": 0.4321,
                         "peak_mib": 78901.2, "fits": True, "unit": "tokens/s", "per_sample": 1024,
                         "band_source": "the fit's leave-one-out errors", "assumptions": ["links as the preset says"]}
                        for r in rows[:5]]
    pngs = write_plots(rows, folder, "single O0")
    page = folder / "index.html"
    page.write_text(to_html(report, pngs))
    return page


@pytest.fixture(scope="module")
def full_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return every_feature_page(tmp_path_factory.mktemp("every_feature"))


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
    if width >= 1400:  # no table has columns off-screen; narrower, a table may scroll inside its own box
        tables = page.evaluate(TABLES)
        assert all(inner <= box for _, inner, box in tables), f"tables wider than their boxes: {tables}"
    kernels = page.evaluate("Array.from(document.querySelectorAll('.meta dt')).find(d => d.textContent == 'kernels')"
                            ".nextElementSibling.textContent")
    assert kernels.startswith("cudnn.benchmark n/a (no CUDA)"), kernels  # a CPU sweep: torch's flag acted on nothing
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


@pytest.mark.parametrize("width", (1400, 1000))
def test_every_table_fits_its_box_with_every_features_columns(browser, full_page, width):
    """The memory table was 1,460 px in a 1,368 px box at 1400 (per-device PIDs on one line beside params/rank):
    with every feature's columns at their widest, each table still fits its box, and the page does not scroll
    sideways."""
    page, asked = open_page(browser, full_page, width)
    scroll, client = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert scroll == client, f"the page is {scroll} px wide in a {client} px window"
    tables = page.evaluate(TABLES)
    assert [t[0] for t in tables] == ["speed", "cumulative", "memory", "parity", "time", "prediction", "projection"]
    assert all(inner <= box for _, inner, box in tables), f"tables wider than their boxes at {width} px: {tables}"
    headers = page.evaluate("Array.from(document.querySelectorAll('th')).map(th => th.textContent)")
    for wanted in ("tok/s [95 %]", "params/rank MiB", "per device (PIDs)", "parity (max rel Δ)", "MFU", "J/image",
                   "profiled: compute/comm/data/optim/other %", "time error", "90 % band"):
        assert wanted in headers, (wanted, headers)
    # eight devices' PIDs: a line each, not one line of 2,700 px
    parts = page.evaluate("Array.from(document.querySelectorAll('#memory tbody tr')[1].querySelectorAll('.part'))"
                          ".map(p => p.getBoundingClientRect().top)")
    assert len(parts) == 8 and len(set(parts)) == 8, parts
    assert asked == []
    page.close()


def test_the_every_feature_page_scrolls_only_inside_a_tables_box_when_narrow(browser, full_page):
    page, _ = open_page(browser, full_page, 800)
    scroll, client = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert scroll == client, f"the page is {scroll} px wide in a {client} px window"
    page.close()


def test_a_busy_rows_time_error_is_not_judged_on_the_page(browser, full_page):
    """The busy row's time error (-2626.4 % of others' work, not the prediction's) reads `— (busy)`."""
    page, _ = open_page(browser, full_page, 1400)
    cells = page.evaluate("""() => {
        const table = document.querySelector('#prediction table');
        const i = Array.from(table.tHead.rows[0].cells).findIndex(th => th.textContent == 'time error');
        return Object.fromEntries(Array.from(table.tBodies[0].rows).map(r => [r.cells[0].textContent,
                                                                             r.cells[i].textContent]));
    }""")
    assert cells["zero O2 grad_accum=2 optim=adamw"] == "— (busy)" and cells["single O0"] == "+8.3 %", cells
    assert "2626" not in page.evaluate("document.body.innerText")
    page.close()
