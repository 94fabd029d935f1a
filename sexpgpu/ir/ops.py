"""The op table: each tensor operation declared once, with its shape and dtype rule, its
gradient written as IR, its NumPy kernel and its CUDA lowering (an expression template for
elementwise ops; the CUDA code generator reads it).

Entries live in ops_*.py next to this file and register themselves here; adding an op
touches one entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np

from .graph import Node, TensorType

if TYPE_CHECKING:
    from .builder import Builder

Kernel = Callable[[list[np.ndarray], dict[str, Any], Optional[np.ndarray]], np.ndarray]
ShapeRule = Callable[[list[TensorType], dict[str, Any]], TensorType]
GradRule = Callable[["Builder", Node, int], list[Optional[int]]]
FlopRule = Callable[[Node, list[TensorType]], int]


class OpError(Exception):
    """A shape or dtype error, phrased for the user, e.g.
    `matmul: f32[64,128] @ f32[64,10]: inner dimensions 128 and 64 differ`."""


def elementwise_flops(node: Node, inputs: list[TensorType]) -> int:
    return node.type.size


def no_flops(node: Node, inputs: list[TensorType]) -> int:
    return 0


@dataclass(frozen=True)
class OpDef:
    name: str
    infer: ShapeRule
    numpy: Kernel
    grad: Optional[GradRule]  # None: not differentiable (integer or boolean results)
    arity: Optional[int] = None  # None: any number of arguments
    cuda: Optional[str] = None  # elementwise: a C expression over {0}, {1}, ...
    flops: FlopRule = elementwise_flops
    elementwise: bool = False
    doc: str = ""
    attrs: tuple[str, ...] = field(default=())
    # optional: (attrs, input types) -> a kernel with the attrs worked out once, which the
    # NumPy plan uses instead of `numpy` so a step does no per-call attribute work
    specialize: Optional[Callable[[dict[str, Any], list[TensorType]], Kernel]] = None
    # optional: how the CUDA lowering builds the op from other ops (which it then fuses), for
    # an op that is a primitive for its gradient's sake: (builder, node with its args) -> value
    decompose: Optional[Callable[["Builder", Node], int]] = None


OPS: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    if op.name in OPS:
        raise ValueError(f"op {op.name} registered twice")
    OPS[op.name] = op
    return op


def op_def(name: str) -> OpDef:
    _load_entries()
    try:
        return OPS[name]
    except KeyError:
        raise OpError(f"unknown op `{name}`") from None


_LOADED: list[bool] = []


def _load_entries() -> None:
    if _LOADED:
        return
    _LOADED.append(True)
    from . import ops_conv, ops_elementwise, ops_linalg, ops_random, ops_reduce, ops_shape  # noqa: F401  (they register)


def all_ops() -> dict[str, OpDef]:
    _load_entries()
    return OPS
