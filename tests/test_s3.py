"""The store on S3, against a real S3 HTTP endpoint on loopback (moto's server), never a mocked
client: files, atomic publish, event segments, retries through an outage, and whole runs
written to `s3://bucket/runs` and read back (through the API and the CLI).

A pausable TCP proxy sits in front of moto, so an "outage" (connections refused, open ones
cut) keeps the data that moto holds in memory. Clients find the server through
`AWS_ENDPOINT_URL` and test credentials in the environment (the standard chain), with
botocore's own retries off (`AWS_MAX_ATTEMPTS=1`), so the store's `RetryPolicy` is the only
retry loop and outages take a predictable time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

import pytest

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e .[test])")
pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e .[test])")
pytest.importorskip("boto3", reason="boto3 is not installed (pip install -e .[test])")

import s3fs  # noqa: E402

from conftest import REPO  # noqa: E402
from s3_server import MotoS3, PausableProxy, boto3_client, make_bucket, patched_env, s3_env  # noqa: E402
from sexpgpu.results.readers import RunReaders  # noqa: E402
from sexpgpu.runtime import store as store_module  # noqa: E402
from sexpgpu.runtime.events import EventLog, StepEvent, read_events  # noqa: E402
from sexpgpu.runtime.runfolder import RunFolder  # noqa: E402
from sexpgpu.runtime.status import StatusWriter, read_status  # noqa: E402
from sexpgpu.runtime.store import RetryPolicy, Store, StoreError  # noqa: E402

QUICKSTART = REPO / "examples" / "quickstart.lisp"

# Outlasts a 1 s outage: waits 0.1 0.2 0.4 0.5 0.5 ... (about 3.7 s over 10 attempts).
PATIENT = RetryPolicy(attempts=10, base_delay=0.1, max_delay=0.5)
# Gives up within a few hundred ms.
BRIEF = RetryPolicy(attempts=3, base_delay=0.02, max_delay=0.05)


@dataclass
class S3:
    """One test's view of the server: the proxy to pause, a fresh bucket, the environment."""

    proxy: PausableProxy
    bucket: str
    env: dict[str, str]

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def store(self, prefix: str = "prefix", retry: RetryPolicy = PATIENT) -> Store:
        return Store.open(self.url(prefix), retry=retry)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[MotoS3, PausableProxy]]:
    """moto's server and a proxy in front of it, both on 127.0.0.1, for this module."""
    with MotoS3() as moto, PausableProxy(moto.port) as proxy:
        yield moto, proxy


@pytest.fixture
def s3(server: tuple[MotoS3, PausableProxy]) -> Iterator[S3]:
    """A fresh bucket behind the proxy, the client environment set, no cached filesystem."""
    _, proxy = server
    proxy.resume()
    env = {**s3_env(proxy.endpoint), "AWS_MAX_ATTEMPTS": "1", "AWS_RETRY_MODE": "standard"}
    s3fs.S3FileSystem.clear_instance_cache()  # one made for another endpoint or bucket
    with patched_env(env):
        bucket = make_bucket(None, proxy.endpoint)
        try:
            yield S3(proxy=proxy, bucket=bucket, env=env)
        finally:
            proxy.resume()
            s3fs.S3FileSystem.clear_instance_cache()


class Sleeps:
    """A RetryPolicy sleep that records every backoff (and really sleeps)."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        time.sleep(seconds)


def policy(base: RetryPolicy, sleeps: Sleeps) -> RetryPolicy:
    return RetryPolicy(base.attempts, base.base_delay, base.max_delay, sleep=sleeps)


def raw_keys(s3: S3) -> list[str]:
    """Every object key in the bucket, straight from S3 (temp names included)."""
    listed = boto3_client(s3.proxy.endpoint).list_objects_v2(Bucket=s3.bucket)
    return sorted(item["Key"] for item in listed.get("Contents", []))


# ---------------------------------------------------------------------------------------------
# Files


def test_open_uses_the_endpoint_and_credentials_from_the_environment(s3: S3) -> None:
    store = s3.store()
    assert not store.is_local
    assert store.url == f"s3://{s3.bucket}/prefix"
    store.write_text("hello.txt", "hi")
    # A client that knows nothing of the store sees the object at bucket/prefix/...
    assert raw_keys(s3) == ["prefix/hello.txt"]


def test_write_read_list_exists_delete(s3: S3) -> None:
    store = s3.store()
    store.write_bytes("a/one.bin", b"\x00\x01\x02")
    store.write_text("a/two.txt", "zwei")
    store.write_json("b/three.json", {"x": 1.5, "bad": float("nan")})
    assert store.read_bytes("a/one.bin") == b"\x00\x01\x02"
    assert store.read_text("a/two.txt") == "zwei"
    assert store.read_json("b/three.json") == {"x": 1.5, "bad": None}
    assert store.list() == ["a/one.bin", "a/two.txt", "b/three.json"]
    assert store.list("a") == ["a/one.bin", "a/two.txt"]
    assert store.list("nothing-here") == []
    assert store.exists("a/one.bin") and store.exists("a") and not store.exists("a/zero.bin")
    with pytest.raises(FileNotFoundError):
        store.read_bytes("a/zero.bin")
    store.delete("a/one.bin")
    assert not store.exists("a/one.bin")
    store.delete("a/one.bin")  # missing is fine
    store.delete("b", recursive=True)
    assert store.list() == ["a/two.txt"]
    # Another store on the same URL (a reader elsewhere) sees the same objects.
    assert Store.open(s3.url("prefix")).read_text("a/two.txt") == "zwei"


def test_publish_is_one_put_of_the_whole_object(s3: S3) -> None:
    store = s3.store()
    store.write_text("status.json", "old\n")
    store.write_text("status.json", "new and longer\n")
    assert store.read_text("status.json") == "new and longer\n"
    # No temporary object is ever made on S3: the replacement is a single PUT.
    assert raw_keys(s3) == ["prefix/status.json"]
    big = os.urandom(3 * 1024 * 1024)
    store.write_bytes("big.bin", big)
    assert store.read_bytes("big.bin") == big
    assert raw_keys(s3) == ["prefix/big.bin", "prefix/status.json"]


def test_events_are_numbered_segments_read_back_in_order(s3: S3) -> None:
    store = s3.store()
    for batch in range(12):
        store.append_lines("run/events", [json.dumps({"n": batch, "i": i}) for i in range(3)])
    names = store.list("run")
    assert names == [f"run/events/{n:06d}.jsonl" for n in range(12)]
    assert not store.exists("run/events.jsonl")
    lines = store.read_lines("run/events")
    assert [json.loads(line)["n"] for line in lines] == [n for n in range(12) for _ in range(3)]
    # A second writer (a resumed attempt) continues the numbering after listing once.
    Store.open(s3.url("prefix")).append_lines("run/events", ['{"n":12,"i":0}'])
    assert store.list("run")[-1] == "run/events/000012.jsonl"
    store.append_lines("run/events", ['{"n":13,"i":0}'])
    assert store.list("run")[-1] == "run/events/000013.jsonl"
    assert [json.loads(line)["n"] for line in store.read_lines("run/events")][-2:] == [12, 13]


def test_event_log_and_status_on_s3(s3: S3) -> None:
    store = s3.store()
    log = EventLog(store, "run", flush_every=4)
    for step in range(1, 11):
        log.emit(StepEvent(step=step, loss=1.0 / step))
    log.close()
    assert [e["step"] for e in read_events(store, "run")] == list(range(1, 11))
    assert len(store.list("run/events")) == 3  # 4 + 4 + 2
    writer = StatusWriter(store, "run")
    writer.update(state="running", step=10, steps=30)
    status = read_status(store, "run")
    assert status is not None and status.state == "running" and status.step == 10


# ---------------------------------------------------------------------------------------------
# Retries


def test_a_write_during_a_short_outage_lands_after_it(s3: S3) -> None:
    sleeps = Sleeps()
    store = s3.store(retry=policy(PATIENT, sleeps))
    store.write_text("before.txt", "1")
    store.append_lines("run/events", ['{"n":0}'])
    started = time.monotonic()
    with s3.proxy.outage(1.0):
        store.write_text("during.txt", "2")  # blocks in retries until the proxy is back
        store.append_lines("run/events", ['{"n":1}', '{"n":2}'])
    assert time.monotonic() - started >= 0.9
    assert sleeps.calls, "the outage never made the store retry"
    assert store.read_text("during.txt") == "2"
    assert store.list() == [
        "before.txt",
        "during.txt",
        "run/events/000000.jsonl",
        "run/events/000001.jsonl",
    ]
    assert store.read_lines("run/events") == ['{"n":0}', '{"n":1}', '{"n":2}']


def test_a_put_that_landed_but_lost_its_reply_is_not_duplicated(s3: S3) -> None:
    store = s3.store(retry=PATIENT)
    store.append_lines("run/events", ['{"n":0}'])
    s3.proxy.drop_response_to(b"PUT ", b"/events/")
    store.append_lines("run/events", ['{"n":1}'])  # the reply is cut; the same key is written again
    assert s3.proxy.dropped == 1
    store.append_lines("run/events", ['{"n":2}'])
    assert store.list("run") == [f"run/events/{n:06d}.jsonl" for n in range(3)]
    assert store.read_lines("run/events") == ['{"n":0}', '{"n":1}', '{"n":2}']


def test_an_outage_past_the_retries_raises_and_loses_no_event(s3: S3) -> None:
    store = s3.store(retry=BRIEF)
    log = EventLog(store, "run", flush_every=3, flush_seconds=3600)
    for step in range(1, 4):
        log.emit(StepEvent(step=step))
    assert log.pending == 0 and log.last_error is None
    s3.proxy.pause()
    try:
        with pytest.raises(StoreError):
            store.write_text("x.txt", "x")
        with pytest.raises(StoreError):
            store.read_text("run/events/000000.jsonl")
        for step in range(4, 11):
            log.emit(StepEvent(step=step))  # flushes quietly fail; the events stay pending
        assert log.pending == 7
        assert isinstance(log.last_error, StoreError)
        with pytest.raises(StoreError):
            log.flush()
        assert log.pending == 7
    finally:
        s3.proxy.resume()
    log.emit(StepEvent(step=11))  # the next due flush writes everything held back
    assert log.pending == 0 and log.last_error is None
    log.close()
    steps = [e["step"] for e in read_events(store, "run")]
    assert steps == list(range(1, 12))  # nothing lost, nothing twice, in order
    columns, lines = RunReaders(store, use_cache=False), RunReaders(store, use_cache=False, use_columns=False)
    assert store.log_segments("run/series")  # the series in columns too, as the lines say
    assert (columns.curves("run"), columns.events_and_count("run")) == (lines.curves("run"), lines.events_and_count("run"))


def test_status_waits_out_a_long_outage(s3: S3) -> None:
    store = s3.store(retry=BRIEF)
    writer = StatusWriter(store, "run")
    writer.update(state="running", step=1, steps=30)
    s3.proxy.pause()
    try:
        writer.update(step=2)  # does not raise: kept for later
        writer.update(step=3, metrics={"loss": 0.5})
        assert isinstance(writer.last_error, StoreError)
        with pytest.raises(StoreError):
            writer.flush()
    finally:
        s3.proxy.resume()
    status = read_status(store, "run")
    assert status is not None and status.step == 1  # the last one published
    writer.flush()
    status = read_status(store, "run")
    assert status is not None and status.step == 3 and status.metrics == {"loss": 0.5}
    assert writer.last_error is None


# ---------------------------------------------------------------------------------------------
# Runs


@pytest.fixture(scope="module")
def experiment() -> Any:
    from sexpgpu.compile.pipeline import compile_file

    result = compile_file(QUICKSTART)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    return result.experiment


def run_options(**fields: Any) -> Any:
    from sexpgpu.runtime.attempt import RunOptions

    return RunOptions(sources={"quickstart.lisp": QUICKSTART.read_bytes()}, **fields)


def steps_of(events: list[dict[str, Any]]) -> list[int]:
    return [e["step"] for e in events if e["kind"] == "step"]


def check_finished_run(store: Store, slug: str, steps: int) -> list[dict[str, Any]]:
    """The run folder of a run that trained its `steps` (a --max-steps cut of the quickstart,
    so `truncated`), read back; its events."""
    folder = RunFolder(store, slug)
    assert folder.exists() and folder.read_run_info().slug == slug
    status = folder.read_status()
    assert status is not None and status.state == "truncated" and status.step == steps
    events = folder.read_events()
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "run.start" and kinds[-1] == "run.end"
    assert steps_of(events) == list(range(10, steps + 1, 10))
    everything = folder.read_events(superseded=True)
    assert len({json.dumps(e, sort_keys=True) for e in everything}) == len(everything)
    names = store.list(slug)
    assert f"{slug}/status.json" in names and f"{slug}/events/000000.jsonl" in names
    assert f"{slug}/events.jsonl" not in names
    return events


def cli_has(verb: str, env: dict[str, str]) -> bool:
    done = subprocess.run(
        [sys.executable, "-m", "sexpgpu", verb, "--help"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )
    return done.returncode == 0


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sexpgpu", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )


def test_a_run_on_s3_reads_back_through_the_store_and_the_cli(s3: S3, experiment: Any) -> None:
    from sexpgpu.runtime.attempt import train

    url = s3.url("runs")
    result = train(experiment, run_options(store=url, max_steps=30), say=lambda _: None)
    assert result.exit_code == 0 and result.steps == 30
    assert result.folder == f"{url}/{result.slug}"
    store = Store.open(url)
    check_finished_run(store, result.slug, 30)
    assert store.read_json(f"{result.slug}/run.json")["max_steps"] == 30
    assert store.list(f"{result.slug}/source") == [f"{result.slug}/source/quickstart.lisp"]

    env = {**os.environ, **s3.env}
    if not cli_has("status", env):
        pytest.skip("`sexpgpu status` does not exist yet: the store side passed, the CLI is unchecked")
    shown = cli(env, "status", f"{url}/{result.slug}")
    assert shown.returncode == 0, shown.stderr
    assert "truncated" in shown.stdout and "30" in shown.stdout
    if not cli_has("logs", env):
        pytest.skip("`sexpgpu logs` does not exist yet: status was checked, logs is unchecked")
    logs = cli(env, "logs", f"{url}/{result.slug}")
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.strip()


def pausing_at(monkeypatch: pytest.MonkeyPatch, actions: dict[int, Callable[[], None]]) -> None:
    """Run ACTIONS[step] right after the trainer finishes that step."""
    from sexpgpu.runtime.trainer import Trainer

    original = Trainer.train_step

    def train_step(self: Any) -> dict[str, Any]:
        record = original(self)
        action = actions.get(self.step)
        if action is not None:
            action()
        return record

    monkeypatch.setattr(Trainer, "train_step", train_step)


def test_a_run_rides_out_a_short_store_outage(
    s3: S3, experiment: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store goes down at step 10 for a second: the status update of that step waits in
    the store's retries (the default policy) and lands once it is back."""
    from sexpgpu.runtime.attempt import train

    timers: list[threading.Timer] = []

    def outage() -> None:
        s3.proxy.pause()
        timer = threading.Timer(1.0, s3.proxy.resume)
        timer.daemon = True
        timers.append(timer)
        timer.start()

    pausing_at(monkeypatch, {10: outage})
    url = s3.url("runs")
    try:
        result = train(experiment, run_options(store=url, max_steps=30), say=lambda _: None)
    finally:
        for timer in timers:
            timer.cancel()
    assert timers, "the outage never started"
    assert result.exit_code == 0 and result.steps == 30
    assert result.wall_time_s >= 0.9  # it did wait for the store
    check_finished_run(Store.open(url), result.slug, 30)


def resume_once_a_publish_failed(s3: S3, sleeps: Sleeps) -> None:
    """Bring the store back once the publisher's thread met the outage (a retry slept): the
    steps may outrun that thread, so a fixed step would not make the outage happen."""
    deadline = time.monotonic() + 60
    while not sleeps.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    s3.proxy.resume()


def test_a_run_keeps_training_through_a_long_outage_and_loses_nothing(
    s3: S3, experiment: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Down from step 5 to step 25, far past the retries: status updates and events are held
    and published once the store is back; the run finishes with its whole history."""
    from sexpgpu.runtime.attempt import train

    sleeps = Sleeps()

    @dataclass(frozen=True)
    class QuickRetry(RetryPolicy):
        """The loop opens its store with the default policy; this one gives up fast."""

        attempts: int = 2
        base_delay: float = 0.01
        max_delay: float = 0.02
        sleep: Callable[[float], None] = field(default=sleeps, compare=False)

    monkeypatch.setattr(store_module, "RetryPolicy", QuickRetry)
    pausing_at(monkeypatch, {5: s3.proxy.pause, 25: lambda: resume_once_a_publish_failed(s3, sleeps)})
    url = s3.url("runs")
    result = train(experiment, run_options(store=url, max_steps=30), say=lambda _: None)
    assert result.exit_code == 0 and result.steps == 30
    assert sleeps.calls, "the store never failed: the outage did not happen"
    events = check_finished_run(Store.open(url), result.slug, 30)
    assert [e["kind"] for e in events].count("run.start") == 1


def test_a_run_resumes_from_s3(s3: S3, experiment: Any) -> None:
    from sexpgpu.runtime.attempt import RunOptions, train

    if not hasattr(RunOptions(), "resume"):
        pytest.skip("RunOptions has no `resume` yet (checkpoints and resume are being added to loop.py)")
    url = s3.url("runs")
    first = train(experiment, run_options(store=url, max_steps=20), say=lambda _: None)
    assert first.exit_code == 0 and first.steps == 20
    store = Store.open(url)
    assert store.exists(f"{first.slug}/checkpoints/LATEST")
    resumed = train(experiment, run_options(store=url, max_steps=30, resume="latest"), say=lambda _: None)
    assert resumed.exit_code == 0 and resumed.slug == first.slug and resumed.steps == 30
    events = RunFolder(store, first.slug).read_events()
    resumes = [e for e in events if e["kind"] == "resume"]
    assert len(resumes) == 1 and resumes[0]["from_step"] == 20
    assert steps_of(events) == [10, 20, 30]
    status = read_status(store, first.slug)
    assert status is not None and status.state == "truncated" and status.step == 30
    # Bit-exact with a run that was never interrupted (in memory, same file and selection).
    whole = train(experiment, run_options(store=f"memory://s3-resume-{s3.bucket}", max_steps=30), say=lambda _: None)
    assert resumed.final_loss == whole.final_loss


def logging_every_step(experiment: Any) -> Any:
    """EXPERIMENT logging a step event (and a status update) at every step."""
    return replace(experiment, run=replace(experiment.run, log_every=1))


def status_writes(s3: S3, key: str) -> int:
    """How many times the S3 server stored KEY (the bucket keeps every version)."""
    client = boto3_client(s3.proxy.endpoint)
    versions = client.list_object_versions(Bucket=s3.bucket, Prefix=key).get("Versions", [])
    return sum(1 for version in versions if version["Key"] == key)


def test_status_writes_are_bounded_by_time_not_by_steps(s3: S3, experiment: Any) -> None:
    """300 logged steps: status.json is written every publish interval (and at the start, each
    checkpoint and the end), not at every logged step, and the events still hold every step."""
    from sexpgpu.runtime.attempt import train

    boto3_client(s3.proxy.endpoint).put_bucket_versioning(Bucket=s3.bucket, VersioningConfiguration={"Status": "Enabled"})
    url = s3.url("runs")
    every_s = 0.5
    result = train(logging_every_step(experiment), run_options(store=url, publish_every_s=every_s), say=lambda _: None)
    assert result.exit_code == 0 and result.steps == 300
    store = Store.open(url)
    events = RunFolder(store, result.slug).read_events()
    assert steps_of(events) == list(range(1, 301))
    checkpoints = sum(1 for e in events if e["kind"] == "checkpoint")
    writes = status_writes(s3, f"runs/{result.slug}/status.json")
    assert writes >= 2  # the start and the end at least
    # the first (compiling) and the end; one per interval of the run's wall time; one per checkpoint
    assert writes <= 2 + checkpoints + result.wall_time_s / every_s + 1, (writes, result.wall_time_s)
    assert writes < 300 / 10, f"{writes} writes of status.json for 300 logged steps"


def test_a_step_never_waits_on_a_paused_store_and_nothing_is_lost(
    s3: S3, experiment: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store is paused from step 5 to step 200, far past its retries: the training thread
    makes no store call in between (the publisher's thread retries), and once the store is back
    every step's event and the final status are published."""
    from sexpgpu.runtime.attempt import train

    sleeps = Sleeps()

    @dataclass(frozen=True)
    class QuickRetry(RetryPolicy):
        attempts: int = 2
        base_delay: float = 0.01
        max_delay: float = 0.02
        sleep: Callable[[float], None] = field(default=sleeps, compare=False)

    monkeypatch.setattr(store_module, "RetryPolicy", QuickRetry)
    trainer_thread = threading.get_ident()
    blocked: list[str] = []  # the store calls the training thread made while the store was paused

    def watched(name: str) -> None:
        original = getattr(Store, name)

        def call(self: Store, *args: Any, **kwargs: Any) -> Any:
            if s3.proxy.paused and threading.get_ident() == trainer_thread:
                blocked.append(f"{name}({args[0] if args else ''})")
            return original(self, *args, **kwargs)

        monkeypatch.setattr(Store, name, call)

    for name in ("write_json", "write_bytes", "write_text", "append_lines", "read_bytes", "exists", "list"):
        watched(name)
    pausing_at(monkeypatch, {5: s3.proxy.pause, 200: lambda: resume_once_a_publish_failed(s3, sleeps)})
    url = s3.url("runs")
    result = train(logging_every_step(experiment), run_options(store=url, publish_every_s=0.2), say=lambda _: None)
    assert result.exit_code == 0 and result.steps == 300
    assert sleeps.calls, "the store never failed: the outage did not happen"
    assert blocked == [], f"training waited on the store while it was paused: {blocked[:5]}"
    store = Store.open(url)
    folder = RunFolder(store, result.slug)
    events = folder.read_events()
    assert steps_of(events) == list(range(1, 301))
    assert [e["kind"] for e in events].count("run.start") == 1 and events[-1]["kind"] == "run.end"
    status = folder.read_status()
    assert status is not None and status.state == "finished" and status.step == 300
