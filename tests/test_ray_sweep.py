"""The Ray driver on a real local Ray cluster: the same per-point results as the local
sweep, and a worker killed mid-run is a preemption that resumes to identical parameters."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import REPO
from sexpgpu.compile.pipeline import compile_file
from sexpgpu.ir.experiment import Selection
from sexpgpu.runtime.checkpoint import list_checkpoints, load_checkpoint
from sexpgpu.runtime.loop import RunOptions, train
from sexpgpu.runtime.store import Store

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

RUN = (REPO / "examples" / "charlm.lisp").read_text().replace(
    "(defrun :steps 600 :seed 0 :log-every 50)", "(defrun :steps 400 :seed 0 :log-every 20 :checkpoint (:every 20 :keep 2))"
).replace(
    '(defknob lr 0.003 :doc "AdamW learning rate")', '(defknob lr 0.003 :doc "AdamW learning rate")\n(defsweep lrs :lr (0.003 0.001))'
)


@pytest.fixture(scope="module")
def ray_cluster():  # type: ignore[no-untyped-def]
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def final(store: Path, slug: str) -> dict[str, np.ndarray]:
    s = Store.open(str(store))
    name = [c.name for c in list_checkpoints(s, slug) if c.valid][-1]
    params, _, state = load_checkpoint(s, slug, name)
    assert state.step == 400
    return params


def test_ray_sweep_equals_the_local_sweep_and_survives_a_killed_worker(tmp_path: Path, ray_cluster: Any) -> None:
    from orchestration.driver import Driver

    (tmp_path / ".git").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "stdlib-docstrings.txt").write_bytes((REPO / "examples" / "data" / "stdlib-docstrings.txt").read_bytes())
    path = tmp_path / "lm.lisp"
    path.write_text(RUN)
    local = tmp_path / "local"
    for point in range(2):
        experiment = compile_file(path, Selection(sweep="lrs", point=point)).experiment
        assert experiment is not None
        train(experiment, RunOptions(store=str(local), signals=False), say=lambda _: None)

    killed: list[int] = []

    def preempt_first(record: Any, gang: Any) -> None:
        worker = gang.workers[0]
        if record.point == 0 and record.attempts == 1:
            def kill() -> None:
                pid = ray.get(worker.where.remote())["pid"]
                time.sleep(1.0)
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

            threading.Thread(target=kill, daemon=True).start()

    remote = tmp_path / "remote"
    ledger = Driver(path, "lrs", str(remote), None, None, None, say=lambda _: None, on_launch=preempt_first).run([(0, {"lr": 0.003}, None), (1, {"lr": 0.001}, None)])
    assert [p.state for p in ledger.points] == ["finished", "finished"]
    assert killed and ledger.points[0].attempts >= 2 and ledger.points[0].preemptions >= 1
    for p in ledger.points:
        ours, theirs = final(local, p.slug), final(remote, p.slug)
        for name, value in ours.items():
            assert value.tobytes() == theirs[name].tobytes(), (p.point, name)
    again = Driver(path, "lrs", str(remote), None, None, None, say=lambda _: None).run([(0, {"lr": 0.003}, None), (1, {"lr": 0.001}, None)])
    assert [p.attempts for p in again.points] == [p.attempts for p in ledger.points], "finished points are skipped"
