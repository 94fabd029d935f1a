"""Sweep schedulers (sexpgpu/sweeps/schedulers.py): ASHA and the median stopping rule decide
each point as it reaches a rung, from the decisions the store holds; a point that goes on
keeps its worker; a sweep killed and run again decides alike."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import REPO, recorded_reads, wait_for
from sexpgpu.ir.experiment import Halving, Scheduler
from sexpgpu.runtime.events import read_events
from sexpgpu.runtime.store import Store
from sexpgpu.sweeps.schedulers import Asha, Decision, DecisionBook, MedianStopping, SyncHalving

SEARCH = REPO / "examples" / "search.lisp"
PREFIX = "sweeps/search.search"


def plan(scheduler: Scheduler, keep: float = 0.5) -> Halving:
    return Halving(metric="val/loss", mode="min", rungs=[10, 30], keep=keep, keep_text=f"{keep:g}", scheduler=scheduler)


def book(name: str) -> DecisionBook:
    return DecisionBook(Store.open(f"memory://schedulers-{name}"), PREFIX)


# -- the rules, on a store ---------------------------------------------------------------------------


def test_asha_decides_each_point_among_those_decided_at_the_rung_before_it() -> None:
    asha = Asha(plan("asha"), book("asha"), {})
    assert asha.on_result(0, 5, 0.9) == "continue"  # not a rung: nothing to decide
    assert asha.on_result(0, 10, 0.5) == "continue"  # alone at the rung: the best 1 of 1
    assert asha.on_result(1, 10, 0.7) == "stop"  # floor(2 / 2) = 1: point 0 is better
    assert asha.on_result(2, 10, 0.3) == "continue"  # the best of 3
    assert asha.on_result(3, 10, float("nan")) == "stop"  # not finite ranks last
    assert asha.on_result(4, 10, 0.4) == "continue"  # among the best 2 of 5
    assert asha.on_result(0, 30, 0.2) == "continue"  # no barrier: rung 2 decides while rung 1 still fills
    stored = asha.book.get(1, 1)
    assert stored is not None and stored.among == [0, 1] and stored.value == 0.7
    assert stored.reason.startswith("pruned at rung 1 (step 10): val/loss 0.7 is not among the best 1 of 2 (min, keep 0.5, the last kept 0.5)")
    # the store's decision is the decision: asked again (a restart), with another value, it stands
    again = Asha(plan("asha"), asha.book, {})
    assert again.on_result(1, 10, 0.01) == "stop" and again.on_start(1) == "stop" and again.on_start(0) == "continue"
    assert sorted(again.pruned()) == [1, 3]


def test_a_worker_that_keeps_what_it_read_reads_each_decision_once_and_decides_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """40 points decided at a rung one after another, as a worker trains them, each through a
    scheduler of its own (one per attempt) sharing what the worker read: each decision is
    read once (was every earlier one at each decision: 780 reads), and every decision is what
    a scheduler reading them all decides."""
    values = [((7 * i) % 40) / 40 for i in range(40)]
    fresh = Asha(plan("asha"), book("asha-fresh"), {})
    expected = [fresh.on_result(p, 10, v) for p, v in enumerate(values)]
    store = Store.open("memory://schedulers-asha-seen")
    reads = recorded_reads(monkeypatch)
    seen: dict[str, Decision] = {}
    got = [Asha(plan("asha"), DecisionBook(store, PREFIX, seen), {}).on_result(p, 10, v) for p, v in enumerate(values)]
    assert got == expected and expected.count("stop") > 10
    earlier = [r for r in reads if r.startswith(f"{PREFIX}/decisions/rung-1/")]
    assert len(earlier) == 2 * 40 + 39, len(earlier)  # each point's own: looked for, then after the put; each earlier one once
    assert [d.model_dump() for d in DecisionBook(store, PREFIX).at_rung(1)] == [d.model_dump() for d in fresh.book.at_rung(1)]


def test_the_median_rule_stops_a_point_worse_than_the_median_of_the_others_at_the_rung() -> None:
    median = MedianStopping(plan("median"), book("median"), {})
    assert [median.on_result(p, 10, v) for p, v in enumerate([0.5, 0.9, 0.1])] == ["continue"] * 3  # fewer than 3 others: no median yet
    assert median.on_result(3, 10, 0.6) == "stop"  # the median of 0.5 0.9 0.1 is 0.5
    assert median.on_result(4, 10, 0.5) == "continue"  # at the median goes on
    assert median.on_result(5, 10, None) == "stop"
    stored = median.book.get(3, 1)
    assert stored is not None and stored.reason == ("pruned at rung 1 (step 10): val/loss 0.6 is worse than the median 0.5 of the 3 points "
                                                    "measured at the rung before it (min, median rule)")
    big = MedianStopping(replace(plan("median"), mode="max"), book("median-max"), {})
    assert [big.on_result(p, 10, v) for p, v in enumerate([0.5, 0.9, 0.1, 0.6, 0.4])] == ["continue"] * 4 + ["stop"]


def test_sync_halving_pauses_at_a_rung_until_the_rung_is_ranked() -> None:
    sync = SyncHalving(plan("sync"), book("sync"), {})
    assert sync.on_result(0, 10, 0.5) == "pause" and sync.on_result(0, 11, 0.5) == "continue"
    sync.book.put(Decision(scheduler="sync", point=0, slug="s", rung=1, step=10, value=0.5, action="continue", among=[0], reason=""))
    assert sync.on_result(0, 10, 0.5) == "continue"


# -- sweeps on this machine -------------------------------------------------------------------------------


def project(root: Path, scheduler: str, sample: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    text = SEARCH.read_text().replace(":sample 16", f":sample {sample}").replace(":keep 1/3))", f"{':keep 1/3 ' if scheduler != 'median' else ''}:scheduler :{scheduler}))")
    assert f":scheduler :{scheduler}" in text
    path = root / "search.lisp"
    path.write_text(text)
    return path


def sweep(path: Path, store: Path, *more: str) -> list[str]:
    return [sys.executable, "-m", "sexpgpu", "sweep", str(path), "--sweep", "search", "--store", str(store), "--json", *more]


def env() -> dict[str, str]:
    return {**os.environ, "NO_COLOR": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def swept(path: Path, store: Path, *more: str) -> dict[str, Any]:
    """The sweep's --json ledger (its stderr under "stderr")."""
    done = subprocess.run(sweep(path, store, *more), capture_output=True, text=True, env=env(), timeout=600)
    assert done.returncode == 0, done.stderr
    ledger: dict[str, Any] = json.loads(done.stdout)
    return {**ledger, "stderr": done.stderr}


def decisions(store: Path) -> list[dict[str, Any]]:
    return [d.model_dump() for d in DecisionBook(Store.open(str(store)), PREFIX).every(2)]


def attempts_of(store: Path, slug: str) -> list[dict[str, Any]]:
    """The run's run.start and resume events: one per attempt that trained."""
    return [e for e in read_events(Store.open(str(store)), slug) if e.get("kind") in ("run.start", "resume")]


@pytest.fixture(scope="module")
def asha_serial(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, dict[str, Any]]]:
    """An 8-point ASHA sweep, one point at a time (so the order points reach a rung is fixed)."""
    root = tmp_path_factory.mktemp("asha")
    path = project(root, "asha", 8)
    yield path, root / "runs", swept(path, root / "runs", "--jobs", "1")


def test_an_asha_sweep_prunes_each_point_where_it_stood_when_it_reached_the_rung(asha_serial: tuple[Path, Path, dict[str, Any]]) -> None:
    _, store, ledger = asha_serial
    points = {p["point"]: p for p in ledger["points"]}
    made = decisions(store)
    assert [d["point"] for d in made if d["rung"] == 1] == list(range(8))  # every point decided at rung 1
    for d in made:  # one at a time: each decided among the points before it that reached the rung
        assert d["scheduler"] == "asha" and d["among"] == sorted(e["point"] for e in made if e["rung"] == d["rung"] and e["point"] <= d["point"])
        p = points[d["point"]]
        if d["action"] == "stop":
            assert p["state"] == "pruned" and p["reason"] == d["reason"] and p["steps"] == d["step"]
            assert f"point {p['point']}: pruned  {d['step']}/{d['step']} steps" in ledger["stderr"]  # its last line says so as it ends
    assert points[0]["state"] == "finished" and points[0]["steps"] == 450  # the first is alone at every rung
    assert {p["state"] for p in points.values()} == {"finished", "pruned"}
    status = json.loads((store / points[1]["slug"] / "status.json").read_text())
    assert status["state"] == "pruned" and status["summary"]["reason"] == points[1]["reason"] if points[1]["state"] == "pruned" else True


def test_a_killed_asha_sweep_run_again_decides_alike(asha_serial: tuple[Path, Path, dict[str, Any]], tmp_path: Path) -> None:
    path, reference_store, reference = asha_serial
    store = tmp_path / "runs"
    book = DecisionBook(Store.open(str(store)), PREFIX)
    proc = subprocess.Popen(sweep(path, store, "--jobs", "1"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env())
    try:  # killed outright once point 3 is decided at rung 1 (point 3 then trains on, or stops)
        wait_for(lambda: proc.poll() is not None or book.get(3, 1) is not None, "point 3 decided at rung 1")
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    again = swept(path, store, "--jobs", "1")
    assert decisions(store) == decisions(reference_store)
    assert [(p["point"], p["slug"], p["state"], p["steps"], p["reason"]) for p in again["points"]] == [
        (p["point"], p["slug"], p["state"], p["steps"], p["reason"]) for p in reference["points"]]


def test_a_point_killed_after_its_checkpoint_at_the_rung_but_before_its_status_stays_pruned(asha_serial: tuple[Path, Path, dict[str, Any]],
                                                                                               tmp_path: Path) -> None:
    """The end of a pruned attempt publishes the checkpoint at the rung, then the status: a
    kill between the two leaves a status short of the rung and a checkpoint at it. The
    sweep run again resumes there, and the stored decision stops the point at once."""
    path, reference_store, reference = asha_serial
    store = tmp_path / "runs"
    shutil.copytree(reference_store, store)
    pruned = next(p for p in reference["points"] if p["state"] == "pruned")
    status_file = store / pruned["slug"] / "status.json"
    status = json.loads(status_file.read_text())
    status.update(state="running", step=pruned["steps"] - 10, summary=None)
    status_file.write_text(json.dumps(status))
    again = swept(path, store, "--jobs", "1")
    assert decisions(store) == decisions(reference_store)
    point = next(p for p in again["points"] if p["point"] == pruned["point"])
    assert (point["state"], point["steps"], point["reason"]) == ("pruned", pruned["steps"], pruned["reason"])
    assert json.loads(status_file.read_text())["state"] == "pruned"


def test_under_jobs_a_point_that_goes_on_keeps_its_worker_and_no_rung_waits(tmp_path: Path) -> None:
    path = project(tmp_path, "asha", 8)
    store = tmp_path / "runs"
    ledger = swept(path, store, "--jobs", "2")
    made = decisions(store)
    first = [d for d in made if d["rung"] == 1]
    assert len(first) == 8
    for p in ledger["points"]:
        assert p["attempts"] == 1 and len(attempts_of(store, p["slug"])) == 1  # one attempt trained it, past every rung it passed
        if p["state"] == "finished":
            assert p["steps"] == 450
    # no barrier: a point evaluated at rung 2 before the last point had evaluated at rung 1
    at_second = min(t for p in ledger["points"] for t in eval_times(store, p["slug"], 150))
    at_first = max(t for p in ledger["points"] for t in eval_times(store, p["slug"], 50))
    assert at_second < at_first, (at_second, at_first)


def eval_times(store: Path, slug: str, step: int) -> list[str]:
    return [e["t"] for e in read_events(Store.open(str(store)), slug) if e.get("kind") == "eval" and e.get("step") == step]


def test_a_median_sweep_stops_the_points_worse_than_the_median(tmp_path: Path) -> None:
    path = project(tmp_path, "median", 8)
    store = tmp_path / "runs"
    ledger = swept(path, store, "--jobs", "1")
    made = decisions(store)
    points = {p["point"]: p for p in ledger["points"]}
    assert [d["point"] for d in made if d["rung"] == 1] == list(range(8))
    assert all(d["action"] == "continue" for d in made if d["rung"] == 1 and d["point"] < 3)  # fewer than 3 before them
    for d in made:
        if d["action"] == "stop":
            assert points[d["point"]]["state"] == "pruned" and "median rule" in d["reason"]
    assert any(d["action"] == "stop" for d in made) and any(p["state"] == "finished" for p in points.values())


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_over_ray_each_worker_asks_the_scheduler_at_its_rungs(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    path = project(tmp_path, "asha", 8)
    store = tmp_path / "runs"
    ray_env = {**env(), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run(sweep(path, store, "--ray"), capture_output=True, text=True, env=ray_env, timeout=900)
    assert done.returncode == 0, done.stderr
    ledger = json.loads(done.stdout)
    made = decisions(store)
    assert sorted(d["point"] for d in made if d["rung"] == 1) == list(range(8))
    stops = {d["point"]: d for d in made if d["action"] == "stop"}
    assert stops and all(d["scheduler"] == "asha" for d in made)
    stored = json.loads((store / "sweeps" / "search.search" / "sweep.json").read_text())
    for p, kept in zip(ledger["points"], stored["points"], strict=True):
        assert p["attempts"] == 1 and len(attempts_of(store, p["slug"])) == 1  # one attempt, past every rung it passed
        status = json.loads((store / p["slug"] / "status.json").read_text())
        if p["point"] in stops:
            assert p["state"] == kept["state"] == status["state"] == "pruned" and p["steps"] == stops[p["point"]]["step"]
            assert p["reason"] == stops[p["point"]]["reason"]
        else:
            assert p["state"] == status["state"] == "finished" and p["steps"] == 450
