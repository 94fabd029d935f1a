"""`sexpgpu VERB ...`: parse the command line and dispatch to the verb's module."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

from . import bundles, check, docs, doctor, inspect, lisp_tools, observe, run, sweeps
from .common import Exit, UsageError


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors exit 2 through our own path (same message format)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message}\n{self.format_usage().strip()}")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="sexpgpu", description="One Lisp file states an ML experiment; sexpgpu checks, explains and trains it.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=Parser)
    check.register(sub)
    lisp_tools.register(sub)
    run.register(sub)
    inspect.register(sub)
    sweeps.register(sub)
    doctor.register(sub)
    bundles.register(sub)
    bundles.register_submit(sub)
    observe.register(sub)
    docs.register(sub)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
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
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return Exit.OK
    except Exception as exc:  # a bug in sexpgpu: say so plainly, without a traceback
        if os.environ.get("SEXPGPU_LOG", "").lower() == "debug":
            raise
        print(f"sexpgpu: internal error ({type(exc).__name__}: {exc}); please report it (SEXPGPU_LOG=debug shows the traceback)", file=sys.stderr)
        return Exit.RUN_FAILED


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
