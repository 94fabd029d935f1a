"""The command line as a user runs it: real processes, exit codes, streams, JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO


def sexpgpu(*args: str, cwd: Path | None = None, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "sexpgpu", *args], cwd=cwd, input=stdin, capture_output=True, text=True, timeout=timeout, env=env
    )


def test_check_ok_example() -> None:
    result = sexpgpu("check", "examples/tour.lisp", cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "examples/tour.lisp: ok"


def test_check_error_exit_3_with_caret(tmp_path: Path) -> None:
    (tmp_path / "bad.lisp").write_text('(defun f (x)\n  (+ x "one"))\n(f 3)\n')
    result = sexpgpu("check", "bad.lisp", cwd=tmp_path)
    assert result.returncode == 3
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0] == 'bad.lisp:2:3: error[E103]: `+`: argument 2 must be a number, got "one" (a string)'
    assert lines[2] == "         ^"
    assert "Traceback" not in result.stderr


def test_check_json_is_a_list(tmp_path: Path) -> None:
    (tmp_path / "bad.lisp").write_text("(car 5)\n")
    result = sexpgpu("check", "--json", "bad.lisp", cwd=tmp_path)
    assert result.returncode == 3
    (diag,) = json.loads(result.stdout)
    assert diag == {
        "severity": "error",
        "code": "E103",
        "message": "`car`: argument 1 must be a list, got 5 (an integer)",
        "file": "bad.lisp",
        "line": 1,
        "col": 1,
        "notes": [],
    }
    ok = sexpgpu("check", "--json", "examples/tour.lisp", cwd=REPO)
    assert ok.returncode == 0 and json.loads(ok.stdout) == []


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    missing = sexpgpu("check", "nope.lisp", cwd=tmp_path)
    assert missing.returncode == 2 and "file not found: nope.lisp" in missing.stderr
    bad_flag = sexpgpu("check", "--bogus", "x.lisp", cwd=tmp_path)
    assert bad_flag.returncode == 2 and "unrecognized arguments" in bad_flag.stderr
    no_verb = sexpgpu(cwd=tmp_path)
    assert no_verb.returncode == 2


def test_limit_flags(tmp_path: Path) -> None:
    (tmp_path / "spin.lisp").write_text("(loop)\n")
    result = sexpgpu("check", "--max-eval-steps", "5000", "spin.lisp", cwd=tmp_path)
    assert result.returncode == 3
    assert "error[L001]: evaluation step budget of 5000 steps exhausted" in result.stderr


def test_eval_expressions_in_a_fresh_world() -> None:
    result = sexpgpu("eval", "(+ 1 2)", "(values 1 2)", "(format nil \"~a-~a\" :a 1)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["3", "1", '"a-1"']


def test_eval_in_a_file_environment() -> None:
    result = sexpgpu("eval", "examples/tour.lisp", "(model-params *char-model*)", cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "834176"


def test_eval_error_is_a_diagnostic_exit_3() -> None:
    result = sexpgpu("eval", "(car 5)")
    assert result.returncode == 3
    assert result.stderr.startswith("<expr>:1:1: error[E103]: `car`: argument 1 must be a list")


def test_eval_stdin_continues_after_an_error() -> None:
    result = sexpgpu("eval", "-", stdin='(defun f (x) (* 2 x))\n(f 21)\n(f "a")\n(list 1 2)\n')
    assert result.returncode == 3
    assert result.stdout.splitlines() == [
        "f",
        "42",
        'error: `*`: argument 2 must be a number, got "a" (a string)',
        "(1 2)",
    ]


def test_eval_stdin_json() -> None:
    result = sexpgpu("eval", "--json", "-", stdin="(floor 7 2) (car 1)")
    document = json.loads(result.stdout)
    assert document[0] == {"form": "(floor 7 2)", "value": "3", "values": ["3", "1"], "error": None, "warnings": []}
    assert document[1]["form"] == "(car 1)" and document[1]["value"] is None and document[1]["values"] == []
    assert document[1]["error"]["code"] == "E103"


def test_repl_reads_multiline_forms() -> None:
    result = sexpgpu("eval", stdin="(defun sq (x)\n  (* x x))\n(sq 7)\n(values 1 2)\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["sq", "49", "1 ; 2"]


def test_fmt_check_and_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "messy.lisp"
    path.write_text("(defun   f(x)\n(+ x\n1))   ; add one\n")
    check = sexpgpu("fmt", "--check", "messy.lisp", cwd=tmp_path)
    assert check.returncode == 3 and "would reformat messy.lisp" in check.stdout
    assert path.read_text() == "(defun   f(x)\n(+ x\n1))   ; add one\n"
    write = sexpgpu("fmt", "messy.lisp", cwd=tmp_path)
    assert write.returncode == 0
    assert path.read_text() == "(defun f (x)\n  (+ x 1)) ; add one\n"
    again = sexpgpu("fmt", "--check", "messy.lisp", cwd=tmp_path)
    assert again.returncode == 0


def test_fmt_reports_read_errors(tmp_path: Path) -> None:
    (tmp_path / "broken.lisp").write_text("(defun f (x)\n")
    result = sexpgpu("fmt", "broken.lisp", cwd=tmp_path)
    assert result.returncode == 3
    assert result.stderr.startswith("broken.lisp:2:1: error[R001]")


def test_watch_rechecks_on_save_of_a_required_file(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "lib.lisp").write_text("(defun helper () 1)\n")
    (tmp_path / "main.lisp").write_text('(require "./lib.lisp" :as lib)\n(lib:helper)\n')
    env = {**os.environ, "NO_COLOR": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sexpgpu", "watch", "--max-checks", "2", "--interval", "0.05", "main.lisp"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.strip().endswith("main.lisp: ok")
    lib = tmp_path / "lib.lisp"
    seen = lib.stat().st_mtime_ns
    lib.write_text("(defun helper () (car 1))\n")
    os.utime(lib, ns=(seen + 1_000_000_000, seen + 1_000_000_000))  # a change the watcher sees at any clock resolution
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert out.strip().endswith("main.lisp: 1 error(s)")
    assert "lib.lisp:1:18: error[E103]" in err


def test_docs_pages() -> None:
    index = sexpgpu("docs", cwd=REPO)
    assert index.returncode == 0 and "it-is-common-lisp.md" in index.stdout
    page = sexpgpu("docs", "It is Common Lisp", cwd=REPO)
    assert page.returncode == 0
    assert page.stdout == (REPO / "docs" / "it-is-common-lisp.md").read_text()
    missing = sexpgpu("docs", "it-is-comon-lisp", cwd=REPO)
    assert missing.returncode == 2 and "did you mean: it-is-common-lisp" in missing.stderr


def test_no_traceback_on_internal_trouble(tmp_path: Path) -> None:
    (tmp_path / "deep.lisp").write_text("(" * 3000 + ")" * 3000)
    result = sexpgpu("check", "deep.lisp", cwd=tmp_path)
    assert result.returncode == 3
    assert "Traceback" not in result.stderr
    assert "error[R003]: nesting deeper than 2000 levels" in result.stderr


@pytest.mark.parametrize("verb", ["check", "eval", "fmt", "watch", "docs"])
def test_every_verb_has_help_and_json(verb: str) -> None:
    result = sexpgpu(verb, "--help")
    assert result.returncode == 0
    assert "--json" in result.stdout


def test_lisp_output_goes_to_stdout_but_not_into_json() -> None:
    plain = sexpgpu("eval", '(progn (format t "hello~%") 5)')
    assert plain.stdout.splitlines() == ["hello", "5"]
    as_json = sexpgpu("eval", "--json", '(progn (format t "hello~%") 5)')
    assert json.loads(as_json.stdout)[0]["value"] == "5"
    assert as_json.stderr == "hello\n"


def test_doctor(tmp_path: Path) -> None:
    ok = sexpgpu("doctor", "--store", str(tmp_path / "runs"), "--json", "examples/quickstart.lisp", cwd=REPO)
    assert ok.returncode == 0, ok.stdout
    document = json.loads(ok.stdout)
    assert document["ok"] is True and {f["check"] for f in document["findings"]} >= {"python", "store", "memory", "file"}
    bad = sexpgpu("doctor", "--store", "/dev/null/runs", cwd=tmp_path)
    assert bad.returncode == 4
    assert "fail  store" in bad.stdout and "fix:" in bad.stdout


def test_diff_shows_defrun_and_loader_changes(tmp_path: Path) -> None:
    other = tmp_path / "q2.lisp"
    other.write_text((REPO / "examples" / "quickstart.lisp").read_text().replace("(defrun :steps 300 :seed 0)", "(defrun :steps 500 :seed 1)").replace(":batch 64)", ":batch 32)"))
    result = sexpgpu("diff", "--json", str(REPO / "examples" / "quickstart.lisp"), str(other), cwd=REPO)
    changes = json.loads(result.stdout)
    assert "steps: 300 -> 500" in changes["run"] and "seed: 0 -> 1" in changes["run"]
    assert changes["loaders"] == ["train batch: 64 -> 32"]  # the values, not only the name


def test_each_verb_loads_only_its_own_module_and_the_table_matches_the_parser() -> None:
    """`sexpgpu VERB` registers (and imports) only VERB's module; the table main.py keeps of
    which module defines which verbs agrees with what the modules register, and the help
    printed from the table alone is the help of the parser with every verb imported."""
    from sexpgpu.cli.main import VERBS, build_parser

    def verbs(parser: Any) -> list[str]:
        return [name for action in parser._subparsers._group_actions for name in action.choices]

    everything = build_parser(every_verb=True)
    assert verbs(everything) == list(VERBS)
    assert build_parser().format_help() == everything.format_help()
    # each verb alone, in a fresh process: its module must not lean on another's import
    for verb in VERBS:
        alone = subprocess.run([sys.executable, "-m", "sexpgpu", verb, "--help"], capture_output=True, text=True, cwd=REPO)
        assert alone.returncode == 0 and verb in alone.stdout, (verb, alone.stderr[-500:])
    done = subprocess.run([sys.executable, "-c", "import sys; from sexpgpu.cli.main import build_parser; build_parser(['check', 'f.lisp']); "
                           "print(sorted(m for m in sys.modules if m.startswith(('sexpgpu.runtime', 'sexpgpu.bundle', 'fsspec', 'ray'))))"],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


HEAVY = ("pydantic", "numpy", "sexpgpu.lisp", "sexpgpu.compile", "sexpgpu.ir", "sexpgpu.runtime", "sexpgpu.session", "sexpgpu.outcome")


@pytest.mark.parametrize("argv", [["--version"], ["--help"], [], ["docs"], ["docs", "quickstart"], ["chek"]])
def test_version_help_and_docs_import_no_compiler_runtime_or_pydantic(argv: list[str]) -> None:
    """`python -X importtime -m sexpgpu ARGV` lists every module the command imported: none of
    the compiler, the runtime or pydantic."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "sexpgpu", *argv], capture_output=True, text=True, cwd=REPO)
    assert done.returncode in (0, 2), done.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "sexpgpu.cli.main" in imported
    heavy = sorted(m for m in imported if m.startswith(HEAVY))
    assert heavy == [], heavy


@pytest.mark.parametrize("example", ["quickstart.lisp", "cnn.lisp", "char-transformer.lisp", "charlm.lisp"])
def test_check_imports_no_numpy_no_pydantic_and_no_runtime(example: str, tmp_path: Path) -> None:
    """`check` needs the op table's shape rules, not its NumPy kernels, and writes no record:
    neither a clean file nor one with an error (a layer given the wrong width) imports NumPy,
    pydantic (sexpgpu/records.py: the records are dataclasses) or the runtime."""
    broken = tmp_path / "broken.lisp"
    broken.write_text((REPO / "examples" / "quickstart.lisp").read_text().replace("(x :f32 (2))", "(x :f32 (3))"))
    for path, code in ((REPO / "examples" / example, 0), (broken, 3)):
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "sexpgpu", "check", str(path)], capture_output=True, text=True, cwd=REPO)
        assert done.returncode == code, done.stdout + done.stderr[-2000:]
        imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
        assert "sexpgpu.compile.pipeline" in imported and (code or "sexpgpu.ir.ops_elementwise" in imported)  # staged: the op table was read
        heavy = sorted(m for m in imported if m.startswith(("numpy", "ml_dtypes", "pydantic", "sexpgpu.runtime", "sexpgpu.session")))
        assert heavy == [], (path.name, heavy)


@pytest.mark.parametrize("example", sorted(p.name for p in (REPO / "examples").glob("*.lisp")))
def test_no_check_of_an_example_imports_pydantic_or_numpy(example: str) -> None:
    """Nor does a sweep's (its points are bound to the probe's IR as plain data: records.plain;
    a sampled sweep draws its points without NumPy: sweeps/philox.py), nor `--json` (the
    diagnostics as plain data)."""
    for flags in ([], ["--json"]):
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "sexpgpu", "check", *flags, str(REPO / "examples" / example)],
                              capture_output=True, text=True, cwd=REPO)
        assert done.returncode == 0, done.stdout + done.stderr[-2000:]
        imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
        assert "sexpgpu.compile.pipeline" in imported
        assert sorted(m for m in imported if m.startswith(("pydantic", "numpy"))) == [], (example, flags)


def test_watch_frees_each_checks_world_before_the_next_check() -> None:
    """A check's Lisp world is cyclic garbage once the check is done; watch collects it while
    it waits for a save (settle_memory), so the next check's collections do not walk it."""
    import gc
    import weakref

    from sexpgpu.cli.check import settle_memory
    from sexpgpu.compile.pipeline import compile_file

    was_enabled = gc.isenabled()
    gc.disable()  # no collection of its own may run between the check and settle_memory
    try:
        result = compile_file(REPO / "examples" / "quickstart.lisp")
        assert result.program is not None
        world = weakref.ref(result.program.interp)
        del result
        assert world() is not None  # held by its own cycles, not by anyone
        settle_memory()
        assert world() is None
    finally:
        gc.unfreeze()  # the rest of this test process collects as before
        if was_enabled:
            gc.enable()


def test_watch_leaves_the_last_check_standing_on_a_save_of_the_same_bytes(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    main = tmp_path / "main.lisp"
    main.write_text("(defun f () 1)\n")
    env = {**os.environ, "NO_COLOR": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sexpgpu", "watch", "--max-checks", "2", "--interval", "0.05", "main.lisp"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        assert proc.stdout.readline().strip().endswith("main.lisp: ok")
        seen = main.stat().st_mtime_ns
        os.utime(main, ns=(seen + 1_000_000_000, seen + 1_000_000_000))  # saved, the bytes as they were
        assert proc.stderr.readline().strip() == "main.lisp: saved unchanged; the last check stands"
        main.write_text("(defun f () (car 1))\n(f)\n")
        os.utime(main, ns=(seen + 2_000_000_000, seen + 2_000_000_000))
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert out.strip().endswith("main.lisp: 1 error(s)") and "error[E103]" in err
