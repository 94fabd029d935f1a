"""What every verb shares: exit codes, printing diagnostics, JSON output."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, NoReturn

from ..exits import Exit

if TYPE_CHECKING:  # `--version`, `--help` and `docs` load this module, and no pydantic
    from ..lisp.diagnostics import Diagnostic, SourceMap


class UsageError(Exception):
    """A bad flag, a missing file: exit 2 with a message on stderr."""


def fail_usage(message: str) -> NoReturn:
    raise UsageError(message)


def existing_file(name: str) -> Path:
    path = Path(name)
    if not path.exists():
        fail_usage(f"file not found: {name}")
    if path.is_dir():
        fail_usage(f"{name} is a folder, not a file")
    return path


def color_enabled(stream: Any) -> bool:
    return "NO_COLOR" not in os.environ and hasattr(stream, "isatty") and stream.isatty()


def print_diagnostics(diagnostics: Iterable[Diagnostic], sources: SourceMap) -> None:
    from ..lisp.diagnostics import render

    for diag in diagnostics:
        text = render(diag, sources)
        if color_enabled(sys.stderr):
            color = "\x1b[31m" if diag.severity == "error" else "\x1b[33m"
            first, _, rest = text.partition("\n")
            text = color + first + "\x1b[0m" + ("\n" + rest if rest else "")
        print(text, file=sys.stderr)


def print_json(document: Any) -> None:
    json.dump(document, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")


def diagnostics_json(diagnostics: Iterable[Diagnostic]) -> list[dict[str, Any]]:
    from ..records import plain

    return [plain(d, exclude_none=True) for d in diagnostics]


def exit_for(diagnostics: Iterable[Diagnostic]) -> int:
    """2 when the selection itself is wrong (unknown knob, variant, sweep or point: no
    position in the file), 3 when the file does not check, 0 otherwise."""
    errors = [d for d in diagnostics if d.severity == "error"]
    if not errors:
        return Exit.OK
    if all(d.code == "C004" and d.file is None for d in errors):
        return Exit.USAGE
    return Exit.CHECK_FAILED


class Console:
    """The session's Reporter on a terminal: progress on stdout (stderr under --json, whose
    stdout is the document), the file's own output, the device's notices and every
    diagnostic and refusal on stderr."""

    def __init__(self, progress_to_stderr: bool = False) -> None:
        self.stream = sys.stderr if progress_to_stderr else sys.stdout

    def say(self, text: str) -> None:
        print(text, file=self.stream)

    def notice(self, text: str) -> None:
        print(text, file=sys.stderr)

    def output(self, text: str) -> None:
        sys.stderr.write(text)

    def diagnostics(self, diagnostics: list[Diagnostic], sources: SourceMap) -> None:
        print_diagnostics(diagnostics, sources)

    def refusal(self, reason: str) -> None:
        print(f"sexpgpu: {reason}", file=sys.stderr)
