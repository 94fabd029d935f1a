"""`docs [PAGE]`: print a documentation page, the same markdown as docs/."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path
from typing import Optional

from ..exits import Exit
from .common import fail_usage


def docs_folder() -> Optional[Path]:
    """docs/ of a source checkout (editable install), else the copy installed with the
    package under share/sexpgpu/docs."""
    candidates = [Path(__file__).resolve().parents[2] / "docs", Path(sys.prefix) / "share" / "sexpgpu" / "docs"]
    for folder in candidates:
        if (folder / "llms.txt").is_file():
            return folder
    return None


def slugify(name: str) -> str:
    name = name.strip().lower().removesuffix(".md")
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    d = sub.add_parser("docs")
    d.add_argument("page", nargs="?", help="a page name such as 'quickstart' or 'It is Common Lisp'")
    d.add_argument("--json", action="store_true", help='{"page", "markdown"} or the list of pages')
    d.set_defaults(run=run_docs)


def run_docs(args: argparse.Namespace) -> int:
    folder = docs_folder()
    if folder is None:
        print("the documentation is not installed with this copy of sexpgpu", file=sys.stderr)
        return Exit.CANNOT_START
    pages = sorted(p.stem for p in folder.glob("*.md"))
    if args.page is None:
        if args.json:
            import json

            print(json.dumps({"pages": pages}, indent=2))
        else:
            sys.stdout.write((folder / "llms.txt").read_text(encoding="utf-8"))
        return Exit.OK
    slug = slugify(args.page)
    if slug not in pages:
        close = difflib.get_close_matches(slug, pages, n=3, cutoff=0.5)
        hint = f"; did you mean: {', '.join(close)}?" if close else "; `sexpgpu docs` lists every page"
        fail_usage(f"no documentation page `{args.page}`{hint}")
    text = (folder / f"{slug}.md").read_text(encoding="utf-8")
    if args.json:
        import json

        print(json.dumps({"page": slug, "markdown": text}, ensure_ascii=False))
    else:
        sys.stdout.write(text)
    return Exit.OK
