"""The docs cannot rot: llms.txt lists every page, and every ```lisp block evaluates cleanly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REPO
from sexpgpu.compile.pipeline import compile_file

DOCS = REPO / "docs"
PAGES = sorted(DOCS.glob("*.md"))
LISP_BLOCK = re.compile(r"```lisp\n(.*?)```", re.S)


def lisp_blocks() -> list[tuple[str, int, str]]:
    out = []
    for page in PAGES:
        for i, match in enumerate(LISP_BLOCK.finditer(page.read_text(encoding="utf-8"))):
            out.append((page.name, i, match.group(1)))
    return out


def test_llms_txt_lists_every_page() -> None:
    index = (DOCS / "llms.txt").read_text(encoding="utf-8")
    listed = set(re.findall(r"\(([a-z0-9-]+\.md)\)", index))
    assert listed == {p.name for p in PAGES}


REQUIRED_NOW = [
    "it-is-common-lisp", "special-forms", "functions-and-bindings", "truth-iteration-and-values",
    "macros-and-symbols", "builtins", "the-prelude", "modules-and-require", "check-and-watch",
    "install", "why-sexpgpu", "command-line",
]


@pytest.mark.parametrize("page", REQUIRED_NOW)
def test_page_exists(page: str) -> None:
    assert (DOCS / f"{page}.md").is_file()


@pytest.mark.parametrize("page,index,code", lisp_blocks(), ids=lambda x: str(x)[:40] if isinstance(x, str) else str(x))
def test_lisp_block_checks(page: str, index: int, code: str, tmp_path: Path) -> None:
    """Each block on its own, as `sexpgpu check` sees a file: run files compile to IR."""
    path = tmp_path / f"{page[:-3]}-{index}.lisp"
    path.write_text(code, encoding="utf-8")
    errors = [d.headline() for d in compile_file(path).diagnostics if d.severity == "error"]
    assert not errors, f"{page} block {index}: {errors[0]}"
