"""The Ray driver for `sexpgpu sweep FILE --sweep S --ray [ADDRESS]`.

Every point is compiled first (a bad point fails the sweep before anything runs); the driver
checks that the store takes a write and a read back and that the cluster can hold a point;
it writes one bundle per point to the store and runs one TrainWorker per point, as many at
once as the cluster holds. A worker that dies is a preemption: the point is started again
with resume="latest" (unbounded unless max_preemptions is set) and every attempt is
recorded in the ledger. A point that fails on its own (exit 1) is not retried.

The ledger, under STORE/sweeps/STEM.SWEEP/, holds each point's state, attempts and slug: a
journal (journal/), one object per round holding the records of the points that changed in
it, and sweep.json, the whole ledger, written when the sweep starts and ends, into which the
journal is folded (sexpgpu.sweeps.ledger.LedgerStore). A lease per
point (leases/) makes sure two drivers never run the same point.

The driver learns that a point ended from its workers' results (ray.wait on the attempts'
refs), not from the store; it reads the store only for the points another driver holds and
for the few it is about to lease, a bounded batch at a time, concurrently: the work of one
round does not grow with the sweep.
"""

from __future__ import annotations

import contextlib
import itertools
import functools
import logging
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from collections import deque
from typing import Any, Callable, Iterable, Iterator, Literal, Optional, Protocol, Sized, TypeVar

import ray
from ray.actor import ActorHandle

from sexpgpu.bundle import BundleError, write_bundle
from sexpgpu.outcome import AttemptOutcome, Exit
from sexpgpu.runtime.runfolder import RunFolder, run_slug
from sexpgpu.runtime.status import Status
from sexpgpu.runtime.store import Store, StoreError
from sexpgpu.session import Compiled, Session, store_check

from sexpgpu.ir.experiment import Halving, Selection
from sexpgpu.sweeps.ledger import DONE, LedgerStore, PointRecord, SweepLedger, concurrently, record_attempt, take_status
from sexpgpu.sweeps.halving import Contender, Leg, limit, search
from sexpgpu.sweeps.schedulers import SchedulerJob, SyncHalving, scheduler_for
from .attempts import close_status, resume_from, worker_env
from workers.train_worker import AttemptRequest

from .gang import Devices, Gang, single_worker
from .feed import BUNDLE_WRITERS, Feed
from .leases import PointLeases
from .nodes import LostNodes

T = TypeVar("T")
FOLLOW_EVERY_S = 5.0  # how often the points another driver holds are read from the store
ROUND_S = 5.0  # the longest a round waits for a result
FEEDING_ROUND_S = 0.25  # the same while points are still being compiled and handed over
Ended = Literal["finished", "truncated", "failed"]


@dataclass(frozen=True)
class SweepPoint:
    """One point of the sweep, compiled (once, before anything runs)."""

    index: int
    knobs: dict[str, Any]
    compiled: Compiled


def sweep_points(compiled: list[Compiled], knobs: list[dict[str, Any]]) -> list[SweepPoint]:
    """The driver's points: each point's compiled result (Session.compile_sweep) and its knobs."""
    return [SweepPoint(index=i, knobs=values, compiled=c) for i, (c, values) in enumerate(zip(compiled, knobs, strict=True))]


class StreamedPoints:
    """The points of a sweep as they are compiled (an iterator), and how many there will be."""

    def __init__(self, points: Iterator[SweepPoint], count: int) -> None:
        self.points, self.count = points, count

    def __iter__(self) -> Iterator[SweepPoint]:
        return self.points

    def __next__(self) -> SweepPoint:
        return next(self.points)

    def __len__(self) -> int:
        return self.count


def streamed_points(session: Session, path: Path, sweep: str, values: list[dict[str, Any]], base: Optional[Selection] = None) -> StreamedPoints:
    """The points of SWEEP (their knob VALUES), each as soon as SESSION has compiled it
    (Session.stream_sweep); the first that does not check ends them with a SweepError (its
    diagnostics are printed; the driver starts no later point)."""

    def points() -> Iterator[SweepPoint]:
        for i, prepared in session.stream_sweep(path, sweep, len(values), base):
            if isinstance(prepared, AttemptOutcome):
                raise SweepError(f"sweep {sweep}: point {i} does not check", prepared.exit_code)
            yield SweepPoint(index=i, knobs=values[i], compiled=prepared)

    return StreamedPoints(points(), len(values))


def ray_logs() -> str:
    """Where this Ray session writes its logs."""
    try:
        from ray._private.worker import global_worker

        return str(global_worker.node.get_logs_dir_path())
    except Exception:  # a Ray without this internal: its usual place
        return "/tmp/ray/session_latest/logs"


class Table(Protocol):
    """The live table (the CLI's LiveTable): the ledger each round, with the points that
    changed since the last round and those active now (None: look at every point)."""

    def __call__(self, ledger: SweepLedger, final: bool, changed: Optional[list[PointRecord]] = None,
                 active: Optional[list[PointRecord]] = None) -> None: ...


class SweepError(Exception):
    """The sweep cannot start: REASON in the words a run would end with, and its exit CODE
    (4: the store, the cluster, missing software; 3 or 5: a point a bundle cannot carry)."""

    def __init__(self, reason: str, code: Exit = Exit.CANNOT_START) -> None:
        super().__init__(reason)
        self.reason, self.code = reason, code


class Driver:
    def __init__(
        self, path: Path, sweep: str, store_url: str, address: Optional[str], max_preemptions: Optional[int], max_steps: Optional[int],
        say: Callable[[str], None], on_launch: Optional[Callable[[PointRecord, Gang], None]] = None, devices: Optional[Devices] = None,
        table: Optional["Table"] = None, capacity_wait_s: float = 900.0, data_roots: tuple[str, ...] = (),
        retry_failed: bool = False,
    ) -> None:
        self.data_roots = data_roots
        self.retry_failed = retry_failed  # points that failed before run again (else they stay failed)
        self.devices = devices or Devices()
        self.on_launch = on_launch  # tests use it to play a preemption on a chosen rank of a gang
        self.path = path
        self.sweep = sweep
        self.store_url = store_url
        self.store = Store.open(store_url)
        self.address = address
        self.max_preemptions = max_preemptions
        self.max_steps = max_steps
        self.say = say
        self.id = uuid.uuid4().hex[:12]
        self.prefix = f"sweeps/{path.stem}.{sweep}"
        self.leases = PointLeases(self.store, self.prefix, self.id)
        self.ledger_store = LedgerStore(self.store, self.prefix, self.id, header=(path.name, sweep))
        self.capacity_wait_s = capacity_wait_s
        self.idle: list[ActorHandle] = []  # single workers whose point ended cleanly, for the next point
        self.steps: dict[str, int] = {}  # slug -> the run's own :steps
        self.wanted: dict[str, int] = {}  # slug -> the steps this sweep asks of it now (--max-steps, a halving rung)
        self.asking: Optional[Halving] = None  # an asynchronous scheduler's plan, asked by the workers at each rung
        self.limited_by: dict[str, str] = {}  # slug -> what set `wanted` below the run's steps (a rung), if not --max-steps
        self.leases_used = False  # the first write of a run takes merge()'s view as it is
        self.table = table  # the live table (the CLI draws it; None: no table)
        self.lost_nodes = LostNodes(ray.nodes)  # nodes gone but not yet marked dead: no attempt is placed there
        self.warmed = False  # the warm pool was started (warm_pool)
        self.expected: Optional[int] = None  # how many points the sweep has, when known before they are compiled

    # -- before anything runs ----------------------------------------------------------------------
    def preflight(self) -> None:
        """What would stop every point, found before any runs: missing software, a store
        that takes no writes (in the words `run` would end with)."""
        problem = self.devices.software() or store_check(self.store_url)
        if problem is not None:
            raise SweepError(f"cannot start here: {problem}")

    def bundle(self, point: SweepPoint) -> PointRecord:
        """POINT's bundle, from its compiled result (no second compile), and its record."""
        try:  # on the driver's own client
            write_bundle(point.compiled.path, point.compiled.result, self.store.under(f"{self.prefix}/bundles/point-{point.index:04d}"))
        except BundleError as exc:
            what = "data error" if exc.code == Exit.DATA else "bundle refused"
            raise SweepError(f"{what}: point {point.index}: {exc}", exc.code) from None
        slug = run_slug(point.compiled.experiment)
        steps = point.compiled.experiment.run.steps
        self.steps[slug] = steps
        self.wanted[slug] = steps if self.max_steps is None else min(steps, self.max_steps)
        return PointRecord(point=point.index, slug=slug, knobs=point.knobs, planned=self.wanted[slug])

    def bundles(self, points: list[SweepPoint]) -> list[PointRecord]:
        """One bundle per point, written concurrently."""
        return concurrently(self.bundle, points, BUNDLE_WRITERS)

    # -- the ledger -------------------------------------------------------------------------------------
    def read_ledger(self) -> Optional[SweepLedger]:
        return self.ledger_store.read()

    def write_points(self, records: list[PointRecord]) -> None:
        """The records of RECORDS that changed, journalled in one object (a round's write);
        the journal compacted when that is due (LedgerStore)."""
        self.ledger_store.write_points(records)

    def write_ledger(self, ledger: SweepLedger) -> None:
        """Write the whole ledger (as a sweep starts and ends), merged over the store's (but
        the first write of a run, which takes merge()'s view as it is): for points another
        driver has advanced further, that driver's record rather than an older view of ours;
        the snapshot guarded against replacing one that holds what ours lacks
        (LedgerStore.write_whole)."""
        self.ledger_store.write_whole(ledger, merge=self.leases_used)
        self.leases_used = True

    def statuses(self, slugs: list[str]) -> list[Optional[Status]]:
        """The runs' status.json, read concurrently (a bounded pool)."""
        return concurrently(lambda slug: RunFolder(self.store, slug).read_status(), slugs)

    def merge(self, fresh: list[PointRecord]) -> SweepLedger:
        """Keep what an earlier driver learned about points whose slug is unchanged; a point
        whose file or selection changed has a new slug and starts over."""
        return SweepLedger(file=self.path.name, sweep=self.sweep, points=self.adopt(fresh, self.known()))

    def known(self) -> dict[str, PointRecord]:
        """What the earlier drivers of this sweep recorded, by slug."""
        old = self.read_ledger()
        return {p.slug: p for p in old.points} if old else {}

    def adopt(self, fresh: list[PointRecord], known: dict[str, PointRecord]) -> list[PointRecord]:
        """FRESH's records, each with what KNOWN (an earlier driver) and its run's status say."""
        points = []
        for record, status in zip(fresh, self.statuses([r.slug for r in fresh]), strict=True):
            previous = known.get(record.slug)
            if previous is not None:
                record = previous.model_copy(update={"point": record.point, "knobs": record.knobs, "planned": record.planned})
            record.planned = self.wanted[record.slug]
            ended = self.ended(status, record.slug) if status is not None else None
            if ended is not None and status is not None:
                record.state = ended
                take_status(record, status)
            elif record.state in DONE:  # done for an earlier sweep, not for this one (longer, or retrying failures)
                record.state, record.lease = "pending", None
            points.append(record)
        return points

    # -- running ----------------------------------------------------------------------------------------
    def run(self, points: Iterable[SweepPoint], halving: Optional[Halving] = None) -> SweepLedger:
        """Every point to its steps, each started as soon as it is compiled and bundled (POINTS
        may still be compiling: Session.stream_sweep); with HALVING, stage by stage, pruning at
        each rung, once every point is compiled.
        Ray prints its raylet's reports (`(raylet) A worker died ...`) to the driver's
        stdout whatever log_to_driver says: while the driver runs they go to stderr, so that
        stdout holds only what the command prints (one JSON document under --json)."""
        if not sys.stderr.isatty():  # Ray's colour codes only where a terminal shows them
            os.environ.setdefault("RAY_COLOR_PREFIX", "0")
        with contextlib.redirect_stdout(sys.stderr):
            return self.run_points(points, halving)

    def run_points(self, points: Iterable[SweepPoint], halving: Optional[Halving]) -> SweepLedger:
        self.preflight()
        self.expected = len(points) if isinstance(points, Sized) else None
        if ray.is_initialized():  # a Ray this driver did not start: the first point's worker starts while that point compiles
            self.warm_first()
        try:
            feed = self.feed(points) if halving is None else None
        except BaseException:
            self.drop_idle()
            raise
        if ray.is_initialized():  # and the others while the first bundle is written
            self.warm_pool()
        try:
            return self.on_ray(feed if feed is not None else points, halving)
        finally:
            if feed is not None:
                feed.stop()

    def feed(self, points: Iterable[SweepPoint]) -> Feed[SweepPoint, PointRecord]:
        """The points' feed, started: the first point is compiled before anything else (a file
        that does not check fails before Ray starts), the rest while Ray starts and points run."""
        rest = iter(points)
        try:
            first = next(rest, None)
        except SweepError as exc:
            raise SweepError(f"{exc.reason}; nothing was run", exc.code) from None
        return Feed(itertools.chain([] if first is None else [first], rest), self.bundle).start()

    def on_ray(self, points: "Feed[SweepPoint, PointRecord] | Iterable[SweepPoint]", halving: Optional[Halving]) -> SweepLedger:
        started_ray = not ray.is_initialized()
        if started_ray:
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
            # Ray's own INFO lines and its raylet's notes go to its log files, not the sweep's output
            ray.init(address=self.address or "local", include_dashboard=False, log_to_driver=False, ignore_reinit_error=True,
                     logging_level=logging.WARNING)
            self.say(f"ray: {'a local Ray for this sweep' if self.address is None else self.address}; its logs: {ray_logs()}")
        try:
            self.wait_for_capacity()
            self.warm_pool()
            if isinstance(points, Feed) or halving is None:
                return self.stream(points if isinstance(points, Feed) else self.feed(points))
            records = self.bundles(list(points))
            self.write_ledger(self.merge(records))
            return self.search(records, halving)
        finally:
            if started_ray:
                ray.shutdown()

    def stream(self, feed: Feed[SweepPoint, PointRecord]) -> SweepLedger:
        """Every point, each started as soon as its bundle is written (orchestration/feed.py)."""
        ledger = SweepLedger(file=self.path.name, sweep=self.sweep, points=[])
        supervision = Supervision(self, ledger, feed=feed, known=self.known())
        supervision.run()
        if isinstance(feed.error, SweepError):  # a point that cannot run: no later one was started
            ran = "nothing was run" if not supervision.launched else "the points started before it ran to their end, no later one was started"
            raise SweepError(f"{feed.error.reason}; {ran}", feed.error.code)
        if feed.error is not None:
            raise feed.error
        return ledger

    def search(self, records: list[PointRecord], halving: Halving) -> SweepLedger:
        """Successive halving (sexpgpu.sweeps.halving decides): each stage runs its points
        to the stage's steps, as many at once as the cluster holds."""

        def stage(legs: list[Leg]) -> bool:
            for leg in legs:
                self.wanted[leg.contender.slug] = leg.steps
                if leg.by is not None:
                    self.limited_by[leg.contender.slug] = leg.by
                else:
                    self.limited_by.pop(leg.contender.slug, None)
            if legs:
                self.supervise(self.merge(records), only={leg.contender.point for leg in legs})
            return True

        contenders = [Contender(point=r.point, slug=r.slug, steps=self.steps[r.slug]) for r in records]
        scheduler = scheduler_for(halving, self.store, self.prefix, {r.point: r.slug for r in records})
        if isinstance(scheduler, SyncHalving):
            pruned = search(halving, contenders, self.store, stage, cap=self.max_steps, say=self.say, decided=scheduler.record)
        else:  # asked by each point's worker at each rung (AttemptRequest.scheduler): no stages
            self.asking = halving
            stage(scheduler.legs(contenders, self.store, self.max_steps))
            pruned = scheduler.pruned()
        ledger = self.merge(records)
        for record in ledger.points:
            if record.point in pruned:
                record.state, record.reason = "pruned", pruned[record.point]
        self.write_ledger(ledger)
        self.show(ledger, final=True)
        return ledger

    def launch(self, record: PointRecord, never_began: bool = False) -> Gang:
        """Start RECORD's next attempt. NEVER_BEGAN: its run had no status.json when this
        driver leased it (no attempt ever began, so it has no checkpoint to resume from: not listed)."""
        record.attempts += 1
        record.state = "running"
        record.lease, record.heartbeat = self.id, time.time()
        bundle = f"{self.store.url_of(self.prefix)}/bundles/point-{record.point:04d}"
        gang = Gang(self.devices, worker_env(), self.idle, avoid=self.lost_nodes.selector())
        resume = None if never_began else resume_from(self.store, record.slug)
        gang.start(AttemptRequest(bundle=bundle, store=self.store_url, resume=resume,
                                  max_steps=limit(self.wanted[record.slug], self.steps[record.slug], self.max_steps),
                                  max_steps_by=self.limited_by.get(record.slug, "--max-steps"),
                                  take_over=record.attempts > 1, data_roots=self.data_roots,
                                  scheduler=None if self.asking is None else SchedulerJob(halving=self.asking, prefix=self.prefix, point=record.point, slug=record.slug)))  # a later attempt: the earlier one's workers are stopped
        if self.on_launch is not None:
            self.on_launch(record, gang)
        return gang

    def supervise(self, ledger: SweepLedger, only: Optional[set[int]] = None) -> SweepLedger:
        """Run every point still open (of ONLY, when given) that this driver can lease; wait
        for the points another live driver holds, and take over those whose driver stops
        renewing its lease."""
        return Supervision(self, ledger, only).run()

    def notice_lost_nodes(self) -> None:
        """After an attempt was lost: the nodes whose raylet no longer answers are left out of
        new placements until Ray marks them dead; the idle workers, some perhaps on such a
        node, are let go (a reused worker there would die before its attempt began)."""
        self.lost_nodes.forget_dead()
        found = self.lost_nodes.look()
        if found:
            self.say(f"node {', '.join(sorted(n[:12] for n in found))} lost: no attempt is placed there")
            self.drop_idle()

    def warm_first(self) -> None:
        """Before the first point is compiled, where Ray is up: the first point's worker,
        started now, so that its process and warm-up (TrainWorkerImpl.warm) overlap that
        compile instead of following it. One only: on a machine it shares with its workers,
        more would take the CPU from that compile (warm_pool starts the rest after it)."""
        if not self.warmed and not self.idle and self.devices.count == 1:
            self.idle.append(single_worker(self.devices, worker_env(), self.lost_nodes.selector()))

    def warm_pool(self) -> None:
        """Once, before the first launch (once the first point is compiled: on a machine it
        shares with its workers, their starts would take the CPU from that compile): a worker
        for each point the cluster holds at once (no more than the sweep has, when known; the
        one warm_first started counts), started now and warming up (its process, the
        runtime's imports, its device: TrainWorkerImpl.warm) while the first bundles are
        written and leased; the launches take them from the idle workers, the longest
        started first. Not for points of several ranks: their gangs are placed together (a
        placement group)."""
        if self.warmed or self.devices.count != 1:
            return
        self.warmed = True
        avoid = self.lost_nodes.selector()
        count = self.capacity() if self.expected is None else min(self.capacity(), self.expected)
        self.idle.extend(single_worker(self.devices, worker_env(), avoid) for _ in range(count - len(self.idle)))

    def drop_idle(self) -> None:
        for worker in self.idle:
            try:
                ray.kill(worker, no_restart=True)
            except Exception:  # already gone
                pass
        self.idle.clear()

    def capacity(self) -> int:
        """How many points (gangs of W ranks) the cluster holds at once, as it is now."""
        resources = ray.cluster_resources()
        need = self.devices.bundle()
        return min(int(float(resources.get(k, 0.0)) // (v * self.devices.count)) for k, v in need.items())

    def ask_autoscaler(self, gangs: int) -> None:
        """Tell an autoscaling cluster (ray up) how much the sweep wants; a no-op elsewhere."""
        if self.address is None:
            return
        try:
            from ray.autoscaler.sdk import request_resources

            request_resources(bundles=[self.devices.bundle()] * (gangs * self.devices.count))
        except Exception:  # no autoscaler on this cluster: nothing to ask
            pass

    def wait_for_capacity(self) -> None:
        """Before anything runs: the cluster must be able to hold one point. A cluster given
        by address may be autoscaling (min 0 GPU workers): ask it and wait up to
        capacity_wait_s; a local Ray cannot grow, so it fails at once (exit 4)."""
        deadline = time.time() + (self.capacity_wait_s if self.address else 0.0)
        while self.capacity() < 1:
            problem = self.devices.feasible(ray.cluster_resources()) or "the cluster cannot hold one point"
            if time.time() >= deadline:
                raise SweepError(f"cannot start here: {problem}")
            self.ask_autoscaler(1)
            self.say(f"waiting for the cluster to grow: {problem}")
            time.sleep(10.0)

    def follow_others(self, others: list[PointRecord]) -> None:
        """OTHERS, points another driver was found to hold: learn when they finish or fail
        (from the run's status), or when their lease is gone (they are open again)."""

        def look(record: PointRecord) -> None:
            status = RunFolder(self.store, record.slug).read_status()
            state = self.ended(status, record.slug) if status is not None else None
            if state is not None and status is not None and status.summary is not None:
                record.state = state
                take_status(record, status)
                record.lease = None
            elif (lease := self.leases.held_elsewhere(record.point)) is not None:
                record.state, record.lease, record.heartbeat = "leased", lease.holder, lease.heartbeat
            else:  # its driver let it go (or is gone): this driver may lease it
                record.state, record.lease = "pending", None

        concurrently(look, others)

    def ended(self, status: Status, slug: str) -> Optional[Ended]:
        """How the run's status says it ended, when that ends it for this sweep: finished or
        truncated (--max-steps) at the steps this sweep wants (a run truncated by a smaller
        --max-steps is not done for a longer sweep), or failed (unless failures are retried)."""
        if status.summary is None:
            return None
        if status.has_ended(self.wanted.get(slug, 0)):
            return "finished" if status.state == "finished" else "truncated"
        if status.state == "failed" and not self.retry_failed:
            return "failed"
        return None

    def tolerant(self, what: str, action: Callable[[], T], fallback: T) -> T:
        """The store may be away for a while (after its own retries): the driver keeps
        supervising and does the bookkeeping on a later round; the runs themselves wait for
        the store to write what they must."""
        try:
            return action()
        except StoreError as exc:
            self.say(f"warning: could not {what}, the store is unreachable ({type(exc).__name__}); trying again in a few seconds")
            return fallback

    def show(self, ledger: SweepLedger, final: bool = False, changed: Optional[list[PointRecord]] = None,
             active: Optional[list[PointRecord]] = None) -> None:
        if self.table is not None:
            self.table(ledger, final, changed, active)

    def record_outcome(self, record: PointRecord, outcome: AttemptOutcome, counted: bool = True) -> bool:
        """Count an ended attempt into the point's record (a loss as a preemption unless it
        is not COUNTED: the same loss as the one before); True when it must run again."""
        record.state = record_attempt(record, outcome, self.max_preemptions, counted)
        if record.state == "preempted":
            return True
        record.lease = None
        self.say(record.line())  # as a local sweep's lines: `point 3: finished  300/300 steps  loss 0.4709  (steps)`
        return False


def ended_itself(outcome: AttemptOutcome) -> bool:
    """Whether the attempt wrote its own end into status.json: it finished or was truncated
    (exit 0, returned by its worker); a lost one, or one whose rank raised, could not."""
    return outcome.exit_code == Exit.OK and not outcome.preempted


class Supervision:
    """One driver's supervision of one sweep: the gangs it runs, the points it has leased
    but not started, and the rounds of waiting, settling, renewing and leasing.

    Each round's work is bounded by what changed in it (the results that came in, the points
    handed over by the feed, a batch of leases), never by the sweep's size: the points still
    to run wait in a queue, those another driver holds in a set of their own."""

    def __init__(self, driver: Driver, ledger: SweepLedger, only: Optional[set[int]] = None,
                 feed: Optional[Feed[SweepPoint, PointRecord]] = None, known: Optional[dict[str, PointRecord]] = None) -> None:
        self.driver, self.ledger, self.only, self.feed, self.known = driver, ledger, only, feed, known or {}
        self.running: dict[ray.ObjectRef, tuple[PointRecord, Gang]] = {}  # result ref -> its point and gang
        self.gangs: dict[int, Gang] = {}  # point -> the gang running it
        self.reserved: list[int] = []  # leased by this driver, not started yet
        self.never_began: set[int] = set()  # leased here with no status.json: no attempt of theirs ever began
        self.lost_at: dict[int, int] = {}  # point -> the attempt its run folder showed when its last loss was counted
        self.touched: set[int] = set()  # points changed since the ledger was last written
        self.noted: set[int] = set()  # points changed since the table was last drawn that are not this driver's to write
        self.followed = 0.0  # when the other drivers' points were last read
        self.by_point: dict[int, PointRecord] = {}
        self.waiting: deque[int] = deque()  # open, to lease and start, in order
        self.others: set[int] = set()  # held by another driver: followed through the store
        self.launched = 0  # attempts this supervision started
        self.asked = -1  # what the autoscaler was last told the sweep wants
        self.place(ledger.points)

    def place(self, records: list[PointRecord]) -> None:
        """RECORDS (the ledger's, or points the feed handed over) where they wait."""
        for record in records:
            self.by_point[record.point] = record
            if record.state in DONE or (self.only is not None and record.point not in self.only):
                continue
            if record.state == "leased":
                self.others.add(record.point)
            else:
                self.waiting.append(record.point)

    def admit(self, wait_s: float = 0.0) -> None:
        """The points the feed has handed over since the last round (waiting up to WAIT_S for
        one), with what an earlier driver and their runs' status know of them."""
        if self.feed is None:
            return
        fresh = self.feed.take(wait_s)
        if fresh:
            adopted = self.driver.adopt(fresh, self.known)
            self.ledger.points.extend(adopted)
            self.place(adopted)
            self.touched.update(r.point for r in adopted)

    def fed(self) -> bool:
        """Whether every point is known (the feed has handed over all it will)."""
        return self.feed is None or self.feed.exhausted()

    def record_of(self, point: int) -> PointRecord:
        return self.by_point[point]

    def write_touched(self) -> None:
        """The point records this round changed, and nothing else."""
        self.driver.write_points([self.by_point[p] for p in sorted(self.touched)])
        self.touched.clear()

    def show(self) -> None:
        """The live table: the points changed since it was last drawn, those active now."""
        changed = [self.by_point[p] for p in sorted(self.touched | self.noted)]
        active = [self.by_point[p] for p in itertools.chain(self.gangs, self.reserved, self.others)]
        self.driver.show(self.ledger, changed=changed, active=active)
        self.noted.clear()

    def unfinished(self) -> bool:
        """Whether anything is left to run, wait for or hand over."""
        return bool(self.running or self.waiting or self.reserved or self.others) or not self.fed()

    def start(self, record: PointRecord) -> bool:
        self.touched.add(record.point)
        never_began = record.point in self.never_began
        self.never_began.discard(record.point)  # once: an attempt may begin from now on
        try:
            gang = self.driver.launch(record, never_began=never_began)
        except Exception as exc:  # the gang could not start (a rank's node went away, the store): next round
            record.state = "preempted"
            record.preemptions += 1
            self.driver.say(f"point {record.point}: could not start ({type(exc).__name__}: {exc}); trying again")
            return False
        self.launched += 1
        self.gangs[record.point] = gang
        for ref in gang.refs:
            self.running[ref] = (record, gang)
        return True

    def stop(self, record: PointRecord, gang: Gang, reuse: bool = False) -> None:
        for ref in gang.refs:
            self.running.pop(ref, None)
        gang.release(self.driver.idle) if reuse else gang.stop()
        self.gangs.pop(record.point, None)

    def next_waiting(self, count: int) -> list[int]:
        """Up to COUNT points from the front of the queue that are still open here."""
        taken: list[int] = []
        while self.waiting and len(taken) < count:
            point = self.waiting.popleft()
            record = self.by_point[point]
            if record.state not in DONE and point not in self.gangs and point not in self.reserved and point not in self.others:
                taken.append(point)
        return taken

    def ask_autoscaler(self) -> None:
        wanted = len(self.gangs) + len(self.reserved) + len(self.waiting)
        if wanted != self.asked:  # the request is the whole demand: sent again only when it changed
            self.driver.ask_autoscaler(wanted)
            self.asked = wanted

    def take_free_points(self) -> None:
        """Start what the cluster holds now (a worker whose point ended runs the next one);
        lease a few points ahead so that a batch of leases is paid for at once."""
        driver, records = self.driver, self.by_point
        room = driver.capacity() - len(self.gangs)
        self.reserved[:] = [p for p in self.reserved if records[p].state not in DONE and p not in self.gangs]
        self.ask_autoscaler()
        if room <= 0:
            return
        if len(self.reserved) < room and self.waiting:
            asked = self.next_waiting(max(room, 2 * driver.capacity(), 8) - len(self.reserved))
            try:
                won = set(driver.leases.claim(asked))
            except BaseException:  # the store away: the same points are asked again next round
                self.waiting.extendleft(reversed(asked))
                raise
            for point in asked:
                if point not in won:  # another driver holds it (its to write): followed from now on
                    records[point].state = "leased"
                    self.others.add(point)
                    self.noted.add(point)
            claimed = [records[p] for p in asked if p in won]
            try:
                statuses = driver.statuses([r.slug for r in claimed])
            except BaseException:  # leased, but not read: started when the store answers (the worker reads it again)
                self.reserved.extend(r.point for r in claimed)
                raise
            for record, status in zip(claimed, statuses, strict=True):
                state = driver.ended(status, record.slug) if status is not None else None
                if state is None:
                    self.reserved.append(record.point)
                    if status is None:
                        self.never_began.add(record.point)
                else:  # another driver ended it since we last looked
                    record.state = state
                    self.touched.add(record.point)
                    driver.leases.release(record.point)
        starting, self.reserved[:] = self.reserved[:room], self.reserved[room:]
        for point in starting:
            record = records[point]
            if self.start(record):
                driver.say(f"point {record.point}: started (attempt {record.attempts})  {record.slug}")
            else:
                self.reserved.append(point)

    def wait_for_results(self) -> list[ray.ObjectRef]:
        """The attempts' results that are in: the first within a few seconds (less while the
        feed is still handing points over), and every other one ready by then (one round for
        all of them)."""
        patience = ROUND_S if self.fed() else FEEDING_ROUND_S
        if not self.running:
            if not self.fed():
                self.admit(patience)
            else:
                time.sleep(patience)  # only other drivers' points are open: look at them again soon
            return []
        refs = list(self.running)
        done, rest = ray.wait(refs, num_returns=1, timeout=patience)
        if done and rest:
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            done = [*done, *more]
        return list(done)

    def collect_done(self, done: list[ray.ObjectRef]) -> None:
        """The attempts whose ranks returned: record each, start the preempted ones again
        (off the nodes found lost, when a loss may have been a node's)."""
        driver = self.driver
        ended: list[tuple[PointRecord, Gang, AttemptOutcome]] = []
        for ref in done:
            if ref not in self.running:  # its gang's outcome is known already
                continue
            record, gang = self.running.pop(ref)
            self.touched.add(record.point)
            outcome = gang.collect(ref)
            if outcome is not None:  # else another rank still runs
                self.stop(record, gang, reuse=not outcome.preempted)
                ended.append((record, gang, outcome))
        if any(outcome.preempted for _, _, outcome in ended):
            driver.notice_lost_nodes()
        released: list[int] = []
        for record, _, outcome in ended:
            counted = not outcome.preempted or driver.tolerant("read a lost attempt's status", functools.partial(self.new_loss, record), True)
            if not ended_itself(outcome):
                driver.tolerant("write the attempt's end into status.json", functools.partial(close_status, driver.store, record.slug, outcome), None)
            if driver.record_outcome(record, outcome, counted):
                if self.start(record):
                    driver.say(f"point {record.point}: preempted, resumed (attempt {record.attempts})")
                else:  # still leased by this driver: started on a later round
                    self.reserved.append(record.point)
            else:
                released.append(record.point)
        # the round's ended points let go together (each a request or two that waits on the store)
        driver.tolerant("release a lease", functools.partial(self.release, released), None)

    def release(self, points: list[int]) -> None:
        concurrently(self.driver.leases.release, points)

    def new_loss(self, record: PointRecord) -> bool:
        """Whether a lost attempt of RECORD is a new loss. One whose worker died before its
        attempt began (the run folder shows no attempt since the loss counted just before:
        it was placed on the node that was lost, before Ray knew) is the same loss, once;
        a second such death in a row counts again, so a launch that never works still ends."""
        status = RunFolder(self.driver.store, record.slug).read_status()
        began = status.attempt if status is not None else 0
        if self.lost_at.pop(record.point, None) == began:
            return False
        self.lost_at[record.point] = began
        return True

    def give_up_lost_leases(self, lost: list[int]) -> None:
        for point in lost:
            record = self.record_of(point)
            if point in self.reserved:
                self.reserved.remove(point)
            elif point in self.gangs:
                self.driver.say(f"point {point}: another driver took its lease over; stopping this driver's ranks")
                self.stop(record, self.gangs[point])
            else:
                continue
            record.state, record.lease = "leased", None
            self.others.add(point)
            self.touched.add(point)

    def follow_others(self) -> None:
        """Every few seconds, the points another driver holds (read from the store; this
        driver's own points it learns of from their workers)."""
        if time.time() - self.followed < FOLLOW_EVERY_S:
            return
        self.followed = time.time()
        others = [self.by_point[p] for p in sorted(self.others)]
        if not others:
            return
        self.driver.follow_others(others)
        for record in others:
            if record.state != "leased":  # ended, or let go: open again here
                self.others.discard(record.point)
                self.touched.add(record.point)
                if record.state not in DONE:
                    self.waiting.append(record.point)

    def run(self) -> SweepLedger:
        driver, ledger = self.driver, self.ledger
        # leases are renewed from a thread, so a slow round (a gang starting, a slow store)
        # never lets them expire under a live driver
        renewal = driver.leases.keep_renewed(lambda: [*self.gangs, *self.reserved])
        try:
            self.admit()
            driver.tolerant("lease free points", self.take_free_points, None)
            self.show()
            driver.tolerant("write the ledger's changed points", self.write_touched, None)
            while self.unfinished():
                done = self.wait_for_results()
                self.collect_done(done)
                self.give_up_lost_leases(renewal.take_lost())
                driver.tolerant("read the other drivers' points", self.follow_others, None)
                self.admit()
                if self.waiting or self.reserved:
                    driver.tolerant("lease free points", self.take_free_points, None)
                if self.feed is not None and self.launched:
                    self.feed.go()
                if not self.reserved and not self.waiting and self.fed():  # nothing of ours to start: idle workers give their CPUs/GPUs back
                    driver.drop_idle()
                driver.lost_nodes.forget_dead()
                self.show()
                driver.tolerant("write the ledger's changed points", self.write_touched, None)
        finally:
            renewal.stop()
        ledger.points.sort(key=lambda p: p.point)
        if ledger.points:
            driver.tolerant("write sweep.json", lambda: driver.write_ledger(ledger), None)
        driver.show(ledger, final=True)
        driver.drop_idle()
        return ledger
