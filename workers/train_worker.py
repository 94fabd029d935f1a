"""TrainWorker: a Ray actor that runs one bundle from the store through the one session layer.

A worker that dies (node lost, spot reclaim, SIGKILL) is a preemption for the driver, which
starts a new worker with resume="latest"; the store holds everything the new one needs.
"""

from __future__ import annotations

import importlib
import os
import socket
from typing import Any, Optional

import ray
from pydantic import BaseModel

from sexpgpu.bundle import BundleCompiles, CompileCounts
from sexpgpu.outcome import AttemptOutcome, Exit, lost, refused
from sexpgpu.runtime.backend import Backend
from sexpgpu.runtime.runfolder import run_slug
from sexpgpu.runtime.stops import EarlyStop
from sexpgpu.runtime.store import KeptStores, patience_configured
from sexpgpu.session import Compiled, Session, Settings
from sexpgpu.sweeps.schedulers import Decision, SchedulerJob
from workers.collective import CollectiveUnavailable, RankSpec, RendezvousError, join


class AttemptRequest(BaseModel):
    """What a supervisor (the sweep driver, a submitted job's) asks of a worker: one attempt."""

    bundle: str  # the bundle's URL
    store: str  # where the run folder is
    resume: Optional[str] = None  # the checkpoint to resume from (every rank the same one)
    max_steps: Optional[int] = None
    max_steps_by: str = "--max-steps"  # what set max_steps: the user, or a halving sweep's rung
    device: str = "cpu"
    # the previous attempt's workers are stopped: the run folder's lease is taken over
    take_over: bool = False
    data_roots: tuple[str, ...] = ()  # where loader sources may be read besides the bundle
    scheduler: Optional[SchedulerJob] = None  # a sweep's asynchronous scheduler, asked at each rung


class TrainWorkerImpl:
    """The plain class (testable without Ray); `TrainWorker` is its Ray actor.

    A worker runs one attempt at a time, and after a point that ended cleanly the driver
    hands it the next one: what it compiled stays for those. The bundles' unpacked projects
    and their sweeps' shape groups (BundleCompiles: a point of a group compiled before is
    bound from it, as the driver binds it), and the device it opened, with every kernel it
    loaded (a later point compiles only the kernels that differ: those its knob values
    reach)."""

    def __init__(self, env: Optional[dict[str, str]] = None, device: Optional[str] = None) -> None:
        """ENV: the driver's settings for workers (worker_env). DEVICE: the device its
        attempts will ask for, opened now (`warm`), while the driver compiles and bundles
        the first points; None: by the first attempt."""
        os.environ.update(env or {})
        self.stores = KeptStores()  # its stores' clients, kept for every attempt
        self.compiles = BundleCompiles(stores=self.stores)
        self.opened: dict[str, tuple[str, Backend]] = {}  # by the device asked for: what it resolved to, opened
        self.decisions: dict[str, Decision] = {}  # the scheduler's decisions read so far, by URL (each is written once)
        if device is not None:
            self.warm(device)

    def warm(self, device: str = "cpu") -> Optional[str]:
        """What every attempt needs and no point decides, done before the first attempt
        comes: the runtime's lazy imports, DEVICE opened (the C toolchain found, the runtime
        library built or loaded) and the compiler's system texts read. Returns what DEVICE
        resolved to. None: it did not open as asked (refused, or the NumPy fallback with its
        notice), or the warm-up failed: the attempt opens it itself, to say why in its run."""
        try:
            if device not in self.opened:
                session = Session(Settings(device=device, signals=False, threads=assigned_cpus()), stores=self.stores)
                if session.open_device() is None and session.backend is not None and (session.device != "numpy" or device == "numpy"):
                    self.opened[device] = (session.device, session.backend)
            for module in WARM_IMPORTS:
                importlib.import_module(module)
            self.compiles.warm()
        except Exception:  # noqa: BLE001 - never the worker's death (a preemption): its attempt meets the same and says it
            return None
        found = self.opened.get(device)
        return found[0] if found is not None else None

    def where(self) -> dict[str, Any]:
        """This worker's host, process and Ray node (the driver's tests kill it, or its node,
        to play a preemption)."""
        node: Optional[str] = None
        if ray.is_initialized():  # outside Ray, asking would start a Ray instance
            node = ray.get_runtime_context().get_node_id()
        return {"host": socket.gethostname(), "pid": os.getpid(), "node": node}

    def describe(self) -> str:
        """This worker, for the run's status.json: its Ray actor and process."""
        actor = ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None
        return f"ray actor {actor} on {socket.gethostname()}, pid {os.getpid()}" if actor else f"pid {os.getpid()}"

    def nccl_unique_id(self) -> list[int]:
        """Rank 0 makes the NCCL unique id; the driver hands it to every rank."""
        from workers.collective import nccl_unique_id

        return nccl_unique_id()

    def run(self, request: AttemptRequest, rank: Optional[RankSpec] = None) -> AttemptOutcome:
        """Train the bundle; with RANK as one of W data-parallel ranks. The run's own failures
        are outcomes (never retried); only a death or a failed rendezvous is a preemption."""
        settings = Settings(store=request.store, device=request.device, max_steps=request.max_steps, max_steps_by=request.max_steps_by,
                            resume=request.resume, signals=False,
                            world=rank.world if rank else 1, store_patience_s=patience_configured(os.environ), take_over=request.take_over,
                            data_roots=request.data_roots, threads=assigned_cpus(), worker=self.describe())
        early = request.scheduler.early_stop(self.stores(request.store), self.decisions) if request.scheduler is not None else None
        session = Session(settings, opened=self.opened.get(request.device), stores=self.stores)
        outcome = self.attempt(session, request.bundle, rank, early)
        if session.backend is not None:
            self.opened[request.device] = (session.device, session.backend)
        return outcome.model_copy(update={"rank": rank.rank if rank else 0})

    def compile_counts(self) -> CompileCounts:
        """What this worker's compiles did so far (the tests look whether a point was bound)."""
        return self.compiles.counts.model_copy()

    def attempt(self, session: Session, bundle_url: str, rank: Optional[RankSpec], early: Optional[EarlyStop] = None) -> AttemptOutcome:
        return session.open_device() or session.with_bundle(bundle_url, lambda compiled: self.join_and_train(session, compiled, rank, early), self.compiles)

    def join_and_train(self, session: Session, compiled: Compiled, rank: Optional[RankSpec], early: Optional[EarlyStop] = None) -> AttemptOutcome:
        collective = None
        if rank is not None:
            slug = run_slug(compiled.experiment)
            try:
                collective = join(rank)
            except CollectiveUnavailable as exc:  # missing software is not fixed by retrying
                return refused(Exit.CANNOT_START, f"cannot start here: {exc}", slug)
            except RendezvousError as exc:  # a rank that never came: retried like a lost node
                return lost(f"rendezvous failed: {exc}", slug)
        return session.train(compiled, ranks=collective, early_stop=early)

# two calls at once: `run`, and `where` while it runs (the tests kill the process it names)
TRAIN_WORKER_OPTIONS: dict[str, int] = {"max_concurrency": 2}
# what the first attempt would import on its way (lowering a program, its arena's plan)
WARM_IMPORTS = ("sexpgpu.runtime.lower.fusion", "sexpgpu.runtime.lower.plan")


def assigned_cpus() -> Optional[int]:
    """The CPUs Ray gave this actor (its BLAS threads: the node's other CPUs are other
    workers'); None outside an actor, where the runtime's own plan applies."""
    if not ray.is_initialized():  # asking would start a Ray instance
        return None
    try:
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    except Exception:  # a driver, not a worker
        return None
    return max(1, int(cpus)) if cpus else None


TrainWorker = ray.remote(TrainWorkerImpl)
