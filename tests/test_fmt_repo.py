"""fmt round-trips every Lisp file in the repository: idempotent and form-preserving."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO
from sexpgpu.lisp.evaluator import run_with_big_stack
from sexpgpu.lisp.layout import SyntaxSymbolTable, format_source
from sexpgpu.lisp.printer import prin1_to_string
from sexpgpu.lisp.reader import read_all

LISP_FILES = sorted(p for p in REPO.rglob("*.lisp") if ".git" not in p.parts and "build" not in p.parts)


def printed_forms(text: str) -> list[str]:
    return [prin1_to_string(f.form) for f in read_all(text, "x.lisp", SyntaxSymbolTable())]


def test_there_are_lisp_files() -> None:
    assert any(p.name == "prelude.lisp" for p in LISP_FILES)
    assert any(p.parent.name == "examples" for p in LISP_FILES)


@pytest.mark.parametrize("path", LISP_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_fmt_round_trip(path: Path) -> None:
    text = path.read_text(encoding="utf-8")

    def check() -> None:
        once = format_source(text, path.name)
        assert format_source(once, path.name) == once
        assert printed_forms(once) == printed_forms(text)
        comments = [line.split(";", 1)[1].strip() for line in text.splitlines() if line.lstrip().startswith(";")]
        for comment in comments:
            assert comment in once

    run_with_big_stack(check)


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*.lisp")), ids=lambda p: p.name)
def test_examples_are_formatted(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert format_source(text, path.name) == text, f"run: sexpgpu fmt {path.relative_to(REPO)}"
