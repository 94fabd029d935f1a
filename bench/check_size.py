"""How `check`'s cost grows with the file's size: six shapes of large input (the kinds the
fuzzer of issue 13 used), each at two sizes, in one process run.

    python bench/check_size.py [--small 1000000] [--large 5000000]

Prints CPU seconds of the check at each size and the growth factor of the time beside the
growth factor of the size: about equal means linear. A file that exceeds an evaluation
limit still counts (the diagnostic is what check gives it); its code is printed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from sexpgpu.compile.pipeline import compile_file
from sexpgpu.lisp.evaluator import run_with_big_stack

SHAPES: dict[str, Callable[[int], str]] = {
    "a quoted list of numbers": lambda n: "(defparameter *x* '(" + " ".join(str(i % 1000) for i in range(n // 4)) + "))\n",
    "one string literal": lambda n: '(defparameter *s* "' + "a" * n + '")\n',
    "short top-level defuns": lambda n: "".join(f"(defun f{i} (x) (+ x {i}))\n" for i in range(n // 24)),
    "comment lines": lambda n: (";" + "c" * 78 + "\n") * (n // 80) + "(+ 1 2)\n",
    "one long symbol": lambda n: "(defparameter " + "s" * n + " 1)\n",
    "a vector of small lists": lambda n: "(defparameter *v* #(" + " ".join("(1 2)" for _ in range(n // 6)) + "))\n",
}


def check_seconds(path: Path) -> tuple[float, str]:
    start = time.process_time()
    result = run_with_big_stack(lambda: compile_file(path))
    elapsed = time.process_time() - start
    errors = [d.code for d in result.diagnostics if d.severity == "error"]
    return elapsed, errors[0] if errors else "ok"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", type=int, default=1_000_000, help="bytes of the small file")
    parser.add_argument("--large", type=int, default=5_000_000, help="bytes of the large file")
    args = parser.parse_args()
    print(f"{'input':28s} {'small MB':>8s} {'s':>7s} {'large MB':>8s} {'s':>7s} {'size x':>7s} {'time x':>7s}  result")
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in SHAPES.items():
            row = []
            for n in (args.small, args.large):
                text = make(n)
                path = Path(tmp) / "big.lisp"
                path.write_text(text, encoding="utf-8")
                seconds, code = check_seconds(path)
                row.append((len(text.encode("utf-8")) / 1e6, seconds, code))
            (mb1, s1, _), (mb2, s2, code) = row
            print(f"{name:28s} {mb1:8.1f} {s1:7.2f} {mb2:8.1f} {s2:7.2f} {mb2 / mb1:7.1f} {s2 / max(s1, 1e-9):7.1f}  {code}", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
