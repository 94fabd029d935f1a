"""The row pass: softmax, log-softmax, layer-norm, rms-norm and cross-entropy as one step.

Those functions reach the fusion pass as primitive ops (a max, a subtraction, an exp, a sum,
a division...: staged so, or built so by their ops' `decompose`), so it sees a run of steps
over one row space S = (..., C): fused elementwise groups over S, reductions over S's last
axis (keepdims), and elementwise work on the reduced values. `fuse_rows` merges such a
contiguous run into a RowGroup, which row_kernel.py computes as one kernel.

A step joins the run only if everything it reads is made before the run starts or inside it,
so the merged plan stays acyclic; the run ends at the first step that cannot join.
"""

from __future__ import annotations

from typing import Optional

from ...ir.dtypes import DType
from ...ir.graph import Program, Shape, TensorType, readers_of
from ...ir.ops_reduce import normalize_axes
from .lowering import Step
from .steps import FusedGroup, ReduceGroup, RowGroup


def last_axis_reduction(step: Step, types: dict[int, TensorType]) -> Optional[Shape]:
    """The row space of a reduction over the last axis with keepdims (None otherwise)."""
    if not isinstance(step, ReduceGroup):
        return None
    space = tuple(types[step.node.args[0]].shape)
    if len(space) < 1 or space[-1] < 2 or not step.node.attrs.get("keepdims", False):
        return None
    if normalize_axes(step.node.op, step.node.attrs.get("axis"), len(space)) != [len(space) - 1]:
        return None
    if types[step.node.args[0]].dtype not in (DType.f32, DType.bf16):
        return None
    return space


def fits(step: Step, space: Shape, types: dict[int, TensorType], region: set[int], made: set[int], constants: set[int]) -> bool:
    reduced = space[:-1] + (1,)
    if isinstance(step, FusedGroup):
        if step.shape not in (space, reduced) or step.piecewise:
            return False
        if any(n.type.dtype not in (DType.f32, DType.bf16, DType.bool, DType.i32) for n in step.nodes):
            return False
        # a row-space node may read a reduced value only in its keepdims form
        for n in step.nodes:
            for a in n.args:
                if a in region and tuple(types[a].shape) not in (space, reduced):
                    return False
    elif last_axis_reduction(step, types) != space:
        return False
    return all(a in region or a in made or a in constants for a in step.reads)


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
            made |= set(step.writes)
            i += 1
            continue
        region: set[int] = set()
        j = start
        while j < len(steps) and fits(steps[j], space, types, region, made, constants):
            region |= {n.id for n in steps[j].nodes}
            j += 1
        run = steps[start:j]
        if len(run) < 2 or not any(isinstance(s, ReduceGroup) for s in run):
            out.append(step)
            made |= set(step.writes)
            i += 1
            continue
        nodes = sorted((n for s in run for n in s.nodes), key=lambda n: position[n.id])  # program order
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
