"""The kernel description that both dialects render: what a reduction's (or a row group's)
accumulation computes, as data, not as C lines of one dialect.

An `Accumulate` is one accumulator over a loop: the loop's variable and extent, the index
expression of each element, the element's work (loads from the kernel's inputs at that
index, ALU nodes whose C comes from the op table's `c_expr`, stores of values other steps
read) and the op table's reducer spec (identity, update, pairwise combine, NaN rule, mean
division). Who shares the loop (`lanes`: a thread, a warp or a block) is part of it: lane l
takes elements l, l + lanes, ..., and the lanes' partial results meet in one fixed tree
(the lane combine, with a barrier between its rounds).

Two renderers write it: `lanes_accumulate` here (the device kernels of runtime/lower/, in
the dialect's names of codegen.py, which the CUDA dialect (runtime/cuda/dialect.py) makes
CUDA and the tests' host emulation runs) with its lanes striding the loop and the tree
through the group's shared memory; and the host renderer
(runtime/cpu/hostc.py, `host_accumulate`) with the lanes as a stack array of partials, the
elements in blocks so that NumPy's own loops can run over a block, and the same tree. The
order of every addition is the description's, so the two agree bit for bit by construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from ...ir.dtypes import DType
from ...ir.graph import Node, Shape, TensorType
from ...ir.ops import ReducerSpec, op_def
from .codegen import LoweringError, c_types, chain_lines, combine_lanes, load_expr, to_storage


@dataclass(frozen=True)
class Load:
    """VALUE (of TYPE) read from input parameter PARAM at the broadcast of flat index `idx` of
    SPACE (each dialect writes the index its own way: a division per stride, or a row base)."""

    value: int
    param: int
    type: TensorType
    space: Shape


@dataclass(frozen=True)
class Alu:
    """One elementwise node, computed from its arguments by the op table's C expression."""

    node: Node


@dataclass(frozen=True)
class Store:
    """VALUE written to output parameter PARAM at flat index `idx`."""

    value: int
    param: int
    dtype: DType


@dataclass(frozen=True)
class Part:
    """One part of a concat: VALUE over [START, STOP) of the loop index, read from input
    parameter PARAM at i - START, or a constant (PARAM None)."""

    value: int
    param: Optional[int]
    dtype: DType
    start: int
    stop: int


@dataclass(frozen=True)
class Concat:
    """A 1-D concat: at index i, the part that holds i (each part read only in its range)."""

    node: Node
    parts: tuple[Part, ...]


@dataclass(frozen=True)
class Window:
    """A 1-D slice [START, STOP) of the loop: the node's value is its argument's; its stores
    go to its own buffer, from its start."""

    node: Node
    start: int
    stop: int


Op = Union[Load, Alu, Concat, Window, Store]


@dataclass(frozen=True)
class WindowStore:
    """VALUE written to output parameter PARAM at i - START, for i in [START, STOP) only."""

    value: int
    param: int
    dtype: DType
    start: int
    stop: int


class Ops:
    """The ops of a loop body by kind, in order (a description's `ops`)."""

    ops: tuple[Union[Op, WindowStore], ...]

    @property
    def nodes(self) -> list[Node]:
        """Every node the loop computes, in order (ALU nodes, concats and windows)."""
        return [op.node for op in self.ops if isinstance(op, (Alu, Concat, Window))]

    @property
    def loads(self) -> list[Load]:
        return [op for op in self.ops if isinstance(op, Load)]

    @property
    def concats(self) -> list[Concat]:
        return [op for op in self.ops if isinstance(op, Concat)]

    @property
    def windows(self) -> list[Window]:
        return [op for op in self.ops if isinstance(op, Window)]

    @property
    def stores(self) -> list[Union[Store, WindowStore]]:
        return [op for op in self.ops if isinstance(op, (Store, WindowStore))]


@dataclass(frozen=True)
class Elementwise(Ops):
    """A fused elementwise group: for each flat index i of SPACE, OPS in order (loads at the
    broadcast of i, one C expression per node, concats read piecewise, stores at i or in a
    window). The CUDA dialect gives i to threads (a grid-stride loop); the host's to rows or
    chunks of contiguous elements, each an inner loop the compiler vectorizes."""

    space: Shape
    ops: tuple[Union[Op, WindowStore], ...]


@dataclass(frozen=True)
class Accumulate(Ops):
    """ACC = REDUCER over VAR in [FIRST, END) of VALUE, each element at idx = INDEX (C over VAR
    and the item's variables) made by OPS; the loop shared by LANES ("thread", "warp", "block")."""

    acc: str
    reducer: ReducerSpec
    integer: bool
    var: str
    first: str
    end: str
    index: str
    ops: tuple[Op, ...]
    value: int
    lanes: str


@dataclass(frozen=True)
class RowScalar:
    """A node over the reduced values of row r (keepdims shape): computed once per row from
    the values before it and its LOADS (inputs at the broadcast of r in the node's shape);
    stored to output STORE when other steps read it."""

    node: Node
    loads: tuple[Load, ...]
    store: Optional[int]


@dataclass(frozen=True)
class RowReduce:
    """A reduction over row r: its accumulator, then its value (f32) as a scalar of the row;
    stored to output STORE when other steps read it."""

    node: Node
    accumulate: Accumulate
    store: Optional[int]


@dataclass(frozen=True)
class RowPass(Ops):
    """The last loop over row r's columns c (idx = r * width + c): OPS make and store the
    row-space outputs."""

    ops: tuple[Op, ...]


RowPhase = Union[RowScalar, RowReduce, RowPass]


@dataclass(frozen=True)
class RowKernel:
    """A row group (softmax, the norms, cross-entropy) over the rows of SPACE = (..., width):
    per row, PHASES in order; who computes a row is LANES (a thread, a warp or a block)."""

    space: Shape
    lanes: str
    phases: tuple[RowPhase, ...]

    @property
    def width(self) -> int:
        return self.space[-1]

    @property
    def rows(self) -> int:
        size = 1
        for d in self.space[:-1]:
            size *= d
        return size

    def result(self, red: RowReduce, acc: str) -> str:
        """Reduction RED's accumulated ACC as the kernel computes on with it (f32, or bf16 rounded)."""
        value = f"(float){red.accumulate.reducer.finish(acc, self.width)}"
        return f"sx_bf16_round({value})" if red.node.type.dtype == DType.bf16 else value


def reducer_of(op: str) -> ReducerSpec:
    spec = op_def(op).reducer
    if spec is None:
        raise LoweringError(f"op {op} is no reduction the kernels compute (no reducer spec in the op table)")
    return spec


def lanes_accumulate(desc: Accumulate, types: dict[int, TensorType], constants: dict[int, Node], names: dict[int, str], indent: str = "    ") -> tuple[list[str], int]:
    """DESC as device kernel lines: the accumulator in a register of each lane, the lanes striding the
    loop, then their fixed tree; NAMES (values known before the loop) is read, not changed."""
    acc_type = "long long" if desc.integer else "double"
    inner = indent + "  "
    local = dict(names)
    body = [f"{inner}const long long idx = {desc.index};"]
    for load in desc.loads:
        if load.value not in local:
            local[load.value] = f"x{load.value}"
            body.append(f"{inner}const {c_types(load.type.dtype)[1]} x{load.value} = {load_expr(load.param, load.type, load.space, 'idx')};")
    lines, flops = chain_lines(desc.nodes, local, types, constants, inner)
    body += lines
    body += [f"{inner}out{store.param}[idx] = {to_storage(local[store.value], store.dtype)};" for store in desc.stores]
    stride = f"for (long long {desc.var} = {desc.first}; {desc.var} < {desc.end}; ++{desc.var}) {{" if desc.lanes == "thread" else \
        f"for (long long {desc.var} = {desc.first} + lane; {desc.var} < {desc.end}; {desc.var} += lanes) {{"
    out = [f"{indent}{acc_type} {desc.acc} = {desc.reducer.start(desc.integer)};", f"{indent}{stride}", *body,
           f"{inner}{desc.reducer.update(desc.acc, local[desc.value], desc.integer)}", f"{indent}}}",
           *combine_lanes(desc.acc, desc.reducer, desc.lanes, indent)]
    return out, flops
