"""The memory plans of a compiled experiment: what a run holds on the host (`explain`) and on
a CUDA device (`explain --cuda`), and the check that a run fits before it starts."""

from __future__ import annotations

from typing import Mapping, Optional

from pydantic import BaseModel

from ..ir.experiment import Experiment
from ..ir.graph import shape_size
from .backend import DeviceError
from .numpy_backend import plan_layout

F32_BYTES = 4  # parameters, gradients and optimizer state are held in f32 (master weights under bf16)


class HostMemoryPlan(BaseModel):
    params: int
    grads: int
    optimizer_state: int
    activations_peak: int
    update_peak: int
    total: int
    device: str = "cpu"


class DeviceMemoryPlan(BaseModel):
    params: int
    optimizer_state: int
    arenas: dict[str, int]  # program -> its arena's bytes, held for the whole run
    gradient_accumulator: int
    # data-parallel ranks (NCCL) reduce their gradients in buckets on the device: the wire
    # copy and, for a bf16 wire, the gradients unpacked from it (at most 1.5 x the gradients)
    allreduce_buckets: int = 0
    total: int


def host_memory_plan(experiment: Experiment) -> HostMemoryPlan:
    shapes = {p.path: p.shape for p in experiment.params}
    params = sum(shape_size(shape) * F32_BYTES for shape in shapes.values())
    states = sum(shape_size(shapes[path]) * F32_BYTES * len(g.states) for g in experiment.groups for path in g.params)
    grads = sum(shape_size(shapes[path]) * F32_BYTES for g in experiment.groups if g.optimizer for path in g.params)
    train = plan_layout(experiment.module.programs["train"]).peak_bytes
    update = plan_layout(experiment.module.programs["update"]).peak_bytes
    return HostMemoryPlan(params=params, grads=grads, optimizer_state=states, activations_peak=train, update_peak=update,
                          total=params + states + train + update)


def device_memory_plan(experiment: Experiment, arenas: Optional[Mapping[str, int]] = None) -> DeviceMemoryPlan:
    """Every program the run loads holds its arena for the whole run (all but `forward`,
    which only explain shows), and with microbatches the gradients are summed in one more
    copy. ARENAS: sizes already known (from lowering reports), the others are planned here."""
    from .lower.fusion import lower
    from .lower.plan import plan_arena

    host = host_memory_plan(experiment)
    known = dict(arenas or {})
    loaded = [name for name in experiment.module.programs if name != "forward"]
    sizes = {name: known[name] if name in known else plan_arena(lower(experiment.module.programs[name])).size for name in loaded}
    accumulator = host.grads if experiment.run.microbatches > 1 else 0
    buckets = host.grads * 3 // 2 if experiment.world > 1 else 0
    total = host.params + host.optimizer_state + sum(sizes.values()) + accumulator + buckets
    return DeviceMemoryPlan(params=host.params, optimizer_state=host.optimizer_state, arenas=sizes, gradient_accumulator=accumulator,
                            allreduce_buckets=buckets, total=total)


def device_memory_problem(experiment: Experiment, free: int) -> Optional[str]:
    """Why the run cannot fit in FREE bytes of device memory, or cannot run on the device at
    all (None: it fits)."""
    try:
        need = device_memory_plan(experiment).total
    except DeviceError as exc:  # a program the CUDA lowering cannot express
        return f"the CUDA device cannot run it: {exc}"
    if need > free:
        return f"the run needs {need:,} bytes of device memory (sexpgpu explain --cuda), the device has {free:,} free; lower the batch or use :microbatches"
    return None


def available_memory() -> Optional[int]:
    """The bytes the machine can give a new process now (Linux's MemAvailable), or None
    where it does not say."""
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def host_memory_problem(experiment: Experiment) -> Optional[str]:
    """Why the run cannot fit in the machine's memory (None: it fits, or the machine does not
    say what it has), found from the plan's sizes before anything is allocated."""
    need, free = host_memory_plan(experiment).total, available_memory()
    if free is not None and need > free:
        return f"the run needs {need:,} bytes of memory (sexpgpu explain), the machine has {free:,} available; lower the batch or the model, or use :microbatches"
    return None
