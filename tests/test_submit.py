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

from conftest import REPO, wait_for
from sexpgpu.bundle import make_bundle
from sexpgpu.ir.experiment import Selection
from sexpgpu.runtime.store import Store

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one local Ray cluster at a time


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
    actor = submit(str(tmp_path / "bundle"), str(store), manifest.slug, None, {})
    wait_for(lambda: ray.get(actor.current_worker.remote()) is not None, "the supervisor started an attempt")
    worker = ray.get(actor.current_worker.remote())
    pid = ray.get(worker.where.remote())["pid"]
    status_file = store / manifest.slug / "status.json"
    wait_for(lambda: status_file.exists() and json.loads(status_file.read_text()).get("step", 0) > 0, "the first attempt logged a step")
    os.kill(pid, signal.SIGKILL)
    record = ended(store / manifest.slug / "submit.json")
    assert record["state"] == "finished" and record["attempts"] >= 2 and record["preemptions"] >= 1, record
    status = json.loads((store / manifest.slug / "status.json").read_text())
    assert status["state"] == "finished" and status["step"] == 600
    wait_for(lambda: supervisor_gone(actor), "a job that ended takes its supervisor with it")  # it kills itself just after its last record


def supervisor_gone(actor: Any) -> bool:
    try:
        ray.get(actor.current_worker.remote(), timeout=60)
    except ray.exceptions.RayActorError:
        return True
    return False


def ended(path: Path, within_s: float = 240.0) -> dict[str, Any]:
    """The submit record once the supervisor wrote a final state (the event waited for)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if path.exists():
            record: dict[str, Any] = json.loads(path.read_text())
            if record["state"] in ("finished", "failed"):
                return record
        time.sleep(0.2)
    raise AssertionError(f"{path} never recorded an end")


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


def test_a_cluster_started_before_the_credentials_were_exported_still_runs_the_job(tmp_path: Path, ray_cluster: Any) -> None:
    """The README's order: the cluster's processes have no AWS_* variables (they started
    first), the submitter has them. The supervisor takes the submitter's store settings, so
    submit.json and the run land in S3; and a store the supervisor cannot write makes
    `submit` exit 4 instead of reporting success."""
    from s3_server import MotoS3, make_bucket, s3_env

    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"} & set(os.environ), "the cluster must start without credentials"
    path = tmp_path / "q.lisp"
    (tmp_path / ".git").mkdir()
    path.write_text((REPO / "examples" / "quickstart.lisp").read_text().replace("(defrun :steps 300 :seed 0)", "(defrun :steps 20 :seed 0)"))
    bundle = tmp_path / "bundle"
    env = dict(os.environ)
    assert subprocess.run([sys.executable, "-m", "sexpgpu", "bundle", str(path), "-o", str(bundle)], env=env, capture_output=True).returncode == 0
    address = ray.get_runtime_context().gcs_address
    with MotoS3() as moto:
        client = {**env, **s3_env(moto.endpoint)}
        bucket = make_bucket(None, moto.endpoint)
        store = f"s3://{bucket}/runs"
        done = subprocess.run([sys.executable, "-m", "sexpgpu", "submit", str(bundle), "--ray", address, "--store", store, "--json"],
                              capture_output=True, text=True, env=client, timeout=180)
        assert done.returncode == 0, done.stderr
        slug = json.loads(done.stdout)["slug"]
        os.environ.update(s3_env(moto.endpoint))  # this process reads with the submitter's credentials
        try:
            reader = Store.open(store)
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and not (reader.exists(f"{slug}/submit.json") and json.loads(reader.read_text(f"{slug}/submit.json"))["state"] == "finished"):
                time.sleep(0.2)
            assert json.loads(reader.read_text(f"{slug}/submit.json"))["state"] == "finished"
            assert json.loads(reader.read_text(f"{slug}/status.json"))["state"] == "finished"
        finally:
            for key in s3_env(moto.endpoint):
                os.environ.pop(key, None)
        refused = subprocess.run([sys.executable, "-m", "sexpgpu", "submit", str(bundle), "--ray", address, "--store", "s3://no-such-bucket/runs"],
                                 capture_output=True, text=True, env=client, timeout=180)
        assert refused.returncode == 4 and "cannot start here" in refused.stderr, refused.stderr
