"""The CUDA dialect: what the lowering's kernels (runtime/lower/, written over the dialect's
names, `codegen.DIALECT_NAMES`) mean on a GPU, and the source NVRTC compiles.

A kernel's lanes are a block's threads (`SX_LANE` is threadIdx.x of `SX_LANES`, blockDim.x)
and its groups the grid's blocks (`SX_GROUP`, blockIdx.x of `SX_GROUPS`, gridDim.x); what a
group shares is `__shared__` memory and its barriers are `__syncwarp` and `__syncthreads`.
The bit casts, the high product and the one-rounding add and multiply are the device's
intrinsics. The launch (blocks for a kernel's items) is `device.grid_size`.

The indexing names are defined outside the `__CUDACC__` branch: the host emulation of the
CUDA kernels (tests/cuda_host.py) compiles the same source as C++ with `blockIdx` and
`threadIdx` set by its own loops, so it runs this dialect's indexing, not a copy of it.
"""

from __future__ import annotations

from typing import Iterable

from ..lower.codegen import PRELUDE, KernelSource

INDEXING = r"""
#define SX_KERNEL extern "C" __global__ void
#define SX_LANE threadIdx.x
#define SX_LANES blockDim.x
#define SX_GROUP blockIdx.x
#define SX_GROUPS gridDim.x
"""

DEVICE = r"""
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define SX_COOPERATIVE extern "C" __global__ void
#define SX_SHARED __shared__
#define SX_SYNC_WARP __syncwarp()
#define SX_SYNC_BLOCK __syncthreads()
#define SX_FN __device__ __forceinline__
#define SX_TABLE __device__ const
SX_FN float sx_bits_float(unsigned int b) { return __uint_as_float(b); }
SX_FN unsigned int sx_float_bits(float f) { return __float_as_uint(f); }
SX_FN unsigned int sx_mulhi(unsigned int a, unsigned int b) { return __umulhi(a, b); }
SX_FN float sx_fadd(float a, float b) { return __fadd_rn(a, b); }
SX_FN float sx_fmul(float a, float b) { return __fmul_rn(a, b); }
#define SX_UNORDERED(a, b) ((a) != (a) || (b) != (b))
#endif
"""

CUDA_PRELUDE = INDEXING + DEVICE + PRELUDE  # what every unit of CUDA kernels starts with


def cuda_source(kernels: Iterable[KernelSource]) -> str:
    """One compilation unit of KERNELS for the GPU."""
    return CUDA_PRELUDE + "".join(k.source for k in kernels)
