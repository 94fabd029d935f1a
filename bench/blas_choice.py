"""Which BLAS the compiled CPU device should call: cblas_sgemm's GF/s at the products of the
CPU benchmarks' workloads (bench/cpu_workloads.py: each train program's gemms, as the lowering
plans them, the transposes included), one thread (the device's pool calls the BLAS on one
thread per piece), for the two it can call, loaded as it loads them: NumPy's OpenBLAS
($SEXPGPU_BLAS=numpy) and the mkl wheel's MKL, sequential ($SEXPGPU_BLAS=mkl), where it is
installed. The libraries alternate shape by shape, the best of several timings kept; each
workload's line is the GF/s of all its gemms together (their FLOPs over their summed times).

    python bench/blas_choice.py
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

from threadpoolctl import threadpool_limits

from cpu_workloads import experiment_of, workloads

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


class Library:
    def __init__(self, name: str, sgemm: Any) -> None:
        self.name, self.sgemm = name, sgemm


def device_blas(choice: str) -> Optional[Library]:
    """The BLAS the compiled CPU device calls when $SEXPGPU_BLAS is CHOICE (numpy: NumPy's
    OpenBLAS; mkl: the mkl wheel's, sequential), as the device loads it; None where it is not installed."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from sexpgpu.runtime.cpu.device import find_blas
    from sexpgpu.runtime.cpu.toolchain import open_toolchain

    try:
        blas = find_blas(open_toolchain(), {"SEXPGPU_BLAS": choice})
    except RuntimeError:
        return None
    integer = ctypes.c_int64 if blas.int64 else ctypes.c_int
    sgemm = ctypes.CFUNCTYPE(None, *([ctypes.c_int] * 3 + [integer] * 3 + [ctypes.c_float, ctypes.c_void_p, integer, ctypes.c_void_p, integer,
                                                                          ctypes.c_float, ctypes.c_void_p, integer]))(blas.sgemm)
    return Library(blas.name, sgemm)


def gemms(path: Path) -> list[tuple[bool, bool, int, int, int, int]]:
    """The train program's gemms: (A transposed, B transposed, m, n, k, batch), row-major."""
    from sexpgpu.runtime.lower.blas import CUBLAS_OP_N
    from sexpgpu.runtime.lower.fusion import lower
    from sexpgpu.runtime.lower.images import ConvStep
    from sexpgpu.runtime.lower.steps import GemmCall

    experiment = experiment_of(path)
    lowering = lower(experiment.module.programs["train"])
    out = []
    for step in lowering.steps:
        calls = step.calls if isinstance(step, GemmCall) else step.gemms if isinstance(step, ConvStep) else []
        for call in calls:
            # cuBLAS's column-major C = A B is row-major C^T = B^T A^T: swap back
            out.append((call.op_b != CUBLAS_OP_N, call.op_a != CUBLAS_OP_N, call.n, call.m, call.k, call.batch))
    return out


def seconds(library: Library, shape: tuple[bool, bool, int, int, int, int], operands: tuple[np.ndarray, np.ndarray, np.ndarray]) -> float:
    ta, tb, m, n, k, batch = shape
    a, b, c = operands
    lda, ldb = (m if ta else k), (k if tb else n)

    def once() -> None:
        for _ in range(batch):
            library.sgemm(ROW_MAJOR, TRANS if ta else NO_TRANS, TRANS if tb else NO_TRANS, m, n, k, 1.0, a.ctypes.data, lda, b.ctypes.data, ldb, 0.0,
                          c.ctypes.data, n)

    once()
    best = float("inf")
    for _ in range(5):
        count, start = 0, time.perf_counter()
        while True:
            once()
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed > 0.02:
                break
        best = min(best, elapsed / count)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    with threadpool_limits(limits=1, user_api="blas"):
        compare([library for library in (device_blas("numpy"), device_blas("mkl")) if library is not None])


def compare(libraries: list[Library]) -> None:
    rng = np.random.default_rng(0)
    print("GF/s of each workload's train gemms together, one thread (higher is better)")
    print(f"{'workload':<48} {'gemms':>5} " + " ".join(f"{lib.name[:26]:>26}" for lib in libraries))
    with tempfile.TemporaryDirectory() as tmp:
        for workload in workloads(Path(tmp), 10):
            shapes = gemms(workload.path)
            flops = sum(2 * m * n * k * batch for _, _, m, n, k, batch in shapes)
            operands = [(rng.standard_normal(m * k, dtype=np.float32), rng.standard_normal(k * n, dtype=np.float32), np.zeros(m * n, dtype=np.float32))
                        for _, _, m, n, k, _ in shapes]
            total = {lib.name: 0.0 for lib in libraries}
            for shape, ops in zip(shapes, operands):
                for lib in libraries:
                    total[lib.name] += seconds(lib, shape, ops)
            cells = [f"{flops / total[lib.name] / 1e9:>26.1f}" for lib in libraries]
            print(f"{workload.name:<48} {len(shapes):>5} " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
