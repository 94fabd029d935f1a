"""Leases on an object store with conditional writes (S3 on loopback: moto's server) are
decided by the store at once: no wait-and-read-back, one winner of two claimants, an expired
lease taken over only in the version judged expired, and a holder presumed dead learns it
lost the lease."""

from __future__ import annotations

import re
import threading
import time
from typing import Any, Iterator
from urllib.parse import unquote

import pytest

from s3_server import MotoS3, make_bucket, patched_env, s3_env
from sexpgpu.runtime import lease as lease_module
from sexpgpu.runtime.lease import Lease, Leases
from sexpgpu.runtime.store import Store, UnexpectedSize

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


class Requests:
    """The S3 requests a store's client sends, as `METHOD key` (a listing as `LIST prefix`)."""

    def __init__(self, store: Store) -> None:
        self.sent: list[str] = []
        store.fs.connect()
        self.client = store.fs.s3
        self.client.meta.events.register("before-send.s3", self.hook)

    def hook(self, request: Any, **_: Any) -> None:
        path, _, query = str(request.url).partition("?")
        listed = re.search(r"prefix=([^&]*)", query)
        what = f"LIST {unquote(listed.group(1))}" if listed else f"{request.method} {path.split('/', 4)[-1]}"
        self.sent.append(what)

    def close(self) -> list[str]:
        self.client.meta.events.unregister("before-send.s3", self.hook)
        return self.sent


def test_a_bounded_read_is_one_request_present_missing_empty_or_too_large(s3_url: str) -> None:
    """A status or lease read (at most LIMIT bytes) is one ranged GET: no HEAD first, and no
    LIST for a missing object (s3fs looks for a folder of that name after a HEAD's 404)."""
    store = Store.open(s3_url)
    store.write_text("bounded/full.json", "abc")
    store.write_text("bounded/empty.json", "")
    store.write_text("bounded/large.json", "x" * 100)
    requests = Requests(store)
    assert store.read_bytes("bounded/full.json", limit=3) == b"abc"
    assert store.read_bytes("bounded/empty.json", limit=3) == b""
    with pytest.raises(FileNotFoundError):
        store.read_bytes("bounded/missing.json", limit=3)
    with pytest.raises(UnexpectedSize, match="more than the 99"):
        store.read_bytes("bounded/large.json", limit=99)
    names = ["full", "empty", "missing", "large"]
    assert requests.close() == [f"GET team/bounded/{name}.json" for name in names]


def test_a_free_lease_is_claimed_in_one_request(s3_url: str, no_waiting: Any) -> None:
    store = Store.open(s3_url)
    leases = Leases(store, "driver-c")
    assert store.conditional_writes()  # probed before counting
    requests = Requests(store)
    assert leases.claim(["free/point-0000.json"]) == ["free/point-0000.json"]
    assert requests.close() == ["PUT team/free/point-0000.json"]  # a create: no HEAD, no LIST first
    assert leases.still_mine("free/point-0000.json")


def test_leases_are_renewed_concurrently(s3_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver holding many leases renews them with requests in flight at once (one at a
    time, a beat on a slow store outlasts the leases): each renewal waits until both began."""
    store = Store.open(s3_url)
    leases = Leases(store, "driver-d")
    paths = ["both/point-0000.json", "both/point-0001.json"]
    assert leases.claim(paths) == paths
    together = threading.Barrier(2, timeout=60)
    renew_one = Leases.renew_one

    def when_both_began(self: Leases, path: str) -> bool:
        together.wait()  # one renewal after the other: broken after the timeout, and the test fails
        return renew_one(self, path)

    monkeypatch.setattr(Leases, "renew_one", when_both_began)
    assert leases.renew(paths) == []
    assert all(leases.still_mine(p) for p in paths)


def test_a_lease_is_renewed_in_one_request_and_a_takeover_still_wins(s3_url: str, no_waiting: Any) -> None:
    """The holder replaces the version it wrote last, with no look first; once another holder
    took the lease over, that replace fails and the holder learns it lost the lease."""
    store = Store.open(s3_url)
    holder = Leases(store, "driver-e")
    path = "renewed/point-0000.json"
    assert holder.claim([path]) == [path]
    requests = Requests(store)
    assert holder.renew([path]) == [] and holder.renew([path]) == []
    assert requests.close() == [f"PUT team/{path}"] * 2
    taker = Leases(Store.open(s3_url), "driver-f")
    assert taker.claim([path], take_over=True) == [path]
    assert holder.renew([path]) == [path]
    assert taker.still_mine(path) and not holder.still_mine(path)
