"""Host emulation of generated CUDA kernels: each kernel is compiled as C++ with a thin shim
(`__global__` gone, `blockIdx`/`threadIdx` set by plain loops over the grid and the block and
read through the CUDA dialect's own indexing (runtime/cuda/dialect.py), bf16
as its 16 bits with the same conversions the kernel uses) and run on NumPy arrays through
ctypes. The code generator is then tested on every op and fusion pattern without a GPU.

Kernels whose lanes cooperate (a warp or a block per item, through shared memory and
`__syncwarp`/`__syncthreads`) are compiled as C++20 coroutines, one per CUDA thread: a block
at a time, every lane runs to its next barrier, then the next round starts; the rounds go
through the lanes forward and backward in turn, so a value one lane writes and another reads
between two barriers (a race on the GPU) is seen written too early in one of the orders and
fails the comparison. After each round a warp's (or a block's) lanes must all be waiting or
all be done: lanes that reach different numbers of barriers (a hang on the GPU) fail the run.
Shared memory is a static array of the kernel.

"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from sexpgpu.ir.dtypes import DType
from sexpgpu.runtime.lower.blas import CUBLAS_OP_N, BlasCall
from sexpgpu.runtime.cpu.hostc import HOST_ARITHMETIC
from sexpgpu.runtime.cuda.dialect import INDEXING
from sexpgpu.runtime.lower.codegen import PRELUDE, KernelSource, c_types

SHIM = r"""
#include <cmath>
#include <coroutine>
#include <cstring>
#include <exception>
#include <vector>
struct sx_dim3 { unsigned int x, y, z; };
static sx_dim3 blockIdx, threadIdx, blockDim, gridDim;
#define __global__
struct sx_lane {
  struct promise_type {
    sx_lane get_return_object() { return sx_lane{std::coroutine_handle<promise_type>::from_promise(*this)}; }
    std::suspend_always initial_suspend() noexcept { return {}; }
    std::suspend_always final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
  std::coroutine_handle<promise_type> handle;
};
#define SX_COOPERATIVE sx_lane
#define SX_SHARED static
#define SX_TABLE static const
#define SX_SYNC_WARP co_await std::suspend_always{}
#define SX_SYNC_BLOCK co_await std::suspend_always{}
static inline float sx_bits_float(unsigned int b) { float f; std::memcpy(&f, &b, 4); return f; }
static inline unsigned int sx_float_bits(float f) { unsigned int b; std::memcpy(&b, &f, 4); return b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
"""

CACHE = Path(tempfile.gettempdir()) / "sexpgpu-host-kernels"


def launcher(kernel: KernelSource) -> str:
    casts = []
    for k, p in enumerate(kernel.params):
        store, _ = c_types(p.dtype)
        qualifier = "const " if p.role == "in" else ""
        casts.append(f"({qualifier}{store}*)args[{k}]")
    call = f"{kernel.name}({', '.join(casts + ['n'])});" if not kernel.table else f"{kernel.name}((void* const*)args, n);"  # the device's pointer array
    if kernel.lanes != "thread":  # cooperating lanes: a coroutine per CUDA thread, a block at a time
        return (
            f'extern "C" int launch_{kernel.name}(void** args, long long n, unsigned int grid, unsigned int block) {{\n'
            "  gridDim.x = grid; blockDim.x = block; gridDim.y = gridDim.z = blockDim.y = blockDim.z = 1;\n"
            f"  const unsigned int group = {32 if kernel.lanes == 'warp' else 0} ? {32 if kernel.lanes == 'warp' else 0} : block;  // lanes that meet at each barrier\n"
            "  int mismatched = 0;\n"
            "  for (unsigned int b = 0; b < grid; ++b) {\n"
            "    blockIdx.x = b; blockIdx.y = blockIdx.z = threadIdx.y = threadIdx.z = 0;\n"
            "    std::vector<sx_lane> lanes;\n"
            f"    for (unsigned int t = 0; t < block; ++t) lanes.push_back({call.rstrip(';')});\n"
            "    bool running = true;\n"
            "    for (unsigned int round = 0; running; ++round) {\n"
            "      running = false;\n"
            "      for (unsigned int k = 0; k < block; ++k) {\n"
            "        const unsigned int t = round % 2 ? block - 1 - k : k;\n"
            "        if (lanes[t].handle.done()) continue;\n"
            "        threadIdx.x = t;\n"
            "        lanes[t].handle.resume();\n"
            "        running = running || !lanes[t].handle.done();\n"
            "      }\n"
            "      // a group's lanes are all at the same barrier or all done: some done and some\n"
            "      // waiting means they reached different numbers of barriers (a hang on the GPU)\n"
            "      for (unsigned int g = 0; g < block; g += group) {\n"
            "        int done = 0;\n"
            "        for (unsigned int t = g; t < g + group && t < block; ++t) done += lanes[t].handle.done() ? 1 : 0;\n"
            "        if (done != 0 && done != (int)(g + group < block ? group : block - g)) mismatched = 1;\n"
            "      }\n"
            "    }\n"
            "    for (sx_lane& lane : lanes) lane.handle.destroy();\n"
            "  }\n  return mismatched;\n}\n"
        )
    return (
        f'extern "C" int launch_{kernel.name}(void** args, long long n, unsigned int grid, unsigned int block) {{\n'
        "  gridDim.x = grid; blockDim.x = block; gridDim.y = gridDim.z = blockDim.y = blockDim.z = 1;\n"
        "  for (unsigned int b = 0; b < grid; ++b) { for (unsigned int t = 0; t < block; ++t) {\n"
        f"    blockIdx.x = b; threadIdx.x = t; {call}\n"
        "  } }\n  return 0;\n}\n"
    )


class HostModule:
    """Many kernels compiled as one C++ library (one g++ call), each run by its name."""

    def __init__(self, kernels: list[KernelSource]) -> None:
        unique = {k.name: k for k in kernels}
        self.kernels = unique
        source = SHIM + INDEXING + HOST_ARITHMETIC + PRELUDE + "".join(k.source + launcher(k) for k in unique.values())
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        CACHE.mkdir(parents=True, exist_ok=True)
        lib = CACHE / f"{digest}.so"
        if not lib.exists():
            cpp = CACHE / f"{digest}.cpp"
            cpp.write_text(source)
            tmp = CACHE / f"{digest}.{os.getpid()}.so"
            done = subprocess.run(["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-o", str(tmp), str(cpp)], capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"a kernel does not compile as C++:\n{done.stderr[-4000:]}")
            tmp.rename(lib)
        self.lib = ctypes.CDLL(str(lib))

    def run(self, kernel: KernelSource, inputs: list[np.ndarray], grid: int = 3, block: int = 32) -> list[np.ndarray]:
        """Run KERNEL on INPUTS (in the order of its input params); returns its outputs.
        BLOCK is a multiple of 32 (a warp) and a power of two (the lanes' tree)."""
        fn = getattr(self.lib, f"launch_{kernel.name}")
        fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_longlong, ctypes.c_uint, ctypes.c_uint]
        fn.restype = ctypes.c_int
        ins = [p for p in kernel.params if p.role == "in"]
        outs = [p for p in kernel.params if p.role == "out"]
        assert len(inputs) == len(ins)
        buffers = [np.ascontiguousarray(storage(np.asarray(x), p.dtype.value)) for p, x in zip(ins, inputs)]
        results = [np.zeros(p.shape, dtype=storage_dtype(p.dtype.value)) for p in outs]
        buffers += results
        pointers = (ctypes.c_void_p * len(buffers))(*[b.ctypes.data for b in buffers])
        block = kernel.threads or block
        assert fn(pointers, kernel.size, grid, block) == 0, f"{kernel.name}: the lanes of a {kernel.lanes} reached different numbers of barriers"
        return [from_storage(r, p.dtype.value) for r, p in zip(results, outs)]


def storage_dtype(dtype: str) -> np.dtype:
    return np.dtype({"f32": np.float32, "bf16": np.uint16, "i32": np.int32, "i64": np.int64, "bool": np.uint8, "f64": np.float64}[dtype])


def storage(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16":
        return x.view(np.uint16)
    if dtype == "bool":
        return x.astype(np.uint8)
    return x


def from_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16":
        import ml_dtypes

        return x.view(ml_dtypes.bfloat16)
    if dtype == "bool":
        return x.astype(bool)
    return x


class HostRunner:
    """The executor's kernel runner on the host: kernels compiled by g++ with the shim (one
    library per prepare call, like one RawModule per program on the device)."""

    def __init__(self) -> None:
        self.modules: dict[str, HostModule] = {}

    def prepare(self, kernels: list[KernelSource]) -> None:
        new = [k for k in kernels if k.name not in self.modules]
        if new:
            module = HostModule(new)
            for k in new:
                self.modules[k.name] = module

    def launch(self, kernel: KernelSource, arrays: list[np.ndarray]) -> None:
        fn = getattr(self.modules[kernel.name].lib, f"launch_{kernel.name}")
        fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_longlong, ctypes.c_uint, ctypes.c_uint]
        fn.restype = ctypes.c_int
        for a in arrays:
            assert a.flags.c_contiguous, kernel.name
        pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        assert fn(pointers, kernel.size, 2, kernel.threads or 64) == 0, f"{kernel.name}: the lanes of a {kernel.lanes} reached different numbers of barriers"

    def gemm(self, call: BlasCall, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
        cublas_gemm(call, a, b, c)


def column_major(flat: np.ndarray, offset: int, rows: int, cols: int, ld: int) -> np.ndarray:
    """The rows x cols matrix whose element (i, j) is flat[offset + i + j * ld] (cuBLAS's
    layout), as a view; the call must stay inside the buffer."""
    assert ld >= max(1, rows), f"ld {ld} < {rows} rows"
    assert offset >= 0 and offset + (rows - 1) + (cols - 1) * ld < flat.size, f"a {rows}x{cols} matrix (ld {ld}) at {offset} leaves a buffer of {flat.size}"
    return np.lib.stride_tricks.as_strided(flat[offset:], shape=(rows, cols), strides=(flat.itemsize, ld * flat.itemsize))


def widened(x: np.ndarray, dtype: DType) -> np.ndarray:
    return (x.astype(np.uint32) << 16).view(np.float32) if dtype == DType.bf16 else x.astype(np.float32)


def cublas_gemm(call: BlasCall, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    """What cuBLAS's documentation says gemm(op_a, op_b, m, n, k, A, lda, B, ldb, C, ldc)
    computes, strided over the batch: C (m x n, column-major) = op(A) op(B), in f32 from the
    operands' storage (bf16 as its bits), stored once in C's dtype."""
    for x in (a, b, c):
        assert x.flags.c_contiguous
    a, b, c = a.reshape(-1), b.reshape(-1), c.reshape(-1)
    for i in range(call.batch):
        shape_a = (call.m, call.k) if call.op_a == CUBLAS_OP_N else (call.k, call.m)
        shape_b = (call.k, call.n) if call.op_b == CUBLAS_OP_N else (call.n, call.k)
        first = column_major(a, call.a.offset + i * call.a.stride, *shape_a, call.a.ld)
        second = column_major(b, call.b.offset + i * call.b.stride, *shape_b, call.b.ld)
        out = column_major(c, call.c.offset + i * call.c.stride, call.m, call.n, call.c.ld)
        op_a = widened(first, call.in_dtype) if call.op_a == CUBLAS_OP_N else widened(first, call.in_dtype).T
        op_b = widened(second, call.in_dtype) if call.op_b == CUBLAS_OP_N else widened(second, call.in_dtype).T
        product = np.matmul(np.ascontiguousarray(op_a), np.ascontiguousarray(op_b))
        if call.out_dtype == DType.bf16:
            import ml_dtypes

            out[...] = product.astype(ml_dtypes.bfloat16).view(np.uint16)
        else:
            out[...] = product
