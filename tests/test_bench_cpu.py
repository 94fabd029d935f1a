"""The CPU benchmarks' own parts: the FMA-peak microkernel (bench/cpu_peak.c) compiles and
measures, the machine description names what ran, and the workloads carry issue 25's four
realistic shapes with their training step's FLOPs by the op table."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import cpu_peak  # noqa: E402
import cpu_workloads  # noqa: E402

from sexpgpu.runtime.cpu.toolchain import find_compiler  # noqa: E402

FLAGS = set(cpu_peak.cpuinfo().get("flags", "").split())
needs_avx2 = pytest.mark.skipif("avx2" not in FLAGS, reason="this CPU has no AVX2: the microkernel measures nothing here")


@needs_avx2
def test_the_peak_microkernel_compiles_and_prints_a_positive_peak() -> None:
    done = subprocess.run([sys.executable, str(REPO / "bench" / "cpu_peak.py"), "--millions", "2", "--threads", "1,2", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    peaks = {(p["isa"], p["threads"]): p for p in report["peaks"]}
    assert ("avx2", 1) in peaks and ("avx2", 2) in peaks
    assert ("avx512", 1) in peaks or "avx512f" not in FLAGS
    assert len(peaks[("avx2", 2)]["thread_gflops"]) == 2
    assert all(g > 0 for p in peaks.values() for g in [p["wall_gflops"], *p["thread_gflops"]])
    assert report["f32_peak_per_core"] > 0
    assert report["machine"]["simd"] and set(report["machine"]["simd"]) <= FLAGS


@needs_avx2
def test_an_isa_the_compiler_did_not_target_is_reported_unsupported() -> None:
    """-mno-avx512f: the binary says it cannot measure AVX-512 instead of printing a number."""
    with tempfile.TemporaryDirectory() as scratch:
        binary = Path(scratch) / "peak"
        subprocess.run([find_compiler(), "-O3", "-march=native", "-mno-avx512f", "-pthread", "-o", str(binary), str(cpu_peak.SOURCE)], check=True)
        assert cpu_peak.run(binary, "avx512", 1, 0.1) is None
        measured = cpu_peak.run(binary, "avx2", 1, 0.5)
        assert measured is not None and measured.per_core > 0


def test_the_machine_names_the_blas_kernels_that_ran() -> None:
    import numpy as np

    np.ones((64, 64), dtype=np.float32) @ np.ones((64, 64), dtype=np.float32)
    described = cpu_peak.machine()
    json.dumps(described)
    blas = [b for b in described["blas"] if b["api"] == "openblas"]
    assert blas and all(b["architecture"] for b in blas)
    assert any(f"kernels: {blas[0]['architecture']}" in line for line in cpu_peak.describe(described))


def test_the_benches_carry_issue_25s_four_workloads_with_their_step_flops() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        chosen = [w for w in cpu_workloads.workloads(Path(tmp), 200) if cpu_workloads.chosen(w, "", issue=True)]
        assert [w.model for w in chosen] == ["mlp", "char_transformer", "vgg", "char_transformer"]
        wide = cpu_workloads.step_flops(cpu_workloads.experiment_of(chosen[0].path))
    # the wide MLP's gemms: forward and weight gradients of all three layers, the input gradients of the last two
    gemms = 2 * 256 * (3 * (1024 * 1024 + 1024 * 10) + 2 * 784 * 1024)
    assert gemms <= wide <= 1.01 * gemms


def test_torch_s_own_kernels_are_named() -> None:
    """MKL's and oneDNN's verbose modes, in a child process, say which code path each chose."""
    torch = pytest.importorskip("torch")
    config = torch.__config__.show()
    found = cpu_peak.torch_kernels()
    if "USE_MKL=ON" in config:
        assert found["mkl"] != "not reported" and "architecture" in found["mkl"]
    if "USE_MKLDNN=ON" in config:
        assert found["onednn"] != "not reported"


def test_our_side_reports_the_compile_apart_and_a_warm_cache_compiles_nothing() -> None:
    """The first build into an empty kernel cache runs the C compiler; a second build of the same
    workload finds every kernel there (compile time 0) and trains to the same first losses."""
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as cache:
        quickstart = next(w for w in cpu_workloads.workloads(Path(tmp), 10) if w.name.startswith("quickstart"))
        cold = cpu_workloads.OurSide(quickstart, "cpu", Path(cache))
        warm = cpu_workloads.OurSide(quickstart, "cpu", Path(cache))
        assert any(Path(cache).rglob("*.so"))
    assert cold.compile_s > 0 and not cold.cache_warm
    assert warm.compile_s == 0 and warm.cache_warm
    assert cold.build_s <= cold.setup_s and warm.first_losses == cold.first_losses


def test_the_thread_bench_reports_the_rules_inputs_and_its_choice() -> None:
    """bench/cpu_threads.py (the thread rule's measurements): per workload the features the
    plan reads, whether the pieces are in use (here the environment's BLAS kernels decide),
    one and two threads' rates and what the plan chose."""
    done = subprocess.run([sys.executable, str(REPO / "bench" / "cpu_threads.py"), "--only", "quickstart", "--repeats", "1", "--steps", "20", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout[done.stdout.index("["):])
    assert (row["product_macs"], row["largest_product"]) == (53_248, 12_288)
    assert row["default_threads"] == [1], "the quickstart's step is too small for two threads, pieces or not"
    assert row["steps_per_s_1t"] > 0 and row["steps_per_s_2t"] > 0 and isinstance(row["pieces"], bool)
