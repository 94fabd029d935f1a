"""The Ray driver on a real local Ray cluster (and a real S3 endpoint on loopback): a 4-point
sweep equals the local sweep point by point even with workers SIGKILLed after they published a checkpoint,
two drivers on one sweep never run a point twice, and the store going away for a while
during a sweep loses nothing."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from conftest import REPO, wait_for
from sexpgpu.compile.pipeline import compile_file
from sexpgpu.ir.experiment import Selection
from sexpgpu.runtime.checkpoint import list_checkpoints, load_checkpoint
from sexpgpu.runtime.attempt import RunOptions, train
from sexpgpu.outcome import Exit
from sexpgpu.runtime.runfolder import RunFolder, run_slug
from sexpgpu.runtime.store import Store
from sexpgpu.runtime.threads import blas_threads, plan_threads
from sexpgpu.session import Session, Settings

ray = pytest.importorskip("ray")
from orchestration.driver import SweepPoint, sweep_points  # noqa: E402 (needs Ray)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one local Ray cluster at a time

WORKER_CPUS = 1  # what orchestration/gang.py asks of Ray for a CPU rank
LRS = [0.003, 0.002, 0.001, 0.0005]
STEPS = 300
RUN = (REPO / "examples" / "charlm.lisp").read_text().replace(
    "(defrun :steps 600 :seed 0 :log-every 50)", f"(defrun :steps {STEPS} :seed 0 :log-every 10 :checkpoint (:every 20 :keep 2))"
).replace(
    '(defknob lr 0.003 :doc "AdamW learning rate")', f'(defknob lr 0.003 :doc "AdamW learning rate")\n(defsweep lrs :lr ({" ".join(map(str, LRS))}))'
)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    (root / ".git").mkdir()
    (root / "data").mkdir()
    (root / "data" / "stdlib-docstrings.txt").write_bytes((REPO / "examples" / "data" / "stdlib-docstrings.txt").read_bytes())
    path = root / "lm.lisp"
    path.write_text(RUN)
    return path


@pytest.fixture(scope="module")
def points(project: Path) -> list[SweepPoint]:
    """Every point compiled once, as `sexpgpu sweep --ray` hands them to the driver."""
    compiled, refusal = Session(Settings()).compile_sweep(project, "lrs", len(LRS))
    assert refusal is None, refusal
    return sweep_points(compiled, [{"lr": lr} for lr in LRS])


@pytest.fixture(scope="module")
def local(project: Path) -> dict[str, dict[str, np.ndarray]]:
    """The same sweep run locally, point by point, on the device the workers use (`cpu`, the
    compiled CPU device) and with their thread count (the CPUs Ray gives a worker, one: the
    count changes a product's last bits, docs/devices.md): slug -> final parameters."""
    from sexpgpu.runtime.devices import open_device

    store = project.parent / "local"
    finals = {}
    device, backend = open_device("cpu")
    plan = plan_threads([], requested=WORKER_CPUS)
    for point in range(len(LRS)):
        experiment = compile_file(project, Selection(sweep="lrs", point=point)).experiment
        assert experiment is not None
        with blas_threads(plan, backend):
            slug = train(experiment, RunOptions(store=str(store), signals=False, device=device, backend=backend, threads=plan), say=lambda _: None).slug
        assert slug is not None
        finals[slug] = final(Store.open(str(store)), slug)
    return finals


def final(store: Store, slug: str) -> dict[str, np.ndarray]:
    name = [c.name for c in list_checkpoints(store, slug) if c.valid][-1]
    params, _, state = load_checkpoint(store, slug, name)
    assert state.step == STEPS
    return params


def assert_same_as_local(store: Store, ledger: Any, local: dict[str, dict[str, np.ndarray]], attempts: bool = True) -> None:
    assert [p.state for p in ledger.points] == ["finished"] * len(LRS), [(p.state, p.reason) for p in ledger.points]
    assert sorted(p.slug for p in ledger.points) == sorted(local)
    for p in ledger.points:
        theirs = final(store, p.slug)
        for name, value in local[p.slug].items():
            assert value.tobytes() == theirs[name].tobytes(), (p.point, name)
        assert not attempts or p.attempts == 1 + p.preemptions, p


def assert_one_series(store: Store, slug: str) -> None:
    """The run's events read as one series: every logged step once, in order, to the end."""
    series: dict[int, float] = {}
    for event in events_of(store, slug):
        if event["kind"] == "resume":
            series = {s: v for s, v in series.items() if s <= event["from_step"]}
        elif event["kind"] == "step":
            assert event["step"] not in series, (slug, event["step"])
            series[event["step"]] = event["loss"]
    assert sorted(series) == list(range(10, STEPS + 1, 10)), (slug, sorted(series))


def events_of(store: Store, slug: str) -> list[dict[str, Any]]:
    lines: list[str] = []
    if store.exists(f"{slug}/events.jsonl"):
        lines = store.read_text(f"{slug}/events.jsonl").splitlines()
    else:
        for name in sorted(store.list(f"{slug}/events")):
            lines += store.read_text(name).splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_a_sweep_with_workers_killed_after_a_checkpoint_equals_the_local_sweep(project: Path, points: list[SweepPoint], ray_cluster: Any, local: Any) -> None:
    from orchestration.driver import Driver

    launched: list[tuple[Any, Any, int]] = []  # (point record, gang, its latest checkpoint's step at launch)
    killed: list[int] = []
    done = threading.Event()
    remote = project.parent / "remote"

    def latest(slug: str) -> int:
        valid = [c.step for c in list_checkpoints(Store.open(str(remote)), slug) if c.valid] if remote.exists() else []
        return max(valid, default=-1)

    def on_launch(record: Any, gang: Any) -> None:
        launched.append((record, gang, latest(record.slug)))

    def killer() -> None:
        """Each attempt is killed once it has published a checkpoint of its own (an event,
        not a delay), until four workers died: the next attempt must resume from it."""
        struck: set[int] = set()
        while not done.is_set() and len(killed) < 4:
            for record, gang, base in list(launched):
                if id(gang) in struck or not gang.refs or gang.stopped or latest(record.slug) <= base:
                    continue
                struck.add(id(gang))
                try:
                    pid = ray.get(gang.workers[0].where.remote(), timeout=5)["pid"]
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except Exception:  # that worker finished (or died) in the meantime
                    pass
            time.sleep(0.05)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        ledger = Driver(project, "lrs", str(remote), None, None, None, say=lambda _: None, on_launch=on_launch).run(points)
    finally:
        done.set()
        thread.join(10)
    store = Store.open(str(remote))
    assert len(killed) >= 2, "the killer found no worker to kill"
    assert sum(p.preemptions for p in ledger.points) >= 2
    assert_same_as_local(store, ledger, local)
    for p in ledger.points:
        assert_one_series(store, p.slug)
    stored = json.loads((remote / "sweeps" / "lm.lrs" / "sweep.json").read_text())
    assert [(p["state"], p["attempts"]) for p in stored["points"]] == [("finished", p.attempts) for p in ledger.points]

    again = Driver(project, "lrs", str(remote), None, None, None, say=lambda _: None).run(points)
    assert [p.attempts for p in again.points] == [p.attempts for p in ledger.points], "finished points are skipped"


def test_two_drivers_on_one_sweep_never_run_a_point_twice(project: Path, points: list[SweepPoint], ray_cluster: Any, local: Any) -> None:
    from orchestration.driver import Driver

    store_dir = project.parent / "shared"
    launches: list[tuple[str, int]] = []
    lock = threading.Lock()
    results: dict[str, Any] = {}

    def drive(name: str) -> None:
        def record(r: Any, _gang: Any) -> None:
            with lock:
                launches.append((name, r.point))

        results[name] = Driver(project, "lrs", str(store_dir), None, None, None, say=lambda _: None, on_launch=record).run(points)

    threads = [threading.Thread(target=drive, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    points = [p for _, p in launches]
    assert sorted(points) == [0, 1, 2, 3], f"each point launched exactly once, got {launches}"
    for name in ("a", "b"):
        assert [p.state for p in results[name].points] == ["finished"] * 4, name
    assert_same_as_local(Store.open(str(store_dir)), results["a"], local, attempts=False)
    for name, point in launches:  # the driver that ran a point recorded its one attempt
        assert results[name].points[point].attempts == 1, (name, results[name].points[point])


def test_the_store_going_away_during_a_ray_sweep_loses_nothing(project: Path, points: list[SweepPoint], ray_cluster: Any, local: Any) -> None:
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    import s3fs

    from orchestration.driver import Driver
    from s3_server import MotoS3, PausableProxy, make_bucket, patched_env, s3_env

    with MotoS3() as moto, PausableProxy(moto.port) as proxy:
        env = s3_env(proxy.endpoint)
        s3fs.S3FileSystem.clear_instance_cache()
        with patched_env(env):
            bucket = make_bucket(None, proxy.endpoint)
            url = f"s3://{bucket}/runs"
            outages: list[float] = []

            def flaky(record: Any, _gang: Any) -> None:
                if record.point == 1 and record.attempts == 1:
                    def training() -> bool:
                        status = RunFolder(Store.open(url), record.slug).read_status()
                        return status is not None and status.step >= 20

                    def outage() -> None:
                        wait_for(training, "point 1 training")  # the outage falls mid-run, whatever the machine's speed
                        proxy.pause()
                        outages.append(time.time())
                        time.sleep(9.0)  # longer than the store's own retries (about 6 s)
                        proxy.resume()

                    threading.Thread(target=outage, daemon=True).start()

            ledger = Driver(project, "lrs", url, None, None, None, say=lambda _: None, on_launch=flaky).run(points[:2])
            assert outages, "the outage did not happen"
            store = Store.open(url)
            assert [p.state for p in ledger.points] == ["finished", "finished"], [(p.state, p.reason) for p in ledger.points]
            for p in ledger.points:
                theirs = final(store, p.slug)
                for name, value in local[p.slug].items():
                    assert value.tobytes() == theirs[name].tobytes(), (p.point, name)
                assert_one_series(store, p.slug)
        s3fs.S3FileSystem.clear_instance_cache()


def kill_after_a_checkpoint(store_url: str, record: Any, gang: Any, killed: list[int]) -> threading.Thread:
    """A thread that SIGKILLs GANG's worker once the attempt published a checkpoint of its own
    (an event, not a delay): the worker dies with its buffered events, as on a lost node."""
    def latest() -> int:
        try:
            return max((c.step for c in list_checkpoints(Store.open(store_url), record.slug) if c.valid), default=-1)
        except OSError:
            return -1

    base = latest()

    def kill() -> None:
        wait_for(lambda: latest() > base or gang.stopped, "a checkpoint of the attempt")
        if gang.stopped:
            return
        pid = ray.get(gang.workers[0].where.remote(), timeout=30)["pid"]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def test_a_point_given_up_after_its_preemptions_fails_with_exit_1(project: Path, points: list[SweepPoint], ray_cluster: Any) -> None:
    """--max-preemptions 0 and a worker lost: the point failed, exit 1 (not 75, which would say
    that the same command continues it), and so does the sweep."""
    from orchestration.driver import Driver

    remote = project.parent / "given-up"
    killed: list[int] = []
    threads: list[threading.Thread] = []

    def on_launch(record: Any, gang: Any) -> None:
        if record.attempts == 1:
            threads.append(kill_after_a_checkpoint(str(remote), record, gang, killed))

    ledger = Driver(project, "lrs", str(remote), None, 0, None, say=lambda _: None, on_launch=on_launch).run(points[:1])
    for thread in threads:
        thread.join(30)
    assert killed, "the worker was never killed"
    [point] = ledger.points
    assert (point.state, point.exit_code, point.preemptions) == ("failed", 1, 1), point
    assert "--max-preemptions 0" in point.reason
    assert max((p.exit_code or 0 for p in ledger.points if p.state == "failed"), default=0) == 1  # `sweep --ray`'s exit


def test_a_lost_node_is_one_preemption_and_every_checkpoint_event_reaches_the_log(project: Path, points: list[SweepPoint], ray_cluster: Any) -> None:
    """A node lost: its worker dies after a checkpoint (with its buffered events), and the next
    attempt's worker, placed there before Ray knew, dies before its attempt began. That is one
    loss: with --max-preemptions 1 the point resumes and finishes; the checkpoint it resumed
    from has its event in the log."""
    from orchestration.driver import Driver

    remote = project.parent / "node-lost"
    killed: list[int] = []
    threads: list[threading.Thread] = []
    unstarted: list[Any] = []

    def on_launch(record: Any, gang: Any) -> None:
        if record.attempts == 1:
            threads.append(kill_after_a_checkpoint(str(remote), record, gang, killed))
        elif record.attempts == 2:  # its worker process is still starting: gone before the attempt begins
            ray.kill(gang.workers[0], no_restart=True)
            unstarted.append(gang)

    ledger = Driver(project, "lrs", str(remote), None, 1, None, say=lambda _: None, on_launch=on_launch).run(points[:1])
    for thread in threads:
        thread.join(30)
    assert killed and unstarted, "the loss was not played"
    [point] = ledger.points
    store = Store.open(str(remote))
    everything = events_of(store, point.slug)
    checkpoints = {e["path"] for e in everything if e["kind"] == "checkpoint"}
    resumes = [e for e in everything if e["kind"] == "resume"]
    problems = []  # both, so that each is seen on its own
    if (point.state, point.attempts, point.preemptions) != ("finished", 3, 1):
        problems.append(f"one loss counted as {point.preemptions} preemptions: {point.state} after {point.attempts} attempts ({point.reason})")
    unlogged = [e["checkpoint"] for e in resumes if e["checkpoint"] not in checkpoints]
    if not resumes or unlogged:
        problems.append(f"resumed from checkpoints without their event in the log: {unlogged or 'no resume'} (logged: {sorted(checkpoints)})")
    assert not problems, problems
    assert_one_series(store, point.slug)


def test_the_first_point_trains_while_later_points_are_still_compiling(project: Path, points: list[SweepPoint], ray_cluster: Any) -> None:
    """The driver starts a point as soon as it is handed over: the second point is handed over
    only once the first has logged a step (a driver that compiled and bundled every point
    before training any would never see that step, and the wait fails)."""
    from orchestration.driver import Driver

    remote = project.parent / "streamed"
    store = Store.open(str(remote))

    def stepped(slug: str) -> bool:
        return any(e["kind"] == "step" for e in events_of(store, slug)) if store.exists(slug) else False

    def gated() -> Iterator[SweepPoint]:
        yield points[0]
        slug = run_slug(points[0].compiled.experiment)
        wait_for(lambda: stepped(slug), "a step of point 0 before point 1 is handed over", within_s=240)
        yield points[1]

    ledger = Driver(project, "lrs", str(remote), None, None, 20, say=lambda _: None).run(gated())
    assert [(p.point, p.state) for p in ledger.points] == [(0, "truncated"), (1, "truncated")], [(p.point, p.state, p.reason) for p in ledger.points]


def test_the_workers_are_started_before_the_first_launch(project: Path, points: list[SweepPoint], ray_cluster: Any) -> None:
    """The driver starts the first point's worker as that point's compile begins, and the
    others (one for each point the cluster holds) before its first launch, which takes one of
    them: when the first point is launched the other is there, idle, though no point has
    ended yet (a driver that starts a worker only for a point it launches has none); a sweep
    whose size is known starts no more workers than it has points; a first point that does
    not check leaves no worker behind."""
    from orchestration.driver import Driver, SweepError

    idle_at_launch: list[int] = []
    idle_at_compile: list[int] = []

    def one_point() -> Iterator[SweepPoint]:  # of unknown size
        idle_at_compile.append(len(driver.idle))  # as the first point's compile begins
        yield points[0]

    driver = Driver(project, "lrs", str(project.parent / "warm"), None, None, 20, say=lambda _: None,
                    on_launch=lambda _record, _gang: idle_at_launch.append(len(driver.idle)))
    ledger = driver.run(one_point())
    assert [(p.point, p.state) for p in ledger.points] == [(0, "truncated")], [(p.point, p.state, p.reason) for p in ledger.points]
    assert idle_at_compile == [1], idle_at_compile  # the first point's worker starts while that point compiles
    assert idle_at_launch == [1], idle_at_launch
    assert not driver.idle  # the pool's other worker gave its CPU back once nothing was left to start
    sized = Driver(project, "lrs", str(project.parent / "warm-one"), None, None, 20, say=lambda _: None,
                   on_launch=lambda _record, _gang: idle_at_launch.append(len(sized.idle)))
    assert [p.state for p in sized.run(points[:1]).points] == ["truncated"]
    assert idle_at_launch == [1, 0], idle_at_launch

    def refused_first() -> Iterator[SweepPoint]:
        raise SweepError("sweep lrs: point 0 does not check", Exit.CHECK_FAILED)
        yield points[0]  # never reached

    refused = Driver(project, "lrs", str(project.parent / "warm-refused"), None, None, 20, say=lambda _: None)
    with pytest.raises(SweepError, match="nothing was run"):
        refused.run(refused_first())
    assert not refused.idle  # the worker started for it is let go


def test_a_point_that_does_not_check_stops_the_stream_after_the_points_started(project: Path, points: list[SweepPoint], ray_cluster: Any) -> None:
    """A point found not to check once others run: no later point starts, the started ones
    run to their end, and the sweep ends with that point's refusal and its exit code."""
    from orchestration.driver import Driver, SweepError

    remote = project.parent / "refused-later"
    store = Store.open(str(remote))
    slug = run_slug(points[0].compiled.experiment)

    def refused_second() -> Iterator[SweepPoint]:
        yield points[0]
        wait_for(lambda: store.exists(f"{slug}/status.json"), "point 0 started", within_s=240)
        raise SweepError("sweep lrs: point 1 does not check", Exit.CHECK_FAILED)
        yield points[1]  # never reached

    with pytest.raises(SweepError) as refusal:
        Driver(project, "lrs", str(remote), None, None, 20, say=lambda _: None).run(refused_second())
    assert refusal.value.code == Exit.CHECK_FAILED
    assert "point 1 does not check; the points started before it ran to their end" in refusal.value.reason
    status = RunFolder(store, slug).read_status()
    assert status is not None and status.state == "truncated", status
    assert not store.exists(run_slug(points[1].compiled.experiment))


def test_the_driver_reads_a_point_in_a_few_requests_on_s3(project: Path, points: list[SweepPoint], ray_cluster: Any) -> None:
    """Per point the driver reads the run's status when it is handed over and when it is
    leased (one GET each: no HEAD first, no LIST after a missing one), takes its free lease in
    one create, lists no checkpoints for a point that never began, and reads no status after
    an attempt that ended itself; its bundles are written on its own client."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from urllib.parse import unquote

    from orchestration.driver import Driver
    from s3_server import MotoS3, make_bucket, patched_env, s3_env

    with MotoS3() as moto, patched_env(s3_env(moto.endpoint)):
        url = f"s3://{make_bucket(None, moto.endpoint)}/runs"
        driver = Driver(project, "lrs", url, None, None, 1, say=lambda _: None)
        sent: list[str] = []

        def count(request: Any, **_: Any) -> None:
            path, _, query = str(request.url).partition("?")
            listed = re.search(r"prefix=([^&]*)", query)
            sent.append(f"LIST {unquote(listed.group(1))}" if listed else f"{request.method} {path.split('/runs/', 1)[-1]}")

        driver.store.fs.connect()
        driver.store.fs.s3.meta.events.register("before-send.s3", count)
        ledger = driver.run(points[:2])
        driver.store.fs.s3.meta.events.unregister("before-send.s3", count)
    assert [p.state for p in ledger.points] == ["truncated", "truncated"], [(p.state, p.reason) for p in ledger.points]
    for p in ledger.points:
        about = [r for r in sent if p.slug in r]
        assert [r for r in about if "status.json" in r] == [f"GET {p.slug}/status.json"] * 2, about
        assert not [r for r in about if "/checkpoints" in r], about
    assert not [r for r in sent if r.startswith("LIST") and "/leases/" in r], sent
    # every bundle written on the driver's own client (a client per bundle cost the driver
    # most of its CPU per point and a third of its memory)
    assert {f"PUT sweeps/lm.lrs/bundles/point-{p.point:04d}/bundle.json" for p in ledger.points} <= set(sent), sent
