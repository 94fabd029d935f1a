"""The small condition system: a Lisp error is a Python exception carrying a Condition.

Limits are a separate exception class so that `handler-case` and `ignore-errors` can
never swallow them.
"""

from __future__ import annotations

from typing import Any, Optional

from .types import Loc

# condition type -> its parent, the CL hierarchy for the types SexpGPU signals
CONDITION_PARENTS: dict[str, Optional[str]] = {
    "CONDITION": None,
    "WARNING": "CONDITION",
    "SIMPLE-WARNING": "WARNING",
    "STYLE-WARNING": "WARNING",
    "SERIOUS-CONDITION": "CONDITION",
    "ERROR": "SERIOUS-CONDITION",
    "SIMPLE-ERROR": "ERROR",
    "TYPE-ERROR": "ERROR",
    "SIMPLE-TYPE-ERROR": "TYPE-ERROR",
    "PROGRAM-ERROR": "ERROR",
    "CONTROL-ERROR": "ERROR",
    "CELL-ERROR": "ERROR",
    "UNBOUND-VARIABLE": "CELL-ERROR",
    "UNDEFINED-FUNCTION": "CELL-ERROR",
    "ARITHMETIC-ERROR": "ERROR",
    "DIVISION-BY-ZERO": "ARITHMETIC-ERROR",
    "FLOATING-POINT-OVERFLOW": "ARITHMETIC-ERROR",
    "PARSE-ERROR": "ERROR",
    "STORAGE-CONDITION": "SERIOUS-CONDITION",
}


def condition_isa(ctype: str, ancestor: str) -> bool:
    """Whether CTYPE is ANCESTOR or a subtype. A type SexpGPU does not know (signalled as
    (error 'my-error)) counts as a kind of ERROR."""
    current: Optional[str] = ctype
    while current is not None:
        if current == ancestor:
            return True
        current = CONDITION_PARENTS.get(current, "ERROR" if current not in CONDITION_PARENTS else None)
    return ancestor == "T"


class Condition:
    """A condition object as Lisp code sees it (handler-case binds it)."""

    __slots__ = ("ctype", "message", "code", "datum")

    def __init__(self, ctype: str, message: str, code: str = "E104", datum: Any = None) -> None:
        self.ctype = ctype
        self.message = message
        self.code = code
        self.datum = datum


class LispError(Exception):
    """A signalled error. `loc` is the innermost user source position known; `macro` the
    macro whose expansion the error came from, if any; `notes` extra lines."""

    def __init__(self, condition: Condition, loc: Optional[Loc] = None) -> None:
        super().__init__(condition.message)
        self.condition = condition
        self.loc = loc
        self.macro: Optional[str] = None
        self.notes: list[str] = []


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
