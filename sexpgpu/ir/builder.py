"""Building programs: append typed nodes (the op table infers each type), and the small
helpers gradient rules use (broadcast reduction, constants)."""

from __future__ import annotations

from typing import Any, Optional

from .dtypes import DType
from .graph import Input, InputKind, Node, Program, Shape, TensorType
from .ops import OpError, op_def


def broadcast_shapes(a: Shape, b: Shape, what: str) -> Shape:
    """NumPy broadcasting, with an error that prints both shapes."""
    out: list[int] = []
    for i in range(max(len(a), len(b))):
        da = a[len(a) - 1 - i] if i < len(a) else 1
        db = b[len(b) - 1 - i] if i < len(b) else 1
        if da != db and da != 1 and db != 1:
            raise OpError(f"{what}: shapes [{','.join(map(str, a))}] and [{','.join(map(str, b))}] do not broadcast (dimension {da} vs {db})")
        out.append(max(da, db) if da != 1 and db != 1 else (db if da == 1 else da))
    return tuple(reversed(out))


class Builder:
    """One program under construction. `loc`, `path` and `site` are stamped on every node
    added while they are set (staging sets them to the current source form, model part and,
    inside a library, the user's call that led there)."""

    def __init__(self, name: str, first_id: int = 0) -> None:
        self.name = name
        self.inputs: list[Input] = []
        self.nodes: list[Node] = []
        self.types: dict[int, TensorType] = {}
        self.next_id = first_id
        self.loc: Optional[str] = None
        self.path: Optional[str] = None
        self.site: Optional[str] = None
        self._consts: dict[tuple[Any, ...], int] = {}

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def input(self, name: str, kind: InputKind, type_: TensorType) -> int:
        nid = self._new_id()
        self.inputs.append(Input(id=nid, name=name, kind=kind, type=type_))
        self.types[nid] = type_
        return nid

    def type(self, nid: int) -> TensorType:
        return self.types[nid]

    def op(self, name: str, *args: int, **attrs: Any) -> int:
        definition = op_def(name)
        if definition.arity is not None and len(args) != definition.arity:
            raise OpError(f"{name}: takes {definition.arity} tensor arguments, got {len(args)}")
        in_types = [self.types[a] for a in args]
        out_type = definition.infer(in_types, attrs)
        nid = self._new_id()
        self.nodes.append(Node(id=nid, op=name, args=list(args), attrs=attrs, type=out_type, loc=self.loc, path=self.path, site=self.site))
        self.types[nid] = out_type
        return nid

    # -- helpers for gradient rules and staging ----------------------------------------------
    def const(self, value: float | int | bool, dtype: DType, shape: Shape = ()) -> int:
        # repr keeps -0.0 apart from 0.0, and int() keeps large integers exact (float()
        # would merge 2**53 and 2**53 + 1)
        key = (repr(float(value)) if dtype.is_float else repr(int(value)), dtype, tuple(shape))
        hit = self._consts.get(key)
        if hit is not None:
            return hit
        nid = self.op("full", value=value, dtype=dtype.value, shape=list(shape))
        self._consts[key] = nid
        return nid

    def constant_keys(self) -> set[tuple[Any, ...]]:
        """The (value, dtype, shape) of every constant made so far: const() gives one node
        to each."""
        return set(self._consts)

    def scalar_like(self, value: float, like: int) -> int:
        return self.const(value, self.type(like).dtype)

    def sum_to(self, g: int, shape: Shape) -> int:
        """Reduce G (broadcast up from SHAPE) back to SHAPE: the gradient of broadcasting."""
        gshape = self.type(g).shape
        if gshape == tuple(shape):
            return g
        lead = len(gshape) - len(shape)
        axes = list(range(lead)) + [lead + i for i, d in enumerate(shape) if d == 1 and gshape[lead + i] != 1]
        out = self.op("sum", g, axis=axes, keepdims=False) if axes else g
        if self.type(out).shape != tuple(shape):
            out = self.op("reshape", out, shape=list(shape))
        return out

    def broadcast_to(self, x: int, shape: Shape) -> int:
        if self.type(x).shape == tuple(shape):
            return x
        return self.op("broadcast_to", x, shape=list(shape))

    def cast(self, x: int, dtype: DType) -> int:
        if self.type(x).dtype == dtype:
            return x
        return self.op("cast", x, dtype=dtype.value)

    def program(self, outputs: dict[str, int]) -> Program:
        return Program(name=self.name, inputs=list(self.inputs), nodes=list(self.nodes), outputs=dict(outputs))
