"""matmul: batched, broadcasting over leading axes, both operands at least 2-D (staging
reshapes vectors)."""

from __future__ import annotations

from typing import Any, Optional

from .lazy_numpy import np

from .builder import Builder, broadcast_shapes
from .graph import Node, TensorType
from .ops import OpDef, OpError, OpKind, register


def _matmul_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    a, b = types
    if a.dtype != b.dtype:
        raise OpError(f"matmul: {a} @ {b}: element types differ; cast one")
    if not a.dtype.is_float:
        raise OpError(f"matmul: {a} @ {b}: needs float tensors")
    if a.rank < 2 or b.rank < 2:
        raise OpError(f"matmul: {a} @ {b}: both operands need at least 2 dimensions")
    if a.shape[-1] != b.shape[-2]:
        raise OpError(f"matmul: {a} @ {b}: inner dimensions {a.shape[-1]} and {b.shape[-2]} differ")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2], "matmul")
    return TensorType(dtype=a.dtype, shape=batch + (a.shape[-2], b.shape[-1]))


def _matmul_kernel(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    a, b = xs
    if a.dtype.itemsize == 2:
        # bf16/f16 emulation: products accumulated in f32, the result rounded once (as
        # cuBLAS with CUBLAS_COMPUTE_32F does)
        result = np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
        if out is not None:
            out[...] = result
            return out
        return result
    if out is not None:
        return np.matmul(a, b, out=out)
    return np.matmul(a, b)


def _swap_last(b: Builder, x: int) -> int:
    rank = b.type(x).rank
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    return b.op("transpose", x, perm=perm)


def _g_matmul(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    x, y = n.args
    tx, ty = b.type(x), b.type(y)
    ga = b.op("matmul", g, _swap_last(b, y))
    if ty.rank == 2 and tx.rank > 2:
        # y (a weight) is shared by every batch: its gradient is one matmul over all the rows,
        # x^T g with the batch folded into the rows, not a batch of products summed afterwards
        rows = 1
        for d in tx.shape[:-1]:
            rows *= d
        flat_x = b.op("reshape", x, shape=[rows, tx.shape[-1]])
        flat_g = b.op("reshape", g, shape=[rows, b.type(g).shape[-1]])
        return [b.sum_to(ga, tx.shape), b.op("matmul", _swap_last(b, flat_x), flat_g)]
    gb = b.op("matmul", _swap_last(b, x), g)
    return [b.sum_to(ga, tx.shape), b.sum_to(gb, ty.shape)]


def _matmul_flops(node: Node, inputs: list[TensorType]) -> int:
    a = inputs[0]
    return 2 * node.type.size * a.shape[-1]


register(OpDef("matmul", _matmul_type, _matmul_kernel, grad=_g_matmul, kind=OpKind.MATMUL, arity=2, flops=_matmul_flops, doc="batched matrix product"))
