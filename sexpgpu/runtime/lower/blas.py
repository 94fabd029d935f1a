"""cuBLAS calls, worked out from shapes when a program is lowered.

A `BlasCall` is one cuBLAS gemm in cuBLAS's own column-major terms: C = op(A) op(B) over a
batch of matrices at fixed strides (cublasGemmEx for one, cublasGemmStridedBatchedEx for
more), f32 or bf16 operands, the product accumulated in f32 (CUBLAS_COMPUTE_32F) and stored
once in the result's dtype. The device's runner passes it to cuBLAS as it is; the host
emulation (tests/cuda_host.py) computes what cuBLAS's documentation says the call computes,
so every call a program makes is checked on the CPU.

SexpGPU's tensors are row-major. A row-major C (m x n) is the column-major C^T, and
C^T = op(B)^T op(A)^T, so a row-major product is the call with the operands swapped
(`row_major`); an operand stored transposed flips its op (cuBLAS's transpose flag: no copy).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from ...ir.dtypes import DType

CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUDA_R_32F, CUDA_R_16BF = 0, 14  # cudaDataType
CUDA_TYPES = {DType.f32: CUDA_R_32F, DType.bf16: CUDA_R_16BF}
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1


class Operand(BaseModel, frozen=True):
    """A column-major matrix in a flat buffer: element (i, j) of batch item b is at
    offset + b * stride + i + j * ld (in elements)."""

    offset: int = 0
    ld: int
    stride: int = 0


class BlasCall(BaseModel, frozen=True):
    """C = op(A) op(B): A's op is m x k, B's k x n, C m x n (alpha 1, beta 0)."""

    op_a: int
    op_b: int
    m: int
    n: int
    k: int
    a: Operand
    b: Operand
    c: Operand
    batch: int = 1
    in_dtype: DType  # A's and B's storage
    out_dtype: DType  # C's

    @property
    def name(self) -> str:
        return "cublasGemmEx" if self.batch == 1 else "cublasGemmStridedBatchedEx"

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k


@dataclass(frozen=True)
class Rows:
    """A row-major matrix in a flat buffer: element (r, c) of batch item b is at
    offset + b * stride + r * ld + c."""

    ld: int
    offset: int = 0
    stride: int = 0


def row_major(m: int, n: int, k: int, a: Rows, b: Rows, c: Rows, trans_a: bool, trans_b: bool, batch: int, in_dtype: DType,
              out_dtype: DType) -> BlasCall:
    """The call for row-major C (m x n) = op(A) @ op(B), where A is stored m x k (k x m when
    TRANS_A) and B k x n (n x k when TRANS_B). cuBLAS's A is then our B (the caller passes
    the buffers in that order: `gemm(call, b, a, c)`)."""
    return BlasCall(op_a=CUBLAS_OP_T if trans_b else CUBLAS_OP_N, op_b=CUBLAS_OP_T if trans_a else CUBLAS_OP_N, m=n, n=m, k=k,
                    a=Operand(offset=b.offset, ld=b.ld, stride=b.stride), b=Operand(offset=a.offset, ld=a.ld, stride=a.stride),
                    c=Operand(offset=c.offset, ld=c.ld, stride=c.stride), batch=batch, in_dtype=in_dtype, out_dtype=out_dtype)


def _product(dims: tuple[int, ...]) -> int:
    size = 1
    for d in dims:
        size *= d
    return size


def matmul_calls(a_shape: tuple[int, ...], b_shape: tuple[int, ...], out_shape: tuple[int, ...], trans_a: bool, trans_b: bool,
                 dtype: DType) -> list[BlasCall]:
    """The calls computing OUT = A @ B from the stored (C-order) operands of shapes A_SHAPE
    and B_SHAPE, each the transpose (of its last two axes) of the operand when its flag is
    set. A plain matrix B takes every leading axis of A as rows of one gemm; otherwise the
    batch axes (broadcast as NumPy does) are strides of one strided-batched call, or of one
    call per index of the outer axes where no single stride describes them."""
    m = a_shape[-1] if trans_a else a_shape[-2]
    k = a_shape[-2] if trans_a else a_shape[-1]
    n = b_shape[-2] if trans_b else b_shape[-1]
    lda, ldb = a_shape[-1], b_shape[-1]
    if len(b_shape) == 2 and not trans_a:
        rows = _product(a_shape[:-1])
        return [row_major(rows, n, k, Rows(lda), Rows(ldb), Rows(n), False, trans_b, 1, dtype, dtype)]
    batch = out_shape[:-2]
    axes: list[list[int]] = []  # [size, stride of A, of B, of C] per batch axis of the product
    strides = [_product(a_shape[-2:]), _product(b_shape[-2:]), m * n]
    shapes = [(1,) * (len(batch) - len(s) + 2) + tuple(s[:-2]) for s in (a_shape, b_shape)]
    inner = list(strides)
    for d in range(len(batch) - 1, -1, -1):
        a_dim, b_dim = shapes[0][d], shapes[1][d]
        axes.insert(0, [batch[d], inner[0] if a_dim > 1 else 0, inner[1] if b_dim > 1 else 0, inner[2]])
        inner = [inner[0] * a_dim, inner[1] * b_dim, inner[2] * batch[d]]
    axes = [axis for axis in axes if axis[0] > 1]
    merged: list[list[int]] = []
    for axis in axes:  # outer to inner: an axis whose strides continue the next one's joins it
        if merged and all(merged[-1][j] == axis[j] * axis[0] for j in (1, 2, 3)):
            merged[-1] = [merged[-1][0] * axis[0], axis[1], axis[2], axis[3]]
        else:
            merged.append(axis)
    last = merged.pop() if merged else [1, 0, 0, 0]
    offsets = [(0, 0, 0)]
    for size, sa, sb, sc in merged:  # the outer axes: one call per index
        offsets = [(oa + i * sa, ob + i * sb, oc + i * sc) for oa, ob, oc in offsets for i in range(size)]
    return [row_major(m, n, k, Rows(lda, oa, last[1]), Rows(ldb, ob, last[2]), Rows(n, oc, last[3]), trans_a, trans_b, last[0], dtype, dtype)
            for oa, ob, oc in offsets]
