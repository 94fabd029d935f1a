"""`doctor [FILE]`: whether a run can start here. Each line ok/warn/fail with the fix;
exit 4 when any line fails."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Optional

from pydantic import BaseModel

from ..outcome import Exit
from .common import existing_file, print_json

if TYPE_CHECKING:
    from ..ir.experiment import Experiment
    from ..ir.graph import Program

Level = Literal["ok", "warn", "fail"]


class Finding(BaseModel):
    check: str
    level: Level
    detail: str
    fix: Optional[str] = None


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    d = sub.add_parser("doctor")
    d.add_argument("file", nargs="?")
    d.add_argument("--store", default=None)
    d.add_argument("--device", default=None)
    d.add_argument("--ray", default=None, metavar="ADDRESS", help="check this Ray cluster (default $SEXPGPU_RAY_ADDRESS)")
    d.add_argument("--json", action="store_true")
    d.set_defaults(run=run_doctor)


def setting(flag: Optional[str], env: str, default: str) -> tuple[str, str]:
    """A setting's value and where it came from: flag, then environment, then default."""
    if flag:
        return flag, "flag"
    if os.environ.get(env):
        return os.environ[env], f"${env}"
    return default, "default"


def package_versions() -> list[Finding]:
    out = []
    required = ["numpy", "pydantic", "fsspec", "safetensors", "ml_dtypes"]
    optional = {"cupy": "the cuda extra: pip install -e '.[cuda]'", "ray": "the cluster extra: pip install -e '.[cluster]'", "s3fs": "the cluster extra, for s3:// stores"}
    for name in required:
        try:
            module = importlib.import_module(name)
            out.append(Finding(check=f"package {name}", level="ok", detail=getattr(module, "__version__", "installed")))
        except ImportError:
            out.append(Finding(check=f"package {name}", level="fail", detail="missing", fix="pip install -e ."))
    for name, fix in optional.items():
        try:
            module = importlib.import_module(name)
            out.append(Finding(check=f"package {name}", level="ok", detail=getattr(module, "__version__", "installed")))
        except Exception:  # an extra that is absent or broken is only a warning
            out.append(Finding(check=f"package {name}", level="warn", detail="not installed (optional)", fix=fix))
    return out


def device_findings(device: str, source: str) -> list[Finding]:
    out = [Finding(check="device", level="ok", detail=f"{device} (from {source}); {os.cpu_count()} CPU cores")]
    if device in ("cpu", "auto"):
        out.append(compiler_finding(device))
    if device.startswith("cuda") or device == "auto":
        from ..runtime.backend import DeviceError
        from ..runtime.devices import free_device_memory, open_backend

        try:
            open_backend("cuda" if device == "auto" else device)
            import cupy

            index = int(device.split(":", 1)[1]) if ":" in device else 0
            name = cupy.cuda.runtime.getDeviceProperties(index)["name"]
            name = name.decode() if isinstance(name, bytes) else str(name)
            out.append(Finding(check="cuda", level="ok", detail=f"{name}: {free_device_memory():,} bytes free"))
        except DeviceError as exc:
            level = "warn" if device == "auto" else "fail"
            out.append(Finding(check="cuda", level=level, detail=str(exc), fix="use --device cpu, or a machine with an NVIDIA GPU and pip install -e '.[cuda]'"))
    return out


def compiler_finding(device: str) -> Finding:
    """The C compiler the compiled CPU device builds its kernels with, and the kernel cache;
    without one a `cpu` run uses the NumPy backend."""
    from ..runtime.cpu.toolchain import NoCompiler, open_toolchain

    try:
        toolchain = open_toolchain()
    except NoCompiler as exc:
        return Finding(check="compiler", level="warn", detail=f"{exc}: --device cpu runs on the NumPy backend",
                       fix="install a C compiler (apt-get install gcc), or set $CC")
    return Finding(check="compiler", level="ok", detail=f"{toolchain.describe()}, kernels cached in {toolchain.cache}")


def cache_finding() -> Finding:
    """The cache root: whether it can be written, and each cache's entries and bad ones (a
    kernel library whose bytes do not match its digest, a dataset that does not open, or
    what is not a regular file)."""
    from ..runtime.cpu.toolchain import LIBRARY_SUFFIX, library_problem
    from ..runtime.data.cache import entry_problem
    from ..runtime.diskcache import CACHE_VARIABLE, CUPY_VARIABLE, bad_entries, cache_root, entry_count, regular_problem, writable_problem

    root = cache_root()
    where = f"{root} (from ${CACHE_VARIABLE})" if os.environ.get(CACHE_VARIABLE) else f"{root} (from default)"
    problem = writable_problem(root)
    if problem is not None:
        return Finding(check="cache", level="warn",
                       detail=f"{where}: cannot be written ({problem}): runs cache in a private temporary folder and compile their kernels again each time",
                       fix=f"set {CACHE_VARIABLE} to a folder you can write")
    cupy = Path(os.environ[CUPY_VARIABLE]) if os.environ.get(CUPY_VARIABLE) else root / "cupy"
    folders = {"kernels": (root / "kernels", library_problem), "data": (root / "data", entry_problem), "cupy": (cupy, regular_problem)}
    older = sorted(path for path in (root / "kernels").glob("*.so") if not path.name.endswith(LIBRARY_SUFFIX))
    counts = ", ".join(f"{kind} {entry_count(folder) - (len(older) if kind == 'kernels' else 0)}" + (" entries" if kind == "kernels" else "")
                       for kind, (folder, _) in folders.items())
    if older:
        counts += f"; {len(older)} kernel libraries of an older sexpgpu, unused (safe to delete)"
    bad = [(kind, folder / name, why) for kind, (folder, check) in folders.items() for name, why in bad_entries(folder, check)
           if folder / name not in older]
    if not bad:
        return Finding(check="cache", level="ok", detail=f"{where}: writable; {counts}")
    listed = ", ".join(f"{kind}/{path.name} ({why})" for kind, path, why in bad)
    return Finding(check="cache", level="warn", detail=f"{where}: writable; {counts}; {len(bad)} bad: {listed}",
                   fix=f"the next run rebuilds a bad entry; or remove them: rm -r {' '.join(str(path) for _, path, _ in bad)}")


def store_finding(url: str, source: str) -> Finding:
    from ..session import store_check

    problem = store_check(url)
    if problem is not None:
        return Finding(check="store", level="fail", detail=f"{problem} (from {source})")
    return Finding(check="store", level="ok", detail=f"{url} (from {source}): writable, read back")


def nccl_finding() -> Finding:
    """NCCL through CuPy: what data-parallel GPU ranks talk over."""
    try:
        import cupy  # noqa: F401
    except Exception:
        return Finding(check="nccl", level="warn", detail="CuPy is not installed: GPU ranks need it", fix="pip install -e '.[cuda]' on GPU machines")
    try:
        from cupy.cuda import nccl

        version = nccl.get_version()
        return Finding(check="nccl", level="ok", detail=f"NCCL {version // 10000}.{version // 100 % 100}.{version % 100} through CuPy")
    except Exception as exc:  # CuPy without its NCCL binding
        return Finding(check="nccl", level="warn", detail=f"CuPy has no NCCL here ({type(exc).__name__}): --devices W>1 with --device cuda will not start",
                       fix="install NCCL for CuPy (pip install nvidia-nccl-cu13) or use CPU ranks")


def credentials_finding(url: str) -> Optional[Finding]:
    """For s3:// stores: which link of the AWS chain supplies credentials."""
    if not url.startswith("s3://"):
        return None
    try:
        import boto3

        creds = boto3.Session().get_credentials()
    except Exception as exc:  # boto3 missing or a broken profile
        return Finding(check="credentials", level="fail", detail=f"{type(exc).__name__}: {exc}", fix="pip install -e '.[cluster]' and check ~/.aws/config")
    if creds is None:
        return Finding(check="credentials", level="fail", detail="no AWS credentials in the standard chain", fix="set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, or an instance role")
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS"
    return Finding(check="credentials", level="ok", detail=f"from {creds.method}; endpoint {endpoint}")


RAY_PROBE = """
import json, os, sys
import ray
ray.init(address=sys.argv[1], namespace="sexpgpu", include_dashboard=False, log_to_driver=False, logging_level="ERROR")
print(json.dumps({"resources": ray.cluster_resources(), "nodes": len([n for n in ray.nodes() if n.get("Alive")])}))
"""


def ray_finding(address: Optional[str], source: str) -> Finding:
    """Connect to the Ray cluster (in a child process, under a timeout) and report what it holds."""
    if not address:
        return Finding(check="ray", level="ok", detail="sweep --ray starts a local Ray (set SEXPGPU_RAY_ADDRESS or doctor --ray ADDRESS to check a cluster)")
    try:
        import ray  # noqa: F401
    except Exception:
        return Finding(check="ray", level="fail", detail=f"{address} (from {source}): Ray is not installed", fix="pip install -e '.[cluster]'")
    try:
        probe = subprocess.run([sys.executable, "-c", RAY_PROBE, address], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return Finding(check="ray", level="fail", detail=f"{address} (from {source}): no answer within 60 s", fix="check the address (ray status on the head node) and the network")
    lines = [line for line in probe.stdout.splitlines() if line.startswith("{")]
    if probe.returncode != 0 or not lines:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return Finding(check="ray", level="fail", detail=f"{address} (from {source}): cannot connect: {last}", fix="start the cluster (ray up ray-cluster.yaml, or deploy/local-cluster/start.sh)")
    found = json.loads(lines[-1])
    res = found["resources"]
    return Finding(check="ray", level="ok", detail=f"{address} (from {source}): {found['nodes']} node(s), {res.get('CPU', 0):g} CPU, {res.get('GPU', 0):g} GPU")


def cuda_plan_finding(experiment: "Experiment", device: str) -> Optional[Finding]:
    """With a CUDA device: the device memory plan (explain --cuda) against its free memory."""
    if not device.startswith("cuda"):
        return None
    from ..runtime.backend import DeviceError
    from ..runtime.devices import free_device_memory, open_backend
    from ..runtime.memory import device_memory_plan

    need = device_memory_plan(experiment).total
    try:
        open_backend(device)
        free = free_device_memory()
    except DeviceError:
        return Finding(check="device memory", level="warn", detail=f"plan needs {need:,} bytes of device memory; no CUDA device to compare with")
    if need > free:
        return Finding(check="device memory", level="fail", detail=f"plan needs {need:,} bytes, the device has {free:,} free", fix="a smaller batch, :microbatches, or a bigger GPU")
    return Finding(check="device memory", level="ok", detail=f"plan needs {need:,} bytes of {free:,} free on the device")


def plan_finding(path: str, device: str = "cpu") -> list[Finding]:
    from ..compile.pipeline import compile_file
    from ..runtime.memory import available_memory, host_memory_plan

    result = compile_file(existing_file(path))
    if result.experiment is None:
        errors = [d.headline() for d in result.diagnostics if d.severity == "error"]
        return [Finding(check="file", level="fail", detail=errors[0] if errors else "not a run file", fix=f"sexpgpu check {path}")]
    need, free = host_memory_plan(result.experiment).total, available_memory()
    out = [Finding(check="file", level="ok", detail=f"{path} compiles (IR {result.experiment.ir_hash[:12]})")]
    if free is None:
        out.append(Finding(check="memory", level="warn", detail=f"plan needs {need:,} bytes; free memory unknown"))
    elif need > free:
        out.append(Finding(check="memory", level="fail", detail=f"plan needs {need:,} bytes, {free:,} are free", fix="a smaller batch, :microbatches, or a bigger machine"))
    else:
        out.append(Finding(check="memory", level="ok", detail=f"plan needs {need:,} bytes of {free:,} free"))
    out.append(threads_finding(list(result.experiment.module.programs.values()), device))
    cuda = cuda_plan_finding(result.experiment, device)
    if cuda is not None:
        out.append(cuda)
    return out


def threads_finding(programs: list["Program"], device: str = "cpu") -> Finding:
    """The BLAS threads a run of PROGRAMS on DEVICE would get here now (all a run's work when
    given; without a file, a run whose products are large)."""
    from ..runtime.threads import blas_library, plan_threads

    pieces, device_blas = cpu_device_blas(device)
    try:
        plan = plan_threads(programs, pieces=pieces) if programs else plan_threads([], environ=None, assume_large=True)
    except ValueError as exc:
        return Finding(check="threads", level="fail", detail=str(exc), fix="unset it, or set a whole number")
    blas = f"{device_blas} (the compiled CPU device), NumPy's {blas_library()}" if device_blas else blas_library()
    return Finding(check="threads", level="ok", detail=f"{plan.blas} thread(s) for the kernels and the BLAS, of {plan.cores} core(s), {plan.source}: {plan.reason}; BLAS: {blas}")


# OpenBLAS's core types whose kernels use AVX-512 (what it picks itself on a core that has it)
OPENBLAS_AVX512 = ("skylakex", "cooperlake", "sapphirerapids")


def openblas_finding(environ: Mapping[str, str]) -> Optional[Finding]:
    """Where ENVIRON pins OpenBLAS's kernels ($OPENBLAS_CORETYPE): which ones NumPy's OpenBLAS
    (and the compiled CPU device's, where it calls that one) runs, and a warning where the CPU
    has AVX-512 and the pinned kernels do not use it; None where nothing is pinned."""
    pinned = environ.get("OPENBLAS_CORETYPE", "").strip()
    if not pinned:
        return None
    from threadpoolctl import threadpool_info

    running = [str(i.get("architecture") or "?") for i in threadpool_info() if i.get("internal_api") == "openblas"]
    if not running:
        return None
    kernels = ", ".join(dict.fromkeys(running))
    detail = f"$OPENBLAS_CORETYPE={pinned}: OpenBLAS runs its {kernels} kernels"
    if cpu_has("avx512f") and not any(k.lower() in OPENBLAS_AVX512 for k in running):
        return Finding(check="openblas", level="warn",
                       detail=f"{detail}, without this CPU's AVX-512, which OpenBLAS's own choice would use (Haswell's kernels made "
                              "the wide MLP's step 1.5x as long on an AVX-512 core: docs/performance.md)",
                       fix="unset OPENBLAS_CORETYPE (and OPENBLAS_L2_SIZE), or run: env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE sexpgpu ...")
    return Finding(check="openblas", level="ok", detail=detail)


def cpu_has(flag: str) -> bool:
    """Whether this CPU's feature flags (/proc/cpuinfo) include FLAG."""
    from ..runtime.cpu.toolchain import cpu_signature

    return any(line.startswith("flags") and flag in line.split() for line in cpu_signature().splitlines())


def cpu_device_blas(device: str) -> tuple[bool, str]:
    """Whether a run on DEVICE here splits its large products into pieces on the compiled CPU
    device's threads (the thread plan's rule depends on it), and the BLAS that device calls:
    (False, "") where that device does not open."""
    if device not in ("cpu", "auto"):
        return False, ""
    from ..runtime.backend import DeviceError
    from ..runtime.cpu.device import CpuBackend
    from ..runtime.devices import open_backend
    from ..runtime.threads import pieces_in_use

    try:
        backend = open_backend("cpu")
    except (DeviceError, RuntimeError, ValueError):  # no compiler, no BLAS it can call: the run falls back to NumPy, whose products stay whole
        return False, ""
    return pieces_in_use(backend), backend.runtime.blas.name if isinstance(backend, CpuBackend) else ""


def run_doctor(args: argparse.Namespace) -> int:
    findings = [Finding(check="python", level="ok" if sys.version_info >= (3, 11) else "fail", detail=f"{platform.python_version()} on {platform.machine()}", fix=None if sys.version_info >= (3, 11) else "use Python 3.11")]
    findings += package_versions()
    device, device_source = setting(args.device, "SEXPGPU_DEVICE", "cpu")
    findings += device_findings(device, device_source)
    store, store_source = setting(args.store, "SEXPGPU_STORE", "./runs")
    findings.append(store_finding(store, store_source))
    credentials = credentials_finding(store)
    if credentials is not None:
        findings.append(credentials)
    findings.append(nccl_finding())
    findings.append(cache_finding())
    address, address_source = setting(args.ray, "SEXPGPU_RAY_ADDRESS", "")
    findings.append(ray_finding(address or None, address_source))
    if args.file:
        findings += plan_finding(args.file, device)
    else:
        findings.append(threads_finding([]))
    pinned = openblas_finding(os.environ)
    if pinned is not None:
        findings.append(pinned)
    failed = any(f.level == "fail" for f in findings)
    if args.json:
        print_json({"ok": not failed, "findings": [f.model_dump() for f in findings]})
    else:
        for f in findings:
            print(f"{f.level:<4}  {f.check:<18} {f.detail}" + (f"\n      fix: {f.fix}" if f.fix and f.level != "ok" else ""))
    return Exit.CANNOT_START if failed else Exit.OK
