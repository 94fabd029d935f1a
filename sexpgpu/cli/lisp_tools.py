"""`eval [FILE] EXPR...` (and the REPL) and `fmt FILE... [--check]`."""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Any, Optional

from ..lisp.diagnostics import Diagnostic, DiagnosticError, SourceMap, render
from ..lisp.layout import format_source
from ..compile.pipeline import compile_file, new_world
from ..lisp.program import EvalResult, Program, display_path, guarded, has_errors
from ..lisp.reader import decode_source
from ..outcome import Exit
from ..records import dump
from .common import existing_file, exit_for, print_diagnostics, print_json
from .flags import add_limit_flags, add_selection_flags, limits_from, selection_from


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    e = sub.add_parser("eval")
    e.add_argument("args", nargs="*", metavar="[FILE] EXPR", help="an optional .lisp file, then expressions; '-' reads forms from stdin")
    e.add_argument("--json", action="store_true", help='a JSON list of {"form", "value", "values", "error"}')
    add_selection_flags(e)
    add_limit_flags(e)
    e.set_defaults(run=run_eval)

    f = sub.add_parser("fmt")
    f.add_argument("files", nargs="+")
    f.add_argument("--check", action="store_true", help="change nothing; exit 3 if a file would change")
    f.add_argument("--json", action="store_true", help='{"files": [{"file", "changed"}], "diagnostics": [...]}')
    f.set_defaults(run=run_fmt)


# -- eval ---------------------------------------------------------------------------------------
def write_lisp_output(text: str) -> None:
    """What the Lisp prints (print, format t ...) goes to stdout, before the results..."""
    sys.stdout.write(text)
    sys.stdout.flush()


def write_stderr(text: str) -> None:
    """... or to stderr under --json, so stdout stays one JSON document."""
    sys.stderr.write(text)
    sys.stderr.flush()


def split_eval_args(args: list[str]) -> tuple[Optional[Path], list[str]]:
    if args and args[0].endswith(".lisp") and not args[0].lstrip().startswith("("):
        return existing_file(args[0]), args[1:]
    return None, args


def run_eval(args: argparse.Namespace) -> int:
    path, exprs = split_eval_args(args.args)
    limits = limits_from(args)
    write_stdout = write_stderr if args.json else write_lisp_output
    if path is not None:
        compiled = compile_file(path, selection_from(args), limits, output=write_stdout)
        program, diagnostics = compiled.program, compiled.diagnostics
        if program is None or has_errors(diagnostics):
            print_diagnostics(diagnostics, program.sources if program else SourceMap())
            return exit_for(diagnostics)
    else:
        program = new_world(limits, output=write_stdout)
    if not exprs:
        return repl(program)
    if exprs == ["-"]:
        results = program.eval_text(sys.stdin.read(), "<stdin>")
        return report(results, program, args.json, stdin_mode=True)
    results = []
    for i, expr in enumerate(exprs):
        results.extend(program.eval_text(expr, f"<expr{i + 1}>" if len(exprs) > 1 else "<expr>"))
    return report(results, program, args.json, stdin_mode=False)


def result_json(r: EvalResult) -> dict[str, Any]:
    return {
        "form": r.form,
        "value": r.value,
        "values": r.values if r.error is None else [],
        "error": None if r.error is None else dump(r.error, mode="python", exclude_none=True),
        "warnings": [dump(w, mode="python", exclude_none=True) for w in r.warnings],
    }


def report(results: list[EvalResult], program: Program, as_json: bool, stdin_mode: bool) -> int:
    failed = any(r.error is not None for r in results)
    if as_json:
        print_json([result_json(r) for r in results])
    else:
        for r in results:
            print_diagnostics(r.warnings, program.sources)
            if r.error is None:
                print(r.value)
            elif stdin_mode:
                print(f"error: {r.error.message}")
            else:
                print_diagnostics([r.error], program.sources)
    sys.stdout.flush()
    return Exit.CHECK_FAILED if failed else Exit.OK


def repl(program: Program) -> int:
    interactive = sys.stdin.isatty()
    buffer = ""
    count = 0
    while True:
        try:
            line = input("sexpgpu> " if interactive and not buffer else ("....... " if interactive else ""))
        except EOFError:
            if buffer.strip():
                show_repl_results(program.eval_text(buffer, f"<repl{count}>"), program)
            return Exit.OK
        except KeyboardInterrupt:
            print()
            buffer = ""
            continue
        buffer += line + "\n"
        if not is_complete(buffer):
            continue
        count += 1
        show_repl_results(program.eval_text(buffer, f"<repl{count}>"), program)
        buffer = ""


def is_complete(text: str) -> bool:
    """Whether TEXT reads without running out of input (so the REPL can evaluate it)."""
    from ..lisp.reader import Reader
    from ..lisp.types import SymbolTable

    reader = Reader(text, "<repl>", SymbolTable())
    try:
        while reader.read_next() is not None:
            pass
    except DiagnosticError as exc:
        return exc.diagnostic.code != "R001"
    return True


def show_repl_results(results: list[EvalResult], program: Program) -> None:
    for r in results:
        print_diagnostics(r.warnings, program.sources)
        if r.error is None:
            print(" ; ".join(r.values) if r.values else "; no values")
        else:
            print(render(r.error, program.sources), file=sys.stderr)


# -- fmt ----------------------------------------------------------------------------------------------
def run_fmt(args: argparse.Namespace) -> int:
    paths = [existing_file(f) for f in args.files]
    changed: list[Path] = []
    problems: list[Diagnostic] = []
    sources = SourceMap()
    for path in paths:
        name = display_path(path)
        try:
            text = decode_source(path.read_bytes(), name)
            sources.add(name, text)
        except DiagnosticError as exc:
            problems.append(exc.diagnostic)
            continue
        formatted, problem = guarded(functools.partial(format_source, text, name))
        if formatted is None:
            problems.append(problem or Diagnostic(code="X001", message=f"internal error formatting {name}"))
            continue
        if formatted != text:
            changed.append(path)
            if not args.check:
                path.write_text(formatted, encoding="utf-8")
    if args.json:
        print_json(
            {
                "files": [{"file": display_path(p), "changed": p in changed} for p in paths],
                "diagnostics": [dump(d, mode="python", exclude_none=True) for d in problems],
            }
        )
    else:
        print_diagnostics(problems, sources)
        for path in changed:
            print(f"{'would reformat' if args.check else 'reformatted'} {display_path(path)}")
    if problems:
        return Exit.CHECK_FAILED
    if args.check and changed:
        return Exit.CHECK_FAILED
    if not changed and not args.check and not args.json:
        print(f"{len(paths)} file(s) already formatted", file=sys.stderr)
    return Exit.OK
