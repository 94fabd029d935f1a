"""How the CUDA device lowers an IR program: fusion groups, cuBLAS calls, other kernels.

Every node is placed by its op's rule (lowering.py's registry, filled by steps.py, images.py
and attention.py, which this module imports): elementwise ops (and `broadcast_to`, 1-D joins
and windows, scalar `full` constants) that compute over the same element space are fused into
one group, which becomes one generated kernel: its values live in registers, only the group's
inputs are read and only the values used outside it (or returned by the program) are written.
Matmuls are cuBLAS calls. Every other op is a step of its own: generated kernels (reductions,
moves, gathers, the deterministic scatter-add, pools, attention), cuBLAS calls with the
kernels around them (convolutions), or, for an op the table declares `on_host`, its NumPy
kernel on the host. Then a reduction takes in the group that makes its input, and the row pass
(rows.py) merges runs over one row space.

A node may join a group only if none of its other arguments depends on the group (else
the group would need its own output before it ends): the partition stays a DAG.

This is the backend's lowering of IR alone (no Lisp, no compiler): `explain --cuda` reads
it on any machine, and the CUDA backend compiles what it names.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from ...ir.builder import Builder
from ...ir.graph import Node, Program, TensorType, readers_of
from ...ir.ops import op_def
from . import attention, images, moves  # noqa: F401  (attention and images register their rules)
from .codegen import storage_bytes
from .lowering import Absorbed, ComputesInputs, Fuse, Placement, Prologue, Step, lowering_for
from .rows import fuse_rows
from .steps import FusedGroup, KernelStep, ReduceGroup, ViewStep


RECOMPUTED_NODES = 32  # the longest chain of ops a reader recomputes instead of reading its value


class Partition:
    """The fusion pass over one program; the context its nodes' rules see."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.types: dict[int, TensorType] = program.types()
        self.by_id = {n.id: n for n in program.nodes}
        # program order (ids follow it, except the nodes a decomposition added at the end)
        self.position = {n.id: k for k, n in enumerate(program.nodes)}
        self.reading = readers_of(program)
        self.returned = set(program.outputs.values())
        self.constants: set[int] = set()  # `full` nodes written as literals into the kernels reading them
        self.group_of: dict[int, FusedGroup] = {}
        self.ancestors: dict[int, frozenset[int]] = {}

    # -- what a rule may ask (lowering.LoweringContext) --------------------------------------------
    def producer(self, vid: int) -> Optional[Node]:
        return self.by_id.get(vid)

    def readers(self, vid: int) -> list[Node]:
        return self.reading.get(vid, [])

    def is_returned(self, vid: int) -> bool:
        return vid in self.returned

    def place(self, node: Node) -> Placement:
        return lowering_for(op_def(node.op))(node, self)

    # -- the pass -------------------------------------------------------------------------------------
    def ancestors_of(self, vid: int) -> frozenset[int]:
        """Every node id VID depends on (itself included)."""
        known = self.ancestors.get(vid)
        if known is not None:
            return known
        node = self.by_id.get(vid)
        if node is None:  # a program input
            result = frozenset([vid])
        else:
            acc: set[int] = {vid}
            for arg in node.args:
                acc |= self.ancestors_of(arg)
            result = frozenset(acc)
        self.ancestors[vid] = result
        return result

    def can_join(self, node: Node, fuse: Fuse, group: FusedGroup) -> bool:
        if fuse.window is not None:  # a window of a value the group computes
            return node.args[0] in group.ids and len(group.shape) == 1
        if group.shape != tuple(node.type.shape):
            return False
        ids = group.ids
        return all(arg in ids or arg in self.constants or not (self.ancestors_of(arg) & ids) for arg in node.args)

    def can_merge(self, group: FusedGroup, other: FusedGroup) -> bool:
        """Whether OTHER can become part of GROUP: the same space, and no value outside both
        that one of them needs and the other makes."""
        if other.shape != group.shape:
            return False
        both = group.ids | other.ids
        for node in group.nodes + other.nodes:
            for arg in node.args:
                if arg not in both and arg not in self.constants and self.ancestors_of(arg) & both:
                    return False
        return True

    def merge(self, group: FusedGroup, other: FusedGroup, steps: list[Step]) -> None:
        group.absorb(other, self.position)
        for node in other.nodes:
            self.group_of[node.id] = group
        steps.remove(other)

    def fuse(self, node: Node, fuse: Fuse, steps: list[Step]) -> None:
        """NODE joins the group of one of its arguments (merging the others' it can), or
        starts one; a window that cannot join its source's group is a kernel of its own."""
        group = next((g for g in (self.group_of.get(a) for a in node.args) if g is not None and self.can_join(node, fuse, g)), None)
        if group is None and fuse.window is not None:
            steps.append(KernelStep(node, moves.slice_kernel))
            return
        if group is None:
            group = FusedGroup(shape=tuple(node.type.shape))
            steps.append(group)
        group.add(node, fuse)
        self.group_of[node.id] = group
        for other in {id(g): g for g in (self.group_of.get(a) for a in node.args) if g is not None and g is not group}.values():
            if self.can_merge(group, other):  # the node joins two groups: one kernel
                self.merge(group, other, steps)

    def run(self) -> list[Step]:
        steps: list[Step] = []
        for node in self.program.nodes:
            self.ancestors_of(node.id)  # memoized in program order: no deep recursion
            placement = self.place(node)
            if isinstance(placement, Fuse):
                self.fuse(node, placement, steps)
            elif placement is Absorbed.LITERAL:
                self.constants.add(node.id)
            elif not isinstance(placement, Absorbed):  # a transpose flag is no step: its matmuls read its source
                steps.append(placement)
        self.finish_groups(steps)
        steps = self.rematerialize(steps)
        self.finish_groups(steps)
        # a group whose every value its readers now recompute has nothing left to do
        steps = [s for s in steps if not isinstance(s, FusedGroup) or s.outputs]
        steps = self.fuse_prologues(steps)
        return fuse_rows(self.ordered(steps), self.program, self.constants)

    def fuse_prologues(self, steps: list[Step]) -> list[Step]:
        """A reduction takes in the fused group that makes its input: the group's kernel is
        gone, its values that other steps read the reduction stores as it visits them."""
        absorbed: set[int] = set()
        readers: dict[int, list[int]] = {}  # value -> the steps that read it
        for step in steps:
            for v in step.reads:
                readers.setdefault(v, []).append(id(step))
        for step in steps:
            if not isinstance(step, ReduceGroup) or step.prologue is not None:
                continue
            source = step.node.args[0]
            group = self.group_of.get(source)
            if group is None or id(group) in absorbed or source not in group.outputs or group.piecewise:
                continue
            if group.shape != tuple(self.types[source].shape):
                continue
            step.prologue = group
            step.sides = [v for v in group.outputs if v != source or v in self.returned or any(r != id(step) for r in readers.get(v, []))]
            absorbed.add(id(group))
        return [s for s in steps if id(s) not in absorbed]

    def finish_groups(self, steps: list[Step]) -> None:
        """Each fused group's inputs (what its nodes read from outside it) and outputs (its
        own nodes' values that another step reads, or the program returns; a node a group
        recomputes is written by its own group alone)."""
        for step in steps:
            if isinstance(step, FusedGroup):
                ids = step.ids
                step.inputs = list(dict.fromkeys(a for n in step.nodes for a in n.args if a not in ids and a not in self.constants))
        used = {v for step in steps for v in step.reads}
        for step in steps:
            if isinstance(step, FusedGroup):
                step.outputs = [n.id for n in step.nodes if self.group_of.get(n.id) is step and (n.id in used or n.id in self.returned)]

    def rematerialize(self, steps: list[Step]) -> list[Step]:
        """A value a fused group writes only for other fused groups and reductions over the
        same element space (the backward pass's reads of the forward pass's intermediates: a
        GELU's, a norm's), or for steps that compute their arguments as they load them
        through a reshape (attention's q, k, v), is recomputed by each of them from the
        writer's inputs when that moves fewer bytes: the writer no longer writes it, the
        readers read the inputs they lack instead (a reduction through a prologue of its
        own). The same ops in the same order: the same bits. Returns the steps without the
        reshapes nothing reads any more."""
        reductions = {s.node.id: s for s in steps if isinstance(s, ReduceGroup)}
        step_of = {n.id: s for s in steps for n in s.nodes}
        dropped: set[int] = set()
        for group in [s for s in steps if isinstance(s, FusedGroup) and not s.piecewise]:
            candidates = {v: self.reading_steps(v, group, reductions, step_of) for v in group.outputs}
            written = {v for v, readers in candidates.items() if readers is None}  # in memory anyway: a chain reads it there
            for value in list(group.outputs):
                readers = candidates[value]
                if readers is None:
                    continue
                chain = self.chain(value, group, written)
                inside = {c.id for c in chain}
                needed = list(dict.fromkeys(a for n in chain for a in n.args if a not in inside and a not in self.constants))
                if len(chain) > RECOMPUTED_NODES or not self.saves_bytes(value, needed, [r for r, _ in readers]):
                    written.add(value)
                    continue
                for reader, through in readers:
                    if through is not None and isinstance(reader, ComputesInputs):  # a reshape of the value, an argument the reader computes
                        reader.compute_input(through.id, Prologue(nodes=list(chain), inputs=needed, value=value))
                        dropped.add(through.id)
                    elif isinstance(reader, ReduceGroup):
                        reader.prologue = FusedGroup(shape=group.shape, nodes=list(chain), inputs=needed, outputs=[value])
                    elif isinstance(reader, FusedGroup):
                        known = reader.ids
                        reader.nodes = sorted(reader.nodes + [n for n in chain if n.id not in known], key=lambda n: self.position[n.id])
                        reader.inputs = list(dict.fromkeys(reader.inputs + [a for a in needed if a not in reader.ids]))
                group.outputs.remove(value)
        return [s for s in steps if not (isinstance(s, ViewStep) and s.node.id in dropped)]

    def saves_bytes(self, value: int, needed: list[int], readers: list[Step]) -> bool:
        """Whether recomputing VALUE in READERS from NEEDED moves fewer bytes than writing it
        once and reading it in each."""
        kept = storage_bytes(self.types[value]) * (1 + len(readers))
        extra = sum(storage_bytes(self.types[a]) for r in readers for a in needed if a not in r.reads and a not in {n.id for n in r.nodes})
        return extra < kept

    def reading_steps(self, value: int, group: FusedGroup, reductions: dict[int, ReduceGroup],
                      step_of: dict[int, Step]) -> Optional[list[tuple[Step, Optional[Node]]]]:
        """The steps that read VALUE and can compute it instead, each with the reshape it
        reads VALUE through (None: it reads VALUE itself) — the other fused groups over
        GROUP's element space, the reductions without a prologue, the steps that compute
        their arguments (through a reshape that only they read) — when nothing else reads it
        (and the program does not return it); else None."""
        if value in self.returned:
            return None
        found: dict[int, tuple[Step, Optional[Node]]] = {}
        for reader in self.readers(value):
            home = self.group_of.get(reader.id)
            if home is group:
                continue
            if home is not None and not home.piecewise and home.shape == group.shape:
                found[id(home)] = (home, None)
            elif home is None and reader.id in reductions and reductions[reader.id].prologue is None:
                found[reader.id] = (reductions[reader.id], None)
            elif home is None and reader.op == "reshape" and reader.id not in self.returned and self.readers(reader.id):
                for computer in self.readers(reader.id):
                    step = step_of.get(computer.id)
                    if not isinstance(step, ComputesInputs) or not step.computes(reader.id):
                        return None
                    found[id(step)] = (step, reader)
            else:
                return None
        return list(found.values()) or None

    def chain(self, value: int, group: FusedGroup, written: set[int]) -> list[Node]:
        """The nodes of GROUP that VALUE is computed from (itself included), in program order,
        up to the values it writes to memory anyway (WRITTEN), which are read from there."""
        inside = {n.id: n for n in group.nodes}
        needed: dict[int, Node] = {}
        stack = [value]
        while stack:
            vid = stack.pop()
            node = inside.get(vid)
            if node is not None and vid not in needed and (vid == value or vid not in written):
                needed[vid] = node
                stack.extend(node.args)
        return sorted(needed.values(), key=lambda n: self.position[n.id])

    def ordered(self, steps: list[Step]) -> list[Step]:
        """Steps in an order where every value is made before it is read (a group runs once
        all its inputs exist: groups may have grown past later steps)."""
        made: set[int] = {i.id for i in self.program.inputs}
        pending = list(steps)
        out: list[Step] = []
        while pending:
            for i, step in enumerate(pending):
                if all(a in made for a in step.reads):
                    out.append(step)
                    made |= {n.id for n in step.nodes}
                    del pending[i]
                    break
            else:  # cannot happen for a DAG partition; keep the program order rather than loop
                out.extend(pending)
                break
        return out


@dataclass
class Lowering:
    """One program as the CUDA device runs it."""

    program: Program
    steps: list[Step]
    constants: dict[int, Node]  # `full` nodes inlined as literals into the kernels reading them
    # the nodes a decomposition made -> the op they build ("%11 log_softmax"), for the report
    origins: dict[int, str] = field(default_factory=dict)

    @property
    def groups(self) -> list[FusedGroup]:
        return [s for s in self.steps if isinstance(s, FusedGroup)]

    @property
    def reductions(self) -> list[ReduceGroup]:
        return [s for s in self.steps if isinstance(s, ReduceGroup)]

    def label(self, node: Node) -> str:
        """"%id op loc path"; a node a decomposition made also names the op it builds, whose
        id is the one `sexpgpu ir` prints: "%48 max (of %11 log_softmax) ..."."""
        origin = self.origins.get(node.id)
        return " ".join(x for x in (f"%{node.id}", node.op, f"(of {origin})" if origin else "", node.loc or "", node.path or "") if x)


def decomposed(program: Program) -> tuple[Program, dict[int, str]]:
    """PROGRAM with every op that says how to build it from other ops (softmax, log-softmax:
    primitives for their gradients' sake) built that way, so the fusion below sees the
    parts (a row group), and which op each new node builds. Other nodes keep their ids; the
    new ones come after the largest (so ids no longer follow program order)."""
    origins: dict[int, str] = {}
    if not any(op_def(n.op).decompose is not None for n in program.nodes):
        return program, origins
    types = program.types()
    b = Builder(program.name, first_id=max(types) + 1)
    b.inputs = list(program.inputs)
    b.types = dict(types)
    renamed: dict[int, int] = {}
    for node in program.nodes:
        args = [renamed.get(a, a) for a in node.args]
        rule = op_def(node.op).decompose
        if rule is None:
            b.nodes.append(replace(node, args=args))
            continue
        b.loc, b.path = node.loc, node.path
        first = b.next_id
        renamed[node.id] = rule(b, replace(node, args=args))
        origins.update({nid: f"%{node.id} {node.op}" for nid in range(first, b.next_id)})
    return b.program({name: renamed.get(v, v) for name, v in program.outputs.items()}), origins


def lower(program: Program) -> Lowering:
    """The program as the CUDA device runs it: fused groups, cuBLAS calls, op kernels, views."""
    program, origins = decomposed(program)
    partition = Partition(program)
    steps = partition.run()
    return Lowering(program=program, steps=steps, constants={n.id: n for n in program.nodes if n.id in partition.constants}, origins=origins)
