"""The disk cache of a run's parsed series (sexpgpu/results/seriescache.py): a reader in
another process that finds it has the same curves and events as one that parsed every line,
reads only what the log added since, writes a chunk of what is new when the log grew, and
builds a damaged cache again; a log that is not the one cached is read from its start. The logs
here have no series in columns (an older version's run): their first read parses every line."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from sexpgpu.results.readers import RunReaders
from sexpgpu.results.seriescache import Manifest, cache_folder
from sexpgpu.runtime.events import EventLog
from sexpgpu.runtime.store import Store
from test_series_columns import random_events  # null, non-finite and integer values, steps that repeat or go back

pytestmark = pytest.mark.xdist_group("dashboard")


def everything(readers: RunReaders, slug: str) -> tuple[Any, ...]:
    curves = readers.curves(slug)
    events, warnings, steps = readers.events_and_count(slug)
    return ([(s.name, s.group, s.steps, s.values) for s in curves.series], curves.events, curves.last_step, events, warnings, steps)


def manifest(cache: Path, store: Store, slug: str) -> Manifest:
    url = store.url_of(f"{slug}/events.jsonl")
    return Manifest.model_validate_json((cache_folder(cache, url) / "manifest.json").read_text())


def test_a_cached_run_reads_as_one_parsed_from_its_start_and_reads_only_what_was_added(tmp_path: Path) -> None:
    chance = random.Random(11)
    for trial in range(12):
        store = Store.open(str(tmp_path / f"store-{trial}"))
        cache = tmp_path / f"cache-{trial}"
        events = random_events(chance, chance.randint(20, 400))
        cut = chance.randint(1, len(events) - 1)
        with EventLog(store, "r", flush_every=1000, series=False) as log:
            for event in events[:cut]:
                log.emit(event)
        first = RunReaders(store, cache=cache, save_after=1)
        first.curves("r")  # read and cached
        with EventLog(store, "r", flush_every=1000, series=False) as log:
            for event in events[cut:]:
                log.emit(event)
        second = RunReaders(store, cache=cache, save_after=1)
        run = second._run("r")
        assert run.cache is not None and run.cache.saved is not None, "the cache was not loaded"
        assert run.reader.count == cut  # what the first read: the second goes on from there
        got = everything(second, "r")
        assert got == everything(RunReaders(store, use_cache=False), "r"), (trial, events)
        third = RunReaders(store, cache=cache, save_after=1)  # the second saved what it added
        assert third._run("r").reader.count == len(events)
        assert everything(third, "r") == got


def test_a_growing_log_is_saved_in_chunks_and_a_resume_saves_it_whole(tmp_path: Path) -> None:
    store, cache = Store.open(str(tmp_path / "runs")), tmp_path / "cache"
    readers = RunReaders(store, cache=cache, save_after=10)
    step = 0
    with EventLog(store, "r", flush_every=1, series=False) as log:
        for round_ in range(3):
            for _ in range(20):
                step += 1
                log.emit({"kind": "step", "step": step, "loss": step / 100})
            readers.curves("r")
            assert len(manifest(cache, store, "r").chunks) == round_ + 1
        log.emit({"kind": "resume", "step": 30, "from_step": 30, "checkpoint": None})
        for _ in range(10):
            step += 1
            log.emit({"kind": "step", "step": step - 30, "loss": 0.5})
        readers.curves("r")
    assert len(manifest(cache, store, "r").chunks) == 1
    fresh = RunReaders(store, cache=cache)
    assert everything(fresh, "r") == everything(RunReaders(store, use_cache=False), "r")
    files = {p.name for p in cache_folder(cache, store.url_of("r/events.jsonl")).iterdir()}
    assert len(files) == 5, files  # the manifest, the tail and one chunk's three files: the old chunks are gone


def write_run(store: Store, steps: int) -> None:
    with EventLog(store, "r", flush_every=1000, series=False) as log:
        for step in range(1, steps + 1):
            log.emit({"kind": "step", "step": step, "loss": 1 / step, "metrics": {"acc": step % 7 / 7}})
            if step % 10 == 0:
                log.emit({"kind": "eval", "step": step, "name": "val", "metrics": {"loss": 2 / step}})


@pytest.mark.parametrize("damage", ["values", "steps", "lines", "tail", "manifest", "missing"])
def test_a_damaged_cache_is_removed_and_built_again(tmp_path: Path, damage: str) -> None:
    store, cache = Store.open(str(tmp_path / "runs")), tmp_path / "cache"
    write_run(store, 300)
    RunReaders(store, cache=cache, save_after=1).curves("r")
    folder = cache_folder(cache, store.url_of("r/events.jsonl"))
    (chunk,) = manifest(cache, store, "r").chunks
    target = {"values": f"{chunk.name}.f8.npy", "steps": f"{chunk.name}.i8.npy", "lines": f"{chunk.name}.jsonl",
              "tail": "tail.jsonl", "manifest": "manifest.json", "missing": f"{chunk.name}.f8.npy"}[damage]
    path = folder / target
    if damage == "missing":
        path.unlink()
    else:
        data = bytearray(path.read_bytes())
        data[-3] ^= 0x01  # one bit of one number (or of a line's end)
        path.write_bytes(bytes(data))
    readers = RunReaders(store, cache=cache, save_after=1)
    run = readers._run("r")
    assert run.cache is not None and run.cache.saved is None and run.cache.rebuilt == 1
    assert run.reader.count == 0  # nothing of the damaged cache was taken
    assert everything(readers, "r") == everything(RunReaders(store, use_cache=False), "r")
    assert (folder / "manifest.json").exists() and manifest(cache, store, "r").position.count == run.reader.count  # built again


def test_another_log_under_the_name_is_read_from_its_start(tmp_path: Path) -> None:
    store, cache = Store.open(str(tmp_path / "runs")), tmp_path / "cache"
    write_run(store, 200)
    RunReaders(store, cache=cache, save_after=1).curves("r")
    path = tmp_path / "runs" / "r" / "events.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    last = json.loads(lines[-1])
    assert last["kind"] == "eval"
    last["metrics"]["loss"] = 123.0  # longer, the same first line, another last line where the cache stopped
    path.write_text("".join([*lines[:-1], json.dumps(last) + "\n", lines[-1]]))
    readers = RunReaders(store, cache=cache, save_after=1)
    assert readers._run("r").reader.count == 0
    got = everything(readers, "r")
    assert got == everything(RunReaders(store, use_cache=False), "r")
    val = next(s for s in readers.curves("r").series if s.name == "val/loss")
    assert 123.0 in val.values


def test_a_cache_that_cannot_be_written_is_left_out(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path / "runs"))
    write_run(store, 50)
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache's folder would go\n")
    readers = RunReaders(store, cache=blocked, save_after=1)
    assert everything(readers, "r") == everything(RunReaders(store, use_cache=False), "r")
