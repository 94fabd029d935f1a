"""`sexpgpu submit BUNDLE --ray ADDRESS --store URL`: one run as a detached, preemptible job.

A detached Supervisor actor (it outlives the submitting process) runs the bundle on a
TrainWorker and starts a new worker with resume="latest" whenever one dies; each attempt is
recorded in STORE/SLUG/submit.json. The submitter can disconnect: `sexpgpu status URL` and
`sexpgpu logs URL --follow` read the run from the store.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import ray
from pydantic import BaseModel, Field

from sexpgpu.runtime.store import Store


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
    def __init__(self, bundle_url: str, store_url: str, slug: str, max_preemptions: Optional[int], env: dict[str, str]) -> None:
        self.record = SubmitRecord(slug=slug, bundle=bundle_url, store=store_url)
        self.max_preemptions = max_preemptions
        self.env = env
        self.store = Store.open(store_url)
        self.worker: Any = None

    def save(self) -> None:
        self.store.write_text(f"{self.record.slug}/submit.json", self.record.model_dump_json(indent=2))

    def current_worker(self) -> Any:
        return self.worker

    def supervise(self) -> dict[str, Any]:
        from workers.train_worker import TrainWorker

        record = self.record
        while True:
            record.attempts += 1
            record.state = "running"
            self.save()
            self.worker = TrainWorker.options(num_cpus=1, max_restarts=0).remote(self.env)
            resume = "latest" if record.attempts > 1 else None
            started = time.time()
            try:
                outcome = ray.get(self.worker.run.remote(record.bundle, record.store, resume, None))
            except Exception as exc:  # the worker died: a preemption
                outcome = {"exit_code": 75, "reason": f"worker lost: {type(exc).__name__}"}
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


Supervisor = ray.remote(num_cpus=0, max_concurrency=2)(SupervisorImpl)


def submit(bundle_url: str, store_url: str, slug: str, max_preemptions: Optional[int], env: dict[str, str]) -> tuple[Any, Any]:
    """Start the detached supervisor (Ray must be initialized); returns (actor, result ref)."""
    actor = Supervisor.options(name=f"sexpgpu-submit-{slug}", lifetime="detached", get_if_exists=False).remote(bundle_url, store_url, slug, max_preemptions, env)
    return actor, actor.supervise.remote()
