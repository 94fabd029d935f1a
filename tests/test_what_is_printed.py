"""What a command prints is true, and goes where the docs say: a closed stdout is a quiet
exit, Ctrl-C at start-up one line and exit 130, notices on stderr, progress by the wall
clock, a rerun's reason as the run folder has it."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO

QUICKSTART = REPO / "examples" / "quickstart.lisp"


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "sexpgpu", *args]


def sexpgpu(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run(command(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quickstart trained to its end in a store of its own; the run folder."""
    root = tmp_path_factory.mktemp("printed")
    (root / "q.lisp").write_text(QUICKSTART.read_text())
    done = sexpgpu("run", "q.lisp", "--store", "runs", "--quiet", cwd=root)
    assert done.returncode == 0, done.stderr
    (folder,) = (root / "runs").iterdir()
    return folder


# -- a closed stdout -------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", [["logs"], ["status"], ["checkpoint", "{run}", "list"]])
def test_a_closed_stdout_is_a_quiet_exit(trained: Path, verb: list[str]) -> None:
    """`sexpgpu logs RUN | head -2`: the reader went away. Exit 0 and not a word, never the
    store blamed (exit 4) for the pipe."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line is written
    args = [a.replace("{run}", str(trained)) for a in verb] if len(verb) > 1 else [*verb, str(trained)]
    try:
        done = subprocess.run(command(*args), stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


# -- Ctrl-C while the command starts ---------------------------------------------------------------


def default_sigint() -> None:
    """In the child: SIGINT interrupts, as at a terminal (a test runner started in the
    background may hand its children SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_while_the_verb_loads_is_exit_130_with_one_line(tmp_path: Path) -> None:
    """SIGINT while `run` is still importing its modules (seen in -X importtime's report of
    the session, which only the verb's modules load; NumPy is imported lazily,
    later): exit 130, `interrupted`, no traceback."""
    (tmp_path / "q.lisp").write_text(QUICKSTART.read_text())
    process = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "sexpgpu", "run", "q.lisp"], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    assert process.stderr is not None
    seen = []
    sent = False
    for line in process.stderr:
        seen.append(line)
        if line.startswith("import time:") and line.split("|")[-1].strip() == "sexpgpu.session":
            process.send_signal(signal.SIGINT)
            sent = True
            break
    out, rest = process.communicate(timeout=120)
    assert sent, "the verb never imported sexpgpu.session"
    lines = [line for line in (*seen, *rest.splitlines(keepends=True)) if not line.startswith("import time:")]
    assert process.returncode == 130, "".join(lines)
    assert [line.rstrip("\n") for line in lines] == ["interrupted"]
    assert out == ""
    assert not (tmp_path / "runs").exists()


# -- notices, --fresh, --resume ----------------------------------------------------------------------


def test_the_kernel_compile_notices_go_to_stderr_under_quiet_too(tmp_path: Path) -> None:
    """A machine's first run of a program compiles its kernels and says so: on stderr, so
    that stdout is the slug line and the result, as run.md has them."""
    (tmp_path / "q.lisp").write_text(QUICKSTART.read_text())
    env = {**os.environ, "NO_COLOR": "1", "SEXPGPU_CACHE": str(tmp_path / "cache")}  # an empty cache: the kernels compile
    done = subprocess.run(command("run", "q.lisp", "--quiet"), cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert len(out) == 2 and out[0].startswith("q.base.") and out[1].startswith("finished: 300 steps"), done.stdout
    notices = [line for line in done.stderr.splitlines() if line.startswith("cpu: ")]
    assert any(line.startswith("cpu: train: compiled ") and line.endswith("(cached on disk for the next run)") for line in notices), done.stderr


def test_fresh_on_a_slug_that_never_ran_keeps_no_folder_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "q.lisp").write_text(QUICKSTART.read_text())
    first = sexpgpu("run", "q.lisp", "--fresh", "--quiet", "--max-steps", "10", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "fresh run" not in first.stdout + first.stderr
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [first.stdout.split()[0]]
    slug = first.stdout.split()[0]
    again = sexpgpu("run", "q.lisp", "--fresh", "--quiet", "--max-steps", "10", cwd=tmp_path)
    kept = f"fresh run: the earlier attempts' folder is kept as {tmp_path / 'runs' / slug}~1"
    assert again.returncode == 0 and again.stdout.splitlines()[0] == kept, again.stdout
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [slug, f"{slug}~1"]
    assert (tmp_path / "runs" / f"{slug}~1" / "status.json").is_file()


def test_resume_of_a_slug_that_never_ran_says_so_and_leaves_no_folder(tmp_path: Path) -> None:
    (tmp_path / "q.lisp").write_text(QUICKSTART.read_text())
    done = sexpgpu("run", "q.lisp", "--resume", "latest", cwd=tmp_path)
    assert done.returncode == 6 and done.stdout == "", done.stdout
    assert done.stderr.startswith("sexpgpu: resume refused: q.base.392de151 has not run yet in "), done.stderr
    assert "run it without --resume" in done.stderr and "no valid checkpoint" not in done.stderr
    assert not (tmp_path / "runs" / "q.base.392de151").exists()


# -- progress by the wall clock ----------------------------------------------------------------------


def test_steps_per_second_and_eta_are_wall_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The progress line's steps/s and ETA, and status.json's eta_s, are what a user waits:
    the steps over the wall time (status and event writes, checkpoints included), as the
    events' own timestamps measure it; not the steps' compute time alone (8-10x faster).
    Every version of status.json the run publishes is kept as the store writes it, so none
    is missed however the machine schedules the run."""
    from sexpgpu.compile.pipeline import compile_file
    from sexpgpu.runtime.attempt import RunOptions, train
    from sexpgpu.runtime.devices import open_device
    from sexpgpu.runtime.store import Store

    (tmp_path / ".git").mkdir()
    path = tmp_path / "q.lisp"
    path.write_text(QUICKSTART.read_text().replace("(defrun :steps 300", "(defrun :steps 2000"))
    experiment = compile_file(path).experiment
    assert experiment is not None
    device, backend = open_device("cpu")
    published: list[dict[str, Any]] = []  # each status.json as written, in order
    write_text = Store.write_text

    def keeping(store: Store, at: str, text: str) -> None:
        write_text(store, at, text)
        if at.endswith("/status.json"):
            published.append(json.loads(text))

    monkeypatch.setattr(Store, "write_text", keeping)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        # statuses every 0.05 s (not the default 2 s: the run takes about two), so several are published mid-run
        outcome = train(experiment, RunOptions(store=str(tmp_path / "runs"), progress=True, signals=False, device=device, backend=backend,
                                               publish_every_s=0.05), say=lambda _: None)
    assert outcome.exit_code == 0 and outcome.slug == "q.base.392de151", outcome.reason
    events = [json.loads(line) for line in (tmp_path / "runs" / outcome.slug / "events.jsonl").read_text().splitlines()]
    steps = [e for e in events if e["kind"] == "step"]

    def at(event: dict[str, object]) -> float:
        return datetime.fromisoformat(str(event["t"]).replace("Z", "+00:00")).timestamp()

    true_rate = (steps[-1]["step"] - steps[0]["step"]) / (at(steps[-1]) - at(steps[0]))
    printed = [float(r) for r in re.findall(r"(\d+) steps/s", err.getvalue())]
    assert len(printed) == 200, err.getvalue()[-500:]
    assert 0.5 * true_rate <= printed[-1] <= 2 * true_rate, (printed[-5:], true_rate)
    running = [(status["step"], status["eta_s"]) for status in published
               if status.get("state") == "running" and status.get("eta_s") and 100 <= status["step"] <= 1900]
    assert running, [(status.get("state"), status.get("step")) for status in published]
    (step, eta) = running[0]
    # what the run knew at that status: its steps so far over their wall time, by the events'
    # own times (the rest of the run's pace depends on what else the machine runs then)
    before = [e for e in steps if int(e["step"]) <= step]
    rate_then = (int(before[-1]["step"]) - int(before[0]["step"])) / (at(before[-1]) - at(before[0]))
    left = (steps[-1]["step"] - step) / rate_then
    assert 0.33 * left <= eta <= 3 * left, (step, eta, left)


# -- sweeps ---------------------------------------------------------------------------------------------

SWEEP = (REPO / "examples" / "sweep.lisp").read_text()
TARGETED = SWEEP.replace("(defsweep lr :lr (0.025 0.05 0.1 0.2))", "(defsweep lr :lr (0.1 0.2))").replace("(defpart net", """(defloader val
  :source (synthetic :spirals :n 512 :classes 3 :seed 1)
  :fields ((x :f32 (2)) (y :i32 ()))
  :batch 128)

(defpart net""").replace("(defgroups", """(defevaluate (batch)
  (metric acc (nn:accuracy (net (field batch x)) (field batch y))))

(defeval val :every 25 :overlap t)  ; another seed: 2 of its 512 examples are in train too
(deftarget val acc :>= 0.7)

(defgroups""")


def sweep_project(tmp_path: Path, text: str = TARGETED) -> Path:
    (tmp_path / ".git").mkdir(exist_ok=True)
    path = tmp_path / "t.lisp"
    path.write_text(text)
    return path


def test_a_rerun_of_a_sweep_shows_how_each_point_ended(tmp_path: Path) -> None:
    """Every point reached its target; the same sweep again trains nothing and says so, with
    the target each point reached, as its status.json has it."""
    sweep_project(tmp_path)
    first = sexpgpu("sweep", "t.lisp", "--sweep", "lr", "--json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    again = sexpgpu("sweep", "t.lisp", "--sweep", "lr", "--json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    before, after = json.loads(first.stdout)["points"], json.loads(again.stdout)["points"]
    for old, new in zip(before, after, strict=True):
        assert old["target"] is not None and old["reason"].startswith("target reached: val/acc "), old
        assert new["target"] == old["target"], (old, new)
        assert new["reason"] == f"already finished: {old['reason']}", new
        status = json.loads((tmp_path / "runs" / new["slug"] / "status.json").read_text())
        assert status["summary"]["reason"] == old["reason"] and status["summary"]["target_reached_at_step"] == new["target"]["step"]


SHORT = SWEEP.replace(
    "(defrun :steps 300 :seed 0 :checkpoint (:every 100 :keep 2))", "(defrun :steps 40 :seed 0 :checkpoint (:every 10 :keep 2))")


def run_jsons(tmp_path: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "runs").glob("*/run.json"))]


def test_a_sweep_point_records_max_steps_only_when_it_was_given(tmp_path: Path) -> None:
    sweep_project(tmp_path, SHORT)
    done = sexpgpu("sweep", "t.lisp", "--sweep", "lr", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [info["max_steps"] for info in run_jsons(tmp_path)] == [None] * 4
    smoke = sexpgpu("sweep", "t.lisp", "--sweep", "lr", "--store", "smoke", "--max-steps", "10", cwd=tmp_path)
    assert smoke.returncode == 0, smoke.stderr
    assert [json.loads(p.read_text())["max_steps"] for p in sorted((tmp_path / "smoke").glob("*/run.json"))] == [10] * 4


# -- bundles ----------------------------------------------------------------------------------------


def test_a_bundled_run_records_the_file_in_the_bundle(tmp_path: Path) -> None:
    """Not the temporary project the bundle was unpacked into, which is gone by then."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "q.lisp").write_text(QUICKSTART.read_text())
    made = sexpgpu("bundle", "q.lisp", "-o", "b", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    ran = sexpgpu("run", "b", "--max-steps", "5", "--json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    info = json.loads((tmp_path / "runs" / json.loads(ran.stdout)["slug"] / "run.json").read_text())
    assert info["file"] == str((tmp_path / "b" / "source" / "q.lisp").resolve())
    assert Path(info["file"]).is_file()


def test_a_local_sweep_says_a_point_is_running_elsewhere(tmp_path: Path) -> None:
    """Point 1's run folder is being written by another attempt (this test process holds its
    writer lease, as a second `run` would): the sweep says so, runs the other points, and
    exits 75: the same command again takes the point up once it is free."""
    from sexpgpu.compile.pipeline import compile_file
    from sexpgpu.ir.experiment import Selection
    from sexpgpu.runtime.lease import Leases
    from sexpgpu.runtime.runfolder import run_slug
    from sexpgpu.runtime.store import Store

    path = sweep_project(tmp_path, SHORT)
    experiment = compile_file(path, Selection(sweep="lr", point=1)).experiment
    assert experiment is not None
    slug = run_slug(experiment)
    leases = Leases(Store.open(str(tmp_path / "runs")), "another attempt")
    assert leases.claim([f"{slug}/lease.json"]) == [f"{slug}/lease.json"]
    renewal = leases.keep_renewed(lambda: [f"{slug}/lease.json"])
    try:
        done = sexpgpu("sweep", "t.lisp", "--sweep", "lr", "--json", cwd=tmp_path)
    finally:
        renewal.stop()
    assert done.returncode == 75, done.stderr
    points = json.loads(done.stdout)["points"]
    assert [p["state"] for p in points] == ["finished", "running", "finished", "finished"], points
    assert f"pid {os.getpid()}, heartbeat " in points[1]["elsewhere"], points[1]
    assert points[1]["attempts"] == 0 and points[1]["exit_code"] is None
    assert f"point 1: running  0/40 steps  loss -  (running elsewhere: {points[1]['elsewhere'].split(',')[0]}" in done.stderr, done.stderr
    assert "failed" not in done.stderr and "nothing more can start here" not in done.stderr
    assert "sweep lr: point 1 is running elsewhere; run the same command again once it ends" in done.stderr


def test_the_sweep_table_never_shows_more_steps_done_than_its_target(tmp_path: Path) -> None:
    """A point that finished 40 steps, the file now asking 20 (the same slug): `40/40`, the
    steps it did of the most it was asked, not `40/20`."""
    path = sweep_project(tmp_path, SHORT)
    assert sexpgpu("sweep", "t.lisp", "--sweep", "lr", cwd=tmp_path).returncode == 0
    path.write_text(SHORT.replace("(defrun :steps 40", "(defrun :steps 20"))
    again = sexpgpu("sweep", "t.lisp", "--sweep", "lr", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    rows = again.stdout.splitlines()[1:]
    assert len(rows) == 4 and all(row.split()[2] == "40/40" for row in rows), again.stdout
    assert "40/20" not in again.stderr, again.stderr


def test_a_ray_sweep_says_an_ended_point_as_a_local_sweep_does(tmp_path: Path) -> None:
    """The driver's line for a point that ended has its numbers rounded as the local sweep's
    lines have them, not every digit of a float."""
    pytest.importorskip("ray")
    from orchestration.driver import Driver
    from sexpgpu.sweeps.ledger import PointRecord
    from sexpgpu.outcome import AttemptOutcome, EvalSeen, Exit

    said: list[str] = []
    driver = Driver(REPO / "examples" / "sweep.lisp", "lr", str(tmp_path), None, None, None, say=said.append)
    record = PointRecord(point=2, slug="sweep.base.lr-2.00000000", knobs={"lr": 0.1}, planned=300)
    outcome = AttemptOutcome(exit_code=Exit.OK, reason="finished", folder=str(tmp_path / "x"), steps=300, final_loss=0.4709201157093048,
                             metrics={"acc": 0.8281250596046448}, evals={"val": EvalSeen(step=300, metrics={"acc": 0.90277777777})})
    assert driver.record_outcome(record, outcome) is False
    assert said == ["point 2: finished  300/300 steps  loss 0.4709  acc 0.8281  eval val: acc 0.9028 (step 300)  (steps)"]
    assert said[0] == record.line()


# -- sweep --ray --json: stdout is the document ------------------------------------------------------------

LONG = SWEEP.replace("(defsweep lr :lr (0.025 0.05 0.1 0.2))", "(defsweep lr :lr (0.05 0.1))").replace(
    "(defrun :steps 300 :seed 0 :checkpoint (:every 100 :keep 2))", "(defrun :steps 4000 :seed 0 :checkpoint (:every 200 :keep 2))")


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_a_ray_sweep_whose_worker_dies_prints_one_json_document(tmp_path: Path) -> None:
    """A worker SIGKILLed (once its run published a checkpoint) makes Ray's raylet report
    `A worker died ...`, with colour codes; none of that reaches stdout, which holds only the
    sweep's JSON document."""
    pytest.importorskip("ray")
    sweep_project(tmp_path, LONG)
    env = {**os.environ, "NO_COLOR": "1", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("SEXPGPU_RAY_ADDRESS", None)
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        process = subprocess.Popen(command("sweep", "t.lisp", "--sweep", "lr", "--ray", "--json"), cwd=tmp_path, stdout=out, stderr=err, env=env)
        killed = None
        try:
            while process.poll() is None and killed is None:
                for status_file in (tmp_path / "runs").glob("t.base.lr-*/status.json"):
                    try:
                        status = json.loads(status_file.read_text())
                    except (OSError, ValueError):  # being replaced
                        continue
                    worker = status.get("worker") or ""
                    if status.get("state") == "running" and status.get("last_checkpoint") and worker.startswith("ray actor"):
                        killed = int(worker.rsplit("pid ", 1)[1])
                        os.kill(killed, signal.SIGKILL)  # the sweep's own worker process (its pid in the status)
                        break
                else:
                    threading.Event().wait(0.02)  # a poll of the status files, not a wait for time to pass
            code = process.wait(timeout=600)
        finally:
            if process.poll() is None:
                process.kill()
    stdout, stderr = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    assert killed is not None, stderr
    assert code == 0, stderr
    ledger = json.loads(stdout)  # one document, nothing else
    assert [p["state"] for p in ledger["points"]] == ["finished", "finished"], ledger
    assert sum(p["preemptions"] for p in ledger["points"]) == 1, ledger
    assert "\x1b[" not in stdout and "(raylet)" not in stdout
    assert [json.loads(p.read_text())["max_steps"] for p in sorted((tmp_path / "runs").glob("*/run.json"))] == [None, None]


# -- runs ---------------------------------------------------------------------------------------------


def test_runs_has_a_column_for_each_knob_that_varies(tmp_path: Path) -> None:
    """The README's promise: `runs` lists the runs with their knobs; the knobs that tell the
    listed runs apart, that is (a knob all of them set alike says nothing)."""
    sweep_project(tmp_path, SHORT.replace("(defknob lr 0.1", "(defknob depth 2)\n(defknob lr 0.1"))
    assert sexpgpu("sweep", "t.lisp", "--sweep", "lr", cwd=tmp_path).returncode == 0
    listed = sexpgpu("runs", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    names = header.split()
    assert names[:5] == ["slug", "file", "selection", "lr", "state"] and "depth" not in names, header
    assert sorted(row.split()[names.index("lr") + 1] for row in rows) == ["0.025", "0.05", "0.1", "0.2"]  # + 1: "base lr-N" is two words
    one = sexpgpu("runs", "--filter", "lr=0.1", cwd=tmp_path)
    assert one.returncode == 0 and "lr" not in one.stdout.splitlines()[0].split(), one.stdout


# -- docs/plot.md's examples are real ---------------------------------------------------------------


def test_the_plot_page_plots_the_runs_its_own_commands_make(tmp_path: Path) -> None:
    """Its commands name the slugs its `run` commands print: every `-o FILE` it shows is
    written (an example that expects `no run at ...` shows nothing of plot)."""
    pytest.importorskip("matplotlib")
    from doc_console import parse_page, run_page

    page = REPO / "docs" / "plot.md"
    assert run_page(page, tmp_path).report() == []
    outputs = [c.text.split(" -o ", 1)[1].split()[0] for b in parse_page(page).blocks if b.skip is None for c in b.commands
               if c.text.startswith("sexpgpu plot ") and " -o " in c.text and not any(line.startswith("sexpgpu: error") for line in c.expected)]
    assert "two.svg" in outputs and "grid.png" in outputs, outputs
    assert all((tmp_path / name).is_file() for name in outputs), [(name, (tmp_path / name).is_file()) for name in outputs]
