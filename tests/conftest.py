"""Shared test setup: one BLAS thread for what the tests train in their own process, and
helpers for evaluating Lisp text.

A run started through `sexpgpu run` (or the session) chooses its threads itself; a test that
builds a Trainer directly is not a run, and on a 2-core machine shared with a second test
process one BLAS thread is the fast setting (runtime/threads.py says why)."""

from __future__ import annotations

from pathlib import Path

import pytest
from threadpoolctl import threadpool_limits

from sexpgpu.lisp.program import EvalResult, Program, new_program

threadpool_limits(limits=1, user_api="blas")

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
