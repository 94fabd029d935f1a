"""Row groups: softmax, log-softmax, layer-norm, rms-norm and cross-entropy as one kernel.

Those functions are staged as primitive ops (a max, a subtraction, an exp, a sum, a
division...), so the fusion pass sees a run of steps over one row space S = (..., C): fused
elementwise groups over S, reductions over S's last axis (keepdims), and elementwise work on
the reduced values. `fuse_rows` merges such a contiguous run into a RowGroup, and
`rows_kernel` computes it with one thread per row: one loop over the row per reduction (the
row-space values it needs are recomputed from the inputs in that loop), the reduced values in
registers, and a last loop that writes the row-space outputs. Only the group's inputs are
read and only the values used outside it are written.

A step joins the run only if everything it reads is made before the run starts or inside it,
so the merged plan stays acyclic; the run ends at the first step that cannot join.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal, Optional

from ...ir.dtypes import DType
from ...ir.graph import Node, Program, TensorType, shape_size
from ...ir.ops import op_def
from ...ir.ops_reduce import normalize_axes
from .codegen import BYTES, KernelSource, Param, broadcast_index, c_types, literal, node_expression
from .fusion import FusedGroup, ReduceGroup, Step

Shape = tuple[int, ...]


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
    if not isinstance(step, ReduceGroup) or step.node.op not in ("sum", "mean", "max", "min"):
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
    returned = set(program.outputs.values())
    readers: dict[int, set[int]] = {}
    for node in program.nodes:
        for a in node.args:
            readers.setdefault(a, set()).add(node.id)
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
        nodes = sorted((n for s in run for n in step_nodes(s)), key=lambda n: n.id)
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


def rows_kernel(group: RowGroup, program: Program, constants: dict[int, Node]) -> KernelSource:
    types = program.types()
    space = group.space
    width = space[-1]
    rows = shape_size(space) // width
    ids = group.ids
    row_nodes = [n for n in group.nodes if tuple(n.type.shape) == space and n.op not in ("sum", "mean", "max", "min")]
    reductions = [n for n in group.nodes if n.op in ("sum", "mean", "max", "min")]
    reduced_nodes = [n for n in group.nodes if n not in row_nodes and n not in reductions]
    params: list[Param] = []
    decls: list[str] = []
    input_index = {vid: k for k, vid in enumerate(group.inputs)}
    for k, vid in enumerate(group.inputs):
        t = types[vid]
        store, _ = c_types(t.dtype)
        decls.append(f"const {store}* __restrict__ in{k}")
        params.append(Param("in", vid, t.dtype, tuple(t.shape)))
    output_index = {vid: k for k, vid in enumerate(group.outputs)}
    for k, vid in enumerate(group.outputs):
        t = types[vid]
        store, _ = c_types(t.dtype)
        decls.append(f"{store}* __restrict__ out{k}")
        params.append(Param("out", vid, t.dtype, tuple(t.shape)))

    def load(vid: int, index: str, relative_to: Shape) -> str:
        t = types[vid]
        text = f"in{input_index[vid]}[{broadcast_index(tuple(t.shape), relative_to, index)}]"
        if t.dtype == DType.bf16:
            return f"sx_bf16_to_f32({text})"
        if t.dtype == DType.bool:
            return f"({text} != 0)"
        return text

    def store(vid: int, value: str, index: str) -> str:
        t = types[vid]
        if t.dtype == DType.bf16:
            value = f"sx_f32_to_bf16({value})"
        elif t.dtype == DType.bool:
            value = f"(unsigned char)({value})"
        return f"out{output_index[vid]}[{index}] = {value};"

    scalars: dict[int, str] = {}  # reduced values computed so far (registers for the row)

    def argument(a: int, names: dict[int, str], loads: dict[int, str], index: str, relative_to: Shape) -> str:
        if a in names:
            return names[a]
        if a in scalars:
            return scalars[a]
        if a in constants:
            return literal(constants[a].attrs["value"], constants[a].type.dtype)
        if a not in loads:
            loads[a] = f"x{a}"
        return loads[a]

    def row_lines(targets: list[int], indent: str) -> tuple[list[str], dict[int, str]]:
        """Lines computing the row-space nodes TARGETS need, at flat index idx."""
        needed: set[int] = set()
        stack = list(targets)
        while stack:
            v = stack.pop()
            if v in needed or v not in ids or v in scalars:
                continue
            node = next(n for n in group.nodes if n.id == v)
            if node in row_nodes:
                needed.add(v)
                stack.extend(node.args)
        names: dict[int, str] = {}
        loads: dict[int, str] = {}
        body: list[str] = []
        for node in row_nodes:
            if node.id not in needed:
                continue
            args = [argument(a, names, loads, "idx", space) for a in node.args]
            expression = node_expression(node, args, types)
            _, compute = c_types(node.type.dtype)
            if node.type.dtype == DType.bf16:
                expression = f"sx_bf16_round({expression})"
            names[node.id] = f"v{node.id}"
            body.append(f"{indent}const {compute} v{node.id} = {expression};")
        for a in targets:  # a target that is an input itself
            if a not in names and a not in scalars and a not in constants and a not in ids:
                argument(a, names, loads, "idx", space)
        head = []
        for a, name in loads.items():
            _, compute = c_types(types[a].dtype)
            head.append(f"{indent}const {compute} {name} = {load(a, 'idx', space)};")
        names.update(loads)
        return head + body, names

    lines: list[str] = []
    done_reduced: set[int] = set()

    def reduced_ready() -> None:
        progress = True
        while progress:
            progress = False
            for node in reduced_nodes:
                if node.id in done_reduced:
                    continue
                if not all(a in scalars or a in constants or (a not in ids) for a in node.args):
                    continue
                loads: dict[int, str] = {}
                args = [argument(a, {}, loads, "r", tuple(node.type.shape)) for a in node.args]
                for a, name in loads.items():
                    _, compute = c_types(types[a].dtype)
                    lines.append(f"    const {compute} {name}_{node.id} = {load(a, 'r', tuple(node.type.shape))};")
                args = [f"{x}_{node.id}" if x in loads.values() else x for x in args]
                expression = node_expression(node, args, types)
                _, compute = c_types(node.type.dtype)
                if node.type.dtype == DType.bf16:
                    expression = f"sx_bf16_round({expression})"
                lines.append(f"    const {compute} s{node.id} = {expression};")
                scalars[node.id] = f"s{node.id}"
                if node.id in output_index:
                    lines.append(f"    {store(node.id, scalars[node.id], 'r')}")
                done_reduced.add(node.id)
                progress = True

    reduced_ready()
    flops = 0
    for red in reductions:
        source = red.args[0]
        body, names = row_lines([source], "      ")
        x = names.get(source) or scalars.get(source)
        init = {"sum": "0.0", "mean": "0.0", "max": "-sx_inf()", "min": "sx_inf()"}[red.op]
        if red.op in ("sum", "mean"):
            step = f"acc += (double){x};"
        else:
            better = ">" if red.op == "max" else "<"
            step = f"if (acc == acc) {{ if ((double){x} {better} acc || {x} != {x}) acc = (double){x}; }}"
        acc = f"acc{red.id}"
        lines += [f"    double {acc} = {init};", f"    for (long long c = 0; c < {width}LL; ++c) {{", f"      const long long idx = r * {width}LL + c;",
                  *body, f"      {step.replace('acc', acc)}", "    }"]
        value = acc if red.op != "mean" else f"({acc} / {width}.0)"
        expression = f"(float){value}"
        if red.type.dtype == DType.bf16:
            expression = f"sx_bf16_round({expression})"
        lines.append(f"    const float s{red.id} = {expression};")
        scalars[red.id] = f"s{red.id}"
        if red.id in output_index:
            lines.append(f"    {store(red.id, scalars[red.id], 'r')}")
        flops += shape_size(space)
        reduced_ready()
    row_outputs = [v for v in group.outputs if v not in scalars]
    if row_outputs:
        body, names = row_lines(row_outputs, "      ")
        lines += [f"    for (long long c = 0; c < {width}LL; ++c) {{", f"      const long long idx = r * {width}LL + c;", *body]
        lines += [f"      {store(v, names[v], 'idx')}" for v in row_outputs]
        lines.append("    }")
    for node in row_nodes + reduced_nodes:
        flops += op_def(node.op).flops(node, [types[a] for a in node.args]) if node.op != "broadcast_to" else 0
    signature = ", ".join(decls + ["long long n"])
    text = (
        'extern "C" __global__ void {name}(' + signature + ") {{\n"
        "  for (long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x; r < n; r += (long long)blockDim.x * gridDim.x) {{\n"
        + "\n".join(lines).replace("{", "{{").replace("}", "}}") + "\n  }}\n}}\n"
    )
    name = f"sx_rows_{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    moved = sum(shape_size(p.shape) * BYTES[p.dtype] for p in params)
    return KernelSource(name=name, source=text.format(name=name), params=params, size=rows, flops=flops, bytes=moved)


__all__ = ["RowGroup", "fuse_rows", "rows_kernel"]
