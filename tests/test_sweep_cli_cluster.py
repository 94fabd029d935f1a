"""The cluster flags of `sweep` without a cluster: usage errors, the live table's drawing."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, recorded_reads
from sexpgpu.runtime.store import Store

pytestmark = pytest.mark.xdist_group("ray")  # one local Ray cluster at a time


def sexpgpu(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sexpgpu", *args], capture_output=True, text=True, cwd=cwd)


def test_devices_without_ray_is_a_usage_error(tmp_path: Path) -> None:
    done = sexpgpu("sweep", str(REPO / "examples" / "sweep.lisp"), "--sweep", "lr", "--devices", "2", "--store", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 2 and "--devices 2 needs --ray" in done.stderr, done.stderr


def test_a_batch_the_ranks_cannot_split_fails_before_anything_runs(tmp_path: Path) -> None:
    done = sexpgpu("sweep", str(REPO / "examples" / "sweep.lisp"), "--sweep", "lr", "--ray", "--devices", "3", "--store", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 3 and "does not split over 3 data-parallel ranks" in done.stderr, done.stderr
    assert not (tmp_path / "sweeps").exists()


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_live_table_redraws_in_place_and_keeps_log_lines_above(tmp_path: Path) -> None:
    from sexpgpu.sweeps.ledger import PointRecord, SweepLedger
    from sexpgpu.cli.sweeps import LiveTable

    screen = Terminal()
    table = LiveTable(screen, Store.open(str(tmp_path)), enabled=True)
    ledger = SweepLedger(file="x.lisp", sweep="lr", points=[PointRecord(point=0, slug="x.a", knobs={"lr": 0.1}, state="running", attempts=1),
                                                            PointRecord(point=1, slug="x.b", knobs={"lr": 0.2}, state="finished", attempts=2, final_loss=0.5)])
    table(ledger, False)
    first = screen.getvalue()
    assert "running" in first and "finished" in first and "0.5" in first and "lr=0.2" in first
    table.say("point 0: preempted, resumed (attempt 2)")
    table(ledger, False)
    text = screen.getvalue()
    assert "\x1b[3F\x1b[J" in text  # the 3-line table (header + 2 points) is erased before the log line
    assert text.index("preempted, resumed") < text.rindex("finished")
    table(ledger, True)
    assert screen.getvalue().endswith("\x1b[3F\x1b[J")  # the final table is the caller's to print


class Untouchable(list):  # type: ignore[type-arg]
    """A ledger's points that a redraw must not walk (it is handed what changed and what runs)."""

    walked = False

    def __iter__(self):  # type: ignore[no-untyped-def]
        if self.walked:
            raise AssertionError("the live table walked every point of the sweep")
        return super().__iter__()


def test_a_large_sweep_s_live_table_is_a_summary_and_the_running_rows_at_a_cost_independent_of_n(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """10,000 points on a 20-line table: the counts by state, the best loss, and as many of
    the running points as fit, their status read (and no other point's); a redraw looks only
    at the points that changed and those active, never the whole sweep."""
    from sexpgpu.cli.sweeps import STATUS_EVERY_S, LiveTable
    from sexpgpu.runtime.status import Status, StatusWriter
    from sexpgpu.sweeps.ledger import PointRecord, SweepLedger

    store = Store.open(str(tmp_path))
    points = Untouchable(PointRecord(point=i, slug=f"x.{i:05d}", knobs={"lr": i / 1e4}, planned=50) for i in range(10_000))
    ledger = SweepLedger(file="x.lisp", sweep="lr", points=[])
    ledger.points = points
    for p in points[:40]:
        p.state, p.attempts = "running", 1
        StatusWriter(store, p.slug).write(Status(state="running", step=7, steps=50, metrics={"loss": 1.5}))
    for p in points[40:100]:
        p.state, p.steps, p.final_loss = "finished", 50, 0.5 + p.point / 1e3
    screen = Terminal()
    now = [0.0]
    table = LiveTable(screen, store, enabled=True, height=20, clock=lambda: now[0])
    table(ledger, False)  # a first look at every point (as after a halving stage)
    now[0] += STATUS_EVERY_S
    points.walked = True
    reads = recorded_reads(monkeypatch)
    running = points[:40]
    points[40].state, points[40].final_loss = "failed", None  # the best one failed after all: found again
    points[0].state, points[0].final_loss, points[0].steps = "finished", 0.25, 50
    table(ledger, False, changed=[points[0], points[40]], active=running[1:])
    monkeypatch.undo()
    drawn = screen.getvalue().rpartition("\x1b[J")[2].splitlines()
    assert len(drawn) <= 20, drawn
    assert drawn[0] == "10000 points: 60 finished, 1 failed, 39 running, 9900 pending  best loss 0.25 (point 0)", drawn[0]
    assert drawn[1].split()[:3] == ["point", "knobs", "steps"]
    assert [line.split()[0] for line in drawn[2:-1]] == [str(i) for i in range(1, 18)]
    assert all("7/50" in line and "running" in line for line in drawn[2:-1])
    assert drawn[-1] == "  ... and 22 more running or about to"
    assert sorted(reads) == sorted(f"x.{i:05d}/status.json" for i in range(1, 18)), reads


def test_a_point_finished_under_a_smaller_max_steps_is_not_finished_for_the_full_sweep(tmp_path: Path) -> None:
    from orchestration.driver import Driver
    from sexpgpu.runtime.status import Status, Summary

    driver = Driver(REPO / "examples" / "sweep.lisp", "lr", str(tmp_path), None, None, None, say=lambda _: None)
    driver.wanted["s"] = 300
    smoke = Status(state="finished", step=10, steps=300, summary=Summary(exit_code=0, reason="finished"))
    assert driver.ended(smoke, "s") is None
    assert driver.ended(smoke.model_copy(update={"step": 300}), "s") == "finished"
    assert driver.ended(Status(state="failed", step=5, summary=Summary(exit_code=1, reason="non-finite")), "s") == "failed"
    assert driver.ended(Status(state="running", step=50), "s") is None


def test_a_rank_without_its_collective_library_is_exit_4_not_a_retry() -> None:
    """Missing software is not a preemption: retrying cannot fix it."""
    from workers.collective import CollectiveUnavailable, RankSpec, join, unavailable

    assert unavailable("gloo") is None  # the test extra installs torch
    try:
        import cupy  # noqa: F401
    except ImportError:
        try:
            join(RankSpec(rank=0, world=2, group="g", backend="nccl", nccl_id=[0]))
        except CollectiveUnavailable as exc:
            assert "CuPy" in str(exc) and "pip install" in str(exc)
        else:
            raise AssertionError("NCCL ranks without CuPy must refuse to start")


def test_the_nccl_hint_names_the_wheel_of_the_installed_cupys_cuda() -> None:
    """A CuPy without NCCL is told the NCCL wheel of its own CUDA major version."""
    from workers.collective import nccl_install

    assert nccl_install(["numpy", "cupy-cuda12x"]) == "pip install nvidia-nccl-cu12"
    assert nccl_install(["cupy_cuda13x", "torch"]) == "pip install nvidia-nccl-cu13"
    assert "NN the CUDA major version" in nccl_install(["cupy"])


def test_a_lost_attempt_does_not_leave_its_run_running(tmp_path: Path) -> None:
    """The supervisor writes the end of an attempt that could not (its rank was killed): the
    status says preempted, with the reason, not `running` with a dead heartbeat."""
    from orchestration.attempts import close_status
    from sexpgpu.outcome import AttemptOutcome, Exit, lost
    from sexpgpu.runtime.status import Status, StatusWriter, read_status

    store = Store.open(str(tmp_path))
    StatusWriter(store, "s").write(Status(state="running", step=40, steps=300))
    close_status(store, "s", lost("rank 0 of 1 lost: killed by Ray's memory monitor (the node ran out of memory)"))
    status = read_status(store, "s")
    assert status is not None and status.state == "preempted" and status.step == 40
    assert status.summary is not None and status.summary.exit_code == 75 and "memory monitor" in status.summary.reason
    StatusWriter(store, "t").write(Status(state="finished", step=300, steps=300))
    close_status(store, "t", AttemptOutcome(exit_code=Exit.RUN_FAILED, reason="late"))
    ended = read_status(store, "t")
    assert ended is not None and ended.state == "finished"  # an attempt's own end is left as it is


def test_a_rank_killed_from_outside_is_a_preemption_and_its_own_exception_a_failure() -> None:
    """Classified by how Ray reports the death: the memory monitor and a lost node are
    RayErrors, an exception in the run's code a RayTaskError."""
    ray = pytest.importorskip("ray")
    from orchestration.gang import death
    from ray.exceptions import OutOfMemoryError, RayError, RayTaskError

    assert "memory monitor" in death(OutOfMemoryError("the node is out of memory"))
    assert issubclass(OutOfMemoryError, RayError) and not issubclass(OutOfMemoryError, RayTaskError)
    assert ray is not None


def sweep_file(tmp_path: Path, lrs: str) -> Path:
    (tmp_path / ".git").mkdir(exist_ok=True)
    path = tmp_path / "s.lisp"
    path.write_text((REPO / "examples" / "sweep.lisp").read_text().replace("(defsweep lr :lr (0.025 0.05 0.1 0.2))", f"(defsweep lr :lr ({lrs}))")
                    .replace("(defrun :steps 300 :seed 0 :checkpoint (:every 100 :keep 2))", "(defrun :steps 40 :seed 0 :checkpoint (:every 10 :keep 2))"))
    return path


def test_a_failed_point_is_run_again_only_with_retry_failed(tmp_path: Path) -> None:
    import json

    from sexpgpu.cli.main import main

    path = sweep_file(tmp_path, "0.05 1e30")
    store = str(tmp_path / "runs")
    assert main(["sweep", str(path), "--sweep", "lr", "--store", store]) == 1  # point 1's loss is not finite
    assert main(["sweep", str(path), "--sweep", "lr", "--store", store]) == 1
    (failed,) = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*lr-1*/status.json")]
    assert failed["attempt"] == 1, failed  # skipped: not run again
    assert main(["sweep", str(path), "--sweep", "lr", "--store", store, "--retry-failed"]) == 1
    (failed,) = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*lr-1*/status.json")]
    assert failed["attempt"] == 2, failed


def test_a_smoke_sweep_is_truncated_and_a_full_sweep_resumes_it(tmp_path: Path) -> None:
    import json

    from sexpgpu.cli.main import main

    path = sweep_file(tmp_path, "0.05 0.1")
    store = str(tmp_path / "runs")
    assert main(["sweep", str(path), "--sweep", "lr", "--store", store, "--max-steps", "10"]) == 0
    states = {p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/status.json")}
    assert {s["state"] for s in states.values()} == {"truncated"} and {s["step"] for s in states.values()} == {10}
    assert main(["sweep", str(path), "--sweep", "lr", "--store", store]) == 0
    states = {p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/status.json")}
    assert {s["state"] for s in states.values()} == {"finished"} and {s["step"] for s in states.values()} == {40}
    assert {s["attempt"] for s in states.values()} == {2}  # resumed, not started over
