"""The store, events, status and run folder, on a local folder and on memory://."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from sexpgpu.runtime import store as store_module
from sexpgpu.runtime.events import (
    EVENT_MODELS,
    CheckpointEvent,
    EventLog,
    ResumeEvent,
    RunEndEvent,
    RunStartEvent,
    SignalEvent,
    StepEvent,
    parse_event,
    read_events,
    utc_now,
)
from sexpgpu.ir.experiment import Selection
from sexpgpu.runtime.runfolder import RunFolder, RunInfo, run_hash, slug
from sexpgpu.runtime.status import Status, StatusWriter, Summary, read_status
from sexpgpu.runtime.store import RetryPolicy, Store, StoreError

FAST = RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.002)


@pytest.fixture(params=["local", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "local":
        yield Store.open(str(tmp_path / "runs"), retry=FAST)
    else:
        root = f"memory://test-{uuid.uuid4().hex}"
        opened = Store.open(root, retry=FAST)
        yield opened
        opened.delete("", recursive=True)


@pytest.fixture
def local(tmp_path: Path) -> Store:
    return Store.open(str(tmp_path / "runs"), retry=FAST)


@pytest.fixture
def memory() -> Iterator[Store]:
    opened = Store.open(f"memory://test-{uuid.uuid4().hex}", retry=FAST)
    yield opened
    opened.delete("", recursive=True)


# ---------------------------------------------------------------------------------------------
# Opening and naming


def test_open_kinds(tmp_path: Path) -> None:
    plain = Store.open(str(tmp_path / "a"))
    assert plain.is_local and plain.url == str(tmp_path / "a")
    url = Store.open(f"file://{tmp_path}/b")
    assert url.is_local and url.url == str(tmp_path / "b")
    mem = Store.open("memory://somewhere/deep")
    assert not mem.is_local and mem.url == "memory:///somewhere/deep"


def test_default_is_runs_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert Store.open().url == str(tmp_path / "runs")


def test_url_of_reopens_to_the_same_place(store: Store) -> None:
    store.write_text("run/a.txt", "hi")
    where = store.url_of("run")
    assert Store.open(where).read_text("a.txt") == "hi"


@pytest.mark.parametrize("bad", ["", "/abs", "a/../b", "a//b", "./a", "a\\b"])
def test_bad_paths_refused(store: Store, bad: str) -> None:
    with pytest.raises(ValueError):
        store.write_text(bad, "x")


# ---------------------------------------------------------------------------------------------
# Whole files


def test_bytes_text_json_round_trip(store: Store) -> None:
    store.write_bytes("r/b.bin", b"\x00\x01\xff")
    store.write_text("r/t.txt", "héllo\n")
    store.write_json("r/j.json", {"a": 1, "nan": float("nan"), "l": [1.5, float("inf")]})
    assert store.read_bytes("r/b.bin") == b"\x00\x01\xff"
    assert store.read_text("r/t.txt") == "héllo\n"
    assert store.read_json("r/j.json") == {"a": 1, "nan": None, "l": [1.5, None]}


def test_a_stamped_read_is_the_file_and_the_time_of_the_version_read(store: Store) -> None:
    store.write_bytes("r/s.json", b"one")
    assert store.read_stamped("r/s.json") == (b"one", store.modified("r/s.json"))
    if store.is_local:  # the opened file's own time: a version written since has a time of its own
        os.utime(store.url_of("r/s.json"), (1_000_000, 1_000_000))
        assert store.read_stamped("r/s.json") == (b"one", 1_000_000)
    with pytest.raises(store_module.UnexpectedSize):
        store.read_stamped("r/s.json", limit=2)
    with pytest.raises(FileNotFoundError):
        store.read_stamped("r/none.json")


def test_write_json_model_and_read_back_as_model(store: Store) -> None:
    status = Status(state="running", step=3, metrics={"loss": 0.5})
    store.write_json("r/status.json", status)
    back = store.read_json("r/status.json", Status)
    assert back == status


def test_overwrite_replaces(store: Store) -> None:
    store.write_text("r/f", "one")
    store.write_text("r/f", "two")
    assert store.read_text("r/f") == "two"
    assert store.list("r") == ["r/f"]


def test_exists_list_delete(store: Store) -> None:
    assert not store.exists("r/a")
    assert store.list("r") == []
    for name in ["r/a", "r/sub/b", "r/sub/c", "other/d"]:
        store.write_text(name, name)
    assert store.exists("r/a") and store.exists("r/sub")
    assert store.list("r") == ["r/a", "r/sub/b", "r/sub/c"]
    assert store.list() == ["other/d", "r/a", "r/sub/b", "r/sub/c"]
    store.delete("r/a")
    assert not store.exists("r/a")
    store.delete("r/a")  # missing is fine
    with pytest.raises(FileNotFoundError):
        store.delete("r/a", missing_ok=False)
    store.delete("r/sub", recursive=True)
    assert store.list("r") == []


def test_missing_file_is_not_retried(store: Store) -> None:
    calls: list[float] = []
    quick = Store(store.fs, store.root, RetryPolicy(attempts=5, sleep=calls.append))
    with pytest.raises(FileNotFoundError):
        quick.read_bytes("nope")
    assert calls == []


# ---------------------------------------------------------------------------------------------
# Atomic publish (local)


def test_temp_name_is_never_the_final_name(local: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    renames: list[tuple[str, str]] = []
    real_replace = os.replace

    def spy(src: Any, dst: Any) -> None:
        renames.append((str(src), str(dst)))
        assert Path(src).read_text() == "complete"  # written in full before it is published
        real_replace(src, dst)

    monkeypatch.setattr(store_module.os, "replace", spy)
    local.write_text("r/status.json", "complete")
    (src, dst), = renames
    assert os.path.dirname(src) == os.path.dirname(dst)
    assert os.path.basename(src) != os.path.basename(dst)
    assert dst == local.url_of("r/status.json")


def test_failure_mid_write_keeps_previous_version(
    local: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    local.write_text("r/status.json", "old")

    def crash(_fd: int) -> None:  # the data is in the temp file, not yet published
        raise RuntimeError("power cut")

    monkeypatch.setattr(store_module.os, "fsync", crash)
    with pytest.raises(RuntimeError):
        local.write_text("r/status.json", "new and longer")
    monkeypatch.undo()
    assert local.read_text("r/status.json") == "old"
    folder = Path(local.url_of("r"))
    assert sorted(p.name for p in folder.iterdir()) == ["status.json"]  # temp cleaned up


def test_temp_files_are_not_listed(local: Store) -> None:
    local.write_text("r/a", "x")
    Path(local.url_of("r/.a.123.tmp")).write_text("partial")
    assert local.list("r") == ["r/a"]


def test_object_store_write_is_one_put(memory: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    puts: list[tuple[str, bytes]] = []
    real = memory.fs.pipe_file

    def spy(path: str, data: bytes, **kwargs: Any) -> None:
        puts.append((path, data))
        real(path, data, **kwargs)

    monkeypatch.setattr(memory.fs, "pipe_file", spy)
    memory.write_json("r/status.json", {"state": "running"})
    assert len(puts) == 1 and puts[0][0].endswith("/r/status.json")


# ---------------------------------------------------------------------------------------------
# Append-only logs


def test_append_layout_local_is_one_file(local: Store) -> None:
    local.append_lines("r/events", ["a", "b"])
    local.append_lines("r/events", ["c"])
    assert local.list("r") == ["r/events.jsonl"]
    assert Path(local.url_of("r/events.jsonl")).read_text() == "a\nb\nc\n"
    assert local.read_lines("r/events") == ["a", "b", "c"]


def test_append_layout_memory_is_segments(memory: Store) -> None:
    memory.append_lines("r/events", ["a", "b"])
    memory.append_lines("r/events", ["c"])
    assert memory.list("r") == ["r/events/000000.jsonl", "r/events/000001.jsonl"]
    assert memory.read_lines("r/events") == ["a", "b", "c"]


def test_append_order_across_many_flushes(store: Store) -> None:
    for batch in range(30):
        store.append_lines("r/events", [f"{batch}-{i}" for i in range(batch % 4 + 1)])
    expected = [f"{b}-{i}" for b in range(30) for i in range(b % 4 + 1)]
    assert store.read_lines("r/events") == expected


def test_segments_order_numerically_past_six_digits(memory: Store) -> None:
    memory.write_text("r/events/999999.jsonl", "a\n")
    memory.write_text("r/events/1000000.jsonl", "b\n")
    memory.write_text("r/events/000010.jsonl", "first\n")
    assert memory.read_lines("r/events") == ["first", "a", "b"]


def test_new_writer_continues_segment_numbering(memory: Store) -> None:
    memory.append_lines("r/events", ["a"])
    again = Store(memory.fs, memory.root, FAST)  # a resumed process
    again.append_lines("r/events", ["b"])
    memory.append_lines("r/events", ["c"])  # its cached number was taken: lists again
    assert memory.read_lines("r/events") == ["a", "b", "c"]
    assert len(memory.list("r/events")) == 3


def test_torn_local_line_is_dropped_and_overwritten(local: Store) -> None:
    local.append_lines("r/events", ["a"])
    with open(local.url_of("r/events.jsonl"), "ab") as handle:
        handle.write(b'{"torn')  # a crash mid-append
    assert local.read_lines("r/events") == ["a"]
    local.append_lines("r/events", ["b"])
    assert Path(local.url_of("r/events.jsonl")).read_text() == "a\nb\n"


def test_append_refuses_newlines(store: Store) -> None:
    with pytest.raises(ValueError):
        store.append_lines("r/events", ["a\nb"])


def test_read_lines_of_missing_log_is_empty(store: Store) -> None:
    assert store.read_lines("r/events") == []


# ---------------------------------------------------------------------------------------------
# Retries


def _flaky(real: Callable[..., Any], failures: int) -> tuple[Callable[..., Any], list[int]]:
    calls = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] <= failures:
            raise ConnectionError("store unreachable") if calls[0] % 2 else OSError("timed out")
        return real(*args, **kwargs)

    return wrapper, calls


def test_object_store_write_survives_two_failures(
    memory: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    sleeps: list[float] = []
    memory.retry = RetryPolicy(attempts=3, base_delay=0.001, sleep=sleeps.append)
    wrapper, calls = _flaky(memory.fs.pipe_file, failures=2)
    monkeypatch.setattr(memory.fs, "pipe_file", wrapper)
    memory.write_text("r/a", "written")
    assert calls[0] == 3 and sleeps == [0.001, 0.002]
    monkeypatch.undo()
    assert memory.read_text("r/a") == "written"


def test_object_store_gives_up_after_attempts(
    memory: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrapper, calls = _flaky(memory.fs.pipe_file, failures=10**6)
    monkeypatch.setattr(memory.fs, "pipe_file", wrapper)
    with pytest.raises(StoreError, match="after 3 attempts"):
        memory.write_text("r/a", "x")
    assert calls[0] == 3
    assert isinstance(StoreError("x"), OSError)


def test_local_write_survives_two_failures(local: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    wrapper, calls = _flaky(os.replace, failures=2)
    monkeypatch.setattr(store_module.os, "replace", wrapper)
    local.write_text("r/a", "written")
    monkeypatch.undo()
    assert calls[0] == 3
    assert local.read_text("r/a") == "written"
    assert local.list("r") == ["r/a"]  # no temp left behind by the failed attempts


def test_local_append_retry_does_not_duplicate(
    local: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    local.append_lines("r/events", ["a"])
    real_fsync = os.fsync
    wrapper, calls = _flaky(real_fsync, failures=2)  # fails after the data was written
    monkeypatch.setattr(store_module.os, "fsync", wrapper)
    local.append_lines("r/events", ["b", "c"])
    monkeypatch.undo()
    assert local.read_lines("r/events") == ["a", "b", "c"]


def test_reads_are_retried(memory: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    memory.write_text("r/a", "x")
    wrapper, calls = _flaky(memory.fs.cat_file, failures=2)
    monkeypatch.setattr(memory.fs, "cat_file", wrapper)
    assert memory.read_text("r/a") == "x"
    assert calls[0] == 3


def test_segment_put_retry_does_not_duplicate(
    memory: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = memory.fs.pipe_file
    calls = [0]

    def lands_then_fails(path: str, data: bytes, **kwargs: Any) -> None:
        calls[0] += 1
        real(path, data, **kwargs)
        if calls[0] == 1:
            raise ConnectionError("response lost")

    monkeypatch.setattr(memory.fs, "pipe_file", lands_then_fails)
    memory.append_lines("r/events", ["a"])
    memory.append_lines("r/events", ["b"])
    assert memory.read_lines("r/events") == ["a", "b"]


# ---------------------------------------------------------------------------------------------
# Events


def test_every_kind_has_a_model() -> None:
    kinds = {
        "run.start", "compile", "step", "eval", "diagnostic", "stage", "checkpoint",
        "nonfinite", "warning", "signal", "preempted", "resume", "target", "annotation",
        "run.end",
    }
    assert set(EVENT_MODELS) == kinds


def test_event_line_shape() -> None:
    event = StepEvent(step=10, loss=1.25, metrics={"acc": 0.5}, lr={"main": 1e-3},
                      grad_norm=0.7, step_time=0.01, examples_per_s=3200.0)
    data = json.loads(event.to_line())
    assert list(data)[:4] == ["v", "t", "kind", "step"]
    assert data["v"] == 1 and data["kind"] == "step" and data["step"] == 10
    assert data["t"].endswith("Z") and "T" in data["t"]
    assert "tokens_per_s" not in data and "memory" not in data  # unset optionals left out
    assert json.loads(RunStartEvent(slug="s").to_line())["step"] is None


def test_utc_now_format() -> None:
    now = utc_now()
    assert now.endswith("Z") and len(now) == len("2026-01-02T03:04:05.678Z")


def test_events_round_trip_with_extra_keys(store: Store) -> None:
    with EventLog(store, "run", flush_every=2) as log:
        log.emit(RunStartEvent(slug="run", attempt=1, custom={"tag": "x"}))
        log.emit({"kind": "step", "step": 1, "loss": float("nan"), "my_metric": [1, 2]})
        log.emit({"kind": "annotation", "text": "hello", "who": "me"})
    events = read_events(store, "run")
    assert [e["kind"] for e in events] == ["run.start", "step", "annotation"]
    assert events[0]["custom"] == {"tag": "x"}
    assert events[1]["my_metric"] == [1, 2] and events[1]["loss"] is None
    assert events[2]["who"] == "me"
    model = parse_event(events[2])
    assert model.model_dump()["who"] == "me"
    assert parse_event({"kind": "from.the.future", "x": 1}).model_dump()["x"] == 1


def test_emit_refuses_unknown_kind_and_bad_fields(store: Store) -> None:
    log = EventLog(store, "run")
    with pytest.raises(ValueError):
        log.emit({"kind": "nope"})
    with pytest.raises(ValueError):
        log.emit({"kind": "step"})  # a step event needs its step


def test_flush_every_n_events(store: Store) -> None:
    log = EventLog(store, "run", flush_every=3, flush_seconds=1e9)
    for step in range(7):
        log.emit(StepEvent(step=step, loss=1.0))
    assert [e["step"] for e in read_events(store, "run")] == [0, 1, 2, 3, 4, 5]
    assert log.pending == 1
    log.close()
    assert [e["step"] for e in read_events(store, "run")] == list(range(7))


def test_flush_every_t_seconds(store: Store) -> None:
    now = [0.0]
    log = EventLog(store, "run", flush_every=1000, flush_seconds=5.0, clock=lambda: now[0])
    log.emit(StepEvent(step=1))
    assert read_events(store, "run") == []
    now[0] = 5.0
    log.emit(StepEvent(step=2))
    assert [e["step"] for e in read_events(store, "run")] == [1, 2]
    log.close()
    with pytest.raises(ValueError):
        log.emit(StepEvent(step=3))


def test_ordering_across_many_flushes(store: Store) -> None:
    with EventLog(store, "run", flush_every=7) as log:
        for step in range(200):
            log.emit(StepEvent(step=step, loss=float(step)))
    steps = [e["step"] for e in read_events(store, "run")]
    assert steps == list(range(200))


def test_resume_supersedes_later_steps(store: Store) -> None:
    with EventLog(store, "run", flush_every=4) as log:
        log.emit(RunStartEvent(slug="run", attempt=1))
        for step in range(1, 9):
            log.emit(StepEvent(step=step, loss=1.0))
            if step == 5:
                log.emit(CheckpointEvent(step=5, path="checkpoints/step-000005"))
        log.emit(SignalEvent(step=8, signal="SIGTERM"))
    with EventLog(store, "run", flush_every=4) as log:  # the second attempt
        log.emit(RunStartEvent(slug="run", attempt=2))
        log.emit(ResumeEvent(step=5, from_step=5, checkpoint="checkpoints/step-000005",
                             attempt=2))
        for step in range(6, 11):
            log.emit(StepEvent(step=step, loss=0.5))
        log.emit(RunEndEvent(step=10, exit_code=0, reason="finished"))
    events = read_events(store, "run")
    steps = [e["step"] for e in events if e["kind"] == "step"]
    assert steps == list(range(1, 11))  # continuous, no duplicates
    assert [e["loss"] for e in events if e["kind"] == "step"] == [1.0] * 5 + [0.5] * 5
    kinds = [e["kind"] for e in events]
    assert kinds.count("run.start") == 2 and "signal" in kinds  # attempt history kept
    everything = read_events(store, "run", superseded=True)
    assert len([e for e in everything if e["kind"] == "step"]) == 13


def test_repeated_resumes(store: Store) -> None:
    with EventLog(store, "run") as log:
        for step in range(1, 5):
            log.emit(StepEvent(step=step, loss=1.0))
        log.emit(ResumeEvent(from_step=2, checkpoint="c2"))
        for step in range(3, 7):
            log.emit(StepEvent(step=step, loss=2.0))
        log.emit(ResumeEvent(from_step=4, checkpoint="c4"))
        for step in range(5, 8):
            log.emit(StepEvent(step=step, loss=3.0))
    series = [(e["step"], e["loss"]) for e in read_events(store, "run") if e["kind"] == "step"]
    assert series == [(1, 1.0), (2, 1.0), (3, 2.0), (4, 2.0), (5, 3.0), (6, 3.0), (7, 3.0)]


def test_garbage_lines_are_skipped(store: Store) -> None:
    store.append_lines("run/events", ['{"v":1,"kind":"step","step":1}', "not json", "[1]"])
    assert [e["step"] for e in read_events(store, "run")] == [1]


def test_event_log_keeps_events_while_the_store_is_down(
    memory: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = EventLog(memory, "run", flush_every=1)
    wrapper, calls = _flaky(memory.fs.pipe_file, failures=10**6)
    monkeypatch.setattr(memory.fs, "pipe_file", wrapper)
    log.emit(StepEvent(step=1))  # the flush fails: kept, no exception
    log.emit(StepEvent(step=2))
    assert log.pending == 2 and isinstance(log.last_error, StoreError)
    with pytest.raises(StoreError):
        log.flush()
    monkeypatch.undo()
    log.close()  # the store is back
    assert [e["step"] for e in read_events(memory, "run")] == [1, 2]


# ---------------------------------------------------------------------------------------------
# Status


def test_status_replaced_on_every_update(store: Store) -> None:
    writer = StatusWriter(store, "run")
    assert read_status(store, "run") is None
    writer.update(state="running", step=1, steps=100, metrics={"loss": 2.0})
    first = read_status(store, "run")
    assert first is not None and first.state == "running" and first.step == 1
    writer.update(step=2, metrics={"loss": float("nan")}, eta_s=12.5)
    second = read_status(store, "run")
    assert second is not None
    assert second.step == 2 and second.metrics == {"loss": None} and second.steps == 100
    assert second.heartbeat >= first.heartbeat and second.started == first.started
    assert store.list("run") == ["run/status.json"]


def test_status_summary_and_final_state(store: Store) -> None:
    writer = StatusWriter(store, "run", Status(state="running", attempt=2, worker="w1"))
    summary = Summary(best_eval={"acc": 0.9}, last_eval={"acc": 0.88},
                      target_reached_at_step=400, wall_time_s=12.0, examples_seen=6400,
                      tokens_seen=None, exit_code=0, reason="target reached")
    writer.update(state="finished", step=400, summary=summary, last_checkpoint="c/400")
    back = read_status(store, "run")
    assert back is not None and back.summary == summary
    assert back.state == "finished" and back.attempt == 2 and back.worker == "w1"


def test_status_refuses_unknown_fields_and_states(store: Store) -> None:
    writer = StatusWriter(store, "run")
    with pytest.raises(TypeError):
        writer.update(stat="running")
    with pytest.raises(ValueError):
        writer.update(state="exploded")


def test_status_survives_store_outage(memory: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = StatusWriter(memory, "run")
    writer.update(state="running", step=1)
    wrapper, _ = _flaky(memory.fs.pipe_file, failures=10**6)
    monkeypatch.setattr(memory.fs, "pipe_file", wrapper)
    writer.update(step=2)  # kept, not raised
    assert isinstance(writer.last_error, StoreError)
    with pytest.raises(StoreError):
        writer.flush()
    monkeypatch.undo()
    writer.flush()
    back = read_status(memory, "run")
    assert back is not None and back.step == 2 and writer.last_error is None


# ---------------------------------------------------------------------------------------------
# Slug and run folder


KNOBS = {"width": 64, "lr": 0.001, "act": "gelu", "layers": [2, 2]}


def test_slug_format() -> None:
    base = slug("mnist", None, None, None, "ir123", KNOBS)
    stem, variant, hash8 = base.split(".")
    assert (stem, variant) == ("mnist", "base") and len(hash8) == 8
    assert all(c in "0123456789abcdef" for c in hash8)
    assert hash8 == run_hash("ir123", KNOBS)
    swept = slug("mnist", "wide", "lr", 3, "ir123", KNOBS)
    assert swept == f"mnist.wide.lr-3.{hash8}"


def test_slug_hash_definition() -> None:
    import hashlib

    canonical = json.dumps(KNOBS, sort_keys=True, separators=(",", ":"))
    expected = hashlib.sha256(("ir123" + canonical).encode()).hexdigest()[:8]
    assert run_hash("ir123", KNOBS) == expected


def test_slug_is_stable_and_sensitive() -> None:
    reordered = dict(reversed(list(KNOBS.items())))
    first = slug("exp", "v", None, None, "ir", KNOBS)
    assert first == slug("exp", "v", None, None, "ir", reordered)
    changes: list[dict[str, Any]] = [
        {**KNOBS, "width": 65},
        {**KNOBS, "lr": 0.0011},
        {**KNOBS, "act": "relu"},
        {**KNOBS, "layers": [2, 3]},
        {**KNOBS, "extra": True},
        {k: v for k, v in KNOBS.items() if k != "act"},
    ]
    hashes = {slug("exp", "v", None, None, "ir", knobs) for knobs in changes}
    assert first not in hashes and len(hashes) == len(changes)
    assert slug("exp", "v", None, None, "ir2", KNOBS) != first


def test_slug_refuses_bad_parts() -> None:
    with pytest.raises(ValueError):
        slug("a/b", None, None, None, "ir", {})
    with pytest.raises(ValueError):
        slug("a", None, "lr", None, "ir", {})
    with pytest.raises(ValueError):
        slug("a", None, "lr", -1, "ir", {})
    with pytest.raises(ValueError):
        slug("a", None, None, None, "ir", {"x": float("nan")})


def test_run_folder(store: Store) -> None:
    name = slug("exp", None, None, None, "irhash", {"w": 1})
    folder = RunFolder(store, name, flush_every=2)
    assert not folder.exists()
    info = RunInfo(slug=name, file="exp.lisp", selection=Selection(set={"w": "1"}),
                   knobs={"w": 1}, source_hash="src", ir_hash="irhash",
                   devices=["cpu"], meta={"who": "me"}, max_steps=10, future="kept")
    folder.write_run_info(info)
    folder.write_sources({"exp.lisp": "(defrun)", "lib/util.lisp": b"(defun f ())"})
    folder.write_ir('{"nodes": []}')
    folder.status.update(state="running", step=0)
    folder.events.emit(RunStartEvent(slug=name))
    folder.events.emit(StepEvent(step=1, loss=0.5))
    folder.events.emit(StepEvent(step=2, loss=0.4))
    folder.close()

    assert folder.exists()
    back = folder.read_run_info()
    assert back == info and back.model_dump()["future"] == "kept"
    assert back.versions.python and back.created.endswith("Z")
    assert folder.list_sources() == ["exp.lisp", "lib/util.lisp"]
    assert store.read_text(f"{name}/source/lib/util.lisp") == "(defun f ())"
    assert folder.read_ir() == '{"nodes": []}'
    assert [e["kind"] for e in folder.read_events()] == ["run.start", "step", "step"]
    status = folder.read_status()
    assert status is not None and status.state == "running"
    files = set(store.list(name))
    assert {f"{name}/run.json", f"{name}/ir.json", f"{name}/status.json"} <= files
    events_file = f"{name}/events.jsonl" if store.is_local else f"{name}/events/000000.jsonl"
    assert events_file in files
    assert folder.url == store.url_of(name)


def test_run_folder_refuses_mismatched_info_and_escaping_sources(store: Store) -> None:
    folder = RunFolder(store, "a.base.00000000")
    with pytest.raises(ValueError):
        folder.write_run_info(RunInfo(slug="b.base.00000000", file="b", source_hash="s",
                                      ir_hash="i"))
    with pytest.raises(ValueError):
        folder.write_sources({"../escape.lisp": b""})


def test_folders_lists_the_folders_only(store: Store) -> None:
    for name in ("b", "a", ".hidden"):
        store.write_text(f"{name}/run.json", "{}")
    store.write_text("file.txt", "x")
    assert store.folders() == ["a", "b"]
    assert store.folders("a") == [] and store.folders("nothing-here") == []


def test_local_folders_are_one_scandir_not_a_stat_a_folder(local: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for n in range(200):
        local.write_text(f"run-{n:03d}/run.json", "{}")
    os.symlink(tmp_path / "runs" / "run-000", tmp_path / "runs" / "a-link")  # not a folder of the store, as fsspec says
    described = []
    real_info = local.fs.info

    def counted_info(path: Any, **kwargs: Any) -> Any:  # fsspec's listing describes each entry (a stat each)
        described.append(path)
        return real_info(path, **kwargs)

    monkeypatch.setattr(local.fs, "info", counted_info)
    assert local.folders() == [f"run-{n:03d}" for n in range(200)]
    assert described == []
