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

    def run(self, bundle_url: str, store_url: str, resume: Optional[str] = None, max_steps: Optional[int] = None) -> dict[str, Any]:
        from sexpgpu.bundle import compile_bundle
        from sexpgpu.runtime.loop import RunOptions, train

        manifest, result = compile_bundle(bundle_url)
        if result.experiment is None:
            errors = "; ".join(d.headline() for d in result.diagnostics if d.severity == "error")
            return {"slug": manifest.slug, "exit_code": 3, "reason": f"the bundle does not check: {errors}"}
        options = RunOptions(store=store_url, max_steps=max_steps, resume=resume, signals=False)
        outcome = train(result.experiment, options, say=lambda _text: None)
        return outcome.model_dump()


TrainWorker = ray.remote(max_concurrency=2)(TrainWorkerImpl)
