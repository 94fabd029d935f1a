"""What a supervisor knows of a run's attempts, and a sweep of its points: one record per
point, the same for a sweep on this machine and one over Ray (`sweep --json` prints it;
the Ray driver keeps it in the store, a journal of the points each round changed: LedgerStore), and the rule that
counts an ended attempt into it.

An attempt that finished ends the run. One that stopped resumably (exit 75: a signal, a
killed worker, a lost node, ranks that never met) runs again from the latest checkpoint,
until it has been preempted more than `--max-preemptions` times. Anything else is the run's
own failure, and is not retried.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Optional, TypeVar

from pydantic import BaseModel, Field

from ..outcome import AttemptOutcome, EvalSeen, Exit, TargetHit, bounded, evals_line
from ..runtime.status import Status
from ..runtime.store import Store, StoreError

T = TypeVar("T")
R = TypeVar("R")

AfterAttempt = Literal["finished", "truncated", "preempted", "failed"]  # "preempted": run it again
PointState = Literal["pending", "leased", "running", "preempted", "stopped", "finished", "truncated", "pruned", "failed"]  # stopped: a local sweep stopped by a signal
DONE = ("finished", "truncated", "pruned", "failed")  # for this sweep: not run again by it


def sweep_prefix(path: Path, sweep: str) -> str:
    """The sweep's folder in the store (its ledger, leases, bundles, the scheduler's decisions)."""
    return f"sweeps/{path.stem}.{sweep}"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


class Attempts(BaseModel):
    """What a supervisor knows of one run's attempts (a point of a sweep, a submit.json)."""

    attempts: int = 0
    preemptions: int = 0
    exit_code: Optional[int] = None
    reason: str = ""
    steps: int = 0  # the step the run stands at
    final_loss: Optional[float] = None
    metrics: dict[str, float] = Field(default_factory=dict)  # the last training batch's
    evals: dict[str, EvalSeen] = Field(default_factory=dict)  # the latest pass of each defeval
    target: Optional[TargetHit] = None


def record_attempt(record: Attempts, outcome: AttemptOutcome, max_preemptions: Optional[int], counted: bool = True) -> AfterAttempt:
    """Count OUTCOME into RECORD (a resumable end as a preemption, unless it is not COUNTED:
    a supervisor's word that it is the same loss as the one before); what the run's state is now."""
    if outcome.resumable and counted:  # a clean stop on SIGTERM (a spot reclaim) is a preemption too
        record.preemptions += 1
    record.exit_code, record.reason = int(outcome.exit_code), outcome.reason
    if outcome.folder is not None:  # an attempt refused before training leaves what the run had
        record.steps, record.final_loss, record.metrics = outcome.steps, outcome.final_loss, dict(outcome.metrics)
        record.evals, record.target = dict(outcome.evals), outcome.target
    if outcome.exit_code == Exit.OK:  # "truncated at step N ...", or a rerun's "already finished: truncated at ..."
        return "truncated" if outcome.reason.removeprefix("already finished: ").startswith("truncated") else "finished"
    if outcome.exit_code != Exit.STOPPED:
        return "failed"
    if max_preemptions is not None and record.preemptions > max_preemptions:
        # given up: the point failed (exit 1), it is no longer a stop that a rerun continues (75)
        record.exit_code = int(Exit.RUN_FAILED)
        record.reason = bounded(f"preempted {record.preemptions} times (--max-preemptions {max_preemptions}); last: {outcome.reason}")
        return "failed"
    return "preempted"


def take_status(record: Attempts, status: Status) -> None:
    """What the run's STATUS says of where it stands, into RECORD (a point run elsewhere, or
    before this sweep started)."""
    record.steps = status.step
    loss = status.metrics.get("loss")
    record.final_loss = loss
    record.metrics = {k: v for k, v in status.metrics.items() if k != "loss" and v is not None}
    record.evals = status.evals()
    if status.summary is not None:
        record.exit_code, record.reason = status.summary.exit_code, status.summary.reason


class PointRecord(Attempts):
    point: int
    slug: str
    knobs: dict[str, Any]
    planned: Optional[int] = None  # the steps this sweep asks of the point (--max-steps and rungs included)
    state: PointState = "pending"
    lease: Optional[str] = None  # driver id holding the point
    heartbeat: Optional[float] = None  # unix time of the holder's last heartbeat
    elsewhere: Optional[str] = None  # a local sweep: the other attempt writing the run folder (`HOST pid N, ...`)

    def progress(self) -> str:
        """The steps done of the point's target: what this sweep asks of it, or the steps the
        run already did when it did more (a run that finished at 20000 steps, the file now
        asking 6000, is `20000/20000`): never more done than the target."""
        if self.planned is None:
            return str(self.steps)
        return f"{self.steps}/{max(self.planned, self.steps)}"

    def line(self) -> str:
        """The point as it ends, on a line of its own, the same on this machine and over Ray:
        `point 3: truncated  50/50 steps  loss 0.7714  val/acc ...  (--max-steps)`."""
        train = "".join(f"  {k} {v:.4g}" for k, v in self.metrics.items())
        evals = f"  {evals_line(self.evals)}" if self.evals else ""
        ended = self.ended_by()
        return f"point {self.point}: {self.state}  {self.progress()} steps  loss {cell(self.final_loss)}{train}{evals}" + (f"  ({ended})" if ended else "")

    def ended_by(self) -> str:
        """Why the point stands where it does, in a few words: `steps`, `--max-steps`, the
        target and its value, the rung that pruned it, or the failure."""
        if self.elsewhere is not None:
            return f"running elsewhere: {self.elsewhere}"
        if self.state == "finished":
            return f"target {self.target.describe()}" if self.target is not None else "steps"
        if self.state == "truncated":  # "truncated at step N by --max-steps (the run asks for M)"
            limit = self.reason.partition(" by ")[2].partition(" (the run asks")[0]
            return limit or self.reason
        if self.state in ("pruned", "failed", "preempted", "stopped"):
            return self.reason
        return ""


def cell(value: Optional[float]) -> str:
    """A number in a sweep's table or line: four significant digits, `-` for none."""
    return f"{value:.4g}" if isinstance(value, (int, float)) else "-"


class SweepLedger(BaseModel):
    version: int = 1
    file: str
    sweep: str
    points: list[PointRecord]
    updated: str = Field(default_factory=now)


READERS = 16  # store requests a ledger keeps in flight at once
COMPACT_OBJECTS = 32  # journal objects a writer leaves since its last snapshot before it may compact (LedgerStore)
JOURNAL_SHARE = 4  # ... and the journal bytes since then, times this, at least the snapshot's
MOST_OBJECTS = 512  # journal objects since its last snapshot after which a writer compacts whatever their bytes
STALE_COMPACTION_S = 120.0  # a local compaction's mark older than this was left by a writer killed in it
WHOLE_TRIES = 4  # reads and guarded writes of the whole ledger on an object store before its snapshot is left to a later writer
MARK_WAIT_S = 5.0  # how long a whole-ledger write waits for another writer's local compaction to end


def concurrently(action: Callable[[T], R], items: Iterable[T], workers: int = READERS) -> list[R]:
    """ACTION over ITEMS, at most WORKERS at once (store requests wait on the network, not
    the CPU), in the order of ITEMS."""
    todo = list(items)
    if len(todo) <= 1:
        return [action(item) for item in todo]
    with ThreadPoolExecutor(max_workers=min(workers, len(todo)), thread_name_prefix="sexpgpu-ledger") as pool:
        return list(pool.map(action, todo))


def keep_advanced(ours: SweepLedger, stored: SweepLedger, writer: str) -> None:
    """OURS, with the record STORED holds for each point another writer has advanced
    further than OURS knows (more attempts, or ended for as many steps as OURS asks: a
    halving stage asks more of a point an earlier stage ended at its rung), rather than our
    older view. A point WRITER holds or held, or that OURS has ended, stays as OURS has it."""
    theirs = {p.slug: p for p in stored.points}
    for i, record in enumerate(ours.points):
        other = theirs.get(record.slug)
        if other is None or record.lease == writer or other.lease == writer or record.state in DONE:
            continue
        ended = other.state in DONE and (other.state == "failed" or (other.planned or 0) >= (record.planned or 0))
        if other.attempts > record.attempts or ended:
            ours.points[i] = other.model_copy(update={"point": record.point, "knobs": record.knobs})


class LedgerStore:
    """A sweep's ledger in the store, under PREFIX (STORE/sweeps/STEM.SWEEP):

    - `journal/TIME-WRITER-N.jsonl`: the point records one round of a driver changed, one
      line each, one object per round (named by the time it was written, so that a listing
      gives the rounds of every driver in order);
    - `sweep.json`: the whole ledger, written when a sweep starts and ends (a snapshot for
      whoever reads one file). Writing it folds the journal objects read or written here
      into it: they are removed once it is written, oldest first, stopping at the first
      the store refuses (what is left is the newest of them, and reads as the snapshot
      does; the next snapshot folds it).

    Compaction, while a sweep runs: once a writer has journalled COMPACT_OBJECTS objects
    since its last snapshot and a JOURNAL_SHARE-th of that snapshot's bytes (or MOST_OBJECTS
    objects, whatever their bytes), its next `write_points` writes a snapshot of the ledger as
    the store holds it (read here: the snapshot and every journal object listed, whoever wrote
    them) and folds what it read. So a reader lists and gets at most MOST_OBJECTS objects of
    each writer, and a compaction's requests (a HEAD, a GET and a LIST, a GET and a DELETE per
    object, a PUT) are a few per round, flat however large the sweep. Its bytes (the snapshot
    written, O(points)) come after at least a JOURNAL_SHARE-th as many bytes of journal, so
    the bytes written per point change stay flat as the sweep grows, until a sweep's rounds
    change so few points each that MOST_OBJECTS comes first. The snapshot is written before
    anything is removed, so a writer killed between the two leaves objects that read as the
    snapshot does; an object another writer journals after the listing is not folded, and stays.

    Two writers compacting at once: on an object store with conditional writes, the snapshot
    is replaced only if it is still the one the compaction read (If-Match on the version taken
    before the read); on a local folder, only by the writer that created the compaction's mark
    (`compacting`, an exclusive create; one older than STALE_COMPACTION_S is taken over). The
    other leaves everything as it is and compacts at a later round. So neither removes what the
    other's snapshot lacks. The snapshot written as a sweep starts and ends (`write_whole`)
    is guarded the same way. An object store without conditional writes is not guarded.

    Reading takes the snapshot and lays every journal line over it, by slug, in the
    journal's order (a record is journalled at every change of its point, so the last one
    is never older than the snapshot's). A ledger of an older version is `sweep.json` alone,
    or with one record per point in `points/SLUG.json` (laid over it before the journal, and
    folded into the next snapshot as the journal is)."""

    def __init__(self, store: Store, prefix: str, writer: str = "", header: Optional[tuple[str, str]] = None) -> None:
        self.store = store
        # (file, sweep) of the ledger this writer keeps: a compaction before any snapshot
        # (a streamed sweep writes its first at its end) names them; without, it waits for one
        self.header = header
        self.snapshot_path = f"{prefix}/sweep.json"
        self.points_prefix = f"{prefix}/points"  # an older version's records, read and folded
        self.journal_prefix = f"{prefix}/journal"
        self.writer = writer or uuid.uuid4().hex[:12]
        self.stored: dict[str, str] = {}  # slug -> the point record's JSON as the store holds it (read or written here)
        self.folded: dict[str, set[str]] = {}  # journal objects (and old point records) read or written here -> their slugs
        self.rounds = 0
        self.bytes_written = 0
        self.since_snapshot = 0  # journal objects written here since the last snapshot written here
        self.bytes_since_snapshot = 0
        self.snapshot_bytes = 0  # the size of the last snapshot read or written here
        self.compactions = 0
        self.refused = 0  # compactions left to a later round: another writer's was under way or done first
        self.mark_path = f"{prefix}/compacting"
        self._guarded: Optional[bool] = None  # guard(), found once
        self.read_version: Optional[str] = None  # the snapshot's version read() read (guard()): "" for none

    def read(self) -> Optional[SweepLedger]:
        """The ledger as the store holds it; None when there is none. Where a snapshot is
        written guarded (guard()), the snapshot's version is taken first, into read_version:
        a snapshot written over the read is refused once another has replaced it since."""
        if self.guard():
            self.read_version = self.store.version(self.snapshot_path) or ""
        try:
            data = self.store.read_bytes(self.snapshot_path)
            self.snapshot_bytes = len(data)
            snapshot: Optional[SweepLedger] = SweepLedger.model_validate_json(data)
        except FileNotFoundError:
            snapshot = None
        paths = [*sorted(self.store.list(self.points_prefix)), *sorted(self.store.list(self.journal_prefix))]
        records: list[PointRecord] = []
        for path, read in zip(paths, concurrently(self.read_records, paths), strict=True):
            if read is None:  # removed since the listing: folded into a snapshot read above, or a later one
                continue
            records.extend(read)
            self.folded[path] = {r.slug for r in read}
        if snapshot is None:
            if not records:
                return None
            snapshot = SweepLedger(file="", sweep="", points=[])
        position = {p.slug: i for i, p in enumerate(snapshot.points)}
        for record in records:  # in the journal's order: the last record of a point wins
            self.stored[record.slug] = record.model_dump_json()
            if record.slug in position:
                snapshot.points[position[record.slug]] = record
            else:
                position[record.slug] = len(snapshot.points)
                snapshot.points.append(record)
        return snapshot

    def read_records(self, path: str) -> Optional[list[PointRecord]]:
        try:
            text = self.store.read_text(path)
        except FileNotFoundError:
            return None
        return [PointRecord.model_validate_json(line) for line in text.splitlines() if line.strip()]

    def write_points(self, records: Iterable[PointRecord], compact: bool = True) -> int:
        """Journal the records of RECORDS that differ from what the store holds, in one
        object (one request however many changed); how many. Then, with COMPACT and when it
        is due (see the class), the ledger is compacted."""
        changed = [(r.slug, r.model_dump_json()) for r in records]
        changed = [(slug, text) for slug, text in changed if self.stored.get(slug) != text]
        if not changed:
            return 0
        self.rounds += 1
        path = f"{self.journal_prefix}/{time.time_ns():020d}-{self.writer}-{self.rounds:06d}.jsonl"
        text = "".join(f"{line}\n" for _, line in changed)
        self.store.write_text(path, text)
        self.bytes_written += len(text.encode())
        self.folded[path] = {slug for slug, _ in changed}
        self.stored.update(changed)
        self.since_snapshot += 1
        self.bytes_since_snapshot += len(text.encode())
        if compact and self.compaction_due():
            self.compact()
        return len(changed)

    def compaction_due(self) -> bool:
        """Whether to compact (see the class). Before any snapshot was read or written here,
        only a writer that knows the ledger's header (file, sweep) compacts, and by the count
        of objects alone."""
        if self.snapshot_bytes == 0:
            return self.header is not None and self.since_snapshot >= COMPACT_OBJECTS
        if self.since_snapshot >= MOST_OBJECTS:
            return True
        return self.since_snapshot >= COMPACT_OBJECTS and self.bytes_since_snapshot * JOURNAL_SHARE >= self.snapshot_bytes

    def compact(self) -> None:
        """The ledger as the store holds it, written as the snapshot; the journal objects
        read for it removed. Left to a later round when another writer's compaction is under
        way or replaced the snapshot since it was read (see the class)."""
        if self.store.is_local:
            self.compact_marked()
            return
        guard = self.guard()
        ledger = self.snapshot_to_write()
        if ledger is None:
            return
        if not self.write_snapshot(ledger, guard=self.read_version if guard else None):
            self.left_for_later()
            return
        self.compactions += 1

    def compact_marked(self) -> None:
        """compact on a local folder: only under the compaction's mark, taken over when a
        writer killed in its compaction left it."""
        if not self.take_mark():
            self.left_for_later()
            return
        try:
            ledger = self.snapshot_to_write()
            if ledger is not None:
                self.write_snapshot(ledger)
                self.compactions += 1
        finally:
            self.store.delete(self.mark_path)

    def take_mark(self) -> bool:
        """The local compaction's mark, created here (taken over when a writer killed in its
        compaction left it); False when another writer holds it."""
        mark = f"{self.writer} {now()}\n".encode()
        if self.store.create_new(self.mark_path, mark):
            return True
        aside = self.store.move_aside(self.mark_path) if self.mark_is_stale() else None
        if aside is None:
            return False
        aside.discard()
        return self.store.create_new(self.mark_path, mark)  # False: another writer took it over first

    def guard(self) -> bool:
        """Whether a snapshot written here is guarded by the version read() took (an object
        store with conditional writes); read() takes that version only then."""
        if self._guarded is None:
            self._guarded = not self.store.is_local and self.store.conditional_writes()
        return self._guarded

    def write_whole(self, ledger: SweepLedger, merge: bool = True) -> bool:
        """LEDGER (this writer's view of every point, as a sweep starts or ends) into the
        store: with MERGE, merged over the ledger as the store holds it (`keep_advanced`;
        without, as a sweep's first write takes its view as it is), the records
        that differ journalled, and the merge written as the snapshot, guarded as a compaction
        is (see the class) so that it never replaces a snapshot holding what it lacks. On an
        object store a refused write reads and merges again, up to WHOLE_TRIES times; on a
        local folder the write waits up to MARK_WAIT_S for another writer's compaction to end.
        Past either, the snapshot is left to a later writer, the records journalled all the
        same, and False. The merge is left in LEDGER."""
        if self.store.is_local:
            if not self.wait_for_mark():
                self.merge_stored(ledger, merge)
                self.left_for_later()
                return False
            try:
                self.merge_stored(ledger, merge)
                return self.write_snapshot(ledger)
            finally:
                self.store.delete(self.mark_path)
        for _ in range(WHOLE_TRIES):
            self.merge_stored(ledger, merge)
            if self.write_snapshot(ledger, guard=self.read_version if self.guard() else None):
                return True
        self.left_for_later()
        return False

    def merge_stored(self, ledger: SweepLedger, merge: bool) -> None:
        """LEDGER merged over the store's (read now, with MERGE; the read is taken all the
        same, for the guard's version and the objects a snapshot folds), stamped, and its
        records that differ from the store's journalled (the points another writer holds are
        that writer's to write)."""
        stored = self.read()
        if stored is not None:
            # what the store holds of every point, the snapshot's too: only what differs is
            # journalled (an older view of a point journalled over another's would win)
            self.stored.update((p.slug, p.model_dump_json()) for p in stored.points)
            if merge:
                keep_advanced(ledger, stored, self.writer)
        ledger.updated = now()
        self.write_points([p for p in ledger.points if p.lease is None or p.lease == self.writer], compact=False)

    def wait_for_mark(self) -> bool:
        """take_mark, trying again while another writer holds it, up to MARK_WAIT_S (its
        compaction is a read and a write of the ledger); False after that."""
        deadline, pause = time.monotonic() + MARK_WAIT_S, 0.005
        while not self.take_mark():
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.25)
        return True

    def snapshot_to_write(self) -> Optional[SweepLedger]:
        """The ledger as the store holds it, stamped for a snapshot (a journal with no snapshot
        yet named by this writer's header); None when there is none."""
        ledger = self.read()
        if ledger is None:
            return None
        if not ledger.file and self.header is not None:
            ledger.file, ledger.sweep = self.header
        ledger.updated = now()
        return ledger

    def left_for_later(self) -> None:
        """A compaction another writer's came before: tried again after as many rounds."""
        self.refused += 1
        self.since_snapshot = self.bytes_since_snapshot = 0

    def mark_is_stale(self) -> bool:
        try:
            written = self.store.modified(self.mark_path)
        except FileNotFoundError:
            return False  # removed since: the next round takes it
        return written is not None and time.time() - written > STALE_COMPACTION_S

    def write_snapshot(self, ledger: SweepLedger, guard: Optional[str] = None) -> bool:
        """LEDGER as the snapshot; then the journal objects it holds every point of are
        removed, oldest first (one that names a point it lacks stays, laid over it); the
        first the store refuses stops the removal, so that no older object is left under
        a newer one removed. GUARD (an object store with conditional writes): the version
        of the snapshot the ledger was read over ("" for none); where the store holds
        another, nothing is written or removed, and False."""
        text = ledger.model_dump_json(indent=2)
        if guard is None:
            self.store.write_text(self.snapshot_path, text)
        elif not self.store.put_if(self.snapshot_path, text.encode(), guard or None).written:
            return False
        self.bytes_written += len(text.encode())
        self.snapshot_bytes = len(text.encode())
        self.since_snapshot = self.bytes_since_snapshot = 0
        held = {p.slug for p in ledger.points}
        done = sorted((path for path, slugs in self.folded.items() if slugs <= held), key=lambda path: (path.startswith(self.journal_prefix), path))
        for path in done:
            if not self.remove(path):
                break
            del self.folded[path]
        return True

    def remove(self, path: str) -> bool:
        """Remove a journal object folded into the snapshot; False when the store is away
        (it stays, laid over the snapshot with what the snapshot holds, and goes next time)."""
        try:
            self.store.delete(path)
        except StoreError:
            return False
        return True
