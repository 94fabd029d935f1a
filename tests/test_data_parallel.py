"""Data parallel on a real local Ray with Ray's GLOO collective (CPU ranks): W=2 equals W=1
up to reduction order, a W=2 checkpoint resumes on W=1, bf16 buckets stay close, and a rank
left alone at the rendezvous fails clearly instead of hanging."""

from __future__ import annotations

import json
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
from sexpgpu.runtime.attempt import RunOptions, train
from sexpgpu.runtime.store import Store

ray = pytest.importorskip("ray")
pytest.importorskip("torch")  # Ray's GLOO collective runs on torch.distributed
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one local Ray cluster at a time

RUN = (REPO / "examples" / "charlm.lisp").read_text().replace(
    "(defrun :steps 600 :seed 0 :log-every 50)", "(defrun :steps 60 :seed 0 :log-every 5 :checkpoint (:every 20 :keep 3))"
).replace(
    '(defknob lr 0.003 :doc "AdamW learning rate")', '(defknob lr 0.003 :doc "AdamW learning rate")\n(defsweep one :lr (0.003))'
)


@pytest.fixture(scope="module")
def ray_cluster():  # type: ignore[no-untyped-def]
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    (tmp_path / ".git").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "stdlib-docstrings.txt").write_bytes((REPO / "examples" / "data" / "stdlib-docstrings.txt").read_bytes())
    path = tmp_path / "lm.lisp"
    path.write_text(RUN)
    return path


def final(store: Path, slug: str) -> tuple[dict[str, np.ndarray], int]:
    s = Store.open(str(store))
    name = [c.name for c in list_checkpoints(s, slug) if c.valid][-1]
    params, _, state = load_checkpoint(s, slug, name)
    return params, state.step


def losses(store: Path, slug: str) -> dict[int, float]:
    series: dict[int, float] = {}
    for line in (store / slug / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["kind"] == "resume":
            series = {s: v for s, v in series.items() if s <= event["from_step"]}
        if event["kind"] == "step":
            assert event["step"] not in series, f"step {event['step']} logged twice"
            series[event["step"]] = event["loss"]
    return series


def single_device(path: Path, store: Path, max_steps: Any = None) -> str:
    experiment = compile_file(path, Selection(sweep="one", point=0)).experiment
    assert experiment is not None
    return train(experiment, RunOptions(store=str(store), signals=False, max_steps=max_steps), say=lambda _: None).slug


def ranks(path: Path, store: Path, max_steps: Any = None, on_launch: Any = None, **allreduce: Any) -> Any:
    from orchestration.driver import Driver
    from orchestration.gang import Devices
    from workers.collective import AllReduceSpec

    devices = Devices(count=2, allreduce=AllReduceSpec(**allreduce))
    from orchestration.driver import sweep_points
    from sexpgpu.session import Session, Settings

    compiled, refusal = Session(Settings(world=2)).compile_sweep(path, "one", 1)
    assert refusal is None, refusal
    ledger = Driver(path, "one", str(store), None, None, max_steps, say=lambda _: None, devices=devices, on_launch=on_launch).run(sweep_points(compiled, [{"lr": 0.003}]))
    point = ledger.points[0]
    assert point.state == ("finished" if max_steps is None else "truncated"), point
    return point


def close(a: dict[str, np.ndarray], b: dict[str, np.ndarray], rtol: float) -> float:
    worst = 0.0
    for name, value in a.items():
        worst = max(worst, float(np.max(np.abs(value - b[name])) / (np.max(np.abs(value)) + 1e-12)))
    assert worst <= rtol, worst
    return worst


def test_two_ranks_equal_one_device_and_their_checkpoint_resumes_on_one(project: Path, ray_cluster: Any) -> None:
    one = project.parent / "one"
    slug = single_device(project, one)
    # tiny buckets: the gradients travel in many buckets, as a large model's would
    two = project.parent / "two"
    point = ranks(project, two, bucket_mb=0.01)
    assert point.slug == slug, "the number of ranks is not part of the run's identity"
    params_one, step = final(one, slug)
    params_two, step_two = final(two, slug)
    assert step == step_two == 60
    close(params_one, params_two, 1e-4)
    series_one, series_two = losses(one, slug), losses(two, slug)
    assert sorted(series_one) == sorted(series_two) == list(range(5, 61, 5))
    for s in series_one:
        assert abs(series_one[s] - series_two[s]) <= 1e-4 * abs(series_one[s]), (s, series_one[s], series_two[s])
    info = json.loads((two / slug / "run.json").read_text())
    assert info["devices"] == ["cpu", "cpu"]

    # rank 1 SIGKILLed mid-run: the gang is a preemption, a new gang resumes bit-identically
    def kill_rank_1(record: Any, gang: Any) -> None:
        if record.attempts == 1:
            pid = ray.get(gang.workers[1].where.remote())["pid"]
            threading.Timer(1.5, lambda: os.kill(pid, signal.SIGKILL)).start()

    killed = project.parent / "killed"
    point = ranks(project, killed, on_launch=kill_rank_1, bucket_mb=0.01)
    assert point.attempts == 2 and point.preemptions == 1, point
    params_killed, _ = final(killed, slug)
    for name, value in params_two.items():
        assert value.tobytes() == params_killed[name].tobytes(), name
    assert sorted(losses(killed, slug)) == list(range(5, 61, 5))

    # W=2 stops at step 30 (checkpoints 20 and 30), then one device resumes it to the end
    mixed = project.parent / "mixed"
    ranks(project, mixed, max_steps=30)
    assert final(mixed, slug)[1] == 30
    single_device(project, mixed)
    params_mixed, step_mixed = final(mixed, slug)
    assert step_mixed == 60
    close(params_one, params_mixed, 1e-4)
    assert sorted(losses(mixed, slug)) == list(range(5, 61, 5))


def test_bf16_gradient_buckets_stay_close(project: Path, ray_cluster: Any) -> None:
    one = project.parent / "one"
    slug = single_device(project, one, max_steps=30)
    bf16 = project.parent / "bf16"
    ranks(project, bf16, max_steps=30, dtype="bf16")
    a, b = losses(one, slug), losses(bf16, slug)
    for s in a:
        assert abs(a[s] - b[s]) <= 1e-2 * abs(a[s]), (s, a[s], b[s])


def test_a_rank_alone_at_the_rendezvous_fails_clearly(project: Path, ray_cluster: Any) -> None:
    from sexpgpu.bundle import make_bundle
    from workers.collective import RankSpec
    from workers.train_worker import TRAIN_WORKER_OPTIONS, AttemptRequest, TrainWorker

    bundle = project.parent / "bundle"
    make_bundle(project, Selection(sweep="one", point=0), str(bundle))
    worker = TrainWorker.options(num_cpus=1, max_restarts=0, **TRAIN_WORKER_OPTIONS).remote({})
    spec = RankSpec(rank=1, world=2, group="lonely", rendezvous_timeout_s=3.0)
    started = time.time()
    outcome = ray.get(worker.run.remote(AttemptRequest(bundle=str(bundle), store=str(project.parent / "store")), spec), timeout=120)
    assert outcome.exit_code == 75 and outcome.preempted and outcome.rank == 1, outcome  # retried like a lost node
    assert "rendezvous" in outcome.reason and "3 s" in outcome.reason, outcome.reason
    assert time.time() - started < 60
    ray.kill(worker)


def test_a_batch_the_ranks_cannot_split_does_not_check(project: Path) -> None:
    result = compile_file(project, Selection(sweep="one", point=0), world=3)
    assert result.experiment is None
    message = next(d.headline() for d in result.diagnostics if d.severity == "error")
    assert "C008" in message and "does not split over 3 data-parallel ranks" in message, message
