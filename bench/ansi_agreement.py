"""How often SexpGPU's compile-time Lisp agrees with SBCL on the forms of the public ANSI CL
test suite (pfdietz/ansi-test): each test's form, evaluated in both, printed the same.

    python bench/ansi_agreement.py ANSI-TEST-DIR [--helpers] [--only SUBDIR ...] [--mismatches FILE]

ANSI-TEST-DIR is a checkout of the suite (or any folder of its .lsp files, searched
recursively). For each file, bench/ansi/extract.lisp takes the form of every `deftest` and the
definitions they use; SBCL (tests/differential/driver.lisp --chunks) and SexpGPU evaluate them
in order in one fresh world per file, and the lines are compared as the differential suite
compares them. --helpers loads bench/ansi/aux.lisp first (our own versions of the suite's
helpers: signals-error, notnot, eqlt ...); without it, a form calling a helper is an
undefined-function error in both. Needs `sbcl` on PATH. Prints one line per file and the total;
never asserted in tests (the suite is not part of this repository).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "tests"))

from sexpgpu.lisp.diagnostics import DiagnosticError  # noqa: E402
from sexpgpu.lisp.evaluator import run_with_big_stack  # noqa: E402
from sexpgpu.lisp.program import new_program  # noqa: E402
from sexpgpu.lisp.reader import Reader  # noqa: E402
from test_differential import case_line, escaped  # noqa: E402  (the suite's own result lines)

HERE = Path(__file__).resolve().parent / "ansi"
DRIVER = REPO / "tests" / "differential" / "driver.lisp"
SEPARATOR = ";;@@CASE\n"


def chunks(text: str) -> list[str]:
    return [c for c in text.split(SEPARATOR) if c.strip()]


def cases_file(test_file: Path, helpers: str, folder: Path) -> Path:
    body = folder / (test_file.stem + ".body")
    subprocess.run(["sbcl", "--script", str(HERE / "extract.lisp"), str(test_file), str(body)], check=True, capture_output=True, timeout=300)
    cases = folder / (test_file.stem + ".lisp")
    cases.write_text(helpers + body.read_text(encoding="utf-8"), encoding="utf-8")
    return cases


def sbcl_lines(cases: Path) -> list[str]:
    out = cases.with_suffix(".sbcl")
    subprocess.run(["sbcl", "--script", str(DRIVER), str(cases), str(out), "--chunks"], check=True, capture_output=True, timeout=3600)
    return out.read_text(encoding="utf-8").splitlines()


def our_lines(cases: Path) -> list[str]:
    """Each case of CASES in one fresh world, in order: a case's line is its last form's (a
    reader error is `error reader`, a crash of ours `error internal`)."""
    program = new_program(None)
    interp = program.interp
    interp.table = program.table
    lines = []
    for chunk in chunks(cases.read_text(encoding="utf-8")):
        try:
            reads = Reader(chunk, cases.name, program.table).read_all()
        except DiagnosticError:
            lines.append("error reader")
            continue
        line = "ok "
        for read in reads:
            try:
                line = case_line(interp, read.form, read.loc)
            except DiagnosticError:
                line = "error diagnostic"
            except Exception as exc:  # noqa: BLE001  (an internal error is a finding, counted, not fatal)
                line = f"error internal {type(exc).__name__}"
        lines.append(escaped(line))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", type=Path)
    parser.add_argument("--helpers", action="store_true", help="load bench/ansi/aux.lisp before each file")
    parser.add_argument("--only", nargs="*", default=[], help="subfolders of the suite to measure")
    parser.add_argument("--mismatches", type=Path, help="write each disagreement here")
    args = parser.parse_args()
    helpers = (HERE / "aux.lisp").read_text(encoding="utf-8") if args.helpers else ""
    skip = len(chunks(helpers))
    roots = [args.suite / d for d in args.only] or [args.suite]
    files = sorted(p for root in roots for p in root.rglob("*.lsp"))
    agree = total = 0
    found: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for test_file in files:
            cases = cases_file(test_file, helpers, Path(tmp))
            theirs = sbcl_lines(cases)[skip:]
            ours = run_with_big_stack(partial(our_lines, cases))[skip:]
            sources = chunks(cases.read_text(encoding="utf-8"))[skip:]
            if len(theirs) != len(ours):
                print(f"{test_file}: SBCL gave {len(theirs)} lines, SexpGPU {len(ours)}; skipped")
                continue
            same = sum(a == b for a, b in zip(theirs, ours))
            agree, total = agree + same, total + len(ours)
            print(f"{same:5d}/{len(ours):<5d} {test_file.relative_to(args.suite)}")
            found += [f"{test_file.name}: {' '.join(s.split())[:200]}\n    sbcl: {a[:200]}\n    ours: {b[:200]}"
                      for s, a, b in zip(sources, theirs, ours) if a != b]
    print(f"agree on {agree} of {total} forms: {100 * agree / max(total, 1):.1f}%")
    if args.mismatches:
        args.mismatches.write_text("\n".join(found) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
