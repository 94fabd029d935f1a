"""The dashboard and `plot` at scale: a run of 1,000,000 logged steps opens in the real
`sexpgpu ui` within 200 MB (the server's own peak, from /proc) and is drawn from its
downsampled series, which keep each bucket's lowest and highest point, with every point
served on request; `plot` of it stays small; a 5,000-run store's sweep page is paged and
reads a run's files again only when they changed; the readers kept are bounded.

The stores are written directly in the formats real runs write (tests/scale_store.py), from a
real run's files; a fresh server opens the long run, which no process read before, from the
series its writer logged in columns, without parsing a line. How long these take is measured by bench/dashboard_scale.py, not here."""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest

from conftest import REPO
import peak_memory
from results_store import TINY, quietly, write_file
from scale_store import EVAL_EVERY, SETTLED, SPIKE_EVERY, loss_at, write_long_run, write_sweep
from sexpgpu.dashboard.server import Dashboard
from sexpgpu.results.curves import CurveData, downsample
from sexpgpu.results.readers import RunReaders
from sexpgpu.runtime.events import EventLog, apply_resumes, read_events
from sexpgpu.runtime.store import Store
from test_dashboard import serving_process

pytestmark = pytest.mark.xdist_group("dashboard")

MILLION = 1_000_000
OPEN_LIMIT_MB = 200
PLOT_LIMIT_MB = 300  # matplotlib's own share is about 60 MB


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run's folder (run.json, status.json, events.jsonl)."""
    base = tmp_path_factory.mktemp("template")
    assert quietly("run", str(write_file(base / "project", text=TINY)), "--store", str(base / "runs"), "--quiet") == 0
    (folder,) = [p for p in (base / "runs").iterdir() if p.is_dir()]
    return folder


@pytest.fixture(scope="module")
def long_run(template: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("long") / "runs"
    return root, write_long_run(root, template, MILLION)


@pytest.fixture(scope="module")
def series_cache(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a child whose disk cache of parsed series is this module's own."""
    return {"SEXPGPU_CACHE": str(tmp_path_factory.mktemp("cache"))}


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=600) as response:
        return json.loads(response.read())


def peak_mb(pid: int) -> float:
    """The peak resident memory of the process PID (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


# -- downsampling -------------------------------------------------------------------------------


def test_downsampling_keeps_each_buckets_first_last_lowest_highest_and_first_gap_and_nothing_else() -> None:
    generator = np.random.default_rng(7)
    steps = np.cumsum(generator.integers(1, 4, size=50_000)).astype(np.int64)
    values = generator.normal(size=steps.size)
    values[generator.integers(0, steps.size, size=300)] = np.nan
    buckets = 700
    kept_steps, kept_values = downsample(steps, values, buckets)
    assert kept_steps.size <= 5 * buckets and np.all(np.diff(kept_steps) > 0)
    kept = dict(zip(kept_steps.tolist(), kept_values.tolist()))
    width = int(steps[-1] - steps[0] + 1)
    bucket = (steps - steps[0]) * buckets // width
    every: set[int] = set()
    for b in np.unique(bucket):
        inside = np.flatnonzero(bucket == b)
        span_steps, span_values = steps[inside], values[inside]
        finite = ~np.isnan(span_values)
        wanted = {int(span_steps[0]), int(span_steps[-1])}
        if finite.any():
            wanted |= {int(span_steps[finite][np.argmin(span_values[finite])]), int(span_steps[finite][np.argmax(span_values[finite])])}
        if not finite.all():
            wanted.add(int(span_steps[~finite][0]))
        assert wanted <= set(kept), (b, wanted - set(kept))
        every |= wanted
        if finite.any():
            shown = [v for s, v in kept.items() if span_steps[0] <= s <= span_steps[-1] and not math.isnan(v)]
            assert min(shown) == span_values[finite].min() and max(shown) == span_values[finite].max()
    assert set(kept) == every  # nothing else: a span keeps its first, last, lowest, highest and first gap


def test_a_short_series_is_shown_whole() -> None:
    steps, values = np.arange(1, 11, dtype=np.int64), np.linspace(0, 1, 10)
    data = CurveData()
    data.add([{"kind": "step", "step": int(s), "loss": float(v)} for s, v in zip(steps, values)])
    (series,) = data.curves(buckets=1000).series
    assert series.steps == steps.tolist() and series.points is None


# -- the curves read as they come ---------------------------------------------------------------


def reference(events: list[dict[str, Any]]) -> dict[str, tuple[list[int], list[Optional[float]]]]:
    """The series loss, acc and val/loss of EVENTS, resumes applied first (read_events' way)."""
    found: dict[str, tuple[list[int], list[Optional[float]]]] = {}
    for event in apply_resumes(events):
        pairs = []
        if event["kind"] == "step":
            pairs = [("loss", event.get("loss", "absent")), ("acc", event.get("metrics", {}).get("acc", "absent"))]
        elif event["kind"] == "eval":
            pairs = [("val/loss", event["metrics"].get("loss", "absent"))]
        for name, value in pairs:
            if value == "absent":
                continue
            steps, values = found.setdefault(name, ([], []))
            steps.append(event["step"])
            values.append(value)
    return found


def test_the_curves_read_as_they_come_are_the_events_with_resumes_applied(tmp_path: Path) -> None:
    chance = random.Random(3)
    for trial in range(40):
        store = Store.open(str(tmp_path / f"store-{trial}"))
        events: list[dict[str, Any]] = []
        step = 0
        for _ in range(chance.randint(1, 80)):
            roll = chance.random()
            if roll < 0.08 and step:
                step = chance.randint(0, step)
                events.append({"kind": "resume", "step": step, "from_step": step, "checkpoint": None})
            elif roll < 0.2:
                events.append({"kind": "eval", "step": step, "name": "val", "metrics": {"loss": chance.random()}})
            else:
                step += chance.randint(1, 3)
                event: dict[str, Any] = {"kind": "step", "step": step}
                if chance.random() < 0.9:
                    event["loss"] = chance.choice([None, chance.random()])
                if chance.random() < 0.5:
                    event["metrics"] = {"acc": chance.random()}
                events.append(event)
        readers = RunReaders(store)
        with EventLog(store, "r", flush_every=7) as log:
            for index, event in enumerate(events):
                log.emit(event)
                if index % 11 == 0:
                    log.flush()
                    readers.curves("r")  # read part of the way: the rest comes incrementally
        curves = readers.curves("r")
        wanted = reference(read_events(store, "r", superseded=True))
        assert {s.name: (s.steps, s.values) for s in curves.series} == wanted, events


def test_at_most_capacity_runs_are_kept_and_a_dropped_one_reads_again(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path / "runs"))
    for n in range(5):
        with EventLog(store, f"r{n}") as log:
            for step in range(1, 4):
                log.emit({"kind": "step", "step": step, "loss": n + step / 10})
    readers = RunReaders(store, capacity=3)
    for n in range(5):
        assert readers.curves(f"r{n}").named("loss") is not None
    assert len(readers) == 3
    loss = readers.curves("r0").named("loss")
    assert loss is not None and loss.values == [0.1, 0.2, 0.3]


# -- a million steps ----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_million_step_run_opens_within_200_mb_downsampled_and_every_point_is_served_on_request(
        long_run: tuple[Path, str], series_cache: dict[str, str]) -> None:
    root, slug = long_run
    with serving_process(str(root), series_cache) as (url, process):
        curves = get(f"{url}api/run/{slug}/curves")
        opened_mb = peak_mb(process.pid)
        loss = next(s for s in curves["series"] if s["name"] == "loss")
        assert loss["points"] == MILLION and len(loss["steps"]) <= 5 * 1000
        shown = dict(zip(loss["steps"], loss["values"]))
        for spike in range(SPIKE_EVERY, MILLION, SPIKE_EVERY):  # each bucket's highest and lowest point is drawn
            assert shown[spike] == loss_at(spike) and shown[spike + 1] == loss_at(spike + 1)
        assert curves["last_step"] == MILLION
        assert opened_mb < OPEN_LIMIT_MB, f"the server peaked at {opened_mb:.0f} MiB opening {MILLION:,} steps"
        events = get(f"{url}api/run/{slug}/events")
        assert events["step_events"] == MILLION and sum(e["kind"] == "step" for e in events["events"]) == 1000
        assert sum(e["kind"] == "checkpoint" for e in events["events"]) == MILLION // 10_000
        full = get(f"{url}api/run/{slug}/curves?points=all&series=loss")
        (every,) = full["series"]
        assert every["points"] is None and every["steps"] == list(range(1, MILLION + 1))
        assert every["values"] == [loss_at(step) for step in range(1, MILLION + 1)]


@pytest.mark.slow
def test_plot_of_a_million_step_run_stays_small_and_draws_a_few_thousand_points(long_run: tuple[Path, str], tmp_path: Path,
                                                                               series_cache: dict[str, str]) -> None:
    root, slug = long_run
    out = tmp_path / "long.svg"
    done = subprocess.run([sys.executable, "-c", peak_memory.MEASURED_CLI, "plot", str(root / slug), "-o", str(out)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO), **series_cache})
    assert done.returncode == 0, done.stderr
    peak = peak_memory.peak_kb(done.stderr)  # this child's own peak (VmHWM), not its parent's
    assert peak / 1024 < PLOT_LIMIT_MB, f"plot peaked at {peak / 1024:.0f} MiB"
    svg = out.read_text()
    line = svg.split('id="series-0-0"', 1)[1].split("</g>", 1)[0]
    vertices = len(re.findall(r"\sL ", line)) + 1  # matplotlib's path: M x y, then a line of L x y each (simplified further)
    assert 2 <= vertices <= 5 * 2000, vertices


def scramble_lines(path: Path, keep: int = 4096) -> None:
    """Every byte of PATH but its newlines and its first and last KEEP bytes made `#`: a
    reader that parses its lines finds none of them an event."""
    data = np.fromfile(path, dtype=np.uint8)
    middle = data[keep:-keep]
    middle[middle != ord("\n")] = ord("#")
    data.tofile(path)


@pytest.mark.slow
def test_a_fresh_process_opens_a_cached_million_step_run_within_200_mb_without_parsing_its_lines(
        long_run: tuple[Path, str], tmp_path: Path) -> None:
    root, slug = long_run
    copy = tmp_path / "runs"
    shutil.copytree(root / slug, copy / slug)
    (copy / slug / "series.jsonl").unlink()  # an older version's run: its first read parses its lines
    cache = {"SEXPGPU_CACHE": str(tmp_path / "cache")}
    with serving_process(str(copy), cache) as (url, _):
        parsed = get(f"{url}api/run/{slug}/curves")  # the first open parses every line, and caches them
    scramble_lines(copy / slug / "events.jsonl")
    with serving_process(str(copy), cache) as (url, process):
        cached = get(f"{url}api/run/{slug}/curves")
        opened_mb = peak_mb(process.pid)
        assert cached == parsed and not cached["warnings"]  # had it parsed a line, every line would be a warning
        assert opened_mb < OPEN_LIMIT_MB, f"the server peaked at {opened_mb:.0f} MiB opening {MILLION:,} cached steps"
        events = get(f"{url}api/run/{slug}/events")
        assert events["step_events"] == MILLION and sum(e["kind"] == "checkpoint" for e in events["events"]) == MILLION // 10_000
    done = subprocess.run([sys.executable, "-c", peak_memory.MEASURED_CLI, "plot", str(copy / slug), "-o", str(tmp_path / "long.svg")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO), **cache})
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    peak = peak_memory.peak_kb(done.stderr)
    assert peak / 1024 < PLOT_LIMIT_MB, f"plot peaked at {peak / 1024:.0f} MiB"


@pytest.mark.slow
def test_a_fresh_server_opens_a_million_step_run_no_process_read_before_from_its_columns_within_200_mb(
        long_run: tuple[Path, str], tmp_path: Path) -> None:
    root, slug = long_run
    copy = tmp_path / "runs"
    shutil.copytree(root / slug, copy / slug)
    scramble_lines(copy / slug / "events.jsonl")  # had it parsed a line, every line would be a warning
    with serving_process(str(copy), {"SEXPGPU_CACHE": str(tmp_path / "cache")}) as (url, process):
        curves = get(f"{url}api/run/{slug}/curves")
        opened_mb = peak_mb(process.pid)
        assert not curves["warnings"] and curves["last_step"] == MILLION and curves["events"] == MILLION + 2 * (MILLION // EVAL_EVERY) + 3
        loss = next(s for s in curves["series"] if s["name"] == "loss")
        shown = dict(zip(loss["steps"], loss["values"]))
        assert loss["points"] == MILLION and all(shown[s] == loss_at(s) for s in range(SPIKE_EVERY, MILLION, SPIKE_EVERY))
        assert opened_mb < OPEN_LIMIT_MB, f"the server peaked at {opened_mb:.0f} MiB opening {MILLION:,} steps from their columns"
        (every,) = get(f"{url}api/run/{slug}/curves?points=all&series=loss")["series"]
        assert every["values"] == [loss_at(step) for step in range(1, MILLION + 1)]
        events = get(f"{url}api/run/{slug}/events")
        assert events["step_events"] == MILLION and [e["step"] for e in events["events"] if e["kind"] == "step"] == list(range(MILLION - 999, MILLION + 1))


# -- a sweep of 5,000 points --------------------------------------------------------------------


def test_a_5000_point_sweep_is_paged_and_its_files_are_read_again_only_when_they_change(template: Path, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    slugs = write_sweep(root, template, 5000)  # dated long ago: every file has settled
    board = Dashboard(Store.open(str(root)))
    first = json.loads(board.sweep("grid", page=2))
    assert first["pages"] == 100 and len(first["points"]) == 5000 and first["shown"] == slugs[50:100]
    assert set(first["curves"]) == set(slugs[50:100]) and board.records.reads == 5000
    assert len(board.readers) == 50  # the events of the points shown, no others
    again = json.loads(board.sweep("grid", page=2))
    assert board.records.reads == 5000 and again["points"] == first["points"]
    status = root / slugs[7] / "status.json"
    changed = json.loads(status.read_text())
    changed["step"] = 39
    status.write_text(json.dumps(changed))
    os.utime(status, (SETTLED + 60, SETTLED + 60))
    third = json.loads(board.sweep("grid", page=1))
    assert board.records.reads == 5001 and third["points"][7]["step"] == 39
    assert json.loads(board.sweep("grid", page=1000))["page"] == 100  # past the end: the last page


SWEEP_LIMIT_MB = 150


@pytest.mark.slow
def test_a_5000_point_sweep_page_is_served_within_150_mb(template: Path, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    slugs = write_sweep(root, template, 5000)
    with serving_process(str(root), {"SEXPGPU_CACHE": str(tmp_path / "cache")}) as (url, process):
        first = get(f"{url}api/sweep/grid")
        again = get(f"{url}api/sweep/grid")
        peak = peak_mb(process.pid)
    assert [p["slug"] for p in first["points"]] == slugs and first["shown"] == slugs[:50] and again == first
    assert peak < SWEEP_LIMIT_MB, f"the server peaked at {peak:.0f} MiB serving a 5,000-point sweep page"
