"""The condition system's builtins (CLHS 9): making, signalling and handling conditions,
restarts, and the readers of condition slots."""

from __future__ import annotations

from typing import Any, Callable

from .builtins import (
    Lib,
    format_to_string,
    lbool,
    list_items,
    need_symbol,
    parse_keys,
    short,
    to_lisp_list,
    type_error,
)
from .conditions import CONDITION_PARENTS, Condition, LispError, OperationName, condition_is, lisp_error
from .objects import ConditionType, HandlerCluster
from .types import NIL, T, Symbol
from .registry import builtin


condition_keys = {"FORMAT-CONTROL", "FORMAT-ARGUMENTS", "DATUM", "EXPECTED-TYPE", "NAME", "OPERATION", "OPERANDS", "PATHNAME", "STREAM", "PACKAGE"}


def make_condition(lib: Lib, ctype: str, datum: Any, args: tuple[Any, ...], default_type: str) -> Condition:
    """The condition that error, warn, signal and make-condition make of their arguments."""
    interp = lib.interp
    if type(datum) is str:
        message = format_to_string(interp, datum, list(args))
        slots = {"FORMAT-CONTROL": datum, "FORMAT-ARGUMENTS": to_lisp_list(args)}
        return Condition(default_type, message, "E104" if default_type != "SIMPLE-WARNING" else "W001", slots=slots)
    if type(datum) is Condition:
        return datum
    if type(datum) is Symbol:
        defined = interp.condition_types.get(datum.name)
        if defined is not None:
            return defined_condition(lib, ctype, defined, args)
        if datum.name not in CONDITION_PARENTS or datum.package not in ("", None):
            raise lisp_error("E103", f"`{ctype}`: {short(datum)} is not a condition type", "TYPE-ERROR", datum)
        keys = parse_keys(ctype, args, condition_keys, 2)
        return Condition(datum.name, standard_message(lib, ctype, datum.name, keys), "E104", keys.get("DATUM"), slots=keys)
    raise type_error(ctype, 1, "a format string, condition type or condition", datum)


def standard_message(lib: Lib, fn: str, name: str, keys: dict[str, Any]) -> str:
    interp = lib.interp
    if "FORMAT-CONTROL" in keys:
        control = keys["FORMAT-CONTROL"]
        arguments = list_items(fn, 5, keys.get("FORMAT-ARGUMENTS", NIL))
        return format_to_string(interp, control, arguments) if type(control) is str else short(control)
    if "DATUM" in keys:
        return f"The value {short(keys['DATUM'])} is not of type {short(keys.get('EXPECTED-TYPE', T))}"
    if "NAME" in keys:
        return f"{name.lower()}: {short(keys['NAME'])}"
    return f"condition {name.lower()} was signalled"


def defined_condition(lib: Lib, fn: str, ctype: ConditionType, args: tuple[Any, ...]) -> Condition:
    interp = lib.interp
    initargs = {k.name for _, inits, _ in ctype.slots for k in inits}
    keys = parse_keys(fn, args, condition_keys | initargs, 2)
    slots = {k: v for k, v in keys.items() if k in condition_keys}
    for slot, inits, initform in ctype.slots:
        given = next((keys[k.name] for k in inits if k.name in keys), None)
        if given is not None or any(k.name in keys for k in inits):
            slots[slot] = given
        elif initform is not None:
            slots[slot] = interp.call(initform)
    message = ctype.report if type(ctype.report) is str else standard_message(lib, fn, ctype.name, keys)
    return Condition(ctype.name, message, "E104", keys.get("DATUM"), slots, lineage=ctype.lineage, report=ctype.report)


@builtin("%define-condition", context=Lib)
def p_define_condition(lib: Lib, name: Any, parents: Any, slots: Any, report: Any) -> Any:
    interp = lib.interp
    need_symbol("define-condition", 1, name)
    lineage = [name.name]
    inherited: list[tuple[str, list[Any], Any]] = []
    for parent in list_items("define-condition", 2, parents) or [interp.sym("CONDITION")]:
        known = interp.condition_types.get(need_symbol("define-condition", 2, parent).name)
        if known is not None:
            lineage.extend(known.lineage)
            inherited.extend(known.slots)
            if report is NIL and known.report is not None:
                report = known.report
        elif parent.name in CONDITION_PARENTS:
            lineage.append(parent.name)
        else:
            raise lisp_error("E103", f"`define-condition`: {short(parent)} is not a condition type", "ERROR", parent)
    specs = []
    for spec in list_items("define-condition", 3, slots):
        slot_name, inits, initform = list_items("define-condition", 3, spec)
        specs.append((need_symbol("define-condition", 3, slot_name).name, list_items("define-condition", 3, inits), None if initform is NIL else initform))
    own = {slot for slot, _, _ in specs}
    specs = specs + [spec for spec in inherited if spec[0] not in own]
    interp.condition_types[name.name] = ConditionType(name.name, tuple(dict.fromkeys(lineage)), specs, None if report is NIL else report)
    return name


@builtin("%condition-slot")
def condition_slot(c: Any, slot: Any) -> Any:
    if type(c) is not Condition:
        raise type_error("slot-value", 1, "a condition", c)
    name = need_symbol("slot-value", 2, slot).name
    if name not in c.slots:
        raise lisp_error("E103", f"the condition has no slot {short(slot)}", "ERROR", slot)
    return c.slots[name]


@builtin("%set-condition-slot")
def set_condition_slot(c: Any, slot: Any, value: Any) -> Any:
    condition_slot(c, slot)
    c.slots[slot.name] = value
    return value


def signal_condition(lib: Lib, condition: Condition) -> None:
    """Search the active handlers, innermost first (CLHS 9.1.4): a handler-case that takes
    the condition gets it raised to it; each handler-bind handler for it is called, with
    only the handlers outside its own active, and may decline by returning."""
    interp = lib.interp
    stack = interp.handlers
    for i in range(len(stack) - 1, -1, -1):
        frame = stack[i]
        if type(frame) is tuple:
            if any(interp.types.typep(condition, spec) for spec in frame):
                exc = LispError(condition)
                exc.signalled = True
                raise exc
            continue
        assert type(frame) is HandlerCluster
        for spec, handler in frame.bindings:
            if interp.types.typep(condition, spec):
                inner = stack[i:]
                del stack[i:]
                try:
                    interp.call(handler, condition)
                finally:
                    stack[i:] = inner


@builtin("%handler-bind", context=Lib)
def handler_bind(lib: Lib, bindings: Any, thunk: Any) -> Any:
    """The core of handler-bind: call THUNK with the cluster active. An error a builtin
    raised (not yet searched) is offered to this cluster's handlers as it passes."""
    interp = lib.interp
    pairs = [(b.car, interp.function_value(b.cdr)) for b in list_items("handler-bind", 1, bindings)]
    cluster = HandlerCluster(pairs)
    depth = len(interp.handlers)
    interp.handlers.append(cluster)
    try:
        return interp.apply(interp.function_value(thunk), [])
    except LispError as exc:
        del interp.handlers[depth:]
        if not exc.signalled:
            for spec, handler in pairs:
                if interp.types.typep(exc.condition, spec):
                    interp.call(handler, exc.condition)
        raise
    finally:
        del interp.handlers[depth:]


@builtin("error", context=Lib)
def lisp_error_fn(lib: Lib, datum: Any, *args: Any) -> Any:
    condition = make_condition(lib, "error", datum, args, "SIMPLE-ERROR")
    signal_condition(lib, condition)
    exc = LispError(condition)
    exc.signalled = True
    raise exc


@builtin("%signal", context=Lib)
def p_signal(lib: Lib, condition: Any) -> Any:
    signal_condition(lib, condition)
    return NIL


@builtin("%make-warning", context=Lib)
def p_make_warning(lib: Lib, datum: Any, args: Any) -> Any:
    condition = make_condition(lib, "warn", datum, tuple(list_items("warn", 2, args)), "SIMPLE-WARNING")
    if not condition_is(condition, "WARNING"):
        raise type_error("warn", 1, "a warning (a format string or a warning type)", datum)
    return condition


@builtin("%record-warning", context=Lib)
def p_record_warning(lib: Lib, condition: Any) -> Any:
    interp = lib.interp
    interp.warnings.append((condition.message, interp.current_loc))
    return NIL


@builtin("signal", context=Lib)
def signal(lib: Lib, datum: Any, *args: Any) -> Any:
    """Signal: handlers may take the condition; if none does, nil."""
    return p_signal(lib, make_condition(lib, "signal", datum, args, "SIMPLE-CONDITION"))


def condition_reader(slot: str, fn: str, kind: str) -> Callable[..., Any]:
    """The reader FN of a condition slot, for conditions of type KIND."""

    def read(lib: Lib, c: Any) -> Any:
        if type(c) is not Condition or not condition_is(c, kind):
            raise type_error(fn, 1, f"a {kind.lower()}", c)
        value = c.slots.get(slot, c.datum if slot in ("DATUM", "NAME") and c.datum is not None else NIL)
        return lib.interp.sym(value.upper()) if type(value) is OperationName else value

    return read


@builtin("%coerce-condition", context=Lib)
def p_coerce_condition(lib: Lib, datum: Any, args: Any, default_type: Any) -> Any:
    """The condition error, signal or warn would make of DATUM and ARGS (restart-case
    makes it first, to associate its restarts with it)."""
    return make_condition(lib, default_type.lower(), datum, tuple(list_items("restart-case", 2, args)), default_type)


make_condition_ = builtin("make-condition", context=Lib)(lambda lib, ctype, *args: make_condition(lib, "make-condition", need_symbol("make-condition", 1, ctype), args, "SIMPLE-ERROR"))
simple_condition_format_control = builtin("simple-condition-format-control", context=Lib)(condition_reader("FORMAT-CONTROL", "simple-condition-format-control", "SIMPLE-CONDITION"))
simple_condition_format_arguments = builtin("simple-condition-format-arguments", context=Lib)(condition_reader("FORMAT-ARGUMENTS", "simple-condition-format-arguments", "SIMPLE-CONDITION"))
type_error_datum = builtin("type-error-datum", context=Lib)(condition_reader("DATUM", "type-error-datum", "TYPE-ERROR"))
type_error_expected_type = builtin("type-error-expected-type", context=Lib)(condition_reader("EXPECTED-TYPE", "type-error-expected-type", "TYPE-ERROR"))
cell_error_name = builtin("cell-error-name", context=Lib)(condition_reader("NAME", "cell-error-name", "CELL-ERROR"))
arithmetic_error_operation = builtin("arithmetic-error-operation", context=Lib)(condition_reader("OPERATION", "arithmetic-error-operation", "ARITHMETIC-ERROR"))
arithmetic_error_operands = builtin("arithmetic-error-operands", context=Lib)(condition_reader("OPERANDS", "arithmetic-error-operands", "ARITHMETIC-ERROR"))
p_condition_p = builtin("%condition-p")(lambda x: lbool(type(x) is Condition))
p_condition_message = builtin("%condition-message")(lambda c: c.message if type(c) is Condition else short(c))

