"""`check FILE` and `watch FILE`."""

from __future__ import annotations

import argparse
import gc
import hashlib
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Optional

from ..lisp.diagnostics import Diagnostic, SourceMap
from ..lisp.evaluator import Limits
from ..ir.experiment import Selection
from ..compile.pipeline import check_every_selection, compile_file, system_image
from ..lisp.image import Leaf, SystemImage, TextKey
from ..lisp.program import has_errors
from ..exits import Exit
from .common import diagnostics_json, existing_file, exit_for, print_diagnostics, print_json
from .flags import add_limit_flags, add_selection_flags, limits_from, selection_from


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("check")
    p.add_argument("file")
    p.add_argument("--json", action="store_true", help="print the diagnostics as a JSON list")
    add_selection_flags(p)
    add_limit_flags(p)
    p.set_defaults(run=run_check)

    w = sub.add_parser("watch")
    w.add_argument("file")
    w.add_argument("--json", action="store_true", help="one JSON document per check, one per line")
    w.add_argument("--interval", type=float, default=0.25, help="seconds between looks at the files (default 0.25)")
    w.add_argument("--max-checks", type=int, default=0, metavar="N", help="stop after N checks (0: run until interrupted)")
    add_limit_flags(w)
    w.set_defaults(run=run_watch)


def check_once(path: Path, limits: Limits, selection: Optional[Selection] = None, image: Optional[SystemImage] = None,
               recording: Optional[dict[TextKey, tuple[Leaf, ...]]] = None) -> tuple[list[Diagnostic], SourceMap, list[Path]]:
    """Compile PATH (read, evaluate, contract, staging, IR check) with SELECTION, or, with
    none chosen, as it is and with every variant and sweep point it declares; what the file
    prints goes to stderr (stdout carries the result). IMAGE: the system texts, read once;
    RECORDING: where the modules the file requires first are recorded (watch's next check
    replays those that did not change)."""
    if selection is None or selection == Selection():
        checked = check_every_selection(path, limits, output=sys.stderr.write, image=image, recording=recording)
        return checked.diagnostics, checked.sources, checked.files
    result = compile_file(path, selection, limits, output=sys.stderr.write, image=image)
    program = result.program
    if program is None:
        return result.diagnostics, SourceMap(), [path]
    return result.diagnostics, program.sources, program.files


def run_check(args: argparse.Namespace) -> int:
    path = existing_file(args.file)
    diagnostics, sources, _ = check_once(path, limits_from(args), selection_from(args))
    if args.json:
        print_json(diagnostics_json(diagnostics))
    else:
        print_diagnostics(diagnostics, sources)
        if not has_errors(diagnostics):
            print(f"{args.file}: ok")
    return exit_for(diagnostics)


def snapshot(files: list[Path]) -> dict[Path, float]:
    out: dict[Path, float] = {}
    for f in files:
        try:
            out[f] = f.stat().st_mtime_ns
        except OSError:
            out[f] = -1
    return out


def contents(files: list[Path]) -> dict[Path, Optional[str]]:
    """Each file's SHA-256 (None when it cannot be read)."""
    out: dict[Path, Optional[str]] = {}
    for f in files:
        try:
            out[f] = hashlib.sha256(f.read_bytes()).hexdigest()
        except OSError:
            out[f] = None
    return out


def wait_for_a_change(args: argparse.Namespace, files: list[Path], before: dict[Path, float], read: dict[Path, Optional[str]]) -> None:
    """Until a save changes what one of FILES holds: a save that writes the same bytes (an
    editor's save of an unchanged buffer, a touch) leaves the last check standing."""
    while True:
        while snapshot(files) == before:
            time.sleep(args.interval)
        before = snapshot(files)
        if contents(files) != read:
            return
        print(f"{args.file}: saved unchanged; the last check stands", file=sys.stderr, flush=True)


def run_watch(args: argparse.Namespace) -> int:
    path = existing_file(args.file)
    limits = limits_from(args)
    image = system_image()  # every check's world takes the prelude's forms from it
    checks = 0
    try:
        while True:
            started = time.time_ns()
            recorded: dict[TextKey, tuple[Leaf, ...]] = {}
            diagnostics, sources, files = check_once(path, limits, image=image, recording=recorded)
            if recorded:  # the modules this check expanded: the next replays those a save leaves as they are
                image = image.with_expansions(recorded, superseding=True)
            # the files' state is taken before the report, so that a save made as soon as
            # the result shows is a change; a save made during the check (or while their
            # contents are read, before their times) checks again at once
            read = contents(files)
            before = snapshot(files)
            checks += 1
            report_watch(args, diagnostics, sources)
            if args.max_checks and checks >= args.max_checks:
                return Exit.OK
            if any(stamp >= started for stamp in before.values()):
                continue
            settle_memory()
            wait_for_a_change(args, files, before, read)
    except KeyboardInterrupt:
        return Exit.OK


def settle_memory() -> None:
    """While watch waits for a save: free the last check's world now (it is cyclic garbage; a
    full collection walking it would otherwise fall inside the next check and make it about
    twice as slow), and freeze what survives, so no later collection walks it again."""
    gc.collect()
    gc.freeze()


def report_watch(args: argparse.Namespace, diagnostics: list[Diagnostic], sources: SourceMap) -> None:
    stamp = datetime.now().strftime("%H:%M:%S")
    if args.json:
        import json

        print(json.dumps({"time": stamp, "ok": not has_errors(diagnostics), "diagnostics": diagnostics_json(diagnostics)}), flush=True)
        return
    print_diagnostics(diagnostics, sources)
    status = "ok" if not has_errors(diagnostics) else f"{sum(d.severity == 'error' for d in diagnostics)} error(s)"
    print(f"[{stamp}] {args.file}: {status}", flush=True)
    sys.stderr.flush()
