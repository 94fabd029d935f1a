"""The sweep's points as they are compiled: the driver starts the first ones while later ones
still compile and their bundles are written.

A thread takes the points from their iterator (Session.stream_sweep: one shape group at a
time), writes the first one's bundle alone (so that the first point starts as soon as it
can) and the others' on a pool of writers (store requests wait on the network, so several
are in flight at once) and hands the driver each point's record. A point's compiled
program is dropped once its bundle is written: the driver keeps only the record. The thread
stops at the first point that cannot be bundled (it does not check, a data source is not
readable): no later point is handed over, and the driver ends the sweep with that error
once the points it started have ended.
"""

from __future__ import annotations

import functools
import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Generic, Iterable, Optional, TypeVar

P = TypeVar("P")
R = TypeVar("R")
BUNDLE_WRITERS = 8  # bundles written at once (after the first, which is written alone)
FIRST_START_S = 10.0  # the longest the feed waits for the driver to start the first point


class Feed(Generic[P, R]):
    """POINTS, each turned into a record by MAKE (which writes its bundle) on WRITERS threads."""

    def __init__(self, points: Iterable[P], make: Callable[[P], R], writers: int = BUNDLE_WRITERS) -> None:
        self.points, self.make, self.writers = points, make, writers
        self.ready: queue.Queue[R] = queue.Queue()
        self.error: Optional[BaseException] = None
        self.done = threading.Event()
        self.halt = threading.Event()
        self.going = threading.Event()  # the driver has started the first point
        self.thread = threading.Thread(target=self.feed, name="sexpgpu-sweep-feed", daemon=True)

    def start(self) -> "Feed[P, R]":
        self.thread.start()
        return self

    def feed(self) -> None:
        try:
            points = iter(self.points)
            first = next(points, None)
            if first is not None:  # alone: the first point's start waits on no other bundle
                self.ready.put(self.make(first))
                # nor on the later points' compiles, which would take the CPU (and Python's lock)
                # from the driver while it starts it
                self.going.wait(FIRST_START_S)
            with ThreadPoolExecutor(max_workers=self.writers, thread_name_prefix="sexpgpu-bundle") as pool:
                slots = threading.BoundedSemaphore(2 * self.writers)  # a bounded number of compiled points held
                for point in points:
                    slots.acquire()
                    if self.halt.is_set():
                        break
                    future = pool.submit(self.make, point)
                    future.add_done_callback(functools.partial(self.hand, slots))
        except BaseException as exc:  # the driver raises it once its started points have ended
            self.fail(exc)
        finally:
            self.done.set()

    def hand(self, slots: threading.BoundedSemaphore, future: "Future[R]") -> None:
        """A point's record, handed to the driver as soon as its bundle is written."""
        slots.release()
        if future.cancelled():
            return
        error = future.exception()
        if error is not None:
            self.fail(error)
        elif not self.halt.is_set():
            self.ready.put(future.result())

    def fail(self, error: BaseException) -> None:
        """The first error ends the feed: no later point is handed over."""
        if self.error is None:
            self.error = error
        self.halt.set()

    def take(self, wait_s: float = 0.0) -> list[R]:
        """The records ready now; with WAIT_S, waiting up to that long for the first one."""
        taken: list[R] = []
        try:
            taken.append(self.ready.get(timeout=wait_s) if wait_s > 0 else self.ready.get_nowait())
            while True:
                taken.append(self.ready.get_nowait())
        except queue.Empty:
            return taken

    def exhausted(self) -> bool:
        """Every point handed over (or the feed stopped at an error) and taken."""
        return self.done.is_set() and self.ready.empty()

    def go(self) -> None:
        """The driver started the first point: compile and bundle the rest."""
        self.going.set()

    def stop(self) -> None:
        self.halt.set()
        self.going.set()
