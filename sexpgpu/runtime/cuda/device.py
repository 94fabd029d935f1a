"""The CUDA device through CuPy: generated kernels loaded from their precompiled cubins
(cubins.py; built for this GPU's architecture without a GPU by `bench/gpu_ready.py`), the
others compiled with NVRTC (`cupy.RawModule`, one module per program, cached by source hash), cuBLAS calls (blas.py's, through CuPy's cuBLAS
bindings on its handle and the current stream), the arena as one device allocation.
`--device cuda|cuda:N|auto`.

CuPy compiles with `-ftz=true`: denormals flush to zero on the device (the CPU keeps them).
"""

from __future__ import annotations

import hashlib
from typing import Any, Union

import numpy as np

from ..backend import DeviceError
from ..diskcache import point_cupy_cache
from ..lower.blas import CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT, CUDA_TYPES, BlasCall
from ..lower.codegen import BLOCK, KernelSource
from ..lower.executor import ArrayDevice
from .cubins import COMPILE_OPTIONS, lookup, unit_source


class CupyRunner:
    """Compiles a program's kernels into one RawModule and launches them."""

    def __init__(self, cupy: Any) -> None:
        self.cupy = cupy
        self.modules: dict[str, Any] = {}  # source hash or cubin path -> RawModule (this device's cache)
        self.functions: dict[str, Any] = {}
        self.tables: dict[str, tuple[tuple[int, ...], Any]] = {}  # kernel -> its pointers and their device array
        self.max_grid = 65535 * 32

    def prepare(self, kernels: list[KernelSource]) -> None:
        unique = {k.name: k for k in kernels if k.name not in self.functions}
        if not unique:
            return
        arch = str(self.cupy.cuda.Device().compute_capability)
        missing = []
        for name, kernel in unique.items():
            cubin = lookup(kernel, arch)
            if cubin is None:
                missing.append(kernel)
                continue
            module = self.modules.get(str(cubin))
            if module is None:  # a unit holds several kernels: loaded once
                module = self.modules[str(cubin)] = self.cupy.RawModule(path=str(cubin))
            self.functions[name] = module.get_function(name)
        if not missing:
            return
        source = unit_source(missing)
        digest = hashlib.sha256(source.encode()).hexdigest()
        module = self.modules.get(digest)
        if module is None:
            module = self.cupy.RawModule(code=source, options=COMPILE_OPTIONS)  # CuPy adds -ftz=true itself
            self.modules[digest] = module
        for kernel in missing:
            self.functions[kernel.name] = module.get_function(kernel.name)

    def launch(self, kernel: KernelSource, arrays: list[Any]) -> None:
        block = kernel.threads or BLOCK
        args = (self.table(kernel, arrays),) if kernel.table else tuple(arrays)
        self.functions[kernel.name]((grid_size(kernel, block, self.max_grid),), (block,), (*args, np.int64(kernel.size)))

    def table(self, kernel: KernelSource, arrays: list[Any]) -> Any:
        """ARRAYS' pointers in device memory, for a kernel with more than the parameter space
        holds; kept per kernel while they stay the same (the arena's buffers do)."""
        pointers = tuple(int(a.data.ptr) for a in arrays)
        known = self.tables.get(kernel.name)
        if known is None or known[0] != pointers:
            known = (pointers, self.cupy.asarray(np.asarray(pointers, dtype=np.uint64)))
            self.tables[kernel.name] = known
        return known[1]

    def gemm(self, call: BlasCall, a: Any, b: Any, c: Any) -> None:
        """CALL through cublasGemmEx or cublasGemmStridedBatchedEx on the current stream,
        alpha and beta given from the host."""
        from cupy.cuda import cublas, device

        def at(array: Any, offset: int) -> int:
            return int(array.data.ptr) + offset * array.dtype.itemsize

        one, zero = np.ones(1, dtype=np.float32), np.zeros(1, dtype=np.float32)
        handle = device.get_cublas_handle()
        cublas.setStream(handle, self.cupy.cuda.get_current_stream().ptr)
        mode = cublas.getPointerMode(handle)
        cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
        ab, out = CUDA_TYPES[call.in_dtype], CUDA_TYPES[call.out_dtype]
        try:
            if call.batch == 1:
                cublas.gemmEx(handle, call.op_a, call.op_b, call.m, call.n, call.k, one.ctypes.data, at(a, call.a.offset), ab, call.a.ld,
                              at(b, call.b.offset), ab, call.b.ld, zero.ctypes.data, at(c, call.c.offset), out, call.c.ld,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
            else:
                cublas.gemmStridedBatchedEx(handle, call.op_a, call.op_b, call.m, call.n, call.k, one.ctypes.data,
                                            at(a, call.a.offset), ab, call.a.ld, call.a.stride, at(b, call.b.offset), ab, call.b.ld, call.b.stride,
                                            zero.ctypes.data, at(c, call.c.offset), out, call.c.ld, call.c.stride, call.batch,
                                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
        finally:
            cublas.setPointerMode(handle, mode)


def grid_size(kernel: KernelSource, block: int, most: int) -> int:
    """Blocks for KERNEL's items: a thread, a warp or a block each (grid-stride loops cover
    what MOST blocks do not)."""
    per_block = {"thread": block, "warp": block // 32, "block": 1, "tile": 1}[kernel.lanes]
    return max(1, min(most, -(-kernel.size // per_block)))


def cuda_device(spec: str) -> ArrayDevice:
    """The device named by SPEC (`cuda`, `cuda:N`), or DeviceError saying why not."""
    try:
        import cupy
    except ImportError:
        raise DeviceError("--device cuda needs CuPy: pip install -e '.[cuda]' (on a machine with an NVIDIA GPU and driver)") from None
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # no driver, or no device
        raise DeviceError(f"CuPy sees no CUDA device ({type(exc).__name__}: {exc}); use --device cpu") from None
    index = int(spec.split(":", 1)[1]) if ":" in spec else 0
    if not 0 <= index < count:
        raise DeviceError(f"--device {spec}: this machine has {count} CUDA device(s) (cuda:0 to cuda:{count - 1})")
    cupy.cuda.Device(index).use()
    point_cupy_cache()  # CuPy's compiled modules go under $SEXPGPU_CACHE/cupy, checked (diskcache.py)
    return ArrayDevice(cupy, CupyRunner(cupy))


def describe(spec: str) -> Union[str, dict[str, Any]]:
    """What run.json records for `--device SPEC`: for a GPU its index, name, memory and the
    CUDA and CuPy versions (the numbers a result depends on); `cpu` stays a word."""
    if spec == "cpu":
        return spec
    try:
        import cupy

        index = int(spec.split(":", 1)[1]) if ":" in spec else 0
        props = cupy.cuda.runtime.getDeviceProperties(index)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return {"device": f"cuda:{index}", "name": name, "memory_bytes": int(props["totalGlobalMem"]),
                "compute_capability": f"{props['major']}.{props['minor']}", "cuda_runtime": int(cupy.cuda.runtime.runtimeGetVersion()),
                "cupy": cupy.__version__}
    except Exception:  # no CuPy or no such device: the run itself says why; the header keeps the word
        return spec


def free_device_memory() -> int:
    import cupy

    free, _total = cupy.cuda.runtime.memGetInfo()
    return int(free)
