"""The op table: each tensor operation declared once, with its shape and dtype rule, its
gradient written as IR, its NumPy kernel, its kind, and what the CUDA lowering reads from it
(a C expression template for elementwise ops; for a row op, how to build it from other ops).

The kind says what the op computes as far as a backend cares, and so which generic lowering
it gets: the NumPy plan shares a view's memory and computes a constant once; the CUDA
lowering (runtime/lower/lowering.py) looks an op's rule up by its name, then by its kind.

Entries live in ops_*.py next to this file and register themselves here; adding an op
touches one entry (and, for an op with a CUDA kernel of its own, one lowering file).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeAlias

from .lazy_numpy import np

from .graph import Node, Program, TensorType

if TYPE_CHECKING:
    from .builder import Builder

# a string, so that the table loads without NumPy (lazy_numpy.py)
Kernel: TypeAlias = "Callable[[list[np.ndarray], dict[str, Any], Optional[np.ndarray]], np.ndarray]"
ShapeRule = Callable[[list[TensorType], dict[str, Any]], TensorType]
GradRule = Callable[["Builder", Node, int], list[Optional[int]]]
FlopRule = Callable[[Node, list[TensorType]], int]


class OpError(Exception):
    """A shape or dtype error, phrased for the user, e.g.
    `matmul: f32[64,128] @ f32[64,10]: inner dimensions 128 and 64 differ`."""


def elementwise_flops(node: Node, inputs: list[TensorType]) -> int:
    return node.type.size


def no_flops(node: Node, inputs: list[TensorType]) -> int:
    return 0


class OpKind(str, Enum):
    """What an op computes, as far as a backend cares."""

    CONSTANT = "constant"  # no arguments: a tensor made from its attributes
    ELEMENTWISE = "elementwise"  # each output element from the same (broadcast) element of every argument
    REDUCTION = "reduction"  # over axes
    ROW = "row"  # a function of each row along an axis, which `decompose` builds from other ops
    VIEW = "view"  # the argument's elements seen through another shape or order (may share its memory)
    LAYOUT = "layout"  # the arguments' elements copied into a new arrangement
    GATHER = "gather"  # elements picked by integer indices
    SCATTER = "scatter"  # values added into zeros at integer indices
    MATMUL = "matmul"
    RANDOM = "random"  # counter-based random bits: the same on every backend only through the op's own kernel
    IMAGE = "image"  # windows over NCHW images: convolutions and pools
    ATTENTION = "attention"  # softmax(q k^T * scale + mask) v, and its gradient


@dataclass(frozen=True)
class ReducerSpec:
    """How a reduction op's kernels accumulate, on every device: an accumulator starts at the
    identity, takes each element in order (`update`), partial results (lanes, chunks) are
    combined pairwise (`combine`), and the result is `finish`ed. Floats accumulate in double,
    integers in 64 bits. An extreme (`better` set) follows NumPy: a NaN wins and stays, ties
    keep the first; any other reducer combines the accumulator with each element as it
    combines two partial results. `divides`: the result is divided by the element count (mean).
    The CUDA kernels and the host C are both rendered from it (runtime/lower/kernel_ir.py)."""

    identity: str  # C, the double accumulator's start
    identity_integer: str  # C, the 64-bit integer accumulator's start
    combine: str  # C over two partial results {0} and {1} (doubles)
    better: Optional[str] = None  # an extreme: the comparison by which an element replaces the accumulator
    divides: bool = False

    def update(self, acc: str, x: str, integer: bool) -> str:
        """The C statement taking element X (as the kernel computes it) into ACC."""
        acc_type = "long long" if integer else "double"
        if self.better is None:
            return f"{acc} = {self.pair(acc, f'({acc_type}){x}')};"
        if integer:
            return f"if (({acc_type}){x} {self.better} {acc}) {acc} = ({acc_type}){x};"
        return f"if ({acc} == {acc}) {{ if (({acc_type}){x} {self.better} {acc} || {x} != {x}) {acc} = ({acc_type}){x}; }}"

    def start(self, integer: bool) -> str:
        return self.identity_integer if integer else self.identity

    def pair(self, a: str, b: str) -> str:
        return self.combine.format(a, b)

    def finish(self, acc: str, count: int) -> str:
        """The result of the accumulated ACC over COUNT elements, still double (or 64-bit)."""
        return f"({acc} / {count}.0)" if self.divides else acc


@dataclass(frozen=True)
class OpDef:
    name: str
    infer: ShapeRule
    numpy: Kernel
    grad: Optional[GradRule]  # None: not differentiable (integer or boolean results)
    kind: OpKind
    arity: Optional[int] = None  # None: any number of arguments
    # inside a fused kernel, on the CUDA device and the CPU device alike: a C expression over
    # {0}, {1}, ... ({dtype}: the C type the result is computed in); every elementwise op has one
    c_expr: Optional[str] = None
    # the expression for i32 and i64 results, where `c_expr` calls float helpers (which round
    # past 2^24)
    c_expr_integer: Optional[str] = None
    # the NumPy ufunc whose f32 inner loop the CPU device calls for the op's f32 results (its
    # default math, so that they equal NumPy's bit for bit), instead of `c_expr`
    numpy_f32_loop: Optional[str] = None
    flops: FlopRule = elementwise_flops
    doc: str = ""
    attrs: tuple[str, ...] = field(default=())
    # optional: (attrs, input types) -> a kernel with the attrs worked out once, which the
    # NumPy plan uses instead of `numpy` so a step does no per-call attribute work
    specialize: Optional[Callable[[dict[str, Any], list[TensorType]], Kernel]] = None
    # optional: how the CUDA lowering builds the op from other ops (which it then fuses), for
    # an op that is a primitive for its gradient's sake: (builder, node with its args) -> value
    decompose: Optional[Callable[["Builder", Node], int]] = None
    # the op has no device kernel: on a device it runs this NumPy kernel on host copies of its
    # arguments and its result is copied back, every run (`explain --cuda` warns of it, and
    # `run --device cuda` names it with the bytes it copies)
    on_host: bool = False
    # a reduction the devices' kernels compute (sum, mean, max, min): how they accumulate
    reducer: Optional[ReducerSpec] = None

    @property
    def elementwise(self) -> bool:
        return self.kind is OpKind.ELEMENTWISE


OPS: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    if op.name in OPS:
        raise ValueError(f"op {op.name} registered twice")
    if op.kind is OpKind.ELEMENTWISE and op.c_expr is None:
        raise ValueError(f"op {op.name}: an elementwise op needs its C expression (c_expr=)")
    if op.kind is OpKind.ROW and op.decompose is None:
        raise ValueError(f"op {op.name}: a row op needs its decomposition into other ops (decompose=)")
    if op.kind is OpKind.CONSTANT and op.arity != 0:
        raise ValueError(f"op {op.name}: a constant takes no arguments (arity=0)")
    OPS[op.name] = op
    return op


def op_def(name: str) -> OpDef:
    _load_entries()
    try:
        return OPS[name]
    except KeyError:
        raise OpError(f"unknown op `{name}`") from None


def program_flops(program: "Program") -> int:
    """The FLOPs one run of PROGRAM does, by each op's own rule."""
    types = program.types()
    return sum(op_def(n.op).flops(n, [types[a] for a in n.args]) for n in program.nodes)


_LOADED: list[bool] = []


def _load_entries() -> None:
    if _LOADED:
        return
    _LOADED.append(True)
    from . import ops_attention, ops_conv, ops_elementwise, ops_linalg, ops_random, ops_reduce, ops_shape  # noqa: F401  (they register)


def all_ops() -> dict[str, OpDef]:
    _load_entries()
    return OPS
