"""The data-parallel ranks' collectives: bucketed gradient all-reduce over a backend.

Two backends carry the same rank code:
- `GlooBackend`: Ray's collective library with its GLOO backend (torch.distributed's gloo
  underneath), on the CPU. CI and CPU clusters run the whole data-parallel path on it: the
  gradients are host arrays, packed into host buckets.
- `NcclBackend`: `cupy.cuda.nccl.NcclCommunicator` on GPUs. Rank 0 makes the unique id, the
  driver hands it to every rank through Ray, and NCCL's own sum/avg and bf16 are used. With the
  CUDA device the gradients never leave it (`DeviceBuckets`): each bucket is packed by a
  generated kernel and all-reduced in place, on a communication stream of its own, as soon
  as the backward pass has made its last gradient (the last layers' first), while the rest
  of the backward pass runs; the step waits for the buckets before the update.

Both joins (rendezvous) run under a timeout: a rank that never arrives is a clear error
(`RendezvousError`), never a hang.
"""

from __future__ import annotations

import re
import threading
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, Optional, Protocol, TypeVar

import numpy as np
from pydantic import BaseModel

from sexpgpu.ir.builder import Builder
from sexpgpu.ir.dtypes import DType
from sexpgpu.ir.graph import Program, TensorType
from sexpgpu.runtime.backend import Backend as ComputeBackend
from sexpgpu.runtime.backend import RunnableProgram

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
        return f"this CuPy has no NCCL (cupy.cuda.nccl.available is False): install NCCL for CuPy ({nccl_install(installed_distributions())})"
    return None


def installed_distributions() -> list[str]:
    from importlib import metadata

    return [d.metadata["Name"] or "" for d in metadata.distributions()]


def nccl_install(distributions: list[str]) -> str:
    """The pip line of the NCCL wheel for the CUDA major version of the CuPy wheel among
    DISTRIBUTIONS (cupy-cuda12x: nvidia-nccl-cu12); a CuPy built from source says which."""
    majors = sorted({m.group(1) for d in distributions if (m := re.fullmatch(r"cupy-cuda(\d+)x", d.strip().lower().replace("_", "-")))})
    if len(majors) == 1:
        return f"pip install nvidia-nccl-cu{majors[0]}"
    return "pip install nvidia-nccl-cuNN, NN the CUDA major version CuPy was built for"


class DeviceReducer(Protocol):
    """All-reduce of device buffers where they are, on a communication stream of its own."""

    averages: bool  # whether it has a native average (NCCL's avg)

    def allreduce_device(self, buffer: Any, op: Literal["avg", "sum"]) -> None:
        """Reduce the contiguous device array BUFFER over the ranks, in place, on the
        communication stream (op avg only when `averages`)."""
        ...

    def side_stream(self) -> AbstractContextManager[None]:
        """Within it, device work goes to the communication stream, after all the work
        queued on the compute stream so far."""
        ...

    def join_streams(self) -> None:
        """The compute stream waits for everything queued on the communication stream."""
        ...


class Backend(Protocol):
    def allreduce_sum(self, buffer: np.ndarray) -> None:
        """Sum BUFFER over the ranks, in place."""
        ...

    def allreduce_avg(self, buffer: np.ndarray) -> bool:
        """Average in place when the backend has a native average; False when it has not."""
        ...

    def device_reducer(self) -> Optional[DeviceReducer]:
        """How it reduces device buffers without the host (None: it reduces host buffers only)."""
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
    # the library's own deadline (GLOO's, set to the same seconds) may fire a moment before
    # ours: the same missing rank, said the same way
    if thread.is_alive() or isinstance(box.get("error"), TimeoutError):
        raise RendezvousError(f"{what}: not every rank joined within {seconds:g} s (a rank's node may be gone, or the ranks cannot reach each other); "
                              "the point is retried as a preemption if the driver can start its ranks again") from box.get("error")
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

    def device_reducer(self) -> Optional[DeviceReducer]:
        return None

    def close(self) -> None:
        try:
            self.col.destroy_collective_group(self.group)
        except Exception:  # the process is going away anyway
            pass


class NcclBackend:
    """NCCL through CuPy. Host buffers (the loss and metrics; the gradients of a rank whose
    loop runs on the CPU) go to the rank's GPU, are reduced there and come back; device
    buffers (the CUDA device's gradient buckets) are reduced in place on its communication
    stream."""

    averages = True

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
        self.stream = cupy.cuda.Stream(non_blocking=True)  # the gradient buckets' communication stream

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

    def device_reducer(self) -> Optional[DeviceReducer]:
        return self

    def allreduce_device(self, buffer: Any, op: Literal["avg", "sum"]) -> None:
        # bf16 lives on the device as its 16 bits (uint16)
        dtype = int(self.nccl.NCCL_FLOAT32) if buffer.dtype == np.float32 else int(getattr(self.nccl, "NCCL_BFLOAT16", 9))
        self.comm.allReduce(buffer.data.ptr, buffer.data.ptr, buffer.size, dtype, self.avg if op == "avg" else int(self.nccl.NCCL_SUM), self.stream.ptr)

    @contextmanager
    def side_stream(self) -> Iterator[None]:
        queued = self.cupy.cuda.Event()
        queued.record(self.cupy.cuda.get_current_stream())
        self.stream.wait_event(queued)
        with self.stream:
            yield

    def join_streams(self) -> None:
        reduced = self.cupy.cuda.Event()
        reduced.record(self.stream)
        self.cupy.cuda.get_current_stream().wait_event(reduced)

    def close(self) -> None:
        self.comm.destroy()


def nccl_unique_id() -> list[int]:
    """Rank 0's NCCL unique id, as plain integers that travel through Ray."""
    from cupy.cuda import nccl

    return [int(b) for b in nccl.get_unique_id()]


@dataclass
class Layout:
    """One bucket: its gradients' names, shapes and offsets (in elements) on the wire."""

    names: list[str]
    shapes: list[tuple[int, ...]]
    offsets: list[int]
    size: int


@dataclass
class Bucket:
    layout: Layout
    buffer: np.ndarray

    @property
    def names(self) -> list[str]:
        return self.layout.names

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return self.layout.shapes

    @property
    def offsets(self) -> list[int]:
        return self.layout.offsets


def wire_dtype(spec: AllReduceSpec) -> np.dtype:
    return np.dtype(np.float32) if spec.dtype == "f32" else np.dtype(bfloat16())


def bucket_layout(shapes: dict[str, tuple[int, ...]], spec: AllReduceSpec, kinds: Optional[dict[str, str]] = None) -> list[Layout]:
    """Gradients in reverse order (the last layers' gradients are ready first in a backward
    pass), packed into buckets of about spec.bucket_mb on the wire; with KINDS (name -> its
    dtype), a bucket holds one kind only."""
    limit = max(1, int(spec.bucket_mb * 2**20) // wire_dtype(spec).itemsize)
    layouts: list[Layout] = []
    current = Layout([], [], [], 0)
    for name in reversed(sorted(shapes)):
        n = int(np.prod(shapes[name], dtype=np.int64))
        other = kinds is not None and current.names and kinds[current.names[0]] != kinds[name]
        if current.names and (current.size + n > limit or other):
            layouts.append(current)
            current = Layout([], [], [], 0)
        current.names.append(name)
        current.shapes.append(tuple(shapes[name]))
        current.offsets.append(current.size)
        current.size += n
    if current.names:
        layouts.append(current)
    return layouts


def plan_buckets(grads: dict[str, np.ndarray], spec: AllReduceSpec) -> list[Bucket]:
    """Host buckets (bucket_layout's) with their buffers in the wire dtype."""
    return [Bucket(layout, np.zeros(layout.size, dtype=wire_dtype(spec))) for layout in bucket_layout({k: tuple(v.shape) for k, v in grads.items()}, spec)]


def pack_program(index: int, layout: Layout, types: dict[str, TensorType], wire: DType) -> Program:
    """The bucket as one 1-D wire-dtype value, "bucket", from its gradients: each flattened,
    joined in order (one generated kernel), cast to the wire dtype in it."""
    b = Builder(f"bucket:{index}:pack")
    parts = [b.op("reshape", b.input(name, "value", types[name]), shape=[int(np.prod(shape, dtype=np.int64))]) for name, shape in zip(layout.names, layout.shapes)]
    joined = b.op("concat", *parts, axis=0)
    dtype = types[layout.names[0]].dtype
    return b.program({"bucket": joined if dtype == wire else b.cast(joined, dtype=wire)})


def unpack_program(index: int, layout: Layout, types: dict[str, TensorType], wire: DType, scale: Optional[float]) -> Program:
    """The reduced bucket back to its gradients: cast to their dtype, scaled (an average the
    reducer does not take natively), each gradient a window of it (one generated kernel)."""
    b = Builder(f"bucket:{index}:unpack")
    dtype = types[layout.names[0]].dtype
    value = b.input("bucket", "value", TensorType(dtype=wire, shape=(layout.size,)))
    if dtype != wire:
        value = b.cast(value, dtype=dtype)
    if scale is not None:
        value = b.op("mul", value, b.const(scale, dtype))
    outputs = {}
    for name, shape, offset in zip(layout.names, layout.shapes, layout.offsets):
        n = int(np.prod(shape, dtype=np.int64))
        outputs[name] = b.op("reshape", b.op("slice", value, starts=[offset], stops=[offset + n]), shape=list(shape))
    return b.program(outputs)


class DeviceBuckets:
    """A rank's gradient buckets on its device (the CUDA device's resident gradients): packed,
    all-reduced in place and unpacked by the device, bucket by bucket as the backward pass
    completes each one (`ready`), the rest when the step asks for them (`finish`). Every rank
    plans the same buckets and completes them in the same order (the same program), which
    NCCL needs. A bucket that needs neither a cast nor a scale comes back as views of itself."""

    def __init__(self, backend: ComputeBackend, types: dict[str, TensorType], spec: AllReduceSpec, reducer: DeviceReducer, world: int) -> None:
        wire = DType.f32 if spec.dtype == "f32" else DType.bf16
        self.spec, self.reducer = spec, reducer
        self.layouts = bucket_layout({k: tuple(t.shape) for k, t in types.items()}, spec, {k: t.dtype.value for k, t in types.items()})
        scale = 1.0 / world if spec.op == "avg" and not reducer.averages else None
        self.pack: list[RunnableProgram] = [backend.program(pack_program(i, layout, types, wire)) for i, layout in enumerate(self.layouts)]
        self.unpack: list[Optional[RunnableProgram]] = [
            backend.program(unpack_program(i, layout, types, wire, scale)) if scale is not None or types[layout.names[0]].dtype != wire else None
            for i, layout in enumerate(self.layouts)
        ]
        self.bucket_of = {name: i for i, layout in enumerate(self.layouts) for name in layout.names}
        self.values: dict[str, Any] = {}
        self.reduced: dict[int, dict[str, Any]] = {}  # bucket -> its reduced gradients (this step's)

    def ready(self, name: str, value: Any) -> None:
        self.values[name] = value
        index = self.bucket_of[name]
        if index not in self.reduced and all(n in self.values for n in self.layouts[index].names):
            self.launch(index)

    def launch(self, index: int) -> None:
        layout = self.layouts[index]
        op: Literal["avg", "sum"] = "avg" if self.spec.op == "avg" and self.reducer.averages else "sum"
        with self.reducer.side_stream():
            packed = self.pack[index].run({n: self.values[n] for n in layout.names}, keep=frozenset({"bucket"}))["bucket"]
            self.reducer.allreduce_device(packed, op)
            unpack = self.unpack[index]
            if unpack is None:
                self.reduced[index] = {n: packed[o : o + int(np.prod(s, dtype=np.int64))].reshape(s) for n, s, o in zip(layout.names, layout.shapes, layout.offsets)}
            else:
                self.reduced[index] = unpack.run({"bucket": packed}, keep=frozenset(layout.names))

    def finish(self, grads: dict[str, Any]) -> dict[str, Any]:
        """Every bucket reduced (those the backward pass did not complete, from GRADS), the
        compute stream waiting for them; this step's reduced gradients."""
        for name, value in grads.items():
            self.values.setdefault(name, value)
        for index in range(len(self.layouts)):
            if index not in self.reduced:
                self.launch(index)
        self.reducer.join_streams()
        out = {name: value for part in self.reduced.values() for name, value in part.items()}
        self.values, self.reduced = {}, {}
        return out


class RankCollective:
    """The loop's `Collective` for one rank: gradients in buckets, loss and metrics in f64."""

    def __init__(self, spec: RankSpec, backend: Backend) -> None:
        self.rank, self.world = spec.rank, spec.world
        self.spec = spec.allreduce
        self.backend = backend
        self.buckets: Optional[list[Bucket]] = None
        self.device: Optional[DeviceBuckets] = None  # the gradients reduced on the device
        self.flag = np.zeros(1, dtype=np.float32)

    def reduces_resident(self, backend: ComputeBackend, grads: dict[str, TensorType]) -> bool:
        """Yes for a backend whose programs run on a device, with a collective that reduces
        device buffers (NCCL)."""
        from sexpgpu.runtime.lower.executor import DeviceBackend

        reducer = self.backend.device_reducer()
        if reducer is None or not isinstance(backend, DeviceBackend):
            return False
        self.device = DeviceBuckets(backend, grads, self.spec, reducer, self.world)
        return True

    def gradient_ready(self, name: str, value: Any) -> None:
        if self.device is not None:
            self.device.ready(name, value)

    def reduce_step(self, out: dict[str, Any]) -> dict[str, Any]:
        grads = {k: v for k, v in out.items() if k.startswith("grad:")}
        reduced = dict(out)
        if self.device is not None:
            reduced.update(self.device.finish(grads))
        else:
            if self.buckets is None:
                self.buckets = plan_buckets(grads, self.spec)
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
