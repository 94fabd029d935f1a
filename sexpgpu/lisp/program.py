"""Loading a file (or text) into a fresh Lisp world, with every failure as a diagnostic.

This is the entry point the CLI, and later the compiler, use: nothing here ever lets a
Python exception escape; a bug in SexpGPU itself becomes an X001 diagnostic.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

from .conditions import LimitExceeded, LispError, lisp_error
from .diagnostics import Diagnostic, DiagnosticError, Note, SourceMap
from .evaluator import Interpreter, Limits, run_with_big_stack
from .image import Leaf, SystemImage, TextKey
from .modules import ModuleLoader, find_project_root
from .printer import PrintTooLarge, prin1_to_string
from .reader import Reader, decode_source
from .types import Loc, MultipleValues, SymbolTable

R = TypeVar("R")


def display_path(path: Path) -> str:
    """A path as diagnostics show it: relative to the working folder when inside it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return rel if not rel.startswith("..") else str(path)


def diagnostic_from(exc: BaseException) -> Diagnostic:
    if isinstance(exc, DiagnosticError):
        return exc.diagnostic
    if isinstance(exc, LispError):
        notes = [Note(message=n) for n in exc.notes]
        return Diagnostic.at(exc.condition.code, exc.condition.message, exc.loc, macro=exc.macro, notes=notes)
    if isinstance(exc, LimitExceeded):
        return Diagnostic.at(exc.code, exc.message, exc.loc, macro=exc.macro)
    if isinstance(exc, RecursionError):
        return Diagnostic(code="L002", message="evaluation depth limit exceeded (the Python stack ran out)")
    if isinstance(exc, MemoryError):
        return Diagnostic(code="L003", message="allocation limit exceeded: the host ran out of memory")
    return Diagnostic(code="X001", message=f"internal error in SexpGPU ({type(exc).__name__}: {exc}); please report it with the file that caused it")


def guarded(thunk: Callable[[], R]) -> tuple[Optional[R], Optional[Diagnostic]]:
    """Run THUNK on the big evaluation stack; any failure comes back as a diagnostic."""
    try:
        return run_with_big_stack(thunk), None
    except BaseException as exc:  # every failure is reported, never raised
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return None, diagnostic_from(exc)


@dataclass
class EvalResult:
    form: str
    values: list[str] = field(default_factory=list)
    error: Optional[Diagnostic] = None
    warnings: list[Diagnostic] = field(default_factory=list)

    @property
    def value(self) -> Optional[str]:
        return self.values[0] if self.values else ("nil" if self.error is None else None)


@dataclass
class Program:
    """A file evaluated in its own world: the interpreter, the file's symbol table, the
    modules it required and every source text read."""

    interp: Interpreter
    table: SymbolTable
    loader: ModuleLoader
    sources: SourceMap
    path: Optional[Path]
    warnings: list[Diagnostic] = field(default_factory=list)

    @property
    def files(self) -> list[Path]:
        """The main file and every file it required, for watch and bundles."""
        return ([self.path] if self.path else []) + list(self.loader.files)

    def eval_text(self, text: str, file: str = "<eval>") -> list[EvalResult]:
        """Evaluate each form of TEXT in the file's environment; an error in one form does
        not stop the rest. A read error ends the text."""
        self.sources.add(file, text)
        reader = Reader(text, file, self.table, features=self.interp.features)
        results: list[EvalResult] = []
        while True:
            read, problem = guarded(reader.read_next)
            if problem is not None:
                results.append(EvalResult(form=text[reader.pos :].strip()[:200], error=problem))
                return results
            if read is None:
                return results
            results.append(self.eval_form(read.form, read.loc, text))

    def eval_form(self, form: Any, loc: Loc, text: str) -> EvalResult:
        interp = self.interp
        interp.reset_budget()
        source = _printed(form, interp)

        def run() -> list[str]:
            previous = interp.table
            interp.table = self.table
            try:
                value = interp.eval_toplevel(form, loc)
                values = list(value) if type(value) is MultipleValues else [value]
                try:
                    return [prin1_to_string(v, interp.print_other) for v in values]
                except PrintTooLarge as exc:  # a circular list, say: as print would say it
                    error = lisp_error("L003", f"the value cannot be printed: {exc}", "STORAGE-CONDITION")
                    error.loc = loc
                    raise error from None
            finally:
                interp.table = previous

        seen = len(interp.warnings)
        printed, problem = guarded(run)
        warnings = [warning_diagnostic(message, where) for message, where in interp.warnings[seen:]]
        if problem is not None:
            return EvalResult(form=source, error=problem, warnings=warnings)
        return EvalResult(form=source, values=printed or [], warnings=warnings)


def _printed(form: Any, interp: Interpreter) -> str:
    try:
        return prin1_to_string(form, interp.print_other)
    except PrintTooLarge:
        return "#<form too large to print>"


Output = Callable[[str], Any]


def new_program(path: Optional[Path], limits: Optional[Limits] = None, stdlib: Any = None, output: Optional[Output] = None,
                image: Optional[SystemImage] = None, recording: Optional[dict[TextKey, tuple[Leaf, ...]]] = None) -> Program:
    """A fresh world. OUTPUT receives what print, princ, format t ... write (by default it
    is kept in interp.output). IMAGE: the system texts read once for many worlds; RECORDING:
    where the world records the leaves of the system texts it loads (lisp/image.py)."""
    interp = Interpreter(limits, image, recording)
    if output is not None:
        interp.write = output
    sources = SourceMap()
    root = find_project_root(path) if path is not None else Path.cwd()
    loader = ModuleLoader(interp, root, sources, stdlib)
    if path is not None:
        loader.current_file.append(path.resolve())
    table = SymbolTable("", interp.base)
    return Program(interp, table, loader, sources, path)


def load_file(path: Path, limits: Optional[Limits] = None, stdlib: Any = None, output: Optional[Output] = None) -> tuple[Optional[Program], list[Diagnostic]]:
    """Read and evaluate PATH in a fresh world (see evaluate_file)."""
    program, problem = guarded(lambda: new_program(path, limits, stdlib, output))
    if program is None:
        return None, [problem] if problem else []
    return evaluate_file(program)


def evaluate_file(program: Program) -> tuple[Optional[Program], list[Diagnostic]]:
    """Read PROGRAM's file and evaluate it in PROGRAM's world (a fresh one, or one the
    compiler has installed its builtins in). Returns the program (None when the file could
    not be read) and every diagnostic, warnings included."""
    path = program.path
    if path is None:
        raise ValueError("evaluate_file needs a program made for a file")
    name = display_path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        return None, [Diagnostic(code="M001", message=f"cannot read {name}: {exc.strerror}")]
    text, problem = guarded(lambda: decode_source(data, name))
    if text is None:
        return None, [problem] if problem else []
    program.sources.add(name, text)

    def run() -> None:
        program.interp.load_text(text, name, program.table)

    _, problem = guarded(run)
    diagnostics = [warning_diagnostic(message, loc) for message, loc in program.interp.warnings]
    program.warnings = diagnostics
    if problem is not None:
        diagnostics.append(problem)
    return program, diagnostics


def warning_diagnostic(message: str, loc: Optional[Loc]) -> Diagnostic:
    return Diagnostic.at("W001", message, loc, severity="warning")


def has_errors(diagnostics: list[Diagnostic]) -> bool:
    return any(d.severity == "error" for d in diagnostics)
