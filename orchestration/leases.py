"""Point leases: two drivers on one sweep folder never run the same point.

A lease is one small object per point, STORE/sweeps/STEM.SWEEP/leases/point-NNNN.json, that
names the driver holding it and its last heartbeat. Taking points is write-then-verify: a
driver writes its lease on every free point, waits `verify_after_s`, and keeps only the points
whose lease still names it (of two drivers racing for a point the later write wins and the
other backs off). The holder renews its leases while the points run; a lease whose
heartbeat is older than `ttl_s` belongs to a driver that is gone, and another driver may take
the point over (it resumes from the point's latest checkpoint).

This needs a store whose reads see a completed write (local folders; S3 has been strongly
consistent since 2020) and drivers whose clocks agree to well within `ttl_s`.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable, Optional

from pydantic import BaseModel

from sexpgpu.runtime.store import Store

LEASE_TTL_S = 60.0
LEASE_VERIFY_AFTER_S = 1.0


class Lease(BaseModel):
    driver: str
    host: str
    heartbeat: float  # unix time


class Leases:
    def __init__(self, store: Store, prefix: str, driver: str, ttl_s: float = LEASE_TTL_S, verify_after_s: float = LEASE_VERIFY_AFTER_S) -> None:
        self.store = store
        self.prefix = f"{prefix}/leases"
        self.driver = driver
        self.ttl_s = ttl_s
        self.verify_after_s = verify_after_s
        self.host = socket.gethostname()

    def key(self, point: int) -> str:
        return f"{self.prefix}/point-{point:04d}.json"

    def holder(self, point: int) -> Optional[Lease]:
        try:
            return Lease.model_validate_json(self.store.read_bytes(self.key(point)))
        except FileNotFoundError:
            return None

    def held_elsewhere(self, point: int) -> Optional[Lease]:
        """The live lease of another driver on POINT, if any."""
        lease = self.holder(point)
        if lease is None or lease.driver == self.driver or time.time() - lease.heartbeat > self.ttl_s:
            return None
        return lease

    def write(self, point: int) -> None:
        self.store.write_text(self.key(point), Lease(driver=self.driver, host=self.host, heartbeat=time.time()).model_dump_json())

    def claim(self, points: list[int]) -> list[int]:
        """Take every point of POINTS that no live driver holds; returns those now ours."""
        written = []
        for point in points:
            if self.held_elsewhere(point) is None:
                self.write(point)
                written.append(point)
        if not written:
            return []
        time.sleep(self.verify_after_s)
        return [p for p in written if (lease := self.holder(p)) is not None and lease.driver == self.driver]

    def renew(self, points: list[int]) -> list[int]:
        """Renew our leases on POINTS; returns the points whose lease another driver took."""
        lost = []
        for point in points:
            lease = self.holder(point)
            if lease is not None and lease.driver != self.driver:
                lost.append(point)
            else:
                self.write(point)
        return lost

    def release(self, point: int) -> None:
        lease = self.holder(point)
        if lease is not None and lease.driver == self.driver:
            self.store.delete(self.key(point))

    def keep_renewed(self, points: Callable[[], list[int]]) -> "Renewal":
        """Renew the leases of POINTS() every ttl/4 from a thread until stopped."""
        renewal = Renewal(self, points)
        renewal.start()
        return renewal


class Renewal(threading.Thread):
    """The driver's lease heartbeat. Points whose lease another driver took are collected for
    the driver's loop (take_lost); a store outage only delays a renewal."""

    def __init__(self, leases: Leases, points: Callable[[], list[int]]) -> None:
        super().__init__(name="sexpgpu lease renewal", daemon=True)
        self.leases = leases
        self.points = points
        self.halt = threading.Event()
        self.lock = threading.Lock()
        self.lost: set[int] = set()

    def run(self) -> None:
        while not self.halt.wait(self.leases.ttl_s / 4):
            try:
                lost = self.leases.renew(list(self.points()))
            except Exception:  # the store is away (after its retries): renew on the next beat
                continue
            with self.lock:
                self.lost.update(lost)

    def take_lost(self) -> list[int]:
        with self.lock:
            lost, self.lost = sorted(self.lost), set()
        return lost

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=10)

