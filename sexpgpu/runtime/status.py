"""`status.json`: the one file to poll, replaced atomically at every log step and state change.

`StatusWriter.update(...)` changes some fields, stamps the heartbeat and publishes the whole
file (temp + rename locally, a single put on object stores). When the store is down past its
retries, `update` keeps the latest status and records the error in `last_error`; the next
update (or `flush()`, which raises) publishes it.
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
    STATUS_LIMIT bytes, refused before it is read (locally one stat and one read; on an object
    store a HEAD and a GET)."""
    try:
        return Status.model_validate_json(store.read_bytes(status_path(run_prefix), limit=STATUS_LIMIT))
    except FileNotFoundError:
        return None


class StatusWriter:
    """Holds a run's current status and republishes it whole on every change."""

    def __init__(self, store: Store, run_prefix: str, status: Optional[Status] = None) -> None:
        self.store = store
        self.path = status_path(run_prefix)
        self.current = status if status is not None else Status(state="compiling")
        self.last_error: Optional[BaseException] = None
        self._dirty = False
        self._lock = threading.RLock()

    def update(self, **changes: Any) -> Status:
        """Set CHANGES (field names of `Status`), stamp the heartbeat, publish; the new status.

        An unknown field name is a TypeError, since a typo would otherwise be published
        silently; `write` takes a whole `Status`, extra keys included."""
        unknown = sorted(set(changes) - set(Status.model_fields))
        if unknown:
            raise TypeError(f"unknown status fields: {', '.join(unknown)}")
        with self._lock:
            data = {**self.current.model_dump(), **changes, "heartbeat": utc_now()}
            return self._publish(Status.model_validate(data), quiet=True)

    def heartbeat(self) -> Status:
        """Republish with a fresh heartbeat only."""
        return self.update()

    def write(self, status: Status) -> Status:
        """Replace the whole status with STATUS (published as given); raises on store errors."""
        with self._lock:
            return self._publish(status, quiet=False)

    def flush(self) -> None:
        """Publish a status an earlier update could not; raises if the store still fails."""
        with self._lock:
            if self._dirty:
                self._publish(self.current, quiet=False)

    def _publish(self, status: Status, quiet: bool) -> Status:
        self.current = status
        self._dirty = True
        try:
            self.store.write_json(self.path, status)
        except Exception as error:  # kept for the next publish (flush raises it); others are bugs
            if not is_store_failure(error):
                raise
            self.last_error = error
            if not quiet:
                raise
            return status
        self._dirty = False
        self.last_error = None
        return status
