"""`status.json`: the one file to poll, replaced atomically (temp + rename locally, a single
put on object stores).

`StatusWriter.update(...)` changes some fields and stamps the heartbeat. On its own it
publishes the whole file at once; during an attempt the run folder's background publisher
(runfolder.Publisher) publishes the latest status every few seconds and at every checkpoint,
stop and end. When the store is down past its retries, the latest status is kept and the
error recorded in `last_error`; the next publish (or `flush()`, which raises) writes it.
"""

from __future__ import annotations

import socket
import threading
from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from ..outcome import EvalSeen, bounded
from .events import utc_now
from .store import Store, is_store_failure

STATUS_VERSION = 1

State = Literal[
    "compiling",
    "running",
    "evaluating",
    "checkpointing",
    "stopped",
    "preempted",
    "finished",
    "truncated",  # ended at --max-steps, before the run's own :steps: a longer run resumes it
    "pruned",  # stopped by a sweep's successive halving at a rung; resumable, like truncated
    "failed",
]
FINAL_STATES = frozenset({"stopped", "preempted", "finished", "truncated", "pruned", "failed"})

# Metric values may be non-finite (written as null).
Metrics = dict[str, Optional[float]]


class Summary(BaseModel):
    """The end of a run."""

    model_config = ConfigDict(extra="allow")

    best_eval: Metrics = Field(default_factory=dict)
    last_eval: Metrics = Field(default_factory=dict)
    target_reached_at_step: Optional[int] = None
    wall_time_s: float = 0.0
    examples_seen: int = 0
    tokens_seen: Optional[int] = None
    exit_code: int = 0
    reason: Annotated[str, AfterValidator(bounded)] = ""


class Status(BaseModel):
    model_config = ConfigDict(extra="allow")

    v: int = STATUS_VERSION
    state: State
    step: int = 0
    steps: Optional[int] = None  # the planned total
    metrics: Metrics = Field(default_factory=dict)  # the latest logged step's
    last_eval: Optional[dict[str, Any]] = None
    last_eval_step: Optional[int] = None  # the step of the latest evaluation pass
    eta_s: Optional[float] = None
    last_checkpoint: Optional[str] = None
    attempt: int = 1
    host: str = Field(default_factory=socket.gethostname)
    worker: Optional[str] = None
    heartbeat: str = Field(default_factory=utc_now)
    started: str = Field(default_factory=utc_now)
    summary: Optional[Summary] = None

    def has_ended(self, steps: int) -> bool:
        """Whether the run has nothing left to do for a run of STEPS: it reached its target,
        or it trained STEPS (finished, or truncated at a --max-steps)."""
        if self.state not in ("finished", "truncated"):
            return False
        reached = self.summary is not None and self.summary.target_reached_at_step is not None
        return reached or self.step >= steps

    def evals(self) -> dict[str, EvalSeen]:
        """The latest pass of each defeval (`last_eval` keys them EVAL/METRIC)."""
        evals: dict[str, EvalSeen] = {}
        for key, value in (self.last_eval or {}).items():
            name, _, metric = key.partition("/")
            if isinstance(value, (int, float)):
                evals.setdefault(name, EvalSeen(step=self.last_eval_step or self.step, metrics={})).metrics[metric] = float(value)
        return evals


def status_path(run_prefix: str) -> str:
    return f"{run_prefix.strip('/')}/status.json"


# A status file is a few kilobytes; one larger than this is not read (UnexpectedSize), so a
# hostile or broken one cannot make a listing read a gigabyte every few seconds.
STATUS_LIMIT = 1 << 20


def read_status(store: Store, run_prefix: str) -> Optional[Status]:
    """The run's status, or None when it has none yet; UnexpectedSize for one of more than
    STATUS_LIMIT bytes, refused unread (locally one stat and one read; on an object store one
    ranged GET of at most STATUS_LIMIT + 1 bytes)."""
    try:
        return Status.model_validate_json(store.read_bytes(status_path(run_prefix), limit=STATUS_LIMIT))
    except FileNotFoundError:
        return None


def read_status_stamped(store: Store, run_prefix: str) -> tuple[Status, Optional[float]]:
    """The run's status and when the version read was written (Store.read_stamped);
    FileNotFoundError when it has none yet, UnexpectedSize as read_status."""
    data, when = store.read_stamped(status_path(run_prefix), limit=STATUS_LIMIT)
    return Status.model_validate_json(data), when


class StatusWriter:
    """Holds a run's current status and publishes it whole: on every change, or, `deferred`
    (a run folder's background publisher flushes it: runfolder.Publisher), only when flushed,
    the updates in between coalesced into the latest. The status is never locked while the
    store is written, so `update` never waits for a publish."""

    def __init__(self, store: Store, run_prefix: str, status: Optional[Status] = None) -> None:
        self.store = store
        self.path = status_path(run_prefix)
        self.current = status if status is not None else Status(state="compiling")
        self.deferred = False  # set by the publisher that flushes this status from its own thread
        self.last_error: Optional[BaseException] = None
        self._dirty = False
        self._lock = threading.Lock()  # current and dirty
        self._writing = threading.Lock()  # one publish at a time

    def update(self, **changes: Any) -> Status:
        """Set CHANGES (field names of `Status`), stamp the heartbeat, publish (unless
        deferred); the new status.

        An unknown field name is a TypeError, since a typo would otherwise be published
        silently; `write` takes a whole `Status`, extra keys included."""
        unknown = sorted(set(changes) - set(Status.model_fields))
        if unknown:
            raise TypeError(f"unknown status fields: {', '.join(unknown)}")
        with self._lock:
            data = {**self.current.model_dump(), **changes, "heartbeat": utc_now()}
            status = self.current = Status.model_validate(data)
            self._dirty = True
            deferred = self.deferred
        if not deferred:
            self._flush_quietly()
        return status

    def heartbeat(self) -> Status:
        """Republish with a fresh heartbeat only."""
        return self.update()

    def write(self, status: Status) -> Status:
        """Replace the whole status with STATUS and publish it as given; raises on store errors."""
        with self._lock:
            self.current, self._dirty = status, True
        self.flush()
        return status

    def flush(self) -> None:
        """Publish the status if it changed since the last publish; raises if the store fails
        (the status stays to publish)."""
        with self._writing:
            with self._lock:
                if not self._dirty:
                    return
                status = self.current
            try:
                self.store.write_json(self.path, status)
            except Exception as error:
                if is_store_failure(error):
                    self.last_error = error
                raise
            with self._lock:
                self._dirty = self.current is not status
                self.last_error = None

    def _flush_quietly(self) -> None:
        try:
            self.flush()
        except Exception as error:  # kept for the next publish (flush raises it); others are bugs
            if not is_store_failure(error):
                raise
