"""The machine the CPU benchmarks ran on, and its cores' f32 FMA peak.

`machine()` describes the CPU (its model and SIMD flags from /proc/cpuinfo), the BLAS
libraries loaded in this process with the kernel architecture each chose (threadpoolctl:
OpenBLAS's `architecture` is its kernel set, Haswell or SkylakeX...), the OpenBLAS variables
that steer that choice, and, when given, torch's own build (its BLAS and the CPU capability its
kernels dispatch to). `peak()` compiles bench/cpu_peak.c with -O3 -march=native and runs it:
independent FMA chains on AVX-512 and AVX2 registers (and vdpbf16ps with avx512_bf16), at one
thread and at two; a thread's GFLOP/s is over its own CPU time, so it is the core's peak while
it runs, on a loaded machine too. The benches divide each workload's GFLOP/s (the op table's
FLOP count of a training step) by it.

    python bench/cpu_peak.py [--millions 50] [--threads 1,2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
SOURCE = Path(__file__).with_suffix(".c")
ISAS = ("avx512", "avx2", "bf16")
SIMD = ("sse4_2", "avx", "fma", "avx2", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
        "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
BLAS_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")


@dataclass(frozen=True)
class Peak:
    """One run of the microkernel: ISA at THREADS threads."""

    isa: str
    threads: int
    wall_gflops: float  # every thread's FLOPs over the wall time
    thread_gflops: list[float]  # each thread's FLOPs over its own CPU time

    @property
    def per_core(self) -> float:
        """The best thread's GFLOP/s: what one core does while it runs."""
        return max(self.thread_gflops)


def cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def device_blas() -> str:
    """The BLAS the compiled CPU device calls here (MKL on an Intel core, else NumPy's; $SEXPGPU_BLAS)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from sexpgpu.runtime.cpu.device import find_blas
    from sexpgpu.runtime.cpu.toolchain import NoCompiler, open_toolchain

    try:
        return find_blas(open_toolchain()).name
    except (NoCompiler, ValueError) as exc:
        return f"none ({exc})"


def machine(torch: Any = None) -> dict[str, Any]:
    """This machine as the benches print it; TORCH (the module) adds torch's own build."""
    from threadpoolctl import threadpool_info

    info = cpuinfo()
    flags = set(info.get("flags", "").split())
    described: dict[str, Any] = {
        "cpu": info.get("model name", "unknown"),
        "cores": len(os.sched_getaffinity(0)),
        "simd": [f for f in SIMD if f in flags],
        "blas": [{"library": Path(i["filepath"]).name, "api": i.get("internal_api"), "version": i.get("version"),
                  "architecture": i.get("architecture"), "threads": i.get("num_threads")}
                 for i in threadpool_info() if i.get("user_api") == "blas"],
        "env": {name: os.environ[name] for name in BLAS_VARIABLES if name in os.environ},
        "device_blas": device_blas(),
    }
    if torch is not None:
        config = torch.__config__.show()
        blas = [part.split("=", 1)[1] for line in config.splitlines() for part in line.replace(",", " ").split() if part.startswith("BLAS_INFO=")]
        versions = [line.strip(" -") for line in config.splitlines() if "Math Kernel Library Version" in line or "MKL-DNN v" in line]
        described["torch"] = {"version": torch.__version__, "capability": torch.backends.cpu.get_cpu_capability(),
                              "blas": blas[0] if blas else "unknown", "mkldnn": bool(torch.backends.mkldnn.is_available()),
                              "libraries": [v.split(" for ")[0].split(" (Git")[0] for v in versions], "kernels": torch_kernels()}
    return described


TORCH_PROBE = """
import torch
torch.set_num_threads(1)
a = torch.ones(256, 256)
a @ a
torch.nn.functional.conv2d(torch.ones(8, 16, 14, 14), torch.ones(16, 16, 3, 3), padding=1)
"""


def torch_kernels() -> dict[str, str]:
    """The code paths torch's MKL and oneDNN chose on this CPU, as their verbose modes say in a
    child process that runs one gemm and one convolution (this process's environment, plus the
    two verbose switches)."""
    env = dict(os.environ, MKL_VERBOSE="1", ONEDNN_VERBOSE="1")
    done = subprocess.run([sys.executable, "-c", TORCH_PROBE], capture_output=True, text=True, env=env, timeout=300)
    found = {"mkl": "not reported", "onednn": "not reported"}
    for line in (done.stdout + done.stderr).splitlines():
        if line.startswith("MKL_VERBOSE oneMKL") and " for " in line:
            found["mkl"] = line.split(" for ", 1)[1].split(",")[0]
        elif line.startswith("onednn_verbose") and ",isa:" in line:
            found["onednn"] = line.split(",isa:", 1)[1]
    return found


def describe(m: dict[str, Any]) -> list[str]:
    """MACHINE as lines of text."""
    env = ", ".join(f"{k}={v}" for k, v in m["env"].items()) or "none set"
    lines = [f"cpu: {m['cpu']} ({m['cores']} cores here), simd: {' '.join(m['simd']) or 'none'}",
             f"OpenBLAS variables: {env}"]
    lines += [f"NumPy's blas: {b['library']} ({b['api']} {b['version']}), kernels: {b['architecture']}, threads by default: {b['threads']}" for b in m["blas"]]
    lines.append(f"the compiled CPU device's blas: {m['device_blas']}")
    if "torch" in m:
        t = m["torch"]
        lines.append(f"torch {t['version']}: blas {t['blas']}, cpu capability {t['capability']}, oneDNN {'yes' if t['mkldnn'] else 'no'} "
                     f"({'; '.join(t['libraries'])}); MKL's code path: {t['kernels']['mkl']}; oneDNN's ISA: {t['kernels']['onednn']}")
    return lines


def build(folder: Path, compiler: Optional[str] = None) -> Path:
    """bench/cpu_peak.c compiled with -O3 -march=native into FOLDER (the CPU device's compiler)."""
    from sexpgpu.runtime.cpu.toolchain import find_compiler

    binary = folder / "cpu_peak"
    done = subprocess.run([compiler or find_compiler(), "-O3", "-march=native", "-pthread", "-o", str(binary), str(SOURCE)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"cannot compile {SOURCE.name}:\n{done.stderr[-2000:]}")
    return binary


def run(binary: Path, isa: str, threads: int, millions: float) -> Optional[Peak]:
    """One run of the microkernel; None when this CPU (or the compiler's -march=native) lacks ISA."""
    done = subprocess.run([str(binary), isa, str(threads), str(millions)], capture_output=True, text=True, check=True)
    words = done.stdout.split()
    if words[1] == "unsupported":
        return None
    return Peak(isa, int(words[1]), float(words[2]), [float(w) for w in words[3:]])


def peak(threads: tuple[int, ...] = (1, 2), millions: float = 50.0, repeats: int = 3) -> list[Peak]:
    """Each ISA's best of REPEATS runs at each thread count (the best: load only slows a run)."""
    found: list[Peak] = []
    with tempfile.TemporaryDirectory(prefix="cpu-peak-") as scratch:
        binary = build(Path(scratch))
        for isa in ISAS:
            for count in threads:
                runs = [r for r in (run(binary, isa, count, millions) for _ in range(repeats)) if r is not None]
                if runs:
                    found.append(max(runs, key=lambda r: r.per_core))
    return found


def f32_peak(peaks: list[Peak]) -> float:
    """One core's f32 FMA peak in GFLOP/s: the widest f32 ISA's best thread."""
    for isa in ("avx512", "avx2"):
        per_core = [p.per_core for p in peaks if p.isa == isa]
        if per_core:
            return max(per_core)
    return float("nan")


def peak_lines(peaks: list[Peak]) -> list[str]:
    names = {"avx512": "f32 FMA, AVX-512", "avx2": "f32 FMA, AVX2", "bf16": "bf16 dot (vdpbf16ps)"}
    return [f"peak {names[p.isa]:<22} {p.threads} thread(s): {p.per_core:7.1f} GFLOP/s per core (its CPU time), "
            f"{p.wall_gflops:7.1f} GFLOP/s all threads (wall)" for p in peaks]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--millions", type=float, default=50.0, help="millions of loop turns a thread (16 FMA instructions each)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    peaks = peak(tuple(int(t) for t in args.threads.split(",")), args.millions)
    m = machine()
    if args.json:
        print(json.dumps({"machine": m, "peaks": [asdict(p) for p in peaks], "f32_peak_per_core": f32_peak(peaks)}, indent=2))
        return
    print("\n".join(describe(m) + peak_lines(peaks)))
    print(f"f32 peak per core: {f32_peak(peaks):.1f} GFLOP/s")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
