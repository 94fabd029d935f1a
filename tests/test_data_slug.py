"""The slug covers the data (docs/run.md, "The slug"): a loader's file is fingerprinted by
its size and a streamed sha256 (cached by path, size and modification time), an object in
S3 by its ETag; changed data is a new run, and `--resume` across it is refused (exit 6),
naming the file."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from conftest import REPO
from s3_server import MotoS3, boto3_client, make_bucket, patched_env, s3_env
from sexpgpu.bundle import make_bundle
from sexpgpu.compile.pipeline import compile_file
from sexpgpu.ir.experiment import Selection
from sexpgpu.runtime.data.fingerprint import CachedDigest, fingerprint, fingerprinted
from sexpgpu.runtime.runfolder import RunFolder, run_slug
from sexpgpu.runtime.store import Store

RUN_FILE = """\
(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)

(defknob lr 0.1)
(defsweep lrs :lr (0.05 0.1))

(defloader train
  :source SOURCE
  :fields ((x :f32 (2)) (y :i32 ()))
  :batch 32
  :shuffle t)

(defpart net (nn:mlp 2 16 3))

(defobjective (batch)
  (nn:cross-entropy (net (field batch x)) (field batch y)))

(defgroups (all "**" (optim:sgd :lr lr)))

(defrun :steps 20 :seed 0 :log-every 10 :checkpoint (:every 10))
"""


def examples(shift: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 2)).astype(np.float32)
    y = ((x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0) + shift) % 3
    return x, y.astype(np.int32)


def write_npz(path: Path, shift: int = 0) -> None:
    x, y = examples(shift)
    np.savez(path, x=x, y=y)


def write_csv(path: Path, shift: int = 0) -> None:
    x, y = examples(shift)
    rows = ["x_0,x_1,y", *(f"{a!r},{b!r},{int(c)}" for (a, b), c in zip(x.tolist(), y.tolist()))]
    path.write_text("\n".join(rows) + "\n")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / ".git").mkdir()  # the project root: sources inside it may be read
    return tmp_path


def env_for(project: Path) -> dict[str, str]:
    return {**os.environ, "NO_COLOR": "1", "SEXPGPU_CACHE": str(project / "cache"), "PYTHONPATH": str(REPO)}


def sexpgpu(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sexpgpu", *args], capture_output=True, text=True, env=env_for(project), cwd=project, timeout=300)


def run_json(project: Path, run_file: Path, *extra: str) -> dict[str, Any]:
    proc = sexpgpu(project, "run", str(run_file), "--store", str(project / "runs"), "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    summary: dict[str, Any] = json.loads(proc.stdout)
    return summary


@pytest.mark.parametrize("kind", ["npz", "csv"])
def test_changed_data_is_a_new_run_with_new_numbers(project: Path, kind: str) -> None:
    """Every label shifted: the run trains anew under a new slug, not `already finished`
    with the old numbers; the same data again is the same slug (nothing to do)."""
    data = project / f"data.{kind}"
    write = write_npz if kind == "npz" else write_csv
    write(data)
    run_file = project / "exp.lisp"
    run_file.write_text(RUN_FILE.replace("SOURCE", f'({kind} "data.{kind}")'))
    first = run_json(project, run_file)
    assert first["reason"] == "finished" and first["steps"] == 20
    again = run_json(project, run_file)
    assert again["slug"] == first["slug"] and again["reason"] == "already finished"
    write(data, shift=1)
    changed = run_json(project, run_file)
    assert changed["slug"] != first["slug"]
    assert changed["reason"] == "finished" and changed["first_step"] == 0 and changed["steps"] == 20
    assert changed["final_loss"] != first["final_loss"]
    info = RunFolder(Store.open(str(project / "runs")), changed["slug"]).read_run_info()
    recorded = info.data["train"]
    assert recorded.source == str(data) and recorded.bytes == data.stat().st_size
    assert recorded.sha256 == hashlib.sha256(data.read_bytes()).hexdigest()


def test_a_sweeps_points_are_new_when_the_data_changed(project: Path) -> None:
    data = project / "data.npz"
    write_npz(data)
    run_file = project / "exp.lisp"
    run_file.write_text(RUN_FILE.replace("SOURCE", '(npz "data.npz")'))

    def sweep() -> list[dict[str, Any]]:
        proc = sexpgpu(project, "sweep", str(run_file), "--sweep", "lrs", "--store", str(project / "runs"), "--json")
        assert proc.returncode == 0, proc.stderr
        points: list[dict[str, Any]] = json.loads(proc.stdout)["points"]
        return points

    first = sweep()
    assert [p["reason"] for p in first] == ["finished", "finished"]
    assert [p["reason"] for p in sweep()] == ["already finished", "already finished"]  # the same data
    write_npz(data, shift=1)
    changed = sweep()
    assert [(p["reason"], p["state"]) for p in changed] == [("finished", "finished")] * 2, changed
    assert {p["slug"] for p in changed}.isdisjoint({p["slug"] for p in first})
    assert [p["final_loss"] for p in changed] != [p["final_loss"] for p in first]


def test_resume_across_changed_data_is_refused_naming_the_file(project: Path) -> None:
    data = project / "data.npz"
    write_npz(data)
    run_file = project / "exp.lisp"
    run_file.write_text(RUN_FILE.replace("SOURCE", '(npz "data.npz")'))
    first = run_json(project, run_file, "--max-steps", "10")
    write_npz(data, shift=1)
    for resume in ("latest", f"{project / 'runs' / first['slug']}/checkpoints/step-000010"):
        proc = sexpgpu(project, "run", str(run_file), "--store", str(project / "runs"), "--resume", resume)
        assert proc.returncode == 6, proc.stderr
        assert "resume refused: the data changed since" in proc.stderr and str(data) in proc.stderr, proc.stderr
        assert first["slug"] in proc.stderr
    fresh = run_json(project, run_file)  # without --resume: the new data, from step 0
    assert fresh["slug"] != first["slug"] and fresh["first_step"] == 0


def test_the_fingerprint_is_cached_by_path_size_and_mtime(tmp_path: Path) -> None:
    """The second fingerprint of an unchanged file reads the cache, not the file: new bytes
    of the same size under the old modification time are not seen (which is what proves no
    read), and the entry records the path, size, mtime and digest."""
    data = tmp_path / "data.bin"
    data.write_bytes(b"a" * 3_000_000)
    cache = tmp_path / "cache"
    first = fingerprint(str(data), cache)
    assert first.bytes == 3_000_000 and first.sha256 == hashlib.sha256(b"a" * 3_000_000).hexdigest()
    (entry,) = (cache / "fingerprints").iterdir()
    stat = data.stat()
    assert CachedDigest.model_validate_json(entry.read_text()) == CachedDigest(path=str(data.resolve()), bytes=stat.st_size, mtime_ns=stat.st_mtime_ns, sha256=first.sha256)
    data.write_bytes(b"b" * 3_000_000)
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert fingerprint(str(data), cache).sha256 == first.sha256  # the cache answered
    entry.unlink()
    assert fingerprint(str(data), cache).sha256 != first.sha256  # no entry: the file is read
    data.touch()  # a new mtime: a new key, read again
    assert fingerprint(str(data), cache).sha256 == hashlib.sha256(b"b" * 3_000_000).hexdigest()
    assert len(list((cache / "fingerprints").iterdir())) == 2


def test_an_unwritable_cache_still_fingerprints(tmp_path: Path) -> None:
    data = tmp_path / "data.bin"
    data.write_bytes(b"abc")
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would be")
    found = fingerprint(str(data), blocked)
    assert found.sha256 == hashlib.sha256(b"abc").hexdigest() and found.bytes == 3


def test_a_missing_file_is_fingerprinted_with_its_problem_and_fails_as_a_data_error(project: Path) -> None:
    run_file = project / "exp.lisp"
    run_file.write_text(RUN_FILE.replace("SOURCE", '(npz "missing.npz")'))
    result = compile_file(run_file)
    assert result.experiment is not None
    with pytest.raises(ValueError, match="fingerprint"):
        run_slug(result.experiment)  # the slug never leaves the data out
    found = fingerprinted(result.experiment, cache_dir=project / "cache")
    assert found.data_sources is not None and found.data_sources["train"].problem == "file not found"
    proc = sexpgpu(project, "run", str(run_file), "--store", str(project / "runs"))
    assert proc.returncode == 5 and "missing.npz" in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoS3]:
    with MotoS3() as server:
        yield server


def test_an_s3_source_is_fingerprinted_by_its_etag(moto: MotoS3, project: Path) -> None:
    """One info call gives the object's size and ETag: the slug follows the object's
    content, and the run reads it from S3."""
    import s3fs

    endpoint = f"http://127.0.0.1:{moto.port}"
    env = s3_env(endpoint)
    with patched_env(env):
        s3fs.S3FileSystem.clear_instance_cache()
        bucket = make_bucket(None, endpoint)
        client = boto3_client(endpoint)
        local = project / "local.npz"
        write_npz(local)
        client.put_object(Bucket=bucket, Key="d/data.npz", Body=local.read_bytes())
        url = f"s3://{bucket}/d/data.npz"
        run_file = project / "exp.lisp"
        run_file.write_text(RUN_FILE.replace("SOURCE", f'(npz "{url}")'))
        result = compile_file(run_file)
        assert result.experiment is not None
        first = fingerprinted(result.experiment, (f"s3://{bucket}",), project / "cache")
        assert first.data_sources is not None
        source = first.data_sources["train"]
        head = client.head_object(Bucket=bucket, Key="d/data.npz")
        assert source.etag == head["ETag"].strip('"') and source.bytes == head["ContentLength"] and source.sha256 is None
        manifest, _ = make_bundle(run_file, Selection(), str(project / "bundle"))
        assert manifest.slug == run_slug(first)
        assert [(e.etag, e.bytes, e.copied) for e in manifest.data] == [(source.etag, source.bytes, False)]
        write_npz(local, shift=1)
        client.put_object(Bucket=bucket, Key="d/data.npz", Body=local.read_bytes())
        second = fingerprinted(result.experiment, (f"s3://{bucket}",), project / "cache")
        assert run_slug(second) != run_slug(first)
    cli_env = {**env_for(project), **env}
    proc = subprocess.run([sys.executable, "-m", "sexpgpu", "run", str(run_file), "--store", str(project / "runs"), "--data-root", f"s3://{bucket}", "--json"],
                          capture_output=True, text=True, env=cli_env, cwd=project, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["slug"] == run_slug(second)
    stale = subprocess.run([sys.executable, "-m", "sexpgpu", "run", str(project / "bundle"), "--store", str(project / "runs"), "--data-root", f"s3://{bucket}"],
                           capture_output=True, text=True, env=cli_env, cwd=project, timeout=300)
    assert stale.returncode == 5, stale.stderr
    assert f"bundle refused: loader train: {url} changed since the bundle was made" in stale.stderr, stale.stderr
