"""`bundle FILE -o DIR|URL`: one self-contained directory that runs anywhere."""

from __future__ import annotations

import argparse
import sys

from ..bundle import BundleError, make_bundle
from .common import Exit, existing_file, print_json
from .selection import add_selection_flags, selection_from


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    b = sub.add_parser("bundle", help="write one self-contained directory (source, IR, data manifest) that `run` accepts")
    b.add_argument("file")
    b.add_argument("-o", "--out", required=True, metavar="DIR|URL")
    b.add_argument("--device", action="append", dest="devices", default=None, help="devices the run asks for (default cpu)")
    b.add_argument("--json", action="store_true")
    add_selection_flags(b)
    b.set_defaults(run=run_bundle)


def run_bundle(args: argparse.Namespace) -> int:
    path = existing_file(args.file)
    try:
        manifest, _ = make_bundle(path, selection_from(args), args.out, args.devices)
    except BundleError as exc:
        print(f"sexpgpu: bundle: {exc}", file=sys.stderr)
        return Exit.CHECK_FAILED if "does not check" in str(exc) else Exit.DATA
    if args.json:
        print_json(manifest.model_dump(mode="json"))
    else:
        copied = sum(d.bytes for d in manifest.data if d.copied)
        print(f"{manifest.slug}  {args.out}")
        print(f"source: {manifest.main}; data: {len(manifest.data)} source(s), {copied:,} bytes copied; IR {manifest.ir_hash[:12]}")
    return Exit.OK
