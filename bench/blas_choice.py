"""Which BLAS the compiled CPU device should call: cblas_sgemm's GF/s at the products of the
CPU benchmarks' workloads (bench/cpu_workloads.py: each train program's gemms, as the lowering
plans them, the transposes included), for the BLAS NumPy links against (OpenBLAS in the
wheels: what the device calls) and, when given, MKL (`--mkl DIR`, a folder holding
libmkl_rt.so* and libiomp5.so, e.g. the `mkl` and `intel-openmp` wheels unpacked). The
libraries alternate shape by shape, the best of several timings kept; each workload's line is
the GF/s of all its gemms together (their FLOPs over their summed times).

    python bench/blas_choice.py [--mkl DIR] [--threads 1,2]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from cpu_workloads import experiment_of, workloads

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


class Library:
    def __init__(self, name: str, sgemm: Any, set_threads: Callable[[int], None]) -> None:
        self.name, self.sgemm, self.set_threads = name, sgemm, set_threads


def numpy_blas() -> Library:
    from threadpoolctl import ThreadpoolController

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from sexpgpu.runtime.cpu.device import find_blas

    blas = find_blas()
    integer = ctypes.c_int64 if blas.int64 else ctypes.c_int
    sgemm = ctypes.CFUNCTYPE(None, *([ctypes.c_int] * 3 + [integer] * 3 + [ctypes.c_float, ctypes.c_void_p, integer, ctypes.c_void_p, integer,
                                                                          ctypes.c_float, ctypes.c_void_p, integer]))(blas.sgemm)
    controller = ThreadpoolController()
    return Library(f"NumPy's {blas.name}", sgemm, lambda n: controller.limit(limits=n, user_api="blas"))


def mkl(folder: Path) -> Optional[Library]:
    omp = next(folder.rglob("libiomp5.so"), None)
    rt = next(folder.rglob("libmkl_rt.so*"), None)
    if omp is None or rt is None:
        return None
    ctypes.CDLL(str(omp), mode=ctypes.RTLD_GLOBAL)
    library = ctypes.CDLL(str(rt), mode=ctypes.RTLD_GLOBAL)
    library.MKL_Get_Version_String.argtypes = [ctypes.c_char_p, ctypes.c_int]
    buffer = ctypes.create_string_buffer(256)
    library.MKL_Get_Version_String(buffer, 256)
    sgemm = library.cblas_sgemm
    sgemm.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
    sgemm.restype = None
    library.MKL_Set_Num_Threads.argtypes = [ctypes.c_int]
    return Library(buffer.value.decode().split("Product")[0].strip(), sgemm, library.MKL_Set_Num_Threads)


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
    parser.add_argument("--mkl", type=Path, default=None)
    parser.add_argument("--threads", default="1,2")
    args = parser.parse_args()
    libraries = [numpy_blas()]
    if args.mkl is not None:
        found = mkl(args.mkl)
        if found is None:
            raise SystemExit(f"--mkl {args.mkl}: no libmkl_rt.so and libiomp5.so under it")
        libraries.append(found)
    threads = [int(t) for t in args.threads.split(",")]
    rng = np.random.default_rng(0)
    print("GF/s of each workload's train gemms together (higher is better)")
    print(f"{'workload':<48} {'gemms':>5} " + " ".join(f"{lib.name[:22] + ' ' + str(t) + 't':>26}" for t in threads for lib in libraries))
    with tempfile.TemporaryDirectory() as tmp:
        for workload in workloads(Path(tmp), 10):
            shapes = gemms(workload.path)
            flops = sum(2 * m * n * k * batch for _, _, m, n, k, batch in shapes)
            operands = [(rng.standard_normal(m * k, dtype=np.float32), rng.standard_normal(k * n, dtype=np.float32), np.zeros(m * n, dtype=np.float32))
                        for _, _, m, n, k, _ in shapes]
            cells = []
            for t in threads:
                total = {lib.name: 0.0 for lib in libraries}
                for shape, ops in zip(shapes, operands):
                    for lib in libraries:
                        lib.set_threads(t)
                        total[lib.name] += seconds(lib, shape, ops)
                cells += [f"{flops / total[lib.name] / 1e9:>26.1f}" for lib in libraries]
            print(f"{workload.name:<48} {len(shapes):>5} " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
