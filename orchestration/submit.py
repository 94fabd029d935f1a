"""`sexpgpu submit BUNDLE --ray ADDRESS --store URL`: one run as a detached, preemptible job.

A detached Supervisor actor (it outlives the submitting process) runs the bundle on a
TrainWorker (or W data-parallel ranks, `--devices W`) and starts a new attempt with
resume="latest" whenever a worker dies; each attempt is
recorded in STORE/SLUG/submit.json. The submitter can disconnect: `sexpgpu status URL` and
`sexpgpu logs URL --follow` read the run from the store.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from typing import Any, Literal, Optional

import ray
from pydantic import BaseModel, Field

from sexpgpu.outcome import AttemptOutcome, Exit, bounded, lost
from sexpgpu.runtime.store import Store, is_store_failure, store_problem

from sexpgpu.sweeps.ledger import Attempts, record_attempt
from .attempts import close_status, resume_from
from workers.train_worker import AttemptRequest

from .gang import Devices, Gang


class AttemptEntry(BaseModel):
    attempt: int
    seconds: float
    exit_code: int
    reason: str


class SubmitRecord(Attempts):
    """STORE/SLUG/submit.json: a submitted run's attempts."""

    version: int = 1
    slug: str
    bundle: str
    store: str
    state: Literal["submitted", "running", "preempted", "finished", "truncated", "failed"] = "submitted"
    history: list[AttemptEntry] = Field(default_factory=list)


class SupervisorImpl:
    def __init__(self, bundle_url: str, store_url: str, slug: str, max_preemptions: Optional[int], env: dict[str, str], devices: Optional[dict[str, Any]] = None,
                 data_roots: tuple[str, ...] = ()) -> None:
        # the submitter's store settings and credentials: the supervisor writes the store too,
        # and the cluster's processes may have been started before they were exported
        os.environ.update(env)
        self.data_roots = data_roots
        self.record = SubmitRecord(slug=slug, bundle=bundle_url, store=store_url)
        self.max_preemptions = max_preemptions
        self.env = env
        self.devices = Devices.model_validate(devices or {})
        self.store = Store.open(store_url)
        self.gang: Optional[Gang] = None
        self.thread: Optional[threading.Thread] = None

    def start(self) -> Optional[str]:
        """Write submit.json, then supervise on the actor's own thread; returns at once: None,
        or why the store refused the first write (nothing then runs). The submitter waits for
        this answer before it exits: a call still on its way when its caller exits is lost
        with it, and the run would never start."""
        if self.thread is None:
            try:
                self.save()
            except Exception as exc:
                if not is_store_failure(exc):
                    raise
                return store_problem(self.record.store, exc)
            self.thread = threading.Thread(target=self.supervise_to_the_end, name="supervise", daemon=True)
            self.thread.start()
        return None

    def supervise_to_the_end(self) -> None:
        """The job, then the supervisor's own end: a detached actor lives until it is killed,
        so a job that ended kills its supervisor."""
        try:
            self.supervise()
        except Exception as exc:  # the supervisor's own failure is the run's outcome, recorded
            self.record.state, self.record.exit_code = "failed", int(Exit.RUN_FAILED)
            self.record.reason = bounded(f"the supervisor failed: {type(exc).__name__}: {exc}")
            with contextlib.suppress(Exception):
                self.save()
        ray.kill(ray.get_runtime_context().current_actor)

    def save(self) -> None:
        self.store.write_text(f"{self.record.slug}/submit.json", self.record.model_dump_json(indent=2))

    def current_worker(self) -> Any:
        """Rank 0 of the attempt in progress (tests kill it to play a preemption)."""
        return self.gang.workers[0] if self.gang is not None else None

    def attempt(self) -> AttemptOutcome:
        """One attempt: W ranks (a gang); its outcome is rank 0's, or a preemption."""
        gang = Gang(self.devices, self.env)
        self.gang = gang
        try:
            try:
                gang.start(AttemptRequest(bundle=self.record.bundle, store=self.record.store, resume=resume_from(self.store, self.record.slug),
                                          take_over=self.record.attempts > 1, data_roots=self.data_roots))  # a later attempt: the earlier one's workers are stopped
            except Exception as exc:  # the ranks could not start: retried like a lost node
                return lost(f"could not start: {type(exc).__name__}: {exc}", self.record.slug)
            pending = list(gang.refs)
            while True:
                done, pending = ray.wait(pending, num_returns=1)
                outcome = gang.collect(done[0])
                if outcome is not None:
                    return outcome
        finally:
            gang.stop()

    def supervise(self) -> SubmitRecord:
        record = self.record
        while True:
            record.attempts += 1
            record.state = "running"
            self.save()
            started = time.time()
            outcome = self.attempt()
            try:
                close_status(self.store, record.slug, outcome)
            except Exception as exc:  # the store away: the next attempt writes the status anyway
                if not is_store_failure(exc):
                    raise
            record.state = record_attempt(record, outcome, self.max_preemptions)
            record.history.append(AttemptEntry(attempt=record.attempts, seconds=round(time.time() - started, 3), exit_code=int(outcome.exit_code), reason=outcome.reason))
            self.save()
            if record.state != "preempted":
                return record


SUPERVISOR_START_S = 300.0  # the supervisor actor's start on a busy cluster (a worker process to launch)
Supervisor = ray.remote(SupervisorImpl)


class SubmitRefused(Exception):
    """The supervisor could not write the run's first record: nothing runs (exit 4)."""


def submit(bundle_url: str, store_url: str, slug: str, max_preemptions: Optional[int], env: dict[str, str], devices: Optional[Devices] = None,
           data_roots: tuple[str, ...] = ()) -> Any:
    """Start the detached supervisor (Ray must be initialized) once its first write to the
    store succeeded; returns the actor. SubmitRefused when the store refused it."""
    payload = (devices or Devices()).model_dump()
    # one name per submission: submitting the same run again (after it ended) is allowed
    name = f"sexpgpu-submit-{slug}-{uuid.uuid4().hex[:8]}"
    actor = Supervisor.options(name=name, lifetime="detached", get_if_exists=False, num_cpus=0, max_concurrency=4).remote(bundle_url, store_url, slug, max_preemptions, env, payload, data_roots)
    try:
        problem = ray.get(actor.start.remote(), timeout=SUPERVISOR_START_S)  # the run has begun before the submitter may exit
    except Exception:
        # the submitter is told the run did not start: it must not start later behind its back
        # (a second submission would then run the same slug twice)
        ray.kill(actor)
        raise
    if problem is not None:
        ray.kill(actor)
        raise SubmitRefused(problem)
    return actor
