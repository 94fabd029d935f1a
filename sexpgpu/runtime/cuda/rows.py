"""Row groups: softmax, log-softmax, layer-norm, rms-norm and cross-entropy as one kernel.

Those functions are staged as primitive ops (a max, a subtraction, an exp, a sum, a
division...), so the fusion pass sees a run of steps over one row space S = (..., C): fused
elementwise groups over S, reductions over S's last axis (keepdims), and elementwise work on
the reduced values. `fuse_rows` merges such a contiguous run into a RowGroup, and
`rows_kernel` computes it with one warp per row (one thread per row when rows are shorter
than a warp, a block per row when they are thousands long): one loop over the row per
reduction, its lanes striding along the row (the
row-space values it needs are recomputed from the inputs in that loop) and their partial
results combined in a fixed tree, the reduced values in registers, and a last loop that
writes the row-space outputs. Only the group's inputs are
read and only the values used outside it are written.

A step joins the run only if everything it reads is made before the run starts or inside it,
so the merged plan stays acyclic; the run ends at the first step that cannot join.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from ...ir.dtypes import DType
from ...ir.graph import Node, Program, TensorType, shape_size
from ...ir.ops import op_def
from ...ir.ops_reduce import normalize_axes
from .codegen import KernelSource, assemble, c_types, chain_lines, combine_lanes, declare, load_expr, to_storage
from .fusion import FusedGroup, ReduceGroup, Step, readers_of

Shape = tuple[int, ...]
REDUCE_OPS = ("sum", "mean", "max", "min")


@dataclass
class RowGroup:
    space: Shape  # the row space (..., C)
    nodes: list[Node] = field(default_factory=list)  # in program order
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    kind: Literal["rows"] = "rows"

    @property
    def ids(self) -> set[int]:
        return {n.id for n in self.nodes}


def last_axis_reduction(step: Step, types: dict[int, TensorType]) -> Optional[Shape]:
    """The row space of a reduction over the last axis with keepdims (None otherwise)."""
    if not isinstance(step, ReduceGroup) or step.node.op not in REDUCE_OPS:
        return None
    space = tuple(types[step.node.args[0]].shape)
    if len(space) < 1 or space[-1] < 2 or not step.node.attrs.get("keepdims", False):
        return None
    if normalize_axes(step.node.op, step.node.attrs.get("axis"), len(space)) != [len(space) - 1]:
        return None
    if types[step.node.args[0]].dtype not in (DType.f32, DType.bf16):
        return None
    return space


def step_nodes(step: Step) -> list[Node]:
    if isinstance(step, FusedGroup):
        return list(step.nodes)
    if isinstance(step, ReduceGroup):
        return (list(step.prologue.nodes) if step.prologue is not None else []) + [step.node]
    return []


def step_reads(step: Step) -> list[int]:
    return list(step.inputs) if isinstance(step, (FusedGroup, ReduceGroup)) else []


def fits(step: Step, space: Shape, types: dict[int, TensorType], region: set[int], made: set[int], constants: set[int]) -> bool:
    reduced = space[:-1] + (1,)
    if isinstance(step, FusedGroup):
        if step.shape not in (space, reduced):
            return False
        if any(n.type.dtype not in (DType.f32, DType.bf16, DType.bool, DType.i32) or n.op in ("concat", "slice") for n in step.nodes):
            return False
        # a row-space node may read a reduced value only in its keepdims form
        for n in step.nodes:
            for a in n.args:
                if a in region and tuple(types[a].shape) not in (space, reduced):
                    return False
    elif last_axis_reduction(step, types) != space:
        return False
    return all(a in region or a in made or a in constants for a in step_reads(step))


def fuse_rows(steps: list[Step], program: Program, constants: set[int]) -> list[Step]:
    """Merge contiguous runs of row-space steps that contain at least one reduction and at
    least two steps into RowGroups."""
    types = program.types()
    position = {n.id: k for k, n in enumerate(program.nodes)}
    returned = set(program.outputs.values())
    readers = {v: {n.id for n in nodes} for v, nodes in readers_of(program).items()}
    made: set[int] = {i.id for i in program.inputs}
    out: list[Step] = []
    i = 0
    while i < len(steps):
        step = steps[i]
        space = last_axis_reduction(step, types)
        # a run may also start with the elementwise group that feeds its first reduction
        start = i
        if space is None and isinstance(step, FusedGroup) and i + 1 < len(steps):
            space = last_axis_reduction(steps[i + 1], types)
            if space is not None and step.shape != space:
                space = None
        if space is None:
            out.append(step)
            made |= produced(step)
            i += 1
            continue
        region: set[int] = set()
        j = start
        while j < len(steps) and fits(steps[j], space, types, region, made, constants):
            region |= {n.id for n in step_nodes(steps[j])}
            j += 1
        run = steps[start:j]
        if len(run) < 2 or not any(isinstance(s, ReduceGroup) for s in run):
            out.append(step)
            made |= produced(step)
            i += 1
            continue
        nodes = sorted((n for s in run for n in step_nodes(s)), key=lambda n: position[n.id])  # program order
        group = RowGroup(space=space, nodes=nodes)
        ids = group.ids
        for n in nodes:
            for a in n.args:
                if a not in ids and a not in constants and a not in group.inputs:
                    group.inputs.append(a)
        group.outputs = [n.id for n in nodes if n.id in returned or readers.get(n.id, set()) - ids]
        out.append(group)
        made |= set(group.outputs)
        i = j
    return out


def produced(step: Step) -> set[int]:
    if isinstance(step, FusedGroup):
        return set(step.outputs)
    node = getattr(step, "node", None)
    return {node.id} if node is not None else set()


WARP_ROWS = 32  # rows at least this long get a warp each
BLOCK_ROWS = 4096  # and rows at least this long a block each (a vocabulary's logits)


def rows_kernel(group: RowGroup, program: Program, constants: dict[int, Node], lanes: Optional[str] = None) -> KernelSource:
    """GROUP's kernel, with a thread, a warp or a block per row (as LANES says; by default
    from the row length)."""
    types = program.types()
    space = group.space
    width = space[-1]
    lanes = lanes or ("block" if width >= BLOCK_ROWS else "warp" if width >= WARP_ROWS else "thread")
    columns = f"for (long long c = 0; c < {width}LL; ++c) {{" if lanes == "thread" else f"for (long long c = lane; c < {width}LL; c += lanes) {{"
    only_lane0 = "" if lanes == "thread" else "if (lane == 0) "
    by_id = {n.id: n for n in group.nodes}
    row_nodes = [n for n in group.nodes if tuple(n.type.shape) == space and n.op not in REDUCE_OPS]
    reductions = [n for n in group.nodes if n.op in REDUCE_OPS]
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
        needed: set[int] = set()
        stack = list(targets)
        while stack:
            v = stack.pop()
            node = by_id.get(v)
            if node is not None and node in row_nodes and v not in needed:
                needed.add(v)
                stack.extend(node.args)
        nodes = [n for n in row_nodes if n.id in needed]
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
    flops += sum(op_def(n.op).flops(n, [types[a] for a in n.args]) for n in reduced_nodes if n.op != "broadcast_to")
    return assemble("sx_rows", decls, "r", lines, params, shape_size(space) // width, flops, lanes=lanes)


__all__ = ["RowGroup", "fuse_rows", "rows_kernel"]
