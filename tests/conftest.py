"""Shared test setup: single-threaded BLAS, and helpers for evaluating Lisp text."""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from sexpgpu.lisp.program import EvalResult, Program, new_program  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def lisp() -> Program:
    """A fresh Lisp world with no file."""
    return new_program(None)


def evaluate(program: Program, text: str) -> EvalResult:
    """The result of the last form of TEXT."""
    results = program.eval_text(text)
    assert results, "no form in text"
    return results[-1]


def value_of(program: Program, text: str) -> str:
    result = evaluate(program, text)
    assert result.error is None, result.error.headline()
    return result.values[0] if result.values else ""
