"""The kernel of a row group (rows.py): softmax, log-softmax, layer-norm, rms-norm and
cross-entropy as one kernel over the rows of a row space S = (..., C).

One warp per row (one thread per row when rows are shorter than a warp, a block per row
when they are thousands long): one loop over the row per reduction, its lanes striding along
the row (the row-space values it needs are recomputed from the inputs in that loop) and
their partial results combined in a fixed tree, the reduced values in registers, and a last
loop that writes the row-space outputs. Only the group's inputs are read and only the values
used outside it are written.
"""

from __future__ import annotations

from typing import Mapping, Optional, Protocol

from ...ir.dtypes import DType
from ...ir.graph import Node, Program, Shape, shape_size
from ...ir.ops import OpKind, op_def
from .codegen import GroupNodes, KernelSource, assemble, c_types, chain_lines, combine_lanes, declare, load_expr, to_storage


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

def rows_kernel(group: RowNodes, program: Program, constants: dict[int, Node], lanes: Optional[str] = None) -> KernelSource:
    """GROUP's kernel, with a thread, a warp or a block per row (as LANES says; by default
    from the row length)."""
    types = program.types()
    space = group.space
    width = space[-1]
    lanes = lanes or ("block" if width >= BLOCK_ROWS else "warp" if width >= WARP_ROWS else "thread")
    columns = f"for (long long c = 0; c < {width}LL; ++c) {{" if lanes == "thread" else f"for (long long c = lane; c < {width}LL; c += lanes) {{"
    only_lane0 = "" if lanes == "thread" else "if (lane == 0) "
    by_id = {n.id: n for n in group.nodes}
    reductions = [n for n in group.nodes if op_def(n.op).kind is OpKind.REDUCTION]
    row_nodes = [n for n in group.nodes if tuple(n.type.shape) == space and n not in reductions]
    reduced_nodes = [n for n in group.nodes if n not in row_nodes and n not in reductions]
    decls, params = declare(group.inputs, group.outputs, types)
    input_index = {vid: k for k, vid in enumerate(group.inputs)}
    output_index = {vid: k for k, vid in enumerate(group.outputs)}
    scalars: dict[int, str] = {}  # reduced values computed so far (registers for the row)
    lines: list[str] = []
    flops = 0

    def loads(nodes: list[Node], index: str, relative_to: Shape, indent: str, tag: str) -> tuple[list[str], dict[int, str]]:
        """The inputs NODES read, loaded at INDEX, and the names of everything they read."""
        names = dict(scalars)
        out = []
        for node in nodes:
            for a in node.args:
                if a in input_index and a not in names:
                    names[a] = f"x{a}{tag}"
                    out.append(f"{indent}const {c_types(types[a].dtype)[1]} {names[a]} = {load_expr(input_index[a], types[a], relative_to, index)};")
        return out, names

    def row_pass(targets: list[int]) -> tuple[list[str], dict[int, str], int]:
        """The loop body computing the row-space values TARGETS need, at flat index idx."""
        nodes = needed_row_nodes(targets, row_nodes, by_id)
        head, names = loads(nodes, "idx", space, "      ", "")
        for v in targets:  # a reduction straight over an input
            if v in input_index and v not in names:
                names[v] = f"x{v}"
                head.append(f"      const {c_types(types[v].dtype)[1]} x{v} = {load_expr(input_index[v], types[v], space, 'idx')};")
        body, cost = chain_lines(nodes, names, types, constants, "      ")
        return head + body, names, cost

    def reduced_ready() -> None:
        """Every reduced-space node whose arguments are known now, in order."""
        for node in reduced_nodes:
            if node.id in scalars or not all(a in scalars or a in constants or a not in by_id for a in node.args):
                continue
            head, names = loads([node], "r", tuple(node.type.shape), "    ", f"_{node.id}")
            body, _ = chain_lines([node], names, types, constants, "    ")
            lines.extend(head + body)
            scalars[node.id] = names[node.id]
            if node.id in output_index:
                lines.append(f"    {only_lane0}out{output_index[node.id]}[r] = {to_storage(scalars[node.id], node.type.dtype)};")

    reduced_ready()
    for red in reductions:
        body, names, cost = row_pass([red.args[0]])
        flops += cost + shape_size(space)
        x, acc = names[red.args[0]], f"acc{red.id}"
        if red.op in ("sum", "mean"):
            step, init = f"{acc} += (double){x};", "0.0"
        else:  # NaN wins, as in NumPy
            better = ">" if red.op == "max" else "<"
            step = f"if ({acc} == {acc}) {{ if ((double){x} {better} {acc} || {x} != {x}) {acc} = (double){x}; }}"
            init = "-sx_inf()" if red.op == "max" else "sx_inf()"
        lines += [f"    double {acc} = {init};", f"    {columns}", f"      const long long idx = r * {width}LL + c;",
                  *body, f"      {step}", "    }", *combine_lanes(acc, red.op, lanes)]
        value = f"(float){acc}" if red.op != "mean" else f"(float)({acc} / {width}.0)"
        lines.append(f"    const float s{red.id} = {f'sx_bf16_round({value})' if red.type.dtype == DType.bf16 else value};")
        scalars[red.id] = f"s{red.id}"
        if red.id in output_index:
            lines.append(f"    {only_lane0}out{output_index[red.id]}[r] = {to_storage(scalars[red.id], red.type.dtype)};")
        reduced_ready()
    row_outputs = [v for v in group.outputs if v not in scalars]
    if row_outputs:
        body, names, _ = row_pass(row_outputs)
        lines += [f"    {columns}", f"      const long long idx = r * {width}LL + c;", *body]
        lines += [f"      out{output_index[v]}[idx] = {to_storage(names[v], types[v].dtype)};" for v in row_outputs]
        lines.append("    }")
    flops += sum(op_def(n.op).flops(n, [types[a] for a in n.args]) for n in reduced_nodes)
    return assemble("sx_rows", decls, "r", lines, params, shape_size(space) // width, flops, lanes=lanes)
