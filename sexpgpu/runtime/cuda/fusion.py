"""How the CUDA device lowers an IR program: fusion groups, cuBLAS calls, other kernels.

Elementwise ops (and `broadcast_to`, and scalar `full` constants) that compute over the same
element space are fused into one group, which becomes one generated kernel: its values live
in registers, only the group's inputs are read and only the values used outside it (or
returned by the program) are written. Matmuls are cuBLAS calls. Every other op is one kernel
of its own (reductions, gathers, the deterministic scatter-add, convolutions, ...).

A node may join a group only if none of its other arguments depends on the group (else
the group would need its own output before it ends): the partition stays a DAG.

This is the backend's lowering of IR alone (no Lisp, no compiler): `explain --cuda` reads
it on any machine, and the CUDA backend compiles what it names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Union

from ...ir.builder import Builder
from ...ir.dtypes import DType
from ...ir.graph import Node, Program, TensorType
from ...ir.ops import op_def

Shape = tuple[int, ...]


@dataclass
class FusedGroup:
    """Elementwise nodes computed by one generated kernel over `shape`."""

    shape: Shape
    nodes: list[Node] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)  # values read (from outside the group)
    outputs: list[int] = field(default_factory=list)  # values written (used outside, or returned)
    kind: Literal["fused"] = "fused"

    @property
    def ids(self) -> set[int]:
        return {n.id for n in self.nodes}


@dataclass
class ReduceGroup:
    """A reduction (sum mean max min) computed by one generated kernel, with the elementwise
    group that produces its input fused in as a prologue when nothing else reads it."""

    node: Node
    prologue: Optional[FusedGroup] = None
    kind: Literal["reduce"] = "reduce"

    @property
    def inputs(self) -> list[int]:
        return self.prologue.inputs if self.prologue is not None else list(self.node.args)

    @property
    def ids(self) -> set[int]:
        return {self.node.id} | (self.prologue.ids if self.prologue is not None else set())


@dataclass
class ScatterStep:
    """scatter_add along axis 0 (the embedding gradient): positions sorted stably by index,
    then one thread per output element adds its rows in that order: deterministic, no float
    atomics, and the same order (so the same f32 bits) as the CPU backend's np.add.at."""

    node: Node
    kind: Literal["scatter"] = "scatter"


@dataclass
class RandomStep:
    """dropout_mask or random_uniform (f32, bf16) as a device Philox kernel with the CPU
    backend's bits."""

    node: Node
    kind: Literal["random"] = "random"


@dataclass
class GemmCall:
    """One matmul through cuBLAS (bf16 inputs accumulate in f32)."""

    node: Node
    batch: int
    m: int
    n: int
    k: int
    kind: Literal["gemm"] = "gemm"
    # an operand that is a transpose of the last two axes is read untransposed, with
    # cuBLAS's transpose flag: the transpose costs no kernel and no memory
    a: int = -1
    b: int = -1
    trans_a: bool = False
    trans_b: bool = False

    @property
    def inputs(self) -> list[int]:
        return [self.a, self.b]


@dataclass
class OpKernel:
    """A node that is a kernel of its own."""

    node: Node
    kind: Literal["op"] = "op"


@dataclass
class ViewStep:
    """A node that moves no data on the device (a reshape of a contiguous buffer)."""

    node: Node
    kind: Literal["view"] = "view"


Step = Union[FusedGroup, ReduceGroup, ScatterStep, RandomStep, GemmCall, OpKernel, ViewStep]
REDUCTIONS = ("sum", "mean", "max", "min")


def joins_flat(node: Node) -> bool:
    """A concat of 1-D values (the optimizer's joined group): fused as a piecewise load."""
    return node.op == "concat" and len(node.type.shape) == 1


def windows_flat(node: Node) -> bool:
    """A contiguous window of a 1-D value (a parameter's part of the joined update): fused as
    a windowed store of the group that computes the value."""
    return node.op == "slice" and len(node.type.shape) == 1


def fusible(node: Node) -> bool:
    return node.op == "broadcast_to" or joins_flat(node) or op_def(node.op).elementwise


def gemm(node: Node, types: dict[int, TensorType]) -> GemmCall:
    a, b = (types[i] for i in node.args)
    out = node.type.shape
    m, n = out[-2], out[-1]
    k = a.shape[-1]
    batch = 1
    for d in out[:-2]:
        batch *= d
    return GemmCall(node=node, batch=batch, m=m, n=n, k=k, a=node.args[0], b=node.args[1])


def swaps_last_axes(node: Node) -> bool:
    perm = list(node.attrs.get("perm", []))
    r = len(perm)
    return node.op == "transpose" and r >= 2 and perm == list(range(r - 2)) + [r - 1, r - 2]


def readers_of(program: Program) -> dict[int, list[Node]]:
    """Value id -> the nodes that read it (a node reading it twice is there twice)."""
    readers: dict[int, list[Node]] = {}
    for node in program.nodes:
        for arg in node.args:
            readers.setdefault(arg, []).append(node)
    return readers


class Partition:
    """The fusion pass over one program."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.types = program.types()
        self.by_id = {n.id: n for n in program.nodes}
        # program order (ids follow it, except the nodes a decomposition added at the end)
        self.position = {n.id: k for k, n in enumerate(program.nodes)}
        self.readers = readers_of(program)
        self.returned = set(program.outputs.values())
        self.group_of: dict[int, FusedGroup] = {}
        self.ancestors: dict[int, frozenset[int]] = {}

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

    def can_join(self, node: Node, group: FusedGroup) -> bool:
        if windows_flat(node):  # a window of a value the group computes
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
        group.nodes = sorted(group.nodes + other.nodes, key=lambda n: self.position[n.id])
        for node in other.nodes:
            self.group_of[node.id] = group
        steps.remove(other)

    def transposes_for_gemm(self) -> dict[int, int]:
        """Transposes of the last two axes read only by matmuls: transposed node -> its source."""
        readers = self.readers
        return {
            n.id: n.args[0] for n in self.program.nodes
            if swaps_last_axes(n) and n.id not in self.returned and readers.get(n.id) and all(r.op == "matmul" for r in readers[n.id])
        }

    def inlined_constants(self) -> set[int]:
        """`full` nodes whose every reader is fused: they become literals in the kernels
        (no memory, no kernel of their own)."""
        return {
            n.id for n in self.program.nodes
            if n.op == "full" and n.id not in self.returned and all(fusible(r) for r in self.readers.get(n.id, []))
        }

    def run(self) -> list[Step]:
        steps: list[Step] = []
        self.constants = self.inlined_constants()
        self.flag_transposes = self.transposes_for_gemm()
        for node in self.program.nodes:
            self.ancestors_of(node.id)  # memoized in program order: no deep recursion
            if node.id in self.constants:
                continue
            if node.id in self.flag_transposes:
                continue
            if node.op == "matmul":
                call = gemm(node, self.types)
                if call.a in self.flag_transposes:
                    call.a, call.trans_a = self.flag_transposes[call.a], True
                if call.b in self.flag_transposes:
                    call.b, call.trans_b = self.flag_transposes[call.b], True
                steps.append(call)
            elif node.op == "reshape":
                steps.append(ViewStep(node))
            elif node.op == "dropout_mask" or (node.op == "random_uniform" and node.type.dtype in (DType.f32, DType.bf16)):
                steps.append(RandomStep(node))
            elif node.op == "scatter_add" and node.attrs.get("axis", 0) % len(node.type.shape) == 0 and node.type.dtype in (DType.f32, DType.bf16):
                steps.append(ScatterStep(node))
            elif node.op in REDUCTIONS and self.types[node.args[0]].dtype in (DType.f32, DType.bf16, DType.i32, DType.i64):
                steps.append(ReduceGroup(node))
            elif fusible(node) or (windows_flat(node) and self.group_of.get(node.args[0]) is not None):
                group = next((g for g in (self.group_of.get(a) for a in node.args) if g is not None and self.can_join(node, g)), None)
                if group is None and windows_flat(node):
                    steps.append(OpKernel(node))
                    continue
                if group is None:
                    group = FusedGroup(shape=tuple(node.type.shape))
                    steps.append(group)
                group.nodes.append(node)
                self.group_of[node.id] = group
                for other in {id(g): g for g in (self.group_of.get(a) for a in node.args) if g is not None and g is not group}.values():
                    if self.can_merge(group, other):  # the node joins two groups: one kernel
                        self.merge(group, other, steps)
            else:
                steps.append(OpKernel(node))
        self.finish_groups(steps)
        steps = self.fuse_prologues(steps)
        from .rows import fuse_rows  # the row pass works on the lowered steps

        return fuse_rows(self.ordered(steps), self.program, self.constants)

    def fuse_prologues(self, steps: list[Step]) -> list[Step]:
        """A reduction takes in the fused group that makes its input when that group makes
        nothing else (its one output is read by the reduction alone)."""
        absorbed: set[int] = set()
        for step in steps:
            if not isinstance(step, ReduceGroup):
                continue
            source = step.node.args[0]
            group = self.group_of.get(source)
            if group is None or group.outputs != [source] or len(self.readers.get(source, [])) != 1 or source in self.returned:
                continue
            if any(n.op in ("concat", "slice") for n in group.nodes):  # piecewise groups stay whole
                continue
            if group.shape != tuple(self.types[source].shape):
                continue
            step.prologue = group
            absorbed.add(id(group))
        return [s for s in steps if id(s) not in absorbed]

    def finish_groups(self, steps: list[Step]) -> None:
        used_outside: dict[int, bool] = {}
        for node in self.program.nodes:
            group = self.group_of.get(node.id)
            for arg in node.args:
                if group is None or arg not in group.ids:
                    used_outside[arg] = True
        for step in steps:
            if isinstance(step, FusedGroup):
                ids = step.ids
                seen: list[int] = []
                for n in step.nodes:
                    for arg in n.args:
                        if arg not in ids and arg not in seen and arg not in self.constants:
                            seen.append(arg)
                step.inputs = seen
                step.outputs = [n.id for n in step.nodes if used_outside.get(n.id) or n.id in self.returned]

    def ordered(self, steps: list[Step]) -> list[Step]:
        """Steps in an order where every value is made before it is read (a group runs once
        all its inputs exist: groups may have grown past later steps)."""
        made: set[int] = {i.id for i in self.program.inputs}
        pending = list(steps)
        out: list[Step] = []
        while pending:
            for i, step in enumerate(pending):
                needs = step.inputs if isinstance(step, (FusedGroup, ReduceGroup, GemmCall)) else step.node.args
                if all(a in made for a in needs):
                    out.append(step)
                    made |= step.ids if isinstance(step, (FusedGroup, ReduceGroup)) else {step.node.id}
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
            b.nodes.append(node.model_copy(update={"args": args}))
            continue
        b.loc, b.path = node.loc, node.path
        first = b.next_id
        renamed[node.id] = rule(b, node.model_copy(update={"args": args}))
        origins.update({nid: f"%{node.id} {node.op}" for nid in range(first, b.next_id)})
    return b.program({name: renamed.get(v, v) for name, v in program.outputs.items()}), origins


def lower(program: Program) -> Lowering:
    """The program as the CUDA device runs it: fused groups, cuBLAS calls, op kernels, views."""
    program, origins = decomposed(program)
    partition = Partition(program)
    steps = partition.run()
    return Lowering(program=program, steps=steps, constants={n.id: n for n in program.nodes if n.id in partition.constants}, origins=origins)
