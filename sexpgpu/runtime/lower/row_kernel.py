"""The kernel of a row group (rows.py): softmax, log-softmax, layer-norm, rms-norm and
cross-entropy as one kernel over the rows of a row space S = (..., C).

One warp per row (one thread per row when rows are shorter than a warp, a block per row
when they are thousands long): one loop over the row per reduction, its lanes striding along
the row (the row-space values it needs are recomputed from the inputs in that loop) and
their partial results combined in a fixed tree, the reduced values in registers, and a last
loop that writes the row-space outputs. Only the group's inputs are read and only the values
used outside it are written. The kernel is rendered from the group's description
(`row_description`, kernel_ir.RowKernel), which the host dialect renders too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Protocol

from ...ir.graph import Node, Program, Shape, TensorType, shape_size
from ...ir.ops import OpKind, op_def
from .codegen import GroupNodes, KernelSource, assemble, c_types, chain_lines, declare, load_expr, to_storage
from .kernel_ir import Accumulate, Alu, Load, Op, RowKernel, RowPass, RowPhase, RowReduce, RowScalar, Store, lanes_accumulate, reducer_of


class RowNodes(GroupNodes, Protocol):
    """The nodes one row kernel computes: row-space elementwise work, reductions over the
    row (keepdims), and elementwise work on the reduced values, in program order."""

    @property
    def space(self) -> Shape: ...


WARP_ROWS = 32  # rows at least this long get a warp each
BLOCK_ROWS = 4096  # and rows at least this long a block each (a vocabulary's logits)


def needed_row_nodes(targets: list[int], row_nodes: list[Node], by_id: Mapping[int, Node]) -> list[Node]:
    """The row-space nodes TARGETS depend on, in ROW_NODES' order (what a pass over a row
    group computes; the CUDA kernel and the host C share it)."""
    needed: set[int] = set()
    stack = list(targets)
    while stack:
        v = stack.pop()
        node = by_id.get(v)
        if node is not None and node in row_nodes and v not in needed:
            needed.add(v)
            stack.extend(node.args)
    return [n for n in row_nodes if n.id in needed]


@dataclass(frozen=True)
class RowParts:
    """A row group's nodes by role: the reductions over the row, the row-space nodes, and the
    reduced-space nodes (elementwise work on the reduced values), each in program order."""

    space: Shape
    reductions: list[Node]
    row_nodes: list[Node]
    reduced_nodes: list[Node]
    by_id: dict[int, Node]
    input_index: dict[int, int]
    output_index: dict[int, int]

    def row_ops(self, targets: list[int], types: dict[int, TensorType]) -> tuple[Op, ...]:
        """What one element of a pass over the row computes for TARGETS: the inputs it loads
        (at flat index idx of the row space) and the row-space nodes TARGETS need."""
        nodes = needed_row_nodes(targets, self.row_nodes, self.by_id)
        read = [a for n in nodes for a in n.args] + targets  # the targets themselves: a reduction straight over an input
        inputs = [Load(a, self.input_index[a], types[a], self.space) for a in dict.fromkeys(read) if a in self.input_index]
        return (*inputs, *[Alu(n) for n in nodes])

    def reduction(self, red: Node, types: dict[int, TensorType], lanes: str) -> Accumulate:
        """Reduction RED over row r's columns c."""
        width = self.space[-1]
        return Accumulate(f"acc{red.id}", reducer_of(red.op), False, "c", "0", f"{width}LL", f"r * {width}LL + c", self.row_ops([red.args[0]], types), red.args[0], lanes)


def row_parts(group: RowNodes) -> RowParts:
    space = tuple(group.space)
    reductions = [n for n in group.nodes if op_def(n.op).kind is OpKind.REDUCTION]
    row_nodes = [n for n in group.nodes if tuple(n.type.shape) == space and n not in reductions]
    reduced_nodes = [n for n in group.nodes if n not in row_nodes and n not in reductions]
    return RowParts(space, reductions, row_nodes, reduced_nodes, {n.id: n for n in group.nodes},
                    {vid: k for k, vid in enumerate(group.inputs)}, {vid: k for k, vid in enumerate(group.outputs)})


def row_lanes(width: int) -> str:
    """Who computes a row of WIDTH: a thread, a warp or a block."""
    return "block" if width >= BLOCK_ROWS else "warp" if width >= WARP_ROWS else "thread"


def row_description(group: RowNodes, types: dict[int, TensorType], constants: Mapping[int, Node], lanes: str) -> RowKernel:
    """GROUP as the description both dialects render: the reduced-space nodes as soon as their
    arguments are known, each reduction's accumulation, and a last pass for the row-space
    outputs (the row values each loop needs are recomputed from the inputs in it)."""
    parts = row_parts(group)
    space = tuple(group.space)
    known: set[int] = set()
    phases: list[RowPhase] = []

    def reduced_ready() -> None:
        for node in parts.reduced_nodes:
            if node.id in known or not all(a in known or a in constants or a not in parts.by_id for a in node.args):
                continue
            shape = tuple(node.type.shape)
            inputs = tuple(Load(a, parts.input_index[a], types[a], shape) for a in dict.fromkeys(node.args) if a in parts.input_index)
            phases.append(RowScalar(node, inputs, parts.output_index.get(node.id)))
            known.add(node.id)

    reduced_ready()
    for red in parts.reductions:
        phases.append(RowReduce(red, parts.reduction(red, types, lanes), parts.output_index.get(red.id)))
        known.add(red.id)
        reduced_ready()
    row_outputs = [v for v in group.outputs if v not in known]
    if row_outputs:
        stores = tuple(Store(v, parts.output_index[v], types[v].dtype) for v in row_outputs)
        phases.append(RowPass((*parts.row_ops(row_outputs, types), *stores)))
    return RowKernel(space, lanes, tuple(phases))


def rows_kernel(group: RowNodes, program: Program, constants: dict[int, Node], lanes: Optional[str] = None) -> KernelSource:
    """GROUP's kernel rendered from its description for CUDA, with a thread, a warp or a
    block per row (as LANES says; by default from the row length): the lanes stride each
    loop over the row and meet in the fixed tree; lane 0 stores the row's scalars."""
    types = program.types()
    desc = row_description(group, types, constants, lanes or row_lanes(group.space[-1]))
    width, lanes = desc.width, desc.lanes
    columns = f"for (long long c = 0; c < {width}LL; ++c) {{" if lanes == "thread" else f"for (long long c = lane; c < {width}LL; c += lanes) {{"
    only_lane0 = "" if lanes == "thread" else "if (lane == 0) "
    decls, params = declare(group.inputs, group.outputs, types)
    scalars: dict[int, str] = {}  # reduced values computed so far (registers for the row)
    lines: list[str] = []
    flops = 0
    for phase in desc.phases:
        if isinstance(phase, RowScalar):
            node = phase.node
            names = dict(scalars)
            for load in phase.loads:
                names[load.value] = f"x{load.value}_{node.id}"
                lines.append(f"    const {c_types(load.type.dtype)[1]} {names[load.value]} = {load_expr(load.param, load.type, load.space, 'r')};")
            more, _ = chain_lines([node], names, types, constants, "    ")
            lines += more
            scalars[node.id] = names[node.id]
            flops += op_def(node.op).flops(node, [types[a] for a in node.args])
        elif isinstance(phase, RowReduce):
            node = phase.node
            more, cost = lanes_accumulate(phase.accumulate, types, constants, scalars)
            flops += cost + shape_size(desc.space)
            lines += [*more, f"    const float s{node.id} = {desc.result(phase, phase.accumulate.acc)};"]
            scalars[node.id] = f"s{node.id}"
        else:
            names = dict(scalars)
            body = []
            for load in phase.loads:
                names[load.value] = f"x{load.value}"
                body.append(f"      const {c_types(load.type.dtype)[1]} x{load.value} = {load_expr(load.param, load.type, load.space, 'idx')};")
            more, _ = chain_lines(phase.nodes, names, types, constants, "      ")
            body += more
            body += [f"      out{store.param}[idx] = {to_storage(names[store.value], store.dtype)};" for store in phase.stores]
            lines += [f"    {columns}", f"      const long long idx = r * {width}LL + c;", *body, "    }"]
        if isinstance(phase, (RowScalar, RowReduce)) and phase.store is not None:
            lines.append(f"    {only_lane0}out{phase.store}[r] = {to_storage(scalars[phase.node.id], phase.node.type.dtype)};")
    return assemble("sx_rows", decls, "r", lines, params, desc.rows, flops, lanes=lanes)
