"""Structures (CLHS 8): the cores of defstruct, its constructors, accessors and predicates."""


from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .builtins import (
    Registry,
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

if TYPE_CHECKING:
    pass

def install(reg: Registry) -> None:
    interp = reg.interp
    add = reg.add

    # -- structures ----------------------------------------------------------------------------------------
    def p_defstruct(name: Any, slots: Any, include: Any) -> Any:
        need_symbol("defstruct", 1, name)
        parent = interp.structs.get(include) if include is not NIL else None
        if include is not NIL and parent is None:
            raise lisp_error("E103", f"defstruct: :include names `{short(include)}`, which is not a structure", "TYPE-ERROR")
        interp.structs[name] = StructType(name, list_items("defstruct", 2, slots), parent)
        return name

    def need_struct_type(fn: str, name: Any) -> StructType:
        stype = interp.structs.get(name)
        if stype is None:
            raise lisp_error("E103", f"`{fn}`: `{short(name)}` is not a structure type", "TYPE-ERROR")
        return stype

    def make_struct(name: Any, *values: Any) -> Any:
        return StructInstance(need_struct_type("make-struct", name), list(values))

    def struct_ref(obj: Any, name: Any, index: Any) -> Any:
        stype = need_struct_type("struct accessor", name)
        if type(obj) is not StructInstance or not obj.stype.isa(stype):
            raise type_error(f"{name.name.lower()}-{stype.slots[index].name.lower()}", 1, f"a {name.name.lower()}", obj)
        return obj.values[index]

    def struct_set(obj: Any, name: Any, index: Any, value: Any) -> Any:
        struct_ref(obj, name, index)
        obj.values[index] = value
        return value

    def struct_p(obj: Any, name: Any) -> Any:
        stype = need_struct_type("struct predicate", name)
        return lbool(type(obj) is StructInstance and obj.stype.isa(stype))

    def copy_structure(obj: Any) -> Any:
        if type(obj) is not StructInstance:
            raise type_error("copy-structure", 1, "a structure", obj)
        return StructInstance(obj.stype, list(obj.values))

    def struct_slots(name: Any) -> Any:

        return to_lisp_list(need_struct_type("defstruct", name).slots)

    def set_struct_printer(name: Any, fn: Any, print_object: Any) -> Any:
        need_struct_type("defstruct", name).printer = (fn, print_object is not NIL)
        return name

    add("%defstruct", p_defstruct)
    add("%set-struct-printer", set_struct_printer)
    add("%make-struct", make_struct)
    add("%struct-ref", struct_ref)
    add("%struct-set", struct_set)
    add("%struct-p", struct_p)
    add("%struct-slots", struct_slots)
    add("copy-structure", copy_structure)

