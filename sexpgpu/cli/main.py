"""`sexpgpu VERB ...`: parse the command line and dispatch to the verb's module."""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from typing import Optional, Sequence

from ..outcome import Exit
from .common import UsageError

# the module that defines each verb and its registering function, in `sexpgpu --help` order.
# A command imports only its own verb's module: `sexpgpu check` does not load the runtime,
# the store or the cluster code (a third of its start-up time before).
REGISTRARS: list[tuple[str, str, tuple[str, ...]]] = [
    ("check", "register", ("check", "watch")),
    ("lisp_tools", "register", ("eval", "fmt")),
    ("run", "register", ("run",)),
    ("inspect", "register", ("ir", "explain", "diff")),
    ("sweeps", "register", ("variants", "sweep", "new")),
    ("doctor", "register", ("doctor",)),
    ("bundles", "register", ("bundle",)),
    ("bundles", "register_submit", ("submit",)),
    ("observe", "register", ("status", "logs", "checkpoint", "annotate")),
    ("runs", "register", ("runs",)),
    ("ui", "register", ("ui",)),
    ("plot", "register", ("plot",)),
    ("docs", "register", ("docs",)),
]


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors exit 2 through our own path (same message format)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message}\n{self.format_usage().strip()}")


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The command line's parser: with every verb, or only ARGV's verb when it names one."""
    parser = Parser(prog="sexpgpu", description="One Lisp file states an ML experiment; sexpgpu checks, explains and trains it.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=Parser)
    verb = argv[0] if argv else None
    wanted = [r for r in REGISTRARS if verb in r[2]] or REGISTRARS
    for module, function, _ in wanted:
        getattr(importlib.import_module(f"{__package__}.{module}"), function)(sub)
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
