"""Leases on an object store with conditional writes (S3 on loopback: moto's server) are
decided by the store at once: no wait-and-read-back, one winner of two claimants, an expired
lease taken over only in the version judged expired, and a holder presumed dead learns it
lost the lease."""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest

from s3_server import MotoS3, make_bucket, patched_env, s3_env
from sexpgpu.runtime import lease as lease_module
from sexpgpu.runtime.lease import Lease, Leases
from sexpgpu.runtime.store import Store

PATH = "sweeps/grid.lrs/leases/point-0000.json"


@pytest.fixture(scope="module")
def s3_url() -> Iterator[str]:
    pytest.importorskip("s3fs")
    with MotoS3() as moto, patched_env(s3_env(moto.endpoint)):
        yield f"s3://{make_bucket(None, moto.endpoint)}/team"


@pytest.fixture
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim that would wait before reading its lease back fails the test."""

    def forbidden(seconds: float) -> None:
        raise AssertionError(f"a lease claim waited {seconds} s")

    monkeypatch.setattr(lease_module.time, "sleep", forbidden)


def test_the_store_has_conditional_writes(s3_url: str) -> None:
    store = Store.open(s3_url)
    assert store.conditional_writes()
    assert store.list() == []  # the probe left nothing behind


def test_of_two_claimants_one_wins_without_a_wait(s3_url: str, no_waiting: Any) -> None:
    first, second = Leases(Store.open(s3_url), "driver-a"), Leases(Store.open(s3_url), "driver-b")
    paths = [f"one/point-{i:04d}.json" for i in range(3)]
    assert first.claim(paths) == paths
    assert second.claim(paths) == []
    assert all(first.still_mine(p) for p in paths)


def test_an_expired_lease_is_taken_over_and_its_old_holder_learns_it(s3_url: str, no_waiting: Any) -> None:
    store = Store.open(s3_url)
    old = Lease(holder="gone", host="elsewhere", pid=1, heartbeat=time.time() - 3600)
    store.write_text(PATH, old.model_dump_json())
    taker = Leases(Store.open(s3_url), "driver-b")
    assert taker.claim([PATH]) == [PATH]
    presumed_dead = Leases(Store.open(s3_url), "gone")
    assert presumed_dead.renew([PATH]) == [PATH]  # lost: its renewal does not overwrite the taker's lease
    assert taker.still_mine(PATH)
    assert taker.renew([PATH]) == []


def test_a_replace_of_a_version_that_changed_is_refused(s3_url: str) -> None:
    store = Store.open(s3_url)
    store.write_text("two/lease.json", "first")
    judged = store.version("two/lease.json")
    assert judged is not None
    store.write_text("two/lease.json", "renewed since")
    assert not store.replace_if("two/lease.json", b"taker", judged)
    assert store.read_text("two/lease.json") == "renewed since"
    assert store.create_new("two/lease.json", b"again") is False
    assert store.version("two/none.json") is None
