"""Faults that end cleanly, with their documented exit codes: a lease file that holds no
lease, a bundle with a link or a FIFO under source/, a checkpoint whose state.json disagrees
with its folder's step."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from sexpgpu.runtime.checkpoint import FileEntry, Manifest

SMALL = """(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)
(defloader train
  :source (synthetic :spirals :n 512 :classes 3 :seed 0)
  :fields ((x :f32 (2)) (y :i32 ()))
  :batch 64)
(defpart net (nn:mlp 2 16 3))
(defobjective (batch) (nn:cross-entropy (net (field batch x)) (field batch y)))
(defgroups (all "**" (optim:momentum :lr 0.05)))
(defrun :steps 30 :seed 0 :log-every 10 :checkpoint (:every 10 :keep KEEP))
"""


def project(root: Path, keep: int = 3) -> Path:
    (root / ".git").mkdir(parents=True)
    path = root / "small.lisp"
    path.write_text(SMALL.replace("KEEP", str(keep)))
    return path


def sexpgpu(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO), "SEXPGPU_CACHE": str(cwd / "cache")}
    return subprocess.run([sys.executable, "-m", "sexpgpu", *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=300)


def only_folder(store: Path) -> Path:
    (folder,) = [p for p in store.iterdir() if p.is_dir()]
    return folder


# -- a lease file that holds no lease -------------------------------------------------------------


def unreadable_lease(kind: str, where: Path) -> None:
    if kind == "empty":
        where.write_bytes(b"")
    elif kind == "torn":
        where.write_bytes(b'{"holder": "attempt-3f2')
    elif kind == "huge":
        where.write_bytes(b"\0" * (1 << 20))
    else:
        where.symlink_to("/dev/zero")


def age(where: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(where, (then, then), follow_symlinks=False)


@pytest.mark.parametrize("kind", ["empty", "torn", "huge", "dev-zero"])
def test_an_unreadable_lease_is_stale_once_the_patience_has_passed(tmp_path: Path, kind: str) -> None:
    """A lease.json left empty or torn (a disk that filled while the folder was taken), or
    not a lease at all: while it is recent the folder is held (exit 4, saying so); once its
    last write is older than the lease's patience (60 s) it holds nothing, and the run,
    with --fresh too, goes on."""
    path = project(tmp_path)
    store = tmp_path / "runs"
    assert sexpgpu("run", str(path), "--store", str(store), "--max-steps", "10", "--quiet", cwd=tmp_path).returncode == 0
    lease = only_folder(store) / "lease.json"
    unreadable_lease(kind, lease)
    held = sexpgpu("run", str(path), "--store", str(store), "--quiet", cwd=tmp_path)
    assert held.returncode == 4 and "a lease file that cannot be read, written" in held.stderr, held.stderr
    age(lease, 120)
    resumed = sexpgpu("run", str(path), "--store", str(store), "--max-steps", "20", cwd=tmp_path)
    assert resumed.returncode == 0 and "resumed from step-000010" in resumed.stdout, resumed.stderr
    assert not lease.exists() and not lease.is_symlink()  # moved aside, then ours, released at the end
    unreadable_lease(kind, lease)
    age(lease, 120)
    fresh = sexpgpu("run", str(path), "--store", str(store), "--fresh", "--quiet", cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stderr
    assert not lease.exists() and not lease.is_symlink()


# -- a bundle with a link or a FIFO under source/ ---------------------------------------------------


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_bundle_with_a_link_or_a_fifo_in_its_source_is_refused(tmp_path: Path, kind: str) -> None:
    path = project(tmp_path / "p")
    made = sexpgpu("bundle", str(path), "-o", str(tmp_path / "b"), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    odd = tmp_path / "b" / "source" / ("notes.txt" if kind == "link" else "pipe")
    if kind == "link":
        odd.symlink_to("/etc/passwd")
    else:
        os.mkfifo(odd)
    ran = sexpgpu("run", str(tmp_path / "b"), "--store", str(tmp_path / "runs"), cwd=tmp_path)
    assert ran.returncode == 4, ran.stderr
    assert "bundle refused" in ran.stderr and str(odd) in ran.stderr and "not a regular file" in ran.stderr, ran.stderr
    assert "internal error" not in ran.stderr


# -- a state.json whose step disagrees with its folder ---------------------------------------------


def republish_state(checkpoint: Path, step: int) -> None:
    """state.json set to STEP, under a manifest whose hashes match it (a careful tamperer)."""
    state = json.loads((checkpoint / "state.json").read_text())
    state["step"] = step
    data = json.dumps(state).encode()
    (checkpoint / "state.json").write_bytes(data)
    manifest = Manifest.model_validate_json((checkpoint / "MANIFEST.json").read_text())
    manifest.files["state.json"] = FileEntry(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (checkpoint / "MANIFEST.json").write_text(manifest.model_dump_json())


@pytest.mark.parametrize("resume", [None, "latest", "10"])
def test_a_state_whose_step_disagrees_with_its_folder_is_refused(tmp_path: Path, resume: str | None) -> None:
    path = project(tmp_path, keep=1)
    store = tmp_path / "runs"
    assert sexpgpu("run", str(path), "--store", str(store), "--max-steps", "10", "--quiet", cwd=tmp_path).returncode == 0
    state = only_folder(store) / "checkpoints" / "step-000010" / "state.json"
    republish_state(state.parent, 10**30)
    ran = sexpgpu("run", str(path), "--store", str(store), *(["--resume", resume] if resume else []), cwd=tmp_path)
    assert ran.returncode == 6, (ran.stdout, ran.stderr)
    assert f"{state} records step {10**30}, but its folder step-000010 is step 10" in ran.stderr, ran.stderr
    status = json.loads((only_folder(store) / "status.json").read_text())
    assert status["step"] == 10
