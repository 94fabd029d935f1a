"""Staging: tensor values, the program being traced, and the tensor builtins.

A Tracer is one program being staged: its IR builder, the parameters and ctx inputs it has
read, its metrics, activations and diagnostic taps, and the precision it reads parameters
and data in. A Staged value is a node of it. TensorLib registers the tensor builtins into an
interpreter; `TensorLib.tracing(tracer)` makes TRACER the program they stage into. Called on
staged values or parameters, a builtin records an IR node (stamped with the calling form's
position) whose shape and dtype the op table checks; on plain Lisp numbers the generic ones
(+, exp, max ...) still compute.

Numbers meet a tensor as weak literals of its dtype, two float dtypes meet at the wider, and
integer and float tensors need an explicit cast. In :bf16 programs parameters and float data
are read as bf16 while reductions, norms and losses run in f32 islands (with-numerics opens
more). A few builtins (gelu, silu, clamp, logsumexp, var, one-hot, einsum, the weight and
bias of layer-norm and rms-norm) are compositions of op-table entries, so autodiff and the
backends only ever see the op table.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

from ..ir.builder import Builder
from ..ir.dtypes import DType, promote_floats
from ..ir.graph import TensorType
from ..ir.ops import OpError
from ..lisp.scope import LIBRARY_FILES
from ..lisp.builtins import Registry, list_items, parse_keys, to_lisp_list, type_error
from ..lisp.conditions import LispError, lisp_error
from ..lisp.objects import Builtin
from ..lisp.types import NIL, T, Cons, Symbol, is_number
from .probes import PROBES, Probing

if TYPE_CHECKING:
    from ..lisp.evaluator import Interpreter
    from .models import Param


class Staged:
    """A tensor value being traced: node ID of the tracer's program."""

    __slots__ = ("tracer", "id")

    def __init__(self, tracer: "Tracer", nid: int) -> None:
        self.tracer = tracer
        self.id = nid

    @property
    def type(self) -> TensorType:
        return self.tracer.builder.type(self.id)

    def lisp_print(self) -> str:
        return f"#<tensor {self.type} %{self.id}>"


class Tracer:
    """One program being staged: its builder, the parameters it has read, its metrics.
    PRECISION is the dtype parameters and float data are read in; CTX_ALLOWED says whether
    `(ctx ...)` may be read (optimizer updates, schedules and defcurriculum)."""

    def __init__(self, name: str, seed: int = 0, training: bool = False, precision: DType = DType.f32, ctx_allowed: bool = False) -> None:
        self.builder = Builder(name)
        self.training = training
        self.precision = precision
        self.ctx_allowed = ctx_allowed
        self.group: Optional[str] = None  # the optimizer group whose update is being staged (its lr:GROUP metric)
        self.params: dict[str, int] = {}
        self.metrics: dict[str, int] = {}
        self.path_stack: list[str] = []
        self.seed = seed
        self.random_ops = 0
        self._step: Optional[int] = None
        self.activations: dict[str, int] = {}  # model path -> its forward's output (act/ diagnostics)
        self.taps: list[tuple[str, str, int]] = []  # (diagnostic name, reducer, node) from (diagnostic ...)

    def ctx_input(self, key: str) -> int:
        """`(ctx :KEY)`: an f32 scalar input the loop feeds at every step."""
        name = f"ctx.{key}"
        for i in self.builder.inputs:
            if i.name == name:
                return i.id
        return self.builder.input(name, "ctx", TensorType(dtype=DType.f32, shape=()))

    def step_input(self) -> int:
        """The step as an i64 scalar input (random ops are keyed by seed, step and node)."""
        if self._step is None:
            self._step = self.builder.input("rng.step", "ctx", TensorType(dtype=DType.i64, shape=()))
        return self._step

    def next_random_key(self) -> int:
        self.random_ops += 1
        return self.random_ops

    def param(self, p: "Param") -> Staged:
        if p.tie is not None:
            source, transpose = p.tie
            staged = self.param(source)
            if transpose:
                rank = staged.type.rank
                perm = list(range(rank - 2)) + [rank - 1, rank - 2]
                return Staged(self, self.builder.op("transpose", staged.id, perm=perm))
            return staged
        nid = self.params.get(p.path)
        if nid is None:
            nid = self.builder.input(p.path, "param", TensorType(dtype=p.dtype, shape=p.shape))
            self.params[p.path] = nid
        return Staged(self, nid)


class TensorLib:
    """Registers the tensor builtins into an interpreter. They stage into the program given
    to `tracing` (the pipeline traces objectives, forwards, updates and evaluations there)."""

    def __init__(self, interp: "Interpreter") -> None:
        self.interp = interp
        self.reg = Registry(interp)
        self.active: Optional[Tracer] = None
        self.islands = 0  # open f32 islands (with-numerics) in a :bf16 program
        self.probing: Optional[Probing] = None  # set by a probe compile (probes.py)

    @contextmanager
    def tracing(self, tracer: Tracer) -> Iterator[Tracer]:
        """Stage the tensor builtins called inside the block into TRACER."""
        previous, self.active = self.active, tracer
        if self.probing is not None:
            self.probing.tracers[id(tracer)] = tracer
        try:
            yield tracer
        finally:
            self.active = previous

    # -- values ------------------------------------------------------------------------------
    def tracer(self, fn: str) -> Tracer:
        tracer = self.active
        if tracer is None:
            raise lisp_error("T003", f"`{fn}` stages a tensor operation, which only happens inside forward, defobjective, defevaluate or an optimizer update", "PROGRAM-ERROR")
        return tracer

    def staged(self, fn: str, pos: int, x: Any, like: Optional[TensorType] = None) -> Staged:
        """X as a staged tensor: parameters become inputs; numbers become constants of LIKE's
        dtype (weak literals) or f32."""
        from .models import Param

        if type(x) in PROBES:  # a knob's probe becomes a constant without being looked at
            x = x.plain()
        if type(x) is Staged:
            if self.islands and x.type.dtype in (DType.bf16, DType.f16):
                return self.op(fn, "cast", x, dtype="f32")
            return x
        if type(x) is Param:
            tracer = self.tracer(fn)
            staged = tracer.param(x)
            if tracer.precision == DType.bf16 and not self.islands and staged.type.dtype == DType.f32:
                return self.op(fn, "cast", staged, dtype="bf16")
            return staged
        if is_number(x):
            tracer = self.tracer(fn)
            dtype = like.dtype if like is not None else DType.f32
            if not dtype.is_float and type(x) is not int and not (type(x) is float and x.is_integer()):
                raise lisp_error("T001", f"{fn}: the number {x} cannot meet the integer tensor {like} without a cast; use (cast x :f32)", "TYPE-ERROR")
            value: Any = float(x) if dtype.is_float else int(x)
            if dtype == DType.bool:
                value = bool(x)
            return Staged(tracer, self.node(fn, lambda b: b.const(value, dtype)))
        raise type_error(fn, pos, "a tensor or a number", x)

    def node(self, fn: str, make: Callable[[Builder], int]) -> int:
        tracer = self.tracer(fn)
        builder = tracer.builder
        loc = self.interp.call_loc
        builder.loc = str(loc) if loc is not None else None
        user = self.interp.user_loc
        builder.site = str(user) if loc is not None and user is not None and loc.file.startswith(LIBRARY_FILES) else None
        builder.path = tracer.path_stack[-1] if tracer.path_stack else None
        try:
            return make(builder)
        except OpError as exc:
            message = str(exc)
            if not message.startswith(fn):
                message = f"{fn}: {message}"
            raise lisp_error("T001", message, "TYPE-ERROR") from None

    def op(self, fn: str, name: str, *args: Staged, **attrs: Any) -> Staged:
        tracer = args[0].tracer if args else self.tracer(fn)
        return Staged(tracer, self.node(fn, lambda b: b.op(name, *(a.id for a in args), **attrs)))

    def pair(self, fn: str, a: Any, b: Any) -> tuple[Staged, Staged]:
        """Two operands with promotion: numbers take the tensor's dtype; two float dtypes
        meet at the wider; integer and float tensors need an explicit cast."""
        from .models import Param

        def tensor_type(x: Any) -> Optional[TensorType]:
            if type(x) is Staged:
                return x.type
            if type(x) is Param:
                return TensorType(dtype=x.dtype, shape=x.shape)
            return None

        ta, tb = tensor_type(a), tensor_type(b)
        sa = self.staged(fn, 1, a, ta or tb)
        sb = self.staged(fn, 2, b, tb or ta)
        da, db = sa.type.dtype, sb.type.dtype
        if da != db:
            if da.is_float and db.is_float:
                wide = promote_floats(da, db)
                sa, sb = self.cast_to(fn, sa, wide), self.cast_to(fn, sb, wide)
            else:
                raise lisp_error("T001", f"{fn}: {sa.type} and {sb.type} mix element types; use (cast x :{da.value}) to convert one", "TYPE-ERROR")
        return sa, sb

    def cast_to(self, fn: str, x: Staged, dtype: DType) -> Staged:
        if x.type.dtype == dtype:
            return x
        return self.op(fn, "cast", x, dtype=dtype.value)

    # -- registration helpers -------------------------------------------------------------
    def generic(self, name: str, tensor_fn: Callable[..., Any]) -> None:
        """Extend the builtin NAME: any tensor argument stages, numbers compute as before."""
        from .models import Param

        sym = self.interp.sym(name)
        original: Optional[Builtin] = self.interp.functions.get(sym)
        tensors = (Staged, Param)
        low, high = arity(tensor_fn)
        interp = self.interp
        lib = self

        def on_tensors(args: tuple[Any, ...]) -> Any:
            if len(args) < low or (high is not None and len(args) > high):
                raise interp.arity_error(name, low, high, len(args))
            return tensor_fn(*args)

        def dispatch(*args: Any) -> Any:
            if original is None:
                return on_tensors(args)
            for a in args:
                if type(a) in tensors:
                    return on_tensors(args)
            if lib.probing is not None:  # arithmetic on a knob's probe, in Lisp numbers: the knob is seen
                for a in args:
                    if type(a) in PROBES:
                        a.probing.observe(a.knob)
            return original.fn(*args)

        min_args = original.min_args if original is not None else 1
        max_args = original.max_args if original is not None else None
        self.interp.functions[sym] = Builtin(name, dispatch, min_args, max_args)
        if original is not None:
            # generated code may inline it as the original on numbers (codegen.py)
            self.interp.inline_aliases[dispatch] = original.fn

    def add(self, name: str, fn: Callable[..., Any]) -> None:
        self.reg.add(name, fn)

    # -- installation --------------------------------------------------------------------------
    def install(self) -> None:
        self.install_arithmetic()
        self.install_unary()
        self.install_reductions()
        self.install_shape()
        self.install_creation()
        self.install_composites()
        self.install_images()
        self.interp.non_boolean_types.add(Staged)
        self.interp.truth_error = truth_error

    def fold(self, fn: str, op: str, args: tuple[Any, ...], identity: Optional[float]) -> Any:
        if not args:
            return identity
        acc = args[0]
        for x in args[1:]:
            a, b = self.pair(fn, acc, x)
            acc = self.op(fn, op, a, b)
        return acc if len(args) > 1 else self.staged(fn, 1, acc)

    def install_arithmetic(self) -> None:
        self.generic("+", lambda *xs: self.fold("+", "add", xs, 0))
        self.generic("*", lambda *xs: self.fold("*", "mul", xs, 1))

        def minus(x: Any, *xs: Any) -> Any:
            if not xs:
                return self.op("-", "neg", self.staged("-", 1, x))
            return self.fold("-", "sub", (x, *xs), None)

        def divide(x: Any, *xs: Any) -> Any:
            if not xs:
                return self.fold("/", "div", (1.0, x), None)
            return self.fold("/", "div", (x, *xs), None)

        self.generic("-", minus)
        self.generic("/", divide)
        for lisp, op in [("=", "eq"), ("/=", "ne"), ("<", "lt"), (">", "gt"), ("<=", "le"), (">=", "ge")]:
            self.generic(lisp, self.comparison(lisp, op))
        self.generic("expt", lambda a, b: self.binary("expt", "pow", a, b))
        for name, op in [("maximum", "maximum"), ("minimum", "minimum"), ("pow", "pow")]:
            self.add(name, self.binary_fn(name, op))
        for name, op in [("logical-and", "logical_and"), ("logical-or", "logical_or")]:
            self.add(name, self.binary_fn(name, op))
        self.add("logical-not", lambda x: self.op("logical-not", "logical_not", self.staged("logical-not", 1, x)))

        def where(c: Any, a: Any, b: Any) -> Any:
            sc = self.staged("where", 1, c)
            sa, sb = self.pair("where", a, b)
            return self.op("where", "where", sc, sa, sb)

        self.add("where", where)

        def cast(x: Any, dtype: Any) -> Any:
            return self.cast_to("cast", self.staged("cast", 1, x), self.dtype_arg("cast", 2, dtype))

        self.add("cast", cast)

    def comparison(self, lisp: str, op: str) -> Callable[..., Any]:
        def compare(a: Any, b: Any) -> Any:
            return self.binary(lisp, op, a, b)

        return compare

    def binary(self, fn: str, op: str, a: Any, b: Any) -> Staged:
        sa, sb = self.pair(fn, a, b)
        return self.op(fn, op, sa, sb)

    def binary_fn(self, fn: str, op: str) -> Callable[[Any, Any], Any]:
        return lambda a, b: self.binary(fn, op, a, b)

    def install_unary(self) -> None:
        for lisp, op in [("exp", "exp"), ("log", "log"), ("sqrt", "sqrt"), ("abs", "abs"), ("sin", "sin"), ("cos", "cos"), ("tanh", "tanh")]:
            self.generic(lisp, self.unary_fn(lisp, op))
        self.generic("signum", self.unary_fn("signum", "sign"))
        for lisp, op in [("neg", "neg"), ("sign", "sign"), ("log1p", "log1p"), ("rsqrt", "rsqrt"), ("square", "square"), ("sigmoid", "sigmoid"), ("relu", "relu"),
                         ("stop-gradient", "stop_gradient")]:
            self.add(lisp, self.unary_fn(lisp, op))

        def gelu(x: Any) -> Any:
            # tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            s = self.staged("gelu", 1, x)
            inner = self.mul(self.add2(s, self.mul(self.mul(self.mul(s, s), s), 0.044715)), math.sqrt(2.0 / math.pi))
            return self.mul(self.mul(s, 0.5), self.add2(self.op("gelu", "tanh", inner), 1.0))

        def silu(x: Any) -> Any:
            s = self.staged("silu", 1, x)
            return self.mul(s, self.op("silu", "sigmoid", s))

        def clamp(x: Any, low: Any, high: Any) -> Any:
            s = self.staged("clamp", 1, x)
            return self.binary("clamp", "minimum", self.binary("clamp", "maximum", s, low), high)

        self.add("gelu", gelu)
        self.add("silu", silu)
        self.add("clamp", clamp)

    def unary_fn(self, fn: str, op: str) -> Callable[[Any], Any]:
        return lambda x: self.op(fn, op, self.staged(fn, 1, x))

    def mul(self, a: Any, b: Any) -> Staged:
        return self.binary("*", "mul", a, b)

    def add2(self, a: Any, b: Any) -> Staged:
        return self.binary("+", "add", a, b)

    # -- reductions -----------------------------------------------------------------------------
    def axis_keys(self, fn: str, args: tuple[Any, ...], first: int) -> tuple[Any, bool]:
        keys = parse_keys(fn, args, {"AXIS", "KEEPDIMS"}, first)
        axis = keys.get("AXIS", NIL)
        if axis is NIL:
            axis_value: Any = None
        elif type(axis) is int:
            axis_value = axis
        else:
            axis_value = [self.int_arg(fn, first, a) for a in list_items(fn, first, axis)]
        return axis_value, keys.get("KEEPDIMS", NIL) is not NIL

    def wide(self, fn: str, x: Any) -> Staged:
        """X for an f32 island: reductions, norms and losses compute in f32 in :bf16 runs."""
        s = self.staged(fn, 1, x)
        if s.type.dtype in (DType.bf16, DType.f16):
            return self.op(fn, "cast", s, dtype="f32")
        return s

    def narrow(self, fn: str, x: Staged, like: DType) -> Staged:
        """Leave an island: back to the dtype the input had."""
        return self.cast_to(fn, x, like) if like in (DType.bf16, DType.f16) else x

    def reduction(self, fn: str, op: str) -> Callable[..., Any]:
        def reduce(x: Any, *args: Any) -> Any:
            axis, keep = self.axis_keys(fn, args, 2)
            source = self.wide(fn, x) if op in ("sum", "mean") else self.staged(fn, 1, x)
            return self.op(fn, op, source, axis=axis, keepdims=keep)

        return reduce

    def install_reductions(self) -> None:
        self.add("sum", self.reduction("sum", "sum"))
        self.add("mean", self.reduction("mean", "mean"))
        self.add("argmax", self.reduction("argmax", "argmax"))

        def extreme(lisp: str, op: str, pairwise: str) -> Callable[..., Any]:
            def fn(x: Any, *rest: Any) -> Any:
                if rest and not (type(rest[0]) is Symbol and rest[0].is_keyword):
                    return self.fold(lisp, pairwise, (x, *rest), None)
                axis, keep = self.axis_keys(lisp, rest, 2)
                return self.op(lisp, op, self.staged(lisp, 1, x), axis=axis, keepdims=keep)

            return fn

        self.generic("max", extreme("max", "max", "maximum"))
        self.generic("min", extreme("min", "min", "minimum"))

        def logsumexp(x: Any, *args: Any) -> Any:
            axis, keep = self.axis_keys("logsumexp", args, 2)
            s = self.wide("logsumexp", x)
            peak = self.shift("logsumexp", s, axis)
            total = self.op("logsumexp", "sum", self.op("logsumexp", "exp", self.binary("logsumexp", "sub", s, peak)), axis=axis, keepdims=True)
            result = self.add2(self.op("logsumexp", "log", total), peak)
            return result if keep else self.squeeze_axes("logsumexp", result, axis)

        def var(x: Any, *args: Any) -> Any:
            axis, keep = self.axis_keys("var", args, 2)
            s = self.wide("var", x)
            mean = self.op("var", "mean", s, axis=axis, keepdims=True)
            dev = self.binary("var", "sub", s, mean)
            return self.op("var", "mean", self.mul(dev, dev), axis=axis, keepdims=keep)

        self.add("logsumexp", logsumexp)
        self.add("var", var)

    def squeeze_axes(self, fn: str, x: Staged, axis: Any) -> Staged:
        shape = x.type.shape
        axes = set(range(len(shape))) if axis is None else {a % len(shape) for a in ([axis] if isinstance(axis, int) else axis)}
        return self.op(fn, "reshape", x, shape=[d for i, d in enumerate(shape) if i not in axes])

    # -- shape ---------------------------------------------------------------------------------------
    def looked_at(self, x: Any) -> Any:
        """X, with a knob's probe seen for its value (a shape, an axis: the knob reaches the
        program's structure) and given as its poison."""
        if type(x) in PROBES:
            x.probing.observe(x.knob)
            return x.plain()
        return x

    def shape_arg(self, fn: str, pos: int, x: Any) -> list[int]:
        x = self.looked_at(x)
        if type(x) is int:
            return [x]
        dims = [self.looked_at(d) for d in list_items(fn, pos, x)]
        for d in dims:
            if type(d) is not int or d < 0:
                raise type_error(fn, pos, "a shape: a list of non-negative integers", x)
        return dims

    def float_arg(self, fn: str, x: Any, pos: int = 3) -> float:
        """A number given as a keyword's value (such as :eps: an integer, a float or a ratio), as a float."""
        x = self.looked_at(x)
        if not is_number(x):
            raise type_error(fn, pos, "a number", x)
        return float(x)

    def int_arg(self, fn: str, pos: int, x: Any) -> int:
        x = self.looked_at(x)
        if type(x) is not int:
            raise type_error(fn, pos, "an integer", x)
        return x

    def dtype_arg(self, fn: str, pos: int, x: Any) -> DType:
        if type(x) is Symbol and x.is_keyword:
            try:
                return DType(x.name.lower())
            except ValueError:
                pass
        raise type_error(fn, pos, "a dtype keyword (:f32 :bf16 :f16 :f64 :i32 :i64 :bool)", x)

    def install_shape(self) -> None:
        def reshape(x: Any, shape: Any) -> Any:
            s = self.staged("reshape", 1, x)
            dims = self.shape_arg("reshape", 2, shape) if not (type(shape) is Cons and -1 in list(shape)) else list(shape)
            if -1 in dims:
                known = 1
                for d in dims:
                    if d != -1:
                        known *= d
                dims = [s.type.size // max(known, 1) if d == -1 else d for d in dims]
            return self.op("reshape", "reshape", s, shape=dims)

        def transpose(x: Any, *perm: Any) -> Any:
            s = self.staged("transpose", 1, x)
            rank = s.type.rank
            order = [self.int_arg("transpose", 2, p) for p in list_items("transpose", 2, perm[0])] if perm else list(range(rank))[::-1] if rank != 2 else [1, 0]
            if not perm and rank > 2:
                order = list(range(rank - 2)) + [rank - 1, rank - 2]
            return self.op("transpose", "transpose", s, perm=order)

        def permute(x: Any, perm: Any) -> Any:
            return self.op("permute", "transpose", self.staged("permute", 1, x), perm=self.shape_arg("permute", 2, perm))

        def broadcast_to(x: Any, shape: Any) -> Any:
            return self.op("broadcast-to", "broadcast_to", self.staged("broadcast-to", 1, x), shape=self.shape_arg("broadcast-to", 2, shape))

        def squeeze(x: Any, *args: Any) -> Any:
            s = self.staged("squeeze", 1, x)
            keys = parse_keys("squeeze", args, {"AXIS"}, 2)
            axis = keys.get("AXIS", NIL)
            shape = s.type.shape
            axes = {i for i, d in enumerate(shape) if d == 1} if axis is NIL else {self.int_arg("squeeze", 3, axis) % max(len(shape), 1)}
            for a in axes:
                if shape[a] != 1:
                    raise lisp_error("T001", f"squeeze: axis {a} of {s.type} has size {shape[a]}, not 1", "TYPE-ERROR")
            return self.op("squeeze", "reshape", s, shape=[d for i, d in enumerate(shape) if i not in axes])

        def unsqueeze(x: Any, *args: Any) -> Any:
            s = self.staged("unsqueeze", 1, x)
            keys = parse_keys("unsqueeze", args, {"AXIS"}, 2)
            axis = self.int_arg("unsqueeze", 3, keys.get("AXIS", 0))
            shape = list(s.type.shape)
            axis = axis % (len(shape) + 1)
            shape.insert(axis, 1)
            return self.op("unsqueeze", "reshape", s, shape=shape)

        def concat(xs: Any, *args: Any) -> Any:
            keys = parse_keys("concat", args, {"AXIS"}, 2)
            parts = [self.staged("concat", 1, x) for x in list_items("concat", 1, xs)]
            if not parts:
                raise lisp_error("T001", "concat: needs at least one tensor", "TYPE-ERROR")
            return self.op("concat", "concat", *parts, axis=self.int_arg("concat", 3, keys.get("AXIS", 0)))

        def stack(xs: Any, *args: Any) -> Any:
            keys = parse_keys("stack", args, {"AXIS"}, 2)
            axis = self.int_arg("stack", 3, keys.get("AXIS", 0))
            parts = [unsqueeze(x, self.interp.kw("axis"), axis) for x in list_items("stack", 1, xs)]
            return self.op("stack", "concat", *parts, axis=axis)

        def slice_(x: Any, *bounds: Any) -> Any:
            s = self.staged("slice", 1, x)
            shape = s.type.shape
            starts, stops = [0] * len(shape), list(shape)
            for axis, bound in enumerate(bounds):
                if bound is NIL or bound is T:
                    continue
                lo, hi = (list_items("slice", axis + 2, bound) + [NIL, NIL])[:2]
                start = 0 if lo is NIL else self.int_arg("slice", axis + 2, lo)
                starts[axis] = start + shape[axis] if start < 0 else start
                stops[axis] = shape[axis] if hi is NIL else (self.int_arg("slice", axis + 2, hi) if hi >= 0 else shape[axis] + hi)
            return self.op("slice", "slice", s, starts=starts, stops=stops)

        def split(x: Any, sizes: Any, *args: Any) -> Any:
            s = self.staged("split", 1, x)
            keys = parse_keys("split", args, {"AXIS"}, 3)
            axis = self.int_arg("split", 4, keys.get("AXIS", 0)) % s.type.rank
            widths = self.shape_arg("split", 2, sizes)
            if len(widths) == 1 and s.type.shape[axis] % widths[0] == 0:
                widths = [s.type.shape[axis] // widths[0]] * widths[0]
            if sum(widths) != s.type.shape[axis]:
                raise lisp_error("T001", f"split: sizes {widths} do not add up to axis {axis} of {s.type}", "TYPE-ERROR")
            out, start = [], 0
            for w in widths:
                starts, stops = [0] * s.type.rank, list(s.type.shape)
                starts[axis], stops[axis] = start, start + w
                out.append(self.op("split", "slice", s, starts=starts, stops=stops))
                start += w
            return to_lisp_list(out)

        def take(x: Any, idx: Any, *args: Any) -> Any:
            keys = parse_keys("take", args, {"AXIS"}, 3)
            return self.op("take", "take", self.staged("take", 1, x), self.staged("take", 2, idx), axis=self.int_arg("take", 4, keys.get("AXIS", 0)))

        def matmul(a: Any, b: Any) -> Any:
            sa, sb = self.pair("matmul", a, b)
            va, vb = sa.type.rank == 1, sb.type.rank == 1
            if va:
                sa = self.op("matmul", "reshape", sa, shape=[1, sa.type.shape[0]])
            if vb:
                sb = self.op("matmul", "reshape", sb, shape=[sb.type.shape[0], 1])
            out = self.op("matmul", "matmul", sa, sb)
            if va or vb:
                shape = list(out.type.shape)
                if vb:
                    shape.pop(-1)
                if va:
                    shape.pop(-2 if vb is False else -1)
                out = self.op("matmul", "reshape", out, shape=shape)
            return out

        for name, fn in [("reshape", reshape), ("transpose", transpose), ("permute", permute), ("broadcast-to", broadcast_to), ("squeeze", squeeze),
                         ("unsqueeze", unsqueeze), ("concat", concat), ("stack", stack), ("slice", slice_), ("split", split), ("take", take), ("matmul", matmul)]:
            self.add(name, fn)

        def shape_of(x: Any) -> Any:
            return to_lisp_list(self.tensor_type("shape", x).shape)

        def dtype_of(x: Any) -> Any:
            return self.interp.kw(self.tensor_type("dtype", x).dtype.value)

        def rank_of(x: Any) -> Any:
            return self.tensor_type("rank", x).rank

        self.add("shape", shape_of)
        self.add("dtype", dtype_of)
        self.add("rank", rank_of)
        self.add("tensorp", lambda x: T if type(x) is Staged else NIL)

    def tensor_type(self, fn: str, x: Any) -> TensorType:
        from .models import Param

        if type(x) is Staged:
            return x.type
        if type(x) is Param:
            return TensorType(dtype=x.dtype, shape=x.shape)
        raise type_error(fn, 1, "a tensor", x)

    # -- creation --------------------------------------------------------------------------------------
    def install_creation(self) -> None:
        def creator(fn: str, value: float) -> Callable[..., Any]:
            def make(shape: Any, *args: Any) -> Any:
                keys = parse_keys(fn, args, {"DTYPE"}, 2)
                dtype = self.dtype_arg(fn, 3, keys.get("DTYPE", self.interp.kw("f32")))
                dims = self.shape_arg(fn, 1, shape)
                return Staged(self.tracer(fn), self.node(fn, lambda b: b.op("full", value=value, dtype=dtype.value, shape=dims)))

            return make

        self.add("zeros", creator("zeros", 0.0))
        self.add("ones", creator("ones", 1.0))

        def full(shape: Any, value: Any, *args: Any) -> Any:
            keys = parse_keys("full", args, {"DTYPE"}, 3)
            dtype = self.dtype_arg("full", 4, keys.get("DTYPE", self.interp.kw("f32")))
            dims = self.shape_arg("full", 1, shape)
            if not is_number(value):
                raise type_error("full", 2, "a number", value)
            v = float(value) if dtype.is_float else int(value)
            return Staged(self.tracer("full"), self.node("full", lambda b: b.op("full", value=v, dtype=dtype.value, shape=dims)))

        def arange(n: Any, *args: Any) -> Any:
            keys = parse_keys("arange", args, {"DTYPE", "START", "STEP"}, 2)
            dtype = self.dtype_arg("arange", 3, keys.get("DTYPE", self.interp.kw("i32")))
            count = self.int_arg("arange", 1, n)
            return Staged(self.tracer("arange"), self.node("arange", lambda b: b.op("arange", dtype=dtype.value, shape=[count], start=keys.get("START", 0), step=keys.get("STEP", 1))))

        def tensor(data: Any, *args: Any) -> Any:
            keys = parse_keys("tensor", args, {"DTYPE"}, 2)
            dtype = self.dtype_arg("tensor", 3, keys.get("DTYPE", self.interp.kw("f32")))
            values, shape = self.nested("tensor", data)
            flat = [float(v) if dtype.is_float else int(v) for v in values]
            return Staged(self.tracer("tensor"), self.node("tensor", lambda b: b.op("constant", data=flat, dtype=dtype.value, shape=shape)))

        def tril_mask(n: Any, *args: Any) -> Any:
            keys = parse_keys("tril-mask", args, {"COLS", "K"}, 2)
            rows = self.int_arg("tril-mask", 1, n)
            cols = self.int_arg("tril-mask", 3, keys.get("COLS", rows))
            return Staged(self.tracer("tril-mask"), self.node("tril-mask", lambda b: b.op("tril_mask", dtype="bool", shape=[rows, cols], k=keys.get("K", 0))))

        def random_op(fn: str, op: str, defaults: dict[str, float]) -> Callable[..., Any]:
            def make(shape: Any, *args: Any) -> Any:
                keys = parse_keys(fn, args, {"DTYPE", *(k.upper() for k in defaults)}, 2)
                dtype = self.dtype_arg(fn, 3, keys.get("DTYPE", self.interp.kw("f32")))
                dims = self.shape_arg(fn, 1, shape)
                tracer = self.tracer(fn)
                step = tracer.step_input()
                attrs = {k: float(keys.get(k.upper(), v)) for k, v in defaults.items()}
                key = tracer.next_random_key()
                return Staged(tracer, self.node(fn, lambda b: b.op(op, step, shape=dims, dtype=dtype.value, seed=tracer.seed % 2**32, key=key, **attrs)))

            return make

        def dropout_mask(shape: Any, rate: Any) -> Any:
            dims = self.shape_arg("dropout-mask", 1, shape)
            if type(rate) not in (int, float) or not 0 <= rate <= 1:
                raise type_error("dropout-mask", 2, "a rate between 0 and 1", rate)
            tracer = self.tracer("dropout-mask")
            step = tracer.step_input()
            key = tracer.next_random_key()
            return Staged(tracer, self.node("dropout-mask", lambda b: b.op("dropout_mask", step, shape=dims, rate=float(rate), seed=tracer.seed % 2**32, key=key)))

        self.add("random-normal", random_op("random-normal", "random_normal", {"mean": 0.0, "std": 1.0}))
        self.add("random-uniform", random_op("random-uniform", "random_uniform", {"low": 0.0, "high": 1.0}))
        self.add("dropout-mask", dropout_mask)
        self.add("full", full)
        self.add("arange", arange)
        self.add("tensor", tensor)
        self.add("tril-mask", tril_mask)

    def nested(self, fn: str, data: Any) -> tuple[list[Any], list[int]]:
        if is_number(data):
            return [data], []
        items = list(data) if isinstance(data, list) else list_items(fn, 1, data)  # a vector or bit vector, else a list
        if not items:
            return [], [0]
        parts = [self.nested(fn, x) for x in items]
        inner = parts[0][1]
        if any(p[1] != inner for p in parts):
            raise lisp_error("T001", f"{fn}: ragged nested list; every row needs the same shape", "TYPE-ERROR")
        return [v for p in parts for v in p[0]], [len(items)] + inner

    # -- composites ----------------------------------------------------------------------------------------
    def shift(self, fn: str, s: Any, axis: Any) -> Any:
        """The maximum along AXIS (kept), subtracted before an exp for stability. logsumexp
        does not change with it, so its gradient is zero: it is a stop-gradient, and the
        backward pass has no path through the max (no mask, no extra reduction, nothing
        saved for it). (softmax and log-softmax are ops of their own, with closed-form
        gradients.)"""
        return self.op(fn, "stop_gradient", self.op(fn, "max", s, axis=axis, keepdims=True))

    def install_composites(self) -> None:
        def softmax(x: Any, *args: Any) -> Any:
            axis = self.single_axis("softmax", args)
            like = self.staged("softmax", 1, x).type.dtype
            return self.narrow("softmax", self.op("softmax", "softmax", self.wide("softmax", x), axis=axis), like)

        def log_softmax(x: Any, *args: Any) -> Any:
            axis = self.single_axis("log-softmax", args)
            return self.op("log-softmax", "log_softmax", self.wide("log-softmax", x), axis=axis)

        def one_hot(idx: Any, n: Any, *args: Any) -> Any:
            keys = parse_keys("one-hot", args, {"DTYPE"}, 3)
            dtype = self.dtype_arg("one-hot", 4, keys.get("DTYPE", self.interp.kw("f32")))
            s = self.staged("one-hot", 1, idx)
            count = self.int_arg("one-hot", 2, n)
            classes = Staged(s.tracer, self.node("one-hot", lambda b: b.op("arange", dtype=s.type.dtype.value, shape=[count])))
            expanded = self.op("one-hot", "reshape", s, shape=list(s.type.shape) + [1])
            return self.cast_to("one-hot", self.op("one-hot", "eq", expanded, classes), dtype)

        def layer_norm(x: Any, *args: Any) -> Any:
            keys = parse_keys("layer-norm", args, {"EPS", "WEIGHT", "BIAS"}, 2)
            like = self.staged("layer-norm", 1, x).type.dtype
            out = self.op("layer-norm", "layer_norm", self.wide("layer-norm", x), eps=self.float_arg("layer-norm", keys.get("EPS", 1e-5)))
            return self.affine("layer-norm", self.narrow("layer-norm", out, like), keys)

        def rms_norm(x: Any, *args: Any) -> Any:
            keys = parse_keys("rms-norm", args, {"EPS", "WEIGHT", "BIAS"}, 2)
            like = self.staged("rms-norm", 1, x).type.dtype
            out = self.op("rms-norm", "rms_norm", self.wide("rms-norm", x), eps=self.float_arg("rms-norm", keys.get("EPS", 1e-6)))
            return self.affine("rms-norm", self.narrow("rms-norm", out, like), keys)

        def einsum(spec: Any, *operands: Any) -> Any:
            from .einsum import stage_einsum

            if type(spec) is not str:
                raise type_error("einsum", 1, 'a subscript string like "bij,bjk->bik"', spec)
            return stage_einsum(self, spec, [self.staged("einsum", i + 2, x) for i, x in enumerate(operands)])

        def attention(q: Any, k: Any, v: Any, *args: Any) -> Any:
            """(attention q k v &key (causal t) scale): q, k, v [..., S, H, D] (S positions of H
            heads of width D); per head softmax(q k^T * scale + mask) v, one op (its gradient in
            closed form; fused on a device); SCALE defaults to 1/sqrt(D). Computed in f32 in a
            :bf16 run, its result rounded once."""
            keys = parse_keys("attention", args, {"CAUSAL", "SCALE"}, 4)
            sq, sk, sv = (self.staged("attention", i + 1, x) for i, x in enumerate((q, k, v)))
            width = sq.type.shape[-1] if sq.type.rank else 1
            scale = self.float_arg("attention", keys["SCALE"], 5) if "SCALE" in keys else 1.0 / math.sqrt(width)
            return self.op("attention", "attention", sq, sk, sv, causal=keys.get("CAUSAL", T) is not NIL, scale=scale)

        def with_numerics(dtype: Any, thunk: Any) -> Any:
            """(with-numerics (:f32) body...): BODY's tensor ops run in f32 in a :bf16 run;
            its tensor result goes back to bf16 at the island's exit."""
            if self.dtype_arg("with-numerics", 1, dtype) != DType.f32:
                raise type_error("with-numerics", 1, "(:f32), the only island dtype", dtype)
            self.islands += 1
            try:
                result = self.interp.call(thunk)
            finally:
                self.islands -= 1
            if type(result) is Staged and result.tracer.precision == DType.bf16 and not self.islands and result.type.dtype == DType.f32:
                return self.op("with-numerics", "cast", result, dtype="bf16")
            return result

        self.add("%with-numerics", with_numerics)
        self.add("softmax", softmax)
        self.add("log-softmax", log_softmax)
        self.add("one-hot", one_hot)
        self.add("layer-norm", layer_norm)
        self.add("rms-norm", rms_norm)
        # the standard modules shadow these names with layers; they reach the ops here
        self.add("%layer-norm", layer_norm)
        self.add("%rms-norm", rms_norm)
        self.add("einsum", einsum)
        self.add("attention", attention)

    # -- images ------------------------------------------------------------------------------------------
    def install_images(self) -> None:
        """(conv2d x w &key (stride 1) (padding 0) (dilation 1) (groups 1)), (max-pool2d x
        kernel &key stride padding), (avg-pool2d x kernel &key stride padding): NCHW; each
        size option is an integer (both axes) or a list of two (height, width); a pool's
        stride defaults to its kernel."""

        def pair_arg(fn: str, pos: int, x: Any, least: int) -> list[int]:
            items = [x, x] if type(x) is int else list_items(fn, pos, x) if type(x) is Cons else None
            if items is None or len(items) != 2 or any(type(v) is not int or v < least for v in items):
                what = "a positive integer" if least > 0 else "a non-negative integer"
                raise type_error(fn, pos, f"{what} or a list of two", x)
            return items

        def key_pos(args: tuple[Any, ...], first: int, name: str) -> int:
            """The argument position of keyword NAME's value (for messages)."""
            for i in range(0, len(args) - 1, 2):
                if type(args[i]) is Symbol and args[i].name == name:
                    return first + i + 1
            return first

        def conv2d(x: Any, w: Any, *args: Any) -> Any:
            keys = parse_keys("conv2d", args, {"STRIDE", "PADDING", "DILATION", "GROUPS"}, 3)
            attrs: dict[str, Any] = {}
            for name, default in (("STRIDE", 1), ("PADDING", 0), ("DILATION", 1)):
                attrs[name.lower()] = pair_arg("conv2d", key_pos(args, 3, name), keys.get(name, default), default)
            groups = keys.get("GROUPS", 1)
            if type(groups) is not int or groups < 1:
                raise type_error("conv2d", key_pos(args, 3, "GROUPS"), "a positive integer", groups)
            attrs["groups"] = groups
            sx, sw = self.pair("conv2d", x, w)
            return self.op("conv2d", "conv2d", sx, sw, **attrs)

        def pool(fn: str, op: str) -> Callable[..., Any]:
            def run(x: Any, kernel: Any, *args: Any) -> Any:
                keys = parse_keys(fn, args, {"STRIDE", "PADDING"}, 3)
                size = pair_arg(fn, 2, kernel, 1)
                stride = pair_arg(fn, key_pos(args, 3, "STRIDE"), keys["STRIDE"], 1) if keys.get("STRIDE", NIL) is not NIL else list(size)
                padding = pair_arg(fn, key_pos(args, 3, "PADDING"), keys.get("PADDING", 0), 0)
                return self.op(fn, op, self.staged(fn, 1, x), kernel=size, stride=stride, padding=padding)

            return run

        self.add("conv2d", conv2d)
        self.add("max-pool2d", pool("max-pool2d", "max_pool2d"))
        self.add("avg-pool2d", pool("avg-pool2d", "avg_pool2d"))

    def single_axis(self, fn: str, args: tuple[Any, ...]) -> int:
        keys = parse_keys(fn, args, {"AXIS"}, 2)
        return self.int_arg(fn, 3, keys.get("AXIS", -1))

    def affine(self, fn: str, x: Staged, keys: dict[str, Any]) -> Staged:
        if keys.get("WEIGHT", NIL) is not NIL:
            x = self.mul(x, keys["WEIGHT"])
        if keys.get("BIAS", NIL) is not NIL:
            x = self.add2(x, keys["BIAS"])
        return x


def arity(fn: Callable[..., Any]) -> tuple[int, Optional[int]]:
    """How many positional arguments FN takes: (least, most or None)."""
    import inspect

    params = inspect.signature(fn).parameters.values()
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    variadic = any(p.kind == p.VAR_POSITIONAL for p in params)
    return sum(1 for p in positional if p.default is p.empty), None if variadic else len(positional)


def truth_error(value: Any) -> LispError:
    return lisp_error(
        "T002",
        f"a staged tensor ({value.type}) is used as a truth value; control flow runs at compile time and data flow is staged: use (where c a b)",
        "TYPE-ERROR",
    )
