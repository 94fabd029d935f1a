"""A run's series in columns (runtime/serieslog.py, results/seriescolumns.py): what a first
reader takes from them is what it would parse from the event lines: the same series, events,
tail, warnings and position, for real runs (one killed and resumed) and for logs of every
kind of step event; a torn or damaged chunk, a line another writer appended, a log rewritten
since, and a run without columns (an older version's) are read from the lines from there; on
S3 the columns are one object a flush."""

from __future__ import annotations

import base64
import json
import math
import random
import signal
from pathlib import Path
from typing import Any, Iterator

import pytest
import s3fs

from conftest import wait_for
from results_store import TINY, quietly, write_file
from s3_server import MotoS3, make_bucket, patched_env, s3_env
from sexpgpu.results.curves import CurveData
from sexpgpu.results.readers import RunReaders
from sexpgpu.results.seriescolumns import load_columns
from sexpgpu.runtime.events import EventLog, EventReader, events_prefix
from sexpgpu.runtime.serieslog import SeriesChunk, read_chunk
from sexpgpu.runtime.store import Store
from test_resume import cli_run, logged_step

pytestmark = pytest.mark.xdist_group("dashboard")

SLUG = "r.base.00000001"
EVERY_STEP = TINY.replace("(defknob steps 40)", "(defknob steps 120)").replace(
    "(defrun :steps steps :seed 0 :log-every 5)", "(defrun :steps steps :seed 0 :log-every 1 :checkpoint (:every 25 :keep 2))")


def everything(readers: RunReaders, slug: str) -> tuple[Any, ...]:
    curves = readers.curves(slug)
    events, warnings, steps = readers.events_and_count(slug)
    series = [(s.name, s.group, s.steps, [None if v is None else repr(v) for v in s.values]) for s in curves.series]
    return series, curves.events, curves.last_step, json.dumps(events), warnings, steps


def taken_from_columns(store: Store, slug: str) -> bool:
    data = CurveData()
    return load_columns(EventReader(store, slug, sink=data, keep=lambda e: e.get("kind") != "step"), data)


def assert_same(store: Store, slug: str) -> tuple[Any, ...]:
    """The run read from its columns (a fresh reader, no disk cache) as read from its lines; that."""
    columns = RunReaders(store, use_cache=False)
    lines = RunReaders(store, use_cache=False, use_columns=False)
    found = everything(columns, slug)
    assert found == everything(lines, slug)
    assert columns._runs[slug].reader.position() == lines._runs[slug].reader.position()
    assert columns._runs[slug].reader.pairs == lines._runs[slug].reader.pairs
    return found


# -- real runs -----------------------------------------------------------------------------------


def test_a_real_run_reads_the_same_from_its_columns_as_from_its_lines(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    assert quietly("run", str(write_file(tmp_path / "project", text=EVERY_STEP)), "--store", str(root), "--quiet") == 0
    (slug,) = [p.name for p in root.iterdir() if p.is_dir()]
    store = Store.open(str(root))
    assert (root / slug / "series.jsonl").is_file() and taken_from_columns(store, slug)
    series, events, last_step, _, warnings, steps = assert_same(store, slug)
    names = [name for name, *_ in series]
    assert {"loss", "acc", "lr:all", "val/loss", "val/acc"} <= set(names) and steps == 120 and last_step == 120 and not warnings


def test_a_killed_and_resumed_run_continues_its_columns_with_each_step_once(tmp_path: Path) -> None:
    path = write_file(tmp_path / "project", text=EVERY_STEP.replace("(defknob steps 120)", "(defknob steps 300)"))
    store_path = tmp_path / "runs"
    proc = cli_run(path, store_path, "--threads", "1")
    wait_for(lambda: logged_step(store_path) >= 80 or proc.poll() is not None, "step 80 logged")
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=120) == -signal.SIGKILL
    proc = cli_run(path, store_path)
    assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
    (slug,) = [p.name for p in store_path.iterdir() if p.is_dir()]
    store = Store.open(str(store_path))
    chunks = [json.loads(line) for line in (store_path / slug / "series.jsonl").read_text().splitlines()]
    assert sum('"kind":"resume"' in item for chunk in chunks for item in chunk["items"] if isinstance(item, str)) == 1
    assert taken_from_columns(store, slug)
    series, *_ = assert_same(store, slug)
    loss = next(steps for name, _, steps, _ in series if name == "loss")
    assert loss == list(range(1, 301)), "no step missing, none twice"


# -- every kind of step event --------------------------------------------------------------------


def random_events(chance: random.Random, count: int) -> list[dict[str, Any]]:
    """Step events with values null, non-finite, integer or missing, metrics that come and go,
    one named like another series, extra keys; evals, diagnostics, checkpoints, resumes."""
    events: list[dict[str, Any]] = []
    step = 0
    for _ in range(count):
        roll = chance.random()
        if roll < 0.03 and step:
            step = chance.randint(0, step)
            events.append({"kind": "resume", "step": step, "from_step": step, "checkpoint": None})
        elif roll < 0.08:
            events.append({"kind": "eval", "step": step, "name": "val", "metrics": {"loss": chance.random(), "acc": None}})
        elif roll < 0.1:
            events.append({"kind": "diagnostic", "step": step, "values": {"grad-norm/w": chance.random()}})
        elif roll < 0.12:
            events.append({"kind": "checkpoint", "step": step, "path": f"checkpoints/step-{step:06d}"})
        else:
            step += chance.choice([1, 1, 1, 2, 0, -1])
            event: dict[str, Any] = {"kind": "step", "step": step, "lr": {"all": 0.1, "head": chance.choice([0.01, None])}}
            event["loss"] = chance.choice([chance.random(), chance.random() * 1e-300, 1e300, math.inf, math.nan, None, 3])
            if chance.random() < 0.5:
                event["metrics"] = {"acc": chance.random(), "val/loss": chance.random()} if chance.random() < 0.9 else {"loss": 1.0}
            if chance.random() < 0.9:
                event["grad_norm"] = chance.random()
            if chance.random() < 0.2:
                event["memory"] = chance.choice([117899264, 1 << 60])
            if chance.random() < 0.05:
                event["note"] = chance.choice(["a note", {"inner": 1}, [1, 2], 2.5])
            events.append(event)
    return events


@pytest.mark.parametrize("seed", range(6))
def test_every_kind_of_step_event_reads_the_same_from_the_columns(tmp_path: Path, seed: int) -> None:
    chance = random.Random(seed)
    store = Store.open(str(tmp_path))
    log = EventLog(store, SLUG, flush_every=chance.choice([1, 7, 50, 2000]))
    for event in random_events(chance, 3000 + 200 * seed):
        log.emit(event)
    log.close()
    assert taken_from_columns(store, SLUG)
    assert_same(store, SLUG)


def a_log(store: Store, events: list[dict[str, Any]], flush_every: int = 10) -> None:
    log = EventLog(store, SLUG, flush_every=flush_every)
    for event in events:
        log.emit(event)
    log.close()


def steps(first: int, last: int) -> list[dict[str, Any]]:
    return [{"kind": "step", "step": s, "loss": 1.0 / s, "metrics": {"acc": 0.5}} for s in range(first, last + 1)]


# -- what is read from the lines -----------------------------------------------------------------


def test_a_torn_or_damaged_chunk_and_what_follows_are_read_from_the_lines(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path))
    a_log(store, steps(1, 100))
    series = tmp_path / SLUG / "series.jsonl"
    whole = series.read_bytes()
    series.write_bytes(whole[:-40])  # the last chunk torn: no newline
    assert taken_from_columns(store, SLUG)
    assert assert_same(store, SLUG)[5] == 100
    chunks = whole.split(b"\n")
    chunks[3] = chunks[3].replace(b'"payload":"', b'"payload":"AAAA')  # a payload that no longer matches its SHA-256
    series.write_bytes(b"\n".join(chunks))
    assert taken_from_columns(store, SLUG)
    assert assert_same(store, SLUG)[5] == 100
    series.write_bytes(b"\n".join([chunks[0], b"{not a chunk", *chunks[2:]]))
    assert taken_from_columns(store, SLUG)
    assert assert_same(store, SLUG)[5] == 100


def test_a_chunk_read_from_its_line_is_what_validating_the_whole_line_gives(tmp_path: Path) -> None:
    """read_chunk takes the payload's text straight from a line as encode_chunk writes it;
    the chunk and the payload are those of pydantic's reading of the whole line, whatever
    the order of its keys, and a damaged payload is refused either way."""
    store = Store.open(str(tmp_path))
    a_log(store, steps(1, 50))
    lines = (tmp_path / SLUG / "series.jsonl").read_bytes().split(b"\n")[:-1]
    assert len(lines) == 5
    for line in lines:
        whole = SeriesChunk.model_validate_json(line)
        chunk, payload = read_chunk(line)
        assert chunk.model_copy(update={"payload": whole.payload}) == whole and chunk.payload == ""
        assert payload == base64.b64decode(whole.payload, validate=True)
        reordered = json.dumps({"payload": whole.payload, **whole.model_dump(mode="json", exclude={"payload"})}).encode()
        assert read_chunk(reordered) == (whole, payload)
        for damaged in (line.replace(b'"payload":"', b'"payload":"A"+"'), line.replace(b'"payload":"', b'"payload":"\\n')):
            with pytest.raises(ValueError):
                read_chunk(damaged)


def test_a_line_another_writer_appended_ends_the_columns_there(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path))
    a_log(store, steps(1, 30))
    store.append_lines(events_prefix(SLUG), ['{"v":1,"t":"2026-01-01T00:00:00.000Z","kind":"annotation","step":30,"text":"hi"}'])
    a_log(store, steps(31, 60))
    assert taken_from_columns(store, SLUG)
    assert assert_same(store, SLUG)[5] == 60


def test_a_run_an_older_version_began_and_this_one_resumed_reads_its_old_lines_then_its_columns(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path))
    log = EventLog(store, SLUG, flush_every=10, series=False)
    for event in steps(1, 50):
        log.emit(event)
    log.close()
    a_log(store, [{"kind": "resume", "step": 40, "from_step": 40, "checkpoint": "checkpoints/step-000040"}, *steps(41, 80)])
    assert taken_from_columns(store, SLUG)
    assert assert_same(store, SLUG)[0][0][2] == list(range(1, 81))
    (tmp_path / SLUG / "events.jsonl").write_bytes((tmp_path / SLUG / "events.jsonl").read_bytes().replace(b'"step":3,', b'"step":3;', 1))
    assert taken_from_columns(store, SLUG)
    warned = assert_same(store, SLUG)[4]
    assert len(warned) == 1 and warned[0].startswith(f"{store.url_of(SLUG + '/events.jsonl')}:3: not JSON")


def test_a_run_without_columns_and_a_log_rewritten_since_are_read_from_their_lines(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path))
    a_log(store, steps(1, 50))
    series = tmp_path / SLUG / "series.jsonl"
    written = series.read_bytes()
    series.unlink()  # what an older version wrote
    assert not taken_from_columns(store, SLUG)
    assert assert_same(store, SLUG)[5] == 50
    events = tmp_path / SLUG / "events.jsonl"
    events.write_text(events.read_text().replace('"loss":0.5,', '"loss":0.25,'))  # as long, another line
    series.write_bytes(written)
    assert not taken_from_columns(store, SLUG)
    loss = assert_same(store, SLUG)[0][0]
    assert loss[0] == "loss" and loss[3][1] == "0.25"


def test_what_came_from_the_columns_is_cached_on_disk_only_once_enough_lines_were_parsed_after(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path / "runs"))
    a_log(store, steps(1, 100))
    first = RunReaders(store, cache=tmp_path / "cache", save_after=30)
    first.curves(SLUG)
    assert not (tmp_path / "cache").exists(), "reading the columns again is about as cheap as the cache"
    log = EventLog(store, SLUG, flush_every=1000, series=False)  # lines the columns do not have
    for event in steps(101, 140):
        log.emit(event)
    log.close()
    first.curves(SLUG)
    (manifest,) = (tmp_path / "cache").glob("series/*/manifest.json")
    assert json.loads(manifest.read_text())["position"]["count"] == 140
    cached = RunReaders(store, cache=tmp_path / "cache")
    assert cached._run(SLUG).cache is not None and cached._run(SLUG).cache.saved is not None  # type: ignore[union-attr]
    assert everything(cached, SLUG) == everything(RunReaders(store, use_cache=False, use_columns=False), SLUG)


# -- S3 ----------------------------------------------------------------------------------------------


@pytest.fixture
def s3_store() -> Iterator[Store]:
    with MotoS3() as moto:
        endpoint = f"http://127.0.0.1:{moto.port}"
        s3fs.S3FileSystem.clear_instance_cache()
        with patched_env(s3_env(endpoint)):
            bucket = make_bucket(None, endpoint)
            yield Store.open(f"s3://{bucket}/runs")
        s3fs.S3FileSystem.clear_instance_cache()


def test_on_s3_the_columns_are_one_object_a_flush_and_read_the_same(s3_store: Store) -> None:
    a_log(s3_store, [*steps(1, 120), {"kind": "resume", "step": 60, "from_step": 60, "checkpoint": None}, *steps(61, 90)], flush_every=25)
    segments = s3_store.log_segments(f"{SLUG}/series")
    assert segments == s3_store.log_segments(events_prefix(SLUG)) and len(segments) == 7  # 151 events, 25 a flush
    assert taken_from_columns(s3_store, SLUG)
    series, *_ = assert_same(s3_store, SLUG)
    assert series[0][2] == list(range(1, 91))
    s3_store.append_lines(events_prefix(SLUG), ['{"v":1,"t":"2026-01-01T00:00:00.000Z","kind":"annotation","step":90,"text":"hi"}'])
    a_log(s3_store, steps(91, 110), flush_every=25)
    assert taken_from_columns(s3_store, SLUG)
    assert assert_same(s3_store, SLUG)[0][0][2] == list(range(1, 111))
