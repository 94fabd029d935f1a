"""Diagnostics: `file:line:col: error[CODE]: message`, the source line and a caret.

Every code the compiler can emit is listed in CODES; docs/check-and-watch.md carries the
catalogue and tests/test_diagnostics.py has a test of each one's exact message and position.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from .types import Loc

Severity = Literal["error", "warning"]

CODES: dict[str, str] = {
    # reader
    "R001": "unexpected end of input: a list, string or form is not closed",
    "R002": "unexpected ')' with no list open",
    "R003": "bad token: not a valid number or symbol",
    "R004": "bad character name after #\\",
    "R005": "unsupported or refused reader syntax (#., unknown # dispatch)",
    "R006": "misplaced dot",
    "R007": "the file is not valid UTF-8 text",
    "R008": "bad feature expression after #+ or #-",
    # evaluator
    "E100": "unbound variable",
    "E101": "undefined function",
    "E102": "wrong number of arguments",
    "E103": "wrong type of argument",
    "E104": "error signalled by the program (error, assert, check-type, ecase...)",
    "E105": "malformed special form or macro call",
    "E106": "unknown block or tag for return-from / go, or a throw with no catch",
    "E107": "a constant cannot be assigned or rebound",
    "E108": "division by zero or another arithmetic error",
    "E109": "not available at compile time in SexpGPU (mutable strings, displaced arrays)",
    "E110": "bad lambda list",
    # limits
    "L001": "evaluation step budget exhausted",
    "L002": "evaluation depth limit exceeded",
    "L003": "allocation limit exceeded",
    "L004": "evaluation time limit exceeded",
    # modules
    "M001": "module not found",
    "M002": "require cycle",
    "M003": "require outside the project root",
    "M004": "unknown module prefix or name not exported by the module",
    "M005": "malformed require",
    # tensors and staging
    "T001": "tensor shape or dtype mismatch (both types printed)",
    "T002": "a staged tensor used as a truth value; use (where c a b)",
    "T003": "a tensor operation outside forward, an objective or an update",
    # the run-file contract
    "C001": "a required contract form is missing",
    "C002": "a contract form is out of order",
    "C003": "a contract form that may appear once is repeated",
    "C004": "a knob value does not match its declaration",
    "C005": "optimizer groups: a parameter in no group, or a group with no parameter",
    "C006": "the objective does not return one f32 scalar",
    "C007": "a parameter gets no gradient and is not frozen",
    "C008": "a malformed contract form (missing or bad option)",
    "C009": "the plan needs more memory than the machine has",
    # warnings
    "W001": "warning signalled by the program (warn)",
    "W002": "an optimizer group that gets no parameter (first match wins)",
}


@dataclass(kw_only=True, slots=True)
class Note:
    message: str
    file: Optional[str] = None
    line: Optional[int] = None
    col: Optional[int] = None


@dataclass(kw_only=True, slots=True)
class Diagnostic:
    """One diagnostic, as printed and as given by `--json` (a record: sexpgpu/records.py)."""

    severity: Severity = "error"
    code: str
    message: str
    file: Optional[str] = None
    line: Optional[int] = None
    col: Optional[int] = None
    macro: Optional[str] = None
    notes: list[Note] = field(default_factory=list)

    @classmethod
    def at(cls, code: str, message: str, loc: Optional[Loc], **kw: Any) -> "Diagnostic":
        if loc is None:
            return cls(code=code, message=message, **kw)
        return cls(code=code, message=message, file=loc.file, line=loc.line, col=loc.col, **kw)

    def headline(self) -> str:
        where = f"{self.file}:{self.line}:{self.col}: " if self.file and self.line else ""
        return f"{where}{self.severity}[{self.code}]: {self.message}"


class DiagnosticError(Exception):
    """Raised where compilation cannot continue; carries the diagnostic."""

    def __init__(self, diagnostic: Diagnostic) -> None:
        super().__init__(diagnostic.headline())
        self.diagnostic = diagnostic


class SourceMap:
    """The text of every file read during a compile, for showing source lines."""

    def __init__(self) -> None:
        self._texts: dict[str, list[str]] = {}

    def add(self, file: str, text: str) -> None:
        self._texts[file] = text.split("\n")

    def line(self, file: str, line: int) -> Optional[str]:
        lines = self._texts.get(file)
        if lines is None or not 1 <= line <= len(lines):
            return None
        return lines[line - 1]


def render(diag: Diagnostic, sources: SourceMap) -> str:
    """The human form: headline, the source line, a caret under the column, then notes."""
    out = [diag.headline()]
    if diag.file and diag.line:
        text = sources.line(diag.file, diag.line)
        if text is not None:
            gutter = f"{diag.line:>4} | "
            out.append(gutter + text.replace("\t", " "))
            out.append(" " * (len(gutter) + max((diag.col or 1) - 1, 0)) + "^")
    if diag.macro:
        out.append(f"  note: in code expanded from macro `{diag.macro}`")
    for note in diag.notes:
        where = f"{note.file}:{note.line}:{note.col}: " if note.file and note.line else ""
        out.append(f"  note: {where}{note.message}")
    return "\n".join(out)
