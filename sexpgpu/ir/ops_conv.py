"""Image entries (NCHW): conv2d and its two gradient ops, max_pool2d and avg_pool2d with
theirs.

conv2d        x [N,C,H,W], w [O,C/groups,KH,KW] -> [N,O,OH,OW]
              OH = (H + 2 ph - dh (KH - 1) - 1) // sh + 1 (and OW alike), like torch's
              F.conv2d (cross-correlation, zero padding).
conv2d_input_grad   g [N,O,OH,OW], w -> [N,C,H,W] (the transposed convolution; attr
              input_shape fixes H and W, which a stride leaves ambiguous)
conv2d_weight_grad  x, g [N,O,OH,OW] -> [O,C/groups,KH,KW] (attr weight_shape)
max_pool2d    x [N,C,H,W] -> [N,C,OH,OW], the maximum of each KHxKW window; padding cells
              never win.
max_pool2d_grad     x, g -> [N,C,H,W]: each window's gradient goes to its argmax. Ties go
              to the FIRST maximum in window order (row by row, left to right within the
              window), like torch's CPU kernel; a NaN counts as the maximum (the first NaN
              in the window gets the gradient). Overlapping windows add up.
max_pool2d_select   x, h [N,C,H,W] -> [N,C,OH,OW]: h read at each window's argmax (the
              adjoint of max_pool2d_grad in g, so that op has a gradient too)
avg_pool2d    the window sum divided by KH*KW, padding cells counted as zeros (torch's
              count_include_pad=True default)
avg_pool2d_grad     g -> [N,C,H,W] (attr input_shape); its own gradient is avg_pool2d.

Attributes are stored as lists: stride [sh,sw], padding [ph,pw], dilation [dh,dw], kernel
[kh,kw]; an integer is accepted for a pair. Padding of a pool is at most half its kernel,
as in torch, so that every window holds at least one input cell.

Kernels work by im2col: the (padded) input seen through as_strided as
[C,KH,KW,N,OH,OW], copied once into a matrix and multiplied per group with one matmul; the
input gradient adds the columns back with one strided add per kernel offset (col2im). The
pools loop over the KH*KW kernel offsets with whole-tensor operations. bf16 and f16 are
computed in f32 and rounded once at the end.

Large temporaries (the padded input, the im2col matrix: C*KH*KW*N*OH*OW elements for the
largest convolution) live in per-thread scratch buffers that are reused from step to step
and are not part of the backend's memory plan; `release_scratch()` frees them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .lazy_numpy import np

from .builder import Builder
from .graph import Node, TensorType
from .ops import GradRule, Kernel, OpDef, OpError, OpKind, ShapeRule, register

Pair = tuple[int, int]


def _fmt(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def _pair(name: str, attrs: dict[str, Any], key: str, default: Any, least: int) -> Pair:
    """Attribute KEY as two integers >= LEAST (an integer means the same for both axes)."""
    value = attrs.get(key, default)
    if value is None:
        value = default
    items = [value, value] if isinstance(value, int) and not isinstance(value, bool) else value
    try:
        a, b = items
    except (TypeError, ValueError):
        a = b = None
    if not (type(a) is int and type(b) is int and a >= least and b >= least):
        what = "a positive integer" if least >= 1 else "a non-negative integer"
        raise OpError(f"{name}: {key.replace('_', ' ')} must be {what} or a list of two, got {_attr(value)}")
    return a, b


def _attr(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "(" + " ".join(_attr(v) for v in value) + ")"
    return str(value)


def _out_size(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    """Windows along one axis (0 when the kernel does not fit)."""
    span = dilation * (kernel - 1) + 1
    room = size + 2 * pad - span
    return room // stride + 1 if room >= 0 else 0


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


_SCRATCH = threading.local()


def _scratch(slot: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A work buffer of SHAPE, contents undefined, reused by every call on this thread that
    names the same SLOT (one per slot and dtype, grown to the largest request): a training
    step then allocates, and page-faults, no large temporaries. Never handed to a caller."""
    pool = getattr(_SCRATCH, "pool", None)
    if pool is None:
        pool = _SCRATCH.pool = {}
    dtype = np.dtype(dtype)
    size = 1
    for d in shape:
        size *= d
    buffer = pool.get((slot, dtype))
    if buffer is None or buffer.size < size:
        buffer = pool[(slot, dtype)] = np.empty(max(size, 1), dtype=dtype)
    return buffer[:size].reshape(shape)


def release_scratch() -> None:
    """Free this thread's scratch buffers (the next kernel call allocates them again)."""
    _SCRATCH.pool = {}


def _finish(result: np.ndarray, out: Optional[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """RESULT (possibly scratch) written to OUT, or copied into a new array of DTYPE."""
    if out is not None:
        if result is not out:
            np.copyto(out, result, casting="unsafe")
        return out
    return np.array(result, dtype=dtype)


def _window_view(xp: np.ndarray, kernel: Pair, stride: Pair, dilation: Pair, size: Pair) -> np.ndarray:
    """Read-only view [C,KH,KW,N,OH,OW] of the padded input XP [N,C,Hp,Wp]:
    view[c,i,j,n,p,q] = xp[n, c, p*sh + i*dh, q*sw + j*dw]."""
    n, c = xp.shape[:2]
    s = xp.strides
    shape = (c, kernel[0], kernel[1], n, size[0], size[1])
    strides = (s[1], s[2] * dilation[0], s[3] * dilation[1], s[0], s[2] * stride[0], s[3] * stride[1])
    return np.lib.stride_tricks.as_strided(xp, shape=shape, strides=strides, writeable=False)


def _offset(i: int, j: int, stride: Pair, dilation: Pair, size: Pair) -> tuple[slice, slice, slice, slice]:
    """The cells [N,C,OH,OW] of the padded input that kernel offset (i, j) reads."""
    r0, c0 = i * dilation[0], j * dilation[1]
    return (slice(None), slice(None), slice(r0, r0 + stride[0] * (size[0] - 1) + 1, stride[0]), slice(c0, c0 + stride[1] * (size[1] - 1) + 1, stride[1]))


def _padded(x: np.ndarray, pad: Pair, dtype: np.dtype, fill: float = 0.0, slot: str = "pad") -> np.ndarray:
    """X in DTYPE with PAD cells of FILL on each side of H and W (X itself when nothing to
    do; otherwise scratch)."""
    if pad == (0, 0) and x.dtype == dtype:
        return x
    n, c, h, w = x.shape
    xp = _scratch(slot, (n, c, h + 2 * pad[0], w + 2 * pad[1]), dtype)
    if pad != (0, 0):
        xp[:, :, : pad[0]] = fill
        xp[:, :, h + pad[0] :] = fill
        xp[:, :, pad[0] : h + pad[0], : pad[1]] = fill
        xp[:, :, pad[0] : h + pad[0], w + pad[1] :] = fill
    np.copyto(xp[:, :, pad[0] : h + pad[0], pad[1] : w + pad[1]], x, casting="unsafe")
    return xp


def _crop(xp: np.ndarray, pad: Pair, hw: Pair) -> np.ndarray:
    return xp[:, :, pad[0] : pad[0] + hw[0], pad[1] : pad[1] + hw[1]]


# == conv2d ===========================================================================================
@dataclass(frozen=True)
class ConvGeom:
    n: int
    c: int
    hw: Pair  # input height, width
    o: int
    kernel: Pair
    stride: Pair
    padding: Pair
    dilation: Pair
    groups: int
    size: Pair  # output height, width

    @property
    def cg(self) -> int:
        return self.c // self.groups

    @property
    def og(self) -> int:
        return self.o // self.groups

    @property
    def k(self) -> int:  # the contraction per group: Cg * KH * KW
        return self.cg * self.kernel[0] * self.kernel[1]

    @property
    def cells(self) -> int:  # N * OH * OW
        return self.n * self.size[0] * self.size[1]

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.o, self.size[0], self.size[1])

    @property
    def in_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.c, self.hw[0], self.hw[1])

    @property
    def w_shape(self) -> tuple[int, int, int, int]:
        return (self.o, self.cg, self.kernel[0], self.kernel[1])


def conv_geometry(name: str, x: tuple[int, ...], w: tuple[int, ...], attrs: dict[str, Any], what: str) -> ConvGeom:
    """Check a convolution of an input of shape X with a weight of shape W; WHAT names them
    in messages (e.g. `f32[8,3,32,32] with weight f32[16,3,3,3]`)."""
    stride = _pair(name, attrs, "stride", 1, 1)
    padding = _pair(name, attrs, "padding", 0, 0)
    dilation = _pair(name, attrs, "dilation", 1, 1)
    groups = attrs.get("groups", 1)
    if type(groups) is not int or groups < 1:
        raise OpError(f"{name}: groups must be a positive integer, got {_attr(groups)}")
    if len(x) != 4:
        raise OpError(f"{name}: {what}: the input needs 4 dimensions [N,C,H,W], it has {len(x)}")
    if len(w) != 4:
        raise OpError(f"{name}: {what}: the weight needs 4 dimensions [O,C/groups,KH,KW], it has {len(w)}")
    n, c, h, wd = x
    o, cg, kh, kw = w
    if c % groups:
        raise OpError(f"{name}: {what}: input channels {c} do not divide into {groups} groups")
    if o % groups:
        raise OpError(f"{name}: {what}: output channels {o} do not divide into {groups} groups")
    if c // groups != cg:
        if groups == 1:
            raise OpError(f"{name}: {what}: input channels {c} and weight channels {cg} differ")
        raise OpError(f"{name}: {what}: input channels {c} in {groups} groups ({c // groups} each) and weight channels {cg} differ")
    if kh < 1 or kw < 1:
        raise OpError(f"{name}: {what}: the kernel {kh}x{kw} is empty")
    oh = _out_size(h, kh, stride[0], padding[0], dilation[0])
    ow = _out_size(wd, kw, stride[1], padding[1], dilation[1])
    if oh < 1 or ow < 1:
        span = (dilation[0] * (kh - 1) + 1, dilation[1] * (kw - 1) + 1)
        raise OpError(
            f"{name}: {what}: the kernel spans {span[0]}x{span[1]} (size {kh}x{kw}, dilation {dilation[0]}x{dilation[1]}), "
            f"more than the padded input {h + 2 * padding[0]}x{wd + 2 * padding[1]} (padding {padding[0]}x{padding[1]})"
        )
    return ConvGeom(n, c, (h, wd), o, (kh, kw), stride, padding, dilation, groups, (oh, ow))


def _float_pair(name: str, a: TensorType, b: TensorType, what: str) -> None:
    if a.dtype != b.dtype:
        raise OpError(f"{name}: {what}: element types differ; cast one")
    if not a.dtype.is_float:
        raise OpError(f"{name}: {what}: needs float tensors; use (cast x :f32)")


def _conv_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    x, w = types
    what = f"{x} with weight {w}"
    _float_pair("conv2d", x, w, what)
    geom = conv_geometry("conv2d", x.shape, w.shape, attrs, what)
    return TensorType(dtype=x.dtype, shape=geom.out_shape)


def _conv_input_grad_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    g, w = types
    shape = tuple(attrs.get("input_shape", ()))
    what = f"gradient {g} with weight {w} for input {_fmt(shape)}"
    _float_pair("conv2d-input-grad", g, w, what)
    geom = conv_geometry("conv2d-input-grad", shape, w.shape, attrs, what)
    if g.shape != geom.out_shape:
        raise OpError(f"conv2d-input-grad: {what}: the gradient needs shape {_fmt(geom.out_shape)}")
    return TensorType(dtype=g.dtype, shape=geom.in_shape)


def _conv_weight_grad_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    x, g = types
    shape = tuple(attrs.get("weight_shape", ()))
    what = f"input {x} with gradient {g} for weight {_fmt(shape)}"
    _float_pair("conv2d-weight-grad", x, g, what)
    geom = conv_geometry("conv2d-weight-grad", x.shape, shape, attrs, what)
    if g.shape != geom.out_shape:
        raise OpError(f"conv2d-weight-grad: {what}: the gradient needs shape {_fmt(geom.out_shape)}")
    return TensorType(dtype=x.dtype, shape=geom.w_shape)


def _columns(x: np.ndarray, geom: ConvGeom, dtype: np.dtype) -> np.ndarray:
    """im2col: [G, K, N*OH*OW] with K = (Cg, KH, KW), in DTYPE (one copy of the windows)."""
    xp = _padded(x, geom.padding, dtype)
    view = _window_view(xp, geom.kernel, geom.stride, geom.dilation, geom.size)
    cols = _scratch("cols", view.shape, dtype)
    np.copyto(cols, view)
    return cols.reshape(geom.groups, geom.k, geom.cells)


def _weights(w: np.ndarray, geom: ConvGeom, dtype: np.dtype) -> np.ndarray:
    """The weight as [G, Og, K] in DTYPE."""
    wm = w.reshape(geom.groups, geom.og, geom.k)
    return wm if wm.dtype == dtype else wm.astype(dtype)


def _conv_forward(x: np.ndarray, w: np.ndarray, geom: ConvGeom, out: Optional[np.ndarray]) -> np.ndarray:
    dtype = _compute_dtype(x.dtype)
    cols = _columns(x, geom, dtype)
    y = np.matmul(_weights(w, geom, dtype), cols, out=_scratch("y", (geom.groups, geom.og, geom.cells), dtype))
    oh, ow = geom.size
    moved = y.reshape(geom.groups, geom.og, geom.n, oh * ow).transpose(2, 0, 1, 3)  # [N, G, Og, L]
    result = out if out is not None and out.flags.c_contiguous else np.empty(geom.out_shape, dtype=x.dtype)
    np.copyto(result.reshape(geom.n, geom.groups, geom.og, oh * ow), moved, casting="unsafe")
    return _finish(result, out, x.dtype) if out is not None else result


def _grad_rows(g: np.ndarray, geom: ConvGeom, dtype: np.dtype) -> np.ndarray:
    """The output gradient [N,O,OH,OW] as [G, Og, N*OH*OW] in DTYPE."""
    oh, ow = geom.size
    rows = _scratch("rows", (geom.groups, geom.og, geom.n, oh * ow), dtype)
    np.copyto(rows, g.reshape(geom.n, geom.groups, geom.og, oh * ow).transpose(1, 2, 0, 3), casting="unsafe")
    return rows.reshape(geom.groups, geom.og, geom.cells)


def _conv_input_grad(g: np.ndarray, w: np.ndarray, geom: ConvGeom, out: Optional[np.ndarray]) -> np.ndarray:
    """col2im of w^T g: the transposed convolution."""
    dtype = _compute_dtype(g.dtype)
    wt = _weights(w, geom, dtype).transpose(0, 2, 1)  # [G, K, Og]
    cols = np.matmul(wt, _grad_rows(g, geom, dtype), out=_scratch("cols", (geom.groups, geom.k, geom.cells), dtype))
    kh, kw = geom.kernel
    cols6 = cols.reshape(geom.c, kh, kw, geom.n, geom.size[0], geom.size[1])
    h, wd = geom.hw
    ph, pw = geom.padding
    direct = out is not None and geom.padding == (0, 0) and out.dtype == dtype
    gxp = out if direct else _scratch("gxp", (geom.n, geom.c, h + 2 * ph, wd + 2 * pw), dtype)
    assert gxp is not None
    gxp.fill(0)
    target = gxp.transpose(1, 0, 2, 3)  # [C, N, Hp, Wp], matching the columns' layout
    for i in range(kh):
        for j in range(kw):
            _, _, rows, colsl = _offset(i, j, geom.stride, geom.dilation, geom.size)
            window = target[:, :, rows, colsl]
            np.add(window, cols6[:, i, j], out=window)
    if direct:
        return gxp
    return _finish(_crop(gxp, geom.padding, geom.hw), out, g.dtype)


def _conv_weight_grad(x: np.ndarray, g: np.ndarray, geom: ConvGeom, out: Optional[np.ndarray]) -> np.ndarray:
    dtype = _compute_dtype(x.dtype)
    cols = _columns(x, geom, dtype)  # [G, K, N*L]
    rows = _grad_rows(g, geom, dtype)  # [G, Og, N*L]
    direct = out is not None and out.flags.c_contiguous and out.dtype == dtype
    target = out.reshape(geom.groups, geom.og, geom.k) if direct and out is not None else _scratch("y", (geom.groups, geom.og, geom.k), dtype)
    np.matmul(rows, cols.transpose(0, 2, 1), out=target)
    if direct:
        assert out is not None
        return out
    return _finish(target.reshape(geom.w_shape), out, x.dtype)


def _conv_kernels(name: str) -> tuple[Kernel, Callable[[dict[str, Any], list[TensorType]], Kernel]]:
    """The plain kernel (geometry worked out per call) and its specializer (once)."""

    def geometry(attrs: dict[str, Any], shapes: list[tuple[int, ...]]) -> ConvGeom:
        a, b = shapes
        if name == "conv2d":
            return conv_geometry(name, a, b, attrs, "")
        if name == "conv2d_input_grad":
            return conv_geometry(name, tuple(attrs["input_shape"]), b, attrs, "")
        return conv_geometry(name, a, tuple(attrs["weight_shape"]), attrs, "")

    compute = {"conv2d": _conv_forward, "conv2d_input_grad": _conv_input_grad, "conv2d_weight_grad": _conv_weight_grad}[name]

    def plain(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
        return compute(xs[0], xs[1], geometry(attrs, [xs[0].shape, xs[1].shape]), out)

    def specialize(attrs: dict[str, Any], types: list[TensorType]) -> Kernel:
        geom = geometry(attrs, [t.shape for t in types])

        def run(xs: list[np.ndarray], at: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
            return compute(xs[0], xs[1], geom, out)

        return run

    return plain, specialize


def _conv_attrs(n: Node) -> dict[str, Any]:
    return {k: n.attrs[k] for k in ("stride", "padding", "dilation", "groups") if k in n.attrs}


def _g_conv(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    x, w = n.args
    attrs = _conv_attrs(n)
    gx = b.op("conv2d_input_grad", g, w, input_shape=list(b.type(x).shape), **attrs)
    gw = b.op("conv2d_weight_grad", x, g, weight_shape=list(b.type(w).shape), **attrs)
    return [gx, gw]


def _g_conv_input_grad(b: Builder, n: Node, h: int) -> list[Optional[int]]:
    """y = J_x^T g is bilinear in (g, w): <y, h> = <g, conv2d(h, w)> = <w, weight_grad(h, g)>."""
    g, w = n.args
    attrs = _conv_attrs(n)
    return [b.op("conv2d", h, w, **attrs), b.op("conv2d_weight_grad", h, g, weight_shape=list(b.type(w).shape), **attrs)]


def _g_conv_weight_grad(b: Builder, n: Node, h: int) -> list[Optional[int]]:
    """y = J_w^T g: <y, h> = <g, conv2d(x, h)> = <x, input_grad(g, h)>."""
    x, g = n.args
    attrs = _conv_attrs(n)
    return [b.op("conv2d_input_grad", g, h, input_shape=list(b.type(x).shape), **attrs), b.op("conv2d", x, h, **attrs)]


def _conv_flops(node: Node, inputs: list[TensorType]) -> int:
    """2 * N * O * OH * OW * Cg * KH * KW for all three (the same multiply-adds)."""
    if node.op == "conv2d":
        out, w = node.type.shape, inputs[1].shape
    elif node.op == "conv2d_input_grad":
        out, w = inputs[0].shape, inputs[1].shape
    else:
        out, w = inputs[1].shape, node.type.shape
    return 2 * out[0] * out[1] * out[2] * out[3] * w[1] * w[2] * w[3]


CONVOLUTIONS: list[tuple[str, ShapeRule, GradRule, str]] = [
    ("conv2d", _conv_type, _g_conv, "2-D convolution (cross-correlation), NCHW"),
    ("conv2d_input_grad", _conv_input_grad_type, _g_conv_input_grad, "conv2d's gradient for its input (the transposed convolution)"),
    ("conv2d_weight_grad", _conv_weight_grad_type, _g_conv_weight_grad, "conv2d's gradient for its weight"),
]
for _name, _infer, _grad, _doc in CONVOLUTIONS:
    _plain, _spec = _conv_kernels(_name)
    register(OpDef(_name, _infer, _plain, grad=_grad, kind=OpKind.IMAGE, arity=2, flops=_conv_flops, doc=_doc, specialize=_spec))


# == pooling ===========================================================================================
@dataclass(frozen=True)
class PoolGeom:
    n: int
    c: int
    hw: Pair
    kernel: Pair
    stride: Pair
    padding: Pair
    size: Pair

    @property
    def in_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.c, self.hw[0], self.hw[1])

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.c, self.size[0], self.size[1])

    def offsets(self) -> list[tuple[int, int]]:
        """Kernel offsets in window order: row by row, left to right."""
        return [(i, j) for i in range(self.kernel[0]) for j in range(self.kernel[1])]

    def cells(self, i: int, j: int) -> tuple[slice, slice, slice, slice]:
        return _offset(i, j, self.stride, (1, 1), self.size)

    def first_real(self) -> np.ndarray:
        """For each window ([OH,OW]), the index into offsets() of its first cell that is
        not padding."""
        first = []
        for size, stride, pad, kernel in zip(self.size, self.stride, self.padding, self.kernel):
            start = stride * np.arange(size) - pad  # the window's first row (or column)
            first.append(np.clip(-start, 0, kernel - 1))
        return first[0][:, None] * self.kernel[1] + first[1][None, :]


def pool_geometry(name: str, x: tuple[int, ...], attrs: dict[str, Any], what: str) -> PoolGeom:
    kernel = _pair(name, attrs, "kernel", None, 1)
    stride = _pair(name, attrs, "stride", list(kernel), 1)
    padding = _pair(name, attrs, "padding", 0, 0)
    if len(x) != 4:
        raise OpError(f"{name}: {what}: needs 4 dimensions [N,C,H,W], it has {len(x)}")
    for side, k, p in zip(("height", "width"), kernel, padding):
        if 2 * p > k:
            raise OpError(f"{name}: {what}: padding {p} is more than half the kernel {side} {k}")
    n, c, h, w = x
    oh = _out_size(h, kernel[0], stride[0], padding[0], 1)
    ow = _out_size(w, kernel[1], stride[1], padding[1], 1)
    if oh < 1 or ow < 1:
        raise OpError(f"{name}: {what}: the kernel {kernel[0]}x{kernel[1]} is larger than the padded input {h + 2 * padding[0]}x{w + 2 * padding[1]} (padding {padding[0]}x{padding[1]})")
    return PoolGeom(n, c, (h, w), kernel, stride, padding, (oh, ow))


def _float_input(name: str, t: TensorType) -> None:
    if not t.dtype.is_float:
        raise OpError(f"{name}: {t}: needs a float tensor; use (cast x :f32)")


def _pool_type(name: str) -> Callable[[list[TensorType], dict[str, Any]], TensorType]:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        (x,) = types
        _float_input(name, x)
        geom = pool_geometry(name, x.shape, attrs, str(x))
        return TensorType(dtype=x.dtype, shape=geom.out_shape)

    return infer


def _max_pool_grad_type(name: str) -> Callable[[list[TensorType], dict[str, Any]], TensorType]:
    """max_pool2d_grad (x, g: output-shaped) -> x's shape; max_pool2d_select (x, h:
    x-shaped) -> the output's shape."""

    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        x, g = types
        what = f"{x} with {'gradient' if name == 'max-pool2d-grad' else 'values'} {g}"
        if x.dtype != g.dtype:
            raise OpError(f"{name}: {what}: element types differ; cast one")
        _float_input(name, x)
        geom = pool_geometry(name, x.shape, attrs, what)
        expected, result = (geom.out_shape, geom.in_shape) if name == "max-pool2d-grad" else (geom.in_shape, geom.out_shape)
        if g.shape != expected:
            raise OpError(f"{name}: {what}: the second argument needs shape {_fmt(expected)}")
        return TensorType(dtype=x.dtype, shape=result)

    return infer


def _avg_pool_grad_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (g,) = types
    shape = tuple(attrs.get("input_shape", ()))
    what = f"gradient {g} for input {_fmt(shape)}"
    _float_input("avg-pool2d-grad", g)
    geom = pool_geometry("avg-pool2d-grad", shape, attrs, what)
    if g.shape != geom.out_shape:
        raise OpError(f"avg-pool2d-grad: {what}: the gradient needs shape {_fmt(geom.out_shape)}")
    return TensorType(dtype=g.dtype, shape=geom.in_shape)


def _max_pool(x: np.ndarray, geom: PoolGeom, out: Optional[np.ndarray], padded: bool = False) -> np.ndarray:
    """The maximum over kernel offsets (exact in any dtype, so computed in x's own); X may
    come PADDED with -inf already."""
    xp = x if padded else _padded(x, geom.padding, x.dtype, fill=-np.inf)
    acc = out if out is not None else np.empty(geom.out_shape, dtype=x.dtype)
    offsets = geom.offsets()
    np.copyto(acc, xp[geom.cells(*offsets[0])])
    for i, j in offsets[1:]:
        np.maximum(acc, xp[geom.cells(i, j)], out=acc)
    return acc


def _argmax(x: np.ndarray, geom: PoolGeom) -> np.ndarray:
    """Each window's argmax as an index into geom.offsets() ([N,C,OH,OW] int16 scratch):
    the first maximum in window order; padding never wins; a NaN is the maximum (the first
    one wins); a window whose input cells are all -inf goes to its first input cell.

    Without masked ufuncs (slow in NumPy): the window maximum M first, then per offset k
    `index = min(index, BIG + hit_k * (k - BIG))` where hit_k = (cell == M)."""
    offsets = geom.offsets()
    if len(offsets) >= 2**15 - 1:
        raise OpError(f"max-pool2d: a {geom.kernel[0]}x{geom.kernel[1]} window has too many cells")
    big = 2**15 - 1
    xp = _padded(x, geom.padding, x.dtype, fill=-np.inf)
    peak = _max_pool(xp, geom, _scratch("peak", geom.out_shape, x.dtype), padded=True)
    nan = bool(np.isnan(peak).any())
    hit = _scratch("hit", geom.out_shape, np.bool_)
    step = _scratch("step", geom.out_shape, np.int16)
    low = _scratch("index", geom.out_shape, np.int16)  # index - BIG (0: no hit yet)
    low.fill(0)
    for k, (i, j) in enumerate(offsets):
        cells = xp[geom.cells(i, j)]
        np.equal(cells, peak, out=hit)
        if nan:
            hit |= np.isnan(cells)
        np.multiply(hit, np.int16(k - big), out=step)
        np.minimum(low, step, out=low)
    index = np.add(low, np.int16(big), out=low)
    if geom.padding != (0, 0):  # all-(-inf) windows: padding cells (-inf too) must not win
        lost = np.isneginf(peak)
        if lost.any():
            index[lost] = np.broadcast_to(geom.first_real(), geom.out_shape)[lost]
    return index


def _masked(values: np.ndarray, index: np.ndarray, k: int, finite: bool) -> np.ndarray:
    """VALUES where INDEX == K, else 0 (scratch)."""
    mask = np.equal(index, k, out=_scratch("mask", index.shape, np.bool_))
    if finite:  # multiplying by the mask is exact and fast, but inf * 0 would be NaN
        return np.multiply(values, mask, out=_scratch("masked", index.shape, values.dtype))
    return np.where(mask, values, values.dtype.type(0))


def _max_pool_grad(x: np.ndarray, g: np.ndarray, geom: PoolGeom, out: Optional[np.ndarray]) -> np.ndarray:
    dtype = _compute_dtype(x.dtype)
    index = _argmax(x, geom)
    h, w = geom.hw
    direct = out is not None and geom.padding == (0, 0) and out.dtype == dtype
    gxp = out if direct else _scratch("gxp", (geom.n, geom.c, h + 2 * geom.padding[0], w + 2 * geom.padding[1]), dtype)
    assert gxp is not None
    gxp.fill(0)
    gc = g if g.dtype == dtype else g.astype(dtype)
    finite = bool(np.isfinite(gc).all())
    for k, (i, j) in enumerate(geom.offsets()):
        window = gxp[geom.cells(i, j)]
        np.add(window, _masked(gc, index, k, finite), out=window)
    return gxp if direct else _finish(_crop(gxp, geom.padding, geom.hw), out, x.dtype)


def _max_pool_select(x: np.ndarray, h: np.ndarray, geom: PoolGeom, out: Optional[np.ndarray]) -> np.ndarray:
    index = _argmax(x, geom)
    hp = _padded(h, geom.padding, h.dtype, slot="pad2")
    finite = bool(np.isfinite(h).all())
    result = out if out is not None else np.empty(geom.out_shape, dtype=h.dtype)
    result.fill(0)
    for k, (i, j) in enumerate(geom.offsets()):
        np.add(result, _masked(hp[geom.cells(i, j)], index, k, finite), out=result)
    return result


def _avg_pool(x: np.ndarray, geom: PoolGeom, out: Optional[np.ndarray]) -> np.ndarray:
    dtype = _compute_dtype(x.dtype)
    xp = _padded(x, geom.padding, dtype)
    direct = out is not None and out.dtype == dtype
    acc = out if direct else _scratch("acc", geom.out_shape, dtype)
    assert acc is not None
    offsets = geom.offsets()
    np.copyto(acc, xp[geom.cells(*offsets[0])])
    for i, j in offsets[1:]:
        np.add(acc, xp[geom.cells(i, j)], out=acc)
    np.multiply(acc, dtype.type(1.0 / (geom.kernel[0] * geom.kernel[1])), out=acc)
    return acc if direct else _finish(acc, out, x.dtype)


def _avg_pool_grad(g: np.ndarray, geom: PoolGeom, out: Optional[np.ndarray]) -> np.ndarray:
    dtype = _compute_dtype(g.dtype)
    h, w = geom.hw
    direct = out is not None and geom.padding == (0, 0) and out.dtype == dtype
    gxp = out if direct else _scratch("gxp", (geom.n, geom.c, h + 2 * geom.padding[0], w + 2 * geom.padding[1]), dtype)
    assert gxp is not None
    gxp.fill(0)
    share = np.multiply(g, dtype.type(1.0 / (geom.kernel[0] * geom.kernel[1])), dtype=dtype, out=_scratch("share", geom.out_shape, dtype))
    for i, j in geom.offsets():
        window = gxp[geom.cells(i, j)]
        np.add(window, share, out=window)
    return gxp if direct else _finish(_crop(gxp, geom.padding, geom.hw), out, g.dtype)


def _pool_kernels(name: str, compute: Callable[..., np.ndarray], shape_of: Callable[[dict[str, Any], list[tuple[int, ...]]], tuple[int, ...]]) -> tuple[Kernel, Callable[[dict[str, Any], list[TensorType]], Kernel]]:
    def plain(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
        return compute(*xs, pool_geometry(name, shape_of(attrs, [x.shape for x in xs]), attrs, ""), out)

    def specialize(attrs: dict[str, Any], types: list[TensorType]) -> Kernel:
        geom = pool_geometry(name, shape_of(attrs, [t.shape for t in types]), attrs, "")

        def run(xs: list[np.ndarray], at: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
            return compute(*xs, geom, out)

        return run

    return plain, specialize


def _pool_attrs(n: Node) -> dict[str, Any]:
    return {k: n.attrs[k] for k in ("kernel", "stride", "padding") if k in n.attrs}


def _g_max_pool(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    return [b.op("max_pool2d_grad", n.args[0], g, **_pool_attrs(n))]


def _g_max_pool_grad(b: Builder, n: Node, h: int) -> list[Optional[int]]:
    """Linear in g (the argmax routing is fixed); piecewise constant in x, so zero there."""
    x = n.args[0]
    t = b.type(x)
    return [b.const(0.0, t.dtype, t.shape), b.op("max_pool2d_select", x, h, **_pool_attrs(n))]


def _g_max_pool_select(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    x = n.args[0]
    t = b.type(x)
    return [b.const(0.0, t.dtype, t.shape), b.op("max_pool2d_grad", x, g, **_pool_attrs(n))]


def _g_avg_pool(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    return [b.op("avg_pool2d_grad", g, input_shape=list(b.type(n.args[0]).shape), **_pool_attrs(n))]


def _g_avg_pool_grad(b: Builder, n: Node, h: int) -> list[Optional[int]]:
    return [b.op("avg_pool2d", h, **_pool_attrs(n))]


def _pool_flops(node: Node, inputs: list[TensorType]) -> int:
    kernel = _pair(node.op, node.attrs, "kernel", None, 1)
    out = node.type if node.op in ("max_pool2d", "avg_pool2d", "max_pool2d_select") else (inputs[1] if node.op == "max_pool2d_grad" else inputs[0])
    return out.size * kernel[0] * kernel[1]


def _first(attrs: dict[str, Any], shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    return shapes[0]


def _given(attrs: dict[str, Any], shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    return tuple(attrs["input_shape"])


PoolShape = Callable[[dict[str, Any], list[tuple[int, ...]]], tuple[int, ...]]
POOLS: list[tuple[str, str, ShapeRule, Callable[..., np.ndarray], PoolShape, GradRule, int, str]] = [
    ("max_pool2d", "max-pool2d", _pool_type("max-pool2d"), _max_pool, _first, _g_max_pool, 1, "maximum over KHxKW windows, NCHW"),
    ("max_pool2d_grad", "max-pool2d-grad", _max_pool_grad_type("max-pool2d-grad"), _max_pool_grad, _first, _g_max_pool_grad, 2, "max_pool2d's gradient: each window's to its first maximum"),
    ("max_pool2d_select", "max-pool2d-select", _max_pool_grad_type("max-pool2d-select"), _max_pool_select, _first, _g_max_pool_select, 2, "values read at each window's first maximum"),
    ("avg_pool2d", "avg-pool2d", _pool_type("avg-pool2d"), _avg_pool, _first, _g_avg_pool, 1, "mean over KHxKW windows (padding counts as zeros), NCHW"),
    ("avg_pool2d_grad", "avg-pool2d-grad", _avg_pool_grad_type, _avg_pool_grad, _given, _g_avg_pool_grad, 1, "avg_pool2d's gradient"),
]
for _name, _user, _infer, _compute, _shape, _grad, _arity, _doc in POOLS:
    _plain, _spec = _pool_kernels(_user, _compute, _shape)
    register(OpDef(_name, _infer, _plain, grad=_grad, kind=OpKind.IMAGE, arity=_arity, flops=_pool_flops, doc=_doc, specialize=_spec))
