"""Records that cross a file or a process, and the one way they cross it.

The records a check builds (diagnostics, the evaluator's limits, the IR, the experiment) are
stdlib dataclasses: a check makes thousands of them and writes none, and importing pydantic
and building its models cost a check more than its compile did. Where a record is written
or read (a bundle's ir.json, a run folder's run.json, a worker's arguments, the `--json` of
`inspect` and `eval`), pydantic validates and serializes it here, through a TypeAdapter built
on first use; `plain` gives the same data without pydantic, for hashes, comparisons and
`check --json`. JSON
from these functions is byte for byte what the pydantic models of earlier versions wrote
(tests/test_record_identity.py), so what they wrote still loads.

A leaf module: it imports pydantic only inside its functions.
"""

from __future__ import annotations

import dataclasses
import math
from enum import Enum
from functools import cache
from typing import TYPE_CHECKING, Any, Hashable, Literal, Optional, TypeVar, cast

if TYPE_CHECKING:
    from pydantic import TypeAdapter

R = TypeVar("R")
Mode = Literal["json", "python"]


def _adapter(kind: Any) -> TypeAdapter[Any]:
    return _built(cast(Hashable, kind))


@cache
def _built(kind: Hashable) -> TypeAdapter[Any]:
    from pydantic import TypeAdapter

    return TypeAdapter(kind)


def adapter(kind: type[R]) -> TypeAdapter[R]:
    """The TypeAdapter of KIND (a record class, or a type such as dict[str, Program]), built
    once per process."""
    return _adapter(kind)


def is_record(value: Any) -> bool:
    """Whether VALUE is a record (a dataclass instance, not a class)."""
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def dump(record: Any, mode: Mode = "json", exclude: Optional[set[str]] = None, exclude_none: bool = False) -> Any:
    """RECORD as plain data (mode "json": only what JSON holds; tuples become lists, enums
    their values), as a pydantic model's model_dump gave it."""
    return _adapter(type(record)).dump_python(record, mode=mode, exclude=exclude, exclude_none=exclude_none)


def dump_json(record: Any, indent: Optional[int] = None, exclude_none: bool = False) -> bytes:
    """RECORD as JSON bytes, as a pydantic model's model_dump_json gave them."""
    return _adapter(type(record)).dump_json(record, indent=indent, exclude_none=exclude_none)


def load(kind: type[R], data: Any) -> R:
    """A KIND validated from plain data (what dump gave, or json.loads of a file); raises
    pydantic's ValidationError (a ValueError) when it does not fit."""
    return adapter(kind).validate_python(data)


def load_json(kind: type[R], text: str | bytes) -> R:
    """A KIND validated from JSON text; raises pydantic's ValidationError (a ValueError)."""
    return adapter(kind).validate_json(text)


def plain(value: Any, exclude_none: bool = False) -> Any:
    """VALUE (a record, or what a record field holds) as dump(VALUE, exclude_none=EXCLUDE_NONE)
    gives it, without pydantic: records as dicts of their fields in order, tuples as lists, an
    enum as its value, a float that is not finite as None (pydantic's JSON mode). For hashes,
    comparisons and `check --json` (an editor asks on every save); what is written to a file
    or another process goes through dump. A value of another kind (a NumPy scalar) is given to
    pydantic."""
    kind: Any = type(value)
    if kind in _ATOMS:
        return value
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is list or kind is tuple:
        if all(type(v) is int for v in value):  # a shape, a node's arguments
            return list(value)
        return [plain(v, exclude_none) for v in value]
    names = _field_names(kind)
    if names is not None:
        fields = ((name, getattr(value, name)) for name in names)
        return {name: plain(v, exclude_none) for name, v in fields if not (exclude_none and v is None)}
    if kind is dict and all(type(k) is str for k in value):
        return {k: plain(v, exclude_none) for k, v in value.items()}
    if isinstance(value, Enum) and type(value.value) in (str, int):
        return value.value
    return _adapter(Any).dump_python(value, mode="json")


_ATOMS = frozenset({str, int, bool, type(None)})


@cache
def _field_names(kind: Any) -> Optional[tuple[str, ...]]:
    """The fields of a record class, in order; None for any other class."""
    return tuple(f.name for f in dataclasses.fields(kind)) if dataclasses.is_dataclass(kind) else None


def as_floats(record: Any, *names: str) -> None:
    """Make the numbers in RECORD's fields NAMES floats (None stays None), as pydantic coerced
    a float field: an int written in the file is the same value and the same JSON."""
    for name in names:
        value = getattr(record, name)
        if value is not None and type(value) is not float:
            object.__setattr__(record, name, float(value))


