"""Reductions: sum, mean, max, min (with :axis and :keepdims) and argmax."""

from __future__ import annotations

from typing import Any, Optional

from .lazy_numpy import np

from .builder import Builder
from .dtypes import DType
from .graph import Node, TensorType
from .ops import OpDef, OpError, OpKind, ReducerSpec, register


def normalize_axes(name: str, axis: Any, rank: int) -> list[int]:
    """The reduced axes as sorted non-negative integers (None: every axis)."""
    if axis is None:
        return list(range(rank))
    axes = [axis] if isinstance(axis, int) else list(axis)
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise OpError(f"{name}: axis {a} is out of range for a rank-{rank} tensor")
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise OpError(f"{name}: axis {axes} repeats an axis")
    return sorted(out)


def reduced_shape(shape: tuple[int, ...], axes: list[int], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _reduce_type(name: str, result: Optional[DType] = None, floats_only: bool = False) -> Any:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        (t,) = types
        if t.dtype == DType.bool or (floats_only and not t.dtype.is_float):
            raise OpError(f"{name}: needs a {'float' if floats_only else 'numeric'} tensor, got {t}")
        axes = normalize_axes(name, attrs.get("axis"), t.rank)
        return TensorType(dtype=result or t.dtype, shape=reduced_shape(t.shape, axes, bool(attrs.get("keepdims", False))))

    return infer


def _axes(attrs: dict[str, Any], rank: int) -> tuple[int, ...]:
    return tuple(normalize_axes("reduce", attrs.get("axis"), rank))


def _kernel(name: str) -> Any:
    """The kernel of the reduction numpy.NAME (looked up at the call: the table loads without NumPy)."""

    def run(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
        fn = getattr(np, name)
        x = xs[0]
        axes = _axes(attrs, x.ndim)
        keep = bool(attrs.get("keepdims", False))
        if out is not None and out.ndim == (x.ndim if keep else x.ndim - len(axes)):
            return fn(x, axis=axes, keepdims=keep, out=out)
        return np.asarray(fn(x, axis=axes, keepdims=keep), dtype=x.dtype)

    return run


def _keepdims_grad(b: Builder, n: Node, g: int) -> int:
    """G reshaped to the keepdims shape, then broadcast to the input's shape."""
    x_type = b.type(n.args[0])
    axes = normalize_axes(n.op, n.attrs.get("axis"), x_type.rank)
    kept = reduced_shape(x_type.shape, axes, True)
    if b.type(g).shape != kept:
        g = b.op("reshape", g, shape=list(kept))
    return b.broadcast_to(g, x_type.shape)


def _g_sum(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    return [_keepdims_grad(b, n, g)]


def _g_mean(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    x_type = b.type(n.args[0])
    axes = normalize_axes("mean", n.attrs.get("axis"), x_type.rank)
    count = 1
    for a in axes:
        count *= x_type.shape[a]
    spread = _keepdims_grad(b, n, g)
    return [b.op("div", spread, b.scalar_like(float(count), spread))]


def _g_extreme(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    """Like torch.amax: the gradient is shared evenly between tied extremes."""
    x = n.args[0]
    x_type = b.type(x)
    axes = normalize_axes(n.op, n.attrs.get("axis"), x_type.rank)
    kept = reduced_shape(x_type.shape, axes, True)
    value = n.id if b.type(n.id).shape == kept else b.op("reshape", n.id, shape=list(kept))
    mask = b.op("cast", b.op("eq", x, value), dtype=x_type.dtype.value)
    ties = b.op("sum", mask, axis=axes, keepdims=True)
    spread = _keepdims_grad(b, n, g)
    return [b.op("div", b.op("mul", spread, mask), ties)]


def _reduce_flops(node: Node, inputs: list[TensorType]) -> int:
    return inputs[0].size


def _specialized(ufunc_name: str, mean: bool = False) -> Any:
    """A reduction kernel with its axes normalized once (the ufunc numpy.UFUNC_NAME's reduce,
    straight into out)."""

    def make(attrs: dict[str, Any], types: list[TensorType]) -> Any:
        ufunc = getattr(np, ufunc_name)
        (t,) = types
        axes = tuple(normalize_axes("reduce", attrs.get("axis"), t.rank))
        keep = bool(attrs.get("keepdims", False))
        count = 1
        for a in axes:
            count *= t.shape[a]
        # the count as a float of the input's width, except for 16-bit floats (whose sums are
        # f32: a count like 257 is not a bf16 number)
        scale = (np.float32(count) if t.dtype.numpy().itemsize == 2 and t.dtype.is_float else t.dtype.numpy().type(count)) if mean and count else None

        def run(xs: list[np.ndarray], at: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
            x = xs[0]
            if x.dtype.itemsize == 2 and x.dtype.kind not in "iub":
                # half-precision inputs accumulate in f32 and round once, like the GPU
                wide = ufunc.reduce(x.astype(np.float32), axis=axes, keepdims=keep)
                if scale is not None:
                    wide = wide / np.float32(scale)
                result = np.asarray(wide).astype(x.dtype)
                if out is not None:
                    out[...] = result
                    return out
                return result
            result = ufunc.reduce(x, axis=axes, keepdims=keep, out=out)
            if scale is not None:
                result = np.divide(result, scale, out=out if out is not None else None)
            return result

        return run

    return make


ADDS = ReducerSpec(identity="0", identity_integer="0", combine="{0} + {1}")
MEAN = ReducerSpec(identity="0", identity_integer="0", combine="{0} + {1}", divides=True)
MAX = ReducerSpec(identity="-sx_inf()", identity_integer="(-9223372036854775807LL - 1)", combine="sx_maxd({0}, {1})", better=">")
MIN = ReducerSpec(identity="sx_inf()", identity_integer="9223372036854775807LL", combine="sx_mind({0}, {1})", better="<")

register(OpDef("sum", _reduce_type("sum"), _kernel("sum"), grad=_g_sum, kind=OpKind.REDUCTION, arity=1, flops=_reduce_flops, doc="sum over axes", specialize=_specialized("add"), reducer=ADDS))
register(OpDef("mean", _reduce_type("mean", floats_only=True), _kernel("mean"), grad=_g_mean, kind=OpKind.REDUCTION, arity=1, flops=_reduce_flops, doc="mean over axes", specialize=_specialized("add", mean=True), reducer=MEAN))
register(OpDef("max", _reduce_type("max"), _kernel("max"), grad=_g_extreme, kind=OpKind.REDUCTION, arity=1, flops=_reduce_flops, doc="maximum over axes", specialize=_specialized("maximum"), reducer=MAX))
register(OpDef("min", _reduce_type("min"), _kernel("min"), grad=_g_extreme, kind=OpKind.REDUCTION, arity=1, flops=_reduce_flops, doc="minimum over axes", specialize=_specialized("minimum"), reducer=MIN))


def _argmax_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (t,) = types
    axis = attrs.get("axis")
    if not isinstance(axis, int):
        raise OpError("argmax: needs one :axis")
    axes = normalize_axes("argmax", axis, t.rank)
    return TensorType(dtype=DType.i32, shape=reduced_shape(t.shape, axes, bool(attrs.get("keepdims", False))))


def _argmax_kernel(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    result = np.argmax(xs[0], axis=attrs["axis"], keepdims=bool(attrs.get("keepdims", False))).astype(np.int32)
    if out is not None:
        out[...] = result
        return out
    return result


register(OpDef("argmax", _argmax_type, _argmax_kernel, grad=None, kind=OpKind.REDUCTION, arity=1, flops=_reduce_flops, doc="index of the maximum along an axis"))


# -- softmax and log-softmax over one axis ---------------------------------------------------------
# Primitives of their own so that their gradients are the short closed forms (which keep only
# the output for the backward pass), not the chain rule through max, exp, sum and div. The
# CUDA lowering builds each from those primitives again (`decompose`) and fuses them into one
# row kernel; the NumPy kernels compute exactly that chain, so results are the same bits.
def _softmax_type(name: str) -> Any:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        (t,) = types
        if not t.dtype.is_float:
            raise OpError(f"{name}: needs a float tensor, got {t}")
        if not isinstance(attrs.get("axis", -1), int) or isinstance(attrs.get("axis", -1), bool):
            raise OpError(f"{name}: needs one :axis (an integer), got {attrs.get('axis')!r}")
        normalize_axes(name, attrs.get("axis", -1), t.rank)
        return t

    return infer


def _axis(attrs: dict[str, Any], rank: int) -> int:
    return normalize_axes("softmax", attrs.get("axis", -1), rank)[0]


def _softmax_parts(x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x - max, its exp, and the exp's sum (16-bit floats summed in f32, rounded once, as `sum`)."""
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    total = np.add.reduce(e.astype(np.float32), axis=axis, keepdims=True).astype(x.dtype) if x.dtype.itemsize == 2 else np.add.reduce(e, axis=axis, keepdims=True)
    return shifted, e, total


def _softmax_kernel(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    _, e, total = _softmax_parts(xs[0], _axis(attrs, xs[0].ndim))
    return np.divide(e, total, out=out)


def _log_softmax_kernel(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    shifted, _, total = _softmax_parts(xs[0], _axis(attrs, xs[0].ndim))
    return np.subtract(shifted, np.log(total), out=out)


def _g_softmax(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    """y (g - sum(g y)): only the output y is kept for the backward pass."""
    axis = _axis(n.attrs, b.type(n.id).rank)
    inner = b.op("sum", b.op("mul", g, n.id), axis=[axis], keepdims=True)
    return [b.op("mul", n.id, b.op("sub", g, inner))]


def _g_log_softmax(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    """g - exp(y) sum(g)."""
    axis = _axis(n.attrs, b.type(n.id).rank)
    total = b.op("sum", g, axis=[axis], keepdims=True)
    return [b.op("sub", g, b.op("mul", b.op("exp", n.id), total))]


def _decompose_softmax(b: Builder, n: Node) -> int:
    x = n.args[0]
    axis = _axis(n.attrs, b.type(x).rank)
    e = b.op("exp", b.op("sub", x, b.op("max", x, axis=[axis], keepdims=True)))
    return b.op("div", e, b.op("sum", e, axis=[axis], keepdims=True))


def _decompose_log_softmax(b: Builder, n: Node) -> int:
    x = n.args[0]
    axis = _axis(n.attrs, b.type(x).rank)
    shifted = b.op("sub", x, b.op("max", x, axis=[axis], keepdims=True))
    return b.op("sub", shifted, b.op("log", b.op("sum", b.op("exp", shifted), axis=[axis], keepdims=True)))


def _softmax_flops(node: Node, inputs: list[TensorType]) -> int:
    return 5 * inputs[0].size


register(OpDef("softmax", _softmax_type("softmax"), _softmax_kernel, grad=_g_softmax, kind=OpKind.ROW, arity=1, flops=_softmax_flops,
               doc="exp(x - max) / sum(exp(x - max)) along :axis (default -1)", decompose=_decompose_softmax))
register(OpDef("log_softmax", _softmax_type("log_softmax"), _log_softmax_kernel, grad=_g_log_softmax, kind=OpKind.ROW, arity=1, flops=_softmax_flops,
               doc="(x - max) - log(sum(exp(x - max))) along :axis (default -1)", decompose=_decompose_log_softmax))


# -- layer-norm and rms-norm over the last axis (without the affine part) ---------------------------
# Ops of their own for the same reason as softmax: closed-form gradients. The NumPy kernels
# compute exactly the chain of `mean`, `sub`, `mul`, `add`, `rsqrt` the CUDA lowering builds.
def _norm_type(name: str) -> Any:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        (t,) = types
        if not t.dtype.is_float or t.rank < 1:
            raise OpError(f"{name}: needs a float tensor with at least one axis, got {t}")
        eps = attrs.get("eps")
        if not isinstance(eps, (int, float)) or isinstance(eps, bool):
            raise OpError(f"{name}: needs a number :eps, got {eps!r}")
        return t

    return infer


def _last_mean(x: np.ndarray) -> np.ndarray:
    """The mean over the last axis, kept, as the `mean` op computes it (a sum, then a division;
    16-bit floats summed in f32 and rounded once)."""
    count = x.dtype.type(x.shape[-1])
    if x.dtype.itemsize == 2:
        return (np.add.reduce(x.astype(np.float32), axis=(x.ndim - 1,), keepdims=True) / np.float32(x.shape[-1])).astype(x.dtype)
    return np.divide(np.add.reduce(x, axis=(x.ndim - 1,), keepdims=True), count)


def _rsqrt_of(x: np.ndarray) -> np.ndarray:
    return np.divide(1.0, np.sqrt(x)).astype(x.dtype, copy=False)


def _layer_norm_kernel(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    x = xs[0]
    dev = x - _last_mean(x)
    rstd = _rsqrt_of(_last_mean(dev * dev) + x.dtype.type(attrs["eps"]))
    return np.multiply(dev, rstd, out=out)


def _rms_norm_kernel(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    x = xs[0]
    return np.multiply(x, _rsqrt_of(_last_mean(x * x) + x.dtype.type(attrs["eps"])), out=out)


def _last_axis_mean(b: Builder, x: int) -> int:
    return b.op("mean", x, axis=[-1], keepdims=True)


def _layer_norm_parts(b: Builder, x: int, eps: float) -> tuple[int, int]:
    """x - mean and 1/sqrt(var + eps), from x."""
    dev = b.op("sub", x, _last_axis_mean(b, x))
    var = _last_axis_mean(b, b.op("mul", dev, dev))
    return dev, b.op("rsqrt", b.op("add", var, b.scalar_like(eps, var)))


def _rms_scale(b: Builder, x: int, eps: float) -> int:
    ms = _last_axis_mean(b, b.op("mul", x, x))
    return b.op("rsqrt", b.op("add", ms, b.scalar_like(eps, ms)))


def _g_layer_norm(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    """rstd (g - mean(g) - y mean(g y)); rstd is recomputed from x (a row's two numbers), y kept."""
    _, rstd = _layer_norm_parts(b, n.args[0], float(n.attrs["eps"]))
    centered = b.op("sub", g, _last_axis_mean(b, g))
    return [b.op("mul", rstd, b.op("sub", centered, b.op("mul", n.id, _last_axis_mean(b, b.op("mul", g, n.id)))))]


def _g_rms_norm(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    """r (g - y mean(g y)), r recomputed from x."""
    r = _rms_scale(b, n.args[0], float(n.attrs["eps"]))
    return [b.op("mul", r, b.op("sub", g, b.op("mul", n.id, _last_axis_mean(b, b.op("mul", g, n.id)))))]


def _decompose_layer_norm(b: Builder, n: Node) -> int:
    dev, rstd = _layer_norm_parts(b, n.args[0], float(n.attrs["eps"]))
    return b.op("mul", dev, rstd)


def _decompose_rms_norm(b: Builder, n: Node) -> int:
    x = n.args[0]
    return b.op("mul", x, _rms_scale(b, x, float(n.attrs["eps"])))


register(OpDef("layer_norm", _norm_type("layer_norm"), _layer_norm_kernel, grad=_g_layer_norm, kind=OpKind.ROW, arity=1, flops=_softmax_flops,
               doc="(x - mean) / sqrt(var + eps) over the last axis", decompose=_decompose_layer_norm))
register(OpDef("rms_norm", _norm_type("rms_norm"), _rms_norm_kernel, grad=_g_rms_norm, kind=OpKind.ROW, arity=1, flops=_softmax_flops,
               doc="x / sqrt(mean(x^2) + eps) over the last axis", decompose=_decompose_rms_norm))
