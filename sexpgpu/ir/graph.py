"""The IR data model: typed SSA programs, their text form (one line per node, like a jaxpr),
their JSON form, and their hash.

The records are dataclasses (sexpgpu/records.py validates and writes them at a file or a
process boundary); their hash is made from records.plain, which gives what pydantic writes
without importing it (tests/test_record_identity.py compares the two)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal, Optional

from ..records import plain
from .dtypes import DType

Shape = tuple[int, ...]
InputKind = Literal["param", "data", "state", "ctx", "value"]


def shape_size(shape: Any) -> int:
    """The number of elements of a shape."""
    n = 1
    for d in shape:
        n *= d
    return n


@dataclass(kw_only=True, slots=True, frozen=True)
class TensorType:
    dtype: DType
    shape: Shape

    def __post_init__(self) -> None:  # what pydantic coerced: a list of dims, a dtype's name
        if type(self.shape) is not tuple:
            object.__setattr__(self, "shape", tuple(self.shape))
        if type(self.dtype) is not DType:
            object.__setattr__(self, "dtype", DType(self.dtype))

    def __str__(self) -> str:
        return f"{self.dtype.value}[{','.join(str(d) for d in self.shape)}]"

    @property
    def size(self) -> int:
        return shape_size(self.shape)

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass(kw_only=True, slots=True)
class Input:
    """A value the program receives: a parameter, a batch field, optimizer state, a ctx
    scalar, or (in backward/update programs) a value computed by another program."""

    id: int
    name: str
    kind: InputKind
    type: TensorType


@dataclass(kw_only=True, slots=True)
class Node:
    id: int
    op: str
    args: list[int]
    attrs: dict[str, Any] = field(default_factory=dict)
    type: TensorType
    loc: Optional[str] = None  # file:line:col of the source form that staged it
    path: Optional[str] = None  # parameter path of the model part that staged it
    site: Optional[str] = None  # file:line:col of the user's call that led to LOC, when LOC is inside a library


@dataclass(kw_only=True, slots=True)
class Program:
    name: str
    inputs: list[Input]
    nodes: list[Node]
    outputs: dict[str, int]

    def types(self) -> dict[int, TensorType]:
        out = {i.id: i.type for i in self.inputs}
        out.update({n.id: n.type for n in self.nodes})
        return out

    def text(self) -> str:
        return program_text(self)

    def canonical_json(self) -> str:
        return json.dumps(plain(self), sort_keys=True, separators=(",", ":"))


@dataclass(kw_only=True, slots=True)
class Module:
    """Everything a run executes: each program by name (forward, train, update, eval:NAME)."""

    version: int = 1
    programs: dict[str, Program]

    def canonical_json(self) -> str:
        return json.dumps(plain(self), sort_keys=True, separators=(",", ":"))

    def hash(self) -> str:
        """The IR's identity: ops, types, attributes and structure. Source positions and
        part paths are left out, so the hash (and the run's slug) does not depend on the
        folder `sexpgpu` was started from, nor on comments and blank lines; the source hash
        in run.json records the file's exact bytes."""
        return self._hash(lambda name: True)

    def numbers_hash(self) -> str:
        """The identity of the programs whose results are the run's numbers: every program
        but the diagnostics variants of train (`train:diagnostics`, `train:diagnostics@STAGE`),
        which compute what train computes and report more (the slug is made from this)."""
        return self._hash(lambda name: not name.startswith("train:diagnostics"))

    def _hash(self, keep: Callable[[str], bool]) -> str:
        return data_hash(plain(self), keep)


def data_hash(module: dict[str, Any], keep: Callable[[str], bool] = lambda name: True) -> str:
    """Module.hash of a module given as plain data (records.plain of it): the programs KEEP
    takes, without source positions and part paths (null) and sites (absent, not null: the
    hash of an IR without sites stays what it was)."""
    programs = {}
    for name, program in module["programs"].items():
        if keep(name):
            nodes = [{**{k: v for k, v in node.items() if k != "site"}, "loc": None, "path": None} for node in program["nodes"]]
            programs[name] = {**program, "nodes": nodes}
    data = {**module, "programs": programs}
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _attr_text(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_attr_text(v) for v in value) + ")"
    return json.dumps(value) if isinstance(value, str) else str(value)


def node_text(node: Node) -> str:
    args = " ".join(f"%{a}" for a in node.args)
    attrs = " ".join(f"{k}={_attr_text(v)}" for k, v in sorted(node.attrs.items()) if k != "data")
    line = f"  %{node.id}:{node.type} = {node.op}" + (f" {args}" if args else "") + (f" {{{attrs}}}" if attrs else "")
    where = "  ".join(x for x in (node.loc, node.path) if x)
    return f"{line:<72} ; {where}" if where else line


def program_text(program: Program) -> str:
    lines = [f"program {program.name}("]
    for i in program.inputs:
        lines.append(f"    %{i.id}:{i.type} {i.kind} {i.name}")
    lines.append(") {")
    lines.extend(node_text(n) for n in program.nodes)
    outs = ", ".join(f"{name}=%{nid}" for name, nid in program.outputs.items())
    lines.append(f"  return {outs}")
    lines.append("}")
    return "\n".join(lines)


def prune(program: Program) -> Program:
    """The program without nodes no output depends on (gradient rules emit a contribution
    for every argument, and autodiff keeps only the ones it needs)."""
    live = set(program.outputs.values())
    for node in reversed(program.nodes):
        if node.id in live:
            live.update(node.args)
    nodes = [n for n in program.nodes if n.id in live]
    return replace(program, nodes=nodes)


def readers_of(program: Program) -> dict[int, list[Node]]:
    """Value id -> the nodes that read it (a node reading it twice is there twice)."""
    readers: dict[int, list[Node]] = {}
    for node in program.nodes:
        for arg in node.args:
            readers.setdefault(arg, []).append(node)
    return readers
