"""The kernel generators of the lowered steps: a fused elementwise group, a reduction (one
kernel, or two when it is split into chunks), the sorted scatter-add and the Philox random
ops; and `kernels_for`, every kernel a step launches. The row kernel is in row_kernel.py;
the C they are made of in codegen.py.

Each fused group and reduction is first a description (kernel_ir.py; `elementwise_description`,
`reduce_description`), which this module renders as CUDA and the host dialect
(runtime/cpu/hostc.py) as C for the CPU.

Fused group: a grid-stride loop over the group's element space; each input is loaded once
per element through its broadcast index (shapes are static, so the index arithmetic is
constants), every node is one line over registers, and the group's outputs are stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Union

import numpy as np

from ...ir.dtypes import DType
from ...ir.graph import Node, Program, Shape, TensorType, shape_size
from ...ir.ops_random import dropout_threshold
from ...ir.ops_reduce import normalize_axes
from .codegen import BYTES, GroupNodes, KernelSource, LoweringError, Param, assemble, c_types, chain_lines, combine_lanes, declare, from_storage, literal, load_expr, flat_index, to_storage
from .kernel_ir import Accumulate, Alu, Concat, Elementwise, Load, Op, Part, Store, Window, WindowStore, lanes_accumulate, reducer_of
from .lowering import Step

Draw = Callable[[Node], str]  # a random op's element from its Philox word w[l], as C


class FusedNodes(GroupNodes, Protocol):
    """The elementwise nodes one kernel computes over SHAPE."""

    @property
    def shape(self) -> Shape: ...

    @property
    def pieces(self) -> set[int]:
        """The 1-D concats, each part loaded inside its own range."""
        ...

    @property
    def windows(self) -> dict[int, tuple[int, int]]:
        """The 1-D slices, node -> [start, stop) of the loop index: windowed stores."""
        ...


class Reduction(Protocol):
    """A reduction node with the elementwise nodes that make its input (its prologue)."""

    @property
    def node(self) -> Node: ...

    @property
    def prologue(self) -> Optional[FusedNodes]: ...

    @property
    def inputs(self) -> list[int]: ...

    @property
    def sides(self) -> list[int]:
        """Values of the prologue the kernel also writes (other steps read them): each input
        element is visited once, so each is stored once."""
        ...


def kernels_for(step: Step, program: Program, constants: Optional[dict[int, Node]] = None) -> list[KernelSource]:
    """The generated kernels STEP launches, in launch order (none for a cuBLAS call, a view
    or array code)."""
    return step.kernels(program, constants or {})


def elementwise_description(group: FusedNodes, types: dict[int, TensorType]) -> Elementwise:
    """GROUP as the description both dialects render: the inputs it loads at each element
    (those only a concat reads are loaded inside the concat, in range only), its nodes, and
    its stores (a window's into its own buffer)."""
    space = tuple(group.shape)
    read_elsewhere = {a for n in group.nodes if n.id not in group.pieces for a in n.args}
    param = {vid: k for k, vid in enumerate(group.inputs)}
    ops: list[Union[Op, WindowStore]] = [Load(vid, k, types[vid], space) for k, vid in enumerate(group.inputs) if vid in read_elsewhere]
    for node in group.nodes:
        if node.id in group.pieces:
            parts, offset = [], 0
            for a in node.args:
                size = shape_size(types[a].shape)
                parts.append(Part(a, param.get(a), types[a].dtype, offset, offset + size))
                offset += size
            ops.append(Concat(node, tuple(parts)))
        elif node.id in group.windows:
            ops.append(Window(node, *group.windows[node.id]))
        else:
            ops.append(Alu(node))
    for k, vid in enumerate(group.outputs):
        if vid in group.windows:
            ops.append(WindowStore(vid, k, types[vid].dtype, *group.windows[vid]))
        else:
            ops.append(Store(vid, k, types[vid].dtype))
    return Elementwise(space, tuple(ops))


def elementwise_kernel(group: FusedNodes, program: Program, constants: Optional[dict[int, Node]] = None) -> KernelSource:
    """The kernel computing GROUP (its inputs are read, its outputs written), rendered from
    its description for CUDA: a thread per element i, in a grid-stride loop."""
    types = program.types()
    constants = constants or {}
    desc = elementwise_description(group, types)
    decls, params = declare(group.inputs, group.outputs, types)
    names: dict[int, str] = {}
    lines: list[str] = []
    flops = 0
    windowed: dict[tuple[int, int], list[str]] = {}
    for op in desc.ops:
        if isinstance(op, Load):
            names[op.value] = f"a{op.param}"
            lines.append(f"    const {c_types(op.type.dtype)[1]} a{op.param} = {load_expr(op.param, op.type, desc.space, 'i')};")
        elif isinstance(op, Concat):
            names[op.node.id] = f"v{op.node.id}"
            lines.append(f"    const {c_types(op.node.type.dtype)[1]} v{op.node.id} = {piecewise(op, constants)};")
        elif isinstance(op, Window):
            names[op.node.id] = names[op.node.args[0]]
        elif isinstance(op, Alu):
            more, cost = chain_lines([op.node], names, types, constants, "    ")
            lines += more
            flops += cost
        elif isinstance(op, WindowStore):  # a window of the loop: its own buffer, from its start
            windowed.setdefault((op.start, op.stop), []).append(f"out{op.param}[i - {op.start}LL] = {to_storage(names[op.value], op.dtype)};")
        else:
            lines.append(f"    out{op.param}[i] = {to_storage(names[op.value], op.dtype)};")
    lines += window_stores(sorted(windowed.items()))
    return assemble("sx_fused", decls, "i", lines, params, shape_size(desc.space), flops)


def window_stores(ranges: list[tuple[tuple[int, int], list[str]]]) -> list[str]:
    """The windowed stores, each range's inside its own range: a balanced tree of
    comparisons where the ranges do not overlap (the joined update's parameters), so an
    element meets a log2 of them, not each."""
    apart = all(ranges[k][0][0] >= ranges[k - 1][0][1] for k in range(1, len(ranges)))
    if not apart:
        return [f"    if (i >= {a}LL && i < {b}LL) {{ {' '.join(stores)} }}" for (a, b), stores in ranges]

    def tree(lo: int, hi: int, indent: str) -> list[str]:
        if hi - lo == 1:
            (a, b), stores = ranges[lo]
            return [f"{indent}if (i >= {a}LL && i < {b}LL) {{ {' '.join(stores)} }}"]
        mid = (lo + hi) // 2
        return [f"{indent}if (i < {ranges[mid][0][0]}LL) {{", *tree(lo, mid, indent + "  "), f"{indent}}} else {{", *tree(mid, hi, indent + "  "), f"{indent}}}"]
    return tree(0, len(ranges), "    ") if ranges else []


def piecewise(concat: Concat, constants: dict[int, Node]) -> str:
    """A 1-D concat at loop index i: each part read only inside its own range."""
    parts: list[tuple[int, str]] = []
    for part in concat.parts:
        if part.value in constants:
            value = literal(constants[part.value].attrs["value"], constants[part.value].type.dtype)
        elif part.param is not None:
            value = from_storage(f"in{part.param}[i - {part.start}LL]", part.dtype)
        else:
            raise LoweringError(f"concat %{concat.node.id}: part %{part.value} is neither an input of the kernel nor a constant")
        parts.append((part.stop, value))
    return split_at_ends(parts, 0, len(parts))


def split_at_ends(parts: list[tuple[int, str]], lo: int, hi: int) -> str:
    """The value of the part of PARTS[LO:HI] (each (end, value), in order) that holds i, as a
    balanced tree of comparisons: a log2 of the parts deep, not one per part (the optimizer's
    joined update has one per parameter)."""
    if hi - lo == 1:
        return parts[lo][1]
    mid = (lo + hi) // 2
    return f"(i < {parts[mid - 1][0]}LL ? {split_at_ends(parts, lo, mid)} : {split_at_ends(parts, mid, hi)})"


@dataclass(frozen=True)
class ReduceStrategy:
    lanes: str  # who reduces one output (or one chunk of it): "thread", "warp" or "block"
    split: int = 1  # chunks per output: > 1 is a partial-results kernel, then a finishing one


def reduce_strategy(outputs: int, extent: int, innermost: bool, integer: bool) -> ReduceStrategy:
    """How a reduction of EXTENT elements into each of OUTPUTS spreads over the GPU.
    INNERMOST: the reduced axes include the last one (lanes stride along memory: a warp or a
    block per output coalesces); otherwise neighbouring outputs are neighbours in memory and a
    thread per output coalesces. Few outputs of many elements are split into chunks, so that
    enough threads work; the chunks' partial results are combined by a second kernel."""
    if integer or extent < 32:
        return ReduceStrategy("thread")
    if not innermost:
        if outputs >= 16384 or outputs * extent < 1 << 16:
            return ReduceStrategy("thread")
        split = min(1024, extent // 16, -(-65536 // outputs))
        return ReduceStrategy("thread", split) if split >= 2 else ReduceStrategy("thread")
    if outputs * extent >= 1 << 20 and outputs < 2048:
        split = min(1024, -(-extent // 8192))
        if split >= 2:
            return ReduceStrategy("block", split)
    return ReduceStrategy("warp")


def reduce_geometry(group: Reduction, types: dict[int, TensorType]) -> tuple[list[int], int, int, bool]:
    """A reduction's reduced axes, elements per output, outputs, and whether its input is integer."""
    node = group.node
    in_t = types[node.args[0]]
    axes = normalize_axes(node.op, node.attrs.get("axis"), len(in_t.shape))
    reduced = 1
    for d in axes:
        reduced *= in_t.shape[d]
    return axes, reduced, shape_size(node.type.shape) or 1, in_t.dtype in (DType.i32, DType.i64)


def planned_strategy(group: Reduction, types: dict[int, TensorType]) -> ReduceStrategy:
    axes, reduced, outputs, integer = reduce_geometry(group, types)
    return reduce_strategy(outputs, reduced, bool(axes) and axes[-1] == len(types[group.node.args[0]].shape) - 1, integer)


def axis_coords(space: tuple[int, ...]) -> Callable[[list[int]], list[tuple[int, int, int]]]:
    """For a row-major array of SPACE: given some of its axes, each axis's (extent, stride
    among those axes, stride in memory), innermost first, to split a flat index over them."""
    mem = [1] * len(space)
    for d in range(len(space) - 2, -1, -1):
        mem[d] = mem[d + 1] * space[d + 1]

    def coords(dims: list[int]) -> list[tuple[int, int, int]]:
        out, stride = [], 1
        for d in reversed(dims):
            out.append((space[d], stride, mem[d]))
            stride *= space[d]
        return out
    return coords


@dataclass(frozen=True)
class ReduceKernel:
    """A reduction's kernel description: output o (or, split, item = chunk c of output o)
    accumulates its elements jj in [FIRST, END) at idx = base + WITHIN, base = BASE (over o)."""

    node: Node
    outputs: int  # outputs of the reduction
    count: int  # elements per output
    split: int
    base: str
    within: str
    accumulate: Accumulate
    sides: tuple[int, ...]
    innermost: bool  # the reduced axes include the last one (an output's elements are neighbours in memory)

    @property
    def finish_lanes(self) -> str:
        """Who combines a split reduction's chunks per output, in chunk order: a thread, or a
        warp when the chunks had cooperating lanes."""
        return "thread" if self.accumulate.lanes == "thread" else "warp"

    def result(self, acc: str) -> str:
        """The accumulated ACC as the output's storage holds it."""
        value = self.accumulate.reducer.finish(acc, self.count)
        out_t = self.node.type
        return to_storage(f"(float){value}", out_t.dtype) if out_t.dtype == DType.bf16 else f"({c_types(out_t.dtype)[0]}){value}"


def reduce_description(group: Reduction, types: dict[int, TensorType], strategy: Optional[ReduceStrategy] = None) -> ReduceKernel:
    """GROUP's reduction as a description both dialects render: the strategy (chosen from the
    shapes unless given) says who shares each output's loop and in how many chunks."""
    node = group.node
    in_t = types[node.args[0]]
    space = tuple(in_t.shape)
    axes, reduced_size, outputs, integer = reduce_geometry(group, types)
    strategy = strategy or planned_strategy(group, types)
    # integers stay exact only in a thread's 64-bit accumulator (the lanes' tree and the chunks' partials are f64)
    if integer and (strategy.lanes != "thread" or strategy.split > 1) or strategy.split > reduced_size:
        raise LoweringError(f"reduction %{node.id}: strategy {strategy} does not fit {in_t}")
    kept = [d for d in range(len(space)) if d not in axes]
    coords = axis_coords(space)
    split = strategy.split
    chunk = -(-reduced_size // split)
    first = "0" if split == 1 else f"c * {chunk}LL"
    end = f"{reduced_size}LL" if split == 1 else f"(c * {chunk}LL + {chunk}LL < {reduced_size}LL ? c * {chunk}LL + {chunk}LL : {reduced_size}LL)"
    ops: list[Op] = [Load(vid, k, types[vid], space) for k, vid in enumerate(group.inputs)]
    ops += [Alu(n) for n in (group.prologue.nodes if group.prologue is not None else [])]
    ops += [Store(v, k + 1, types[v].dtype) for k, v in enumerate(group.sides)]
    within = flat_index(coords(axes), "jj", reduced_size)
    acc = Accumulate("acc", reducer_of(node.op), integer, "jj", first, end, f"base + {within}", tuple(ops), node.args[0], strategy.lanes)
    innermost = bool(axes) and axes[-1] == len(space) - 1
    return ReduceKernel(node, outputs, reduced_size, split, flat_index(coords(kept), "o", outputs), within, acc, tuple(group.sides), innermost)


def reduce_kernels(group: Reduction, program: Program, constants: Optional[dict[int, Node]] = None,
                   strategy: Optional[ReduceStrategy] = None) -> list[KernelSource]:
    """A reduction as one kernel, or two when it is split (partial results per chunk, then
    their combination): each output (or chunk) by a thread, a warp or a block (the
    strategy), looping over its elements in a fixed order and combining the lanes in a fixed
    tree (deterministic), accumulating in double (ints in 64 bits); the prologue (the fused
    group that makes the reduction's input) is computed per element inside the loop, and the
    values of it that other steps read (its sides) are stored there."""
    types = program.types()
    desc = reduce_description(group, types, strategy)
    node = group.node
    lanes, split, outputs = desc.accumulate.lanes, desc.split, desc.outputs
    only_lane0 = "" if lanes == "thread" else "if (lane == 0) "
    loop, flops = lanes_accumulate(desc.accumulate, types, constants or {}, {})
    flops += desc.count * outputs
    body = [*([f"    const long long o = item % {outputs}LL, c = item / {outputs}LL;"] if split > 1 else []), f"    const long long base = {desc.base};", *loop]
    sides = list(desc.sides)
    if split == 1:
        decls, params = declare(group.inputs, [node.id] + sides, types)
        body.append(f"    {only_lane0}out0[o] = {desc.result('acc')};")
        return [assemble(f"sx_reduce_{node.op}", decls, "o", body, params, outputs, flops, lanes=lanes)]
    decls, params = declare(group.inputs, [], types)
    decls.append("double* __restrict__ out0")
    params.append(Param("out", -1, DType.f64, (split * outputs,)))
    for k, v in enumerate(sides):
        decls.append(f"{c_types(types[v].dtype)[0]}* __restrict__ out{k + 1}")
        params.append(Param("out", v, types[v].dtype, tuple(types[v].shape)))
    body.append(f"    {only_lane0}out0[item] = acc;")
    partials = assemble(f"sx_reduce_{node.op}_chunks", decls, "item", body, params, split * outputs, flops, lanes=lanes)
    # the chunks' partial results, combined per output in chunk order
    finish_lanes = desc.finish_lanes
    reducer = desc.accumulate.reducer
    loop_c = f"for (long long c = 0; c < {split}LL; ++c) {{" if finish_lanes == "thread" else f"for (long long c = lane; c < {split}LL; c += lanes) {{"
    out_t = node.type
    store, _ = c_types(out_t.dtype)
    finish = [
        f"    double acc = {reducer.start(False)};", f"    {loop_c}", f"      const double p = in0[c * {outputs}LL + o];", f"      acc = {reducer.pair('acc', 'p')};", "    }",
        *combine_lanes("acc", reducer, finish_lanes), f"    {'' if finish_lanes == 'thread' else 'if (lane == 0) '}out0[o] = {desc.result('acc')};",
    ]
    finish_params = [Param("in", -1, DType.f64, (split * outputs,)), Param("out", node.id, out_t.dtype, tuple(out_t.shape))]
    done = assemble(f"sx_reduce_{node.op}_finish", ["const double* __restrict__ in0", f"{store}* __restrict__ out0"], "o", finish, finish_params,
                    outputs, split * outputs, lanes=finish_lanes)
    return [partials, done]


def scatter_kernel(node: Node, program: Program) -> KernelSource:
    """scatter_add along its axis over the positions sorted by index (`order`) and each
    output row's range in them (`starts`, rows + 1 entries): one thread per output element
    adds its values in index order, floats in f32 (rounded once for bf16), integers in 64
    bits."""
    types = program.types()
    values_t = types[node.args[0]]
    shape = tuple(node.type.shape)
    axis = int(node.attrs.get("axis", 0)) % len(shape)
    rows = shape[axis]
    inner = shape_size(shape[axis + 1:])
    positions = shape_size(types[node.args[1]].shape)
    dtype = node.type.dtype
    store, _ = c_types(dtype)
    integer = dtype in (DType.i32, DType.i64)
    acc = "long long" if integer else "float"
    value = f"g[(o * {positions}LL + order[p]) * {inner}LL + c]"
    body = [
        f"    const long long c = e % {inner}LL;",
        f"    const long long r = (e / {inner}LL) % {rows}LL;",
        f"    const long long o = e / {rows * inner}LL;",
        f"    {acc} acc = 0;",
        f"    for (long long p = starts[r]; p < starts[r + 1]; ++p) acc += {value if integer else from_storage(value, dtype)};",
        f"    out[e] = {f'({store})acc' if integer else to_storage('acc', dtype)};",
    ]
    decls = [f"const {store}* __restrict__ g", "const long long* __restrict__ order", "const long long* __restrict__ starts", f"{store}* __restrict__ out"]
    params = [
        Param("in", node.args[0], values_t.dtype, tuple(values_t.shape)),
        Param("in", -1, DType.i64, (positions,)),
        Param("in", -2, DType.i64, (rows + 1,)),
        Param("out", node.id, dtype, shape),
    ]
    return assemble("sx_scatter_sorted", decls, "e", body, params, shape_size(shape), shape_size(values_t.shape))


def random_kernel(node: Node, program: Program, draw: Draw) -> KernelSource:
    """A random op as a device kernel: one thread per Philox block of four elements, the
    derivation of ir/ops_random.py word for word, each element DRAW's value of its word
    `w[l]`, so the bits equal the CPU backend's."""
    types = program.types()
    step_t = types[node.args[0]]
    step_store, _ = c_types(step_t.dtype)
    size = shape_size(node.type.shape)
    out_store, _ = c_types(node.type.dtype)
    seed, key = int(node.attrs["seed"]) & 0xFFFFFFFF, int(node.attrs["key"]) & 0xFFFFFFFF
    value = draw(node)
    body = [
        "    unsigned int w[4] = {(unsigned int)((unsigned long long)b & 0xffffffffu), (unsigned int)((unsigned long long)b >> 32), "
        "(unsigned int)(s & 0xffffffffu), (unsigned int)(s >> 32)};",
        f"    sx_philox(w, {seed}u, {key}u);",
        "    for (int l = 0; l < 4; ++l) {",
        "      const long long i = 4 * b + l;",
        f"      if (i < {size}LL) out[i] = {value};",
        "    }",
    ]
    decls = [f"const {step_store}* __restrict__ step", f"{out_store}* __restrict__ out"]
    params = [Param("in", node.args[0], step_t.dtype, ()), Param("out", node.id, node.type.dtype, tuple(node.type.shape))]
    return assemble(f"sx_{node.op}", decls, "b", body, params, (size + 3) // 4, size * 20,
                    before=("  const unsigned long long s = (unsigned long long)(long long)step[0];",), moved=size * BYTES[node.type.dtype])


def dropout_draw(node: Node) -> str:
    """dropout_mask's element: kept when its word's top 24 bits reach the rate's threshold."""
    return to_storage(f"(w[l] >> 8) >= {dropout_threshold(node.attrs['rate'])}u", DType.bool)


def uniform_draw(node: Node) -> str:
    """random_uniform's element (f32, bf16): low + width * U in f32, with no fused multiply-add."""
    low32 = float(np.float32(node.attrs.get("low", 0.0)))
    width32 = float(np.float32(np.float32(node.attrs.get("high", 1.0)) - np.float32(low32)))
    u = "((float)(w[l] >> 8) * 5.9604644775390625e-08f)"
    return to_storage(f"sx_fadd({literal(low32, DType.f32)}, sx_fmul({literal(width32, DType.f32)}, {u}))", node.type.dtype)
