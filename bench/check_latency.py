"""Median latency of `sexpgpu check`: generated 1,000- and 5,000-line files and every file in examples/.

Two columns: the whole command as a user runs it (a new process: Python start-up, imports,
prelude, the file), and the check alone inside one process. Goal: < 0.2 s; promise: < 1 s.

    python bench/check_latency.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sexpgpu.compile.pipeline import compile_file  # noqa: E402

GOAL_S = 0.2
PROMISE_S = 1.0


def generated_file(lines: int = 1000) -> str:
    """Ordinary compile-time code: structs, functions, macros, loops, hash tables."""
    parts = [
        "(defstruct layer (name nil) (width 0) (depth 0))",
        "(defmacro with-total ((var) &body body) `(let ((,var 0)) ,@body ,var))",
        "(defparameter *table* (make-hash-table :test 'equal))",
    ]
    i = 0
    while sum(p.count("\n") + 1 for p in parts) < lines:
        parts.append(
            f"(defun block-{i} (width &key (expansion 4) (heads 8))\n"
            f"  \"Parameters of block {i}.\"\n"
            f"  (let* ((hidden (* expansion width))\n"
            f"         (attention (* 4 width width))\n"
            f"         (mlp (+ (* 2 width hidden) hidden width)))\n"
            f"    (setf (gethash \"block-{i}\" *table*) (list heads hidden))\n"
            f"    (with-total (total)\n"
            f"      (loop for part in (list attention mlp) do (incf total part)))))\n"
            f"(defparameter *b{i}* (make-layer :name \"b{i}\" :width (* 8 {i + 1}) :depth {i % 12}))\n"
            f"(assert (plusp (block-{i} (layer-width *b{i}*))))"
        )
        i += 1
    return "\n\n".join(parts) + "\n"


def time_process(path: Path, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "sexpgpu", "check", str(path)], capture_output=True, text=True, cwd=REPO)
        times.append(time.perf_counter() - start)
        if result.returncode != 0:
            raise SystemExit(f"check failed on {path}:\n{result.stderr}")
    return statistics.median(times)


def time_in_process(path: Path, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = compile_file(path)  # what `sexpgpu check` runs: read, expand, stage, type-check
        times.append(time.perf_counter() - start)
        errors = [d for d in result.diagnostics if d.severity == "error"]
        if errors:
            raise SystemExit(f"check failed on {path}: {errors[0].headline()}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for lines in (1000, 5000):  # 5000: the size issue 16 asks to check in under a second
            generated = Path(tmp) / f"generated-{lines}.lisp"
            generated.write_text(generated_file(lines))
            files.append((f"generated ({generated.read_text().count(chr(10))} lines)", generated))
        files += [(str(p.relative_to(REPO)), p) for p in sorted((REPO / "examples").glob("*.lisp"))]
        print(f"{'file':<34} {'command (s)':>12} {'in-process (s)':>15} {'goal':>6} {'promise':>8}")
        for name, path in files:
            command = time_process(path, args.repeat)
            inside = time_in_process(path, args.repeat)
            goal = "ok" if command < GOAL_S else "miss"
            promise = "ok" if command < PROMISE_S else "MISS"
            print(f"{name:<34} {command:>12.3f} {inside:>15.3f} {goal:>6} {promise:>8}")


if __name__ == "__main__":
    main()
