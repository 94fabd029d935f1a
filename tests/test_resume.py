"""Runs that survive: checkpoints, exact resume after SIGTERM and SIGKILL between checkpoints,
refused and corrupt checkpoints, the finite guard's report."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, wait_for
from sexpgpu.compile.pipeline import compile_file
from sexpgpu.runtime.checkpoint import ResumeError, list_checkpoints, load_checkpoint, resolve
from sexpgpu.runtime.attempt import RunOptions, train
from sexpgpu.runtime.runfolder import RunFolder, run_slug
from sexpgpu.runtime.store import Store
from sexpgpu.runtime.threads import BLAS_VARIABLES

LONG = (REPO / "examples" / "charlm.lisp").read_text().replace(
    "(defrun :steps 600 :seed 0 :log-every 50)", "(defrun :steps 400 :seed 0 :log-every 5 :checkpoint (:every 30 :keep 2))"
)


def write_run(tmp_path: Path, text: str = LONG) -> Path:
    """The run file in a project of its own, its data beside it."""
    (tmp_path / ".git").mkdir(exist_ok=True)
    (tmp_path / "data").mkdir(exist_ok=True)
    shutil.copy(REPO / "examples" / "data" / "stdlib-docstrings.txt", tmp_path / "data")
    path = tmp_path / "long.lisp"
    path.write_text(text)
    return path


def final_params(store: Path, steps: int = 400) -> dict[str, np.ndarray]:
    (slug,) = [p.name for p in store.iterdir() if p.is_dir()]
    s = Store.open(str(store))
    name = [c.name for c in list_checkpoints(s, slug) if c.valid][-1]
    params, _, state = load_checkpoint(s, slug, name)
    assert state.step == steps
    return params


def cli_run(path: Path, store: Path, *flags: str, one_core: bool = False) -> subprocess.Popen[str]:
    """`sexpgpu run PATH --store STORE FLAGS`; ONE_CORE: the process may use only this
    process's first core (its affinity, which the thread plan counts)."""
    env = {k: v for k, v in os.environ.items() if k not in ("SEXPGPU_THREADS", *BLAS_VARIABLES)} | {"NO_COLOR": "1"}
    first = min(os.sched_getaffinity(0))
    return subprocess.Popen([sys.executable, "-m", "sexpgpu", "run", str(path), "--store", str(store), "--quiet", *flags], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, preexec_fn=(lambda: os.sched_setaffinity(0, {first})) if one_core else None)


def logged_step(store: Path) -> int:
    """The step the run in STORE last logged (its status.json, replaced whole), or -1."""
    paths = list(store.glob("*/status.json"))
    if not paths:
        return -1
    status = json.loads(paths[0].read_text())
    return int(status["step"]) if status["state"] == "running" else -1


# Each kill lands after the run has logged a step (an event, not a delay), between two
# checkpoints (every 30 steps), by SIGKILL (no chance to write anything) or SIGTERM (the
# run checkpoints and exits 75).
KILLS = ((45, signal.SIGKILL), (130, signal.SIGTERM), (200, signal.SIGKILL), (310, signal.SIGTERM))


def test_killed_and_resumed_runs_end_bit_identical(tmp_path: Path) -> None:
    """Both runs get one BLAS thread (the count changes a product's last bits, so a run
    compared bit for bit with another has its count set); the broken run only on its first
    attempt: the later ones keep it on their own, whatever the load."""
    path = write_run(tmp_path)
    straight = tmp_path / "straight"
    proc = cli_run(path, straight, "--threads", "1")
    assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
    reference = final_params(straight)

    broken = tmp_path / "broken"
    landed = 0
    for after, sig in KILLS:
        proc = cli_run(path, broken, *(("--threads", "1") if landed == 0 else ()))
        wait_for(lambda after=after, proc=proc: logged_step(broken) >= after or proc.poll() is not None, f"step {after} logged")
        proc.send_signal(sig)
        code = proc.wait(timeout=120)
        assert code == (75 if sig == signal.SIGTERM else -signal.SIGKILL), (code, proc.stderr.read() if proc.stderr else "")
        landed += 1
    proc = cli_run(path, broken)
    assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
    resumed = final_params(broken)
    for name, value in reference.items():
        assert value.tobytes() == resumed[name].tobytes(), name
    (slug,) = [p.name for p in broken.iterdir() if p.is_dir()]
    series = [(e["step"], e["loss"]) for e in RunFolder(Store.open(str(broken)), slug).read_events() if e["kind"] == "step"]
    steps = [s for s, _ in series]
    assert steps == sorted(set(steps)) and steps[-1] == 400, "a resumed series has no duplicate steps"
    straight_series = [(e["step"], e["loss"]) for e in RunFolder(Store.open(str(straight)), slug).read_events() if e["kind"] == "step"]
    assert series == straight_series, "the same loss series as the uninterrupted run"
    history = RunFolder(Store.open(str(broken)), slug).read_events(superseded=True)
    assert sum(e["kind"] == "resume" for e in history) == landed, "every attempt after a kill resumed"


SHORT = LONG.replace("(defrun :steps 400 :seed 0 :log-every 5 :checkpoint (:every 30 :keep 2))", "(defrun :steps 40 :seed 0 :log-every 5 :checkpoint (:every 20 :keep 2))")


def test_a_resumed_attempt_keeps_the_thread_count_of_the_first_whatever_it_would_choose_now(tmp_path: Path) -> None:
    """OpenBLAS's products change in the last bits with its thread count, which a run
    chooses from the cores free when it starts. The first attempt has 2 threads; the
    resumed one runs where it would choose 1 (one core in its affinity) and keeps 2 (run.json),
    so it ends with the bits of the run never stopped."""
    path = write_run(tmp_path, SHORT)
    straight = tmp_path / "straight"
    proc = cli_run(path, straight, "--threads", "2")
    assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
    broken = tmp_path / "broken"
    proc = cli_run(path, broken, "--threads", "2", "--max-steps", "20")
    assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
    proc = cli_run(path, broken, one_core=True)
    assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
    (slug,) = [p.name for p in broken.iterdir() if p.is_dir()]
    assert any(e["kind"] == "resume" and e["from_step"] == 20 for e in RunFolder(Store.open(str(broken)), slug).read_events())
    reference, resumed = final_params(straight, 40), final_params(broken, 40)
    for name, value in reference.items():
        assert value.tobytes() == resumed[name].tobytes(), name
    plan = RunFolder(Store.open(str(broken)), slug).read_run_info().threads
    assert plan is not None and (plan.blas, plan.cores, plan.source) == (2, 1, "run.json"), plan


def test_threads_the_user_sets_on_a_resume_win_and_are_warned_about(tmp_path: Path) -> None:
    path = write_run(tmp_path, SHORT)
    store = tmp_path / "runs"
    proc = cli_run(path, store, "--threads", "2", "--max-steps", "20")
    assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
    proc = subprocess.Popen([sys.executable, "-m", "sexpgpu", "run", str(path), "--store", str(store), "--threads", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "NO_COLOR": "1"})
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "--threads 1 gives this run 1 BLAS thread(s) where its earlier attempts had 2" in out + err
    (slug,) = [p.name for p in store.iterdir() if p.is_dir()]
    plan = RunFolder(Store.open(str(store)), slug).read_run_info().threads
    assert plan is not None and (plan.blas, plan.source) == (1, "flag")


def compiled(path: Path):  # type: ignore[no-untyped-def]
    result = compile_file(path)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    return result.experiment


QUICK = (REPO / "examples" / "quickstart.lisp").read_text().replace("(defrun :steps 300 :seed 0)", "(defrun :steps 60 :seed 0 :checkpoint (:every 20 :keep 3))")


def test_an_edit_that_changes_no_number_resumes_and_another_run_is_refused(tmp_path: Path) -> None:
    """A comment keeps the slug (docs/run.md, "The slug") and the run continues from its
    checkpoint; a checkpoint of another run (a folder copied under this slug) is refused."""
    path = write_run(tmp_path, QUICK)
    store = str(tmp_path / "runs")
    done = train(compiled(path), RunOptions(store=store, max_steps=40, signals=False), say=lambda _: None)
    path.write_text(QUICK.replace(";;;; quickstart.lisp", ";;;; edited quickstart.lisp"))
    edited = compiled(path)
    said: list[str] = []
    again = train(edited, RunOptions(store=store, resume="latest", signals=False), say=said.append)
    assert again.slug == done.slug and "resumed from step-000040 (step 40)" in said and again.steps == 60
    path.write_text(QUICK.replace("(defrun :steps 60 :seed 0", "(defrun :steps 60 :seed 1"))
    other = compiled(path)
    (tmp_path / "runs" / done.slug).rename(tmp_path / "runs" / run_slug(other))
    with pytest.raises(ResumeError, match="belongs to another run"):
        train(other, RunOptions(store=store, resume="latest", signals=False), say=lambda _: None)
    env = {**os.environ, "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "sexpgpu", "run", str(path), "--store", store, "--resume", "latest"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 6 and "resume refused" in proc.stderr


def test_corrupt_checkpoints_are_never_loaded(tmp_path: Path) -> None:
    path = write_run(tmp_path, QUICK)
    store = tmp_path / "runs"
    first = train(compiled(path), RunOptions(store=str(store), max_steps=40, signals=False), say=lambda _: None)
    ckpts = store / first.slug / "checkpoints"
    newest = sorted(p for p in ckpts.iterdir() if p.is_dir())[-1]
    data = (newest / "params.safetensors").read_bytes()
    (newest / "params.safetensors").write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(ResumeError, match="does not match|truncated"):
        train(compiled(path), RunOptions(store=str(store), resume=newest.name, signals=False), say=lambda _: None)
    messages: list[str] = []
    again = train(compiled(path), RunOptions(store=str(store), resume="latest", signals=False), say=messages.append)
    assert any("skipped" in m and "truncated" in m for m in messages)
    assert any(m.startswith("resumed from step-000020") for m in messages)
    assert again.exit_code == 0 and again.steps == 60


BLOWUP = """
(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)
(defmodel fragile ()
  (defpart inner (nn:linear 2 3))
  (forward (x)
    (log (- (inner x) 1000.0))))
(defloader train :source (synthetic :spirals :n 512 :classes 3) :fields ((x :f32 (2)) (y :i32 ())) :batch 32)
(defpart net (fragile))
(defobjective (batch) (mean (net (field batch x))))
(defgroups (all "**" (optim:sgd :lr 0.1)))
(defrun :steps 20 :seed 0 :finite-guard (:skip 2))
"""


def test_finite_guard_names_the_node_that_created_the_nan(tmp_path: Path) -> None:
    path = write_run(tmp_path, BLOWUP)
    store = tmp_path / "runs"
    outcome = train(compiled(path), RunOptions(store=str(store), signals=False), say=lambda _: None)
    assert outcome.exit_code == 1
    events = [e for e in RunFolder(Store.open(str(store)), outcome.slug).read_events() if e["kind"] == "nonfinite"]
    assert [e["action"] for e in events] == ["skipped", "skipped", "stopped"]
    first = events[0]
    assert first["op"] == "log" and first["created"] is True
    assert first["location"] == f"{path.name}:7:5" or first["location"].endswith("long.lisp:7:5")
    assert first["param_path"] == "net"
    status = json.loads((store / outcome.slug / "status.json").read_text())
    assert status["state"] == "failed" and status["summary"]["exit_code"] == 1


def test_each_checkpoint_event_carries_the_size_checkpoint_list_shows(tmp_path: Path) -> None:
    path = write_run(tmp_path, QUICK)
    store = tmp_path / "runs"
    done = train(compiled(path), RunOptions(store=str(store), max_steps=40, signals=False), say=lambda _: None)
    events = [json.loads(line) for line in (store / done.slug / "events.jsonl").read_text().splitlines()]
    sizes = {e["path"]: e["bytes"] for e in events if e["kind"] == "checkpoint"}
    assert sizes, "no checkpoint event"
    for where, size in sizes.items():
        manifest = json.loads((store / done.slug / where / "MANIFEST.json").read_text())
        on_disk = sum((store / done.slug / where / name).stat().st_size for name in manifest["files"])
        assert size == on_disk == sum(f["bytes"] for f in manifest["files"].values())


def test_an_abandoned_attempts_newer_checkpoints_stay_until_written_again_or_pruned(tmp_path: Path) -> None:
    """docs/checkpoints-and-resume.md, "Not yet": after --resume from an older step, the
    newer checkpoints of the abandoned attempt are kept, count among :keep, and are what
    --resume latest falls back to when the checkpoint LATEST names is damaged."""
    path = write_run(tmp_path, QUICK)  # a checkpoint every 20 steps, keep 3
    store = tmp_path / "runs"
    first = train(compiled(path), RunOptions(store=str(store), max_steps=50, signals=False), say=lambda _: None)
    s = Store.open(str(store))
    assert [c.name for c in list_checkpoints(s, first.slug)] == ["step-000020", "step-000040", "step-000050"]
    train(compiled(path), RunOptions(store=str(store), resume="20", max_steps=30, signals=False), say=lambda _: None)
    assert [c.name for c in list_checkpoints(s, first.slug) if c.valid] == ["step-000030", "step-000040", "step-000050"]
    assert resolve(s, first.slug, "latest")[0] == "step-000030"
    params = store / first.slug / "checkpoints" / "step-000030" / "params.safetensors"
    params.write_bytes(params.read_bytes()[:100])
    name, warnings = resolve(s, first.slug, "latest")
    assert name == "step-000050" and any("step-000030" in w for w in warnings)
