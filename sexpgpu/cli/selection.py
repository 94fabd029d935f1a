"""The selection flags every compiling verb shares: --variant, --set KNOB=VALUE, --sweep/--point."""

from __future__ import annotations

import argparse

from ..ir.experiment import Selection
from .common import fail_usage


def add_selection_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variant", metavar="V", help="a variant declared with defvariant")
    parser.add_argument("--set", dest="set_values", action="append", default=[], metavar="KNOB=VALUE", help="override a knob (repeatable)")
    parser.add_argument("--sweep", metavar="S", help="a sweep declared with defsweep (with --point)")
    parser.add_argument("--point", type=int, metavar="N", help="the point of the sweep, from 0")


def selection_from(args: argparse.Namespace) -> Selection:
    values: dict[str, str] = {}
    for item in args.set_values:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            fail_usage(f"--set {item}: write --set KNOB=VALUE")
        values[name.strip().lower()] = value
    if (args.sweep is None) != (args.point is None):
        fail_usage("--sweep and --point go together: --sweep S --point N")
    return Selection(variant=args.variant, set=values, sweep=args.sweep, point=args.point)
