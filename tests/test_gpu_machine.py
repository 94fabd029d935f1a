"""bench/gpu_check.sh on a simulated GPU machine (tests/gpu_machine.py): a fresh Python with
numpy, ml-dtypes and CuPy only, no registry, `.gpu-wheels` from bench/gpu_wheels.sh. Its
install lines, as written, install sexpgpu and what the tests need; pytest then collects every
CUDA and NCCL test; the precompiled kernels it carries land where the CUDA device finds them."""

from __future__ import annotations

from pathlib import Path

import pytest

import gpu_machine
from sexpgpu.runtime.cuda import cubins, nvrtc


@pytest.mark.slow
def test_the_gpu_check_installs_and_collects_every_gpu_test_on_a_bare_machine(tmp_path: Path) -> None:
    import kernel_census

    try:
        nvrtc.find_nvrtc(), nvrtc.find_ptxas()
    except nvrtc.Toolchain as exc:
        pytest.skip(str(exc))
    # the quickstart's kernels, precompiled here and carried as bench/gpu_wheels.sh packs them
    kernels = list(kernel_census.program_kernels(kernel_census.compiled_programs(gpu_machine.REPO / "examples" / "quickstart.lisp")[0]).values())
    report = nvrtc.check(kernels, root=tmp_path / "here")
    assert not report.failures, report.failures
    count, missing = cubins.pack(kernels, tmp_path / "cubins.tar.gz", nvrtc.ARCH, tmp_path / "here")
    assert count == len(kernels) and not missing
    machine = gpu_machine.simulate(tmp_path / "machine", tmp_path / "cubins.tar.gz")
    assert machine.install_ok, machine.log_tail
    assert not machine.missing, f"not collected: {machine.missing}\n{machine.log_tail}"
    assert len(machine.collected) >= len(gpu_machine.test_functions()) > 10, machine.collected
    assert machine.kernels_found == len(kernels), machine.log_tail
    for kernel in kernels:
        assert cubins.lookup(kernel, nvrtc.ARCH, tmp_path / "machine" / "machine-cache") is not None, kernel.name


def test_the_install_lines_are_the_scripts_and_name_what_the_tests_import() -> None:
    """The simulation runs the script's own lines: they install from .gpu-wheels what a bare
    machine lacks (setuptools and wheel to build the editable install, the test runner's
    plugins, the conftest's threadpoolctl) and unpack the precompiled kernels."""
    lines = gpu_machine.install_lines()
    for name in ("setuptools", "wheel", "threadpoolctl", "pytest-xdist", "execnet", "pydantic", "--no-index", "cubins.tar.gz", "--no-build-isolation -e ."):
        assert name in lines, name
    wheels = (gpu_machine.REPO / "bench" / "gpu_wheels.sh").read_text()
    for name in ("setuptools", "wheel", "threadpoolctl==", "pytest-xdist==", "execnet=="):
        assert name in wheels, name
