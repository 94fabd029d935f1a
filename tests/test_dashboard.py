"""`sexpgpu ui`: the dashboard served by the real CLI, loaded in a real headless Chromium
(Debian's chromium and chromium-driver, through selenium) against a store made by real runs:
each page, each curve's number of points against the run's events, a training run's curve
growing while the page watches, nothing from the store taken as markup, the store unchanged
byte for byte after a session, and the same over a real S3 (moto's server on loopback).
A screenshot of each page is saved in the test's temp folder.

The HTTP-level tests (the Host check, 404s, headers, the event stream) need no browser; the
browser tests skip, saying why, only when chromium or its driver is not installed (.ci/run
installs both)."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from conftest import REPO, wait_for
from results_store import STEPS, SWEEP_POINTS, MadeStore, counts, events_of, make_store, quietly, snapshot, write_file, TINY
from sexpgpu.dashboard import server as dashboard
from sexpgpu.runtime.runfolder import RunFolder
from sexpgpu.runtime.store import Store

sys.path.insert(0, str(Path(__file__).parent))
from s3_server import MotoS3, boto3_client, make_bucket, patched_env, s3_env  # noqa: E402

pytestmark = pytest.mark.xdist_group("dashboard")  # one browser and one server for the module

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
needs_browser = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver; .ci/run installs them)")
WAIT_S = 90.0

MARKUP_KNOB = '<img src=x onerror="window.pwned=1">'
MARKUP_NOTE = "<script>window.pwned=2</script><b>bold</b>"
XSS_FILE = "x<i>ss.lisp"  # a file stem with markup: it names the slug


# -- the store, the server, the browser ---------------------------------------------------------


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> MadeStore:
    base = tmp_path_factory.mktemp("dashboard")
    store = make_store(base / "runs")
    text = TINY.replace("(defknob steps 40)", f"(defknob steps 10)\n(defknob note {json.dumps(MARKUP_KNOB)})")
    xss = write_file(base / "project", XSS_FILE, text)
    assert quietly("run", str(xss), "--store", str(store.root), "--quiet") == 0
    slug = next(p.name for p in store.root.iterdir() if p.name.startswith("x<i>ss."))
    assert quietly("annotate", str(store.root / slug), MARKUP_NOTE) == 0
    return MadeStore(root=store.root, file=store.file, slugs=store.slugs + [slug], points=store.points)


def xss_slug(made: MadeStore) -> str:
    return made.slugs[-1]


@contextlib.contextmanager
def serving(store: str, env: Optional[dict[str, str]] = None, *flags: str) -> Iterator[str]:
    """`sexpgpu ui STORE` in its own process: its URL while it serves; stopped with SIGINT
    (it must exit 0)."""
    with serving_process(store, env, *flags) as (url, _):
        yield url


@contextlib.contextmanager
def serving_process(store: str, env: Optional[dict[str, str]] = None, *flags: str) -> Iterator[tuple[str, "subprocess.Popen[str]"]]:
    """`serving`, with the server's process (to read its memory)."""
    process = subprocess.Popen([sys.executable, "-m", "sexpgpu", "ui", store, "--interval", "0.2", *flags],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        match = re.match(r"sexpgpu ui: (http://127\.0\.0\.1:\d+/)  \(the store (.*), read-only; Ctrl-C stops\)$", first.rstrip("\n"))
        assert match, (first, process.stderr.read() if process.stderr else "")
        yield match.group(1), process
    finally:
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        assert code == 0, process.stderr.read() if process.stderr else code


@pytest.fixture(scope="module")
def ui(made: MadeStore) -> Iterator[str]:
    with serving(str(made.root)) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver; .ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000",
                     "--no-first-run", "--disable-extensions", "--disable-background-networking"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


ROW_SLUGS = "return [...document.querySelectorAll('#runs tbody tr')].map(r => r.dataset.slug)"


def until(driver: Any, script: str, what: str) -> Any:
    """The value of SCRIPT once it is truthy (the page polled, not slept on)."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.05).until(lambda d: d.execute_script(script), message=what)


def open_page(driver: Any, url: str) -> None:
    driver.get(url)
    until(driver, "return document.body.dataset.ready === 'true' && window.sexpgpu.ready === true", f"{url} drawn (data-ready)")


def screenshot(driver: Any, folder: Path, name: str) -> Path:
    """The whole page (the window made as tall as the page), as NAME.png."""
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    driver.set_window_size(1400, max(600, min(height + 40, 6000)))
    path = folder / f"{name}.png"
    driver.save_screenshot(str(path))
    driver.set_window_size(1400, 1000)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return path


CHART_COUNTS = """
const out = {};
for (const [key, chart] of Object.entries(window.sexpgpu.charts)) {
  const u = chart.uplot;
  out[key] = Object.fromEntries(u.series.slice(1).map((s, i) => [s.label, u.data[i + 1].filter((v) => v !== null && v !== undefined).length]));
}
return out;
"""


def severe_logs(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def page_url(ui: str, kind: str, name: str, file: Optional[str] = None) -> str:
    from urllib.parse import quote

    return f"{ui}{kind}/{quote(name, safe='')}" + (f"?file={quote(file, safe='')}" if file else "")


# -- pages ------------------------------------------------------------------------------------------


@needs_browser
def test_the_runs_page_lists_every_run_and_sorts_by_a_column(made: MadeStore, ui: str, browser: Any, shots: Path) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, ui)
    # each read is one script: the page redraws the table every 5 s, so elements found in one
    # call can be gone in the next
    assert sorted(browser.execute_script(ROW_SLUGS)) == sorted(made.slugs)
    headers = browser.execute_script("return [...document.querySelectorAll('#runs thead th')].map(th => th.textContent)")
    assert headers[:5] == ["slug", "file", "selection", "state", "steps"] and "val/loss" in headers and headers[-3:] == ["started", "duration", "device"]
    store = Store.open(str(made.root))
    losses = {s: RunFolder(store, s).read_status().metrics["loss"] for s in made.slugs}  # type: ignore[union-attr]
    browser.find_element(By.CSS_SELECTOR, '#runs th[data-key="loss"]').click()
    until(browser, "return document.querySelector('#runs').dataset.sort === 'loss'", "sorted by loss")
    assert browser.execute_script(ROW_SLUGS) == sorted(made.slugs, key=lambda s: losses[s])
    browser.find_element(By.CSS_SELECTOR, '#runs th[data-key="loss"]').click()
    until(browser, "return document.querySelector('#runs').dataset.desc === 'true'", "sorted the other way")
    assert browser.execute_script(ROW_SLUGS) == sorted(made.slugs, key=lambda s: -losses[s])
    state = browser.execute_script(f"return document.querySelector('#runs tr[data-slug=\"{made.points[1]}\"] td[data-key=\"state\"]').textContent")
    assert state == "finished"
    screenshot(browser, shots, "runs")
    assert severe_logs(browser) == []


@needs_browser
def test_a_run_page_has_a_curve_per_series_with_a_point_per_logged_step(made: MadeStore, ui: str, browser: Any, shots: Path) -> None:
    from selenium.webdriver.common.by import By

    store = Store.open(str(made.root))
    for slug in (made.slugs[0], made.points[2]):
        open_page(browser, page_url(ui, "run", slug))
        expected = counts(store, slug)
        assert expected == {"loss": STEPS // 5, "val/loss": 2}
        charts = until(browser, CHART_COUNTS, "charts drawn")
        assert charts["metric:loss"] == {"train": expected["loss"], "val": expected["val/loss"]}
        assert charts["metric:acc"] == {"train": expected["loss"], "val": expected["val/loss"]}
        assert charts["optimizer:grad_norm"] == {"grad_norm": expected["loss"]} and charts["optimizer:lr:all"] == {"lr:all": expected["loss"]}
        # every series the events hold is drawn, each with its every point
        steps = [e for e in events_of(store, slug) if e["kind"] == "step"]
        assert {k for k in charts if k.startswith("speed:")} == {f"speed:{f}" for f in ("step_time", "examples_per_s", "memory") if f in steps[0]}
        info = RunFolder(store, slug).read_run_info()
        body = browser.find_element(By.TAG_NAME, "main").text
        assert info.ir_hash in body and info.source_hash in body
        non_step = [e for e in events_of(store, slug) if e["kind"] != "step"]
        assert len(browser.find_elements(By.CSS_SELECTOR, "table.events tr[data-kind]")) == len(non_step)
    knobs = browser.find_element(By.XPATH, "//h2[text()='Knobs']/following-sibling::table").text
    assert "lr 0.2" in knobs and "width 8" in knobs
    browser.find_element(By.CSS_SELECTOR, 'a[data-source="tiny.lisp"]').click()
    until(browser, "return !document.querySelector('pre.source').hidden", "the source shown")
    assert browser.find_element(By.CSS_SELECTOR, "pre.source").text.startswith(";;;; tiny.lisp")
    screenshot(browser, shots, "run")
    assert severe_logs(browser) == []


@needs_browser
def test_the_sweep_page_overlays_its_points_and_draws_knobs_against_the_metric(made: MadeStore, ui: str, browser: Any, shots: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    open_page(browser, page_url(ui, "sweep", "grid", str(made.file)))
    store = Store.open(str(made.root))
    charts = until(browser, CHART_COUNTS, "the overlay drawn")
    expected = {f"grid-{i} lr={lr} width={w}": counts(store, made.points[i])["loss"] for i, (lr, w) in enumerate([(0.05, 8), (0.05, 16), (0.2, 8), (0.2, 16)])}
    assert charts == {"sweep": expected}
    Select(browser.find_element(By.ID, "metric")).select_by_value("val/acc")
    until(browser, "return Object.values(window.sexpgpu.charts.sweep.uplot.data.slice(1)).every((c) => c.filter((v) => v !== null).length === 2)", "val/acc overlaid")
    lines = browser.find_elements(By.CSS_SELECTOR, "svg.parallel polyline.pc-line")
    assert sorted(line.get_attribute("data-slug") for line in lines) == sorted(made.points)
    axes = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "svg.parallel > text")]
    assert {"lr", "width", "val/loss"} <= set(axes)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#sweep-points tr[data-slug]")) == SWEEP_POINTS
    screenshot(browser, shots, "sweep")
    assert severe_logs(browser) == []


@needs_browser
def test_nothing_from_the_store_is_taken_as_markup(made: MadeStore, ui: str, browser: Any, shots: Path) -> None:
    """A slug, a knob value and an annotation with markup are shown as text, never run."""
    from selenium.webdriver.common.by import By

    slug = xss_slug(made)
    assert "<i>" in slug
    open_page(browser, ui)
    assert browser.find_element(By.CSS_SELECTOR, "#runs tbody").text.count(slug) == 1
    open_page(browser, page_url(ui, "run", slug))
    until(browser, "return document.querySelectorAll('table.events tr[data-kind=annotation]').length === 1", "the annotation listed")
    main = browser.find_element(By.TAG_NAME, "main")
    assert main.find_elements(By.CSS_SELECTOR, "img, script, b, i") == []
    text = main.text
    assert slug in text and MARKUP_KNOB in text and MARKUP_NOTE in text
    assert browser.execute_script("return window.pwned === undefined")
    screenshot(browser, shots, "markup")


@needs_browser
def test_a_training_runs_curve_grows_while_the_page_watches(made: MadeStore, browser: Any, shots: Path, tmp_path: Path) -> None:
    """A long run trains into its own store; its page shows the points logged so far, then
    more, as the run logs them."""
    root = tmp_path / "live"
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    run = subprocess.Popen([sys.executable, "-m", "sexpgpu", "run", "--set", "steps=1000000", str(made.file), "--store", str(root), "--quiet"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        store = Store.open(str(root))

        def logged() -> int:
            folders = store.folders() if root.is_dir() else []
            return sum(1 for e in events_of(store, folders[0]) if e["kind"] == "step") if folders else 0

        wait_for(lambda: logged() > 0, "the run's first step events")
        (slug,) = store.folders()
        with serving(str(root)) as ui:
            open_page(browser, page_url(ui, "run", slug))
            first = until(browser, "return (window.sexpgpu.charts['metric:loss'] || {uplot: {data: [[]]}}).uplot.data[0].length", "a first curve")
            seen = logged()
            wait_for(lambda: logged() > max(seen, first), "more step events in the store")
            grown = until(browser, f"const n = window.sexpgpu.charts['metric:loss'].uplot.data[0].length; return n > {first} ? n : 0", "the curve grew")
            assert grown > first
            # read in one script: the page redraws the header as status arrives, so an element
            # found in one call can be gone by the next
            state = until(browser, "const e = document.querySelector('main span.state'); return e && e.textContent !== '-' ? e.textContent : ''", "the run's state shown")
            assert state in ("running", "evaluating", "checkpointing"), state
            screenshot(browser, shots, "live")
    finally:
        run.send_signal(signal.SIGINT)
        code = run.wait(timeout=60)
    assert code == 75, run.stderr.read() if run.stderr else code


@needs_browser
def test_a_session_leaves_the_store_byte_identical(made: MadeStore, ui: str, browser: Any) -> None:
    """Every page and every API document read, live streams left running: no file of the
    store was written, added or removed."""
    before = snapshot(made.root)
    stamps = {p: os.stat(made.root / p).st_mtime_ns for p in before}
    open_page(browser, ui)
    for slug in made.slugs:
        open_page(browser, page_url(ui, "run", slug))
        until(browser, "return document.querySelectorAll('table.events tr').length > 1", "events listed")
    open_page(browser, page_url(ui, "sweep", "grid"))
    for slug in made.slugs:
        for tail in ("", "/curves", "/events", "/source/tiny.lisp"):
            get(f"{page_url(ui, 'api/run', slug)}{tail}", ok=(200, 404))
    assert snapshot(made.root) == before
    assert {p: os.stat(made.root / p).st_mtime_ns for p in before} == stamps


# -- HTTP, without a browser ------------------------------------------------------------------------


def get(url: str, host: Optional[str] = None, method: str = "GET", ok: tuple[int, ...] = (200,)) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, headers, body = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        status, headers, body = error.code, dict(error.headers), error.read()
    assert status in ok, (url, status, body[:300])
    return status, headers, body


def test_the_api_serves_the_store_as_json(made: MadeStore, ui: str) -> None:
    _, headers, body = get(f"{ui}api/runs")
    assert headers["Content-Type"] == "application/json; charset=utf-8" and "default-src 'self'" in headers["Content-Security-Policy"]
    doc = json.loads(body)
    assert doc["store"] == str(made.root) and sorted(r["slug"] for r in doc["runs"]) == sorted(made.slugs)
    store = Store.open(str(made.root))
    curves = json.loads(get(page_url(ui, "api/run", made.slugs[0]) + "/curves")[2])
    by_name = {s["name"]: s for s in curves["series"]}
    steps = [e for e in events_of(store, made.slugs[0]) if e["kind"] == "step"]
    assert by_name["loss"]["steps"] == [e["step"] for e in steps] and by_name["loss"]["values"] == [e["loss"] for e in steps]
    assert by_name["val/acc"]["group"] == "eval" and by_name["val/acc"]["steps"] == [20, 40]
    sweep = json.loads(get(f"{ui}api/sweep/grid")[2])
    assert [p["slug"] for p in sweep["points"]] == made.points and set(sweep["curves"]) == set(made.points)
    source = json.loads(get(page_url(ui, "api/run", made.slugs[0]) + "/source/tiny.lisp")[2])
    assert source["text"] == made.file.read_text()


@pytest.mark.parametrize("path", ["api/run/nope.base.1", "api/run/..%2F..%2Fetc", "api/run/.hidden", "static/VENDORED.md", "static/../server.py",
                                  "api/sweep/nope", "nothing", "api/run/%s/source/..%%2Frun.json"])
def test_what_is_not_there_is_a_404(made: MadeStore, ui: str, path: str) -> None:
    status, _, body = get(ui + (path % made.slugs[0] if "%s" in path else path), ok=(404,))
    assert status == 404 and (body.startswith(b"{") or b"404" in body)


@pytest.mark.parametrize("query", ["points=%C2%B2", "page=%C2%B2", "per_page=0", "points=0", "points=all2"])
def test_a_query_that_is_not_a_number_is_a_400(ui: str, query: str) -> None:
    status, _, body = get(f"{ui}api/sweep/grid?{query}", ok=(400,))
    assert "give" in json.loads(body)["error"]


class Faulty(dashboard.Dashboard):
    """A dashboard with a fault of its own (not the store's) in its runs listing."""

    def runs(self) -> dict[str, Any]:
        raise KeyError("a fault of the dashboard's own")


def test_a_fault_of_the_dashboard_is_a_500_that_says_what_and_the_server_goes_on(made: MadeStore, capfd: pytest.CaptureFixture[str]) -> None:
    server = dashboard.Server(Faulty(Store.open(str(made.root))))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        status, headers, body = get(f"{server.url}api/runs", ok=(500,))
        error = json.loads(body)["error"]
        assert headers["Content-Type"] == "application/json; charset=utf-8"
        assert "KeyError" in error and "a fault of the dashboard's own" in error and "/api/runs" in error, error
        assert "Traceback" in capfd.readouterr().err
        assert json.loads(get(page_url(server.url, "api/run", made.slugs[0]))[2])["record"]["slug"] == made.slugs[0]
    finally:
        server.close()
        thread.join(timeout=30)


def test_only_requests_to_127_0_0_1_are_answered(ui: str) -> None:
    status, _, body = get(f"{ui}api/runs", host="evil.example:80", ok=(421,))
    assert b"answers only 127.0.0.1 and localhost" in body
    port = ui.rstrip("/").rsplit(":", 1)[1]
    assert get(f"{ui}api/runs", host=f"localhost:{port}")[0] == 200
    assert get(ui, method="HEAD")[2] == b""


def test_the_live_stream_sends_the_whole_curve_then_only_what_is_new(made: MadeStore, ui: str) -> None:
    host, port = ui[len("http://"):].rstrip("/").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("GET", page_url("/", "api/run", made.slugs[0]) + "/live")
        response = connection.getresponse()
        assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream; charset=utf-8"
        messages: list[str] = []
        buffer = b""
        while len(messages) < 2:  # the first update, then a tick with nothing new
            buffer += response.read1(65536)
            while b"\n\n" in buffer:
                block, buffer = buffer.split(b"\n\n", 1)
                messages.append(block.decode())
    finally:
        connection.close()
    assert messages[0].startswith("retry: ")
    update = next(m for m in messages if m.startswith("event: update"))
    doc = json.loads(update.split("data: ", 1)[1])
    assert doc["reset"] is True and doc["record"]["slug"] == made.slugs[0] and doc["last_step"] == STEPS
    assert {s["name"]: len(s["steps"]) for s in doc["series"]}["loss"] == STEPS // 5


def test_a_live_page_is_sent_only_new_points_and_everything_again_when_a_resume_replaced_some(tmp_path: Path) -> None:
    from sexpgpu.results.readers import RunReaders
    from sexpgpu.runtime.events import EventLog

    store = Store.open(str(tmp_path / "runs"))
    readers = RunReaders(store)
    sent: dict[str, tuple[int, int, Optional[float]]] = {}

    def log(*events: dict[str, Any]) -> None:
        with EventLog(store, "r") as events_log:
            for event in events:
                events_log.emit(event)

    def step(n: int, loss: float) -> dict[str, Any]:
        return {"kind": "step", "step": n, "loss": loss}

    log(step(1, 1.0), step(2, 0.9))
    fresh, reset = readers.since("r", sent, 1000)
    assert not reset and [(s.name, s.steps) for s in fresh.series] == [("loss", [1, 2])]
    log(step(3, 0.8))
    fresh, reset = readers.since("r", sent, 1000)
    assert not reset and [(s.name, s.steps) for s in fresh.series] == [("loss", [3])]
    fresh, reset = readers.since("r", sent, 1000)
    assert not reset and fresh.series == []
    log({"kind": "resume", "step": 1, "from_step": 1, "checkpoint": "step-1"}, step(2, 0.95), step(3, 0.7))  # step 2 on came again
    fresh, reset = readers.since("r", sent, 1000)
    assert reset and [(s.name, s.steps, s.values) for s in fresh.series] == [("loss", [1, 2, 3], [1.0, 0.95, 0.7])]


def test_the_vendored_uplot_is_the_npm_release_with_its_licence() -> None:
    static = REPO / "sexpgpu" / "dashboard" / "static"
    notes = (static / "VENDORED.md").read_text()
    for name in ("uPlot.iife.min.js", "uPlot.min.css"):
        digest = hashlib.sha256((static / name).read_bytes()).hexdigest()
        assert f"| {name} | {digest} |" in notes
    assert (static / "uPlot.iife.min.js").read_text().startswith("/*! https://github.com/leeoniya/uPlot (v1.6.32) */")
    assert "uPlot 1.6.32" in notes and (static / "uPlot.LICENSE").read_text().startswith("The MIT License (MIT)")
    assert "Permission is hereby granted" in (static / "uPlot.LICENSE").read_text()
    pages = (static / "index.html").read_text()
    references = re.findall(r'(?:src|href)="([^"]+)"', pages)
    assert references == ["/static/favicon.svg", "/static/uPlot.min.css", "/static/style.css", "/static/uPlot.iife.min.js", "/static/app.js", "/"]  # nothing from elsewhere
    assert set(dashboard.STATIC) == {"app.js", "style.css", "uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE", "favicon.svg"}
    assert "innerHTML" not in (static / "app.js").read_text() and "insertAdjacentHTML" not in (static / "app.js").read_text()


# -- the verb's own errors ------------------------------------------------------------------------


def test_ui_refuses_a_missing_store_a_taken_port_and_bad_flags(made: MadeStore, ui: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def ui_exit(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sexpgpu", "ui", *args], capture_output=True, text=True, timeout=60, env=env)

    missing = ui_exit(str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no store at " in missing.stderr
    port = ui.rstrip("/").rsplit(":", 1)[1]
    taken = ui_exit(str(made.root), "--port", port)
    assert taken.returncode == 4 and f"cannot listen on 127.0.0.1:{port}" in taken.stderr
    assert ui_exit(str(made.root), "--interval", "0").returncode == 2
    assert ui_exit(str(made.root), "--port", "70000").returncode == 2


# -- S3 -----------------------------------------------------------------------------------------------


@needs_browser
def test_the_dashboard_over_s3(made: MadeStore, browser: Any, shots: Path) -> None:
    """A run trained onto a bucket (events as numbered segments): its API documents and its
    page, the bucket's objects unchanged after."""
    pytest.importorskip("s3fs")
    with MotoS3() as moto:
        env = s3_env(moto.endpoint)
        bucket = make_bucket(None, moto.endpoint)
        url = f"s3://{bucket}/team"
        with patched_env(env):
            assert quietly("run", str(made.file), "--store", url, "--quiet", "--set", "steps=20") == 0
            store = Store.open(url)
            (slug,) = store.folders()
            expected = counts(store, slug)
        client = boto3_client(moto.endpoint)

        def objects() -> dict[str, str]:
            return {o["Key"]: o["ETag"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]}

        before = objects()
        assert any("/events/000000.jsonl" in key for key in before)
        with serving(url, env) as ui:
            doc = json.loads(get(f"{ui}api/runs")[2])
            assert [r["slug"] for r in doc["runs"]] == [slug] and doc["runs"][0]["state"] == "finished"
            open_page(browser, page_url(ui, "run", slug))
            charts = until(browser, CHART_COUNTS, "charts drawn")
            assert charts["metric:loss"] == {"train": expected["loss"], "val": expected["val/loss"]} == {"train": 4, "val": 1}
            screenshot(browser, shots, "run-s3")
            open_page(browser, ui)
        assert objects() == before


# -- the dashboard as a researcher reads it ------------------------------------------------------------

LAYOUT = Path(__file__).parent / "dashboard_layout.json"  # what is where on each page, as drawn at 1400 px wide
UPDATE_LAYOUT = "SEXPGPU_UPDATE_LAYOUT"  # set to 1 to write LAYOUT anew from this machine's pages

# The boxes a page is compared by: NAME -> a CSS selector (each element it matches, in order).
# What lies low on a long page (the events, the sources) moves with every font: left out.
LAYOUT_PARTS = {
    "runs": {"header": "header", "title": "main h1", "toolbar": "main .toolbar", "table": "#runs"},
    "run": {"header": "header", "title": "main h1", "summary": "main > div > table.kv", "toolbar": "main > .toolbar",
            "sections": "main section[data-section]:not([hidden]) > h2", "charts": "main .chart"},
    "sweep": {"header": "header", "title": "main h1", "overlay": "#overlay .chart", "parallel": "svg.parallel", "points": "#sweep-points"},
}
# boxes whose width is their text's: the run's summary names its folder, a path as long as the machine's temp folder
TEXT_WIDE = {("run", "summary")}
BOXES = """
const out = {};
for (const [name, selector] of Object.entries(arguments[0])) {
  out[name] = [...document.querySelectorAll(selector)].map((e) => {
    const r = e.getBoundingClientRect();
    return [Math.round(r.left + window.scrollX), Math.round(r.top + window.scrollY), Math.round(r.width), Math.round(r.height)];
  });
}
return out;
"""


def near(a: int, b: int) -> bool:
    """Two coordinates of one box on two machines: fonts differ, so some tens of pixels."""
    return abs(a - b) <= 40 + 0.08 * max(abs(a), abs(b))


def layout_of(driver: Any, page: str) -> dict[str, list[list[int]]]:
    return dict(driver.execute_script(BOXES, LAYOUT_PARTS[page]))


@needs_browser
def test_the_pages_are_laid_out_as_stored(made: MadeStore, ui: str, browser: Any, shots: Path) -> None:
    """The runs, run and sweep pages, screenshotted once drawn (data-ready), have the parts
    the stored layout has, each where it was within a tolerance (not pixel for pixel)."""
    pages = {"runs": ui, "run": page_url(ui, "run", made.slugs[0]), "sweep": page_url(ui, "sweep", "grid", str(made.file))}
    found = {}
    for page, url in pages.items():
        open_page(browser, url)
        screenshot(browser, shots, f"layout-{page}")
        found[page] = layout_of(browser, page)
    if os.environ.get(UPDATE_LAYOUT) == "1":
        LAYOUT.write_text(json.dumps(found, indent=1) + "\n")
    assert LAYOUT.exists(), f"no stored layout: run with {UPDATE_LAYOUT}=1 once, look at the screenshots in {shots}, commit {LAYOUT.name}"
    stored = json.loads(LAYOUT.read_text())
    for page, parts in stored.items():
        for name, boxes in parts.items():
            have = found[page][name]
            assert len(have) == len(boxes), (page, name, have, boxes)
            for box, want in zip(have, boxes):
                compared = [0, 1, 3] if (page, name) in TEXT_WIDE else [0, 1, 2, 3]
                assert all(near(box[i], want[i]) for i in compared), (page, name, "x y width height now", box, "stored", want)


Y_AXES = """
const out = {};
for (const [key, chart] of Object.entries(window.sexpgpu.charts)) {
  const u = chart.uplot, axis = u.axes[1];
  u.ctx.font = axis.font[0];
  const widest = Math.max(0, ...(axis._values || []).map((v) => u.ctx.measureText(String(v)).width / devicePixelRatio));
  out[key] = {label: axis.label || null, values: axis._values, need: widest + axis.ticks.size + axis.gap, size: axis._size,
              data: u.data.slice(1).map((c) => c.filter((v) => v !== null))};
}
return out;
"""


@needs_browser
def test_memory_is_charted_in_mib_and_no_axis_label_is_clipped(made: MadeStore, ui: str, browser: Any) -> None:
    store = Store.open(str(made.root))
    slug = made.slugs[0]
    memory = [e["memory"] for e in events_of(store, slug) if e["kind"] == "step" and "memory" in e]
    assert memory, "the run logs its memory"
    open_page(browser, page_url(ui, "run", slug))
    axes = until(browser, "return (function () {" + Y_AXES + "})()", "the axes drawn")
    chart = axes["speed:memory"]
    assert chart["label"] == "MiB" and all(str(v).replace(".", "").isdigit() for v in chart["values"] if v), chart
    assert chart["data"][0] == pytest.approx([m / (1 << 20) for m in memory])
    for key, axis in axes.items():
        assert axis["need"] <= axis["size"], (key, axis)  # every tick label fits its axis


def lab(color: str) -> tuple[float, float, float]:
    """An sRGB colour (#rrggbb) in CIELAB (D65)."""
    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(int(color[i:i + 2], 16) / 255) for i in (1, 3, 5))
    x, y, z = ((0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047, 0.2126 * r + 0.7152 * g + 0.0722 * b, (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883)

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116

    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


POINT_ON_LINE = """
const line = document.querySelector(`svg.parallel polyline[data-slug="${arguments[0]}"]`);
line.scrollIntoView({block: "center"});
const box = line.ownerSVGElement.getBoundingClientRect();
const p = line.getAttribute("points").split(" ").map((xy) => xy.split(",").map(Number));
const [a, b] = [p[p.length - 2], p[p.length - 1]];
return [Math.round(box.left + a[0] + 0.85 * (b[0] - a[0])), Math.round(box.top + a[1] + 0.85 * (b[1] - a[1]))];
"""


@needs_browser
def test_thirty_series_have_thirty_distinct_colours_and_hover_picks_one_out(made: MadeStore, ui: str, browser: Any) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.actions.action_builder import ActionBuilder
    from selenium.webdriver.common.by import By

    open_page(browser, page_url(ui, "sweep", "grid", str(made.file)))
    palette = browser.execute_script("return window.sexpgpu.palette")
    assert len(palette) >= 30
    points = [lab(c) for c in palette[:30]]
    closest = min(sum((a - b) ** 2 for a, b in zip(p, q)) ** 0.5 for i, p in enumerate(points) for q in points[i + 1:])
    assert closest >= 20, closest  # CIE76: 2.3 is just noticeable; 20 is another colour
    assert all(lab(c)[0] <= 75 for c in palette[:30])  # dark enough to read on white
    legend = browser.find_elements(By.CSS_SELECTOR, "#overlay .u-legend .u-series")
    ActionChains(browser).move_to_element(legend[2]).perform()  # the legend's row of the second point
    alphas = until(browser, "const s = window.sexpgpu.charts.sweep.uplot.series.slice(1); return s.some((x) => x.alpha < 1) && s.map((x) => x.alpha)", "a point picked out")
    assert alphas[1] == 1 and [a for i, a in enumerate(alphas) if i != 1] == [0.2] * (len(alphas) - 1)
    # onto the fourth point's line, most of the way along its last segment (to the metric's axis,
    # where every point has its own height)
    x, y = browser.execute_script(POINT_ON_LINE, made.points[3])
    actions = ActionBuilder(browser)
    actions.pointer_action.move_to_location(x, y)
    actions.perform()
    alphas = until(browser, "const s = window.sexpgpu.charts.sweep.uplot.series.slice(1); return s[3].alpha === 1 && s[0].alpha < 1 && s.map((x) => x.alpha)", "its curve picked out from the parallel view")
    assert alphas == [0.2, 0.2, 0.2, 1]


@needs_browser
def test_a_colour_means_one_thing_on_a_page(made: MadeStore, ui: str, browser: Any) -> None:
    open_page(browser, page_url(ui, "sweep", "grid", str(made.file)))
    curves = browser.execute_script("const u = window.sexpgpu.charts.sweep; return Object.fromEntries(u.series.map((s, i) => [s.name, u.uplot.series[i + 1].stroke()]))")
    lines = browser.execute_script("return Object.fromEntries([...document.querySelectorAll('svg.parallel polyline.pc-line')].map((l) => [l.dataset.slug, l.getAttribute('stroke')]))")
    assert set(curves) == set(made.points) and lines == curves  # a point's line has its curve's colour
    assert len(set(curves.values())) == len(curves)
    open_page(browser, page_url(ui, "run", made.slugs[0]))
    strokes = browser.execute_script("return Object.fromEntries(Object.entries(window.sexpgpu.charts).map(([k, c]) => [k, c.uplot.series.slice(1).map((s) => [s.label, s.stroke()])]))")
    by_label: dict[str, set[str]] = {}
    for series in strokes.values():
        for label, stroke in series:
            by_label.setdefault("val" if label == "val" else "train", set()).add(stroke)
    assert len(by_label["train"]) == 1 and len(by_label["val"]) == 1 and by_label["train"] != by_label["val"], strokes


@needs_browser
def test_values_read_as_values_not_json(made: MadeStore, ui: str, browser: Any) -> None:
    open_page(browser, page_url(ui, "run", made.slugs[0]))
    until(browser, "return document.querySelectorAll('table.kv td').length > 20", "the tables drawn")
    cells = browser.execute_script("return [...document.querySelectorAll('table.kv td')].filter((td) => !td.querySelector('table')).map((td) => td.textContent)")
    assert not [c for c in cells if c.startswith(("{", "[")) or '":' in c], cells
    versions = browser.execute_script("return [...document.querySelectorAll('table.kv th')].filter((th) => th.textContent === 'versions')[0].nextSibling.textContent")
    assert "python" in versions and "{" not in versions, versions


LOG_FILE = TINY.replace("(defsweep grid", "(defsweep search :sample 3 :seed 0 :lr (log-uniform 0.001 0.9))\n(defsweep grid").replace("(defknob steps 40)", "(defknob steps 10)")


@needs_browser
def test_a_knob_drawn_from_a_log_uniform_is_on_a_log_axis(browser: Any, tmp_path: Path, shots: Path) -> None:
    path = write_file(tmp_path / "project", text=LOG_FILE)
    root = tmp_path / "runs"
    assert quietly("sweep", str(path), "--sweep", "search", "--store", str(root)) == 0
    store = Store.open(str(root))
    lrs = [RunFolder(store, s).read_run_info().knobs["lr"] for s in store.folders()]
    assert max(lrs) >= 10 * min(lrs), lrs  # the three draws span a decade
    with serving(str(root)) as ui:
        open_page(browser, page_url(ui, "sweep", "search"))
        scales = browser.execute_script("return Object.fromEntries([...document.querySelectorAll('svg.parallel > text[data-scale]')].map((t) => [t.textContent, t.dataset.scale]))")
        assert scales == {"lr (log)": "log", "val/loss": "linear"}, scales
        ys = browser.execute_script("return Object.fromEntries([...document.querySelectorAll('svg.parallel polyline')].map((l) => [l.dataset.slug, Number(l.getAttribute('points').split(' ')[0].split(',')[1])]))")
        screenshot(browser, shots, "sweep-log")
    import math

    by_lr = sorted((RunFolder(store, s).read_run_info().knobs["lr"], y) for s, y in ys.items())
    (lo, y_lo), (mid, y_mid), (hi, y_hi) = by_lr
    share = (y_lo - y_mid) / (y_lo - y_hi)  # how far up the axis the middle draw is
    assert share == pytest.approx((math.log(mid) - math.log(lo)) / (math.log(hi) - math.log(lo)), abs=0.02)


@needs_browser
def test_every_page_names_its_store_and_the_site_has_an_icon(made: MadeStore, ui: str, browser: Any) -> None:
    for url in (ui, page_url(ui, "run", made.slugs[0]), page_url(ui, "sweep", "grid")):
        open_page(browser, url)
        assert until(browser, "return document.getElementById('where').textContent", "the store named") == f"store {made.root}"
        assert browser.execute_script("return document.querySelector('link[rel=icon]').href").endswith("/static/favicon.svg")
    for path in ("favicon.ico", "static/favicon.svg"):
        _, headers, body = get(ui + path)
        assert headers["Content-Type"] == "image/svg+xml" and body.startswith(b"<svg")


@needs_browser
def test_a_run_page_says_which_lines_of_its_events_it_skipped(made: MadeStore, browser: Any, tmp_path: Path) -> None:
    slug = made.slugs[0]
    shutil.copytree(made.root / slug, tmp_path / "runs" / slug)
    events = tmp_path / "runs" / slug / "events.jsonl"
    lines = len(events.read_bytes().splitlines())
    with open(events, "ab") as handle:
        handle.write(b"not an event\n")
    with serving(str(tmp_path / "runs")) as ui:
        open_page(browser, page_url(ui, "run", slug))
        said = until(browser, "const e = document.getElementById('skipped'); return !e.hidden && e.textContent", "the skipped line said")
    assert said.startswith("1 line(s) of the events skipped: ") and f"{events}:{lines + 1}: not JSON" in said, said


@needs_browser
def test_a_long_runs_page_draws_downsampled_curves_and_links_every_point(made: MadeStore, browser: Any, tmp_path: Path) -> None:
    from scale_store import SPIKE_EVERY, loss_at, write_long_run

    steps = 2 * SPIKE_EVERY + 10  # two spikes, and far more points than a chart's 1,000 spans
    slug = write_long_run(tmp_path / "runs", made.root / made.slugs[0], steps)
    with serving(str(tmp_path / "runs"), {"SEXPGPU_CACHE": str(tmp_path / "cache")}) as ui:  # its series are cached: not in the user's cache
        open_page(browser, page_url(ui, "run", slug))
        said = until(browser, "const e = document.getElementById('downsampled'); return !e.hidden && e.textContent", "the downsampling said")
        assert f"of {steps:,} points" in said and "loss " in said, said
        drawn = browser.execute_script("const u = window.sexpgpu.charts['metric:loss'].uplot; return [u.data[0], u.data[1]];")
        assert len(drawn[0]) <= 5 * 1000
        shown = dict(zip(drawn[0], drawn[1]))
        assert shown[SPIKE_EVERY] == loss_at(SPIKE_EVERY) and shown[2 * SPIKE_EVERY] == loss_at(2 * SPIKE_EVERY)
        href = browser.execute_script("return document.querySelector('#downsampled a[data-full=\"loss\"]').href")
        with urllib.request.urlopen(href, timeout=120) as response:
            (every,) = json.loads(response.read())["series"]
    assert every["steps"] == list(range(1, steps + 1)) and every["points"] is None
