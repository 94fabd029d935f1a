"""The steps a lowered program runs, and the rules that lower the op table's ops to them.

Each step type says what it reads and writes, which kernels it generates, how it runs on a
device and what the report says of it. The rules at the end put each op in a step (or in a
fused group); they are registered in lowering.py's registry when this module is imported.
An op with a kernel of its own adds its step type and its rule here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar, Optional

import numpy as np

from ...ir.dtypes import DType
from ...ir.graph import Node, Program, Shape, TensorType, shape_size
from ...ir.ops import OpKind, op_def
from . import moves
from .blas import BlasCall, matmul_calls
from .codegen import KernelSource, LoweringError, storage_bytes
from .kernels import Draw, dropout_draw, elementwise_kernel, planned_strategy, random_kernel, reduce_kernels, scatter_kernel, uniform_draw
from .lowering import (Absorbed, Fuse, KernelLine, Lowered, LoweringContext, Placement, StepRun, register_host_lowering, register_kind_lowering,
                       register_lowering)
from .row_kernel import rows_kernel

LANES = {"thread": "a thread", "warp": "a warp", "block": "a block"}


def launch_group(run: StepRun, kernel: KernelSource, inputs: list[int], outputs: list[int]) -> None:
    """KERNEL over the values INPUTS, writing OUTPUTS into their arena buffers."""
    outs = [run.buffer(v) for v in outputs]
    run.launch(kernel, [run.contiguous(v) for v in inputs] + outs)
    for vid, out in zip(outputs, outs):
        run.set(vid, out)


# -- groups: one generated kernel over many nodes ---------------------------------------------
class OneKernelGroup:
    """What the groups of one generated kernel share: the kernel reads the group's inputs and
    writes its outputs into their buffers, and nothing else."""

    nodes: list[Node]
    inputs: list[int]
    outputs: list[int]
    once: ClassVar[bool] = False

    @property
    def ids(self) -> set[int]:
        return {n.id for n in self.nodes}

    @property
    def reads(self) -> list[int]:
        return self.inputs

    @property
    def writes(self) -> list[int]:
        return self.outputs

    @property
    def aliases(self) -> dict[int, int]:
        return {}

    def scratch_bytes(self, types: dict[int, TensorType]) -> int:
        return 0

    def launch(self, run: StepRun, kernels: list[KernelSource]) -> None:
        launch_group(run, kernels[0], self.inputs, self.outputs)


@dataclass
class FusedGroup(OneKernelGroup):
    """Elementwise nodes computed by one generated kernel over `shape`."""

    shape: Shape
    nodes: list[Node] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)  # values read (from outside the group)
    outputs: list[int] = field(default_factory=list)  # values written (used outside, or returned)
    pieces: set[int] = field(default_factory=set)  # 1-D concats, loaded piecewise
    windows: dict[int, tuple[int, int]] = field(default_factory=dict)  # 1-D slices: node -> [start, stop), stored windowed
    kind: ClassVar[str] = "fused"

    @property
    def piecewise(self) -> bool:
        """Whether the group joins or windows 1-D values (the optimizer's joined update): it
        stays whole, neither a reduction's prologue nor part of a row group."""
        return bool(self.pieces or self.windows)

    def add(self, node: Node, fuse: Fuse) -> None:
        self.nodes.append(node)
        if fuse.piecewise:
            self.pieces.add(node.id)
        if fuse.window is not None:
            self.windows[node.id] = fuse.window

    def absorb(self, other: FusedGroup, position: dict[int, int]) -> None:
        """OTHER's nodes become this group's, all in program order (POSITION)."""
        self.nodes = sorted(self.nodes + other.nodes, key=lambda n: position[n.id])
        self.pieces |= other.pieces
        self.windows.update(other.windows)

    def kernels(self, program: Program, constants: dict[int, Node]) -> list[KernelSource]:
        return [elementwise_kernel(self, program, constants)]

    def describe(self, index: int, lowered: Lowered) -> KernelLine:
        kernel = elementwise_kernel(self, lowered.program, lowered.constants)
        return KernelLine(step=index, kind=self.kind, kernel=kernel.name, nodes=[lowered.label(n) for n in self.nodes],
                          elements=kernel.size, bytes=kernel.bytes, flops=kernel.flops, how="a thread per element")


@dataclass
class ReduceGroup:
    """A reduction (sum mean max min) computed by one generated kernel, with the elementwise
    group that produces its input fused in as a prologue; the group's values that other steps
    read (`sides`) the kernel stores as it goes (a bias gradient summed as it is made)."""

    node: Node
    prologue: Optional[FusedGroup] = None
    sides: list[int] = field(default_factory=list)
    kind: ClassVar[str] = "reduce"
    once: ClassVar[bool] = False

    @property
    def inputs(self) -> list[int]:
        return self.prologue.inputs if self.prologue is not None else list(self.node.args)

    @property
    def nodes(self) -> list[Node]:
        return (self.prologue.nodes if self.prologue is not None else []) + [self.node]

    @property
    def ids(self) -> set[int]:
        return {n.id for n in self.nodes}

    @property
    def reads(self) -> list[int]:
        return self.inputs

    @property
    def writes(self) -> list[int]:
        return [self.node.id] + self.sides

    @property
    def aliases(self) -> dict[int, int]:
        return {}

    def scratch_bytes(self, types: dict[int, TensorType]) -> int:
        split = planned_strategy(self, types).split
        return 8 * split * (shape_size(self.node.type.shape) or 1) if split > 1 else 0

    def kernels(self, program: Program, constants: dict[int, Node]) -> list[KernelSource]:
        return reduce_kernels(self, program, constants)

    def launch(self, run: StepRun, kernels: list[KernelSource]) -> None:
        out = run.buffer(self.node.id)
        inputs = [run.contiguous(v) for v in self.inputs]
        sides = [run.buffer(v) for v in self.sides]
        if len(kernels) == 2:  # split: the chunks' partial results, then their combination
            partials, finish = kernels
            scratch = run.scratch(np.float64, partials.size)
            run.launch(partials, inputs + [scratch] + sides)
            run.launch(finish, [scratch, out])
        else:
            run.launch(kernels[0], inputs + [out] + sides)
        for vid, value in zip(self.writes, [out] + sides):
            run.set(vid, value)

    def describe(self, index: int, lowered: Lowered) -> KernelLine:
        kernels = reduce_kernels(self, lowered.program, lowered.constants)
        outputs = kernels[-1].size
        if len(kernels) == 1:
            how = f"{LANES[kernels[0].lanes]} per output"
        else:
            how = f"{kernels[0].size // outputs} chunks per output, {LANES[kernels[0].lanes]} per chunk; then {LANES[kernels[1].lanes]} per output"
        return KernelLine(step=index, kind=self.kind, kernel=" + ".join(x.name for x in kernels), how=how, nodes=[lowered.label(n) for n in self.nodes],
                          elements=outputs, bytes=sum(x.bytes for x in kernels), flops=sum(x.flops for x in kernels), launches=len(kernels))


@dataclass
class RowGroup(OneKernelGroup):
    """A run of row-space steps computed by one kernel (rows.py makes them, row_kernel.py
    generates the kernel)."""

    space: Shape  # the row space (..., C)
    nodes: list[Node] = field(default_factory=list)  # in program order
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    kind: ClassVar[str] = "rows"

    def kernels(self, program: Program, constants: dict[int, Node]) -> list[KernelSource]:
        return [rows_kernel(self, program, constants)]

    def describe(self, index: int, lowered: Lowered) -> KernelLine:
        kernel = rows_kernel(self, lowered.program, lowered.constants)
        return KernelLine(step=index, kind=self.kind, kernel=kernel.name, how=f"{LANES[kernel.lanes]} per row", nodes=[lowered.label(n) for n in self.nodes],
                          elements=shape_size(self.space), bytes=kernel.bytes, flops=kernel.flops)


# -- one node each ----------------------------------------------------------------------------------
@dataclass
class NodeStep:
    """A step that computes one node from its arguments."""

    node: Node
    once: ClassVar[bool] = False

    @property
    def nodes(self) -> list[Node]:
        return [self.node]

    @property
    def reads(self) -> list[int]:
        return list(self.node.args)

    @property
    def writes(self) -> list[int]:
        return [self.node.id]

    @property
    def aliases(self) -> dict[int, int]:
        return {}

    def scratch_bytes(self, types: dict[int, TensorType]) -> int:
        return 0

    def kernels(self, program: Program, constants: dict[int, Node]) -> list[KernelSource]:
        return []

    def moved_bytes(self, types: dict[int, TensorType]) -> int:
        """Its arguments read and its result written once."""
        return sum(storage_bytes(types[a]) for a in self.node.args) + storage_bytes(self.node.type)


Generator = Callable[[Node, Program], KernelSource]


@dataclass
class KernelStep(NodeStep):
    """A node computed by one generated kernel over its arguments (moves.py's: transposes,
    slices, joins, gathers, argmax)."""

    generate: Generator
    kind: ClassVar[str] = "move"

    def kernels(self, program: Program, constants: dict[int, Node]) -> list[KernelSource]:
        return [self.generate(self.node, program)]

    def launch(self, run: StepRun, kernels: list[KernelSource]) -> None:
        launch_group(run, kernels[0], list(self.node.args), [self.node.id])

    def describe(self, index: int, lowered: Lowered) -> KernelLine:
        kernel = self.generate(self.node, lowered.program)
        return KernelLine(step=index, kind=self.kind, kernel=kernel.name, how="a thread per output element", nodes=[lowered.label(self.node)],
                          elements=kernel.size, bytes=kernel.bytes, flops=kernel.flops)


@dataclass
class ConstantStep(KernelStep):
    """A constant (full, arange, tril_mask, literal data) that no fused kernel takes as a
    literal: its kernel runs when the program first runs, and its buffer keeps the value for
    the program's life (no launch per run, as the NumPy plan computes constants once)."""

    kind: ClassVar[str] = "constant"
    once: ClassVar[bool] = True

    def describe(self, index: int, lowered: Lowered) -> KernelLine:
        kernel = self.generate(self.node, lowered.program)
        return KernelLine(step=index, kind=self.kind, kernel=kernel.name, how="once, when the program first runs", nodes=[lowered.label(self.node)],
                          elements=kernel.size, bytes=0, flops=0, launches=0)


@dataclass
class ScatterStep(NodeStep):
    """scatter_add along any axis (the embedding gradient along axis 0): positions sorted
    stably by index, then one thread per output element adds its values in that order:
    deterministic, no float atomics, and the same order (so the same f32 bits) as the CPU
    backend's np.add.at."""

    kind: ClassVar[str] = "scatter"

    def kernels(self, program: Program, constants: dict[int, Node]) -> list[KernelSource]:
        return [scatter_kernel(self.node, program)]

    def launch(self, run: StepRun, kernels: list[KernelSource]) -> None:
        """Sort the positions by index on the device (stable: equal indices keep their order),
        find each row's range, and let the kernel add the values in that order."""
        xp, node = run.xp, self.node
        axis = int(node.attrs.get("axis", 0)) % len(node.type.shape)
        rows = node.type.shape[axis]
        idx = xp.clip(run.value(node.args[1]).reshape(-1).astype(np.int64), 0, rows - 1)
        order = xp.ascontiguousarray(xp.argsort(idx, kind="stable").astype(np.int64))
        starts = xp.ascontiguousarray(xp.searchsorted(idx[order], xp.arange(rows + 1, dtype=np.int64)).astype(np.int64))
        out = run.buffer(node.id)
        run.launch(kernels[0], [run.contiguous(node.args[0]), order, starts, out])
        run.set(node.id, out)

    def describe(self, index: int, lowered: Lowered) -> KernelLine:
        kernel = scatter_kernel(self.node, lowered.program)
        return KernelLine(step=index, kind=self.kind, kernel=kernel.name, how="a thread per output element, over the positions sorted by index "
                          "(CuPy's stable argsort, on the device)", nodes=[lowered.label(self.node)],
                          elements=kernel.size, bytes=kernel.bytes, flops=kernel.flops)


@dataclass
class RandomStep(NodeStep):
    """A random op (dropout_mask, random_uniform in f32 or bf16) as a device Philox kernel
    with the CPU backend's bits: each element DRAW's value of its Philox word."""

    draw: Draw
    kind: ClassVar[str] = "random"

    def kernels(self, program: Program, constants: dict[int, Node]) -> list[KernelSource]:
        return [random_kernel(self.node, program, self.draw)]

    def launch(self, run: StepRun, kernels: list[KernelSource]) -> None:
        out = run.buffer(self.node.id)
        run.launch(kernels[0], [run.contiguous(self.node.args[0]), out])
        run.set(self.node.id, out)

    def describe(self, index: int, lowered: Lowered) -> KernelLine:
        kernel = random_kernel(self.node, lowered.program, self.draw)
        return KernelLine(step=index, kind=self.kind, kernel=kernel.name, how="Philox4x32-10, a thread per block of four elements",
                          nodes=[lowered.label(self.node)], elements=shape_size(self.node.type.shape), bytes=kernel.bytes, flops=kernel.flops)


@dataclass
class GemmCall(NodeStep):
    """One matmul through cuBLAS (bf16 inputs accumulate in f32): `calls`, from blas.py."""

    batch: int
    m: int
    n: int
    k: int
    # an operand that is a transpose of the last two axes is read untransposed, with
    # cuBLAS's transpose flag: the transpose costs no kernel and no memory
    a: int = -1
    b: int = -1
    trans_a: bool = False
    trans_b: bool = False
    calls: list[BlasCall] = field(default_factory=list)
    kind: ClassVar[str] = "gemm"

    @property
    def reads(self) -> list[int]:
        return [self.a, self.b]

    def launch(self, run: StepRun, kernels: list[KernelSource]) -> None:
        out = run.buffer(self.node.id)
        a, b = run.contiguous(self.a), run.contiguous(self.b)
        for call in self.calls:  # cuBLAS's first matrix is B (row-major C is its C^T)
            run.gemm(call, b, a, out)
        run.set(self.node.id, out)

    def describe(self, index: int, lowered: Lowered) -> KernelLine:
        types = lowered.program.types()
        node = self.node
        a = types[node.args[0]]
        precision = "bf16 in, f32 accumulate" if a.dtype == DType.bf16 else a.dtype.value
        calls = self.calls
        shape = f"{calls[0].batch}x" if calls[0].batch > 1 else ""
        flags = "".join(f", {x}^T" for x, t in (("A", self.trans_a), ("B", self.trans_b)) if t)
        count = f"{len(calls)} x " if len(calls) > 1 else ""
        return KernelLine(step=index, kind=self.kind, kernel=f"{count}{calls[0].name} {shape}{self.m}x{self.n}x{self.k} ({precision}{flags})",
                          nodes=[lowered.label(node)], elements=shape_size(node.type.shape), bytes=self.moved_bytes(types),
                          flops=2 * self.batch * self.m * self.n * self.k, launches=len(calls), cublas=len(calls))


@dataclass
class HostStep(NodeStep):
    """An op the table declares `on_host`: its NumPy kernel on host copies of its
    arguments, the result copied back to the device, every run."""

    kind: ClassVar[str] = "host"

    def launch(self, run: StepRun, kernels: list[KernelSource]) -> None:
        out = run.buffer(self.node.id)
        out[...] = run.host_op(self.node)
        run.set(self.node.id, out)

    def describe(self, index: int, lowered: Lowered) -> KernelLine:
        types = lowered.program.types()
        node = self.node
        copied = self.moved_bytes(types)
        return KernelLine(step=index, kind=self.kind, kernel="(on the host: the op table's NumPy kernel)", nodes=[lowered.label(node)],
                          elements=shape_size(node.type.shape), bytes=copied, flops=op_def(node.op).flops(node, [types[a] for a in node.args]),
                          launches=0, host_bytes=copied,
                          warning=f"{node.op} runs on the host: {copied:,} bytes cross between the host and the device each run")


@dataclass
class ViewStep(NodeStep):
    """A node that moves no data on the device: a reshape of a contiguous buffer, or a
    contiguous window of one (`start`: its first element in the source)."""

    start: int = 0
    kind: ClassVar[str] = "view"

    @property
    def aliases(self) -> dict[int, int]:
        return {self.node.id: self.node.args[0]}

    def launch(self, run: StepRun, kernels: list[KernelSource]) -> None:
        source = run.contiguous(self.node.args[0]).reshape(-1)
        run.set(self.node.id, source[self.start : self.start + shape_size(self.node.type.shape)].reshape(self.node.type.shape))

    def describe(self, index: int, lowered: Lowered) -> KernelLine:
        return KernelLine(step=index, kind=self.kind, kernel="(view: no kernel)", nodes=[lowered.label(self.node)],
                          elements=shape_size(self.node.type.shape), bytes=0, flops=0, launches=0)


# -- the rules: which node becomes which step -------------------------------------------------------
GENERATED_DTYPES = (DType.f32, DType.bf16)  # what cuBLAS and the random kernels compute here
REDUCED_DTYPES = (DType.f32, DType.bf16, DType.i32, DType.i64)  # what the reduction kernels read


@register_kind_lowering(OpKind.ELEMENTWISE)
def _elementwise(node: Node, context: LoweringContext) -> Placement:
    return Fuse()


@register_lowering("broadcast_to")
def _broadcast(node: Node, context: LoweringContext) -> Placement:
    """Fused: the broadcast is in the index its readers load through."""
    return Fuse()


@register_lowering("concat")
def _concat(node: Node, context: LoweringContext) -> Placement:
    """A concat of 1-D values (the optimizer's joined group): fused as a piecewise load;
    along another axis, a kernel of its own."""
    return Fuse(piecewise=True) if len(node.type.shape) == 1 else KernelStep(node, moves.concat_kernel)


@register_lowering("slice")
def _slice(node: Node, context: LoweringContext) -> Placement:
    """A contiguous window of a 1-D value (a parameter's part of the joined update): fused as
    a windowed store of the group that computes the value. A window that is one contiguous
    run of its source's memory is a view; any other, a kernel of its own."""
    if len(node.type.shape) == 1:
        return Fuse(window=(int(node.attrs["starts"][0]), int(node.attrs["stops"][0])))
    start = contiguous_window(tuple(context.types[node.args[0]].shape), list(node.attrs["starts"]), list(node.attrs["stops"]))
    return ViewStep(node, start) if start is not None else KernelStep(node, moves.slice_kernel)


def contiguous_window(shape: Shape, starts: list[int], stops: list[int]) -> Optional[int]:
    """The first element of the window [STARTS, STOPS) of SHAPE when the window is one
    contiguous run of memory (the axes after its last partial axis are whole, those before it
    one element wide), else None."""
    partial = [d for d in range(len(shape)) if (starts[d], stops[d]) != (0, shape[d])]
    if partial and any(stops[d] - starts[d] != 1 for d in range(partial[-1])):
        return None
    return sum(s * st for s, st in zip(starts, moves.strides(shape)))


@register_lowering("unslice")
def _unslice(node: Node, context: LoweringContext) -> Placement:
    return KernelStep(node, moves.unslice_kernel)


@register_lowering("full")
def _full(node: Node, context: LoweringContext) -> Placement:
    """A constant whose every reader is fused becomes a literal in their kernels (no memory,
    no kernel of its own); else it is made once."""
    if context.is_returned(node.id) or not all(takes_literals(context.place(r)) for r in context.readers(node.id)):
        return constant(node, context)
    return Absorbed.LITERAL


def takes_literals(placement: Placement) -> bool:
    return isinstance(placement, Fuse) and placement.takes_literals


CONSTANTS: dict[str, Generator] = {"full": moves.full_kernel, "arange": moves.arange_kernel, "tril_mask": moves.tril_kernel, "constant": moves.constant_kernel}


@register_lowering("arange", "tril_mask", "constant")
def _constant(node: Node, context: LoweringContext) -> Placement:
    return constant(node, context)


def constant(node: Node, context: LoweringContext) -> Placement:
    """Made once, unless the program returns it (a returned buffer is the caller's until the
    next run, so it is made every run)."""
    generate = CONSTANTS[node.op]
    return KernelStep(node, generate) if context.is_returned(node.id) else ConstantStep(node, generate)


@register_lowering("reshape")
def _reshape(node: Node, context: LoweringContext) -> Placement:
    return ViewStep(node)


@register_lowering("transpose")
def _transpose(node: Node, context: LoweringContext) -> Placement:
    return Absorbed.TRANSPOSE_FLAG if is_transpose_flag(node, context) else KernelStep(node, moves.transpose_kernel)


def is_transpose_flag(node: Node, context: LoweringContext) -> bool:
    """Whether NODE is a transpose of the last two axes that only matmuls read (and the
    program does not return): cuBLAS's transpose flag on its source, no step."""
    readers = context.readers(node.id)
    return (node.op == "transpose" and swaps_last_axes(node) and not context.is_returned(node.id) and bool(readers)
            and all(op_def(r.op).kind is OpKind.MATMUL for r in readers))


def swaps_last_axes(node: Node) -> bool:
    perm = list(node.attrs.get("perm", []))
    r = len(perm)
    return r >= 2 and perm == list(range(r - 2)) + [r - 1, r - 2]


@register_kind_lowering(OpKind.MATMUL)
def _matmul(node: Node, context: LoweringContext) -> Placement:
    a, b = (context.types[i] for i in node.args)
    out = node.type.shape
    batch = 1
    for d in out[:-2]:
        batch *= d
    call = GemmCall(node, batch=batch, m=out[-2], n=out[-1], k=a.shape[-1], a=node.args[0], b=node.args[1])
    source_a, source_b = (transposed_source(v, context) for v in node.args)
    if source_a is not None:
        call.a, call.trans_a = source_a, True
    if source_b is not None:
        call.b, call.trans_b = source_b, True
    if a.dtype not in GENERATED_DTYPES:
        raise LoweringError(f"matmul %{node.id}: cuBLAS computes f32 and bf16 here, not {a.dtype.value}")
    call.calls = matmul_calls(tuple(context.types[call.a].shape), tuple(context.types[call.b].shape), tuple(out), call.trans_a, call.trans_b, a.dtype)
    return call


def transposed_source(vid: int, context: LoweringContext) -> Optional[int]:
    """The value VID is the transpose of, when a matmul reads it through cuBLAS's flag."""
    producer = context.producer(vid)
    return producer.args[0] if producer is not None and is_transpose_flag(producer, context) else None


@register_lowering("sum", "mean", "max", "min")
def _reduction(node: Node, context: LoweringContext) -> Placement:
    dtype = context.types[node.args[0]].dtype
    if dtype not in REDUCED_DTYPES:
        raise LoweringError(f"{node.op} %{node.id}: the CUDA device reduces {', '.join(d.value for d in REDUCED_DTYPES)}, not {dtype.value}")
    return ReduceGroup(node)


@register_lowering("argmax")
def _argmax(node: Node, context: LoweringContext) -> Placement:
    return KernelStep(node, moves.argmax_kernel)


@register_lowering("scatter_add")
def _scatter_add(node: Node, context: LoweringContext) -> Placement:
    return ScatterStep(node)


@register_lowering("take")
def _take(node: Node, context: LoweringContext) -> Placement:
    return KernelStep(node, moves.take_kernel)


@register_lowering("dropout_mask")
def _dropout_mask(node: Node, context: LoweringContext) -> Placement:
    return RandomStep(node, dropout_draw)


@register_lowering("random_uniform")
def _random_uniform(node: Node, context: LoweringContext) -> Placement:
    if node.type.dtype not in GENERATED_DTYPES:
        raise LoweringError(f"random_uniform %{node.id}: the CUDA device draws f32 and bf16, not {node.type.dtype.value}")
    return RandomStep(node, uniform_draw)


@register_host_lowering
def _on_host(node: Node, context: LoweringContext) -> Placement:
    """An op the table declares `on_host` (random_normal: its bits must be the CPU's)."""
    return HostStep(node)


@register_kind_lowering(OpKind.CONSTANT, OpKind.REDUCTION, OpKind.ROW, OpKind.VIEW, OpKind.LAYOUT, OpKind.GATHER, OpKind.SCATTER,
                        OpKind.RANDOM, OpKind.IMAGE, OpKind.ATTENTION)
def _no_kernel(node: Node, context: LoweringContext) -> Placement:
    """An op of these kinds needs a rule of its own (its kernel); one without is an error
    here, never a silent detour. (A row op gets here only undecomposed: fusion.py builds each
    from its parts first.)"""
    raise LoweringError(f"op {node.op} (kind {op_def(node.op).kind.value}) has no CUDA kernel: register a lowering for it, or declare it on_host in the op table")
