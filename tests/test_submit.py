"""submit: a detached supervisor runs a bundle and restarts a killed worker from the store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO
from sexpgpu.bundle import make_bundle
from sexpgpu.ir.experiment import Selection
from sexpgpu.runtime.store import Store

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_cluster():  # type: ignore[no-untyped-def]
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="sexpgpu-test")
    yield
    ray.shutdown()


def test_submitted_run_survives_a_killed_worker(tmp_path: Path, ray_cluster: Any) -> None:
    from orchestration.submit import submit

    (tmp_path / ".git").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "stdlib-docstrings.txt").write_bytes((REPO / "examples" / "data" / "stdlib-docstrings.txt").read_bytes())
    run_file = tmp_path / "lm.lisp"
    run_file.write_text((REPO / "examples" / "charlm.lisp").read_text().replace("(defrun :steps 600 :seed 0 :log-every 50)", "(defrun :steps 600 :seed 0 :log-every 20 :checkpoint (:every 20 :keep 2))"))
    manifest, _ = make_bundle(run_file, Selection(), str(tmp_path / "bundle"))
    store = tmp_path / "runs"
    actor, ref = submit(str(tmp_path / "bundle"), str(store), manifest.slug, None, {})
    worker = None
    for _ in range(100):
        worker = ray.get(actor.current_worker.remote())
        if worker is not None:
            break
        time.sleep(0.1)
    assert worker is not None
    pid = ray.get(worker.where.remote())["pid"]
    time.sleep(1.0)
    os.kill(pid, signal.SIGKILL)
    result = ray.get(ref, timeout=240)
    assert result.state == "finished" and result.attempts >= 2 and result.preemptions >= 1
    record = json.loads(Store.open(str(store)).read_text(f"{manifest.slug}/submit.json"))
    assert record["state"] == "finished"
    status = json.loads((store / manifest.slug / "status.json").read_text())
    assert status["state"] == "finished" and status["step"] == 600
    ray.kill(actor)


def test_submit_from_the_command_line_then_disconnect_and_read_the_status(tmp_path: Path, ray_cluster: Any) -> None:
    """The submitter is another process that exits at once; the run (two data-parallel
    ranks) goes on in the cluster and is read back from the store with `sexpgpu status`."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "stdlib-docstrings.txt").write_bytes((REPO / "examples" / "data" / "stdlib-docstrings.txt").read_bytes())
    run_file = tmp_path / "lm.lisp"
    run_file.write_text((REPO / "examples" / "charlm.lisp").read_text().replace("(defrun :steps 600 :seed 0 :log-every 50)", "(defrun :steps 200 :seed 0 :log-every 20 :checkpoint (:every 50 :keep 2))"))
    bundle = tmp_path / "bundle"
    env = dict(os.environ)
    made = subprocess.run([sys.executable, "-m", "sexpgpu", "bundle", str(run_file), "-o", str(bundle), "--json"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    store = tmp_path / "runs"
    address = ray.get_runtime_context().gcs_address
    started = time.time()
    submitted = subprocess.run([sys.executable, "-m", "sexpgpu", "submit", str(bundle), "--ray", address, "--store", str(store), "--devices", "2", "--json"],
                               capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    run = json.loads(submitted.stdout)["run"]
    state = None
    while time.time() - started < 240:
        status = subprocess.run([sys.executable, "-m", "sexpgpu", "status", run, "--json"], capture_output=True, text=True, env=env, cwd=tmp_path)
        if status.returncode == 0:
            state = json.loads(status.stdout)
            if state["state"] in ("finished", "failed"):
                break
        time.sleep(1.0)
    assert state is not None and state["state"] == "finished" and state["step"] == 200, state
    info = json.loads((store / json.loads(submitted.stdout)["slug"] / "run.json").read_text())
    assert info["devices"] == ["cpu", "cpu"]
