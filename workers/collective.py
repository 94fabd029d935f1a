"""The data-parallel ranks' collectives: bucketed gradient all-reduce over a backend.

Two backends carry the same rank code:
- `GlooBackend`: Ray's collective library with its GLOO backend (torch.distributed's gloo
  underneath), on the CPU. CI and CPU clusters run the whole data-parallel path on it.
- `NcclBackend`: `cupy.cuda.nccl.NcclCommunicator` on GPUs. Rank 0 makes the unique id, the
  driver hands it to every rank through Ray, and NCCL's own sum/avg and bf16 are used.

Both joins (rendezvous) run under a timeout: a rank that never arrives is a clear error
(`RendezvousError`), never a hang.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional, Protocol, TypeVar

import numpy as np
from pydantic import BaseModel

T = TypeVar("T")


class AllReduceSpec(BaseModel):
    """How gradients travel between ranks (`sweep --allreduce-dtype/--allreduce-op/--bucket-mb`)."""

    dtype: Literal["f32", "bf16"] = "f32"  # the wire format of gradient buckets
    op: Literal["avg", "sum"] = "avg"  # avg: the gradient of the global batch's mean loss
    bucket_mb: float = 25.0


class RankSpec(BaseModel):
    """What one rank needs to join its group; crosses from the driver to the rank actor."""

    rank: int
    world: int
    group: str  # unique per attempt
    backend: Literal["gloo", "nccl"] = "gloo"
    nccl_id: Optional[list[int]] = None  # rank 0's cupy.cuda.nccl.get_unique_id(), for nccl
    allreduce: AllReduceSpec = AllReduceSpec()
    rendezvous_timeout_s: float = 120.0


class RendezvousError(RuntimeError):
    """A rank did not join its group in time."""


class CollectiveUnavailable(RuntimeError):
    """The collective library is missing on this worker (not retried: exit 4 with the fix)."""


def unavailable(backend: str) -> Optional[str]:
    """Why BACKEND cannot run in this process (None: it can)."""
    if backend == "gloo":
        try:
            import torch.distributed  # noqa: F401  Ray's GLOO group is torch.distributed's gloo
        except ImportError:
            return "CPU ranks use Ray's GLOO collective, which needs PyTorch: pip install torch==2.13.0 (the test extra has it) on every worker"
        return None
    try:
        from cupy.cuda import nccl
    except ImportError:
        return "GPU ranks need CuPy with NCCL: pip install -e '.[cuda]' on every worker"
    if not getattr(nccl, "available", True):
        return "this CuPy has no NCCL (cupy.cuda.nccl.available is False): install NCCL for CuPy (pip install nvidia-nccl-cu13)"
    return None


class Backend(Protocol):
    def allreduce_sum(self, buffer: np.ndarray) -> None:
        """Sum BUFFER over the ranks, in place."""
        ...

    def allreduce_avg(self, buffer: np.ndarray) -> bool:
        """Average in place when the backend has a native average; False when it has not."""
        ...


def within(seconds: float, what: str, join: Callable[[], T]) -> T:
    """Run JOIN (a blocking rendezvous) with a deadline."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = join()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"rendezvous {what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise RendezvousError(f"{what}: not every rank joined within {seconds:g} s (a rank's node may be gone, or the ranks cannot reach each other); "
                              "the point is retried as a preemption if the driver can start its ranks again")
    if "error" in box:
        raise RendezvousError(f"{what}: {type(box['error']).__name__}: {box['error']}") from box["error"]
    return box["value"]


def bfloat16() -> Any:
    import ml_dtypes

    return ml_dtypes.bfloat16


class GlooBackend:
    """Ray's collective group with the GLOO backend (torch's gloo), numpy buffers in place."""

    def __init__(self, spec: RankSpec) -> None:
        import ray.util.collective as col

        self.col = col
        self.group = spec.group
        timeout_ms = int(spec.rendezvous_timeout_s * 1000)
        within(spec.rendezvous_timeout_s, f"GLOO group {spec.group} (rank {spec.rank} of {spec.world})",
               lambda: col.init_collective_group(spec.world, spec.rank, backend="gloo", group_name=spec.group, gloo_timeout=timeout_ms))
        self.barrier_probe = np.zeros(1, dtype=np.float32)
        within(spec.rendezvous_timeout_s, f"GLOO group {spec.group} first all-reduce", lambda: self.allreduce_sum(self.barrier_probe))

    def tensor(self, buffer: np.ndarray) -> Any:
        import torch

        if buffer.dtype == bfloat16():  # torch reads ml_dtypes' bf16 through its bits
            return torch.from_numpy(buffer.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(buffer)

    def allreduce_sum(self, buffer: np.ndarray) -> None:
        self.col.allreduce(self.tensor(buffer), group_name=self.group)

    def allreduce_avg(self, buffer: np.ndarray) -> bool:
        return False

    def close(self) -> None:
        try:
            self.col.destroy_collective_group(self.group)
        except Exception:  # the process is going away anyway
            pass


class NcclBackend:
    """NCCL through CuPy: buffers go to the rank's GPU, are reduced there and come back.
    (With the CUDA device the gradients already live on the GPU; this is the same call.)"""

    def __init__(self, spec: RankSpec) -> None:
        import cupy
        from cupy.cuda import nccl

        if spec.nccl_id is None:
            raise RendezvousError("NCCL needs rank 0's unique id; the driver did not pass one")
        self.cupy, self.nccl = cupy, nccl
        unique_id = tuple(spec.nccl_id)
        device = cupy.cuda.Device().id  # this rank's GPU (Ray sets CUDA_VISIBLE_DEVICES per actor)

        def join() -> Any:
            cupy.cuda.Device(device).use()  # NCCL binds the communicator to the current device
            return nccl.NcclCommunicator(spec.world, unique_id, spec.rank)

        self.comm = within(spec.rendezvous_timeout_s, f"NCCL communicator {spec.group} (rank {spec.rank} of {spec.world})", join)
        self.avg = getattr(nccl, "NCCL_AVG", 4)  # ncclAvg (NCCL >= 2.10)

    def nccl_dtype(self, buffer: np.ndarray) -> int:
        if buffer.dtype == np.float32:
            return int(self.nccl.NCCL_FLOAT32)
        if buffer.dtype == np.float64:  # the loss and metrics
            return int(getattr(self.nccl, "NCCL_FLOAT64", 8))
        if buffer.dtype == bfloat16():
            return int(getattr(self.nccl, "NCCL_BFLOAT16", 9))  # ncclBfloat16
        raise TypeError(f"NCCL buckets are f32 or bf16, not {buffer.dtype}")

    def reduce(self, buffer: np.ndarray, op: int) -> None:
        cp = self.cupy
        wire = buffer.view(np.uint16) if buffer.dtype == bfloat16() else buffer
        # the copy in, the all-reduce and the copy out on one stream, in that order
        stream = cp.cuda.get_current_stream()
        device = cp.asarray(wire)
        self.comm.allReduce(device.data.ptr, device.data.ptr, buffer.size, self.nccl_dtype(buffer), op, stream.ptr)
        wire[...] = cp.asnumpy(device, stream=stream)
        stream.synchronize()

    def allreduce_sum(self, buffer: np.ndarray) -> None:
        self.reduce(buffer, int(self.nccl.NCCL_SUM))

    def allreduce_avg(self, buffer: np.ndarray) -> bool:
        self.reduce(buffer, self.avg)
        return True

    def close(self) -> None:
        self.comm.destroy()


def nccl_unique_id() -> list[int]:
    """Rank 0's NCCL unique id, as plain integers that travel through Ray."""
    from cupy.cuda import nccl

    return [int(b) for b in nccl.get_unique_id()]


@dataclass
class Bucket:
    names: list[str]
    shapes: list[tuple[int, ...]]
    offsets: list[int]
    buffer: np.ndarray


def plan_buckets(grads: dict[str, np.ndarray], spec: AllReduceSpec) -> list[Bucket]:
    """Gradients in reverse order (the last layers' gradients are ready first in a backward
    pass), packed into buckets of about spec.bucket_mb on the wire."""
    wire = np.dtype(np.float32) if spec.dtype == "f32" else np.dtype(bfloat16())
    limit = max(1, int(spec.bucket_mb * 2**20) // wire.itemsize)
    buckets: list[Bucket] = []
    names: list[str] = []
    shapes: list[tuple[int, ...]] = []
    offsets: list[int] = []
    size = 0
    for name in reversed(sorted(grads)):
        n = int(grads[name].size)
        if names and size + n > limit:
            buckets.append(Bucket(names, shapes, offsets, np.zeros(size, dtype=wire)))
            names, shapes, offsets, size = [], [], [], 0
        names.append(name)
        shapes.append(tuple(grads[name].shape))
        offsets.append(size)
        size += n
    if names:
        buckets.append(Bucket(names, shapes, offsets, np.zeros(size, dtype=wire)))
    return buckets


class RankCollective:
    """The loop's `Collective` for one rank: gradients in buckets, loss and metrics in f64."""

    def __init__(self, spec: RankSpec, backend: Backend) -> None:
        self.rank, self.world = spec.rank, spec.world
        self.spec = spec.allreduce
        self.backend = backend
        self.buckets: Optional[list[Bucket]] = None
        self.flag = np.zeros(1, dtype=np.float32)

    def reduce_step(self, out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        grads = {k: v for k, v in out.items() if k.startswith("grad:")}
        if self.buckets is None:
            self.buckets = plan_buckets(grads, self.spec)
        reduced = dict(out)
        for bucket in self.buckets:
            self.reduce_bucket(bucket, grads, reduced)
        scalars = [k for k in sorted(out) if k == "loss" or k.startswith("metric:")]
        values = np.array([float(out[k]) for k in scalars], dtype=np.float64)
        self.backend.allreduce_sum(values)
        for k, v in zip(scalars, values / self.world):
            reduced[k] = np.asarray(v, dtype=out[k].dtype)
        return reduced

    def reduce_bucket(self, bucket: Bucket, grads: dict[str, np.ndarray], reduced: dict[str, np.ndarray]) -> None:
        flat = bucket.buffer
        for name, offset in zip(bucket.names, bucket.offsets):
            g = grads[name]
            flat[offset : offset + g.size] = g.reshape(-1)  # casts to the wire dtype
        averaged = self.spec.op == "avg" and self.backend.allreduce_avg(flat)
        if not averaged:
            self.backend.allreduce_sum(flat)
        scale = 1.0 / self.world if self.spec.op == "avg" and not averaged else None
        for name, offset, shape in zip(bucket.names, bucket.offsets, bucket.shapes):
            n = int(np.prod(shape, dtype=np.int64))
            g = flat[offset : offset + n].astype(np.float32).reshape(shape)
            if scale is not None:
                g *= np.float32(scale)
            reduced[name] = g

    def agree(self, value: bool) -> bool:
        self.flag[0] = 1.0 if (value and self.rank == 0) else 0.0
        self.backend.allreduce_sum(self.flag)
        return bool(self.flag[0] > 0)

    def broadcast(self, value: float) -> float:
        """Rank 0's VALUE on every rank (e.g. the elapsed time the ctx and curriculum read)."""
        box = np.array([value if self.rank == 0 else 0.0], dtype=np.float64)
        self.backend.allreduce_sum(box)
        return float(box[0])


def join(spec: RankSpec) -> RankCollective:
    """Join this rank's group (under the rendezvous timeout) and return its collective."""
    problem = unavailable(spec.backend)
    if problem is not None:
        raise CollectiveUnavailable(problem)
    backend: Backend = NcclBackend(spec) if spec.backend == "nccl" else GlooBackend(spec)
    return RankCollective(spec, backend)
