"""TrainWorker: a Ray actor that runs one bundle from the store through the one training loop.

A worker that dies (node lost, spot reclaim, SIGKILL) is a preemption for the driver, which
starts a new worker with resume="latest"; the store holds everything the new one needs.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Optional

import ray


class TrainWorkerImpl:
    """The plain class (testable without Ray); `TrainWorker` is its Ray actor."""

    def __init__(self, env: Optional[dict[str, str]] = None) -> None:
        os.environ.update(env or {})
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

    def where(self) -> dict[str, Any]:
        """This worker's host and process (the driver's tests kill it to play a preemption)."""
        return {"host": socket.gethostname(), "pid": os.getpid()}

    def nccl_unique_id(self) -> list[int]:
        """Rank 0 makes the NCCL unique id; the driver hands it to every rank."""
        from workers.collective import nccl_unique_id

        return nccl_unique_id()

    def run(
        self, bundle_url: str, store_url: str, resume: Optional[str] = None, max_steps: Optional[int] = None,
        rank: Optional[dict[str, Any]] = None, device: str = "cpu",
    ) -> dict[str, Any]:
        """Train the bundle; with RANK (a RankSpec) as one of W data-parallel ranks."""
        from sexpgpu.bundle import BundleError, compile_bundle
        from sexpgpu.runtime.checkpoint import ResumeError
        from sexpgpu.runtime.data import DataError
        from sexpgpu.runtime.loop import RunOptions, train
        from sexpgpu.runtime.store import StoreError
        from workers.collective import CollectiveUnavailable, RankSpec, RendezvousError, join

        spec = RankSpec.model_validate(rank) if rank is not None else None
        try:
            manifest, result = compile_bundle(bundle_url, world=spec.world if spec else 1)
        except BundleError as exc:
            return {"exit_code": 3, "reason": f"bundle refused: {exc}"}
        if result.experiment is None:
            errors = "; ".join(d.headline() for d in result.diagnostics if d.severity == "error")
            return {"slug": manifest.slug, "exit_code": 3, "reason": f"the bundle does not check: {errors}"}
        collective = None
        if spec is not None:
            try:
                collective = join(spec)
            except CollectiveUnavailable as exc:  # missing software is not fixed by retrying
                return {"slug": manifest.slug, "exit_code": 4, "reason": f"cannot start here: {exc}"}
            except RendezvousError as exc:  # a rank that never came: retried like a lost node
                return {"slug": manifest.slug, "exit_code": 75, "reason": f"rendezvous failed: {exc}", "preempted": True}
        options = RunOptions(store=store_url, device=device, max_steps=max_steps, resume=resume, signals=False, ranks=collective)
        try:
            outcome = train(result.experiment, options, say=lambda _text: None)
        except DataError as exc:  # the run's own failures are outcomes (never retried); only a death is a preemption
            return {"slug": manifest.slug, "exit_code": 5, "reason": f"data error: {exc}"}
        except ResumeError as exc:
            return {"slug": manifest.slug, "exit_code": 6, "reason": f"resume refused: {exc}"}
        except StoreError as exc:
            return {"slug": manifest.slug, "exit_code": 4, "reason": f"the store is not writable from this worker: {exc}"}
        return {**outcome.model_dump(), "rank": spec.rank if spec else 0}


TrainWorker = ray.remote(max_concurrency=2)(TrainWorkerImpl)
