"""Elementwise entries of the op table: creation, unary, binary (broadcasting), comparisons,
logic, where and cast."""

from __future__ import annotations

from typing import Any, Callable, Optional, TypeAlias

from .lazy_numpy import np

from .builder import Builder, broadcast_shapes
from .dtypes import DType, numpy_dtype, parse_dtype
from .graph import Node, TensorType
from .ops import OpDef, OpError, OpKind, no_flops, register

Arrays: TypeAlias = "list[np.ndarray]"


# -- creation ---------------------------------------------------------------------------------
def _full_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    return TensorType(dtype=parse_dtype(attrs["dtype"]), shape=tuple(attrs["shape"]))


def _full_kernel(xs: Arrays, attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    dtype = numpy_dtype(parse_dtype(attrs["dtype"]))
    if out is not None:
        out.fill(attrs["value"])
        return out
    return np.full(tuple(attrs["shape"]), attrs["value"], dtype=dtype)


register(OpDef("full", _full_type, _full_kernel, grad=None, kind=OpKind.CONSTANT, arity=0, flops=no_flops, doc="a constant tensor of one value"))


def _constant_kernel(xs: Arrays, attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    dtype = numpy_dtype(parse_dtype(attrs["dtype"]))
    return np.asarray(attrs["data"], dtype=dtype).reshape(tuple(attrs["shape"]))


register(OpDef("constant", _full_type, _constant_kernel, grad=None, kind=OpKind.CONSTANT, arity=0, flops=no_flops, doc="a tensor from literal data"))


def _arange_kernel(xs: Arrays, attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    n = attrs["shape"][0]
    return (attrs.get("start", 0) + attrs.get("step", 1) * np.arange(n)).astype(numpy_dtype(parse_dtype(attrs["dtype"])))


register(OpDef("arange", _full_type, _arange_kernel, grad=None, kind=OpKind.CONSTANT, arity=0, flops=no_flops, doc="start, start+step, ..."))


def _tril_kernel(xs: Arrays, attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    n, m = attrs["shape"]
    return np.tril(np.ones((n, m), dtype=numpy_dtype(parse_dtype(attrs["dtype"]))), k=attrs.get("k", 0))


register(OpDef("tril_mask", _full_type, _tril_kernel, grad=None, kind=OpKind.CONSTANT, arity=0, flops=no_flops, doc="lower-triangular boolean mask"))


# -- unary ------------------------------------------------------------------------------------------
def _same_float(name: str) -> Callable[[list[TensorType], dict[str, Any]], TensorType]:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        (t,) = types
        if not t.dtype.is_float:
            raise OpError(f"{name}: needs a float tensor, got {t}; use (cast x :f32)")
        return t

    return infer


def _same_numeric(name: str) -> Callable[[list[TensorType], dict[str, Any]], TensorType]:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        (t,) = types
        if t.dtype == DType.bool:
            raise OpError(f"{name}: needs a numeric tensor, got {t}")
        return t

    return infer


def unary(name: str, kernel: str | Callable[..., np.ndarray], grad: Optional[Callable[[Builder, Node, int], list[Optional[int]]]], c_expr: str, numeric: bool = False, doc: str = "",
          c_expr_integer: Optional[str] = None, decompose: Optional[Callable[[Builder, Node], int]] = None, numpy_f32_loop: Optional[str] = None) -> None:
    """KERNEL: a function of (x, out=), or the name of the NumPy ufunc (looked up at the call,
    so that the table loads without NumPy)."""

    def run(xs: Arrays, attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
        fn = getattr(np, kernel) if isinstance(kernel, str) else kernel
        return fn(xs[0], out=out) if out is not None else fn(xs[0])

    infer = _same_numeric(name) if numeric else _same_float(name)
    register(OpDef(name, infer, run, grad=grad, kind=OpKind.ELEMENTWISE, arity=1, c_expr=c_expr, c_expr_integer=c_expr_integer, doc=doc, decompose=decompose,
                   numpy_f32_loop=numpy_f32_loop))


def _g_neg(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    return [b.op("neg", g)]


def _g_abs(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    return [b.op("mul", g, b.op("sign", n.args[0]))]


def _g_exp(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    return [b.op("mul", g, n.id)]


def _g_log(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    return [b.op("div", g, n.args[0])]


def _g_log1p(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    x = n.args[0]
    return [b.op("div", g, b.op("add", x, b.scalar_like(1.0, x)))]


def _g_sqrt(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    return [b.op("div", b.op("mul", g, b.scalar_like(0.5, g)), n.id)]


def _g_rsqrt(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    cube = b.op("mul", n.id, b.op("mul", n.id, n.id))
    return [b.op("mul", b.op("mul", g, b.scalar_like(-0.5, g)), cube)]


def _g_square(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    x = n.args[0]
    return [b.op("mul", g, b.op("mul", x, b.scalar_like(2.0, x)))]


def _g_tanh(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    one = b.scalar_like(1.0, g)
    return [b.op("mul", g, b.op("sub", one, b.op("mul", n.id, n.id)))]


def _g_sigmoid(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    one = b.scalar_like(1.0, g)
    return [b.op("mul", g, b.op("mul", n.id, b.op("sub", one, n.id)))]


def _g_relu(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    x = n.args[0]
    positive = b.op("cast", b.op("gt", x, b.scalar_like(0.0, x)), dtype=b.type(x).dtype.value)
    return [b.op("mul", g, positive)]


def _g_sin(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    return [b.op("mul", g, b.op("cos", n.args[0]))]


def _g_cos(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    return [b.op("neg", b.op("mul", g, b.op("sin", n.args[0])))]


def _sigmoid(x: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    # 1 / (1 + exp(-x)) without overflow warnings: exp of a non-positive number only
    e = np.exp(-np.abs(x))
    pos = 1.0 / (1.0 + e)
    result = np.where(x >= 0, pos, e * pos).astype(x.dtype, copy=False)
    if out is not None:
        out[...] = result
        return out
    return result


def _rsqrt(x: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    r = np.sqrt(x, out=out)
    return np.divide(1.0, r, out=r if out is not None else None).astype(x.dtype, copy=False)


def _decompose_sigmoid(b: Builder, n: Node) -> int:
    """The lowerings compute sigmoid as its NumPy kernel does, op by op: e = exp(-|x|) in x's
    dtype, then 1 / (1 + e) for x >= 0, else e times that, in f32 (NumPy promotes a bf16 array
    and a Python float to f32), rounded to x's dtype once."""
    x = n.args[0]
    dtype = b.type(x).dtype
    e = b.op("exp", b.op("neg", b.op("abs", x)))
    wide = b.cast(e, DType.f32) if dtype != DType.f32 else e
    positive = b.op("div", b.const(1.0, DType.f32), b.op("add", b.const(1.0, DType.f32), wide))
    result = b.op("where", b.op("ge", x, b.scalar_like(0.0, x)), positive, b.op("mul", wide, positive))
    return b.cast(result, dtype) if dtype != DType.f32 else result


def _decompose_rsqrt(b: Builder, n: Node) -> int:
    """1 / sqrt(x), two roundings, as the NumPy kernel computes it."""
    x = n.args[0]
    return b.op("div", b.scalar_like(1.0, x), b.op("sqrt", x))


def _relu(x: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    return np.maximum(x, 0, out=out) if out is not None else np.maximum(x, x.dtype.type(0))


def _sign(x: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    # + 0: a zero's sign is +0 in every dtype (ml_dtypes' bf16 sign keeps -0)
    zero = x.dtype.type(0)
    return np.add(np.sign(x, out=out), zero, out=out) if out is not None else np.add(np.sign(x), zero)


def _identity(x: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    if out is not None:
        out[...] = x
        return out
    return x


unary("neg", "negative", _g_neg, "(-{0})", numeric=True, doc="-x")
unary("stop_gradient", _identity, None, "({0})", numeric=True, doc="x, passing no gradient (a value autodiff treats as a constant)")
unary("abs", "absolute", _g_abs, "fabsf({0})", numeric=True, doc="|x|", c_expr_integer="(({0}) < 0 ? -({0}) : ({0}))")
unary("sign", _sign, None, "(({0} > 0) ? ({dtype})1 : (({0} < 0) ? ({dtype})-1 : (({0} == 0) ? ({dtype})0 : {0})))", numeric=True, doc="-1, 0 or 1 (NaN for NaN)",
      c_expr_integer="(({0} > 0) - ({0} < 0))")
unary("exp", "exp", _g_exp, "expf({0})", doc="e^x", numpy_f32_loop="exp")
unary("log", "log", _g_log, "logf({0})", doc="natural logarithm", numpy_f32_loop="log")
unary("log1p", "log1p", _g_log1p, "log1pf({0})", doc="log(1 + x)", numpy_f32_loop="log1p")
unary("sqrt", "sqrt", _g_sqrt, "sqrtf({0})", doc="square root")
unary("rsqrt", _rsqrt, _g_rsqrt, "rsqrtf({0})", doc="1 / sqrt(x)", decompose=_decompose_rsqrt)
unary("square", "square", _g_square, "({0} * {0})", numeric=True, doc="x * x")
unary("tanh", "tanh", _g_tanh, "tanhf({0})", doc="hyperbolic tangent", numpy_f32_loop="tanh")
unary("sigmoid", _sigmoid, _g_sigmoid, "(1.0f / (1.0f + expf(-{0})))", doc="1 / (1 + e^-x), computed stably", decompose=_decompose_sigmoid)
unary("relu", _relu, _g_relu, "sx_maxf({0}, 0.0f)", numeric=True, doc="max(x, 0)", c_expr_integer="(({0}) > 0 ? ({0}) : 0)")
unary("sin", "sin", _g_sin, "sinf({0})", doc="sine", numpy_f32_loop="sin")
unary("cos", "cos", _g_cos, "cosf({0})", doc="cosine", numpy_f32_loop="cos")


# -- cast ----------------------------------------------------------------------------------------------
def _cast_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    return TensorType(dtype=parse_dtype(attrs["dtype"]), shape=types[0].shape)


def _cast_kernel(xs: Arrays, attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    target = numpy_dtype(parse_dtype(attrs["dtype"]))
    if out is not None:
        out[...] = xs[0]
        return out
    return xs[0].astype(target)


def _g_cast(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    source = b.type(n.args[0]).dtype
    if not source.is_float or not n.type.dtype.is_float:
        return [None]
    return [b.cast(g, source)]


register(OpDef("cast", _cast_type, _cast_kernel, grad=_g_cast, kind=OpKind.ELEMENTWISE, arity=1, c_expr="(({dtype}){0})", doc="convert the element type"))


# -- binary ---------------------------------------------------------------------------------------------
def _binary_type(name: str, result: Optional[DType] = None, floats_only: bool = False, bools_only: bool = False) -> Callable[[list[TensorType], dict[str, Any]], TensorType]:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        a, b = types
        if a.dtype != b.dtype:
            raise OpError(f"{name}: {a} and {b} have different element types; use (cast x :{b.dtype.value}) on one")
        if floats_only and not a.dtype.is_float:
            raise OpError(f"{name}: needs float tensors, got {a} and {b}")
        if bools_only and a.dtype != DType.bool:
            raise OpError(f"{name}: needs boolean tensors, got {a} and {b}")
        if not bools_only and result is None and a.dtype == DType.bool:
            raise OpError(f"{name}: needs numeric tensors, got {a} and {b}")
        shape = broadcast_shapes(a.shape, b.shape, name)
        return TensorType(dtype=result or a.dtype, shape=shape)

    return infer


def binary(name: str, ufunc_name: str, grad: Optional[Callable[[Builder, Node, int], list[Optional[int]]]], c_expr: str, result: Optional[DType] = None, floats_only: bool = False, bools_only: bool = False, doc: str = "",
           c_expr_integer: Optional[str] = None, numpy_f32_loop: Optional[str] = None) -> None:
    """UFUNC_NAME: the NumPy ufunc's name, looked up at the call (the table loads without NumPy)."""

    def run(xs: Arrays, attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
        ufunc = getattr(np, ufunc_name)
        if out is not None:
            return ufunc(xs[0], xs[1], out=out)
        return ufunc(xs[0], xs[1])

    register(OpDef(name, _binary_type(name, result, floats_only, bools_only), run, grad=grad, kind=OpKind.ELEMENTWISE, arity=2, c_expr=c_expr, c_expr_integer=c_expr_integer, doc=doc,
                   numpy_f32_loop=numpy_f32_loop))


def _shapes(b: Builder, n: Node) -> tuple[Any, Any]:
    return b.type(n.args[0]).shape, b.type(n.args[1]).shape


def _g_add(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    sa, sb = _shapes(b, n)
    return [b.sum_to(g, sa), b.sum_to(g, sb)]


def _g_sub(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    sa, sb = _shapes(b, n)
    return [b.sum_to(g, sa), b.sum_to(b.op("neg", g), sb)]


def _g_mul(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    x, y = n.args
    sa, sb = _shapes(b, n)
    return [b.sum_to(b.op("mul", g, y), sa), b.sum_to(b.op("mul", g, x), sb)]


def _g_div(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    x, y = n.args
    sa, sb = _shapes(b, n)
    ga = b.op("div", g, y)
    gb = b.op("neg", b.op("div", b.op("mul", g, n.id), y))
    return [b.sum_to(ga, sa), b.sum_to(gb, sb)]


def _g_pow(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    x, y = n.args
    sa, sb = _shapes(b, n)
    one = b.scalar_like(1.0, y)
    ga = b.op("mul", g, b.op("mul", y, b.op("pow", x, b.op("sub", y, one))))
    # d/db a^b = a^b log a; at a = 0 the product is 0 * -inf: take log 1 there (0 for b > 0,
    # as torch does), so pow(x, 2.0) with zeros in x keeps a finite exponent gradient
    safe_x = b.op("where", b.op("eq", x, b.scalar_like(0.0, x)), b.scalar_like(1.0, x), x)
    gb = b.op("mul", g, b.op("mul", n.id, b.op("log", safe_x)))
    return [b.sum_to(ga, sa), b.sum_to(gb, sb)]


def _g_maximum(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    return _g_select(b, n, g, "ge")


def _g_minimum(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    return _g_select(b, n, g, "le")


def _g_select(b: Builder, n: Node, g: int, cmp: str) -> list[Optional[int]]:
    x, y = n.args
    sa, sb = _shapes(b, n)
    dtype = n.type.dtype.value
    first = b.op("cast", b.op(cmp, x, y), dtype=dtype)
    second = b.op("sub", b.scalar_like(1.0, g), first)
    return [b.sum_to(b.op("mul", g, first), sa), b.sum_to(b.op("mul", g, second), sb)]


binary("add", "add", _g_add, "({0} + {1})", doc="a + b, broadcasting")
binary("sub", "subtract", _g_sub, "({0} - {1})", doc="a - b, broadcasting")
binary("mul", "multiply", _g_mul, "({0} * {1})", doc="a * b, broadcasting")
binary("div", "divide", _g_div, "({0} / {1})", floats_only=True, doc="a / b, broadcasting")
binary("pow", "power", _g_pow, "powf({0}, {1})", floats_only=True, doc="a ^ b, broadcasting", numpy_f32_loop="power")
binary("maximum", "maximum", _g_maximum, "sx_maxf({0}, {1})", doc="elementwise maximum (ties send the gradient to a)", c_expr_integer="(({0}) > ({1}) ? ({0}) : ({1}))")
binary("minimum", "minimum", _g_minimum, "sx_minf({0}, {1})", doc="elementwise minimum (ties send the gradient to a)", c_expr_integer="(({0}) < ({1}) ? ({0}) : ({1}))")
for _name, _ufunc, _c in [("eq", "equal", "=="), ("ne", "not_equal", "!="), ("lt", "less", "<"), ("gt", "greater", ">"), ("le", "less_equal", "<="), ("ge", "greater_equal", ">=")]:
    binary(_name, _ufunc, None, "({0} " + _c + " {1})", result=DType.bool, doc=f"a {_c} b as a boolean tensor")
binary("logical_and", "logical_and", None, "({0} && {1})", result=DType.bool, bools_only=True, doc="a and b")
binary("logical_or", "logical_or", None, "({0} || {1})", result=DType.bool, bools_only=True, doc="a or b")


def _not_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (t,) = types
    if t.dtype != DType.bool:
        raise OpError(f"logical-not: needs a boolean tensor, got {t}")
    return t


register(OpDef("logical_not", _not_type, lambda xs, at, out: np.logical_not(xs[0], out=out) if out is not None else np.logical_not(xs[0]), grad=None, kind=OpKind.ELEMENTWISE, arity=1, c_expr="(!{0})", doc="not a"))


# -- where ------------------------------------------------------------------------------------------------
def _where_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    c, a, b = types
    if c.dtype != DType.bool:
        raise OpError(f"where: the condition must be a boolean tensor, got {c}; compare with (> x 0) to make one")
    if a.dtype != b.dtype:
        raise OpError(f"where: branches {a} and {b} have different element types")
    shape = broadcast_shapes(broadcast_shapes(c.shape, a.shape, "where"), b.shape, "where")
    return TensorType(dtype=a.dtype, shape=shape)


def _where_kernel(xs: Arrays, attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    result = np.where(xs[0], xs[1], xs[2])
    if out is not None:
        out[...] = result
        return out
    return result


def _g_where(b: Builder, n: Node, g: int) -> list[Optional[int]]:
    c, x, y = n.args
    zero = b.scalar_like(0.0, g)
    return [None, b.sum_to(b.op("where", c, g, zero), b.type(x).shape), b.sum_to(b.op("where", c, zero, g), b.type(y).shape)]


register(OpDef("where", _where_type, _where_kernel, grad=_g_where, kind=OpKind.ELEMENTWISE, arity=3, c_expr="({0} ? {1} : {2})", doc="a where c, else b"))
