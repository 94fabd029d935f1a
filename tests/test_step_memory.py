"""Step events report the process's peak memory, as cli.md's event list says."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import REPO
from sexpgpu.compile.pipeline import compile_file
from sexpgpu.runtime.attempt import RunOptions, train


def test_step_events_carry_the_peak_memory(tmp_path: Path) -> None:
    experiment = compile_file(REPO / "examples" / "quickstart.lisp").experiment
    assert experiment is not None
    result = train(experiment, RunOptions(store=str(tmp_path), max_steps=20, signals=False), say=lambda _: None)
    steps = [json.loads(line) for line in (tmp_path / result.slug / "events.jsonl").read_text().splitlines() if '"kind":"step"' in line]
    assert steps and all(isinstance(e["memory"], int) and e["memory"] > 10 * 2**20 for e in steps)
