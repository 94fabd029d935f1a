"""Speed of the compile-time Lisp: four workloads, each beside the same computation written in
CPython and run by SBCL's interpreter (sb-ext:*evaluator-mode* :interpret).

    python bench/eval_speed.py [--repeat N]

Workloads: fib 22 with labels; (loop for i below 100000 sum i); building a 48-layer model's
config with loop and format; `check` of a 5,000-line generated file (SBCL loads the same file).
Times are CPU seconds of the computation alone (no process start-up), the best of N runs.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

from sexpgpu.compile.pipeline import compile_file  # from PYTHONPATH or the install: the bench runs on any checkout
from sexpgpu.lisp.evaluator import Limits, run_with_big_stack
from sexpgpu.lisp.program import new_program

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_latency import generated_file  # noqa: E402  (after sexpgpu, which it must not replace)

FIB = "(labels ((fib (n) (if (< n 2) n (+ (fib (- n 1)) (fib (- n 2)))))) (fib 22))"
LOOP = "(loop for i below 100000 sum i)"
CONFIG = """
(let ((config (make-hash-table :test 'equal)))
  (loop for i below 48
        for width = (* 64 (1+ (mod i 4)))
        do (setf (gethash (format nil "block-~2,'0d" i) config)
                 (list :name (format nil "block-~2,'0d" i)
                       :width width
                       :heads (floor width 32)
                       :shapes (loop for part in '("q" "k" "v" "o" "up" "down")
                                     collect (format nil "~a: ~d x ~d" part width (* 4 width)))
                       :params (+ (* 4 width width) (* 8 width width)))))
  (loop for k being the hash-keys of config using (hash-value v)
        sum (getf v :params)))
"""


def py_fib() -> int:
    def fib(n: int) -> int:
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    return fib(22)


def py_loop() -> int:
    total = 0
    for i in range(100000):
        total += i
    return total


def py_config() -> int:
    config = {}
    for i in range(48):
        width = 64 * (1 + i % 4)
        name = f"block-{i:02d}"
        config[name] = {
            "name": name, "width": width, "heads": width // 32,
            "shapes": [f"{part}: {width} x {4 * width}" for part in ("q", "k", "v", "o", "up", "down")],
            "params": 4 * width * width + 8 * width * width,
        }
    return sum(v["params"] for v in config.values())


def best(run: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return min(times)


def lisp_time(source: str, repeat: int) -> float:
    """CPU seconds of evaluating SOURCE in a fresh world (the world's making not counted)."""
    def run() -> float:
        program = new_program(None, Limits(steps=100_000_000, alloc=100_000_000))
        start = time.process_time()
        results = program.eval_text(source)
        elapsed = time.process_time() - start
        error = results[-1].error
        if error is not None:
            raise SystemExit(f"{source[:40]}...: {error.headline()}")
        return elapsed

    return min(run_with_big_stack(run) for _ in range(repeat))


def check_time(path: Path, repeat: int) -> float:
    def run() -> None:
        result = compile_file(path)
        errors = [d for d in result.diagnostics if d.severity == "error"]
        if errors:
            raise SystemExit(f"check failed on {path}: {errors[0].headline()}")

    return best(run, repeat)


SBCL_TIMER = """
(setf sb-ext:*evaluator-mode* :interpret)
(defun %time (thunk repeat)
  (let ((best nil))
    (dotimes (i repeat best)
      (let ((start (get-internal-run-time)))
        (funcall thunk)
        (let ((s (/ (- (get-internal-run-time) start) internal-time-units-per-second)))
          (when (or (null best) (< s best)) (setf best s)))))))
"""


def sbcl_times(sources: dict[str, str], check_path: Path, repeat: int) -> dict[str, Optional[float]]:
    """SBCL's interpreter on the same forms, and loading the same generated file."""
    if shutil.which("sbcl") is None:
        return {name: None for name in [*sources, "check"]}
    lines = [SBCL_TIMER]
    for name, source in sources.items():
        lines.append(f'(format t "~a ~f~%" "{name}" (%time (lambda () (eval (quote {source}))) {repeat}))')
    lines.append(f'(format t "~a ~f~%" "check" (%time (lambda () (load "{check_path}")) {repeat}))')
    with tempfile.NamedTemporaryFile("w", suffix=".lisp", delete=False) as script:
        script.write("\n".join(lines))
    result = subprocess.run(["sbcl", "--script", script.name], capture_output=True, text=True, timeout=1200)
    out: dict[str, Optional[float]] = {name: None for name in [*sources, "check"]}
    for line in result.stdout.splitlines():
        name, _, value = line.partition(" ")
        if name in out:
            out[name] = float(value)
    return out


def cell(x: Optional[float]) -> str:
    return f"{x:>10.4f}" if x is not None else f"{'-':>10}"


def ratio(a: Optional[float], b: Optional[float]) -> str:
    return f"{a / b:>9.1f}x" if a is not None and b else f"{'-':>10}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "generated-5000.lisp"
        path.write_text(generated_file(5000))
        lines = path.read_text().count("\n")
        ours = {
            "fib": lisp_time(FIB, args.repeat),
            "loop": lisp_time(LOOP, args.repeat),
            "config": lisp_time(CONFIG, args.repeat),
            "check": check_time(path, args.repeat),
        }
        python = {"fib": best(py_fib, args.repeat), "loop": best(py_loop, args.repeat), "config": best(py_config, args.repeat), "check": None}
        sbcl = sbcl_times({"fib": FIB, "loop": LOOP, "config": " ".join(CONFIG.split())}, path, args.repeat)
    labels = {
        "fib": "fib 22 (labels)",
        "loop": "(loop for i below 100000 sum i)",
        "config": "48-layer config (loop, format)",
        "check": f"check of a {lines}-line file",
    }
    print(f"CPU seconds, best of {args.repeat}")
    print(f"{'workload':<34} {'sexpgpu':>10} {'cpython':>10} {'sbcl-interp':>11} {'vs cpython':>10} {'vs sbcl':>10}")
    for key, label in labels.items():
        print(f"{label:<34} {cell(ours[key])} {cell(python[key])} {cell(sbcl[key]):>11} {ratio(ours[key], python[key])} {ratio(ours[key], sbcl[key])}")


if __name__ == "__main__":
    main()
