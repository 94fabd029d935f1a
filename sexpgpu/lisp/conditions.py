"""The small condition system: a Lisp error is a Python exception carrying a Condition.

Limits are a separate exception class so that `handler-case` and `ignore-errors` can
never swallow them.
"""

from __future__ import annotations

from typing import Any, Optional

from .types import Loc

# the standard condition types (CLHS 9.1) -> their direct supertypes
CONDITION_PARENTS: dict[str, tuple[str, ...]] = {
    "CONDITION": (),
    "WARNING": ("CONDITION",),
    "STYLE-WARNING": ("WARNING",),
    "SIMPLE-CONDITION": ("CONDITION",),
    "SIMPLE-WARNING": ("SIMPLE-CONDITION", "WARNING"),
    "SERIOUS-CONDITION": ("CONDITION",),
    "STORAGE-CONDITION": ("SERIOUS-CONDITION",),
    "ERROR": ("SERIOUS-CONDITION",),
    "SIMPLE-ERROR": ("SIMPLE-CONDITION", "ERROR"),
    "TYPE-ERROR": ("ERROR",),
    "SIMPLE-TYPE-ERROR": ("SIMPLE-CONDITION", "TYPE-ERROR"),
    "PROGRAM-ERROR": ("ERROR",),
    "CONTROL-ERROR": ("ERROR",),
    "CELL-ERROR": ("ERROR",),
    "UNBOUND-VARIABLE": ("CELL-ERROR",),
    "UNDEFINED-FUNCTION": ("CELL-ERROR",),
    "UNBOUND-SLOT": ("CELL-ERROR",),
    "ARITHMETIC-ERROR": ("ERROR",),
    "DIVISION-BY-ZERO": ("ARITHMETIC-ERROR",),
    "FLOATING-POINT-OVERFLOW": ("ARITHMETIC-ERROR",),
    "FLOATING-POINT-UNDERFLOW": ("ARITHMETIC-ERROR",),
    "FLOATING-POINT-INEXACT": ("ARITHMETIC-ERROR",),
    "FLOATING-POINT-INVALID-OPERATION": ("ARITHMETIC-ERROR",),
    "PARSE-ERROR": ("ERROR",),
    "STREAM-ERROR": ("ERROR",),
    "END-OF-FILE": ("STREAM-ERROR",),
    "READER-ERROR": ("PARSE-ERROR", "STREAM-ERROR"),
    "FILE-ERROR": ("ERROR",),
    "PACKAGE-ERROR": ("ERROR",),
    "PRINT-NOT-READABLE": ("ERROR",),
}

# the classes the differential suite records an error under, most specific first
ERROR_CLASSES = (
    "UNBOUND-VARIABLE", "UNDEFINED-FUNCTION", "DIVISION-BY-ZERO", "FLOATING-POINT-OVERFLOW", "ARITHMETIC-ERROR",
    "TYPE-ERROR", "PROGRAM-ERROR", "CONTROL-ERROR", "PARSE-ERROR", "STREAM-ERROR", "CELL-ERROR", "ERROR",
)


def condition_isa(ctype: str, ancestor: str) -> bool:
    """Whether condition type CTYPE is ANCESTOR or one of its subtypes."""
    if ancestor == "T" or ctype == ancestor:
        return True
    pending = list(CONDITION_PARENTS.get(ctype, ()))
    while pending:
        current = pending.pop()
        if current == ancestor:
            return True
        pending.extend(CONDITION_PARENTS.get(current, ()))
    return False


def error_class(condition: "Condition | str") -> str:
    """The most specific of ERROR_CLASSES that a condition (or a standard condition type)
    belongs to (lower case)."""
    for name in ERROR_CLASSES:
        if condition_is(condition, name) if type(condition) is Condition else condition_isa(str(condition), name):
            return name.lower()
    return "condition"


class Condition:
    """A condition object as Lisp code sees it (handler-case binds it). SLOTS holds what its
    readers return (format-control, format-arguments, datum, expected-type, name ..., and a
    define-condition type's own slots). LINEAGE is every supertype of a define-condition type
    (empty for the standard types, whose supertypes CONDITION_PARENTS gives); REPORT its
    :report (a string or a function of the condition and a stream), if any."""

    __slots__ = ("ctype", "message", "code", "datum", "slots", "lineage", "report")

    def __init__(self, ctype: str, message: str, code: str = "E104", datum: Any = None, slots: Optional[dict[str, Any]] = None,
                 lineage: tuple[str, ...] = (), report: Any = None) -> None:
        self.ctype = ctype
        self.message = message
        self.code = code
        self.datum = datum
        self.slots = slots if slots is not None else {}
        self.lineage = lineage
        self.report = report


class OperationName(str):
    """The name of the function an arithmetic error happened in; arithmetic-error-operation
    gives its symbol."""


def condition_is(condition: Condition, ancestor: str) -> bool:
    """Whether CONDITION is of the condition type named ANCESTOR."""
    if condition.lineage:
        return ancestor == "T" or any(condition_isa(t, ancestor) for t in condition.lineage)
    return condition_isa(condition.ctype, ancestor)


class LispError(Exception):
    """A signalled error. `loc` is the innermost user source position known; `macro` the
    macro whose expansion the error came from, if any; `notes` extra lines."""

    def __init__(self, condition: Condition, loc: Optional[Loc] = None) -> None:
        super().__init__(condition.message)
        self.condition = condition
        self.loc = loc
        self.macro: Optional[str] = None
        self.notes: list[str] = []
        # true once the handlers were searched at the signal point (error, signal, warn);
        # an error a builtin raises is searched for as it passes each handler-bind instead
        self.signalled = False


def lisp_error(code: str, message: str, ctype: str = "SIMPLE-ERROR", datum: Any = None) -> LispError:
    return LispError(Condition(ctype, message, code, datum))


class LimitExceeded(Exception):
    """An evaluation limit ran out: never catchable from Lisp."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.loc: Optional[Loc] = None
        self.macro: Optional[str] = None
