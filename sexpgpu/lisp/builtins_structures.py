"""Structures (CLHS 8): the cores of defstruct, its constructors, accessors and predicates."""

from __future__ import annotations

from typing import Any

from .builtins import (
    Lib,
    lbool,
    list_items,
    need_symbol,
    short,
    to_lisp_list,
    type_error,
)
from .conditions import lisp_error
from .objects import StructInstance, StructType
from .types import NIL
from .registry import builtin


@builtin("%defstruct", context=Lib)
def p_defstruct(lib: Lib, name: Any, slots: Any, include: Any) -> Any:
    interp = lib.interp
    need_symbol("defstruct", 1, name)
    parent = interp.structs.get(include) if include is not NIL else None
    if include is not NIL and parent is None:
        raise lisp_error("E103", f"defstruct: :include names `{short(include)}`, which is not a structure", "TYPE-ERROR")
    interp.structs[name] = StructType(name, list_items("defstruct", 2, slots), parent)
    return name


def need_struct_type(lib: Lib, fn: str, name: Any) -> StructType:
    interp = lib.interp
    stype = interp.structs.get(name)
    if stype is None:
        raise lisp_error("E103", f"`{fn}`: `{short(name)}` is not a structure type", "TYPE-ERROR")
    return stype


@builtin("%make-struct", context=Lib)
def make_struct(lib: Lib, name: Any, *values: Any) -> Any:
    return StructInstance(need_struct_type(lib, "make-struct", name), list(values))


@builtin("%struct-ref", context=Lib)
def struct_ref(lib: Lib, obj: Any, name: Any, index: Any) -> Any:
    stype = need_struct_type(lib, "struct accessor", name)
    if type(obj) is not StructInstance or not obj.stype.isa(stype):
        raise type_error(f"{name.name.lower()}-{stype.slots[index].name.lower()}", 1, f"a {name.name.lower()}", obj)
    return obj.values[index]


@builtin("%struct-set", context=Lib)
def struct_set(lib: Lib, obj: Any, name: Any, index: Any, value: Any) -> Any:
    struct_ref(lib, obj, name, index)
    obj.values[index] = value
    return value


@builtin("%struct-p", context=Lib)
def struct_p(lib: Lib, obj: Any, name: Any) -> Any:
    stype = need_struct_type(lib, "struct predicate", name)
    return lbool(type(obj) is StructInstance and obj.stype.isa(stype))


@builtin("copy-structure")
def copy_structure(obj: Any) -> Any:
    if type(obj) is not StructInstance:
        raise type_error("copy-structure", 1, "a structure", obj)
    return StructInstance(obj.stype, list(obj.values))


@builtin("%struct-slots", context=Lib)
def struct_slots(lib: Lib, name: Any) -> Any:

    return to_lisp_list(need_struct_type(lib, "defstruct", name).slots)


@builtin("%set-struct-printer", context=Lib)
def set_struct_printer(lib: Lib, name: Any, fn: Any, print_object: Any) -> Any:
    need_struct_type(lib, "defstruct", name).printer = (fn, print_object is not NIL)
    return name


