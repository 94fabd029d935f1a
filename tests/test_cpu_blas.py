"""Which BLAS the compiled CPU device calls (runtime/cpu/device.py find_blas): MKL on an Intel
core where the `mkl` wheel is installed, else NumPy's (OpenBLAS); $SEXPGPU_BLAS names one. MKL
is linked into a library of ours loaded privately, so it never meets another MKL in the
process (PyTorch's, linked in statically): checked with the dynamic linker's own log."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from sexpgpu.ir.dtypes import DType
from sexpgpu.runtime.cpu.device import CpuRunner, CpuRuntime, cpu_vendor, find_blas, mkl_files
from sexpgpu.runtime.cpu.toolchain import Toolchain, open_toolchain
from sexpgpu.runtime.lower.blas import BlasCall, Operand

needs_mkl = pytest.mark.skipif(mkl_files() is None, reason="the mkl wheel is a dependency on x86-64 Linux only")


@pytest.fixture(scope="module")
def toolchain(tmp_path_factory: pytest.TempPathFactory) -> Toolchain:
    return open_toolchain({**os.environ, "SEXPGPU_CACHE": str(tmp_path_factory.mktemp("cache"))})


def test_the_default_is_mkl_on_an_intel_core_and_numpys_blas_elsewhere_or_when_told(toolchain: Toolchain) -> None:
    intel = cpu_vendor() == "GenuineIntel" and mkl_files() is not None
    assert find_blas(toolchain, {}).name.startswith("MKL" if intel else "openblas")
    assert find_blas(toolchain, {"SEXPGPU_BLAS": "numpy"}).name.startswith("openblas")
    with pytest.raises(ValueError, match=r"SEXPGPU_BLAS='openblas': use one of auto, mkl, numpy"):
        find_blas(toolchain, {"SEXPGPU_BLAS": "openblas"})


@needs_mkl
def test_mkl_is_what_it_says_and_its_products_are_right_in_every_layout(toolchain: Toolchain) -> None:
    """MKL's sgemm through the device's runner: the four transposes, with leading dimensions
    wider than the operands and offsets into them, against f64 products."""
    blas = find_blas(toolchain, {"SEXPGPU_BLAS": "mkl"})
    assert blas.name.startswith("MKL 20") and blas.name.endswith("sequential") and not blas.int64
    runner = CpuRunner(CpuRuntime(toolchain, blas=blas))
    rng = np.random.default_rng(3)
    m, n, k, pad = 37, 53, 29, 3
    for op_a in (0, 1):
        for op_b in (0, 1):
            # column-major, as cuBLAS: A is m x k (k x m stored when transposed), B k x n, C m x n
            a_rows, a_cols = (k, m) if op_a else (m, k)
            b_rows, b_cols = (n, k) if op_b else (k, n)
            a = rng.standard_normal((a_cols, a_rows + pad)).astype(np.float32)
            b = rng.standard_normal((b_cols, b_rows + pad)).astype(np.float32)
            c = np.full((n, m + pad), 7.0, dtype=np.float32)
            call = BlasCall(op_a=op_a, op_b=op_b, m=m, n=n, k=k, a=Operand(ld=a_rows + pad, offset=1), b=Operand(ld=b_rows + pad, offset=2),
                            c=Operand(ld=m + pad, offset=1), in_dtype=DType.f32, out_dtype=DType.f32)
            runner.gemm(call, a.ravel(), b.ravel(), c.ravel())
            a64 = a[:, 1:1 + a_rows].astype(np.float64).T
            b64 = b[:, 2:2 + b_rows].astype(np.float64).T
            want = (a64.T if op_a else a64) @ (b64.T if op_b else b64)
            np.testing.assert_allclose(c[:, 1:1 + m].T, want, rtol=1e-4, atol=1e-4)
            assert (c[:, 0] == 7.0).all() and (c[:, 1 + m:] == 7.0).all(), "written outside C"


@needs_mkl
def test_the_pieces_probe_says_what_the_runner_sees_with_mkl(toolchain: Toolchain) -> None:
    """The pool splits products only where the BLAS gives a piece the whole product's bits:
    the probe's verdict for MKL against the runner's own whole products and pieces."""
    runtime = CpuRuntime(toolchain, threads=2, blas=find_blas(toolchain, {"SEXPGPU_BLAS": "mkl"}))
    single = CpuRunner(CpuRuntime(toolchain, threads=1, blas=runtime.blas))
    rng = np.random.default_rng(11)
    exact = True
    for m, n, k in ((128, 768, 128), (768, 200, 96), (100, 300, 256)):
        a, b = rng.standard_normal(m * k).astype(np.float32), rng.standard_normal(k * n).astype(np.float32)
        whole = np.zeros(m * n, dtype=np.float32)
        single.gemm(BlasCall(op_a=0, op_b=0, m=m, n=n, k=k, a=Operand(ld=m), b=Operand(ld=k), c=Operand(ld=m), in_dtype=DType.f32, out_dtype=DType.f32), a, b, whole)
        width = 64
        pieces = np.zeros(m * n, dtype=np.float32)
        for at in range(0, n, width):
            span = min(width, n - at)
            single.gemm(BlasCall(op_a=0, op_b=0, m=m, n=span, k=k, a=Operand(ld=m), b=Operand(ld=k, offset=at * k), c=Operand(ld=m, offset=at * m),
                                 in_dtype=DType.f32, out_dtype=DType.f32), a, b, pieces)
        exact = exact and np.array_equal(whole, pieces)
    if not exact:
        assert not runtime.split_gemms
    assert runtime.split_gemms == runtime.pieces_available()


@needs_mkl
def test_mkl_stays_out_of_the_global_scope_so_torchs_own_mkl_is_left_alone(tmp_path: Path) -> None:
    """Loaded first, our MKL must not take over PyTorch's calls into its statically linked MKL
    (a library loaded with RTLD_GLOBAL would: the linker's log shows libtorch_cpu bound to it),
    and neither side's products change."""
    pytest.importorskip("torch")
    script = textwrap.dedent("""
        import ctypes, os
        import numpy as np
        from sexpgpu.runtime.cpu.device import find_blas
        from sexpgpu.runtime.cpu.toolchain import open_toolchain
        blas = find_blas(open_toolchain(), {"SEXPGPU_BLAS": "mkl"})
        everyone = ctypes.CDLL(None)
        leaked = [s for s in ("cblas_sgemm", "mkl_blas_sgemm", "MKL_Get_Version_String") if hasattr(everyone, s)]
        assert not leaked, leaked
        import torch
        a = np.random.default_rng(0).standard_normal((300, 300)).astype(np.float32)
        got = (torch.from_numpy(a) @ torch.from_numpy(a)).numpy()
        np.testing.assert_allclose(got, a.astype(np.float64) @ a, rtol=1e-4, atol=1e-3)
        print("ok", blas.name)
    """)
    log = tmp_path / "ld"
    env = {**os.environ, "LD_DEBUG": "bindings", "LD_DEBUG_OUTPUT": str(log), "SEXPGPU_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("ok MKL"), done.stdout + done.stderr[-3000:]
    lines = [line for path in tmp_path.glob("ld.*") for line in path.read_text(errors="replace").splitlines()]
    assert any("libmkl_core" in line for line in lines), "the linker's log holds no MKL binding: it did not log"
    crossed = [line for line in lines if "libtorch_cpu" in line.split(" to ")[0] and "/libmkl_" in line.partition(" to ")[2]]
    assert not crossed, crossed[:3]


def test_a_continued_run_is_told_when_its_blas_changed() -> None:
    from sexpgpu.runtime.threads import ThreadPlan, departs_from

    recorded = ThreadPlan(blas=2, cores=2, source="chosen", reason="both cores free", library="openblas 0.3.31")
    now = recorded.model_copy(update={"library": "MKL 2026.2 sequential"})
    said = departs_from(now, recorded)
    assert said is not None and "computed their products with openblas 0.3.31, this one with MKL 2026.2 sequential" in said and "SEXPGPU_BLAS" in said
    assert departs_from(recorded, recorded) is None
    assert departs_from(now, recorded.model_copy(update={"library": ""})) is None  # an older run.json names none



def test_run_refuses_a_blas_variable_it_cannot_follow_before_anything_runs(tmp_path: Path) -> None:
    shutil.copy(REPO / "examples" / "quickstart.lisp", tmp_path / "quickstart.lisp")
    done = subprocess.run([sys.executable, "-m", "sexpgpu", "run", "quickstart.lisp", "--max-steps", "2", "--quiet"], cwd=tmp_path,
                          capture_output=True, text=True, env={**os.environ, "SEXPGPU_BLAS": "openblas"}, timeout=120)
    assert done.returncode == 2 and "$SEXPGPU_BLAS='openblas': use one of auto, mkl, numpy" in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()


def test_doctor_warns_where_openblas_is_pinned_to_kernels_without_the_cpus_avx512(tmp_path: Path) -> None:
    """$OPENBLAS_CORETYPE=Haswell on a core with AVX-512 (as this project's machines set it):
    a warning naming the kernels and the fix; pinned to the kernels OpenBLAS picks there, or
    on a core without AVX-512, an ok line; unset, no line."""
    with open("/proc/cpuinfo") as info:
        avx512 = any(line.startswith("flags") and "avx512f" in line.split() for line in info)

    def finding(**changes: str) -> list[dict[str, str]]:
        env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
        done = subprocess.run([sys.executable, "-m", "sexpgpu", "doctor", "--json", "--store", str(tmp_path / "runs")], cwd=tmp_path,
                              capture_output=True, text=True, env={**env, **changes, "SEXPGPU_DEVICE": "numpy"}, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return [f for f in json.loads(done.stdout)["findings"] if f["check"] == "openblas"]

    assert finding() == []
    (haswell,) = finding(OPENBLAS_CORETYPE="Haswell")
    assert haswell["detail"].startswith("$OPENBLAS_CORETYPE=Haswell: OpenBLAS runs its Haswell kernels"), haswell
    if avx512:
        assert haswell["level"] == "warn" and "without this CPU's AVX-512" in haswell["detail"], haswell
        assert haswell["fix"].startswith("unset OPENBLAS_CORETYPE"), haswell
        (picked,) = finding(OPENBLAS_CORETYPE="SkylakeX")
        assert picked["level"] == "ok" and picked["detail"] == "$OPENBLAS_CORETYPE=SkylakeX: OpenBLAS runs its SkylakeX kernels", picked
    else:
        assert haswell["level"] == "ok", haswell
