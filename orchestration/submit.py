"""`sexpgpu submit BUNDLE --ray ADDRESS --store URL`: one run as a detached, preemptible job.

A detached Supervisor actor (it outlives the submitting process) runs the bundle on a
TrainWorker (or W data-parallel ranks, `--devices W`) and starts a new attempt with
resume="latest" whenever a worker dies; each attempt is
recorded in STORE/SLUG/submit.json. The submitter can disconnect: `sexpgpu status URL` and
`sexpgpu logs URL --follow` read the run from the store.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Optional

import ray
from pydantic import BaseModel, Field

from sexpgpu.runtime.checkpoint import list_checkpoints
from sexpgpu.runtime.store import Store

from .gang import Devices, Gang


class SubmitRecord(BaseModel):
    version: int = 1
    slug: str
    bundle: str
    store: str
    state: str = "submitted"  # submitted running preempted finished failed
    attempts: int = 0
    preemptions: int = 0
    exit_code: Optional[int] = None
    reason: str = ""
    history: list[dict[str, Any]] = Field(default_factory=list)


class SupervisorImpl:
    def __init__(self, bundle_url: str, store_url: str, slug: str, max_preemptions: Optional[int], env: dict[str, str], devices: Optional[dict[str, Any]] = None) -> None:
        self.record = SubmitRecord(slug=slug, bundle=bundle_url, store=store_url)
        self.max_preemptions = max_preemptions
        self.env = env
        self.devices = Devices.model_validate(devices or {})
        self.store = Store.open(store_url)
        self.gang: Optional[Gang] = None
        self.thread: Optional[threading.Thread] = None
        self.outcome: Optional[dict[str, Any]] = None

    def start(self) -> bool:
        """Begin supervising on the actor's own thread and return at once. The submitter
        waits for this answer before it exits: a call still on its way when its caller exits
        is lost with it, and the run would never start."""
        if self.thread is None:
            self.thread = threading.Thread(target=self.supervise_to_the_end, name="supervise", daemon=True)
            self.thread.start()
        return True

    def supervise_to_the_end(self) -> None:
        try:
            self.outcome = self.supervise()
        except Exception as exc:  # the supervisor's own failure is the run's outcome, recorded
            self.record.state, self.record.exit_code = "failed", 1
            self.record.reason = f"the supervisor failed: {type(exc).__name__}: {exc}"
            try:
                self.save()
            finally:
                self.outcome = self.record.model_dump()

    def result(self) -> dict[str, Any]:
        """The submit record once the run has ended (waits for it)."""
        assert self.thread is not None, "start() first"
        self.thread.join()
        assert self.outcome is not None
        return self.outcome

    def save(self) -> None:
        self.store.write_text(f"{self.record.slug}/submit.json", self.record.model_dump_json(indent=2))

    def current_worker(self) -> Any:
        """Rank 0 of the attempt in progress (tests kill it to play a preemption)."""
        return self.gang.workers[0] if self.gang is not None else None

    def attempt(self) -> dict[str, Any]:
        """One attempt: W ranks (a gang); its outcome is rank 0's, or a preemption."""
        from workers.train_worker import TrainWorker

        valid = [c.name for c in list_checkpoints(self.store, self.record.slug) if c.valid]
        resume = valid[-1] if valid else None  # every rank resumes from the same checkpoint
        gang = Gang(ray, TrainWorker, self.devices, self.env)
        self.gang = gang
        try:
            try:
                gang.start(self.record.bundle, self.record.store, resume, None)
            except Exception as exc:  # the ranks could not start: retried like a lost node
                return {"exit_code": 75, "reason": f"could not start: {type(exc).__name__}: {exc}", "preempted": True}
            pending = list(gang.refs)
            while True:
                done, pending = ray.wait(pending, num_returns=1)
                outcome = gang.settle(done[0])
                if outcome is not None:
                    return outcome
        finally:
            gang.stop()

    def supervise(self) -> dict[str, Any]:
        record = self.record
        while True:
            record.attempts += 1
            record.state = "running"
            self.save()
            started = time.time()
            outcome = self.attempt()
            if outcome.get("preempted"):
                record.preemptions += 1
            record.history.append({"attempt": record.attempts, "seconds": round(time.time() - started, 3), "exit_code": outcome.get("exit_code"), "reason": outcome.get("reason")})
            code = int(outcome.get("exit_code", 1))
            record.exit_code, record.reason = code, str(outcome.get("reason", ""))
            if code == 75 and (self.max_preemptions is None or record.preemptions <= self.max_preemptions):
                record.state = "preempted"
                self.save()
                continue
            record.state = "finished" if code == 0 else "failed"
            self.save()
            return record.model_dump()


SUPERVISOR_START_S = 300.0  # the supervisor actor's start on a busy cluster (a worker process to launch)
Supervisor = ray.remote(num_cpus=0, max_concurrency=4)(SupervisorImpl)


def submit(bundle_url: str, store_url: str, slug: str, max_preemptions: Optional[int], env: dict[str, str], devices: Optional[Devices] = None) -> tuple[Any, Any]:
    """Start the detached supervisor (Ray must be initialized); returns (actor, result ref)."""
    payload = (devices or Devices()).model_dump()
    # one name per submission: submitting the same run again (after it ended) is allowed
    name = f"sexpgpu-submit-{slug}-{uuid.uuid4().hex[:8]}"
    actor = Supervisor.options(name=name, lifetime="detached", get_if_exists=False).remote(bundle_url, store_url, slug, max_preemptions, env, payload)
    try:
        ray.get(actor.start.remote(), timeout=SUPERVISOR_START_S)  # the run has begun before the submitter may exit
    except Exception:
        # the submitter is told the run did not start: it must not start later behind its back
        # (a second submission would then run the same slug twice)
        ray.kill(actor)
        raise
    return actor, actor.result.remote()
