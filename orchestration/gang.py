"""One attempt of one run on the cluster: W rank workers started together.

A run asking for W devices gets W TrainWorker actors in one Ray placement group (all or
none are placed; PACK keeps them on as few nodes as fit). For NCCL, rank 0 makes the unique
id and the gang hands it to every rank. The attempt's outcome is rank 0's (only rank 0
writes); a rank that dies makes the whole attempt a preemption: the other ranks are stopped
and the driver starts a new gang that resumes from the latest checkpoint, on any W.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal, Optional

from pydantic import BaseModel

import ray
from ray.actor import ActorHandle
from ray.exceptions import OutOfMemoryError, RayError, RayTaskError
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from sexpgpu.outcome import AttemptOutcome, Exit, lost
from workers.collective import AllReduceSpec, RankSpec
from workers.train_worker import TRAIN_WORKER_OPTIONS, AttemptRequest, TrainWorker



def death(error: BaseException) -> str:
    """How a rank died, in a few words for the ledger."""
    if isinstance(error, OutOfMemoryError):
        return "killed by Ray's memory monitor (the node ran out of memory)"
    return type(error).__name__


class Devices(BaseModel):
    """What each point (or submitted run) asks of the cluster."""

    count: int = 1  # W: data-parallel ranks
    kind: Literal["cpu", "cuda"] = "cpu"
    allreduce: AllReduceSpec = AllReduceSpec()
    rendezvous_timeout_s: float = 120.0

    def bundle(self) -> dict[str, float]:
        """The resources of one rank."""
        return {"CPU": 1.0, "GPU": 1.0} if self.kind == "cuda" else {"CPU": 1.0}

    def software(self) -> Optional[str]:
        """Why CPU ranks cannot meet (PyTorch missing for GLOO), checked here before anything
        runs: the workers run the same installation. NCCL is checked by each GPU rank (a CPU
        head node may lack what the GPU workers have), which then exits 4."""
        if self.count == 1 or self.kind == "cuda":
            return None
        from workers.collective import unavailable

        return unavailable("gloo")

    def feasible(self, cluster: dict[str, float]) -> Optional[str]:
        """Why the cluster can never hold one run of these devices (None: it can)."""
        for resource, amount in self.bundle().items():
            have = float(cluster.get(resource, 0.0))
            if have < amount * self.count:
                noun = "GPU" if resource == "GPU" else "CPU"
                return (f"a point needs {self.count} rank(s) with {amount:g} {noun} each, the cluster has {have:g} {noun}; "
                        f"add nodes (ray-cluster.yaml max_workers) or lower --devices")
        return None


def worker_options(devices: Devices) -> dict[str, Any]:
    """The Ray options of one rank's TrainWorker."""
    options: dict[str, Any] = {"max_restarts": 0, "num_cpus": 1, **TRAIN_WORKER_OPTIONS}
    if devices.kind == "cuda":
        options["num_gpus"] = 1
    return options


def single_worker(devices: Devices, env: dict[str, str], avoid: Optional[dict[str, str]] = None) -> ActorHandle:
    """A new TrainWorker for a point of one rank, kept off the nodes AVOID selects; it opens
    its device as it starts (TrainWorkerImpl.warm), before its point comes."""
    options = worker_options(devices)
    if avoid:
        options["label_selector"] = avoid
    return TrainWorker.options(**options).remote(env, device_of(devices))


def device_of(devices: Devices) -> str:
    """The device a rank's attempts ask for (AttemptRequest.device)."""
    return "cuda" if devices.kind == "cuda" else "cpu"


class Gang:
    """The W rank actors of one attempt, their placement group and their result refs."""

    def __init__(self, devices: Devices, env: dict[str, str], idle: Optional[list[ActorHandle]] = None,
                 avoid: Optional[dict[str, str]] = None) -> None:
        """AVOID: a label selector that keeps the ranks off nodes lost but not yet marked dead
        (orchestration/nodes.py)."""
        self.devices = devices
        self.group = f"sexpgpu-{uuid.uuid4().hex[:12]}"
        self.placement: Optional[PlacementGroup] = None
        self.workers: list[ActorHandle] = []
        self.refs: list[ray.ObjectRef] = []
        self.outcomes: dict[int, AttemptOutcome] = {}
        self.stopped = False
        options = worker_options(devices)
        if devices.count > 1:
            placement = ray.util.placement_group([devices.bundle() for _ in range(devices.count)], strategy="PACK",
                                                 bundle_label_selector=[avoid] * devices.count if avoid else None)
            self.placement = placement
            for i in range(devices.count):
                strategy = PlacementGroupSchedulingStrategy(placement_group=placement, placement_group_bundle_index=i)
                self.workers.append(TrainWorker.options(scheduling_strategy=strategy, **options).remote(env, device_of(devices)))
        elif idle:  # a worker whose point ended cleanly (or started ahead: Driver.warm_pool), the longest idle, runs the next one
            self.workers.append(idle.pop(0))
        else:
            self.workers.append(single_worker(devices, env, avoid))

    def start(self, request: AttemptRequest) -> None:
        """Start every rank on REQUEST; on any error the gang stops itself (no leaked actors
        or groups)."""
        try:
            self._start(request.model_copy(update={"device": device_of(self.devices)}))
        except Exception:
            self.stop()
            raise

    def _start(self, request: AttemptRequest) -> None:
        devices = self.devices
        if devices.count == 1:
            self.refs = [self.workers[0].run.remote(request, None)]
            return
        backend: Literal["gloo", "nccl"] = "nccl" if devices.kind == "cuda" else "gloo"
        nccl_id: Optional[list[int]] = None
        if backend == "nccl":
            nccl_id = ray.get(self.workers[0].nccl_unique_id.remote(), timeout=devices.rendezvous_timeout_s)
        for rank, worker in enumerate(self.workers):
            spec = RankSpec(rank=rank, world=devices.count, group=self.group, backend=backend, nccl_id=nccl_id,
                            allreduce=devices.allreduce, rendezvous_timeout_s=devices.rendezvous_timeout_s)
            self.refs.append(worker.run.remote(request, spec))

    def collect(self, ref: Any) -> Optional[AttemptOutcome]:
        """Take one rank's finished ref; the attempt's outcome once it is known, else None.

        How a rank ended decides what the attempt was: its process killed from outside (a
        SIGKILL, Ray's memory monitor, its node lost) is a preemption, retried; an exception
        raised by the run's own code (Ray's RayTaskError) is the run's failure."""
        rank = self.refs.index(ref)
        world = len(self.refs)
        try:
            outcome: AttemptOutcome = ray.get(ref)
        except RayTaskError as exc:
            # with several ranks, a rank that died makes the others' collectives raise too:
            # look whether one of them died before calling this the run's own failure
            dead = self.dead_rank()
            if dead is not None:
                return lost(f"rank {dead} of {world} lost (rank {rank} then raised {exc.cause.__class__.__name__ if exc.cause else 'an error'})")
            cause = exc.cause if exc.cause is not None else exc
            last = str(cause).strip().splitlines()[-1] if str(cause).strip() else ""
            return AttemptOutcome(exit_code=Exit.RUN_FAILED, reason=f"rank {rank} raised {type(cause).__name__}: {last}", rank=rank)
        except RayError as exc:  # the process or its node is gone: never the run's own fault
            return lost(f"rank {rank} of {world} lost: {death(exc)}")
        self.outcomes[rank] = outcome
        if rank == 0:
            return outcome
        if outcome.exit_code != Exit.OK and 0 not in self.outcomes:
            return outcome.with_rank_note(rank, world)
        return None

    def dead_rank(self, wait_s: float = 10.0) -> Optional[int]:
        """The first rank whose process died, waiting up to WAIT_S for the others to return."""
        if len(self.refs) == 1:
            return None
        ready, _ = ray.wait(list(self.refs), num_returns=len(self.refs), timeout=wait_s)
        for ref in ready:
            try:
                ray.get(ref)
            except RayTaskError:  # another rank's own error: not a death
                continue
            except RayError:
                return self.refs.index(ref)
        return None

    def release(self, idle: list[Any]) -> None:
        """After an outcome that is not a preemption: a single worker goes back to IDLE for
        the next point; ranks of a placement group are stopped with their group."""
        if self.placement is None and len(self.workers) == 1 and len(self.outcomes) == 1:
            self.stopped = True
            idle.append(self.workers[0])
        else:
            self.stop()

    def stop(self) -> None:
        self.stopped = True
        for worker in self.workers:
            try:
                ray.kill(worker, no_restart=True)
            except Exception:  # already gone
                pass
        if self.placement is not None:
            try:
                ray.util.remove_placement_group(self.placement)
            except Exception:  # already removed
                pass
