"""Attention entries: `attention` (scaled dot-product self-attention, optionally causal) and
its gradient op `attention_grad`.

attention       q, k, v [..., S, H, D] (one dtype, one shape: a sequence of S positions, each
                with H heads of width D, as a linear layer's output reshaped gives them)
                -> [..., S, H, D]: for each head, softmax(q k^T * scale + mask) v over the
                positions, the mask hiding key j from query i when j > i (attrs causal, a
                bool, and scale, a float: staging makes it 1/sqrt(D)). A causal row always
                sees its own key, so no row is empty. With heads next to the width, the
                head split and merge around it are reshapes: no transposes.
attention_grad  q, k, v, o (attention's result), g (its cotangent) -> [3, ..., S, H, D]:
                the gradients of q, k and v, stacked (the gradient rule takes them apart as
                views): with P = softmax(q k^T * scale + mask) recomputed,
                    dv = P^T g,  dP = g v^T,  dS = P * (dP - rowsum(g * o)),
                    dq = dS k * scale,  dk = dS^T q * scale
                (rowsum(g * o) = rowsum(P * dP): the softmax's closed form, read from the
                stored o, as the device's kernels do).

An op of its own, with its closed-form gradient, so that a device computes it without
materializing the S x S scores in memory (runtime/lower/attention.py: flash-attention kernels,
the backward pass recomputing P tile by tile); on the CPU the kernels below compute the
unfused math in one call each. 16-bit floats are computed in f32 and rounded once at the
end; f64 in f64.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from .lazy_numpy import np

from .builder import Builder
from .dtypes import numpy_dtype
from .graph import Node, TensorType
from .ops import Kernel, OpDef, OpError, OpKind, register


def _same(name: str, types: list[TensorType], what: list[str]) -> TensorType:
    first = types[0]
    if not first.dtype.is_float:
        raise OpError(f"{name}: needs float tensors, got {first}")
    if first.rank < 3:
        raise OpError(f"{name}: {what[0]} {first} needs at least 3 dimensions [..., S, H, D]")
    for label, t in zip(what[1:], types[1:]):
        if t != first:
            raise OpError(f"{name}: {what[0]} {first} and {label} {t} differ; self-attention takes one shape and dtype for all")
    return first


def _check_attrs(name: str, attrs: dict[str, Any]) -> None:
    if not isinstance(attrs.get("causal"), bool):
        raise OpError(f"{name}: causal must be true or false, got {attrs.get('causal')!r}")
    scale = attrs.get("scale")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise OpError(f"{name}: scale must be a positive number, got {scale!r}")


def _attention_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    _check_attrs("attention", attrs)
    return _same("attention", types, ["q", "k", "v"])


def _attention_grad_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    _check_attrs("attention-grad", attrs)
    t = _same("attention-grad", types, ["q", "k", "v", "o", "g"])
    return TensorType(dtype=t.dtype, shape=(3,) + tuple(t.shape))


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _heads_first(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """[..., S, H, D] as [..., H, S, D] in DTYPE (a view when it has that dtype)."""
    return np.swapaxes(x.astype(dtype, copy=False), -3, -2)


def _hidden(size: int, causal: bool, dtype: np.dtype) -> Optional[np.ndarray]:
    """-inf where a query [S, S] does not see the key, 0 where it does (None: it sees all)."""
    return np.where(np.triu(np.ones((size, size), dtype=bool), 1), dtype.type(-np.inf), dtype.type(0)) if causal else None


def _row_sums(x: np.ndarray) -> np.ndarray:
    """The sums along the last axis, keepdims, through BLAS (a matrix-vector product is far
    faster than NumPy's reduction over a short last axis)."""
    return np.matmul(x, np.ones(x.shape[-1], dtype=x.dtype))[..., None]


def _probabilities(q: np.ndarray, k: np.ndarray, scale: float, hidden: Optional[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """softmax(q k^T * scale + mask) over the last axis, in DTYPE."""
    s = np.matmul(q, np.swapaxes(k, -1, -2))
    s *= dtype.type(scale)
    if hidden is not None:
        s += hidden
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= _row_sums(s)
    return s


def _store(result: np.ndarray, out: Optional[np.ndarray], dtype: np.dtype) -> np.ndarray:
    if out is not None:
        np.copyto(out, result, casting="unsafe")
        return out
    return result.astype(dtype, copy=False)


def _forward(xs: list[np.ndarray], scale: float, hidden: Optional[np.ndarray], out: Optional[np.ndarray]) -> np.ndarray:
    dtype = _compute_dtype(xs[0].dtype)
    q, k, v = (_heads_first(x, dtype) for x in xs)
    return _store(np.swapaxes(np.matmul(_probabilities(q, k, scale, hidden, dtype), v), -3, -2), out, xs[0].dtype)


def _backward(xs: list[np.ndarray], scale: float, hidden: Optional[np.ndarray], out: Optional[np.ndarray]) -> np.ndarray:
    dtype = _compute_dtype(xs[0].dtype)
    q, k, v, o, g = (_heads_first(x, dtype) for x in xs)
    p = _probabilities(q, k, scale, hidden, dtype)
    result = out if out is not None and out.dtype == dtype else np.empty((3,) + xs[0].shape, dtype=dtype)
    parts = np.swapaxes(result, -3, -2)  # [3, ..., H, S, D] views of the result
    np.matmul(np.swapaxes(p, -1, -2), g, out=parts[2])
    ds = np.matmul(g, np.swapaxes(v, -1, -2))
    ds -= _row_sums(g * o)
    ds *= p
    np.matmul(ds, k, out=parts[0])
    np.matmul(np.swapaxes(ds, -1, -2), q, out=parts[1])
    result[:2] *= dtype.type(scale)
    return result if result is out else _store(result, out, xs[0].dtype)


def _kernels(compute: Any) -> tuple[Kernel, Any]:
    """The plain kernel and its specializer (the mask made once per node)."""

    def plain(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
        return compute(xs, float(attrs["scale"]), _hidden(xs[0].shape[-3], bool(attrs["causal"]), _compute_dtype(xs[0].dtype)), out)

    def specialize(attrs: dict[str, Any], types: list[TensorType]) -> Kernel:
        dtype = _compute_dtype(np.dtype(numpy_dtype(types[0].dtype)))
        scale, hidden = float(attrs["scale"]), _hidden(types[0].shape[-3], bool(attrs["causal"]), dtype)

        def run(xs: list[np.ndarray], at: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
            return compute(xs, scale, hidden, out)

        return run

    return plain, specialize


def _attrs(n: Node) -> dict[str, Any]:
    return {"causal": n.attrs["causal"], "scale": n.attrs["scale"]}


def _g_attention(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    q, k, v = n.args
    packed = b.op("attention_grad", q, k, v, n.id, g, **_attrs(n))
    shape = list(b.type(q).shape)
    parts: list[Optional[int]] = []
    for i in range(3):
        part = b.op("slice", packed, starts=[i] + [0] * len(shape), stops=[i + 1] + shape)
        parts.append(b.op("reshape", part, shape=shape))
    return parts


def visible_pairs(size: int, causal: bool) -> int:
    """(query, key) pairs one [S, S] attention computes."""
    return size * (size + 1) // 2 if causal else size * size


def _flops(factor: int) -> Any:
    """FACTOR multiply-adds of D per visible pair (2 for the forward pass's q k^T and P v;
    5 for the gradient's recomputed scores, dP, dv, dq and dk), two FLOPs each."""

    def count(node: Node, inputs: list[TensorType]) -> int:
        shape = inputs[0].shape
        heads = shape[-2]
        for d in shape[:-3]:
            heads *= d
        return 2 * factor * heads * visible_pairs(shape[-3], bool(node.attrs["causal"])) * shape[-1]

    return count


_forward_plain, _forward_specialize = _kernels(_forward)
_backward_plain, _backward_specialize = _kernels(_backward)
register(OpDef("attention", _attention_type, _forward_plain, grad=_g_attention, kind=OpKind.ATTENTION, arity=3, flops=_flops(2),
               doc="per head: softmax(q k^T * scale + causal mask) v, q k v [..., S, H, D]", attrs=("causal", "scale"), specialize=_forward_specialize))
register(OpDef("attention_grad", _attention_grad_type, _backward_plain, grad=None, kind=OpKind.ATTENTION, arity=5, flops=_flops(5),
               doc="attention's gradients for q, k and v, stacked", attrs=("causal", "scale"), specialize=_backward_specialize))
