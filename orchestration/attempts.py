"""The rule a supervisor follows after each attempt of a run, written once for the sweep
driver's points and for submitted runs.

An attempt that finished ends the run. One that stopped resumably (exit 75: a signal, a
killed worker, a lost node, ranks that never met) runs again from the latest checkpoint,
until it has been preempted more than `--max-preemptions` times. Anything else is the run's
own failure, and is not retried.
"""

from __future__ import annotations

import os
from typing import Literal, Optional

from pydantic import BaseModel, Field

from sexpgpu.outcome import AttemptOutcome, Exit, bounded
from sexpgpu.runtime.checkpoint import list_checkpoints
from sexpgpu.runtime.events import utc_now
from sexpgpu.runtime.status import FINAL_STATES, StatusWriter, Summary, read_status
from sexpgpu.runtime.store import Store

AfterAttempt = Literal["finished", "truncated", "preempted", "failed"]  # "preempted": run it again


class Attempts(BaseModel):
    """What a supervisor knows of one run's attempts (a point of sweep.json, a submit.json)."""

    attempts: int = 0
    preemptions: int = 0
    exit_code: Optional[int] = None
    reason: str = ""
    final_loss: Optional[float] = None
    metrics: dict[str, float] = Field(default_factory=dict)


def record_attempt(record: Attempts, outcome: AttemptOutcome, max_preemptions: Optional[int]) -> AfterAttempt:
    """Count OUTCOME into RECORD; what the run's state is now."""
    if outcome.resumable:  # a clean stop on SIGTERM (a spot reclaim) is a preemption too
        record.preemptions += 1
    record.exit_code, record.reason = int(outcome.exit_code), outcome.reason
    record.final_loss, record.metrics = outcome.final_loss, dict(outcome.metrics)
    if outcome.exit_code == Exit.OK:
        return "truncated" if outcome.reason.startswith("truncated") else "finished"
    if outcome.exit_code != Exit.STOPPED:
        return "failed"
    if max_preemptions is not None and record.preemptions > max_preemptions:
        record.reason = bounded(f"preempted {record.preemptions} times (--max-preemptions {max_preemptions}); last: {outcome.reason}")
        return "failed"
    return "preempted"


# the settings a worker needs from the process that started the run: the store's
# credentials and endpoint, sexpgpu's own settings, BLAS threads the user set
WORKER_ENV_PREFIXES = ("AWS_", "SEXPGPU_", "OPENBLAS_", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def worker_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(WORKER_ENV_PREFIXES)}


def resume_from(store: Store, slug: str) -> Optional[str]:
    """The checkpoint a new attempt resumes from: the latest published one, named, so that
    every rank resumes from the same one (a rank left over from a killed gang may still
    publish another while the new ranks start); None: start over."""
    valid = [c.name for c in list_checkpoints(store, slug) if c.valid]
    return valid[-1] if valid else None


def close_status(store: Store, slug: str, outcome: AttemptOutcome) -> None:
    """An attempt lost from outside (or one whose rank raised) cannot write its own end: its
    supervisor writes it, once the attempt's ranks are stopped, so that no run stays
    `running`, with a dead heartbeat, after its attempt ended. A status the attempt ended
    itself is left as it is."""
    status = read_status(store, slug)
    if status is None or status.state in FINAL_STATES:
        return
    state = "preempted" if outcome.resumable else "failed"
    summary = Summary(exit_code=int(outcome.exit_code), reason=outcome.reason)
    StatusWriter(store, slug, status).write(status.model_copy(update={"state": state, "summary": summary, "heartbeat": utc_now()}))
