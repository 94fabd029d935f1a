"""The CPU backend: runs an IR program with NumPy under a memory plan made once.

The plan (liveness analysis) gives every non-view result a preallocated buffer, reused once
its last reader has run, and passes it as `out=`; views (ops of the op table's kind `view`:
reshape, transpose, broadcast_to, slice) keep their source alive instead. Constants (kind
`constant`) are computed once. Running a step is then one kernel call per node and nothing
else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
from pydantic import BaseModel

from ..ir.dtypes import numpy_dtype
from ..ir.graph import Node, Program, TensorType
from ..ir.ops import OpKind, op_def


def is_view(node: Node) -> bool:
    """Whether NODE's result may share its first argument's memory."""
    return op_def(node.op).kind is OpKind.VIEW


@dataclass
class Step:
    kernel: Callable[[list[np.ndarray], dict[str, Any], Optional[np.ndarray]], np.ndarray]
    args: list[int]
    attrs: dict[str, Any]
    out: Optional[int]  # buffer index, or None for views and kernels without out=
    result: int
    dtype: Any


@dataclass
class Plan:
    steps: list[Step]
    buffers: list[np.ndarray]
    constants: dict[int, np.ndarray]
    slots: int
    peak_bytes: int
    total_bytes: int


def _last_uses(program: Program) -> dict[int, int]:
    """For each value, the index of the last node reading it (outputs live to the end)."""
    last: dict[int, int] = {}
    alias: dict[int, int] = {}
    for index, node in enumerate(program.nodes):
        for a in node.args:
            root = alias.get(a, a)
            last[root] = index
        if is_view(node):
            alias[node.id] = alias.get(node.args[0], node.args[0])
    end = len(program.nodes)
    for nid in program.outputs.values():
        last[alias.get(nid, nid)] = end
    return last


@dataclass(frozen=True)
class Layout:
    """Where each result goes, worked out without allocating anything: a buffer index for
    each node that needs one (None: a view or a constant), and the buffers' shapes."""

    placed: list[tuple[Node, Optional[int]]]
    buffers: list[tuple[tuple[int, ...], Any]]  # (shape, NumPy dtype)
    peak_bytes: int
    total_bytes: int


def plan_layout(program: Program) -> Layout:
    """Liveness analysis: a buffer per non-view result, reused by a later result of its
    shape and dtype once its last reader has run. Sizes only: `explain` and the memory
    check read it for programs too large to allocate."""
    last = _last_uses(program)
    free: dict[tuple[tuple[int, ...], Any], list[int]] = {}
    buffers: list[tuple[tuple[int, ...], Any]] = []
    placed: list[tuple[Node, Optional[int]]] = []
    releases: dict[int, list[tuple[tuple[tuple[int, ...], Any], int]]] = {}
    live_bytes = peak = 0
    for index, node in enumerate(program.nodes):
        if op_def(node.op).kind is OpKind.CONSTANT:
            placed.append((node, None))
            continue
        for key, buffer_index in releases.pop(index, []):
            free.setdefault(key, []).append(buffer_index)
            live_bytes -= nbytes(buffers[buffer_index])
        out: Optional[int] = None
        if not is_view(node):
            key = (node.type.shape, numpy_dtype(node.type.dtype))
            pool = free.get(key)
            if pool:
                out = pool.pop()
            else:
                buffers.append(key)
                out = len(buffers) - 1
            live_bytes += nbytes(buffers[out])
            peak = max(peak, live_bytes)
            releases.setdefault(last.get(node.id, index) + 1, []).append((key, out))
        placed.append((node, out))
    return Layout(placed, buffers, peak, sum(nbytes(b) for b in buffers))


def nbytes(buffer: tuple[tuple[int, ...], Any]) -> int:
    shape, dtype = buffer
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def make_plan(program: Program) -> Plan:
    types: dict[int, TensorType] = program.types()
    layout = plan_layout(program)
    buffers = [np.empty(shape, dtype=dtype) for shape, dtype in layout.buffers]
    steps: list[Step] = []
    constants: dict[int, np.ndarray] = {}
    for node, out in layout.placed:
        definition = op_def(node.op)
        if definition.kind is OpKind.CONSTANT:
            constants[node.id] = definition.numpy([], node.attrs, None)
            continue
        kernel = definition.numpy
        if definition.specialize is not None:
            kernel = definition.specialize(dict(node.attrs), [types[a] for a in node.args])
        steps.append(Step(kernel, list(node.args), dict(node.attrs), out, node.id, numpy_dtype(node.type.dtype)))
    slots = max([i.id for i in program.inputs] + [n.id for n in program.nodes] + [0]) + 1
    return Plan(steps, buffers, constants, slots, layout.peak_bytes, layout.total_bytes)


class CompiledProgram:
    """A program with its plan, ready to run many times."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.plan = make_plan(program)
        self.input_ids = {i.name: i.id for i in program.inputs}
        self.input_types = {i.name: i.type for i in program.inputs}

    def run(self, feeds: dict[str, np.ndarray], keep: frozenset[str] = frozenset(),
            ready: Optional[Callable[[str, Any], None]] = None) -> dict[str, np.ndarray]:
        """Run on FEEDS. The results may be this program's buffers, overwritten by its next run;
        KEEP (which outputs the caller keeps resident) changes nothing on the host. READY is
        called with each kept output after the run."""
        with np.errstate(all="ignore"):  # non-finite values are the finite guard's business
            out = self._run(feeds)
        if ready is not None:
            for name in keep:
                if name in out:
                    ready(name, out[name])
        return out

    def notice(self) -> Optional[str]:
        return None

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values: list[Any] = [None] * self.plan.slots
        for name, nid in self.input_ids.items():
            values[nid] = feeds[name]
        for nid, value in self.plan.constants.items():
            values[nid] = value
        buffers = self.plan.buffers
        for step in self.plan.steps:
            args = [values[a] for a in step.args]
            out = buffers[step.out] if step.out is not None else None
            result = step.kernel(args, step.attrs, out)
            if out is not None and result is not out:
                out[...] = result
                result = out
            values[step.result] = result
        return {name: values[nid] for name, nid in self.program.outputs.items()}

    def run_copy(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Like run, but the results are copies the caller may keep across runs."""
        return {k: np.array(v, copy=True) for k, v in self.run(feeds).items()}


class NonFiniteNode(BaseModel):
    """The first node of a replay whose result is not finite."""

    node: int
    op: str
    loc: Optional[str]
    path: Optional[str]
    created: bool  # True: its inputs were finite and it made the non-finite value
    site: Optional[str] = None  # the user's call that led into the library, when loc is inside one

    @property
    def where(self) -> Optional[str]:
        """The position to name first: the user's call, else the node's own form."""
        return self.site or self.loc

    @property
    def library_loc(self) -> Optional[str]:
        """The library's line that staged the node, when the user's call led there."""
        return self.loc if self.site else None

    def describe(self) -> str:
        where = f" at {self.where}" if self.where else ""
        inside = f" in {self.path}" if self.path else ""
        how = "created it" if self.created else "passed on a non-finite input"
        library = f" (inside the standard library, at {self.loc})" if self.site else ""
        return f"{self.op} (%{self.node}){where}{inside} {how}{library}"


def first_nonfinite(program: Program, feeds: dict[str, np.ndarray]) -> Optional[NonFiniteNode]:
    """Replay PROGRAM node by node on fresh arrays and name the first node whose result holds
    a NaN or an infinity (the finite guard's report)."""
    values: dict[int, Any] = {i.id: feeds[i.name] for i in program.inputs if i.name in feeds}

    def finite(x: Any) -> bool:
        a = np.asarray(x)
        return a.dtype.kind not in "fc" or bool(np.isfinite(a.astype(np.float32) if a.dtype.itemsize == 2 else a).all())

    for node in program.nodes:
        with np.errstate(all="ignore"):
            result = op_def(node.op).numpy([values[a] for a in node.args], dict(node.attrs), None)
        values[node.id] = result
        if not finite(result):
            created = all(finite(values[a]) for a in node.args)
            return NonFiniteNode(node=node.id, op=node.op, loc=node.loc, path=node.path, created=created, site=node.site)
    return None
