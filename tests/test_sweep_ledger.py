"""The Ray driver's ledger in the store: a journal of the points each round changed, one
object per round (never the whole sweep, nor one object per point), folded into sweep.json
when it is written; the ledgers of the older forms still read,
and a round of the driver reads the store only for the points another driver holds."""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from conftest import recorded_reads
from sexpgpu.sweeps.ledger import LedgerStore, PointRecord, SweepLedger
from sexpgpu.runtime.lease import Lease
from sexpgpu.runtime.store import Store

PREFIX = "sweeps/grid.lrs"
MANY = 200


def records(count: int) -> list[PointRecord]:
    return [PointRecord(point=i, slug=f"grid-{i:04d}-abcdef", knobs={"lr": 0.001 * i}, planned=50) for i in range(count)]


def recorded_writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths Store.write_text writes, in order (the real write happens too)."""
    writes: list[str] = []
    original = Store.write_text

    def recording(self: Store, path: str, text: str) -> None:
        writes.append(path)
        original(self, path, text)

    monkeypatch.setattr(Store, "write_text", recording)
    return writes


def test_a_ledger_of_the_one_file_form_still_reads(tmp_path: Path) -> None:
    """sweep.json as drivers before per-point records wrote it: the whole ledger, indented."""
    old = {
        "version": 1, "file": "grid.lisp", "sweep": "lrs", "updated": "2026-11-30T10:00:00Z",
        "points": [{"point": 0, "slug": "grid-0000-abcdef", "knobs": {"lr": 0.1}, "planned": 50, "state": "finished", "attempts": 2,
                    "preemptions": 1, "exit_code": 0, "reason": "finished", "steps": 50, "final_loss": 0.5, "lease": None, "heartbeat": None},
                   {"point": 1, "slug": "grid-0001-abcdef", "knobs": {"lr": 0.2}, "state": "running", "lease": "d1", "heartbeat": 1.0}],
    }
    (tmp_path / PREFIX).mkdir(parents=True)
    (tmp_path / PREFIX / "sweep.json").write_text(json.dumps(old, indent=2))
    ledger = LedgerStore(Store.open(str(tmp_path)), PREFIX).read()
    assert ledger is not None
    assert (ledger.file, ledger.sweep) == ("grid.lisp", "lrs")
    assert [(p.point, p.slug, p.state, p.attempts, p.preemptions, p.lease) for p in ledger.points] == [
        (0, "grid-0000-abcdef", "finished", 2, 1, None), (1, "grid-0001-abcdef", "running", 0, 0, "d1")]


def test_a_round_writes_only_the_points_that_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store.open(str(tmp_path))
    ledger = SweepLedger(file="grid.lisp", sweep="lrs", points=records(MANY))
    writer = LedgerStore(store, PREFIX, "driver-a")
    writer.write_points(ledger.points)
    writer.write_snapshot(ledger)
    writes = recorded_writes(monkeypatch)
    for point in (7, 9, 150):
        ledger.points[point].state, ledger.points[point].attempts = "running", 1
    assert writer.write_points(ledger.points) == 3
    assert len(writes) == 1 and writes[0].startswith(f"{PREFIX}/journal/") and writes[0].endswith("-driver-a-000002.jsonl"), writes
    journalled = [json.loads(line) for line in store.read_text(writes[0]).splitlines()]
    assert [(r["point"], r["state"]) for r in journalled] == [(7, "running"), (9, "running"), (150, "running")]
    assert writer.write_points(ledger.points) == 0  # nothing changed since
    assert len(writes) == 1
    again = LedgerStore(store, PREFIX).read()  # another driver's view: the snapshot, the journal over it
    assert again is not None
    assert again.points == ledger.points
    assert (again.file, again.sweep) == ("grid.lisp", "lrs")


def test_the_journal_reads_over_an_older_snapshot_in_its_order(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path))
    ledger = SweepLedger(file="grid.lisp", sweep="lrs", points=records(3))
    LedgerStore(store, PREFIX).write_snapshot(ledger)
    first, second = LedgerStore(store, PREFIX, "driver-a"), LedgerStore(store, PREFIX, "driver-b")
    first.write_points([ledger.points[2].model_copy(update={"state": "running", "attempts": 1, "lease": "driver-a"})])
    second.write_points([ledger.points[1].model_copy(update={"state": "running", "attempts": 1, "lease": "driver-b"})])
    first.write_points([ledger.points[2].model_copy(update={"state": "finished", "steps": 50, "attempts": 1})])
    read = LedgerStore(store, PREFIX).read()
    assert read is not None
    assert [(p.state, p.attempts) for p in read.points] == [("pending", 0), ("running", 1), ("finished", 1)]


def test_a_snapshot_folds_the_journal_and_a_crash_before_the_fold_reads_the_same(tmp_path: Path) -> None:
    """Writing sweep.json removes the journal objects it holds every point of; killed between
    the snapshot and the removal, the journal left over reads as the snapshot does."""
    store = Store.open(str(tmp_path))
    ledger = SweepLedger(file="grid.lisp", sweep="lrs", points=records(20))
    writer = LedgerStore(store, PREFIX, "driver-a")
    writer.write_points(ledger.points)
    for round_ in range(5):
        for point in range(round_, 20, 5):
            ledger.points[point].state, ledger.points[point].attempts = "running", round_ + 1
        writer.write_points(ledger.points)
    journal = tmp_path / PREFIX / "journal"
    kept = {path.name: path.read_bytes() for path in journal.iterdir()}
    assert len(kept) == 6
    other = PointRecord(point=20, slug="grid-0020-abcdef", knobs={"lr": 0.5}, state="running", lease="driver-b")
    LedgerStore(store, PREFIX, "driver-b").write_points([other])  # a point this snapshot does not hold
    writer.write_snapshot(ledger)
    assert [path.name for path in journal.iterdir()] == [name for name in os.listdir(journal) if name.endswith("-driver-b-000001.jsonl")]
    read = LedgerStore(store, PREFIX).read()
    assert read is not None and read.points == [*ledger.points, other]
    for name, data in kept.items():  # as if the driver died before removing what it folded
        (journal / name).write_bytes(data)
    again = LedgerStore(store, PREFIX).read()
    assert again is not None and again.points == [*ledger.points, other]


def test_per_point_records_of_the_older_form_read_and_fold(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path))
    ledger = SweepLedger(file="grid.lisp", sweep="lrs", points=records(3))
    LedgerStore(store, PREFIX).write_snapshot(ledger)
    ended = ledger.points[2].model_copy(update={"state": "finished", "steps": 50, "attempts": 1})
    store.write_text(f"{PREFIX}/points/{ended.slug}.json", ended.model_dump_json())
    reader = LedgerStore(store, PREFIX, "driver-a")
    read = reader.read()
    assert read is not None
    assert [p.state for p in read.points] == ["pending", "pending", "finished"]
    read.points[0].state = "running"
    reader.write_points(read.points)
    reader.write_snapshot(read)
    assert not store.list(f"{PREFIX}/points") and not store.list(f"{PREFIX}/journal")
    again = LedgerStore(store, PREFIX).read()
    assert again is not None and [p.state for p in again.points] == ["running", "pending", "finished"]


def test_a_round_of_many_changes_is_one_request_on_s3() -> None:
    """On S3 (moto's server on loopback) a round that changed 150 points journals them in one
    PUT, and a reader sees them."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from s3_server import MotoS3, make_bucket, patched_env, s3_env
    from test_lease_conditional import Requests

    with MotoS3() as moto, patched_env(s3_env(moto.endpoint)):
        url = f"s3://{make_bucket(None, moto.endpoint)}/team"
        store = Store.open(url)
        ledger = SweepLedger(file="grid.lisp", sweep="lrs", points=records(MANY))
        writer = LedgerStore(store, PREFIX, "driver-a")
        requests = Requests(store)
        assert writer.write_points(ledger.points) == MANY
        for point in range(150):
            ledger.points[point].state = "running"
        assert writer.write_points(ledger.points) == 150
        sent = requests.close()
        assert len(sent) == 2 and all(r.startswith(f"PUT team/{PREFIX}/journal/") for r in sent), sent
        read = LedgerStore(Store.open(url), PREFIX).read()
        assert read is not None and read.points == ledger.points


def test_a_round_reads_the_store_only_for_points_another_driver_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A round of the driver's supervision: its own points it learns of from their workers;
    it reads the status and lease of the points another driver was found to hold, and no
    other point's."""
    pytest.importorskip("ray")
    from orchestration.driver import FOLLOW_EVERY_S, Driver, Supervision

    path = tmp_path / "grid.lisp"
    path.write_text("")
    driver = Driver(path, "lrs", str(tmp_path / "store"), None, None, None, say=lambda _: None)
    ledger = SweepLedger(file="grid.lisp", sweep="lrs", points=records(MANY))
    for point in (3, 150):
        ledger.points[point].state = "leased"
    lease = Lease(holder="other-driver", host="elsewhere", pid=1, heartbeat=time.time())
    driver.store.write_text(driver.leases.key(150), lease.model_dump_json())
    reads = recorded_reads(monkeypatch)
    supervision = Supervision(driver, ledger)
    supervision.follow_others()
    assert sorted(reads) == sorted(["grid-0003-abcdef/status.json", driver.leases.key(3), "grid-0150-abcdef/status.json", driver.leases.key(150)])
    assert ledger.points[3].state == "pending"  # its lease is gone: this driver may take it
    assert (ledger.points[150].state, ledger.points[150].lease) == ("leased", "other-driver")
    reads.clear()
    supervision.follow_others()  # again within FOLLOW_EVERY_S: nothing read
    assert reads == [] and FOLLOW_EVERY_S > 0


def test_leases_on_a_local_folder_are_claimed_concurrently(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each lease on a local folder is an exclusive create with two fsyncs: claimed one after
    the other, a batch waited on the disk in turn (146 of a 10,000-point driver's 239 s).
    Each create here waits until both began; of two claimants each lease still has one."""
    from sexpgpu.runtime.lease import Leases

    store = Store.open(str(tmp_path))
    together = threading.Barrier(2, timeout=60)
    create_new = Store.create_new

    def when_both_began(self: Store, path: str, data: bytes) -> bool:
        together.wait()  # one create after the other: broken after the timeout, and the claim fails
        return create_new(self, path, data)

    monkeypatch.setattr(Store, "create_new", when_both_began)
    paths = [f"{PREFIX}/leases/point-{i:04d}.json" for i in range(2)]
    assert Leases(store, "driver-a").claim(paths) == paths
    monkeypatch.undo()
    assert Leases(Store.open(str(tmp_path)), "driver-b").claim(paths) == []


def journal_objects(store: Store) -> list[str]:
    return sorted(store.list(f"{PREFIX}/journal"))


def journal_bytes(store: Store) -> int:
    return sum(len(store.read_bytes(path)) for path in journal_objects(store))


@pytest.mark.parametrize("start", ["snapshot", "streamed"])
def test_a_long_sweep_compacts_its_journal_as_it_runs(tmp_path: Path, start: str) -> None:
    """Round after round of a few changes: after every round the journal left in the store is
    under COMPACT_OBJECTS objects or under a JOURNAL_SHARE-th of the snapshot's bytes (else
    that round compacted), never MOST_OBJECTS, and the ledger reads as the changes made it:
    after a snapshot written at the start (a halving sweep), and with none before the end (a
    streamed sweep: its driver's writer knows the header it compacts under)."""
    from sexpgpu.sweeps.ledger import COMPACT_OBJECTS, JOURNAL_SHARE, MOST_OBJECTS

    store = Store.open(str(tmp_path))
    ledger = SweepLedger(file="grid.lisp", sweep="lrs", points=records(MANY))
    writer = LedgerStore(store, PREFIX, "driver-a", header=("grid.lisp", "lrs"))
    writer.write_points(ledger.points, compact=False)
    if start == "snapshot":
        writer.write_snapshot(ledger)
    counts = []
    for round_ in range(8 * COMPACT_OBJECTS):
        point = ledger.points[round_ % MANY]
        point.state, point.attempts = "running", point.attempts + 1
        writer.write_points(ledger.points)
        objects = journal_objects(store)
        counts.append(len(objects))
        if store.exists(f"{PREFIX}/sweep.json"):
            snapshot = len(store.read_bytes(f"{PREFIX}/sweep.json"))
            assert len(objects) < COMPACT_OBJECTS or journal_bytes(store) * JOURNAL_SHARE < snapshot, round_
        else:
            assert len(objects) <= COMPACT_OBJECTS + 1, round_  # the journal alone, before the first snapshot
        read = LedgerStore(store, PREFIX).read()
        assert read is not None and read.points == ledger.points
        if start == "snapshot" or writer.compactions:  # a journal alone names no file yet
            assert (read.file, read.sweep) == ("grid.lisp", "lrs")
    assert max(counts) < MOST_OBJECTS and writer.compactions >= 2, (counts, writer.compactions)


def test_the_ledger_bytes_written_per_change_stay_flat_as_the_sweep_grows(tmp_path: Path) -> None:
    """Rounds of two changed points over a sweep of 200 points and one of 800: the bytes
    written per change (journal and compactions together) stay within a factor of 1.5, where
    a compaction every COMPACT_OBJECTS rounds wrote 3.4 times as many per change at 800 points
    as at 200 (the snapshot grows with the sweep)."""
    per_change = []
    for size in (200, 800):
        store = Store.open(str(tmp_path / str(size)))
        ledger = SweepLedger(file="grid.lisp", sweep="lrs", points=records(size))
        writer = LedgerStore(store, PREFIX, "driver-a", header=("grid.lisp", "lrs"))
        writer.write_snapshot(ledger)
        start, changes = writer.bytes_written, 0
        for round_ in range(size):
            for point in (ledger.points[(2 * round_) % size], ledger.points[(2 * round_ + 1) % size]):
                point.state, point.attempts = "running", point.attempts + 1
            changes += writer.write_points(ledger.points)
        assert writer.compactions >= 2
        per_change.append((writer.bytes_written - start) / changes)
        read = LedgerStore(store, PREFIX).read()
        assert read is not None and read.points == ledger.points
    assert per_change[1] < 1.5 * per_change[0], per_change


def finished_one_a_round(tmp_path: Path, points: int, rounds: int, writer: str) -> tuple[Store, SweepLedger, LedgerStore]:
    """A snapshot of POINTS points, then ROUNDS rounds of WRITER's, each finishing the next
    point (journalled, not compacted)."""
    store = Store.open(str(tmp_path))
    ledger = SweepLedger(file="grid.lisp", sweep="lrs", points=records(points))
    kept = LedgerStore(store, PREFIX, writer)
    kept.write_snapshot(ledger)
    for round_ in range(rounds):
        ledger.points[round_].state = "finished"
        kept.write_points(ledger.points, compact=False)
    return store, ledger, kept


def test_a_compaction_under_way_is_left_alone_by_another_writer(tmp_path: Path) -> None:
    """On a local folder the compaction's mark is held by one writer at a time: another
    writer's compaction leaves the snapshot and the journal as they are and is counted
    refused; a mark left by a writer killed in its compaction is taken over once stale."""
    from sexpgpu.sweeps.ledger import STALE_COMPACTION_S

    store, ledger, writer = finished_one_a_round(tmp_path, 10, 4, "driver-b")
    snapshot = store.read_bytes(f"{PREFIX}/sweep.json")
    assert store.create_new(f"{PREFIX}/compacting", b"driver-a\n")  # driver-a is compacting
    writer.compact()
    assert (writer.refused, writer.compactions) == (1, 0)
    assert store.read_bytes(f"{PREFIX}/sweep.json") == snapshot and len(journal_objects(store)) == 4
    old = os.path.getmtime(tmp_path / PREFIX / "compacting") - STALE_COMPACTION_S - 1
    os.utime(tmp_path / PREFIX / "compacting", (old, old))  # driver-a was killed in it
    writer.compact()
    assert (writer.refused, writer.compactions) == (1, 1) and journal_objects(store) == []
    assert not store.exists(f"{PREFIX}/compacting")
    assert [p.name for p in (tmp_path / PREFIX).iterdir() if "compacting" in p.name] == []  # the stale mark moved aside is gone too
    read = LedgerStore(store, PREFIX).read()
    assert read is not None and read.points == ledger.points


@contextmanager
def two_writers_on_s3(points: int) -> Iterator[tuple[str, SweepLedger, LedgerStore, LedgerStore]]:
    """S3 on loopback (moto): a bucket's URL, a ledger of POINTS points written as its
    snapshot by driver-a, and the LedgerStores of driver-a and driver-b."""
    pytest.importorskip("s3fs")
    from s3_server import MotoS3, make_bucket, patched_env, s3_env

    with MotoS3() as moto, patched_env(s3_env(moto.endpoint)):
        url = f"s3://{make_bucket(None, moto.endpoint)}/team"
        ledger = SweepLedger(file="grid.lisp", sweep="lrs", points=records(points))
        first, second = LedgerStore(Store.open(url), PREFIX, "driver-a"), LedgerStore(Store.open(url), PREFIX, "driver-b")
        first.write_snapshot(ledger)
        yield url, ledger, first, second


def test_of_two_writers_compacting_at_once_on_s3_the_later_leaves_the_snapshot_alone() -> None:
    """S3 on loopback (moto): driver-a reads the ledger to compact it; before it writes,
    driver-b journals a change and compacts (its snapshot holds the change, its journal object
    is removed). driver-a's snapshot, which lacks the change, is refused by the store (If-Match
    on the version it read over), so the change is not lost; driver-a compacts later."""
    with two_writers_on_s3(10) as (url, ledger, first, second):
        for i in range(4):
            ledger.points[i].state = "finished"
            (first if i % 2 else second).write_points([ledger.points[i]], compact=False)
        read = first.read

        def then_the_other_compacts() -> SweepLedger | None:
            held = read()
            ledger.points[8].state, ledger.points[8].attempts = "running", 1
            second.write_points([ledger.points[8]], compact=False)
            second.compact()
            return held

        first.read = then_the_other_compacts  # type: ignore[method-assign]
        first.compact()
        assert (first.refused, first.compactions, second.compactions) == (1, 0, 1)
        after = LedgerStore(Store.open(url), PREFIX).read()
        assert after is not None and after.points == ledger.points
        first.read = read  # type: ignore[method-assign]
        first.compact()
        assert first.compactions == 1
        final = LedgerStore(Store.open(url), PREFIX).read()
        assert final is not None and final.points == ledger.points


def test_a_read_after_a_compaction_equals_the_read_before(tmp_path: Path) -> None:
    store, ledger, writer = finished_one_a_round(tmp_path, 20, 10, "driver-a")
    before = LedgerStore(store, PREFIX).read()
    assert len(journal_objects(store)) == 10
    writer.compact()
    assert journal_objects(store) == []
    after = LedgerStore(store, PREFIX).read()
    assert before is not None and after is not None and after.points == before.points == ledger.points


def test_a_compaction_killed_between_the_snapshot_and_the_removals_reads_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot is written, then the store refuses the removals (a kill, an outage) after
    some of them: what is left reads as the snapshot does, and the next compaction folds it."""
    from sexpgpu.runtime.store import StoreError

    store = Store.open(str(tmp_path))
    ledger = SweepLedger(file="grid.lisp", sweep="lrs", points=records(6))
    writer = LedgerStore(store, PREFIX, "driver-a")
    writer.write_snapshot(ledger)
    for round_ in range(8):  # the same points changed again and again: an older object left under a newer one would show
        point = ledger.points[round_ % 3]
        point.state, point.attempts = "running", round_ + 1
        writer.write_points(ledger.points, compact=False)
    before = LedgerStore(store, PREFIX).read()
    deleted: list[str] = []
    refused: list[str] = []
    delete = Store.delete

    def then_the_store_is_away(self: Store, path: str, recursive: bool = False, missing_ok: bool = True) -> None:
        if len(deleted) == 3 and not refused:  # one removal refused: one after it would leave an older object under the snapshot
            refused.append(path)
            raise StoreError("the store is away")
        deleted.append(path)
        delete(self, path, recursive, missing_ok)

    monkeypatch.setattr(Store, "delete", then_the_store_is_away)
    writer.compact()
    assert len(journal_objects(store)) == 5
    middle = LedgerStore(store, PREFIX).read()
    monkeypatch.undo()
    writer.compact()
    after = LedgerStore(store, PREFIX).read()
    assert journal_objects(store) == []
    assert before is not None and middle is not None and after is not None
    assert middle.points == before.points == after.points == ledger.points


def test_two_writers_compact_interleaved(tmp_path: Path) -> None:
    """Two drivers' rounds interleaved, each compacting: what the other journals after a
    compaction's listing stays, and every read is the latest record of every point."""
    from sexpgpu.sweeps.ledger import COMPACT_OBJECTS

    store = Store.open(str(tmp_path))
    ledger = SweepLedger(file="grid.lisp", sweep="lrs", points=records(40))
    LedgerStore(store, PREFIX).write_snapshot(ledger)
    writers = [LedgerStore(store, PREFIX, "driver-a"), LedgerStore(store, PREFIX, "driver-b")]
    for writer in writers:
        assert writer.read() is not None
    counts = []
    for round_ in range(3 * COMPACT_OBJECTS):
        for side, writer in enumerate(writers):  # a: the even points, b: the odd
            point = ledger.points[(2 * round_ + side) % 40]
            point.state, point.attempts, point.lease = "running", point.attempts + 1, writer.writer
            writer.write_points([point])
        counts.append(len(journal_objects(store)))
        read = LedgerStore(store, PREFIX).read()
        assert read is not None and read.points == ledger.points
    assert all(writer.compactions >= 2 for writer in writers) and max(counts) <= 2 * COMPACT_OBJECTS, counts


def test_a_sweep_ends_on_s3_without_replacing_a_snapshot_that_holds_what_it_lacks() -> None:
    """S3 on loopback (moto): driver-a ends its sweep, writing the whole ledger; between its
    read and its write, driver-b journals a change and compacts (the change is then in the
    snapshot alone). driver-a's snapshot, which lacks it, is refused (If-Match on the version
    it read over); it reads again, keeps driver-b's record of that point (advanced further
    than driver-a knew) and its own of the rest, and writes. Nothing is lost."""
    with two_writers_on_s3(10) as (url, stored, first, second):
        ours = stored.model_copy(deep=True)
        ours.points[5].state, ours.points[5].attempts = "finished", 1  # driver-a's own end
        read, reads = first.read, []

        def then_the_other_compacts() -> SweepLedger | None:
            held = read()
            reads.append(held)
            if len(reads) == 1:
                theirs = stored.points[8].model_copy(update={"state": "running", "attempts": 1, "lease": "driver-b"})
                second.write_points([theirs], compact=False)
                second.compact()
            return held

        first.read = then_the_other_compacts  # type: ignore[method-assign]
        assert first.write_whole(ours)
        assert len(reads) == 2 and second.compactions == 1 and first.refused == 0
        after = LedgerStore(Store.open(url), PREFIX).read()
        assert after is not None
        assert (after.points[8].state, after.points[8].attempts, after.points[8].lease) == ("running", 1, "driver-b")
        assert (after.points[5].state, after.points[5].attempts) == ("finished", 1)
        assert after.points == ours.points and [p.slug for p in after.points] == [p.slug for p in stored.points]
        snapshot = SweepLedger.model_validate_json(Store.open(url).read_bytes(f"{PREFIX}/sweep.json"))
        assert snapshot.points == ours.points  # in the snapshot itself, not only laid over it


def test_a_whole_ledger_write_under_another_writers_compaction_journals_and_leaves_the_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a local folder the whole ledger is written under the compaction's mark: while
    another writer holds it (past MARK_WAIT_S), the snapshot is left as it is and counted
    refused, and the records are journalled all the same, so the ledger reads as this
    writer's view; once the mark is gone the next write folds them into the snapshot."""
    import sexpgpu.sweeps.ledger as ledger_module

    monkeypatch.setattr(ledger_module, "MARK_WAIT_S", 0.0)
    store = Store.open(str(tmp_path))
    ledger = SweepLedger(file="grid.lisp", sweep="lrs", points=records(6))
    writer = LedgerStore(store, PREFIX, "driver-a")
    assert writer.write_whole(ledger, merge=False)
    snapshot = store.read_bytes(f"{PREFIX}/sweep.json")
    assert store.create_new(f"{PREFIX}/compacting", b"driver-b\n")  # driver-b is compacting
    ledger.points[2].state, ledger.points[2].attempts = "finished", 1
    assert not writer.write_whole(ledger)
    assert writer.refused == 1 and store.read_bytes(f"{PREFIX}/sweep.json") == snapshot and len(journal_objects(store)) == 1
    read = LedgerStore(store, PREFIX).read()
    assert read is not None and read.points == ledger.points
    store.delete(f"{PREFIX}/compacting")
    assert writer.write_whole(ledger)
    assert journal_objects(store) == [] and not store.exists(f"{PREFIX}/compacting")
    final = SweepLedger.model_validate_json(store.read_bytes(f"{PREFIX}/sweep.json"))
    assert final.points == ledger.points
