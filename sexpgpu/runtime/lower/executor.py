"""Running a lowered program: the arena, the generated kernels, cuBLAS calls and op kernels,
over an array module (CuPy on a GPU; NumPy with host-compiled kernels in the tests, which
run whole programs of the examples this way and compare them with the NumPy backend).

Arrays on the device are in their storage dtype: bf16 as its 16 bits (uint16), booleans as
bytes. A program's inputs are host arrays (copied in) or arrays already on the device (used
as they are: the loop's resident parameters, optimizer state and gradients); its outputs go
back to the host unless the caller keeps them on the device (`run(feeds, keep=...)`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol

import numpy as np

from ...ir.builder import Builder
from ...ir.dtypes import DType, numpy_dtype
from ...ir.graph import Node, Program, TensorType
from ...ir.ops import op_def
from ..backend import Ready
from .blas import BlasCall
from .codegen import STORAGE, KernelSource, storage_bytes
from .fusion import Lowering, lower
from .kernels import kernels_for
from .plan import plan_arena, scratch_value


def c_order(xp: Any, a: Any) -> Any:
    """A in C order, with its shape (ascontiguousarray makes a 0-d array 1-d)."""
    return a if a.flags.c_contiguous else xp.ascontiguousarray(a).reshape(a.shape)


class KernelRunner(Protocol):
    """What launches work on a device: generated kernels and cuBLAS calls (CuPy's NVRTC and
    cuBLAS on a GPU; the host emulation of both in the tests)."""

    def prepare(self, kernels: list[KernelSource]) -> None:
        """Compile every kernel once (cached by source)."""
        ...

    def launch(self, kernel: KernelSource, arrays: list[Any]) -> None:
        """Run KERNEL over ARRAYS (its params, in order; contiguous, storage dtypes)."""
        ...

    def gemm(self, call: BlasCall, a: Any, b: Any, c: Any) -> None:
        """CALL on the flat storage of the contiguous arrays A, B (read) and C (written)."""
        ...


class ArrayDevice:
    """An array module plus a kernel runner: what a lowered program runs on."""

    def __init__(self, xp: Any, runner: KernelRunner) -> None:
        self.xp = xp
        self.runner = runner

    def to_device(self, host: Any, t: TensorType) -> Any:
        if isinstance(host, self.xp.ndarray) and host.dtype == STORAGE[t.dtype]:  # already on the device
            if host.shape != tuple(t.shape):
                raise ValueError(f"an input of shape {host.shape} for {t}")
            return c_order(self.xp, host)
        a = np.asarray(host, dtype=numpy_dtype(t.dtype))  # the declared type, as the kernels read it
        if a.shape != tuple(t.shape):
            raise ValueError(f"an input of shape {a.shape} for {t}")
        if t.dtype == DType.bf16:
            a = a.view(np.uint16)
        elif t.dtype == DType.bool:
            a = a.astype(np.uint8)
        return c_order(self.xp, self.xp.asarray(a))

    def to_host(self, value: Any, t: TensorType) -> np.ndarray:
        a = value.get() if hasattr(value, "get") and self.xp is not np else np.asarray(value)
        if t.dtype == DType.bf16:
            return c_order(np, a).view(numpy_dtype(DType.bf16))
        if t.dtype == DType.bool:
            return a.astype(bool)
        return a

    def on_host(self, node: Node, args: list[Any], arg_types: list[TensorType]) -> Any:
        """The op table's NumPy kernel on host copies, the result sent back (an op declared
        `on_host`): the CPU backend's exact values, at the price of the copies."""
        host = [self.to_host(a, t) for a, t in zip(args, arg_types)]
        with np.errstate(all="ignore"):
            result = op_def(node.op).numpy(host, dict(node.attrs), None)
        return self.to_device(np.asarray(result), node.type)


class LoweredProgram:
    """A program lowered for the CUDA device, with its arena, ready to run many times; the
    same interface as the NumPy backend's CompiledProgram."""

    def __init__(self, program: Program, device: ArrayDevice) -> None:
        self.device = device
        self.lowering = lower(program)
        self.schedule(self.lowering)
        self.program = program  # the IR as `sexpgpu ir` prints it (the non-finite replay names its nodes)
        program = self.lowering.program  # what runs: softmax and the like built from their parts
        self.outputs = program.outputs
        self.arena = plan_arena(self.lowering)
        self.types = program.types()
        self.input_ids = {i.name: i.id for i in program.inputs}
        self.input_types = {i.name: i.type for i in program.inputs}
        xp = device.xp
        self.memory = xp.zeros(max(self.arena.size, 1), dtype=np.uint8)
        self.views: dict[int, Any] = {}
        for buf in self.arena.buffers:
            raw = self.memory[buf.offset : buf.offset + buf.bytes]
            if buf.value < 0:  # a step's scratch bytes, typed by the step (`ProgramRun.scratch`)
                self.views[buf.value] = raw
                continue
            t = self.types[buf.value]
            self.views[buf.value] = raw.view(STORAGE[t.dtype]).reshape(t.shape)
        self.kernels = [kernels_for(step, program, self.lowering.constants) for step in self.lowering.steps]
        device.runner.prepare([kernel for kernels in self.kernels for kernel in kernels])
        self.made_once = False  # whether the constants made once are in their buffers
        # the step after which each output is done with: written, and read by no later step
        # (a gradient can travel from then on while the program goes on)
        last: dict[str, int] = {}
        for k, step in enumerate(self.lowering.steps):
            for name, vid in self.outputs.items():
                if vid in step.writes or vid in step.reads:
                    last[name] = k
        self.output_steps: dict[int, list[str]] = {}
        for name, k in last.items():
            self.output_steps.setdefault(k, []).append(name)

    def schedule(self, lowering: Lowering) -> None:
        """The device's choices of how the steps launch their work that change no bit, made
        before the arena is planned (none here: each kernel and gemm launched once)."""

    def run(self, feeds: dict[str, Any], keep: frozenset[str] = frozenset(), ready: Optional[Ready] = None) -> dict[str, Any]:
        """Run on FEEDS; the outputs named in KEEP stay on the device (views of the arena or
        of an input: valid until the next run), the others come back as host arrays. READY,
        if given, is called with each kept output as soon as the last step that writes or
        reads it has been launched (a data-parallel rank starts all-reducing gradients while
        the backward pass goes on)."""
        device, types = self.device, self.types
        values: dict[int, Any] = {}
        for name, vid in self.input_ids.items():
            values[vid] = device.to_device(feeds[name], self.input_types[name])
        if ready is not None:
            for name, vid in self.outputs.items():
                if name in keep and vid in values and not any(name in names for names in self.output_steps.values()):  # an input returned as it is
                    ready(name, values[vid])
        run = ProgramRun(self, values)
        for k, step in enumerate(self.lowering.steps):
            run.step = k
            if step.once and self.made_once:
                for vid in step.writes:
                    run.set(vid, run.buffer(vid))
            else:
                step.launch(run, self.kernels[k])
            if ready is not None:
                for name in self.output_steps.get(k, ()):
                    if name in keep:
                        ready(name, values[self.outputs[name]])
        self.made_once = True
        return {name: values[vid] if name in keep else device.to_host(values[vid], types[vid]) for name, vid in self.outputs.items()}

    def run_copy(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        return {k: np.array(v, copy=True) for k, v in self.run(feeds).items()}

    def notice(self) -> Optional[str]:
        """The ops of this program that run on the host (`on_host` in the op table) and the
        bytes they copy per run, in one line."""
        host = [step for step in self.lowering.steps if step.kind == "host"]
        name = self.program.name
        if not host:
            return f"cuda: {name}: every op runs on the device"
        ops = ", ".join(f"%{n.id} {n.op}" for step in host for n in step.nodes)
        copied = sum(storage_bytes(self.types[v]) for step in host for v in step.reads + step.writes)
        return f"cuda: {name}: {len(host)} op{'s' if len(host) > 1 else ''} on the host ({ops}): {copied:,} bytes copied per run"


class ProgramRun:
    """One run of a lowered program, as its steps see it (lowering.StepRun)."""

    def __init__(self, lowered: LoweredProgram, values: dict[int, Any]) -> None:
        self.lowered = lowered
        self.device = lowered.device
        self.values = values
        self.step = 0  # the step running now (whose scratch buffer `scratch` is)

    @property
    def xp(self) -> Any:
        return self.device.xp

    def value(self, vid: int) -> Any:
        return self.values[vid]

    def contiguous(self, vid: int) -> Any:
        return c_order(self.device.xp, self.values[vid])

    def buffer(self, vid: int) -> Any:
        return self.lowered.views[vid]

    def scratch(self, dtype: Any, count: int, offset: int = 0) -> Any:
        raw = self.lowered.views[scratch_value(self.step)]
        return raw[offset : offset + count * np.dtype(dtype).itemsize].view(dtype)

    def set(self, vid: int, value: Any) -> None:
        self.values[vid] = value

    def launch(self, kernel: KernelSource, arrays: list[Any]) -> None:
        self.device.runner.launch(kernel, arrays)

    def gemm(self, call: BlasCall, a: Any, b: Any, c: Any) -> None:
        self.device.runner.gemm(call, a, b, c)

    def each(self, count: int, body: Callable[[int], None], private_bytes: Optional[int] = None) -> None:
        for item in range(count):
            body(item)

    def host_op(self, node: Node) -> Any:
        types = self.lowered.types
        return self.device.on_host(node, [self.values[a] for a in node.args], [types[a] for a in node.args])


class DeviceBackend:
    """The loop's backend on a device: programs lowered for it, parameters, optimizer state and
    gradients resident in its memory between programs (see runtime/backend.py). Summing and
    scaling resident arrays (microbatches) are generated kernels too, bf16 as its bits."""

    def __init__(self, device: ArrayDevice) -> None:
        self.device = device
        self.arithmetic: dict[tuple[str, str, tuple[int, ...], float], LoweredProgram] = {}  # the sums and scalings made so far

    def program(self, program: Program) -> LoweredProgram:
        return LoweredProgram(program, self.device)

    def put(self, host: np.ndarray, t: TensorType) -> Any:
        return self.device.xp.array(self.device.to_device(host, t), copy=True)

    def get(self, value: Any, t: TensorType) -> np.ndarray:
        return np.array(self.device.to_host(value, t), copy=True)

    def add(self, total: Optional[Any], value: Any, t: TensorType) -> Any:
        if total is None:
            return self.device.xp.array(value, copy=True)
        total[...] = self.elementwise("add", t, 0.0).run({"a": total, "b": value}, keep=frozenset({"out"}))["out"]
        return total

    def scaled(self, total: Any, factor: float, t: TensorType) -> Any:
        return self.device.xp.array(self.elementwise("mul", t, factor).run({"a": total}, keep=frozenset({"out"}))["out"], copy=True)

    def elementwise(self, op: str, t: TensorType, factor: float) -> LoweredProgram:
        """out = a + b, or a * FACTOR (rounded to T's dtype, as NumPy rounds it), lowered once."""
        key = (op, t.dtype.value, tuple(t.shape), factor)
        if key not in self.arithmetic:
            b = Builder(f"{op}:{t}")
            a = b.input("a", "value", t)
            other = b.input("b", "value", t) if op == "add" else b.const(factor, t.dtype)
            self.arithmetic[key] = self.program(b.program({"out": b.op(op, a, other)}))
        return self.arithmetic[key]
