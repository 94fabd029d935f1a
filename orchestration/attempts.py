"""What a supervisor (the sweep driver, a submitted job's) does around each attempt of a
run: the environment its workers get, the checkpoint a new attempt resumes from, and the end
of an attempt that could not write it. The rule that counts an attempt is
sexpgpu.sweeps.ledger.record_attempt, shared with local sweeps."""

from __future__ import annotations

import os
from typing import Optional

from sexpgpu.outcome import AttemptOutcome
from sexpgpu.runtime.checkpoint import list_checkpoints
from sexpgpu.runtime.events import utc_now
from sexpgpu.runtime.status import FINAL_STATES, StatusWriter, Summary, read_status
from sexpgpu.runtime.store import Store

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
