"""A simulated GPU machine, as bench/gpu_check.sh meets one: a fresh Python (a venv without
this machine's packages, without setuptools or wheel) that has only numpy, ml-dtypes and CuPy
(the machine's own; CuPy imports without a GPU), no package registry (PIP_NO_INDEX=1), the
working tree as the device tool carries it, and `.gpu-wheels` made by bench/gpu_wheels.sh.
The script's install lines run as they are written there; then `pytest --collect-only` must
collect every test of the GPU test files, and the precompiled kernels must be where the CUDA
device looks for them.

numpy, ml-dtypes and CuPy come from the registry once (CuPy is a 70 MB wheel), kept in
`$SEXPGPU_CACHE/gpu-machine-wheels`; the wheels of .gpu-wheels come through pip's own cache.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from sexpgpu.runtime.data.cache import default_cache_dir

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_check.sh"
GPU_TESTS = ("tests/test_cuda_device.py", "tests/test_nccl.py")  # what the script runs
CUPY_NEEDS = ("cuda-pathfinder==1.9.1",)  # CuPy 14's one dependency besides numpy


@dataclass
class Machine:
    install_ok: bool
    collected: list[str]  # the node ids pytest collected
    missing: list[str]  # GPU test functions it did not collect
    kernels_found: Optional[int]  # precompiled kernels the device finds there (None: none packed)
    log_tail: str = ""
    steps: list[str] = field(default_factory=list)


def pins() -> list[str]:
    """numpy's and ml-dtypes' pins (the dependencies) and CuPy's (the cuda extra)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [d for d in project["dependencies"] if d.split("==")[0] in ("numpy", "ml-dtypes")]
    return wanted + list(project["optional-dependencies"]["cuda"]) + list(CUPY_NEEDS)


def machine_wheels(cache: Optional[Path] = None) -> list[Path]:
    """The machine's own packages as wheels for this Python, downloaded once."""
    folder = (cache or default_cache_dir()) / "gpu-machine-wheels"
    folder.mkdir(parents=True, exist_ok=True)
    wanted = pins()

    def have(pin: str) -> list[Path]:
        name, version = pin.split("==")
        return sorted(folder.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    lacking = [p for p in wanted if not have(p)]
    if lacking:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(folder), *lacking], check=True)
    return [have(p)[0] for p in wanted]


def install_lines(script: Path = SCRIPT) -> str:
    """The lines between the script's `# -- install` and `# -- end install --` markers."""
    text = script.read_text()
    match = re.search(r"^# -- install.*?\n(.*?)^# -- end install --", text, re.S | re.M)
    assert match is not None, f"{script}: no install markers"
    return match.group(1)


def test_functions(paths: tuple[str, ...] = GPU_TESTS) -> set[str]:
    """`file::test_name` of every test function the GPU test files define."""
    out = set()
    for path in paths:
        tree = ast.parse((REPO / path).read_text())
        out |= {f"{path}::{node.name}" for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}
    return out


def carried_tree(work: Path) -> Path:
    """The working tree as the device tool carries it: tracked files and untracked ones git
    does not ignore."""
    repo = work / "repo"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, repo / name)
    return repo


def run(command: list[str], env: dict[str, str], cwd: Path, steps: list[str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    steps.append(f"$ {' '.join(command)[:200]}\n{(done.stdout + done.stderr)[-3000:]}(exit {done.returncode})")
    return done


def simulate(work: Path, cubins: Optional[Path] = None) -> Machine:
    """The simulated machine in WORK; CUBINS, an archive of precompiled kernels to carry in
    .gpu-wheels (as bench/gpu_wheels.sh packs it)."""
    steps: list[str] = []
    repo = carried_tree(work)
    outer = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_NO_INDEX")}
    wheels = repo / ".gpu-wheels"
    python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    made = run(["bash", str(REPO / "bench" / "gpu_wheels.sh")],
               {**outer, "GPU_WHEELS_OUT": str(wheels), "GPU_WHEELS_PYTHONS": python_version, "GPU_WHEELS_KERNELS": "0"}, REPO, steps)
    assert made.returncode == 0, steps[-1]
    if cubins is not None:
        shutil.copy2(cubins, wheels / "cubins.tar.gz")
    own = machine_wheels()
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    bin_dir = venv / "bin"
    cache = work / "machine-cache"
    env = {**outer, "PATH": f"{bin_dir}{os.pathsep}{outer.get('PATH', '')}", "VIRTUAL_ENV": str(venv), "PIP_NO_INDEX": "1",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "SEXPGPU_CACHE": str(cache), "OUT": str(work / "out")}
    python = str(bin_dir / "python")
    run([python, "-m", "pip", "uninstall", "-y", "-q", "setuptools", "wheel"], env, repo, steps)  # the machine has neither
    ok = run([python, "-m", "pip", "install", "-q", "--no-deps", *map(str, own)], env, repo, steps).returncode == 0
    installed = run(["bash", "-c", "set -uo pipefail\n" + install_lines()], env, repo, steps)
    # from outside the tree: sexpgpu is found because it is installed, not because it is here
    imports = run([python, "-c", "import sexpgpu, threadpoolctl, xdist, execnet, pydantic, cupy, ml_dtypes; print(sexpgpu.__file__, cupy.__version__)"], env, work, steps)
    installed_ok = imports.returncode == 0 and str(repo) in imports.stdout
    install_ok = ok and installed.returncode == 0 and installed_ok
    collect = run([python, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-n", "0", *GPU_TESTS], env, repo, steps)
    collected = [line.strip() for line in collect.stdout.splitlines() if "::" in line]
    functions = {re.sub(r"\[.*$", "", node) for node in collected}
    missing = sorted(test_functions() - functions)
    found = None
    if cubins is not None:
        links = cache / "cubins"
        found = sum(1 for p in links.rglob("*.cubin") if p.parent.name != "units" and p.resolve().is_file()) if links.is_dir() else 0
    return Machine(install_ok=install_ok, collected=collected, missing=missing, kernels_found=found, log_tail="\n".join(steps)[-6000:], steps=steps)
