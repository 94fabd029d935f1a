"""Leases: one writer at a time for a thing in the store (a run folder, a sweep's point).

A lease is one small JSON object naming its holder and the holder's last heartbeat. It is
taken so that of two claimants exactly one wins:

- on a local folder, by creating the file exclusively (O_EXCL): the filesystem decides;
- on an object store with conditional writes (S3: If-None-Match, If-Match), by creating it
  only if there is none, or replacing the one it judged expired only if it is still that
  one (its version): the store decides, at once;
- on an object store without them, by writing it, waiting `verify_after_s` and reading it
  back: of two claimants the later write wins and the other backs off. This needs a store
  whose reads see a completed write (S3 is strongly consistent).

Either way the clocks must agree to well within `ttl_s`.

The holder renews it while it works; a lease whose heartbeat is older than `ttl_s`, or whose
holder is a process of this host that is gone, belongs to nobody and may be taken over. A
holder that finds its lease taken (it was presumed dead) must stop writing: renewals report
it, and a writer checks before each publish.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional, TypeVar

from pydantic import BaseModel

from .store import NotARegularFile, Store, UnexpectedSize

LEASE_TTL_S = 60.0
LEASE_VERIFY_AFTER_S = 1.0
LEASE_LIMIT = 64 * 1024  # a lease is a few hundred bytes
CLAIMERS = 16  # lease requests in flight at once
T = TypeVar("T")


class Lease(BaseModel):
    holder: str  # an id chosen by the holder: a driver's, an attempt's
    host: str
    pid: int = 0
    heartbeat: float  # unix time

    def describe(self, now: float) -> str:
        return f"{self.host} pid {self.pid}, heartbeat {max(0.0, now - self.heartbeat):.0f} s ago"


class UnreadableLease(Lease):
    """A lease file that holds no lease (empty, torn, not JSON: a disk that filled while it
    was written). Its heartbeat is the file's modification time, so it is judged by the same
    patience as a readable one; never written."""

    content: Optional[bytes] = None  # what it held; None: not a regular file, or too large to be a lease

    def describe(self, now: float) -> str:
        return f"a lease file that cannot be read, written {max(0.0, now - self.heartbeat):.0f} s ago"


class Leases:
    """The leases of one holder, at paths of one store."""

    def __init__(self, store: Store, holder: str, ttl_s: float = LEASE_TTL_S, verify_after_s: float = LEASE_VERIFY_AFTER_S) -> None:
        self.store = store
        self.holder = holder
        self.ttl_s = ttl_s
        self.verify_after_s = verify_after_s
        self.host = socket.gethostname()
        # path -> the version (ETag) of our last conditional write there, as the store replied:
        # a renewal replaces only that version, with no look first (a write by anyone else in
        # between changed the version, and the replace fails)
        self.written: dict[str, str] = {}

    def mine(self) -> Lease:
        return Lease(holder=self.holder, host=self.host, pid=os.getpid(), heartbeat=time.time())

    def holder_of(self, path: str) -> Optional[Lease]:
        """The lease at PATH: None when there is none, an UnreadableLease when the file holds
        none (it expires like a lease whose last heartbeat was the file's last write)."""
        try:
            content = self.store.read_bytes(path, limit=LEASE_LIMIT)
        except FileNotFoundError:
            return None
        except (NotARegularFile, UnexpectedSize):
            return self.unreadable(path, None)
        try:
            return Lease.model_validate_json(content)
        except ValueError:  # torn, empty or foreign
            return self.unreadable(path, content)

    def unreadable(self, path: str, content: Optional[bytes]) -> Optional[Lease]:
        try:
            written = self.store.modified(path)
        except FileNotFoundError:
            return None
        # a store that does not say when: nothing could be waited for, it holds nothing now
        heartbeat = written if written is not None else time.time() - 2 * self.ttl_s
        return UnreadableLease(holder="", host="", pid=0, heartbeat=heartbeat, content=content)

    def live(self, lease: Lease) -> bool:
        """Whether LEASE's holder may still be at work: a recent heartbeat, and when it is a
        process of this host, that process still running."""
        if time.time() - lease.heartbeat > self.ttl_s:
            return False
        return lease.host != self.host or lease.pid <= 0 or process_alive(lease.pid)

    def held_elsewhere(self, path: str) -> Optional[Lease]:
        """The live lease of another holder at PATH, if any."""
        lease = self.holder_of(path)
        if lease is None or lease.holder == self.holder or not self.live(lease):
            return None
        return lease

    def claim(self, paths: list[str], take_over: bool = False) -> list[str]:
        """Take every lease of PATHS that no live holder has (every one with TAKE_OVER: the
        caller knows their holders are gone); returns the paths now held."""
        if self.store.is_local:  # each an exclusive create, a few at once (each waits on its fsyncs, not the CPU)
            return [p for p, won in zip(paths, self.each(lambda p: self.create(p, take_over), paths), strict=True) if won]
        if self.store.conditional_writes():  # each lease on its own: taken concurrently
            return [p for p, won in zip(paths, self.each(lambda p: self.take(p, take_over), paths), strict=True) if won]
        free = [p for p, elsewhere in zip(paths, self.each(lambda p: take_over or self.held_elsewhere(p) is None, paths), strict=True) if elsewhere]
        self.each(self.write, free)
        if not free:
            return []
        time.sleep(self.verify_after_s)
        return [p for p in free if (lease := self.holder_of(p)) is not None and lease.holder == self.holder]

    def each(self, action: Callable[[str], T], paths: list[str]) -> list[T]:
        """ACTION on each of PATHS, a few store requests in flight at once (they wait on the
        network), in the order of PATHS."""
        if len(paths) <= 1:
            return [action(p) for p in paths]
        with ThreadPoolExecutor(max_workers=min(CLAIMERS, len(paths)), thread_name_prefix="sexpgpu-lease") as pool:
            return list(pool.map(action, paths))

    def create(self, path: str, take_over: bool) -> bool:
        """The lease at PATH made ours by an exclusive create (of two claimants one wins),
        after moving aside one that holds nothing any more (expired, dead, or one we take
        over): the move is atomic, and a lease that turns out to be another claimant's fresh
        one is put back."""
        current = self.holder_of(path)
        if current is not None:
            if current.holder != self.holder and self.live(current) and not take_over:
                return False
            moved = self.store.move_aside(path)
            if moved is None:  # another claimant moved it first: the exclusive create decides
                pass
            elif not same_lease(moved.data, current):  # not the one we judged: put it back
                moved.restore()
                return False
            else:
                moved.discard()
        return self.store.create_new(path, self.mine().model_dump_json().encode())

    def take(self, path: str, take_over: bool) -> bool:
        """The lease at PATH made ours by a conditional write: created if there is none (tried
        first: the usual case, one request), else replaced if it holds nothing any more (or
        we take it over) and is still the version we judged. The version is read before the
        lease, so a lease renewed in between fails the replace rather than being judged by
        its older self."""
        mine = self.mine().model_dump_json().encode()
        if self.put(path, mine, None):
            return True
        version = self.store.version(path)
        current = self.holder_of(path) if version is not None else None
        if current is None:
            return self.put(path, mine, None) or self.still_mine(path)
        if current.holder != self.holder and self.live(current) and not take_over:
            return False
        return self.put(path, mine, version or "") or self.still_mine(path)

    def put(self, path: str, data: bytes, version: Optional[str]) -> bool:
        """A conditional write of our lease (a create when VERSION is None); the version it
        wrote is kept for the next renewal."""
        self.written.pop(path, None)
        done = self.store.put_if(path, data, version)
        if done.written and done.version is not None:
            self.written[path] = done.version
        return done.written

    def write(self, path: str) -> None:
        self.store.write_text(path, self.mine().model_dump_json())

    def still_mine(self, path: str) -> bool:
        lease = self.holder_of(path)
        return lease is not None and lease.holder == self.holder

    def renew(self, paths: list[str]) -> list[str]:
        """Renew our leases at PATHS (a few requests in flight at once); returns those another
        holder took."""
        return [path for path, kept in zip(paths, self.each(self.renew_one, paths), strict=True) if not kept]

    def renew_one(self, path: str) -> bool:
        """Renew our lease at PATH; False when another holder has it. With conditional
        writes the renewal replaces only the version we wrote last (one request), or, when
        that was not ours any more or is not known, the version read as ours (a takeover in
        between wins either way)."""
        if self.store.is_local or not self.store.conditional_writes():
            if not self.still_mine(path):
                return False
            self.write(path)
            return True
        mine = self.mine().model_dump_json().encode()
        known = self.written.get(path)
        if known is not None and self.put(path, mine, known):
            return True
        version = self.store.version(path)  # changed since (our own write whose reply was lost, or a taker's)
        if version is None or not self.still_mine(path):
            return False
        return self.put(path, mine, version)

    def release(self, path: str) -> None:
        self.written.pop(path, None)
        if self.still_mine(path):
            self.store.delete(path)

    def keep_renewed(self, paths: Callable[[], list[str]]) -> "Renewal":
        """Renew the leases of PATHS() every ttl/4 from a thread until stopped."""
        renewal = Renewal(self, paths)
        renewal.start()
        return renewal


class Renewal(threading.Thread):
    """A holder's heartbeat. Leases another holder took are collected (take_lost); a store
    outage only delays a renewal."""

    def __init__(self, leases: Leases, paths: Callable[[], list[str]]) -> None:
        super().__init__(name="sexpgpu lease renewal", daemon=True)
        self.leases = leases
        self.paths = paths
        self.halt = threading.Event()
        self.lock = threading.Lock()
        self.lost: set[str] = set()

    def run(self) -> None:
        while not self.halt.wait(self.leases.ttl_s / 4):
            try:
                lost = self.leases.renew(list(self.paths()))
            except Exception:  # the store is away (after its retries): renew on the next beat
                continue
            with self.lock:
                self.lost.update(lost)

    def take_lost(self) -> list[str]:
        with self.lock:
            lost, self.lost = sorted(self.lost), set()
        return lost

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=10)


def same_lease(data: bytes, judged: Lease) -> bool:
    """Whether DATA, a lease file's bytes, is the lease JUDGED was read as."""
    try:
        lease: Optional[Lease] = Lease.model_validate_json(data)
    except ValueError:
        lease = None
    if isinstance(judged, UnreadableLease):
        return data == judged.content if judged.content is not None else lease is None
    return lease == judged


def process_alive(pid: int) -> bool:
    """Whether process PID of this host runs (another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
