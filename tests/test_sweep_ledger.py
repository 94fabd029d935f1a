"""The Ray driver's ledger in the store: one record per point, written when that point
changes (never the whole sweep each round), a ledger of the older one-file form still reads,
and a round of the driver reads the store only for the points another driver holds."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

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
    writer = LedgerStore(store, PREFIX)
    writer.write_points(ledger.points)
    writer.write_snapshot(ledger)
    writes = recorded_writes(monkeypatch)
    ledger.points[7].state, ledger.points[7].attempts = "running", 1
    assert writer.write_points(ledger.points) == 1
    assert writes == [f"{PREFIX}/points/grid-0007-abcdef.json"]
    assert writer.write_points(ledger.points) == 0  # nothing changed since
    again = LedgerStore(store, PREFIX).read()  # another driver's view: the snapshot, the record over it
    assert again is not None
    assert again.points == ledger.points
    assert (again.file, again.sweep) == ("grid.lisp", "lrs")


def test_a_point_record_reads_over_an_older_snapshot(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path))
    ledger = SweepLedger(file="grid.lisp", sweep="lrs", points=records(3))
    LedgerStore(store, PREFIX).write_snapshot(ledger)
    ended = ledger.points[2].model_copy(update={"state": "finished", "steps": 50, "attempts": 1})
    LedgerStore(store, PREFIX).write_points([ended])
    read = LedgerStore(store, PREFIX).read()
    assert read is not None
    assert [p.state for p in read.points] == ["pending", "pending", "finished"]


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
    reads: list[str] = []
    original = Store.read_bytes

    def recording(self: Store, path: str, *args: Any, **kwargs: Any) -> bytes:
        reads.append(path)
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(Store, "read_bytes", recording)
    supervision = Supervision(driver, ledger)
    supervision.follow_others()
    assert sorted(reads) == sorted(["grid-0003-abcdef/status.json", driver.leases.key(3), "grid-0150-abcdef/status.json", driver.leases.key(150)])
    assert ledger.points[3].state == "pending"  # its lease is gone: this driver may take it
    assert (ledger.points[150].state, ledger.points[150].lease) == ("leased", "other-driver")
    reads.clear()
    supervision.follow_others()  # again within FOLLOW_EVERY_S: nothing read
    assert reads == [] and FOLLOW_EVERY_S > 0
