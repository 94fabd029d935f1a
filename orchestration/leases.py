"""Point leases: two drivers on one sweep folder never run the same point.

A lease is one small object per point, STORE/sweeps/STEM.SWEEP/leases/point-NNNN.json, that
names the driver holding it and its last heartbeat, taken and renewed by the store's one
lease protocol (sexpgpu/runtime/lease.py: exclusive create on a local folder; write, wait
and read back on an object store). The holder renews its leases while the points run; a
lease whose heartbeat is older than the TTL belongs to a driver that is gone, and another
driver may take the point over (it resumes from the point's latest checkpoint).
"""

from __future__ import annotations

from typing import Callable, Optional

from sexpgpu.runtime.lease import LEASE_TTL_S, LEASE_VERIFY_AFTER_S, Lease, Leases, Renewal
from sexpgpu.runtime.store import Store


class PointLeases:
    """One driver's leases on the points of one sweep (points by number)."""

    def __init__(self, store: Store, prefix: str, driver: str, ttl_s: float = LEASE_TTL_S, verify_after_s: float = LEASE_VERIFY_AFTER_S) -> None:
        self.prefix = f"{prefix}/leases"
        self.leases = Leases(store, driver, ttl_s, verify_after_s)

    def key(self, point: int) -> str:
        return f"{self.prefix}/point-{point:04d}.json"

    def point_of(self, key: str) -> int:
        return int(key.rsplit("-", 1)[1].split(".")[0])

    def held_elsewhere(self, point: int) -> Optional[Lease]:
        return self.leases.held_elsewhere(self.key(point))

    def claim(self, points: list[int]) -> list[int]:
        """Take every point of POINTS that no live driver holds; returns those now ours."""
        return [self.point_of(k) for k in self.leases.claim([self.key(p) for p in points])]

    def release(self, point: int) -> None:
        self.leases.release(self.key(point))

    def keep_renewed(self, points: Callable[[], list[int]]) -> "PointRenewal":
        return PointRenewal(self, self.leases.keep_renewed(lambda: [self.key(p) for p in points()]))


class PointRenewal:
    """The driver's lease heartbeat, in points."""

    def __init__(self, leases: PointLeases, renewal: Renewal) -> None:
        self.leases, self.renewal = leases, renewal

    def take_lost(self) -> list[int]:
        return [self.leases.point_of(k) for k in self.renewal.take_lost()]

    def stop(self) -> None:
        self.renewal.stop()
