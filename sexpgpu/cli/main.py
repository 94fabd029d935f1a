"""`sexpgpu VERB ...`: parse the command line and dispatch to the verb's module."""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Sequence

from ..exits import Exit
from .common import UsageError


class Verb(NamedTuple):
    """A verb: the module under cli/ that defines it, the function there that registers its
    flags, and its line in `sexpgpu --help`."""

    module: str
    registrar: str
    summary: str


# Every verb by name, in `sexpgpu --help` order. A command imports only its own verb's module
# (on first use): `--version`, `--help` and `docs` load no compiler, runtime or pydantic, and
# `check` no runtime, store or cluster code.
VERBS: dict[str, Verb] = {
    "check": Verb("check", "register", "read, evaluate and check a file; print diagnostics"),
    "watch": Verb("check", "register", "check again on every save of the file or anything it requires"),
    "eval": Verb("lisp_tools", "register", "evaluate expressions in a file's environment (or a fresh one); no EXPR: a REPL"),
    "fmt": Verb("lisp_tools", "register", "rewrite files in the one canonical layout"),
    "run": Verb("run", "register", "train a run file"),
    "ir": Verb("inspect", "register", "print the IR (one SSA line per node)"),
    "explain": Verb("inspect", "register", "knobs, parameter tree, groups, FLOPs and the memory plan"),
    "diff": Verb("inspect", "register", "what changed between two files or two selections of one"),
    "variants": Verb("sweeps", "register", "the declared selection: knobs, variants, sweeps and every point with its slug"),
    "sweep": Verb("sweeps", "register", "run every point of a sweep: in order on this machine, or over a Ray cluster with --ray"),
    "new": Verb("sweeps", "register", "start a run file from a template or another file, knob defaults changed"),
    "doctor": Verb("doctor", "register", "whether a run can start here: packages, devices, memory, the store, Ray"),
    "bundle": Verb("bundles", "register", "write one self-contained directory (source, IR, data manifest) that `run` accepts"),
    "submit": Verb("bundles", "register_submit", "run a bundle as a detached, preemptible job on a Ray cluster"),
    "status": Verb("observe", "register", "a run's status file: state, step, metrics, ETA, heartbeat, summary"),
    "logs": Verb("observe", "register", "a run's events, one per line (--follow to keep reading)"),
    "checkpoint": Verb("observe", "register", "list, show, verify or export a run's checkpoints"),
    "annotate": Verb("observe", "register", "append an annotation event to a run's log"),
    "runs": Verb("runs", "register", "the runs of a store as a table: state, steps, latest train and eval metrics, start, duration, device"),
    "ui": Verb("ui", "register", "a read-only web dashboard of a store on 127.0.0.1: runs, live curves, sweeps, events"),
    "plot": Verb("plot", "register", "curves of runs or of a sweep's points, overlaid: a PNG or SVG file, or --terminal"),
    "docs": Verb("docs", "register", "print a documentation page (no PAGE: the index)"),
}


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors exit 2 through our own path (same message format)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message}\n{self.format_usage().strip()}")


if TYPE_CHECKING:
    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    SubParsers = argparse._SubParsersAction


class VerbParsers(SubParsers):
    """The VERB argument. A registrar's add_parser takes the verb's summary from VERBS, the one
    place it is written, so the full help can be printed without importing any verb."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.setdefault("help", VERBS[name].summary)
        return super().add_parser(name, **kwargs)


def named_verb(argv: Sequence[str]) -> Optional[str]:
    """The verb ARGV names: its first word that is not a flag (sexpgpu's own flags take no
    value), when that word is a verb."""
    first = next((word for word in argv if not word.startswith("-")), None)
    return first if first in VERBS else None


def build_parser(argv: Sequence[str] = (), every_verb: bool = False) -> argparse.ArgumentParser:
    """The command line's parser. ARGV's verb gets its module's parser; every other verb is
    only its name and summary (enough for `--help` and a usage error), unless EVERY_VERB
    imports them all."""
    parser = Parser(prog="sexpgpu", description="One Lisp file states an ML experiment; sexpgpu checks, explains and trains it.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=Parser, action=VerbParsers)
    verb = named_verb(argv)
    registered: set[str] = set()
    for name, entry in VERBS.items():
        if name in registered:
            continue
        if every_verb or (verb is not None and entry[:2] == VERBS[verb][:2]):
            registrar = getattr(importlib.import_module(f"{__package__}.{entry.module}"), entry.registrar)
            before = set(sub.choices)
            registrar(sub)
            registered |= set(sub.choices) - before
        else:
            sub.add_parser(name)
            registered.add(name)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
        if args.version:
            from .. import __version__

            print(f"sexpgpu {__version__}")
            return Exit.OK
        if args.verb is None:
            parser.print_help(sys.stderr)
            return Exit.USAGE
        # what the verb imported lives to the end: frozen, the collections of its work do not
        # walk it (a tenth of a second of an example's check)
        gc.freeze()
        return int(args.run(args))
    except UsageError as exc:
        print(f"sexpgpu: error: {exc}", file=sys.stderr)
        return Exit.USAGE
    except BrokenPipeError:
        raise  # a closed stdout is not a bug: entry() ends quietly
    except Exception as exc:  # a bug in sexpgpu: say so plainly, without a traceback
        if os.environ.get("SEXPGPU_LOG", "").lower() == "debug":
            raise
        print(f"sexpgpu: internal error ({type(exc).__name__}: {exc}); please report it (SEXPGPU_LOG=debug shows the traceback)", file=sys.stderr)
        return Exit.RUN_FAILED


def entry() -> None:
    """The `sexpgpu` command. Ctrl-C (during start-up too, while the verb's modules load) is
    exit 130 with one line; a closed stdout (`sexpgpu logs RUN | head -2`) is a quiet exit."""
    try:
        code = main()
        sys.stdout.flush()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = Exit.INTERRUPTED
    except BrokenPipeError:
        # nothing more reaches the reader; point stdout at nothing so that the interpreter's
        # own flush at exit does not complain about the same pipe
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = Exit.OK
    # The process ends here. Its last full garbage collection would walk every object the
    # compile made (0.6 s of a 2 s check of a 5,000-line file); frozen, they are left to the
    # end of the process. atexit handlers and module teardown still run.
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
