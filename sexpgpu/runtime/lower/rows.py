"""The row pass: softmax, log-softmax, layer-norm, rms-norm and cross-entropy as one step.

Those functions reach the fusion pass as primitive ops (a max, a subtraction, an exp, a sum,
a division...: staged so, or built so by their ops' `decompose`), so it sees a run of steps
over one row space S = (..., C): fused elementwise groups over S, reductions over S's last
axis (keepdims), and elementwise work on the reduced values. `fuse_rows` merges such a
contiguous run into a RowGroup, which row_kernel.py computes as one kernel.

A step joins the run only if everything it reads is made before the run starts or inside it,
so the merged plan stays acyclic; a step in between that depends on nothing the run makes (a
parameter's cast) runs before the run instead; the run ends at the first step that can do
neither.
"""

from __future__ import annotations

from typing import Optional

from ...ir.dtypes import DType
from ...ir.graph import Program, Shape, TensorType
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
    read_by: dict[int, set[int]] = {}  # value -> the steps that read it
    for k, step in enumerate(steps):
        for v in step.reads:
            read_by.setdefault(v, set()).add(k)
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
        members: list[int] = []  # the run's steps
        hoisted: list[int] = []  # steps among them that do not depend on it: they run before it
        available = set(made)
        j = start
        while j < len(steps):
            candidate = steps[j]
            if fits(candidate, space, types, region, available, constants):
                members.append(j)
                region |= {n.id for n in candidate.nodes}
            elif members and not set(candidate.reads) & region and all(a in available or a in constants for a in candidate.reads):
                hoisted.append(j)  # a parameter's cast, say, between a norm's parts
                available |= set(candidate.writes)
            else:
                break
            j += 1
        end = members[-1] + 1 if members else start
        hoisted = [k for k in hoisted if k < end]
        run = [steps[k] for k in members]
        if len(run) < 2 or not any(isinstance(s, ReduceGroup) for s in run):
            out.append(step)
            made |= set(step.writes)
            i += 1
            continue
        for k in hoisted:
            out.append(steps[k])
            made |= set(steps[k].writes)
        # program order; a node two of the steps compute (one recomputes it) once
        nodes = sorted({n.id: n for s in run for n in s.nodes}.values(), key=lambda n: position[n.id])
        group = RowGroup(space=space, nodes=nodes)
        ids = group.ids
        for n in nodes:
            for a in n.args:
                if a not in ids and a not in constants and a not in group.inputs:
                    group.inputs.append(a)
        # what the steps wrote that is read outside the run (each value has one writer)
        written = [v for s in run for v in s.writes]
        group.outputs = [v for v in sorted(written, key=lambda v: position[v]) if v in returned or read_by.get(v, set()) - set(members)]
        out.append(group)
        made |= set(group.outputs)
        i = end
    return out
