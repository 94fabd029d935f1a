"""`sweep --jobs N`: points side by side in child processes, with the results of the sweep
that runs them one at a time; a killed child's point resumes, SIGTERM stops every child
resumably."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, wait_for

from sexpgpu.cli.main import main
from sexpgpu.compile.pipeline import compile_file
from sexpgpu.ir.experiment import Selection
from sexpgpu.sweeps.jobs import WORTH_A_PROCESS_FLOPS, JobPlan, plan_jobs, training_flops
from sexpgpu.runtime.threads import plan_threads, process_cores

SWEEP = (REPO / "examples" / "sweep.lisp").read_text()
SEARCH = (REPO / "examples" / "search.lisp").read_text()
SMALL_SEARCH = (SEARCH.replace(":sample 16", ":sample 6").replace(":rungs (50 150) :keep 1/3", ":rungs (20) :keep 1/2")
                .replace("(defeval val :loader val :every 50)", "(defeval val :loader val :every 10)")
                .replace("(defrun :steps 450 :seed 0 :checkpoint (:every 150 :keep 2))", "(defrun :steps 40 :seed 0 :checkpoint (:every 20 :keep 2))"))
LONG = (SWEEP.replace("(defsweep lr :lr (0.025 0.05 0.1 0.2))", "(defsweep lr :lr (0.05 0.1))")
        .replace("(defrun :steps 300 :seed 0 :checkpoint (:every 100 :keep 2))", "(defrun :steps 1000 :seed 0 :checkpoint (:every 20 :keep 2))"))


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as stop:
            code = int(stop.code or 0)
    return code, out.getvalue(), err.getvalue()


def project(root: Path, text: str, name: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / ".git").mkdir(exist_ok=True)
    path = root / name
    path.write_text(text)
    return path


def ledger(out: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(out)
    doc.pop("updated")
    return doc


def parameters(store: Path) -> dict[str, bytes]:
    """Every checkpoint's parameters and optimizer state, by path in the store."""
    return {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.glob("*/checkpoints/*/*.safetensors"))}


def folder_of(store: Path, point: int) -> Path:
    found = [p for p in store.glob(f"*.lr-{point}.*") if p.is_dir()]
    assert len(found) == 1, found
    return found[0]


def state_of(store: Path, point: int) -> str | None:
    path = next(iter(store.glob(f"*.lr-{point}.*/status.json")), None)
    if path is None:
        return None
    try:
        return str(json.loads(path.read_text())["state"])
    except (ValueError, KeyError):  # being replaced as we read it
        return None


def sweep_process(path: Path, store: Path, *more: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "sexpgpu", "sweep", str(path), "--sweep", "lr", "--store", str(store), "--jobs", "2", *more],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "NO_COLOR": "1"})


@pytest.mark.parametrize("name,text,sweep,more", [
    ("sweep.lisp", SWEEP, "lr", ("--max-steps", "60")),
    ("search.lisp", SMALL_SEARCH, "search", ()),
], ids=["grid", "halving"])
def test_two_jobs_give_what_one_at_a_time_gives(tmp_path: Path, name: str, text: str, sweep: str, more: tuple[str, ...]) -> None:
    path = project(tmp_path, text, name)
    results = {}
    for jobs in ("1", "2"):
        store = tmp_path / f"runs-{jobs}"
        code, out, err = cli("sweep", str(path), "--sweep", sweep, "--store", str(store), "--jobs", jobs, "--json", *more)
        assert code == 0, err
        results[jobs] = (ledger(out), parameters(store), err)
    (one, one_params, one_err), (two, two_params, two_err) = results["1"], results["2"]
    assert two == one
    assert one_params and two_params == one_params  # bit for bit
    if sweep == "search":
        assert any(p["state"] == "pruned" for p in two["points"])
    # the lines come in point order, as one at a time prints them
    heads = [line.split(":")[0] for line in two_err.splitlines() if line.startswith("point ") and " of " in line]
    assert heads == [line.split(":")[0] for line in one_err.splitlines() if line.startswith("point ") and " of " in line]


def test_the_table_is_the_same_with_two_jobs(tmp_path: Path) -> None:
    path = project(tmp_path, SWEEP, "sweep.lisp")
    tables = [cli("sweep", str(path), "--sweep", "lr", "--store", str(tmp_path / f"runs-{jobs}"), "--jobs", jobs, "--max-steps", "30")
              for jobs in ("1", "2")]
    assert [t[0] for t in tables] == [0, 0]
    assert tables[1][1] == tables[0][1]


def test_a_killed_childs_point_resumes_on_the_next_sweep(tmp_path: Path) -> None:
    path = project(tmp_path, LONG, "sweep.lisp")
    store = tmp_path / "runs"
    proc = sweep_process(path, store)
    lease = lambda: next(iter(store.glob("*.lr-0.*/lease.json")), None)  # noqa: E731
    wait_for(lambda: proc.poll() is not None or (lease() is not None and any(store.glob("*.lr-0.*/checkpoints/LATEST"))), "point 0's first checkpoint")
    holder = json.loads(lease().read_text())  # type: ignore[union-attr]
    assert holder["pid"] != proc.pid  # a child of the sweep writes it
    os.kill(holder["pid"], signal.SIGKILL)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 75, err  # the point is not done: the same command again continues it
    assert "point 0: stopped" in err and "before its attempt did" in err, err
    assert state_of(store, 1) == "finished"  # the other point went on
    code, out, err = cli("sweep", str(path), "--sweep", "lr", "--store", str(store), "--jobs", "2", "--json")
    assert code == 0, err
    points = json.loads(out)["points"]
    assert [(p["state"], p["steps"], p["attempts"]) for p in points] == [("finished", 1000, 1), ("finished", 1000, 1)]  # a finished point is asked once more, as one at a time asks it
    events = [json.loads(line) for line in (folder_of(store, 0) / "events.jsonl").read_text().splitlines()]
    resumed = [e for e in events if e.get("kind") == "resume"]
    assert [e["attempt"] for e in resumed] == [2] and resumed[0]["from_step"] >= 20, resumed


def test_sigterm_stops_every_child_resumably(tmp_path: Path) -> None:
    path = project(tmp_path, LONG, "sweep.lisp")
    store = tmp_path / "runs"
    proc = sweep_process(path, store)
    wait_for(lambda: proc.poll() is not None or (state_of(store, 0) == "running" and state_of(store, 1) == "running"), "both points training")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 75, err
    assert state_of(store, 0) == state_of(store, 1) == "stopped", err
    assert "run the same command again to continue" in err
    assert not list(store.glob("*/lease.json"))  # no child still writes


def test_a_point_of_a_sweep_side_by_side_takes_its_share_of_the_cores() -> None:
    plan = plan_threads([], share=1, assume_large=True, environ={})
    assert (plan.blas, plan.reason) == (1, "one core: this point's share of the sweep's cores")


def test_the_default_is_what_the_free_cores_and_the_memory_allow(tmp_path: Path) -> None:
    experiment = compile_file(REPO / "examples" / "sweep.lisp", Selection(sweep="lr", point=0)).experiment
    assert experiment is not None
    assert plan_jobs([experiment], "cuda", None) == JobPlan(1, None)  # one accelerator: one point at a time
    chosen = plan_jobs([experiment] * 64, "cpu", None)
    assert 1 <= chosen.jobs <= process_cores()
    asked = plan_jobs([experiment] * 4, "cpu", 2)
    assert asked.jobs == 2 and asked.share is not None and asked.jobs * asked.share <= process_cores()
    assert plan_jobs([experiment] * 4, "cpu", 1) == JobPlan(1, None)  # one at a time: the point's own thread plan


def test_points_too_small_to_pay_for_a_process_run_one_at_a_time_by_default() -> None:
    experiment = compile_file(REPO / "examples" / "sweep.lisp", Selection(sweep="lr", point=0)).experiment
    assert experiment is not None
    assert training_flops(experiment) < WORTH_A_PROCESS_FLOPS  # the example's points are small
    assert plan_jobs([experiment] * 64, "cpu", None) == JobPlan(1, None)  # whatever the free cores
    big = replace(experiment, run=replace(experiment.run, steps=int(2 * WORTH_A_PROCESS_FLOPS / training_flops(experiment) * experiment.run.steps)))
    assert training_flops(big) >= WORTH_A_PROCESS_FLOPS
    assert plan_jobs([big] * 2, "cpu", 2).jobs == 2  # asked for: always honoured
