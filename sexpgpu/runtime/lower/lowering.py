"""What a lowered program is made of, and which rule lowers each op.

A lowering rule takes one IR node and says where it goes in the CUDA program: a step of its
own (generated kernels, cuBLAS calls, a view, or for an op the table declares `on_host` its
NumPy kernel on the host), `Fuse` (computed inside a fused
elementwise kernel), or no step at all (`Absorbed`). Rules are registered by op name
(`register_lowering`), or for every op of a kind that has no rule of its own
(`register_kind_lowering`), as JAX registers each primitive's lowering; an op the table
declares `on_host` gets the host rule (`register_host_lowering`). The lowering modules
(steps.py, images.py, attention.py) register their rules when they are imported, which
fusion.py does. The fusion pass finds a node's rule with
`lowering_for` and nothing else.

Every step implements `Step`: the values it reads and writes (the arena's liveness), the
kernels it generates, how it runs (`launch`, over the `StepRun` the executor gives it) and
its line in the report (`describe`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, ClassVar, Optional, Protocol, TypeVar, Union, runtime_checkable

from pydantic import BaseModel

from ...ir.graph import Node, Program, TensorType
from ...ir.ops import OpDef, OpKind
from .blas import BlasCall
from .codegen import KernelSource, LoweringError


class KernelLine(BaseModel):
    """One step in the report of `sexpgpu explain --cuda`."""

    step: int
    kind: str  # fused | rows | reduce | scatter | random | gemm | move | constant | image | attention | host | view
    # what runs, " + " between launches of different kernels: generated kernels by their names
    # (in the program's source), cuBLAS calls as "cublasGemmEx ..." (or "N x cublas... ")
    kernel: str
    nodes: list[str]  # "%id op loc path"
    elements: int
    bytes: int
    flops: int
    launches: int = 1  # per run of the program (a split reduction is two kernels; a constant made once, none)
    cublas: int = 0  # how many of the launches are cuBLAS calls
    how: str = ""  # who computes what: "a warp per row", "a thread per output", ...
    host_bytes: int = 0  # bytes copied between the host and the device per run (an op that runs on the host)
    warning: str = ""  # what the reader must know: an op that runs on the host


class Lowered(Protocol):
    """A lowered program, as a step's report line reads it."""

    @property
    def program(self) -> Program: ...

    @property
    def constants(self) -> dict[int, Node]:
        """The `full` nodes written as literals into the kernels that read them."""
        ...

    def label(self, node: Node) -> str:
        """"%id op loc path", naming the op a decomposition built NODE for."""
        ...


class StepRun(Protocol):
    """One run of a lowered program, as a step's `launch` sees it: the values made so far,
    the program's arena, and the device."""

    @property
    def xp(self) -> Any:
        """The device's array module (CuPy; NumPy in the host emulation)."""
        ...

    def value(self, vid: int) -> Any: ...

    def contiguous(self, vid: int) -> Any:
        """Value VID in C order (what a generated kernel reads)."""
        ...

    def buffer(self, vid: int) -> Any:
        """Value VID's buffer in the arena, in its storage dtype."""
        ...

    def scratch(self, dtype: Any, count: int, offset: int = 0) -> Any:
        """COUNT elements of DTYPE from byte OFFSET of the running step's scratch buffer in
        the arena (see `Step.scratch_bytes`)."""
        ...

    def set(self, vid: int, value: Any) -> None: ...

    def launch(self, kernel: KernelSource, arrays: list[Any]) -> None:
        """Run a generated kernel over ARRAYS (its params in order: contiguous, storage dtypes)."""
        ...

    def gemm(self, call: BlasCall, a: Any, b: Any, c: Any) -> None:
        """One cuBLAS call on the flat storage of A, B and C (cuBLAS's operands, in its order)."""
        ...

    def host_op(self, node: Node) -> Any:
        """NODE's result from the op table's NumPy kernel on host copies of its arguments,
        back on the device (an op that runs on the host, `OpDef.on_host`)."""
        ...

    def each(self, count: int, body: Callable[[int], None], private_bytes: Optional[int] = None) -> None:
        """BODY(i) for each i in range(COUNT), whose launches read and write nothing another
        i's write, but the step's scratch: each i may take the scratch (its first
        PRIVATE_BYTES, where given; the rest each i writes a part of its own) as its own (the
        CPU runs items on its threads at once, each with a copy; a GPU runs them in turn)."""
        ...


class Step(Protocol):
    """One step of a lowered program: generated kernels, cuBLAS calls, an op on the host, or
    a view."""

    kind: ClassVar[str]  # the report's (KernelLine.kind)
    once: ClassVar[bool]  # a constant: computed when the program first runs, its buffer kept for the program's life

    @property
    def nodes(self) -> list[Node]:
        """The IR nodes the step computes."""
        ...

    @property
    def reads(self) -> list[int]:
        """The values it reads: program inputs or values earlier steps made."""
        ...

    @property
    def writes(self) -> list[int]:
        """The values it makes for later steps (or the program's outputs)."""
        ...

    @property
    def aliases(self) -> dict[int, int]:
        """Written value -> the value whose buffer it shares (a view); the others get one each."""
        ...

    def scratch_bytes(self, types: dict[int, TensorType]) -> int:
        """Bytes of arena the step needs while it runs (a split reduction's partial results)."""
        ...

    def kernels(self, program: Program, constants: dict[int, Node]) -> list[KernelSource]:
        """The generated kernels it launches, in launch order."""
        ...

    def launch(self, run: StepRun, kernels: list[KernelSource]) -> None:
        """Compute the step on the device (KERNELS: its `kernels`, compiled)."""
        ...

    def describe(self, index: int, lowered: Lowered) -> KernelLine: ...


@dataclass(frozen=True)
class Prologue:
    """The elementwise nodes that make VALUE from INPUTS (in program order): a step computes
    them as it loads its argument instead of reading the value from memory."""

    nodes: list[Node]
    inputs: list[int]
    value: int


@runtime_checkable
class ComputesInputs(Protocol):
    """A step that can compute an argument's elements as it loads them (attention's q, k and
    v: a projection plus its bias), given the chain that makes it: the fusion pass's
    recomputation hands it the chain when that moves fewer bytes."""

    def computes(self, vid: int) -> bool:
        """Whether it can compute its argument VID (a contiguous value, its flat index the
        chain's) itself."""
        ...

    def compute_input(self, vid: int, prologue: Prologue) -> None: ...


@runtime_checkable
class FitsCache(Protocol):
    """A step that can launch its work a part at a time (the same bits: the parts are
    independent), for a device that wants each part's scratch to stay in its cache."""

    def fit_cache(self, types: dict[int, TensorType], cache_bytes: int) -> None:
        """Split the launches so that each part's scratch fits in CACHE_BYTES where it can."""
        ...


@dataclass(frozen=True)
class Fuse:
    """The node is computed inside a fused elementwise kernel."""

    piecewise: bool = False  # a 1-D join of its arguments: each part loaded inside its own range
    window: Optional[tuple[int, int]] = None  # a window [start, stop) of a 1-D value the group computes: a windowed store

    @property
    def takes_literals(self) -> bool:
        """Whether the node's constant arguments can be literals in the kernel (a window
        stores a value the group computes, so its argument must be one)."""
        return self.window is None


class Absorbed(Enum):
    """A node that is no step of its own."""

    LITERAL = "literal"  # a constant written as a literal into every kernel that reads it
    TRANSPOSE_FLAG = "transpose flag"  # a transpose of the last two axes its readers (matmuls) take as cuBLAS's flag on its source


Placement = Union[Step, Fuse, Absorbed]


class LoweringContext(Protocol):
    """What a rule may ask about the program it lowers."""

    @property
    def types(self) -> dict[int, TensorType]: ...

    def producer(self, vid: int) -> Optional[Node]:
        """The node that makes value VID (None for a program input)."""
        ...

    def readers(self, vid: int) -> list[Node]:
        """The nodes that read value VID (a node reading it twice is there twice)."""
        ...

    def is_returned(self, vid: int) -> bool: ...

    def place(self, node: Node) -> Placement:
        """Where NODE goes: its rule's answer. A rule asks it only of the nodes that read its
        own (later ones), so that placing a node never comes back to it."""
        ...


Rule = Callable[[Node, LoweringContext], Placement]

K = TypeVar("K")

# filled once, when the modules that define rules are imported (steps.py, images.py, attention.py)
LOWERINGS_BY_OP: dict[str, Rule] = {}
LOWERINGS_BY_KIND: dict[OpKind, Rule] = {}
ON_HOST = "on host"
LOWERINGS_ON_HOST: dict[str, Rule] = {}  # ON_HOST -> the rule of every op declared `on_host`


def register_lowering(*ops: str) -> Callable[[Rule], Rule]:
    """A decorator: the rule lowers the ops named OPS."""
    return _registering(LOWERINGS_BY_OP, ops, lambda op: f"op {op}")


def register_kind_lowering(*kinds: OpKind) -> Callable[[Rule], Rule]:
    """A decorator: the rule lowers every op of KINDS that has no rule of its own."""
    return _registering(LOWERINGS_BY_KIND, kinds, lambda kind: f"the kind {kind.value}")


def register_host_lowering(rule: Rule) -> Rule:
    """A decorator: the rule lowers every op the table declares `on_host`."""
    return _registering(LOWERINGS_ON_HOST, (ON_HOST,), lambda key: "the ops on the host")(rule)


def _registering(table: dict[K, Rule], keys: tuple[K, ...], named: Callable[[K], str]) -> Callable[[Rule], Rule]:
    def add(rule: Rule) -> Rule:
        for key in keys:
            if key in table:
                raise ValueError(f"a CUDA lowering for {named(key)} is registered twice")
            table[key] = rule
        return rule

    return add


def lowering_for(op: OpDef) -> Rule:
    """The rule that lowers OP: the host's for an op declared `on_host`, else its own, else
    its kind's."""
    rule = LOWERINGS_ON_HOST.get(ON_HOST) if op.on_host else LOWERINGS_BY_OP.get(op.name) or LOWERINGS_BY_KIND.get(op.kind)
    if rule is None:
        raise LoweringError(f"no CUDA lowering for op {op.name} (kind {op.kind.value})")
    return rule
