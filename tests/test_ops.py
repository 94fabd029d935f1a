"""The op table against numerical oracles: every op with a gradient rule is checked in f64
with the dot-product test against central finite differences; every kernel gives the same
result with and without a preallocated `out=` buffer; every built program passes the IR
checker; the counter-based random ops reproduce Philox4x32-10 (Random123 known answers)
and have the documented statistics.

The case tables (GRAD_CASES, FORWARD_CASES) are shared with test_ops_torch.py. An op added
to the table without an entry here fails `test_every_op_has_cases`.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import pytest

from sexpgpu.compile.autodiff import backward
from sexpgpu.ir.builder import Builder
from sexpgpu.ir.check import check_program
from sexpgpu.ir.dtypes import DType, numpy_dtype, parse_dtype
from sexpgpu.ir.graph import TensorType
from sexpgpu.ir.ops import OpError, all_ops, op_def
from sexpgpu.ir.ops_random import dropout_threshold, philox4x32, random_words
from sexpgpu.runtime.numpy_backend import CompiledProgram

Shape = tuple[int, ...]
FLOAT = "<float>"  # in attrs: replaced by the float dtype under test (f64 here, f32 against torch)


# -- input generators ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Arg:
    """One tensor argument: its shape, how to draw it (as f64 or exact values), and its dtype
    (None: the float dtype under test, and differentiable)."""

    shape: Shape
    make: Callable[[np.random.Generator], np.ndarray]
    dtype: Optional[str] = None

    @property
    def differentiable(self) -> bool:
        return self.dtype is None

    def type(self, float_dtype: str) -> TensorType:
        return TensorType(dtype=parse_dtype(self.dtype or float_dtype), shape=self.shape)

    def draw(self, rng: np.random.Generator, float_dtype: str) -> np.ndarray:
        value = np.asarray(self.make(rng))
        return value.astype(numpy_dtype(parse_dtype(self.dtype or float_dtype))).reshape(self.shape)


def F(*shape: int) -> Arg:
    """Standard normal."""
    return Arg(shape, lambda r: r.standard_normal(shape))


def P(*shape: int, lo: float = 0.5, hi: float = 2.0) -> Arg:
    """Positive, bounded away from 0 (log, sqrt, rsqrt, pow's base)."""
    return Arg(shape, lambda r: r.uniform(lo, hi, shape))


def A(*shape: int) -> Arg:
    """Away from 0 by at least 0.2 (abs, relu, a divisor): no kink within eps."""
    return Arg(shape, lambda r: r.choice([-1.0, 1.0], shape) * r.uniform(0.2, 2.0, shape))


def G(*shape: int, offset: float = 0.0) -> Arg:
    """On the grid 0.1 * (k + offset): two grids with offsets 0 and 0.5 never tie."""
    return Arg(shape, lambda r: 0.1 * (r.integers(-20, 20, shape) + offset))


def D(*shape: int) -> Arg:
    """Distinct values at least 0.1 apart (max/min reductions without ties)."""
    n = math.prod(shape)
    return Arg(shape, lambda r: (r.permutation(n) - n / 2).reshape(shape) * 0.1 + 0.01)


def I(values: Any, dtype: str = "i64") -> Arg:  # noqa: E743  (I for indices)
    array = np.asarray(values)
    return Arg(tuple(array.shape), lambda r: array, dtype)


def B(*shape: int) -> Arg:
    """A random boolean mask."""
    return Arg(shape, lambda r: r.random(shape) < 0.5, "bool")


def S(value: int, dtype: str = "i64") -> Arg:
    """An integer scalar (the step of the random ops)."""
    return Arg((), lambda r: np.asarray(value), dtype)


@dataclass(frozen=True)
class Case:
    args: list[Arg]
    attrs: dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        shapes = ", ".join(f"{a.dtype or 'float'}{list(a.shape)}" for a in self.args)
        return f"({shapes}) {self.attrs}"

    def resolved_attrs(self, float_dtype: str) -> dict[str, Any]:
        return {k: (float_dtype if v == FLOAT else v) for k, v in self.attrs.items()}


def _unary(gen: Callable[..., Arg]) -> list[Case]:
    return [Case([gen()]), Case([gen(5)]), Case([gen(2, 3, 4)])]


BROADCAST_PAIRS: list[tuple[Shape, Shape]] = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 3), (1, 5, 1)), ((), (3,)), ((2, 3), ()), ((4, 1), (1,))]


def _binary(first: Callable[..., Arg], second: Callable[..., Arg]) -> list[Case]:
    return [Case([first(*sa), second(*sb)]) for sa, sb in BROADCAST_PAIRS]


def _reductions(gen: Callable[..., Arg]) -> list[Case]:
    return [
        Case([gen(2, 3, 4)], {"axis": None}),
        Case([gen(2, 3, 4)], {"axis": 1}),
        Case([gen(2, 3, 4)], {"axis": -1, "keepdims": True}),
        Case([gen(2, 3, 4)], {"axis": [0, 2]}),
        Case([gen(2, 3, 4)], {"axis": [0, 2], "keepdims": True}),
        Case([gen(2, 3, 4)], {"axis": [0, 1, 2], "keepdims": True}),
        Case([gen(5)], {"axis": 0}),
        Case([gen(3, 4)], {"axis": []}),
        Case([gen()], {"axis": None}),
    ]


UNARY_INPUT: dict[str, Callable[..., Arg]] = {
    "neg": F, "abs": A, "exp": F, "log": P, "log1p": P, "sqrt": P, "rsqrt": P, "square": F,
    "tanh": F, "sigmoid": F, "relu": A, "sin": F, "cos": F,
}

GRAD_CASES: dict[str, list[Case]] = {name: _unary(gen) for name, gen in UNARY_INPUT.items()}
GRAD_CASES.update(
    {
        "add": _binary(F, F),
        "sub": _binary(F, F),
        "mul": _binary(F, F),
        "div": _binary(F, A),
        "pow": _binary(P, F),
        "maximum": _binary(lambda *s: G(*s, offset=0.5), G),
        "minimum": _binary(lambda *s: G(*s, offset=0.5), G),
        "cast": [Case([F(3, 4)], {"dtype": FLOAT}), Case([F()], {"dtype": FLOAT})],
        "where": [
            Case([B(3, 4), F(3, 4), F(3, 4)]),
            Case([B(3, 1), F(1, 4), F(3, 4)]),
            Case([B(2, 3), F(), F(3)]),
            Case([B(), F(2, 2), F(2, 1)]),
        ],
        "sum": _reductions(F),
        "mean": _reductions(F),
        "softmax": [Case([F(3, 5)]), Case([F(2, 4, 3)], {"axis": 1}), Case([F(6)], {"axis": 0})],
        "log_softmax": [Case([F(3, 5)]), Case([F(2, 4, 3)], {"axis": 1}), Case([F(6)], {"axis": 0})],
        "layer_norm": [Case([F(3, 5)], {"eps": 1e-5}), Case([F(2, 4, 6)], {"eps": 0.1})],
        "rms_norm": [Case([F(3, 5)], {"eps": 1e-6}), Case([F(2, 4, 6)], {"eps": 0.1})],
        "max": _reductions(D),
        "min": _reductions(D),
        "matmul": [
            Case([F(3, 4), F(4, 5)]),
            Case([F(2, 3, 4), F(4, 5)]),
            Case([F(2, 1, 3, 4), F(5, 4, 6)]),
            Case([F(4, 5), F(2, 5, 3)]),
            Case([F(1, 1), F(1, 1)]),
        ],
        "reshape": [
            Case([F(2, 3, 4)], {"shape": [6, 4]}),
            Case([F(3)], {"shape": [1, 3, 1]}),
            Case([F()], {"shape": [1, 1]}),
            Case([F(2, 3)], {"shape": [6]}),
        ],
        "transpose": [
            Case([F(2, 3, 4)], {"perm": [2, 0, 1]}),
            Case([F(3, 4)], {"perm": [1, 0]}),
            Case([F(5)], {"perm": [0]}),
        ],
        "broadcast_to": [
            Case([F(3)], {"shape": [2, 3]}),
            Case([F(3, 1)], {"shape": [2, 3, 4]}),
            Case([F()], {"shape": [2, 2]}),
            Case([F(1, 4)], {"shape": [3, 4]}),
            Case([F(2, 3)], {"shape": [2, 3]}),
        ],
        "concat": [
            Case([F(2, 3), F(4, 3)], {"axis": 0}),
            Case([F(2, 3), F(2, 1), F(2, 2)], {"axis": 1}),
            Case([F(2, 3, 1), F(2, 3, 2)], {"axis": -1}),
            Case([F(3)], {"axis": 0}),
        ],
        "slice": [
            Case([F(4, 5)], {"starts": [1, 0], "stops": [3, 5]}),
            Case([F(2, 3, 4)], {"starts": [0, 1, 1], "stops": [2, 3, 3]}),
            Case([F(6)], {"starts": [5], "stops": [6]}),
        ],
        "unslice": [
            Case([F(2, 3)], {"shape": [4, 5], "starts": [1, 2], "stops": [3, 5]}),
            Case([F(4)], {"shape": [7], "starts": [0], "stops": [4]}),
        ],
        "take": [
            Case([F(5, 3), I([0, 2, 2, 4, 0])], {"axis": 0}),
            Case([F(5, 3), I([[1, 1], [4, 0], [1, 3]])], {"axis": 0}),
            Case([F(3, 4), I([3, 0, 3], "i32")], {"axis": 1}),
            Case([F(2, 3, 4), I([[0, 3], [3, 3]])], {"axis": -1}),
            Case([F(2, 5, 2), I([[4, 4, 1]])], {"axis": 1}),
            Case([F(4), I(2)], {"axis": 0}),
        ],
        "scatter_add": [
            Case([F(5, 3), I([0, 2, 2, 4, 0])], {"shape": [5, 3], "axis": 0}),
            Case([F(2, 2, 3), I([[1, 1], [3, 0]])], {"shape": [4, 3], "axis": 0}),
            Case([F(2, 3), I([1, 1, 0])], {"shape": [2, 4], "axis": -1}),
            Case([F(2, 2, 2, 3), I([[0, 1], [1, 1]])], {"shape": [2, 2, 3], "axis": -2}),
            Case([F(3), I(1)], {"shape": [2, 3], "axis": 0}),
        ],
    }
)


# -- images (NCHW): conv2d and the pools, with their gradient ops (each differentiable too) --------
def _conv(stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1, **extra: Any) -> dict[str, Any]:
    return {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups, **extra}


def _pool(kernel: Any, stride: Any = None, padding: Any = 0, **extra: Any) -> dict[str, Any]:
    return {"kernel": kernel, "padding": padding, **({} if stride is None else {"stride": stride}), **extra}


GRAD_CASES.update(
    {
        "conv2d": [
            Case([F(2, 3, 5, 6), F(4, 3, 3, 3)]),  # defaults: stride 1, no padding
            Case([F(2, 3, 7, 7), F(4, 3, 3, 3)], _conv(stride=2, padding=1)),  # integers for both axes
            Case([F(1, 2, 8, 9), F(3, 2, 2, 3)], _conv(stride=[2, 3], padding=[1, 0], dilation=[2, 1])),  # rectangular, mixed
            Case([F(2, 4, 6, 5), F(6, 2, 3, 2)], _conv(stride=[1, 2], padding=[1, 1], groups=2)),
            Case([F(1, 3, 5, 5), F(3, 1, 3, 3)], _conv(padding=2, dilation=2, groups=3)),  # depthwise, dilated
            Case([F(2, 5, 3, 4), F(2, 5, 1, 1)]),  # 1x1
            Case([F(1, 1, 6, 7), F(1, 1, 3, 3)], _conv(stride=2)),  # the last row/column is in no window
            Case([F(1, 2, 1, 5), F(2, 2, 1, 5)], _conv(padding=[0, 2], stride=[1, 3])),
        ],
        "conv2d_input_grad": [
            Case([F(2, 4, 4, 4), F(4, 3, 3, 3)], _conv(stride=2, padding=1, input_shape=[2, 3, 7, 7])),
            Case([F(2, 4, 4, 4), F(4, 3, 3, 3)], _conv(stride=2, padding=1, input_shape=[2, 3, 8, 8])),  # same g, one more row
            Case([F(1, 6, 4, 3), F(6, 2, 2, 3)], _conv(stride=[1, 2], padding=[0, 1], dilation=[2, 1], groups=2, input_shape=[1, 4, 6, 6])),
        ],
        "conv2d_weight_grad": [
            Case([F(2, 3, 6, 5), F(2, 4, 4, 3)], _conv(weight_shape=[4, 3, 3, 3])),
            Case([F(1, 4, 7, 6), F(1, 6, 4, 2)], _conv(stride=[2, 3], padding=[1, 0], dilation=[1, 2], groups=2, weight_shape=[6, 2, 3, 2])),
        ],
        "max_pool2d": [
            Case([D(2, 3, 6, 6)], _pool(2)),  # stride defaults to the kernel
            Case([D(1, 2, 7, 8)], _pool([3, 2], stride=[2, 1], padding=[1, 1])),  # overlapping, padded
            Case([D(2, 1, 5, 7)], _pool(3, stride=[1, 2], padding=[1, 0])),
            Case([D(1, 2, 7, 8)], _pool([2, 3], stride=3)),  # gaps between windows
        ],
        "max_pool2d_grad": [
            Case([D(2, 3, 6, 6), F(2, 3, 3, 3)], _pool(2)),
            Case([D(1, 2, 7, 8), F(1, 2, 4, 9)], _pool([3, 2], stride=[2, 1], padding=[1, 1])),
        ],
        "max_pool2d_select": [
            Case([D(2, 3, 6, 6), F(2, 3, 6, 6)], _pool(2)),
            Case([D(1, 2, 7, 8), F(1, 2, 7, 8)], _pool([3, 2], stride=[2, 1], padding=[1, 1])),
        ],
        "avg_pool2d": [
            Case([F(2, 3, 6, 6)], _pool(2)),
            Case([F(1, 2, 7, 8)], _pool([3, 2], stride=[2, 1], padding=[1, 1])),  # padding counts as zeros
            Case([F(2, 1, 5, 7)], _pool(3, stride=[1, 2], padding=[1, 0])),
            Case([F(1, 2, 7, 8)], _pool([2, 3], stride=3)),
        ],
        "avg_pool2d_grad": [
            Case([F(2, 3, 3, 3)], _pool(2, input_shape=[2, 3, 6, 7])),
            Case([F(1, 2, 4, 9)], _pool([3, 2], stride=[2, 1], padding=[1, 1], input_shape=[1, 2, 7, 8])),
        ],
    }
)

# -- attention: q, k, v of one shape [..., S, H, D]; causal or not; lengths that are no multiple of any tile
GRAD_CASES["attention"] = [
    Case([F(2, 5, 1, 3)] * 3, {"causal": True, "scale": 3**-0.5}),
    Case([F(1, 7, 2, 4)] * 3, {"causal": True, "scale": 0.5}),
    Case([F(3, 6, 2, 2)] * 3, {"causal": False, "scale": 0.9}),
    Case([F(2, 1, 3, 3)] * 3, {"causal": True, "scale": 1.0}),  # one position: attends to itself
    Case([F(4, 3, 2)] * 3, {"causal": True, "scale": 0.7}),  # no batch axis
]

FORWARD_CASES: dict[str, list[Case]] = {
    "full": [Case([], {"value": 1.5, "dtype": "f32", "shape": [2, 3]}), Case([], {"value": 3, "dtype": "i64", "shape": []})],
    "constant": [Case([], {"data": [1.0, 2.0, 3.0, 4.0], "dtype": "f64", "shape": [2, 2]}), Case([], {"data": [True, False], "dtype": "bool", "shape": [2]})],
    "arange": [Case([], {"shape": [5], "dtype": "i64"}), Case([], {"shape": [4], "dtype": "f32", "start": 2, "step": 3})],
    "tril_mask": [Case([], {"shape": [3, 4], "dtype": "bool"}), Case([], {"shape": [4, 4], "dtype": "bool", "k": -1}), Case([], {"shape": [2, 3], "dtype": "f32"})],
    "sign": [Case([I([[-2, 0, 3]], "i32")]), Case([F(2, 3)])],
    "stop_gradient": [Case([I([[-2, 0, 3]], "i32")]), Case([F(2, 3)])],
    "logical_not": [Case([B(3, 4)])],
    "logical_and": [Case([B(3, 4), B(4)])],
    "logical_or": [Case([B(2, 1), B(1, 3)])],
    "argmax": [Case([D(3, 4)], {"axis": 1}), Case([D(2, 3, 4)], {"axis": -3, "keepdims": True})],
    "random_uniform": [
        Case([S(7)], {"shape": [5, 3], "dtype": "f32", "seed": 1, "key": 2, "low": -1.0, "high": 2.0}),
        Case([S(0)], {"shape": [4], "dtype": "f64", "seed": 1, "key": 2, "low": 0.0, "high": 1.0}),
    ],
    "random_normal": [
        Case([S(3)], {"shape": [3, 3], "dtype": "f32", "seed": 5, "key": 9, "mean": 1.0, "std": 2.0}),
        Case([S(1, "i32")], {"shape": [7], "dtype": "bf16", "seed": 5, "key": 9, "mean": 0.0, "std": 1.0}),
    ],
    "dropout_mask": [Case([S(2)], {"shape": [6, 5], "rate": 0.3, "seed": 11, "key": 4})],
    # its values are attention's gradients, which the finite differences of "attention" check
    "attention_grad": [
        Case([F(2, 5, 1, 3)] * 5, {"causal": True, "scale": 3**-0.5}),
        Case([F(1, 6, 2, 4)] * 5, {"causal": False, "scale": 0.5}),
    ],
}
for _cmp in ("eq", "ne", "lt", "gt", "le", "ge"):
    FORWARD_CASES[_cmp] = [Case([G(3, 4), G(4)]), Case([I([1, 2, 3]), I([[2], [1]])])]


def _rng(*parts: Any) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def test_every_op_has_cases() -> None:
    """Each op with a gradient rule has gradient cases; every other op has forward cases."""
    ops = all_ops()
    missing_grad = sorted(n for n, d in ops.items() if d.grad is not None and not GRAD_CASES.get(n))
    assert not missing_grad, f"ops with a gradient rule but no entry in GRAD_CASES: {missing_grad}"
    missing = sorted(n for n in ops if n not in GRAD_CASES and not FORWARD_CASES.get(n))
    assert not missing, f"ops with no entry in GRAD_CASES or FORWARD_CASES: {missing}"
    stale = sorted(n for n in list(GRAD_CASES) + list(FORWARD_CASES) if n not in ops)
    assert not stale, f"case entries for ops not in the table: {stale}"
    wrong = sorted(n for n in GRAD_CASES if ops[n].grad is None)
    assert not wrong, f"GRAD_CASES entries for ops without a gradient rule: {wrong}"


# -- building and running one op -----------------------------------------------------------------------
@dataclass
class Built:
    compiled: CompiledProgram
    names: list[str]  # input names, in argument order
    diff: list[int]  # argument positions that are differentiable
    out_type: TensorType


def build_grad_program(op: str, case: Case, float_dtype: str) -> Built:
    """x0..xn -> y = op(x...); loss = sum(y * v) for a cotangent input v; outputs y, loss
    and the gradient of loss for each differentiable argument (g0.. by position)."""
    b = Builder(f"grad_{op}")
    ids = [b.input(f"x{i}", "value", arg.type(float_dtype)) for i, arg in enumerate(case.args)]
    y = b.op(op, *ids, **case.resolved_attrs(float_dtype))
    v = b.input("v", "value", b.type(y))
    loss = b.op("sum", b.op("mul", y, v), axis=None, keepdims=False)
    diff = [i for i, arg in enumerate(case.args) if arg.differentiable]
    grads = backward(b, loss, [ids[i] for i in diff])
    outputs = {"y": y, "loss": loss}
    for i in diff:
        g = grads[ids[i]]
        assert g is not None, f"{op} {case.label()}: no gradient for argument {i}"
        assert b.type(g) == b.type(ids[i]), f"{op} {case.label()}: gradient {b.type(g)} for argument {b.type(ids[i])}"
        outputs[f"g{i}"] = g
    program = b.program(outputs)
    check_program(program)
    return Built(CompiledProgram(program), [f"x{i}" for i in range(len(case.args))], diff, b.type(y))


def draw_feeds(case: Case, built: Built, rng: np.random.Generator, float_dtype: str) -> dict[str, np.ndarray]:
    feeds = {name: arg.draw(rng, float_dtype) for name, arg in zip(built.names, case.args)}
    feeds["v"] = rng.standard_normal(built.out_type.shape).astype(numpy_dtype(parse_dtype(float_dtype)))
    return feeds


EPS = 1e-6
RTOL = 1e-6


@pytest.mark.parametrize("op", sorted(n for n, d in all_ops().items() if d.grad is not None))
def test_gradient_matches_finite_differences(op: str) -> None:
    """The dot-product test in f64: <grad, d> against (L(x + eps d) - L(x - eps d)) / 2 eps
    for random directions d, one argument at a time and all together."""
    cases = GRAD_CASES.get(op)
    assert cases, f"{op} has a gradient rule but no entry in GRAD_CASES"
    for index, case in enumerate(cases):
        rng = _rng(op, index)
        built = build_grad_program(op, case, "f64")
        feeds = draw_feeds(case, built, rng, "f64")
        result = built.compiled.run_copy(feeds)
        grads = {i: result[f"g{i}"] for i in built.diff}

        def loss_at(direction: dict[int, np.ndarray], scale: float, feeds: dict[str, np.ndarray] = feeds, built: Any = built) -> float:
            moved = dict(feeds)
            for i, d in direction.items():
                moved[built.names[i]] = feeds[built.names[i]] + scale * d
            return float(built.compiled.run(moved)["loss"])

        subsets = [[i] for i in built.diff] + ([built.diff] if len(built.diff) > 1 else [])
        for subset in subsets:
            for trial in range(2):
                direction = {i: rng.standard_normal(case.args[i].shape) for i in subset}
                predicted = sum(float(np.sum(grads[i] * d)) for i, d in direction.items())
                measured = (loss_at(direction, EPS) - loss_at(direction, -EPS)) / (2 * EPS)
                assert abs(predicted - measured) <= RTOL * max(1.0, abs(measured)), (
                    f"{op} {case.label()}: arguments {subset} trial {trial}: <grad, d> = {predicted!r}, finite differences give {measured!r}"
                )


# -- kernels with and without out= ------------------------------------------------------------------------
def _all_cases() -> list[tuple[str, int, Case]]:
    table = {**FORWARD_CASES, **GRAD_CASES}
    return [(op, i, case) for op in sorted(table) for i, case in enumerate(table[op])]


def _garbage(t: TensorType, fill: int) -> np.ndarray:
    dtype = numpy_dtype(t.dtype)
    if t.dtype == DType.bool:
        return np.full(t.shape, bool(fill), dtype=dtype)
    if t.dtype.is_float:
        return np.full(t.shape, np.nan if fill else 7.25, dtype=dtype)
    return np.full(t.shape, -12345 if fill else 7, dtype=dtype)


@pytest.mark.parametrize("float_dtype", ["f64", "f32"])
def test_kernels_same_with_and_without_out(float_dtype: str) -> None:
    """The plan passes preallocated buffers: a kernel must give the same values either way,
    write every element of the buffer it is given, and match its inferred type."""
    for op, index, case in _all_cases():
        rng = _rng(op, index, float_dtype)
        attrs = case.resolved_attrs(float_dtype)
        definition = op_def(op)
        xs = [arg.draw(rng, float_dtype) for arg in case.args]
        saved = [x.copy() for x in xs]
        out_type = definition.infer([arg.type(float_dtype) for arg in case.args], attrs)
        plain = np.asarray(definition.numpy(xs, attrs, None))
        where = f"{op} {case.label()}"
        assert plain.shape == out_type.shape, f"{where}: kernel gives shape {plain.shape}, inferred {out_type}"
        assert plain.dtype == numpy_dtype(out_type.dtype), f"{where}: kernel gives {plain.dtype}, inferred {out_type}"
        for fill in (0, 1):
            buffer = _garbage(out_type, fill)
            result = definition.numpy(xs, attrs, buffer)
            if result is not buffer:  # the backend copies such results into the buffer
                buffer[...] = result
            np.testing.assert_array_equal(buffer, plain, err_msg=f"{where}: out= changes the result")
        for before, after in zip(saved, xs):  # the inputs are left alone
            np.testing.assert_array_equal(before, after, err_msg=f"{where}: the kernel wrote into an input")


def test_compiled_forward_matches_kernels() -> None:
    """Every op run through the planned backend (buffers reused across two runs) gives what
    its kernel gives on its own; every such program passes the checker."""
    for op, index, case in _all_cases():
        b = Builder(f"fwd_{op}")
        ids = [b.input(f"x{i}", "value", arg.type("f64")) for i, arg in enumerate(case.args)]
        attrs = case.resolved_attrs("f64")
        y = b.op(op, *ids, **attrs)
        program = b.program({"y": y})
        check_program(program)
        compiled = CompiledProgram(program)
        for run in range(2):
            rng = _rng(op, index, "run", run)
            xs = [arg.draw(rng, "f64") for arg in case.args]
            got = compiled.run({f"x{i}": x for i, x in enumerate(xs)})["y"]
            np.testing.assert_array_equal(got, op_def(op).numpy(xs, attrs, None), err_msg=f"{op} {case.label()} run {run}")


# -- specific behaviour -------------------------------------------------------------------------------------
def test_take_scatter_add_repeated_indices_accumulate() -> None:
    g = np.arange(12.0).reshape(2, 2, 3)
    idx = np.array([[1, 1], [3, 1]])
    got = op_def("scatter_add").numpy([g, idx], {"shape": [4, 3], "axis": 0}, None)
    expected = np.zeros((4, 3))
    for (i, j), row in zip(np.ndindex(2, 2), g.reshape(4, 3)):
        expected[idx[i, j]] += row
    np.testing.assert_array_equal(got, expected)
    # the same along the last axis, addressed as -1
    got = op_def("scatter_add").numpy([g.transpose(2, 0, 1).copy(), idx], {"shape": [3, 4], "axis": -1}, None)
    np.testing.assert_array_equal(got, expected.T)


def test_take_clips_and_scatter_add_agrees() -> None:
    """take clips out-of-range indices; its gradient must send those rows to the clipped
    position too (so the adjoint identity <take(x), g> = <x, scatter_add(g)> holds)."""
    x = np.arange(4.0)
    idx = np.array([-1, 5, 2])
    taken = op_def("take").numpy([x, idx], {"axis": 0}, None)
    g = np.array([1.0, 10.0, 100.0])
    scattered = op_def("scatter_add").numpy([g, idx], {"shape": [4], "axis": 0}, None)
    assert float(taken @ g) == float(x @ scattered)


def test_builder_constants_are_exact() -> None:
    b = Builder("consts")
    assert b.const(0.0, DType.f32) != b.const(-0.0, DType.f32)
    assert b.const(2**53, DType.i64) != b.const(2**53 + 1, DType.i64)
    assert b.const(1.0, DType.f32) == b.const(1, DType.f32)
    assert b.const(1.0, DType.f32) != b.const(1.0, DType.f64)
    values = CompiledProgram(b.program({"z": b.const(-0.0, DType.f32), "big": b.const(2**53 + 1, DType.i64)})).run({})
    assert math.copysign(1.0, float(values["z"])) == -1.0
    assert int(values["big"]) == 2**53 + 1


def test_max_ties_share_the_gradient() -> None:
    b = Builder("ties")
    x = b.input("x", "value", TensorType(dtype=DType.f64, shape=(2, 3)))
    m = b.op("max", x, axis=1)
    loss = b.op("sum", m, axis=None)
    g = backward(b, loss, [x])[x]
    got = CompiledProgram(b.program({"g": g})).run({"x": np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])})["g"]
    np.testing.assert_allclose(got, [[0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]])


def _grads_at(op: str, xs: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """y and the gradients of sum(y) for float64 arguments XS."""
    b = Builder(op)
    ids = [b.input(f"x{i}", "value", TensorType(dtype=DType.f64, shape=x.shape)) for i, x in enumerate(xs)]
    y = b.op(op, *ids)
    grads = backward(b, b.op("sum", y, axis=None), ids)
    out = CompiledProgram(b.program({"y": y, **{f"g{i}": grads[i] for i in ids}})).run_copy({f"x{i}": x for i, x in enumerate(xs)})
    return out["y"], [out[f"g{i}"] for i in ids]


def test_maximum_minimum_ties_send_the_gradient_to_the_first_argument() -> None:
    """The documented convention (torch.maximum splits ties; ours gives them to a, so that
    a clamp written as maximum(x, lo) passes the gradient at the bound, like torch.clamp)."""
    a, b = np.array([1.0, 2.0, 3.0]), np.array([1.0, 5.0, 3.0])
    for op in ("maximum", "minimum"):
        _, (ga, gb) = _grads_at(op, [a, b])
        tie = a == b
        np.testing.assert_array_equal(ga[tie], 1.0)
        np.testing.assert_array_equal(gb[tie], 0.0)


def test_pow_at_zero_base_has_finite_gradients() -> None:
    base, exponent = np.array([0.0, 0.0, 2.0]), np.array([2.0, 3.0, 1.5])
    y, (ga, gb) = _grads_at("pow", [base, exponent])
    np.testing.assert_array_equal(y, base**exponent)
    np.testing.assert_allclose(ga, exponent * base ** (exponent - 1))
    np.testing.assert_allclose(gb, [0.0, 0.0, 2.0**1.5 * np.log(2.0)])


@pytest.mark.parametrize(
    "op, args, attrs, message",
    [
        ("matmul", [(64, 128), (64, 10)], {}, "inner dimensions 128 and 64 differ"),
        ("add", [(3, 4), (5,)], {}, "do not broadcast"),
        ("take", [(), (2,)], {}, "take"),
        ("scatter_add", [(3,), (3,)], {"shape": [2, 3], "axis": 2}, "axis"),
        ("scatter_add", [(4,), (3,)], {"shape": [5], "axis": 0}, "needs values of shape"),
        ("concat", [(), ()], {"axis": 0}, "scalars"),
        ("unslice", [(2, 3)], {"shape": [4, 5], "starts": [1, 2], "stops": [2, 5]}, "unslice"),
        ("concat", [(2, 3), (2, 3)], {"axis": 2}, "axis"),
    ],
)
def test_shape_errors_are_op_errors(op: str, args: list[Shape], attrs: dict[str, Any], message: str) -> None:
    b = Builder("bad")
    ids = [b.input(f"x{i}", "value", TensorType(dtype=DType.i64 if op in ("take", "scatter_add") and i == 1 else DType.f32, shape=s)) for i, s in enumerate(args)]
    with pytest.raises(OpError, match=message):
        b.op(op, *ids, **attrs)


# -- images: conventions, messages, bf16, staging --------------------------------------------------------------
def _run(op: str, xs: list[np.ndarray], **attrs: Any) -> np.ndarray:
    """OP on XS through the planned backend (the specialized kernels)."""
    b = Builder(op)
    ids = [b.input(f"x{i}", "value", TensorType(dtype=DType.f64 if x.dtype == np.float64 else DType.f32, shape=x.shape)) for i, x in enumerate(xs)]
    program = b.program({"y": b.op(op, *ids, **attrs)})
    check_program(program)
    return CompiledProgram(program).run_copy({f"x{i}": x for i, x in enumerate(xs)})["y"]


def test_max_pool_gradient_goes_to_the_first_maximum_in_window_order() -> None:
    """The documented tie rule (torch's CPU kernel does the same): row by row, left to right
    within each window; overlapping windows add up; padding never wins, not even against
    -inf; a NaN is the maximum and the first NaN gets the gradient."""
    x = np.array([[1.0, 3.0, 3.0, 0.0], [3.0, 2.0, 0.0, 0.0], [5.0, 5.0, 7.0, 7.0], [5.0, 5.0, 7.0, 7.0]]).reshape(1, 1, 4, 4)
    g = np.array([1.0, 10.0, 100.0, 1000.0]).reshape(1, 1, 2, 2)
    expected = np.zeros((4, 4))
    expected[0, 1], expected[0, 2], expected[2, 0], expected[2, 2] = 1.0, 10.0, 100.0, 1000.0
    np.testing.assert_array_equal(_run("max_pool2d_grad", [x, g], kernel=[2, 2])[0, 0], expected)
    # overlapping windows on a constant image: each window's top-left cell
    got = _run("max_pool2d_grad", [np.ones((1, 1, 3, 3)), np.ones((1, 1, 2, 2))], kernel=[2, 2], stride=[1, 1])
    np.testing.assert_array_equal(got[0, 0], [[1, 1, 0], [1, 1, 0], [0, 0, 0]])
    # an image of -inf with padding: each window holds one real cell, which gets its gradient
    minus = np.full((1, 1, 2, 2), -np.inf)
    np.testing.assert_array_equal(_run("max_pool2d", [minus], kernel=[2, 2], padding=[1, 1]), minus)
    np.testing.assert_array_equal(_run("max_pool2d_grad", [minus, g], kernel=[2, 2], padding=[1, 1]), g)
    # NaN
    nan = np.array([1.0, np.nan, np.nan, 2.0]).reshape(1, 1, 2, 2)
    assert np.isnan(_run("max_pool2d", [nan], kernel=[2, 2])).all()
    np.testing.assert_array_equal(_run("max_pool2d_grad", [nan, np.full((1, 1, 1, 1), 5.0)], kernel=[2, 2])[0, 0], [[0, 5], [0, 0]])
    # an infinite gradient stays in its cell (no inf * 0 = NaN elsewhere)
    got = _run("max_pool2d_grad", [x, np.array([np.inf, 1.0, 1.0, 1.0]).reshape(1, 1, 2, 2)], kernel=[2, 2])
    assert np.isinf(got[0, 0, 0, 1]) and np.isfinite(np.delete(got.reshape(-1), 1)).all()


def test_avg_pool_counts_padding_cells() -> None:
    """count_include_pad=True: a corner window of a padded 2x2 image of ones holds 1 cell of 4."""
    got = _run("avg_pool2d", [np.ones((1, 1, 2, 2))], kernel=[2, 2], padding=[1, 1])
    np.testing.assert_array_equal(got[0, 0], np.full((2, 2), 0.25))


@pytest.mark.parametrize(
    "op, args, attrs, message",
    [
        ("conv2d", [("f32", (8, 3, 32, 32)), ("f32", (16, 4, 3, 3))], {}, "conv2d: f32[8,3,32,32] with weight f32[16,4,3,3]: input channels 3 and weight channels 4 differ"),
        ("conv2d", [("f32", (8, 6, 9, 9)), ("f32", (16, 4, 3, 3))], {"groups": 2}, "conv2d: f32[8,6,9,9] with weight f32[16,4,3,3]: input channels 6 in 2 groups (3 each) and weight channels 4 differ"),
        ("conv2d", [("f32", (8, 6, 9, 9)), ("f32", (16, 2, 3, 3))], {"groups": 4}, "conv2d: f32[8,6,9,9] with weight f32[16,2,3,3]: input channels 6 do not divide into 4 groups"),
        ("conv2d", [("f32", (8, 6, 9, 9)), ("f32", (15, 3, 3, 3))], {"groups": 2}, "conv2d: f32[8,6,9,9] with weight f32[15,3,3,3]: output channels 15 do not divide into 2 groups"),
        ("conv2d", [("f32", (3, 32, 32)), ("f32", (16, 3, 3, 3))], {}, "conv2d: f32[3,32,32] with weight f32[16,3,3,3]: the input needs 4 dimensions [N,C,H,W], it has 3"),
        ("conv2d", [("f32", (1, 3, 8, 8)), ("f32", (3, 3))], {}, "conv2d: f32[1,3,8,8] with weight f32[3,3]: the weight needs 4 dimensions [O,C/groups,KH,KW], it has 2"),
        ("conv2d", [("f32", (1, 1, 4, 4)), ("f32", (1, 1, 3, 3))], {"dilation": [2, 2]}, "conv2d: f32[1,1,4,4] with weight f32[1,1,3,3]: the kernel spans 5x5 (size 3x3, dilation 2x2), more than the padded input 4x4 (padding 0x0)"),
        ("conv2d", [("f32", (1, 1, 4, 4)), ("f64", (1, 1, 3, 3))], {}, "conv2d: f32[1,1,4,4] with weight f64[1,1,3,3]: element types differ; cast one"),
        ("conv2d", [("i32", (1, 1, 4, 4)), ("i32", (1, 1, 3, 3))], {}, "conv2d: i32[1,1,4,4] with weight i32[1,1,3,3]: needs float tensors; use (cast x :f32)"),
        ("conv2d", [("f32", (1, 1, 4, 4)), ("f32", (1, 1, 3, 3))], {"stride": [1, 0]}, "conv2d: stride must be a positive integer or a list of two, got (1 0)"),
        ("conv2d", [("f32", (1, 1, 4, 4)), ("f32", (1, 1, 3, 3))], {"padding": [1, 2, 3]}, "conv2d: padding must be a non-negative integer or a list of two, got (1 2 3)"),
        ("conv2d", [("f32", (1, 1, 4, 4)), ("f32", (1, 1, 3, 3))], {"groups": 0}, "conv2d: groups must be a positive integer, got 0"),
        ("conv2d_input_grad", [("f32", (1, 2, 3, 3)), ("f32", (2, 1, 3, 3))], {"input_shape": [1, 1, 4, 4]}, "conv2d-input-grad: gradient f32[1,2,3,3] with weight f32[2,1,3,3] for input [1,1,4,4]: the gradient needs shape [1,2,2,2]"),
        ("conv2d_weight_grad", [("f32", (1, 1, 4, 4)), ("f32", (1, 2, 2, 2))], {"weight_shape": [2, 1, 2, 2]}, "conv2d-weight-grad: input f32[1,1,4,4] with gradient f32[1,2,2,2] for weight [2,1,2,2]: the gradient needs shape [1,2,3,3]"),
        ("max_pool2d", [("f32", (1, 1, 4, 4))], {"kernel": [2, 2], "padding": [2, 0]}, "max-pool2d: f32[1,1,4,4]: padding 2 is more than half the kernel height 2"),
        ("avg_pool2d", [("f32", (1, 1, 4, 4))], {"kernel": [3, 5]}, "avg-pool2d: f32[1,1,4,4]: the kernel 3x5 is larger than the padded input 4x4 (padding 0x0)"),
        ("avg_pool2d", [("f32", (4, 4))], {"kernel": [2, 2]}, "avg-pool2d: f32[4,4]: needs 4 dimensions [N,C,H,W], it has 2"),
        ("max_pool2d", [("i64", (1, 1, 4, 4))], {"kernel": [2, 2]}, "max-pool2d: i64[1,1,4,4]: needs a float tensor; use (cast x :f32)"),
        ("max_pool2d", [("f32", (1, 1, 4, 4))], {}, "max-pool2d: kernel must be a positive integer or a list of two, got None"),
        ("max_pool2d_grad", [("f32", (1, 1, 4, 4)), ("f32", (1, 1, 3, 3))], {"kernel": [2, 2]}, "max-pool2d-grad: f32[1,1,4,4] with gradient f32[1,1,3,3]: the second argument needs shape [1,1,2,2]"),
        ("avg_pool2d_grad", [("f32", (1, 1, 3, 3))], {"kernel": [2, 2], "input_shape": [1, 1, 4, 4]}, "avg-pool2d-grad: gradient f32[1,1,3,3] for input [1,1,4,4]: the gradient needs shape [1,1,2,2]"),
    ],
)
def test_image_op_errors(op: str, args: list[tuple[str, Shape]], attrs: dict[str, Any], message: str) -> None:
    b = Builder("bad")
    ids = [b.input(f"x{i}", "value", TensorType(dtype=parse_dtype(d), shape=s)) for i, (d, s) in enumerate(args)]
    with pytest.raises(OpError) as info:
        b.op(op, *ids, **attrs)
    assert str(info.value) == message


@pytest.mark.parametrize("op", ["conv2d", "conv2d_input_grad", "conv2d_weight_grad", "max_pool2d", "max_pool2d_grad", "max_pool2d_select", "avg_pool2d", "avg_pool2d_grad"])
def test_image_ops_in_bf16_match_f32(op: str) -> None:
    """bf16 is computed in f32 and rounded once: within 1e-2 relative of the f32 result on
    the same (bf16-representable) inputs."""
    bf16 = numpy_dtype(DType.bf16)
    for index, case in enumerate(GRAD_CASES[op]):
        rng = _rng(op, index, "bf16")
        xs = [arg.draw(rng, "f32").astype(bf16) for arg in case.args]
        definition = op_def(op)
        assert definition.infer([arg.type("bf16") for arg in case.args], case.attrs).dtype == DType.bf16
        low = definition.numpy(xs, case.attrs, None)
        high = definition.numpy([x.astype(np.float32) for x in xs], case.attrs, None)
        assert low.dtype == bf16
        low32 = low.astype(np.float32)
        assert np.all(np.abs(low32 - high) <= 1e-2 * np.maximum(1.0, np.abs(high))), f"{op} {case.label()}"


def test_image_staging_builtins() -> None:
    """conv2d, max-pool2d and avg-pool2d from Lisp: integer or two-element options, the
    pool stride defaulting to the kernel, and argument errors naming the argument."""
    from sexpgpu.compile.tensors import Staged, TensorLib, Tracer
    from sexpgpu.lisp.conditions import LispError
    from sexpgpu.lisp.evaluator import Interpreter

    interp = Interpreter()
    tracer = Tracer("images")
    lib = TensorLib(interp)
    lib.install()
    b = tracer.builder
    for name, shape in [("x", (8, 3, 32, 32)), ("w", (16, 3, 3, 3)), ("wd", (6, 1, 3, 3)), ("w4", (16, 4, 3, 3))]:
        interp.values[interp.sym(name)] = Staged(tracer, b.input(name, "value", TensorType(dtype=DType.f32, shape=shape)))

    def stage(text: str) -> tuple[TensorType, dict[str, Any]]:
        with lib.tracing(tracer):
            result = interp.load_text(text, "images.lisp", interp.base)
        node = b.nodes[-1]
        assert node.id == result.id
        return result.type, node.attrs

    conv = {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1}
    assert stage("(conv2d x w)") == (TensorType(dtype=DType.f32, shape=(8, 16, 30, 30)), conv)
    assert stage("(conv2d x w :stride 2 :padding '(1 2))") == (TensorType(dtype=DType.f32, shape=(8, 16, 16, 17)), {**conv, "stride": [2, 2], "padding": [1, 2]})
    assert stage("(conv2d x wd :groups 3 :dilation '(2 1))")[0].shape == (8, 6, 28, 30)
    assert stage("(max-pool2d x 2)") == (TensorType(dtype=DType.f32, shape=(8, 3, 16, 16)), {"kernel": [2, 2], "stride": [2, 2], "padding": [0, 0]})
    assert stage("(avg-pool2d x '(3 2) :stride 1 :padding 1)") == (TensorType(dtype=DType.f32, shape=(8, 3, 32, 33)), {"kernel": [3, 2], "stride": [1, 1], "padding": [1, 1]})
    for text, message in [
        ("(conv2d x w4)", "conv2d: f32[8,3,32,32] with weight f32[16,4,3,3]: input channels 3 and weight channels 4 differ"),
        ("(conv2d x w :stride '(1 2 3))", "`conv2d`: argument 4 must be a positive integer or a list of two, got (1 2 3) (a cons)"),
        ("(conv2d x w :padding -1)", "`conv2d`: argument 4 must be a non-negative integer or a list of two, got -1 (an integer)"),
        ("(conv2d x w :stride 1 :groups 1.5)", "`conv2d`: argument 6 must be a positive integer, got 1.5 (a float)"),
        ("(max-pool2d x '(2 0))", "`max-pool2d`: argument 2 must be a positive integer or a list of two, got (2 0) (a cons)"),
        ("(max-pool2d x 2 :padding 2)", "max-pool2d: f32[8,3,32,32]: padding 2 is more than half the kernel height 2"),
    ]:
        with pytest.raises(LispError) as info, lib.tracing(tracer):
            interp.load_text(text, "images.lisp", interp.base)
        assert str(info.value) == message, text


# -- random ops: Philox4x32-10 and its use ---------------------------------------------------------------------
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0), (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter, key, expected", KNOWN_ANSWERS)
def test_philox_known_answers(counter: tuple[int, ...], key: tuple[int, int], expected: tuple[int, ...]) -> None:
    got = philox4x32(np.array([counter], dtype=np.uint32), key)[0]
    assert [int(w) for w in got] == list(expected)


def _philox_reference(counter: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, int, int, int]:
    """Philox4x32-10 on Python integers, written straight from the paper."""
    m = 0xFFFFFFFF
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & m, (k1 + 0xBB67AE85) & m
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & m, p1 & m, ((p0 >> 32) ^ c3 ^ k1) & m, p0 & m
    return c0, c1, c2, c3


def test_philox_vectorized_matches_reference() -> None:
    rng = np.random.default_rng(0)
    counters = rng.integers(0, 2**32, size=(64, 4), dtype=np.uint64).astype(np.uint32)
    key = (int(rng.integers(0, 2**32)), int(rng.integers(0, 2**32)))
    got = philox4x32(counters, key)
    for row, words in zip(counters, got):
        assert tuple(int(w) for w in words) == _philox_reference(tuple(int(c) for c in row), key)


@pytest.mark.parametrize("step", [0, 5, 2**33 + 7, -1])
def test_random_words_follow_the_documented_layout(step: int) -> None:
    """Element i is lane i % 4 of Philox((i // 4, 0, step lo, step hi), (seed, key))."""
    seed, key = 0xDEADBEEF, 12345
    words = random_words((3, 5), seed, key, step)
    s = step & (2**64 - 1)
    for i in range(15):
        block = _philox_reference((i // 4, 0, s & 0xFFFFFFFF, s >> 32), (seed, key))
        assert int(words.reshape(-1)[i]) == block[i % 4], i


def _run_random(op: str, step: int, **attrs: Any) -> np.ndarray:
    b = Builder(op)
    s = b.input("step", "value", TensorType(dtype=DType.i64, shape=()))
    program = b.program({"r": b.op(op, s, **attrs)})
    check_program(program)
    return CompiledProgram(program).run_copy({"step": np.array(step, dtype=np.int64)})["r"]


def test_random_uniform_is_the_documented_function_of_the_bits() -> None:
    attrs = {"shape": [4, 6], "dtype": "f32", "seed": 3, "key": 8, "low": -2.0, "high": 3.0}
    got = _run_random("random_uniform", 11, **attrs)
    u = (random_words((4, 6), 3, 8, 11) >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)
    expected = np.float32(-2.0) + np.float32(5.0) * u
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)
    f64 = _run_random("random_uniform", 11, **{**attrs, "dtype": "f64"})
    np.testing.assert_array_equal(f64, -2.0 + 5.0 * u.astype(np.float64))


def test_random_ops_are_deterministic_and_streams_differ() -> None:
    for op, extra in [("random_uniform", {"dtype": "f32", "low": 0.0, "high": 1.0}), ("random_normal", {"dtype": "f32", "mean": 0.0, "std": 1.0}), ("dropout_mask", {"rate": 0.5})]:
        base = {"shape": [64, 16], "seed": 42, "key": 7, **extra}
        first = _run_random(op, 3, **base)
        np.testing.assert_array_equal(first, _run_random(op, 3, **base), err_msg=f"{op}: not deterministic")
        limit = 0.6 if op == "dropout_mask" else 0.01  # booleans agree half the time by chance
        for label, variant, step in [("step", base, 4), ("key", {**base, "key": 8}, 3), ("seed", {**base, "seed": 43}, 3)]:
            other = _run_random(op, step, **variant)
            assert np.mean(first == other) < limit, f"{op}: a different {label} gives the same numbers"
        # a larger tensor starts with the same numbers (element i depends on i only)
        bigger = _run_random(op, 3, **{**base, "shape": [2, 64, 16]})
        np.testing.assert_array_equal(bigger.reshape(-1)[: first.size], first.reshape(-1), err_msg=op)


def test_random_uniform_statistics() -> None:
    n = 200_000
    x = _run_random("random_uniform", 1, shape=[n], dtype="f64", seed=9, key=1, low=-1.0, high=3.0).astype(np.float64)
    assert x.min() >= -1.0 and x.max() < 3.0
    # U(-1, 3): mean 1, variance 16/12; five standard errors
    assert abs(x.mean() - 1.0) < 5 * math.sqrt(16 / 12 / n)
    assert abs(x.var() - 16 / 12) < 5 * math.sqrt((16**2 / 80 - (16 / 12) ** 2) / n)
    counts = np.histogram(x, bins=16, range=(-1.0, 3.0))[0]
    chi2 = float(np.sum((counts - n / 16) ** 2 / (n / 16)))
    assert chi2 < 50.0  # 15 degrees of freedom: p < 1e-5
    for dtype in ("bf16", "f16"):
        low = _run_random("random_uniform", 1, shape=[4096], dtype=dtype, seed=9, key=1, low=0.0, high=1.0).astype(np.float32)
        assert low.min() >= 0.0 and low.max() <= 1.0 and abs(low.mean() - 0.5) < 0.05


def test_random_normal_statistics() -> None:
    n = 200_000
    z = _run_random("random_normal", 2, shape=[n], dtype="f64", seed=9, key=2, mean=0.0, std=1.0)
    assert abs(z.mean()) < 5 / math.sqrt(n)
    assert abs(z.var() - 1.0) < 5 * math.sqrt(2 / n)
    assert abs(np.mean(z**4) - 3.0) < 0.1  # kurtosis of a normal
    assert abs(np.mean(np.abs(z) < 1.0) - 0.682689) < 0.01
    shifted = _run_random("random_normal", 2, shape=[n], dtype="f32", seed=9, key=2, mean=3.0, std=0.5)
    np.testing.assert_allclose(shifted, (3.0 + 0.5 * z).astype(np.float32), rtol=1e-6)


@pytest.mark.parametrize("rate", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_dropout_keep_rate(rate: float) -> None:
    n = 100_000
    mask = _run_random("dropout_mask", 5, shape=[n], rate=rate, seed=1, key=3)
    assert mask.dtype == np.bool_
    keep = 1.0 - rate
    assert abs(mask.mean() - keep) <= 5 * math.sqrt(keep * (1 - keep) / n) + 1e-12
    assert dropout_threshold(rate) == min(2**24, math.ceil(rate * 2**24))


@pytest.mark.parametrize(
    "op, step_type, attrs, message",
    [
        ("random_uniform", ("f32", ()), {"shape": [2], "dtype": "f32", "seed": 1, "key": 1}, "step"),
        ("random_uniform", ("i64", (2,)), {"shape": [2], "dtype": "f32", "seed": 1, "key": 1}, "step"),
        ("random_uniform", ("i64", ()), {"shape": [2], "dtype": "i32", "seed": 1, "key": 1}, "dtype"),
        ("random_normal", ("i64", ()), {"shape": [2], "dtype": "f32", "seed": 2**32, "key": 1}, "seed"),
        ("dropout_mask", ("i64", ()), {"shape": [2], "rate": 1.5, "seed": 1, "key": 1}, "rate"),
        ("dropout_mask", ("i64", ()), {"shape": [2], "rate": 0.5, "seed": 1, "key": -1}, "key"),
    ],
)
def test_random_op_errors(op: str, step_type: tuple[str, Shape], attrs: dict[str, Any], message: str) -> None:
    b = Builder("bad")
    s = b.input("step", "value", TensorType(dtype=parse_dtype(step_type[0]), shape=step_type[1]))
    with pytest.raises(OpError, match=message):
        b.op(op, s, **attrs)


def test_random_ops_have_no_gradient_and_block_none() -> None:
    """A random draw multiplied into a parameter: the parameter's gradient flows, the step
    gets none."""
    b = Builder("noise")
    s = b.input("step", "value", TensorType(dtype=DType.i64, shape=()))
    w = b.input("w", "value", TensorType(dtype=DType.f64, shape=(3,)))
    noise = b.op("random_normal", s, shape=[3], dtype="f64", seed=1, key=2, mean=0.0, std=1.0)
    loss = b.op("sum", b.op("mul", w, noise), axis=None)
    grads = backward(b, loss, [w, s])
    assert grads[s] is None
    program = b.program({"g": grads[w], "noise": noise})
    check_program(program)
    out = CompiledProgram(program).run({"step": np.array(0), "w": np.ones(3)})
    np.testing.assert_array_equal(out["g"], out["noise"])
