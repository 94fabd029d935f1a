"""Shared test setup: one BLAS thread for what the tests train in their own process, and
helpers for evaluating Lisp text.

A run started through `sexpgpu run` (or the session) chooses its threads itself; a test that
builds a Trainer directly is not a run, and on a 2-core machine shared with a second test
process one BLAS thread is the fast setting (runtime/threads.py says why)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from threadpoolctl import threadpool_limits

from sexpgpu.lisp.program import EvalResult, Program, new_program

threadpool_limits(limits=1, user_api="blas")

REPO = Path(__file__).resolve().parents[1]


def environment(**changes: Optional[str]) -> dict[str, str]:
    """This process's environment for a child that runs this checkout, with CHANGES (None
    removes a variable)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


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


def wait_for(test: Callable[[], bool], what: str, within_s: float = 300.0) -> None:
    """Until TEST holds (the event waited for: a file written, a step logged), polling;
    fails after WITHIN_S. The poll interval is not a delay anything depends on."""
    deadline = time.monotonic() + within_s
    while not test():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.02)


def recorded_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths Store.read_bytes reads from now on, in order (the real read happens too)."""
    from sexpgpu.runtime.store import Store

    reads: list[str] = []
    original = Store.read_bytes

    def recording(self: Store, path: str, *args: Any, **kwargs: Any) -> bytes:
        reads.append(path)
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(Store, "read_bytes", recording)
    return reads
