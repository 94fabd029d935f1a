"""The records' identities do not move: every example's IR hash, the numbers' hash, the
experiment's identity (the slug's part that is not the knob values) and the bytes of its JSON,
for the file as it is and every variant and sweep point it declares, equal the values the code
computed before the records became dataclasses (tests/data/example_identities.json, written
on main at 323411f, when they were pydantic models, by this file's main() with the model's
model_dump_json in place of dump_json). Each point's experiment also round-trips through its
JSON, and records.plain (hashes, comparisons) gives what pydantic writes."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from sexpgpu.compile.pipeline import compile_points, declared_selections
from sexpgpu.compile.selection import prescan
from sexpgpu.ir.dtypes import DType
from sexpgpu.ir.experiment import Experiment, InitSpec, Selection
from sexpgpu.ir.graph import TensorType
from sexpgpu.lisp.diagnostics import Diagnostic, Note
from sexpgpu.lisp.evaluator import Limits
from sexpgpu.records import dump, dump_json, load, load_json, plain

REPO = Path(__file__).resolve().parent.parent
EXPECTED = REPO / "tests" / "data" / "example_identities.json"
EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.lisp") if p.name != "tour.lisp")  # the tour is no run file


def identities(experiment: Experiment) -> dict[str, str]:
    assert plain(experiment) == dump(experiment)  # the pure-Python form hashes and compares what pydantic writes
    assert load_json(Experiment, dump_json(experiment)) == experiment  # and what it writes loads back as it was
    text = dump_json(experiment).decode().replace(str(REPO), "<repo>")
    return {
        "ir": experiment.module.hash(),
        "numbers": experiment.module.numbers_hash(),
        "ir_hash": experiment.ir_hash,
        "identity": experiment.identity_hash(with_data=False),
        "json": hashlib.sha256(text.encode()).hexdigest(),
    }


def example_identities(name: str) -> dict[str, dict[str, str]]:
    path = Path("examples") / name
    selections = [Selection()] + [selection for selection, _ in declared_selections(prescan(REPO / path))]
    out: dict[str, dict[str, str]] = {}
    for selection, result in zip(selections, compile_points(path, selections)):
        assert result.ok, [d.headline() for d in result.diagnostics]
        if result.experiment is None:
            continue  # not a run file (tour.lisp)
        label = f"{selection.variant or ''}/{selection.sweep or ''}/{'' if selection.point is None else selection.point}"
        out[label] = identities(result.experiment)
    return out


@pytest.mark.parametrize("name", EXAMPLES)
def test_each_selection_keeps_its_identities(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    expected = json.loads(EXPECTED.read_text())[name]
    assert example_identities(name) == expected


def test_a_diagnostic_as_json_is_what_pydantic_writes() -> None:
    """`check --json` writes plain(d, exclude_none=True); pydantic writes the same."""
    note = Note(message="raised here", file="lib.lisp", line=3)
    for diagnostic in (Diagnostic(code="E100", message="unbound variable x"),
                       Diagnostic(severity="warning", code="W001", message="careful", file="a.lisp", line=1, col=2, macro="m", notes=[note])):
        for exclude_none in (False, True):
            assert plain(diagnostic, exclude_none) == dump(diagnostic, exclude_none=exclude_none) == dump(diagnostic, mode="python", exclude_none=exclude_none)
        assert load(Diagnostic, dump(diagnostic)) == diagnostic


def test_records_are_validated_where_they_are_read_and_coerced_where_pydantic_coerced() -> None:
    """load() (pydantic) refuses what does not fit, __post_init__ does what pydantic's
    coercion did when a record is made in the process, and Limits refuses a limit that is
    not positive either way."""
    from pydantic import ValidationError

    assert load(TensorType, {"dtype": "f32", "shape": [2, 3]}) == TensorType(dtype=DType.f32, shape=(2, 3))
    made = TensorType(dtype="i32", shape=[4])  # type: ignore[arg-type]
    assert made.shape == (4,) and made.dtype is DType.i32 and hash(made) == hash(TensorType(dtype=DType.i32, shape=(4,)))
    assert InitSpec(kind="normal", mean=1).mean == 1.0 and type(InitSpec(kind="normal", std=2).std) is float
    for kind, data in ((InitSpec, {"kind": "bogus"}), (TensorType, {"dtype": "f99", "shape": [1]}), (Limits, {"steps": 0}),
                       (Limits, {"depth": "deep"}), (Diagnostic, {"code": "E100"})):
        with pytest.raises(ValidationError):
            load(kind, data)
    with pytest.raises(ValueError, match="limit seconds must be a positive number"):
        Limits(seconds=0.0)


def main() -> None:
    import os

    os.chdir(REPO)
    data: dict[str, Any] = {name: example_identities(name) for name in EXAMPLES}
    EXPECTED.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
