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
from pydantic import BaseModel

from ...ir.dtypes import DType, numpy_dtype
from ...ir.graph import Node, Program, TensorType
from ...ir.ops import OpKind, op_def
from ..backend import HostBackend
from .codegen import KernelSource
from .fusion import lower
from .kernels import kernels_for
from .plan import plan_arena, scratch_value

STORAGE = {DType.f32: np.float32, DType.bf16: np.uint16, DType.i32: np.int32, DType.i64: np.int64, DType.bool: np.uint8, DType.f64: np.float64}


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
        widened to f32 and rounded back on a device without a bf16 array type. A random op
        runs the CPU backend's kernel on the host: its bits (Philox keyed by seed, step and
        op) must be the CPU's, bit for bit."""
        definition = op_def(node.op)
        kernel = definition.numpy
        attrs = dict(node.attrs)
        arg_types = [types[a] for a in node.args]
        if definition.moves_elements:
            try:
                return kernel(args, attrs, None)
            except (TypeError, ValueError, NotImplementedError):  # NumPy API CuPy lacks
                return self.on_host(node, args, arg_types)
        if self.xp is np:
            with np.errstate(all="ignore"):
                return self.storage(kernel([self.typed(a, t) for a, t in zip(args, arg_types)], attrs, None), node.type)
        if definition.kind is OpKind.RANDOM:
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

    def matmul(self, node: Node, a: Any, b: Any, types: dict[int, TensorType], out: Any, trans_a: bool = False, trans_b: bool = False) -> Any:
        """OUT = A @ B through cuBLAS, written straight into OUT (the product's arena buffer,
        in storage dtype): bf16 operands accumulate in f32 and the product is rounded to
        bf16 once (the NumPy backend's bf16 matmul on the host). An operand whose flag is
        set is given as its transpose (of the last two axes)."""
        ta, tb = types[node.args[0]], types[node.args[1]]
        if ta.dtype == DType.bf16 and self.xp is not np and bf16_gemm(self.xp, a, b, out, trans_a, trans_b):
            return out
        a = a.swapaxes(-1, -2) if trans_a else a  # a view: CuPy's matmul passes cuBLAS the flag
        b = b.swapaxes(-1, -2) if trans_b else b
        if self.xp is np:
            op_def("matmul").numpy([self.typed(a, ta), self.typed(b, tb)], dict(node.attrs), self.typed(out, node.type))
        elif ta.dtype == DType.bf16:  # a broadcast batch: widened to f32, rounded once
            out[...] = self.round_bf16(self.xp.matmul(self.widen_bf16(a), self.widen_bf16(b)))
        else:
            self.xp.matmul(a, b, out=out)
        return out


class LoweredProgram:
    """A program lowered for the CUDA device, with its arena, ready to run many times; the
    same interface as the NumPy backend's CompiledProgram."""

    def __init__(self, program: Program, device: ArrayDevice) -> None:
        self.device = device
        self.lowering = lower(program)
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
            # a value's buffer, or a split reduction's partial results (f64)
            t = self.types[buf.value] if buf.value >= 0 else TensorType(dtype=DType.f64, shape=(buf.bytes // 8,))
            itemsize = np.dtype(STORAGE[t.dtype]).itemsize
            count = buf.bytes // itemsize
            self.views[buf.value] = self.memory[buf.offset : buf.offset + buf.bytes].view(STORAGE[t.dtype])[:count].reshape(t.shape)
        self.kernels = [kernels_for(step, program, self.lowering.constants) for step in self.lowering.steps]
        device.runner.prepare([kernel for kernels in self.kernels for kernel in kernels])

    def run(self, feeds: dict[str, Any], keep: frozenset[str] = frozenset()) -> dict[str, Any]:
        """Run on FEEDS; the outputs named in KEEP stay on the device (views of the arena or
        of an input: valid until the next run), the others come back as host arrays."""
        device, types = self.device, self.types
        values: dict[int, Any] = {}
        for name, vid in self.input_ids.items():
            values[vid] = device.to_device(feeds[name], self.input_types[name])
        run = ProgramRun(self, values)
        for k, step in enumerate(self.lowering.steps):
            run.step = k
            step.launch(run, self.kernels[k])
        return {name: values[vid] if name in keep else device.to_host(values[vid], types[vid]) for name, vid in self.outputs.items()}

    def run_copy(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        return {k: np.array(v, copy=True) for k, v in self.run(feeds).items()}


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

    def scratch(self) -> Any:
        return self.lowered.views[scratch_value(self.step)]

    def set(self, vid: int, value: Any) -> None:
        self.values[vid] = value

    def launch(self, kernel: KernelSource, arrays: list[Any]) -> None:
        self.device.runner.launch(kernel, arrays)

    def matmul(self, node: Node, a: Any, b: Any, out: Any, trans_a: bool, trans_b: bool) -> Any:
        return self.device.matmul(node, a, b, self.lowered.types, out, trans_a, trans_b)

    def array_op(self, node: Node) -> Any:
        return self.device.op(node, [self.values[a] for a in node.args], self.lowered.types)


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
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1


class GemmArguments(BaseModel, frozen=True):
    """One cuBLAS call for a row-major C = op(A) @ op(B), in cuBLAS's column-major terms:
    row-major C (m x n) is column-major C^T, and C^T = op(B)^T op(A)^T, so the call takes B
    first. An operand given transposed (stored as its transpose, contiguous) flips its op."""

    op_b: int  # applied to the first (B's) matrix
    op_a: int
    rows: int  # of column-major C^T: n
    cols: int  # m (all of a 2-D call's rows of A when B is a plain matrix)
    depth: int  # k
    ldb: int
    lda: int
    ldc: int
    stride_b: int
    stride_a: int
    stride_c: int
    batch: int  # 1: cublasGemmEx; more: cublasGemmStridedBatchedEx


def gemm_arguments(a_shape: tuple[int, ...], b_shape: tuple[int, ...], trans_a: bool, trans_b: bool) -> Optional[GemmArguments]:
    """The call computing A @ B from the stored (contiguous) operands of shapes A_SHAPE and
    B_SHAPE, each the transpose of the operand when its flag is set; None when the batch
    shapes differ (broadcasting the strided call cannot express)."""
    k, m = (a_shape[-2], a_shape[-1]) if trans_a else (a_shape[-1], a_shape[-2] if len(a_shape) >= 2 else 1)
    n = b_shape[-2] if trans_b else b_shape[-1]
    ldb = k if trans_b else n
    op_b = CUBLAS_OP_T if trans_b else CUBLAS_OP_N
    op_a = CUBLAS_OP_T if trans_a else CUBLAS_OP_N
    if len(b_shape) == 2 and len(a_shape) >= 2 and not trans_a:
        rows = int(np.prod(a_shape[:-1]))  # every leading axis of A is a row of one gemm
        return GemmArguments(op_b=op_b, op_a=op_a, rows=n, cols=rows, depth=k, ldb=ldb, lda=k, ldc=n, stride_b=0, stride_a=0, stride_c=0, batch=1)
    if len(a_shape) == len(b_shape) and a_shape[:-2] == b_shape[:-2] and len(a_shape) >= 2:
        batch = int(np.prod(a_shape[:-2], dtype=np.int64))
        return GemmArguments(op_b=op_b, op_a=op_a, rows=n, cols=m, depth=k, ldb=ldb, lda=m if trans_a else k, ldc=n,
                             stride_b=k * n, stride_a=m * k, stride_c=m * n, batch=batch)
    return None


def bf16_gemm(cupy: Any, a: Any, b: Any, out: Any, trans_a: bool = False, trans_b: bool = False) -> bool:
    """OUT = A @ B, bf16 x bf16 -> bf16 with f32 accumulation through cuBLAS (cublasGemmEx,
    or cublasGemmStridedBatchedEx for equal batch shapes), on row-major operands given as
    their 16-bit storage, each stored transposed when its flag says so (cuBLAS's transpose
    flag: no copy), written into OUT (contiguous uint16). False when the shapes need
    broadcasting (the caller widens to f32 instead)."""
    from cupy.cuda import cublas, device

    call = gemm_arguments(tuple(a.shape), tuple(b.shape), trans_a, trans_b)
    if call is None:
        return False
    a, b = c_order(cupy, a), c_order(cupy, b)
    assert out.flags.c_contiguous and out.dtype == np.uint16
    one, zero = np.ones(1, dtype=np.float32), np.zeros(1, dtype=np.float32)
    handle = device.get_cublas_handle()
    mode = cublas.getPointerMode(handle)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)  # alpha and beta live on the host
    try:
        if call.batch == 1:
            cublas.gemmEx(handle, call.op_b, call.op_a, call.rows, call.cols, call.depth, one.ctypes.data, b.data.ptr, CUDA_R_16BF, call.ldb,
                          a.data.ptr, CUDA_R_16BF, call.lda, zero.ctypes.data, out.data.ptr, CUDA_R_16BF, call.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
        else:
            cublas.gemmStridedBatchedEx(handle, call.op_b, call.op_a, call.rows, call.cols, call.depth, one.ctypes.data,
                                        b.data.ptr, CUDA_R_16BF, call.ldb, call.stride_b, a.data.ptr, CUDA_R_16BF, call.lda, call.stride_a,
                                        zero.ctypes.data, out.data.ptr, CUDA_R_16BF, call.ldc, call.stride_c, call.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
    finally:
        cublas.setPointerMode(handle, mode)
    return True
