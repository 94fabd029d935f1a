"""Running a lowered program: the arena, the generated kernels, cuBLAS calls and op kernels,
over an array module (CuPy on a GPU; NumPy with host-compiled kernels in the tests, which
run whole programs of the examples this way and compare them with the NumPy backend).

Arrays on the device are in their storage dtype: bf16 as its 16 bits (uint16), booleans as
bytes. A program's inputs are host arrays (copied in) or arrays already on the device (used
as they are: the loop's resident parameters, optimizer state and gradients); its outputs go
back to the host unless the caller keeps them on the device (`run(feeds, keep=...)`).
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

import numpy as np

from ...ir.dtypes import DType, numpy_dtype
from ...ir.graph import Node, Program, TensorType
from ...ir.ops import op_def
from ..backend import HostBackend
from .codegen import KernelSource, kernel_for
from .fusion import FusedGroup, GemmCall, OpKernel, RandomStep, ReduceGroup, ScatterStep, ViewStep, lower
from .plan import plan_arena
from .rows import RowGroup

STORAGE = {DType.f32: np.float32, DType.bf16: np.uint16, DType.i32: np.int32, DType.i64: np.int64, DType.bool: np.uint8, DType.f64: np.float64}
# ops that only move elements: they run on the storage bits whatever the dtype
MOVES = {"transpose", "take", "concat", "slice", "unslice", "broadcast_to", "reshape"}
# computed by the CPU backend's kernel and sent to the device: the random bits (Philox keyed
# by seed, step and op) must be the CPU's, bit for bit
ON_HOST = {"dropout_mask", "random_uniform", "random_normal"}


def c_order(xp: Any, a: Any) -> Any:
    """A in C order, with its shape (ascontiguousarray makes a 0-d array 1-d)."""
    return a if a.flags.c_contiguous else xp.ascontiguousarray(a).reshape(a.shape)


def stored_as_bits(t: TensorType) -> bool:
    """Whether T's device storage differs from its host dtype (bf16 as uint16, bool as bytes)."""
    return np.dtype(STORAGE[t.dtype]) != np.dtype(numpy_dtype(t.dtype))


class KernelRunner(Protocol):
    def prepare(self, kernels: list[KernelSource]) -> None:
        """Compile every kernel once (cached by source)."""
        ...

    def launch(self, kernel: KernelSource, arrays: list[Any]) -> None:
        """Run KERNEL over ARRAYS (its params, in order; contiguous, storage dtypes)."""
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

    def typed(self, value: Any, t: TensorType) -> Any:
        """A storage array as the NumPy backend's dtype (host only: bf16 through ml_dtypes)."""
        if t.dtype == DType.bf16:
            return value.view(numpy_dtype(DType.bf16))
        if t.dtype == DType.bool:
            return value.astype(bool)
        return value

    def storage(self, value: Any, t: TensorType) -> Any:
        value = self.xp.asarray(value)
        if t.dtype == DType.bf16:
            return value.view(np.uint16) if value.dtype.itemsize == 2 else self.round_bf16(value)
        if t.dtype == DType.bool:
            return value.astype(np.uint8)
        return value.astype(STORAGE[t.dtype], copy=False)

    def round_bf16(self, value: Any) -> Any:
        """f32 values to bf16 bits, rounding to nearest even (as ml_dtypes does)."""
        bits = c_order(self.xp, value.astype(np.float32)).view(np.uint32)
        nan = (bits & 0x7FFFFFFF) > 0x7F800000
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        return self.xp.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)

    def widen_bf16(self, bits: Any) -> Any:
        return (bits.astype(np.uint32) << 16).view(np.float32)

    def op(self, node: Node, args: list[Any], types: dict[int, TensorType]) -> Any:
        """An op that is a kernel of its own. Element moves run on the storage bits; other ops
        run the op table's kernel (NumPy's API, which CuPy arrays also dispatch), with bf16
        widened to f32 and rounded back on a device without a bf16 array type."""
        kernel = op_def(node.op).numpy
        attrs = dict(node.attrs)
        arg_types = [types[a] for a in node.args]
        if node.op == "take" and self.xp is not np:  # CuPy's take has no mode=: clip first, as the CPU does
            rows = args[0].shape[attrs.get("axis", 0)]
            return self.xp.take(args[0], self.xp.clip(args[1], 0, rows - 1), axis=attrs.get("axis", 0))
        if node.op in MOVES:
            try:
                return kernel(args, attrs, None)
            except (TypeError, ValueError, NotImplementedError):  # NumPy API CuPy lacks
                return self.on_host(node, args, arg_types)
        if self.xp is np:
            with np.errstate(all="ignore"):
                return self.storage(kernel([self.typed(a, t) for a, t in zip(args, arg_types)], attrs, None), node.type)
        if node.op in ON_HOST:
            return self.on_host(node, args, arg_types)
        wide = [self.widen_bf16(a) if t.dtype == DType.bf16 else (a.astype(bool) if t.dtype == DType.bool else a) for a, t in zip(args, arg_types)]
        if node.type.dtype == DType.bf16 and "dtype" in attrs:
            attrs["dtype"] = "f32"
        try:
            return self.storage(kernel(wide, attrs, None), node.type)
        except (TypeError, ValueError, NotImplementedError):  # NumPy API CuPy lacks (take's mode=, ...)
            return self.on_host(node, args, arg_types)

    def on_host(self, node: Node, args: list[Any], arg_types: list[TensorType]) -> Any:
        """The op table's NumPy kernel on host copies, the result sent back: the CPU
        backend's exact values (Philox bits), at the price of two copies."""
        host = [self.typed(np.asarray(a.get() if hasattr(a, "get") else a), t) for a, t in zip(args, arg_types)]
        with np.errstate(all="ignore"):
            result = op_def(node.op).numpy(host, dict(node.attrs), None)
        return self.storage(self.xp.asarray(self.to_storage_host(np.asarray(result), node.type)), node.type)

    def to_storage_host(self, value: np.ndarray, t: TensorType) -> np.ndarray:
        if t.dtype == DType.bf16:
            return c_order(np, value.astype(numpy_dtype(DType.bf16))).view(np.uint16)
        if t.dtype == DType.bool:
            return value.astype(np.uint8)
        return value

    def matmul(self, node: Node, a: Any, b: Any, types: dict[int, TensorType]) -> Any:
        """cuBLAS through the array module's matmul; bf16 operands accumulate in f32 and the
        product is rounded to bf16 once (the NumPy backend's bf16 matmul on the host)."""
        ta, tb = types[node.args[0]], types[node.args[1]]
        if self.xp is np:
            return self.storage(op_def("matmul").numpy([self.typed(a, ta), self.typed(b, tb)], dict(node.attrs), None), node.type)
        if ta.dtype == DType.bf16:
            out = bf16_gemm(self.xp, a, b, tuple(node.type.shape))
            if out is not None:
                return out
            return self.round_bf16(self.xp.matmul(self.widen_bf16(a), self.widen_bf16(b)))
        return self.xp.matmul(a, b)


class LoweredProgram:
    """A program lowered for the CUDA device, with its arena, ready to run many times; the
    same interface as the NumPy backend's CompiledProgram."""

    def __init__(self, program: Program, device: ArrayDevice) -> None:
        self.program = program
        self.device = device
        self.lowering = lower(program)
        self.arena = plan_arena(self.lowering)
        self.types = program.types()
        self.input_ids = {i.name: i.id for i in program.inputs}
        self.input_types = {i.name: i.type for i in program.inputs}
        xp = device.xp
        self.memory = xp.zeros(max(self.arena.size, 1), dtype=np.uint8)
        self.views: dict[int, Any] = {}
        for buf in self.arena.buffers:
            t = self.types[buf.value]
            itemsize = np.dtype(STORAGE[t.dtype]).itemsize
            count = buf.bytes // itemsize
            self.views[buf.value] = self.memory[buf.offset : buf.offset + buf.bytes].view(STORAGE[t.dtype])[:count].reshape(t.shape)
        self.kernels: dict[int, KernelSource] = {}
        for k, step in enumerate(self.lowering.steps):
            if isinstance(step, (FusedGroup, RowGroup, ReduceGroup, ScatterStep, RandomStep)):
                self.kernels[k] = kernel_for(step, program, self.lowering.constants)
        device.runner.prepare(list(self.kernels.values()))

    def run(self, feeds: dict[str, Any], keep: frozenset[str] = frozenset()) -> dict[str, Any]:
        """Run on FEEDS; the outputs named in KEEP stay on the device (views of the arena or
        of an input: valid until the next run), the others come back as host arrays."""
        device, types = self.device, self.types
        values: dict[int, Any] = {}
        for name, vid in self.input_ids.items():
            values[vid] = device.to_device(feeds[name], self.input_types[name])
        for k, step in enumerate(self.lowering.steps):
            if isinstance(step, (FusedGroup, RowGroup)):
                outs = [self.views[v] for v in step.outputs]
                device.runner.launch(self.kernels[k], [self.contiguous(values[v]) for v in step.inputs] + outs)
                values.update(zip(step.outputs, outs))
            elif isinstance(step, ReduceGroup):
                out = self.views[step.node.id]
                device.runner.launch(self.kernels[k], [self.contiguous(values[v]) for v in step.inputs] + [out])
                values[step.node.id] = out
            elif isinstance(step, RandomStep):
                out = self.views[step.node.id]
                device.runner.launch(self.kernels[k], [self.contiguous(values[step.node.args[0]]), out])
                values[step.node.id] = out
            elif isinstance(step, ScatterStep):
                values[step.node.id] = self.scatter(k, step.node, values)
            elif isinstance(step, ViewStep):
                values[step.node.id] = self.contiguous(values[step.node.args[0]]).reshape(step.node.type.shape)
            elif isinstance(step, GemmCall):
                a, b = values[step.a], values[step.b]
                a = a.swapaxes(-1, -2) if step.trans_a else a  # a view: the transpose flag
                b = b.swapaxes(-1, -2) if step.trans_b else b
                values[step.node.id] = self.place(step.node, device.matmul(step.node, a, b, types))
            else:
                assert isinstance(step, OpKernel)
                values[step.node.id] = self.place(step.node, device.op(step.node, [values[a] for a in step.node.args], types))
        return {name: values[vid] if name in keep else device.to_host(values[vid], types[vid]) for name, vid in self.program.outputs.items()}

    def scatter(self, k: int, node: Node, values: dict[int, Any]) -> Any:
        """Sort the positions by index (stable: equal indices keep their order), find each
        row's range, and let the kernel add the rows in that order."""
        xp = self.device.xp
        rows = node.type.shape[0]
        idx = xp.clip(values[node.args[1]].reshape(-1).astype(np.int64), 0, rows - 1)
        order = xp.ascontiguousarray(xp.argsort(idx, kind="stable").astype(np.int64))
        starts = xp.ascontiguousarray(xp.searchsorted(idx[order], xp.arange(rows + 1, dtype=np.int64)).astype(np.int64))
        out = self.views[node.id]
        self.device.runner.launch(self.kernels[k], [self.contiguous(values[node.args[0]]), order, starts, out])
        return out

    def place(self, node: Node, result: Any) -> Any:
        out = self.views[node.id]
        out[...] = result
        return out

    def contiguous(self, value: Any) -> Any:
        return c_order(self.device.xp, value)

    def run_copy(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        return {k: np.array(v, copy=True) for k, v in self.run(feeds).items()}


class DeviceBackend:
    """The loop's backend on a device: programs lowered for it, parameters, optimizer state and
    gradients resident in its memory between programs (see runtime/backend.py)."""

    def __init__(self, device: ArrayDevice) -> None:
        self.device = device

    def program(self, program: Program) -> LoweredProgram:
        return LoweredProgram(program, self.device)

    def put(self, host: np.ndarray, t: TensorType) -> Any:
        return self.device.xp.array(self.device.to_device(host, t), copy=True)

    def get(self, value: Any, t: TensorType) -> np.ndarray:
        return np.array(self.device.to_host(value, t), copy=True)

    def add(self, total: Optional[Any], value: Any, t: TensorType) -> Any:
        if stored_as_bits(t):  # bf16 and bool: their bits, summed on the host
            host = HostBackend().add(None if total is None else self.get(total, t), self.get(value, t), t)
            return self.put(host, t)
        if total is None:
            return self.device.xp.array(value, copy=True)
        total += value
        return total

    def scaled(self, total: Any, factor: float, t: TensorType) -> Any:
        if stored_as_bits(t):
            return self.put(HostBackend().scaled(self.get(total, t), factor, t), t)
        return (total * total.dtype.type(factor)).astype(total.dtype)


CUDA_R_16BF = 14  # cudaDataType: bf16
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1
CUBLAS_OP_N = 0


def bf16_gemm(cupy: Any, a: Any, b: Any, shape: tuple[int, ...]) -> Any:
    """bf16 x bf16 -> bf16 with f32 accumulation through cuBLAS (cublasGemmEx, or
    cublasGemmStridedBatchedEx for equal batch shapes), on row-major operands given as their
    16-bit storage. None when the shapes need broadcasting the batched call cannot express
    (the caller widens to f32 instead)."""
    from cupy.cuda import cublas, device

    a, b = cupy.ascontiguousarray(a), cupy.ascontiguousarray(b)
    k, n = b.shape[-2], b.shape[-1]
    m = a.shape[-2] if a.ndim >= 2 else 1
    out = cupy.empty(shape, dtype=np.uint16)
    one, zero = np.ones(1, dtype=np.float32), np.zeros(1, dtype=np.float32)
    handle = device.get_cublas_handle()
    mode = cublas.getPointerMode(handle)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)  # alpha and beta live on the host
    try:
        return _bf16_gemm_calls(cupy, cublas, handle, a, b, out, m, n, k, one, zero)
    finally:
        cublas.setPointerMode(handle, mode)


def _bf16_gemm_calls(cupy: Any, cublas: Any, handle: int, a: Any, b: Any, out: Any, m: int, n: int, k: int, one: np.ndarray, zero: np.ndarray) -> Any:
    # row-major C = A @ B is column-major C^T = B^T @ A^T: swap the operands, no transposes
    if b.ndim == 2 and a.ndim >= 2:
        rows = int(np.prod(a.shape[:-1]))
        cublas.gemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, rows, k, one.ctypes.data, b.data.ptr, CUDA_R_16BF, n,
                      a.data.ptr, CUDA_R_16BF, k, zero.ctypes.data, out.data.ptr, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
        return out
    if a.ndim == b.ndim and a.shape[:-2] == b.shape[:-2] and a.ndim > 2:
        batch = int(np.prod(a.shape[:-2]))
        cublas.gemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, one.ctypes.data, b.data.ptr, CUDA_R_16BF, n, k * n,
                                    a.data.ptr, CUDA_R_16BF, k, m * k, zero.ctypes.data, out.data.ptr, CUDA_R_16BF, n, m * n,
                                    batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
        return out
    return None

