"""Every generated kernel as a GPU would meet it, without one: NVRTC (the nvidia-cuda-nvrtc
wheel of the test extra) with the options CuPy passes, then ptxas for sm_90 (the
nvidia-cuda-nvcc wheel), in parallel, cached by source hash under the kernel cache. Every
kernel of tests/kernel_census.py compiles without an error or a warning (but an unused
variable's), spills nothing and stays within sm_90's limits; the check itself catches each of
those; what it builds is the precompiled cache the CUDA device loads, and packed and unpacked
elsewhere it is found there."""

from __future__ import annotations

import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from sexpgpu.ir.dtypes import DType
from sexpgpu.runtime.cuda import cubins, nvrtc
from sexpgpu.runtime.lower.codegen import KernelSource, Param, assemble

try:
    nvrtc.find_nvrtc(), nvrtc.find_ptxas()
except nvrtc.Toolchain as exc:
    pytest.skip(f"{exc}", allow_module_level=True)


def kernel(name: str, body: str, params: int = 1) -> KernelSource:
    """A hand-written kernel of PARAMS float arrays."""
    decls = ", ".join(f"float* __restrict__ p{k}" for k in range(params))
    source = f'extern "C" __global__ void {name}({decls}, long long n) {{\n{body}\n}}\n'
    return KernelSource(name=name, source=source, params=[Param("out", k, DType.f32, (4,)) for k in range(params)], size=4, flops=0, bytes=0)


@pytest.mark.slow  # cold, about 70 s on two cores; warm (after bench/gpu_ready.py in .ci/run), the 20 s listing
def test_every_kernel_compiles_for_sm_90_without_a_spill_and_within_its_limits() -> None:
    import kernel_census

    sources = kernel_census.census()
    every = {name: k for kernels in sources.values() for name, k in kernels.items()}
    assert all(len(k) > 100 for k in sources.values()), {n: len(k) for n, k in sources.items()}
    report = nvrtc.check(list(every.values()))
    assert not report.failures, "\n".join(report.failures[:40])
    assert {k.name for k in report.kernels} == set(every), set(every) ^ {k.name for k in report.kernels}
    assert max(k.param_bytes for k in report.kernels) <= nvrtc.PARAM_BYTES
    print(f"{len(report.kernels)} kernels in {report.units} units ({report.built} built now): at most {max(k.registers for k in report.kernels)} registers, "
          f"{max(k.static_shared for k in report.kernels)} B static shared, {max(k.param_bytes for k in report.kernels)} B of parameters, no spill")


def test_the_check_fails_an_error_a_warning_a_spill_and_each_limit(tmp_path: Path) -> None:
    unused = kernel("sx_unused", "  const int lanes = 32;\n  p0[0] = 1.0f;")
    broken = kernel("sx_broken", "  p0[0] = undeclared_name;")
    warned = kernel("sx_warned", "  int x; p0[0] = (float)x;")  # used before it is set
    # 320 values, each needed until the end: more than 255 registers hold
    spilled = kernel("sx_spilled", "  float a[320];\n#pragma unroll\n  for (int k = 0; k < 320; ++k) a[k] = sqrtf(p0[k] * (float)n);\n  float s = 0.0f;\n"
                     "#pragma unroll\n  for (int k = 0; k < 320; ++k) s = s * a[k] + a[319 - k];\n  p0[0] = s;")
    shared = kernel("sx_shared", "  __shared__ float s[12800];\n  s[threadIdx.x] = p0[0]; __syncthreads(); p0[1] = s[(int)n];")
    wide = kernel("sx_wide", "  p0[0] = 1.0f;", params=520)
    heavy = replace(spilled, name="sx_heavy", source=spilled.source.replace("sx_spilled", "sx_heavy"), threads=512)  # launched with 512 threads
    report = nvrtc.check([unused, broken, warned, spilled, shared, wide, heavy], root=tmp_path, workers=2)
    failures = "\n".join(report.failures)
    assert not [f for f in report.failures if f.startswith("sx_unused")], failures
    assert any(f.startswith("sx_broken: ") and "undeclared_name" in f for f in report.failures), failures
    assert any(f.startswith("sx_warned: ") and "warning" in f for f in report.failures), failures
    assert any(f.startswith("sx_spilled: spills") for f in report.failures), failures
    assert any(f.startswith("sx_shared: ") and "too much shared data" in f for f in report.failures), failures  # ptxas refuses it itself
    assert any(f.startswith("sx_heavy: 255 registers x 512 threads > 65536") for f in report.failures), failures
    assert any(f.startswith("sx_wide: 4168 B of parameters > 4096") for f in report.failures), failures
    # a kernel with too many pointers for the parameter space is generated with a device array of them
    generated = assemble("sx_many", [f"const float* __restrict__ in{k}" for k in range(600)], "i", ["    (void)in0;"],
                         [Param("in", k, DType.f32, (4,)) for k in range(600)], 4, 0)
    (fine,) = nvrtc.check([generated], root=tmp_path).kernels
    assert generated.table and fine.param_bytes == 16 and not fine.problems, fine


def test_what_the_check_builds_is_the_cache_the_device_reads_and_it_travels(tmp_path: Path) -> None:
    here, there = tmp_path / "here", tmp_path / "there"
    first = [kernel(f"sx_k_{k:02x}0000000000", f"  p0[0] = {k}.0f;") for k in range(3)]
    report = nvrtc.check(first, root=here)
    assert report.built == report.units == 3 and not report.failures
    for k in first:
        found = cubins.lookup(k, nvrtc.ARCH, here)
        assert found is not None and found.read_bytes()[:4] == b"\x7fELF", k.name
    # unchanged: nothing is built again; a changed kernel rebuilds its own unit only
    assert nvrtc.check(first, root=here).built == 0
    changed = [first[0], first[1], kernel(first[2].name, "  p0[0] = -1.0f;")]
    again = nvrtc.check(changed, root=here)
    assert again.built == 1 and cubins.lookup(changed[2], nvrtc.ARCH, here) is not None
    assert cubins.lookup(kernel("sx_k_ff0000000000", "  p0[0] = 9.0f;"), nvrtc.ARCH, here) is None  # a miss: the device compiles it
    count, missing = cubins.pack(changed, tmp_path / "cubins.tar.gz", nvrtc.ARCH, here)
    assert count == 3 and not missing
    with tarfile.open(tmp_path / "cubins.tar.gz") as tar:
        tar.extractall(there, filter="data")
    for k in changed:
        found = cubins.lookup(k, nvrtc.ARCH, there)
        assert found is not None and found.is_relative_to(there.resolve()), k.name


def test_a_unit_that_does_not_build_is_built_a_kernel_at_a_time(tmp_path: Path) -> None:
    """Kernels sharing a unit: the broken one is named, the others still get their cubins."""
    good, bad = kernel("sx_a_120000000000", "  p0[0] = 1.0f;"), kernel("sx_b_120000000000", "  p0[0] = nope;")
    report = nvrtc.check([good, bad], root=tmp_path)
    assert report.failures and all(f.startswith("sx_b_120000000000: ") for f in report.failures), report.failures
    assert cubins.lookup(good, nvrtc.ARCH, tmp_path) is not None and cubins.lookup(bad, nvrtc.ARCH, tmp_path) is None


def test_nvrtc_gets_cupys_options() -> None:
    """The device's options, -ftz=true as CuPy appends it, for compute_90 (then ptxas: sm_90)."""
    assert nvrtc.options(cubins.COMPILE_OPTIONS) == ("--std=c++14", "--fmad=false", "-ftz=true", "-arch=compute_90")
