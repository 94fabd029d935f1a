"""The SBCL differential suite: every cases file in tests/differential/ (cases.lisp and one
file per CLHS chapter) is evaluated form by form, in order, in a fresh world, and each case
must print exactly what SBCL printed (NAME.expected, made by generate.sh). Known, documented
differences are listed below with their reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import pytest

from sexpgpu.compile.pipeline import system_image
from sexpgpu.lisp.image import SystemImage
from sexpgpu.lisp.conditions import LimitExceeded, LispError, error_class
from sexpgpu.lisp.evaluator import Interpreter, run_with_big_stack
from sexpgpu.lisp.printer import prin1_to_string
from sexpgpu.lisp.program import new_program
from sexpgpu.lisp.reader import Reader
from sexpgpu.lisp.types import Loc, MultipleValues

HERE = Path(__file__).parent / "differential"
CASE_FILES = sorted(p.name for p in HERE.glob("*.lisp") if p.name != "driver.lisp")

# case source -> why SexpGPU differs on purpose (docs/it-is-common-lisp.md lists each)
KNOWN_DIFFERENCES = {
    '(assoc "b" \'(("a" . 1) ("b" . 2)))': "strings are Python strings: eql on two equal one-character strings may be true",
}


def run_cases(name: str, hot: int = 0, image: Optional[SystemImage] = None) -> list[tuple[str, str, str]]:
    """Every case's result line. HOT > 0 turns code into generated Python after that many
    calls or loops (the second tier), instead of the interpreter's defaults. IMAGE: the world
    is built from it (the prelude evaluated as its recorded expansions), as a sweep's are."""
    program = new_program(None, image=image)
    interp = program.interp
    if hot:
        interp.hot_calls = interp.hot_loops = hot
    text = (HERE / name).read_text(encoding="utf-8")
    reader = Reader(text, name, program.table)
    interp.table = program.table
    out: list[tuple[str, str, str]] = []
    while (read := reader.read_next()) is not None:
        source = text[_offset(text, read.loc.line, read.loc.col) : reader.pos]
        out.append((f"{read.loc}", source, escaped(case_line(interp, read.form, read.loc))))
    return out


def case_line(interp: Interpreter, form: Any, loc: Loc) -> str:
    """FORM's result line, as driver.lisp writes SBCL's (unescaped): a fresh budget, inside a
    handler for error."""
    interp.reset_budget()
    interp.handlers.clear()
    try:
        interp.handlers.append((interp.sym("ERROR"),))
        value = interp.eval_toplevel(form, loc)
        values = list(value) if type(value) is MultipleValues else [value]
        return "ok " + " ; ".join(prin1_to_string(v, interp.print_other) for v in values)
    except LispError as exc:
        return "error " + error_class(exc.condition)
    except LimitExceeded:
        return "error limit"


def escaped(line: str) -> str:
    return line.replace("\\", "\\\\").replace("\n", "\\n")


def _offset(text: str, line: int, col: int) -> int:
    lines = text.split("\n")
    return sum(len(x) + 1 for x in lines[: line - 1]) + col - 1


def _expected(name: str) -> list[str]:
    return [e for e in (HERE / name.replace(".lisp", ".expected")).read_text(encoding="utf-8").split("\n") if e]


def test_the_suite_is_large() -> None:
    """Three times the 1257 cases the suite started with."""
    assert sum(len(_expected(name)) for name in CASE_FILES) >= 3 * 1257


@pytest.mark.parametrize("hot", [0, 1], ids=["default-tiers", "all-generated"])
@pytest.mark.parametrize("name", CASE_FILES)
def test_sbcl_differential(name: str, hot: int) -> None:
    expected = _expected(name)
    results = run_with_big_stack(lambda: run_cases(name, hot))
    assert len(expected) == len(results), f"{name} and its .expected are out of step: run generate.sh"
    mismatches = []
    for (where, source, got), want in zip(results, expected):
        if got != want and source.strip() not in KNOWN_DIFFERENCES:
            mismatches.append(f"{where} {source.strip()[:80]}\n    sbcl: {want[:120]}\n    ours: {got[:120]}")
    assert not mismatches, f"{len(mismatches)} of {len(results)} cases differ from SBCL:\n" + "\n".join(mismatches[:30])


@pytest.fixture(scope="module")
def image() -> SystemImage:
    return run_with_big_stack(system_image)


@pytest.mark.parametrize("name", CASE_FILES)
def test_sbcl_differential_in_a_world_from_the_system_image(name: str, image: SystemImage) -> None:
    """The same cases in a world that evaluated the prelude's recorded expansions
    (lisp/image.py) instead of expanding its forms itself."""
    assert image.expanded, "the image holds no expansion"
    expected = _expected(name)
    results = run_with_big_stack(lambda: run_cases(name, 0, image))
    assert len(expected) == len(results)
    mismatches = [f"{where} {source.strip()[:80]}\n    sbcl: {want[:120]}\n    ours: {got[:120]}"
                  for (where, source, got), want in zip(results, expected) if got != want and source.strip() not in KNOWN_DIFFERENCES]
    assert not mismatches, f"{len(mismatches)} of {len(results)} cases differ from SBCL:\n" + "\n".join(mismatches[:30])


@pytest.mark.parametrize("name", CASE_FILES)
def test_expected_is_what_sbcl_prints_today(name: str, tmp_path: Path) -> None:
    """Regenerates the expectations with SBCL (installed by .ci/run) and compares."""
    import shutil
    import subprocess

    if shutil.which("sbcl") is None:
        pytest.skip("sbcl is not installed (apt-get install -y sbcl)")
    out = tmp_path / "expected"
    subprocess.run(
        ["sbcl", "--script", str(HERE / "driver.lisp"), str(HERE / name), str(out)],
        check=True, capture_output=True, timeout=300,
    )
    assert out.read_text(encoding="utf-8") == (HERE / name.replace(".lisp", ".expected")).read_text(encoding="utf-8")
