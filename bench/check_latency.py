"""Latency of `sexpgpu check`, each row a new process as a user runs it: `--version`, every
file in examples/, generated sweeps over the quickstart model (a 1,024-point grid of learning
rates and seeds, a 64-point grid that changes a width), the generated 5,505-line file, and in
one process a second check and a `watch` re-check after a save. Goals (issue 26): --version
< 0.15 s, each example < 0.3 s, search.lisp and the 1,024-point sweep < 1 s, the 5,505-line
file < 1 s, a watch re-check of an example < 0.2 s.

    python bench/check_latency.py [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from sweep_files import lr_seed_grid, width_grid  # noqa: E402

# a row's goal in seconds, by what it times; a sweep whose points change a shape compiles once
# per shape (issue 26 sets it no goal: eight widths are eight compiles and their checks)
GOALS: dict[str, float | None] = {"version": 0.15, "example": 0.3, "sweep": 1.0, "shapes": None, "large": 1.0, "recheck": 0.2}

SECOND_CHECK = """
import sys, time
from pathlib import Path
from sexpgpu.cli.check import settle_memory
from sexpgpu.compile.pipeline import check_every_selection
path = Path(sys.argv[1])
check_every_selection(path)
settle_memory()  # what watch does between checks
start = time.perf_counter()
check_every_selection(path)
print(time.perf_counter() - start)
"""


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


def median_of(repeat: int, once: Callable[[], float]) -> float:
    return statistics.median(once() for _ in range(repeat))


def command(*argv: str) -> Callable[[], float]:
    def once() -> float:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "sexpgpu", *argv], capture_output=True, text=True, cwd=REPO)
        took = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"sexpgpu {' '.join(argv)} failed:\n{done.stderr}")
        return took

    return once


def second_check(path: Path) -> Callable[[], float]:
    def once() -> float:
        done = subprocess.run([sys.executable, "-c", SECOND_CHECK, str(path)], capture_output=True, text=True, cwd=REPO, check=True)
        return float(done.stdout.split()[-1])

    return once


def watch_recheck(path: Path) -> Callable[[], float]:
    """From a save of PATH (a copy of an example) to watch's status line of the re-check."""

    def once() -> float:
        watch = subprocess.Popen([sys.executable, "-m", "sexpgpu", "watch", "--interval", "0.02", "--max-checks", "2", str(path)],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO)
        assert watch.stdout is not None
        watch.stdout.readline()  # the first check's status line
        time.sleep(0.5)  # past the first check's settling; the save must come after it
        path.write_text(path.read_text() + "\n")
        saved = time.perf_counter()
        watch.stdout.readline()
        took = time.perf_counter() - saved
        watch.wait(timeout=60)
        return took

    return once


def rows(tmp: Path) -> list[tuple[str, str, Callable[[], float]]]:
    out: list[tuple[str, str, Callable[[], float]]] = [("sexpgpu --version", "version", command("--version"))]
    for example in sorted((REPO / "examples").glob("*.lisp")):
        kind = "sweep" if example.stem in ("search", "sweep") else "example"
        out.append((f"check {example.relative_to(REPO)}", kind, command("check", str(example))))
    grid = tmp / "grid-1024.lisp"
    grid.write_text(lr_seed_grid(32, 32))
    out.append(("check grid: 32 lrs x 32 seeds", "sweep", command("check", str(grid))))
    widths = tmp / "widths-64.lisp"
    widths.write_text(width_grid(8, 8))
    out.append(("check grid: 8 widths x 8 lrs", "shapes", command("check", str(widths))))
    large = tmp / "generated.lisp"
    large.write_text(generated_file(5000))
    out.append((f"check generated ({large.read_text().count(chr(10))} lines)", "large", command("check", str(large))))
    out.append(("second check, one process (quickstart)", "recheck", second_check(REPO / "examples" / "quickstart.lisp")))
    copy = tmp / "quickstart.lisp"
    copy.write_text((REPO / "examples" / "quickstart.lisp").read_text())
    out.append(("watch re-check after a save (quickstart)", "recheck", watch_recheck(copy)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}; median of {args.repeat}")
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'what':<44} {'seconds':>8} {'goal':>6}")
        for name, kind, once in rows(Path(tmp)):
            took = median_of(args.repeat, once)
            goal = GOALS[kind]
            verdict = "-" if goal is None else "ok" if took < goal else "miss"
            print(f"{name:<44} {took:>8.3f} {verdict:>6}", flush=True)


if __name__ == "__main__":
    main()
