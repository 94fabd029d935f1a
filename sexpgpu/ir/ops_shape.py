"""Shape entries: reshape, transpose, broadcast_to, concat, slice (and its gradient), take
(gather) and scatter_add (its deterministic gradient)."""

from __future__ import annotations

from typing import Any, Optional

from .lazy_numpy import np

from .builder import Builder
from .graph import Node, TensorType
from .ops import OpDef, OpError, OpKind, no_flops, register


def _fmt(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


# -- reshape -----------------------------------------------------------------------------------------
def _reshape_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (t,) = types
    shape = tuple(attrs["shape"])
    size = 1
    for d in shape:
        size *= d
    if size != t.size:
        raise OpError(f"reshape: {t} has {t.size} elements, the shape {_fmt(shape)} holds {size}")
    return TensorType(dtype=t.dtype, shape=shape)


def _reshape_kernel(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    return xs[0].reshape(tuple(attrs["shape"]))


def _g_reshape(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    return [b.op("reshape", g, shape=list(b.type(n.args[0]).shape))]


register(OpDef("reshape", _reshape_type, _reshape_kernel, grad=_g_reshape, kind=OpKind.VIEW, arity=1, flops=no_flops, doc="same elements, new shape"))


# -- transpose ------------------------------------------------------------------------------------------
def _transpose_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (t,) = types
    perm = list(attrs["perm"])
    if sorted(perm) != list(range(t.rank)):
        raise OpError(f"transpose: {perm} is not a permutation of the {t.rank} axes of {t}")
    return TensorType(dtype=t.dtype, shape=tuple(t.shape[p] for p in perm))


def _transpose_kernel(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    return np.transpose(xs[0], attrs["perm"])


def _g_transpose(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    perm = list(n.attrs["perm"])
    inverse = [perm.index(i) for i in range(len(perm))]
    return [b.op("transpose", g, perm=inverse)]


register(OpDef("transpose", _transpose_type, _transpose_kernel, grad=_g_transpose, kind=OpKind.VIEW, arity=1, flops=no_flops, doc="permute axes"))


# -- broadcast_to -------------------------------------------------------------------------------------------
def _broadcast_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (t,) = types
    shape = tuple(attrs["shape"])
    lead = len(shape) - t.rank
    if lead < 0 or any(d not in (1, shape[lead + i]) for i, d in enumerate(t.shape)):
        raise OpError(f"broadcast-to: {t} cannot broadcast to {_fmt(shape)}")
    return TensorType(dtype=t.dtype, shape=shape)


def _broadcast_kernel(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    return np.broadcast_to(xs[0], tuple(attrs["shape"]))


def _g_broadcast(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    return [b.sum_to(g, b.type(n.args[0]).shape)]


register(OpDef("broadcast_to", _broadcast_type, _broadcast_kernel, grad=_g_broadcast, kind=OpKind.VIEW, arity=1, c_expr="{0}", flops=no_flops, doc="repeat along size-1 and new leading axes"))


# -- concat ----------------------------------------------------------------------------------------------------
def _concat_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    if not types:
        raise OpError("concat: needs at least one tensor")
    first = types[0]
    if first.rank == 0:
        raise OpError(f"concat: cannot join scalars {first}; stack them instead")
    axis = attrs["axis"]
    if not -first.rank <= axis < first.rank:
        raise OpError(f"concat: axis {axis} is out of range for {first}")
    axis %= first.rank
    total = 0
    for t in types:
        if t.dtype != first.dtype or t.rank != first.rank or any(d != e for i, (d, e) in enumerate(zip(t.shape, first.shape)) if i != axis):
            raise OpError(f"concat: {first} and {t} do not match outside axis {axis}")
        total += t.shape[axis]
    shape = list(first.shape)
    shape[axis] = total
    return TensorType(dtype=first.dtype, shape=tuple(shape))


def _concat_kernel(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    if out is not None:
        return np.concatenate(xs, axis=attrs["axis"], out=out)
    return np.concatenate(xs, axis=attrs["axis"])


def _g_concat(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    axis = n.attrs["axis"] % n.type.rank
    grads: list[Optional[int]] = []
    start = 0
    for a in n.args:
        width = b.type(a).shape[axis]
        starts = [0] * n.type.rank
        stops = list(n.type.shape)
        starts[axis], stops[axis] = start, start + width
        grads.append(b.op("slice", g, starts=starts, stops=stops))
        start += width
    return grads


register(OpDef("concat", _concat_type, _concat_kernel, grad=_g_concat, kind=OpKind.LAYOUT, flops=no_flops, doc="join along an axis"))


# -- slice (static bounds, step 1) -------------------------------------------------------------------------------
def _slice_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (t,) = types
    starts, stops = list(attrs["starts"]), list(attrs["stops"])
    if len(starts) != t.rank or len(stops) != t.rank:
        raise OpError(f"slice: {t} needs {t.rank} bounds")
    for axis, (lo, hi, d) in enumerate(zip(starts, stops, t.shape)):
        if not 0 <= lo <= hi <= d:
            raise OpError(f"slice: bounds {lo}..{hi} are outside axis {axis} of {t}")
    return TensorType(dtype=t.dtype, shape=tuple(hi - lo for lo, hi in zip(starts, stops)))


def _slices(attrs: dict[str, Any]) -> tuple[slice, ...]:
    return tuple(slice(lo, hi) for lo, hi in zip(attrs["starts"], attrs["stops"]))


def _slice_kernel(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    return xs[0][_slices(attrs)]


def _g_slice(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    return [b.op("unslice", g, shape=list(b.type(n.args[0]).shape), starts=n.attrs["starts"], stops=n.attrs["stops"])]


register(OpDef("slice", _slice_type, _slice_kernel, grad=_g_slice, kind=OpKind.VIEW, arity=1, flops=no_flops, doc="a static window"))


def _unslice_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (t,) = types
    shape = tuple(attrs["shape"])
    window = _slice_type([TensorType(dtype=t.dtype, shape=shape)], attrs)
    if window.shape != t.shape:
        raise OpError(f"unslice: {t} does not fill the window {attrs['starts']}..{attrs['stops']} of {_fmt(shape)}")
    return TensorType(dtype=t.dtype, shape=shape)


def _unslice_kernel(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    result = out if out is not None else np.empty(tuple(attrs["shape"]), dtype=xs[0].dtype)
    result.fill(0)
    result[_slices(attrs)] = xs[0]
    return result


def _g_unslice(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    return [b.op("slice", g, starts=n.attrs["starts"], stops=n.attrs["stops"])]


register(OpDef("unslice", _unslice_type, _unslice_kernel, grad=_g_unslice, kind=OpKind.LAYOUT, arity=1, flops=no_flops, doc="zeros with a window set (slice's gradient)"))


# -- take (gather) and scatter_add -------------------------------------------------------------------------------
def _axis(name: str, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise OpError(f"{name}: axis {axis} is out of range for a rank-{rank} tensor")
    return axis % rank


def _take_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    x, idx = types
    if not idx.dtype.is_int:
        raise OpError(f"take: indices must be an integer tensor, got {idx}")
    if x.rank == 0:
        raise OpError(f"take: cannot gather from a scalar {x}")
    axis = _axis("take", attrs.get("axis", 0), x.rank)
    shape = x.shape[:axis] + idx.shape + x.shape[axis + 1 :]
    return TensorType(dtype=x.dtype, shape=shape)


def _take_kernel(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    """Out-of-range indices clip to the nearest row (scatter_add, the gradient, does the same)."""
    x, idx = xs
    axis = attrs.get("axis", 0)
    if out is not None:
        return np.take(x, idx, axis=axis, out=out, mode="clip")
    return np.take(x, idx, axis=axis, mode="clip")


def _g_take(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    x, idx = n.args
    return [b.op("scatter_add", g, idx, shape=list(b.type(x).shape), axis=n.attrs.get("axis", 0)), None]


register(OpDef("take", _take_type, _take_kernel, grad=_g_take, kind=OpKind.GATHER, arity=2, flops=no_flops, doc="gather rows by integer indices"))


def _scatter_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    g, idx = types
    if not idx.dtype.is_int:
        raise OpError(f"scatter-add: indices must be an integer tensor, got {idx}")
    shape = tuple(attrs["shape"])
    if not shape:
        raise OpError("scatter-add: cannot scatter into a scalar")
    axis = _axis("scatter-add", attrs.get("axis", 0), len(shape))
    expected = shape[:axis] + idx.shape + shape[axis + 1 :]
    if g.shape != expected:
        raise OpError(f"scatter-add: {g} with indices {idx} into {_fmt(shape)} along axis {axis} needs values of shape {_fmt(expected)}")
    return TensorType(dtype=g.dtype, shape=shape)


def _scatter_kernel(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    """Deterministic: np.add.at accumulates in index order, the same on every run.
    Indices clip like take's, so this stays take's exact adjoint."""
    g, idx = xs
    shape = tuple(attrs["shape"])
    axis = attrs.get("axis", 0) % len(shape)
    half = g.dtype.itemsize == 2  # bf16/f16: accumulate in f32, round once
    result = np.zeros(shape, dtype=np.float32) if half else (out if out is not None else np.empty(shape, dtype=g.dtype))
    result.fill(0)
    moved = np.moveaxis(result, axis, 0)
    rows = np.moveaxis(g.reshape(shape[:axis] + (idx.size,) + shape[axis + 1 :]), axis, 0)
    np.add.at(moved, np.clip(idx.reshape(-1), 0, shape[axis] - 1), rows.astype(np.float32) if half else rows)
    if half:
        if out is not None:
            out[...] = result
            return out
        return result.astype(g.dtype)
    return result


def _g_scatter(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    return [b.op("take", g, n.args[1], axis=n.attrs.get("axis", 0)), None]


register(OpDef("scatter_add", _scatter_type, _scatter_kernel, grad=_g_scatter, kind=OpKind.SCATTER, arity=2, doc="add rows into zeros at integer indices (take's gradient)"))
