"""Whether the CUDA path is ready for a GPU, on a machine without one, in one command:

    python bench/gpu_ready.py [--workers N] [--no-install] [--pack .gpu-wheels/cubins.tar.gz]

1. Every kernel the device can be asked for (tests/kernel_census.py: the examples in f32 and
   bf16 with every lane and reduction choice, every op-table case, the benchmark
   configurations) through NVRTC and ptxas for sm_90, with CuPy's options
   (sexpgpu/runtime/cuda/nvrtc.py), in parallel, cached by source hash under the kernel cache
   (`$SEXPGPU_CACHE/cubins/sm_90`): the count, the largest registers, static shared memory
   and parameter bytes, the spills, and every failure (a compile error, a warning but an
   unused variable's, a spill, a limit of sm_90 exceeded).
2. With --pack, the cubins of those kernels as the archive bench/gpu_check.sh unpacks into
   the GPU machine's kernel cache.
3. Unless --no-install, the simulated GPU machine (tests/gpu_machine.py): a fresh venv with
   no registry, numpy, ml-dtypes and cupy, bench/gpu_check.sh's install lines as they are,
   then `pytest --collect-only` of the GPU tests.

The last line is one JSON object: kernels, failures, spills, max_registers,
max_static_shared, max_param_bytes, install_ok, gpu_tests_collected (null with
--no-install). Exit 0 when there is no failure (and the install worked), else 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))


def kernel_check(workers: Optional[int]) -> tuple[dict[str, Any], list[Any], Any]:
    """The census and the check: (counts per source, the kernels, the report)."""
    import kernel_census
    from sexpgpu.runtime.cuda.nvrtc import check

    began = time.perf_counter()
    sources = kernel_census.census()
    every = {name: k for kernels in sources.values() for name, k in kernels.items()}
    print(f"kernels: {len(every)} distinct ({', '.join(f'{n} {len(k)}' for n, k in sources.items())}), listed in {time.perf_counter() - began:.1f} s", flush=True)
    began = time.perf_counter()
    report = check(list(every.values()), workers=workers)
    print(f"NVRTC {report.nvrtc} + ptxas sm_90: {report.units} units, {report.built} built now, {report.units - report.built} from the cache, "
          f"{time.perf_counter() - began:.1f} s", flush=True)
    return {n: len(k) for n, k in sources.items()}, list(every.values()), report


def summary(report: Any) -> dict[str, Any]:
    kernels = report.kernels
    return {
        "kernels": len(kernels),
        "failures": len(report.failures),
        "spills": sum(1 for k in kernels if k.spill_bytes),
        "max_registers": max((k.registers for k in kernels), default=0),
        "max_static_shared": max((k.static_shared for k in kernels), default=0),
        "max_param_bytes": max((k.param_bytes for k in kernels), default=0),
    }


def print_report(report: Any) -> None:
    kernels = report.kernels
    for title, key in (("registers", lambda k: k.registers), ("static shared bytes", lambda k: k.static_shared), ("parameter bytes", lambda k: k.param_bytes)):
        top = sorted(kernels, key=key, reverse=True)[:3]
        print(f"most {title}: " + ", ".join(f"{k.name} {key(k)}" for k in top))
    for failure in report.failures:
        print(f"FAILED {failure}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=None, help="compiles at a time (default: the CPUs)")
    parser.add_argument("--no-install", action="store_true", help="skip the simulated GPU machine")
    parser.add_argument("--pack", type=Path, default=None, help="write the kernels' cubins to this archive (for .gpu-wheels)")
    args = parser.parse_args()

    _, every, report = kernel_check(args.workers)
    print_report(report)
    result: dict[str, Any] = summary(report)
    result["install_ok"], result["gpu_tests_collected"] = None, None
    with tempfile.TemporaryDirectory(prefix="sexpgpu-gpu-machine-") as work:
        archive = args.pack or Path(work) / "cubins.tar.gz"
        if args.pack is not None or not args.no_install:
            from sexpgpu.runtime.cuda.cubins import pack
            from sexpgpu.runtime.cuda.nvrtc import ARCH

            count, missing = pack(every, archive, ARCH)
            print(f"packed {count} cubins into {archive} ({archive.stat().st_size / 2**20:.1f} MiB); {len(missing)} without one", flush=True)
        if not args.no_install:
            import gpu_machine

            machine = gpu_machine.simulate(Path(work) / "machine", archive)
            print(machine.log_tail, flush=True)
            print(f"simulated GPU machine: install {'worked' if machine.install_ok else 'FAILED'}, {len(machine.collected)} GPU tests collected"
                  f"{', not collected: ' + ', '.join(machine.missing) if machine.missing else ''}; {machine.kernels_found} precompiled kernels found in its cache",
                  flush=True)
            result["install_ok"] = machine.install_ok and not machine.missing and machine.kernels_found == len(every)
            result["gpu_tests_collected"] = len(machine.collected)
    print(json.dumps(result), flush=True)
    return 0 if result["failures"] == 0 and result["install_ok"] is not False else 1


if __name__ == "__main__":
    sys.exit(main())
