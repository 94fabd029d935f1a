"""Knob probes: how one staging serves every point of a sweep that differs only in scalars.

A probe compile binds each knob that varies across a group of points to a probe: a number of
the knob's type (a float or an int subclass) holding a poison value no file writes. The
compile layer's sinks take a probe's value without looking at it: a tensor operation turns
it into an IR constant (`TensorLib.staged`), a record keeps it (`Compiler.number_of`,
`count_of`, replayed per point as guards). Anything else that reads the value (a comparison,
arithmetic, printing, hashing, a shape) goes through one of the probe's methods, which
records the knob as observed: such a knob reaches the program's structure and its points
are grouped by its value. What the Python runtime reads without a method call (a C function
on the float) gives a number derived from the poison, which the check against a real compile
of the group's first point catches (pipeline.compile_points).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

from ..lisp.objects import BitVector, HashTable, LispArray, StructInstance
from ..lisp.types import Cons

if TYPE_CHECKING:
    from ..ir.experiment import KnobSpec
    from .selection import Written
    from .tensors import Tracer

# poison values: numbers no file writes, far from any a computation could produce by chance.
# Ints are past 2**32, so a seed taken modulo 2**32 (a random op's key) differs from the poison.
FLOAT_POISON = 0.0012345678901234567
INT_POISON = 2**41 + 7919


def float_poison(index: int) -> float:
    return FLOAT_POISON * (1.0 + index * 2.0**-20)


def int_poison(index: int) -> int:
    return INT_POISON + 104_729 * index


@dataclass
class Probing:
    """One probe compile's record: the knobs probed, with each point's value; what observed
    a knob; the guards to replay per point; each point's KnobSpec; the points whose values
    the knob checks refuse (they compile on their own); the tracers staged into (for the
    constants each builder shares)."""

    values: dict[str, list[Any]]  # knob -> its literal value at each point of the group
    written: dict[str, list[Optional["Written"]]]  # knob -> where each point's value is written
    bound: dict[str, list[Any]] = field(default_factory=dict)  # knob -> each point's value as bound (checked)
    observed: set[str] = field(default_factory=set)
    guards: list[tuple[str, Callable[[Any], Any]]] = field(default_factory=list)
    specs: dict[str, list[Optional["KnobSpec"]]] = field(default_factory=dict)
    refused: set[int] = field(default_factory=set)
    tracers: dict[int, "Tracer"] = field(default_factory=dict)  # by id
    poisons: dict[str, Any] = field(default_factory=dict)

    def observe(self, knob: str) -> None:
        self.observed.add(knob)

    def guard(self, knob: str, check: Callable[[Any], Any]) -> None:
        self.guards.append((knob, check))

    def probe(self, knob: str, value: Any) -> Any:
        """The probe that stands for KNOB (whose first point's value is VALUE), or VALUE itself
        when the knob's type has no probe."""
        index = len(self.poisons)
        if type(value) is float:
            made: Any = FloatProbe(float_poison(index), knob, self)
        elif type(value) is int:
            made = IntProbe(int_poison(index), knob, self)
        else:
            self.observe(knob)
            return value
        self.poisons[knob] = made.plain()
        return made


def _observing(base: type, name: str) -> Callable[..., Any]:
    original = getattr(base, name)

    def method(self: Any, *args: Any) -> Any:
        self.probing.observe(self.knob)
        return original(self, *args)

    method.__name__ = name
    return method


FLOAT_READS = ("__eq__ __ne__ __lt__ __le__ __gt__ __ge__ __hash__ __bool__ __add__ __radd__ __sub__ __rsub__ __mul__ __rmul__ "
               "__truediv__ __rtruediv__ __floordiv__ __rfloordiv__ __mod__ __rmod__ __divmod__ __rdivmod__ __pow__ __rpow__ __neg__ "
               "__pos__ __abs__ __float__ __int__ __round__ __trunc__ __floor__ __ceil__ __repr__ __str__ __format__ is_integer "
               "as_integer_ratio hex conjugate __getnewargs__ __reduce__ __reduce_ex__").split()
INT_READS = FLOAT_READS + ("__and__ __rand__ __or__ __ror__ __xor__ __rxor__ __lshift__ __rlshift__ __rshift__ __rrshift__ __invert__ "
                           "__index__ bit_length bit_count to_bytes __lshift__").split()


class Probe:
    """What a knob's stand-in is besides its number: the knob, and the record it notes
    observations in. `plain` is the poison as a plain number, read without observing (for
    the sinks)."""

    knob: str
    probing: Probing

    def __new__(cls, value: Any, knob: str, probing: Probing) -> Any:
        made = super().__new__(cls, value)  # type: ignore[call-arg]
        made.knob = knob
        made.probing = probing
        return made

    def plain(self) -> Any:
        number: Any = self
        return float.__float__(number) if isinstance(number, float) else int.__int__(number)


class FloatProbe(Probe, float):
    """A float knob's stand-in in a probe compile (see the module's docstring)."""


class IntProbe(Probe, int):
    """An integer knob's stand-in in a probe compile."""


for _name in FLOAT_READS:
    if hasattr(float, _name):
        setattr(FloatProbe, _name, _observing(float, _name))
for _name in INT_READS:
    if hasattr(int, _name):
        setattr(IntProbe, _name, _observing(int, _name))

PROBES = (FloatProbe, IntProbe)


def is_probe(x: Any) -> bool:
    return type(x) is FloatProbe or type(x) is IntProbe


def observe_within(values: Any) -> None:
    """Note the knob of every probe in VALUES or inside them: in a list, a vector, an array,
    a structure or a hash table, as far as they reach (each object once)."""
    for x in values:  # most calls take only plain atoms: no walk
        kind = type(x)
        if kind is FloatProbe or kind is IntProbe or kind in CONTAINERS:
            break
    else:
        return
    stack = list(values)
    seen: set[int] = set()
    while stack:
        x = stack.pop()
        kind = type(x)
        if kind is FloatProbe or kind is IntProbe:
            x.probing.observe(x.knob)
        elif kind in CONTAINERS and id(x) not in seen:
            seen.add(id(x))
            stack.extend(CONTAINERS[kind](x))


# what a probe can sit inside of, and how to reach what is inside
CONTAINERS: dict[type, Callable[[Any], Iterable[Any]]] = {
    Cons: lambda c: (c.car, c.cdr),
    list: lambda v: v,
    tuple: lambda v: v,
    BitVector: lambda v: (),
    LispArray: lambda a: (a.data,),
    StructInstance: lambda s: s.values,
    HashTable: lambda h: h.entries.values(),  # (key, value) pairs
}


def plain(x: Any) -> Any:
    """X's value as the sinks take it: a probe's poison as a plain number, anything else as is."""
    return x.plain() if type(x) is FloatProbe or type(x) is IntProbe else x
