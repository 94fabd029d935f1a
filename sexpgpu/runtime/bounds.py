"""The range each integer field of a loader must stay in, read from the program it feeds, and
the check of a dataset against it (a data error, exit 5, instead of a silent wrong loss).

An id that an embedding `take`s past its table's rows is clipped; a label that `one-hot`
(staged as `eq` against an `arange` of the classes) compares with no class gives an
all-zero row. Both train to a meaningless loss without a word. So before a run trains, each
integer field is followed through the ops that only move or reshape it, to the ops that use
it as an index: `take` (the table's rows on its axis) and `eq`/`ne` against an `arange`
(the classes). A scalar constant the field is compared with (an `:ignore-index`) is a
value it may also hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..ir.dtypes import DType
from ..ir.graph import Node, Program
from .data.spec import DataError, Dataset

# ops through which a value keeps being the same ids, reshaped or moved
PASSES_IDS = frozenset({"reshape", "broadcast_to", "transpose", "slice", "concat", "squeeze", "expand_dims"})
INTEGERS = (DType.i32, DType.i64)


@dataclass
class Bound:
    """Values of a field must be in [0, limit), or one of `sentinels`."""

    limit: int
    what: str  # what sets the limit: "the embedding table model.embed (96 rows)"
    sentinels: set[int] = field(default_factory=set)


def index_bounds(program: Program) -> dict[str, Bound]:
    """Field name -> its bound, for each integer data input of PROGRAM used as an index."""
    graph = Graph(program)
    bounds: dict[str, Bound] = {}
    for put in program.inputs:
        if not put.name.startswith("data.") or put.type.dtype not in INTEGERS:
            continue
        bound = graph.follow(put.id)
        if bound is not None:
            bounds[put.name[len("data."):]] = bound
    return bounds


class Graph:
    """Who makes and who reads each value of a program, and what each value is."""

    def __init__(self, program: Program) -> None:
        self.types = program.types()
        self.producers = {n.id: n for n in program.nodes}
        self.names = {i.id: i.name for i in program.inputs}
        self.readers: dict[int, list[Node]] = {}
        for node in program.nodes:
            for arg in node.args:
                self.readers.setdefault(arg, []).append(node)

    def follow(self, start: int) -> Optional[Bound]:
        """The tightest bound of the index uses reached from value START."""
        limits: list[tuple[int, str]] = []
        sentinels: set[int] = set()
        seen, todo = {start}, [start]
        while todo:
            value = todo.pop()
            for node in self.readers.get(value, []):
                if node.op in PASSES_IDS or (node.op == "cast" and node.type.dtype in INTEGERS):
                    if node.id not in seen:
                        seen.add(node.id)
                        todo.append(node.id)
                elif node.op == "take" and node.args[1] == value:
                    rows = self.types[node.args[0]].shape[node.attrs.get("axis", 0)]
                    limits.append((rows, f"the embedding table {self.describe(node.args[0], node)} ({rows} rows)"))
                elif node.op in ("eq", "ne"):
                    other = node.args[1] if node.args[0] == value else node.args[0]
                    classes = arange_length(other, self.producers)
                    if classes is not None:
                        limits.append((classes, f"the {classes} classes it is compared with (one-hot, cross-entropy)"))
                    constant = scalar_constant(other, self.producers)
                    if constant is not None:
                        sentinels.add(constant)
        if not limits:
            return None
        limit, what = min(limits)
        return Bound(limit, what, sentinels)

    def describe(self, value: int, user: Node) -> str:
        """A parameter by its path, else the part that used it."""
        return self.names.get(value) or (user.path or "")


def arange_length(value: int, producers: dict[int, Node]) -> Optional[int]:
    """N when VALUE is an `arange` of N (reshaped or broadcast), else None."""
    node = producers.get(value)
    while node is not None and node.op in ("reshape", "broadcast_to"):
        node = producers.get(node.args[0])
    if node is None or node.op != "arange":
        return None
    shape = list(node.attrs.get("shape") or [])
    return int(shape[0]) if len(shape) == 1 else None


def scalar_constant(value: int, producers: dict[int, Node]) -> Optional[int]:
    node = producers.get(value)
    while node is not None and node.op in ("reshape", "broadcast_to", "cast"):
        node = producers.get(node.args[0])
    if node is None or node.op != "full" or node.attrs.get("shape") not in ((), []):
        return None
    constant = node.attrs.get("value")
    return int(constant) if isinstance(constant, (int, float)) and float(constant).is_integer() else None


def check_bounds(dataset: Dataset, bounds: dict[str, Bound], loader: str) -> None:
    """DataError naming the field, its range in the data and the model size it feeds, when a
    value falls outside what the model can use."""
    for name, bound in bounds.items():
        values = dataset.fields.get(name)
        if values is None or values.size == 0:
            continue
        outside = (values < 0) | (values >= bound.limit)
        for sentinel in bound.sentinels:
            outside &= values != sentinel
        if not outside.any():
            continue
        low, high = int(values.min()), int(values.max())
        first = int(np.argwhere(outside.reshape(len(values), -1).any(axis=1))[0][0])
        vocab = f"; char-vocab found {len(dataset.vocab)} characters" if dataset.vocab else ""
        raise DataError(
            f"holds {low}..{high}{vocab}, but it feeds {bound.what}: its values must be 0..{bound.limit - 1}"
            f" (first outside: example {first}); make the model that large (a knob such as vocab or classes), or fix the data",
            loader=loader, field=name)
