"""Sweeps that search (sampled points, successive halving) and eval metrics wherever a run
is summed up: the progress line, the last line, the target's line, status, the sweep table
and sweep --json."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import REPO, wait_for
from sexpgpu.cli.main import main
from sexpgpu.compile.selection import prescan
from sexpgpu.ir.experiment import Halving
from sexpgpu.sweeps.halving import decide

SEARCH = REPO / "examples" / "search.lisp"


def cli(*args: str, cwd: Path | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), contextlib.chdir(cwd or Path.cwd()):
        try:
            code = main(list(args))
        except SystemExit as stop:  # a usage or check failure before the verb ran
            code = int(stop.code or 0)
    return code, out.getvalue(), err.getvalue()


def project(root: Path, text: str, name: str = "search.lisp") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / ".git").mkdir(exist_ok=True)
    path = root / name
    path.write_text(text)
    return path


def statuses(store: Path) -> dict[int, dict[str, Any]]:
    """Each point's status.json, by point index (from its slug)."""
    found = {}
    for path in store.glob("*/status.json"):
        point = int(path.parent.name.split(".")[-2].rsplit("-", 1)[1])
        found[point] = json.loads(path.read_text())
    return found


# -- sampled points ----------------------------------------------------------------------------


def sweep_text(head: str) -> str:
    return SEARCH.read_text().replace(SEARCH.read_text()[SEARCH.read_text().index("(defsweep"):SEARCH.read_text().index("(defloader")], head + "\n\n")


def test_sampled_points_are_drawn_from_the_seed_point_by_point(tmp_path: Path) -> None:
    sixteen = prescan(project(tmp_path / "a", sweep_text("(defsweep s :sample 16 :seed 3 :lr (log-uniform 1e-4 1e-2) :width (choice 64 128 256))"))).sweeps["s"].points()
    thirty_two = prescan(project(tmp_path / "b", sweep_text("(defsweep s :sample 32 :seed 3 :lr (log-uniform 1e-4 1e-2) :width (choice 64 128 256))"))).sweeps["s"].points()
    assert len(sixteen) == 16 and thirty_two[:16] == sixteen  # point N is the same point whatever :sample says
    with_more = prescan(project(tmp_path / "c", sweep_text(
        "(defsweep s :sample 16 :seed 3 :lr (log-uniform 1e-4 1e-2) :width (choice 64 128 256) :depth (int-uniform 1 4))"))).sweeps["s"].points()
    assert [{k: p[k] for k in ("lr", "width")} for p in with_more] == sixteen  # another knob changes no other knob's draws
    other_seed = prescan(project(tmp_path / "d", sweep_text("(defsweep s :sample 16 :seed 4 :lr (log-uniform 1e-4 1e-2) :width (choice 64 128 256))"))).sweeps["s"].points()
    assert other_seed != sixteen
    for p in thirty_two:
        assert 1e-4 <= p["lr"] <= 1e-2 and p["lr"] == float(f"{p['lr']:.4g}") and p["width"] in (64, 128, 256)
    assert {p["width"] for p in thirty_two} == {64, 128, 256}
    assert all(type(p["depth"]) is int and 1 <= p["depth"] <= 4 for p in with_more) and {p["depth"] for p in with_more} == {1, 2, 3, 4}
    logs = sorted(math.log10(p["lr"]) for p in thirty_two)  # log-uniform: as many below 1e-3 as above, roughly
    assert logs[0] < -3.5 and logs[-1] > -2.5


@pytest.mark.parametrize("head, message", [
    ("(defsweep s :lr (log-uniform 1e-4 1e-2))", "defsweep s: :lr needs a list of values, got ['log-uniform', 0.0001, 0.01] (a distribution such as (log-uniform ...) needs :sample N)"),
    ("(defsweep s :sample 4 :lr (log-uniform 0 1e-2))", "defsweep s: :lr ['log-uniform', 0, 0.01]: expected (log-uniform LOW HIGH): a float whose logarithm is uniform, 0 < LOW < HIGH"),
    ("(defsweep s :sample 4 :depth (int-uniform 0 100000000000000000000))",
     "defsweep s: :depth ['int-uniform', 0, 100000000000000000000]: expected (int-uniform LOW HIGH): an integer from LOW to HIGH, both included (64-bit integers)"),
    ("(defsweep s :sample 0 :lr (uniform 0 1))", "defsweep s: :sample needs a positive number of points, got 0"),
    ("(defsweep s :sample 4 :zip t :lr (uniform 0 1))", "defsweep s: :zip and :sample do not go together"),
    ("(defsweep s :sample 4 :lr (uniform 0 1) :halving (:metric val/loss :mode :min :rungs (50 150) :keep 3))", "defsweep s :halving :keep needs a fraction between 0 and 1, such as 1/3"),
    ("(defsweep s :sample 4 :lr (uniform 0 1) :halving (:metric loss :mode :min :rungs (50) :keep 1/2))", "defsweep s :halving :metric needs an eval's metric as EVAL/METRIC, such as val/loss"),
    ("(defsweep s :sample 4 :lr (uniform 0 1) :halving (:metric val/loss :mode :min :rungs (150 50) :keep 1/2))", "defsweep s :halving :rungs needs increasing positive step counts, such as (100 300 900)"),
    ("(defsweep s :sample 4 :lr (uniform 0 1) :halving (:metric val/los :mode :min :rungs (50) :keep 1/2))", "defsweep s :halving :metric val/los: eval val measures loss, acc, not los"),
    ("(defsweep s :sample 4 :lr (uniform 0 1) :halving (:metric val/loss :mode :min :rungs (50 450) :keep 1/2))", "defsweep s :halving :rungs: rung 450 is not before the run's last step (450)"),
    ("(defsweep s :sample 4 :lr (uniform 0 1) :halving (:metric val/loss :mode :min :rungs (50) :keep 1/2 :scheduler :hyperband))",
     "defsweep s :halving :scheduler needs :sync (every point to each rung, then the best go on), :asha (each point decided as it reaches a rung) or :median (the median stopping rule)"),
    ("(defsweep s :sample 4 :lr (uniform 0 1) :halving (:metric val/loss :mode :min :rungs (50) :keep 1/2 :scheduler :median))",
     "defsweep s :halving :keep: the median rule keeps what is at least as good as the median; remove :keep, or use :scheduler :sync or :asha"),
    ("(defsweep s :sample 4 :lr (uniform 0 1) :halving (:metric val/loss :mode :min :rungs (50) :keep 1/2 :grace 10))",
     "defsweep s :halving: unknown option :grace (options: :metric :mode :rungs :keep :scheduler)"),
])
def test_a_wrong_search_is_a_check_failure_at_its_defsweep(tmp_path: Path, head: str, message: str) -> None:
    path = project(tmp_path, sweep_text(head))
    code, _, err = cli("sweep", str(path), "--sweep", "s", "--store", str(tmp_path / "runs"))
    assert code == 3, err
    line = path.read_text().splitlines().index(head) + 1
    assert f"{path}:{line}:1: error[C008]: {message}" in err, err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # nothing ran
    code, _, err = cli("check", str(path))  # check finds it too, without being asked for the sweep
    assert code == 3 and f"{path}:{line}:1: error[C008]: {message}" in err, err


# -- halving, decided -----------------------------------------------------------------------------


def test_each_rung_keeps_the_best_fraction_ties_to_the_lower_point_and_unmeasured_last() -> None:
    plan = Halving(metric="val/loss", mode="min", rungs=[10], keep=1 / 3, keep_text="1/3")
    decision = decide(plan, 1, 10, {0: 0.5, 1: 0.2, 2: None, 3: float("nan"), 4: 0.2, 5: 0.9, 6: 0.1})
    assert [p for p, _ in decision.ranked] == [6, 1, 4, 0, 5, 2, 3]
    assert decision.kept == [1, 6]  # floor(7 / 3) = 2: points 6 and 1 (1 beats 4 on the tie)
    assert decision.reason(plan, 4) == "pruned at rung 1 (step 10): val/loss 0.2 is not among the best 2 of 7 (min, keep 1/3, the last kept 0.2)"
    assert decision.reason(plan, 2).startswith("pruned at rung 1 (step 10): val/loss never measured")
    assert decide(replace(plan, mode="max"), 1, 10, {0: 0.5, 1: 0.2, 2: 0.7}).kept == [2]  # at least one is kept
    assert decide(plan, 1, 10, {0: 0.5}).kept == [0]


# -- a halving sweep on this machine ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, dict[str, Any]]]:
    """examples/search.lisp's 16-point search, run through: its project, store and --json."""
    root = tmp_path_factory.mktemp("search")
    path = project(root, SEARCH.read_text())
    store = root / "runs"
    code, out, err = cli("sweep", str(path), "--sweep", "search", "--store", str(store), "--json")
    assert code == 0, err
    yield path, store, json.loads(out)


def test_a_halving_sweep_prunes_at_each_rung_and_trains_the_best_to_the_end(searched: tuple[Path, Path, dict[str, Any]]) -> None:
    _, store, ledger = searched
    points = ledger["points"]
    assert len(points) == 16
    by_state: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        by_state.setdefault(p["state"], []).append(p)
    assert sorted(by_state) == ["finished", "pruned"]
    (winner,) = by_state["finished"]
    assert winner["steps"] == 450 and winner["evals"]["val"]["step"] == 450 and winner["reason"] == "finished"
    at_first = [p for p in by_state["pruned"] if p["reason"].startswith("pruned at rung 1 (step 50)")]
    at_second = [p for p in by_state["pruned"] if p["reason"].startswith("pruned at rung 2 (step 150)")]
    assert len(at_first) == 11 and len(at_second) == 4  # 16 -> floor(16/3) = 5 -> floor(5/3) = 1
    assert all(p["steps"] == 50 for p in at_first) and all(p["steps"] == 150 for p in at_second)
    # the rung's own numbers: every kept point's val/loss at step 50 beats every pruned one's
    first = {p["point"]: p for p in points}
    survivors = [p for p in points if p not in at_first]
    status = statuses(store)
    assert {i for i, s in status.items() if s["state"] == "pruned"} == {p["point"] for p in by_state["pruned"]}
    for p in at_first:
        assert status[p["point"]]["last_eval"]["val/loss"] >= max(value_at_rung(store, s["slug"], 50) for s in survivors)
    assert first[winner["point"]]["knobs"] == winner["knobs"]


def test_the_sync_scheduler_decides_as_the_halving_before_it_and_stores_each_decision(searched: tuple[Path, Path, dict[str, Any]]) -> None:
    """The :sync scheduler (the default) against what the code before the scheduler interface
    ran for the same sweep (tests/data/search_sync_before.json): the same points, slugs,
    pruning decisions and steps; and each decision as the store holds it."""
    from sexpgpu.runtime.store import Store
    from sexpgpu.sweeps.schedulers import DecisionBook

    _, store, ledger = searched
    before = json.loads((REPO / "tests" / "data" / "search_sync_before.json").read_text())["points"]
    now = [{"point": p["point"], "slug": p["slug"], "knobs": p["knobs"], "state": p["state"], "steps": p["steps"], "reason": p["reason"],
            "final_loss": float(f"{p['final_loss']:.4g}")} for p in ledger["points"]]
    assert now == before
    book = DecisionBook(Store.open(str(store)), "sweeps/search.search")
    first, second = book.at_rung(1), book.at_rung(2)
    assert [d.point for d in first] == list(range(16)) and len(second) == 5  # every point ranked at rung 1, the 5 kept at rung 2
    status = statuses(store)
    for d in [*first, *second]:
        assert d.scheduler == "sync" and d.slug == before[d.point]["slug"]
        assert d.value == value_at_rung(store, d.slug, d.step)
        assert (d.action == "stop") == (before[d.point]["reason"] == d.reason and status[d.point]["state"] == "pruned")
    assert sorted(d.point for d in [*first, *second] if d.action == "stop") == sorted(p["point"] for p in before if p["state"] == "pruned")


def value_at_rung(store: Path, slug: str, step: int) -> float:
    from sexpgpu.sweeps.halving import value_at
    from sexpgpu.runtime.store import Store

    value = value_at(Store.open(str(store)), slug, "val/loss", step)
    assert value is not None
    return value


def test_a_pruned_run_keeps_its_checkpoint_and_resumes(searched: tuple[Path, Path, dict[str, Any]], tmp_path: Path) -> None:
    path, store, ledger = searched
    pruned = next(p for p in ledger["points"] if p["state"] == "pruned" and p["steps"] == 50)
    copy = tmp_path / "runs"
    shutil.copytree(store / pruned["slug"], copy / pruned["slug"])
    code, out, err = cli("run", str(path), "--sweep", "search", "--point", str(pruned["point"]), "--store", str(copy), "--max-steps", "60", "--quiet")
    assert code == 0, err
    assert "resumed from step-000050 (step 50)" in out and "60 steps (10 in this attempt)" in out


def test_the_sweep_table_shows_eval_metrics_steps_and_what_ended_each_point(searched: tuple[Path, Path, dict[str, Any]]) -> None:
    path, store, ledger = searched
    code, out, err = cli("sweep", str(path), "--sweep", "search", "--store", str(store))  # nothing left to train: the same table
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split() == ["point", "knobs", "steps", "loss", "val/acc", "val/loss", "state", "ended", "by"]
    assert len(rows) == 16
    winner = next(p for p in ledger["points"] if p["state"] == "finished")
    row = rows[winner["point"]]
    assert "450/450" in row and f"{winner['evals']['val']['metrics']['acc']:.4g}" in row and row.rstrip().endswith("finished   steps")
    assert "attempt" not in err.lower() or "point 0 (1 of 16)" not in err  # nothing was trained again


def test_a_stopped_search_run_again_continues_and_decides_alike(searched: tuple[Path, Path, dict[str, Any]], tmp_path: Path) -> None:
    path, _, reference = searched
    store = tmp_path / "runs"
    env = {**os.environ, "NO_COLOR": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "sexpgpu", "sweep", str(path), "--sweep", "search", "--store", str(store)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    # stop it once rung 1 has been decided and the second stage is training
    wait_for(lambda: proc.poll() is not None or (store.exists() and any(s["state"] == "pruned" for s in statuses(store).values())), "a point pruned at rung 1")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 75, proc.stderr.read() if proc.stderr else ""
    code, out, err = cli("sweep", str(path), "--sweep", "search", "--store", str(store), "--json")
    assert code == 0, err
    again = json.loads(out)
    assert [(p["point"], p["state"], p["steps"], p["final_loss"]) for p in again["points"]] == [
        (p["point"], p["state"], p["steps"], p["final_loss"]) for p in reference["points"]]


# -- eval metrics wherever a run is summed up --------------------------------------------------------------------


CNN_TARGET = (REPO / "examples" / "cnn.lisp").read_text().replace("(defeval val :loader val :every 100)", "(defeval val :loader val :every 20)\n(deftarget val acc :>= 0.9)")


def cnn_project(root: Path, text: str) -> Path:
    path = project(root, text, "cnn.lisp")
    (root / "data").mkdir(exist_ok=True)
    shutil.copy(REPO / "examples" / "data" / "digits.npz", root / "data")
    return path


def test_the_target_line_says_the_value_that_met_it_and_when(tmp_path: Path) -> None:
    path = cnn_project(tmp_path, CNN_TARGET)
    code, out, err = cli("run", str(path), "--store", str(tmp_path / "runs"), "--json")
    assert code == 0, err
    outcome = json.loads(out)
    target = outcome["target"]
    assert target["metric"] == "val/acc" and target["test"] == ">=" and target["threshold"] == 0.9 and target["value"] >= 0.9
    assert outcome["reason"] == f"target reached: val/acc {target['value']:.4g} >= 0.9 at step {target['step']}"
    assert outcome["evals"]["val"] == {"step": target["step"], "metrics": {"loss": outcome["evals"]["val"]["metrics"]["loss"], "acc": target["value"]}}
    code, out, err = cli("run", str(path), "--store", str(tmp_path / "runs"))  # reached: nothing more to do
    assert code == 0 and "already finished" in out, (out, err)
    assert out.splitlines()[-1].endswith(f"eval val: loss {outcome['evals']['val']['metrics']['loss']:.4g} acc {target['value']:.4g} (step {target['step']})")
    code, out, err = cli("status", str(next((tmp_path / "runs").iterdir())))
    assert code == 0, err
    assert f"(step {target['step']})" in next(line for line in out.splitlines() if line.startswith("last eval"))
    assert f"summary    target reached: val/acc {target['value']:.4g} >= 0.9 at step {target['step']} (exit 0)" in out


def test_the_progress_and_last_lines_carry_the_latest_eval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sexpgpu.compile.pipeline import compile_file
    from sexpgpu.runtime.attempt import RunOptions, train

    path = cnn_project(tmp_path, (REPO / "examples" / "cnn.lisp").read_text().replace(":every 100", ":every 20").replace(":log-every 50", ":log-every 10"))
    experiment = compile_file(path).experiment
    assert experiment is not None
    outcome = train(experiment, RunOptions(store=str(tmp_path / "runs"), max_steps=40, progress=True, signals=False), say=lambda _: None)
    progress = capsys.readouterr().err.split("\r")
    at_30 = next(line for line in progress if line.startswith("step 30/40"))
    assert "eval val: loss " in at_30 and "(step 20)" in at_30 and "  acc " in at_30  # the training batch's acc, then the eval's
    assert outcome.evals["val"].step == 40


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_the_same_search_over_ray_prunes_the_same_points(searched: tuple[Path, Path, dict[str, Any]], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    path, _, reference = searched
    store = tmp_path / "runs"
    code, out, err = cli("sweep", str(path), "--sweep", "search", "--store", str(store), "--ray", "--json")
    assert code == 0, err
    over_ray = json.loads(out)
    assert [(p["point"], p["state"], p["steps"]) for p in over_ray["points"]] == [(p["point"], p["state"], p["steps"]) for p in reference["points"]]
    for ours, theirs in zip(over_ray["points"], reference["points"], strict=True):
        assert ours["final_loss"] == pytest.approx(theirs["final_loss"], rel=1e-5)
        assert ours["reason"].split(" (")[0] == theirs["reason"].split(" (")[0]
    ledger = json.loads((store / "sweeps" / "search.search" / "sweep.json").read_text())
    assert sum(p["state"] == "pruned" for p in ledger["points"]) == 15
    assert {i for i, s in statuses(store).items() if s["state"] == "pruned"} == {p["point"] for p in reference["points"] if p["state"] == "pruned"}


def test_the_sampled_draws_are_numpys_philox_draws_without_numpy() -> None:
    """A check draws a sampled sweep's points without importing NumPy (sweeps/philox.py), and
    every draw is the one numpy.random.Generator(Philox(key)) makes, which the points' slugs
    were made from: NumPy is the oracle, on random keys, ranges, bounds and long runs of draws."""
    import numpy as np

    from sexpgpu.sweeps.philox import PhiloxStream

    pick = random.Random(20261202)
    sizes = [1, 2, 3, 5, 7, 10, 100, 2**31 + 3, 2**32 - 1, 2**32, 2**32 + 1, 2**40 + 7, 2**62 + 5]
    for _ in range(1500):
        key = pick.getrandbits(128)
        ours, theirs = PhiloxStream(key), np.random.Generator(np.random.Philox(key=key))
        low, high = pick.uniform(-10, 10), pick.uniform(10, 1e3)
        assert ours.uniform(low, high) == theirs.uniform(low, high)
        size = pick.choice(sizes)
        assert ours.integers(size) == int(theirs.integers(size))
        start = pick.randint(-1000, 1000)
        assert ours.integers(start, start + size) == int(theirs.integers(start, start + size))
        assert ours.random() == theirs.random()  # the stream goes on past mixed 32- and 64-bit draws
    ours, theirs = PhiloxStream(77), np.random.Generator(np.random.Philox(key=77))
    assert [ours.integers(3) for _ in range(3000)] == theirs.integers(3, size=3000).tolist()  # rejections, blocks, carries
    with pytest.raises(ValueError, match="empty"):
        PhiloxStream(1).integers(0)
    with pytest.raises(ValueError, match="64-bit"):
        PhiloxStream(1).integers(0, 2**64)
