"""Nothing lost, nobody in: a full disk, a store that lost its records, hostile bundles and
checkpoints, sources outside the project, two writers on one run folder, and stop requests
at every phase. Each test waits for an event (a line, a file, a status), never a delay."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
import pytest

from conftest import REPO, wait_for
from sexpgpu.cli.main import main
from sexpgpu.runtime.checkpoint import FileEntry, Manifest, encode_tensors, list_checkpoints
from sexpgpu.runtime.store import RetryPolicy, Store, is_transient

SMALL = """(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)
(defloader train
  :source SOURCE
  :fields ((x :f32 (2)) (y :i32 ()))
  :batch 64)
(defpart net (nn:mlp 2 WIDTH 3 :depth 2))
(defobjective (batch) (nn:cross-entropy (net (field batch x)) (field batch y)))
(defgroups (all "**" (optim:momentum :lr 0.05)))
(defrun :steps STEPS :seed 0 :log-every 10 :checkpoint (:every EVERY :keep 3))
"""
SPIRALS = "(synthetic :spirals :n 512 :classes 3 :seed 0)"


def project(root: Path, steps: int = 60, every: int = 10, width: int = 16, source: str = SPIRALS, head: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / ".git").mkdir(exist_ok=True)
    path = root / "small.lisp"
    path.write_text(head + SMALL.replace("SOURCE", source).replace("WIDTH", str(width)).replace("STEPS", str(steps)).replace("EVERY", str(every)))
    return path


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def spawn(*args: str, cwd: Optional[Path] = None) -> "subprocess.Popen[str]":
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.Popen([sys.executable, "-m", "sexpgpu", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)


def status_of(store: Path) -> dict[str, Any]:
    (path,) = store.glob("*/status.json")
    return dict(json.loads(path.read_text()))


def run_folder(store: Path) -> Path:
    (folder,) = [p for p in store.iterdir() if p.is_dir()]
    return folder


# -- a full disk, a store that lost its records, the retry budget ------------------------------


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A real small filesystem, where the machine lets this process mount one."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_full_disk_never_turns_into_finished(tmp_path: Path) -> None:
    """Checkpoints of ~730 KB every 100 steps on a 2 MB store: the run stops (exit 4) at the
    checkpoint the store refuses, says the last safe step, is never `finished`, and with room
    made resumes from that step to the end."""
    path = project(tmp_path / "p", steps=1000, every=100, width=300)
    with tmpfs(tmp_path / "store", "2m") as store:
        code, out, err = cli("run", str(path), "--store", str(store), "--quiet")
        assert code == 4, (out, err)
        assert "No space left on device" in out and "the last safe step is " in out, out
        status = status_of(store)
        assert status["state"] != "finished" and status["summary"]["exit_code"] == 4, status
        safe = status["last_checkpoint"]
        assert safe is not None and f"checkpoints/{safe}" in out
        subprocess.run(["mount", "-o", "remount,size=16m", str(store)], check=True)
        code, out, err = cli("run", str(path), "--store", str(store), "--quiet")
        assert code == 0, (out, err)
        assert f"resumed from {safe}" in out and out.strip().splitlines()[-1].startswith("finished: 1000 steps"), out
        assert status_of(store)["state"] == "finished"


def test_a_store_full_at_the_start_fails_at_once_without_retries(tmp_path: Path) -> None:
    path = project(tmp_path / "p")
    with tmpfs(tmp_path / "store", "64k") as store:
        (store / "filler").write_bytes(b"\0" * (64 * 1024 - 4096))
        with contextlib.suppress(OSError):  # fill what is left, to the byte
            with open(store / "rest", "wb") as rest:
                while True:
                    rest.write(b"\0" * 512)
                    rest.flush()
        code, out, err = cli("run", str(path), "--store", str(store))
    assert code == 4, (out, err)
    assert "No space left on device" in err and "cannot start here" in err, err


def test_no_space_and_no_access_are_not_retried() -> None:
    import errno

    assert not is_transient(OSError(errno.ENOSPC, "No space left on device"))
    assert not is_transient(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert is_transient(OSError(errno.ECONNRESET, "Connection reset"))
    quota = OSError(errno.EIO, "put failed")
    quota.__cause__ = type("ClientError", (Exception,), {"response": {"Error": {"Code": "QuotaExceeded"}}})()
    assert not is_transient(quota)


def test_the_retry_budget_is_a_setting_and_the_only_retry_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    assert RetryPolicy.configured({}).attempts == 6
    assert RetryPolicy.configured({"SEXPGPU_STORE_RETRIES": "2"}).attempts == 2
    with pytest.raises(ValueError, match="SEXPGPU_STORE_RETRIES"):
        RetryPolicy.configured({"SEXPGPU_STORE_RETRIES": "many"})
    pytest.importorskip("s3fs")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    store = Store.open("s3://bucket/prefix")
    assert store.fs.retries == 1  # s3fs's own retries off
    store.fs.connect()  # botocore reads (and rewrites) the retry settings here
    assert store.fs.s3.meta.config.retries["total_max_attempts"] == 1  # botocore's too: one try per call
    monkeypatch.setenv("SEXPGPU_STORE_PATIENCE", "soon")
    code, _, err = cli("run", str(REPO / "examples" / "quickstart.lisp"))
    assert code == 2 and "SEXPGPU_STORE_PATIENCE" in err, err


def test_a_store_that_lost_the_runs_records_stops_resumably(tmp_path: Path) -> None:
    """run.json and the first checkpoint vanish (an S3 server restarted empty): the run
    notices at its next checkpoint, writes run.json and a checkpoint of that step anew, and
    stops with exit 75; run again, it continues from there to the end."""
    path = project(tmp_path / "p", steps=20000, every=50)
    store = tmp_path / "store"
    proc = spawn("run", str(path), "--store", str(store), "--quiet")
    wait_for(lambda: any(store.glob("*/checkpoints/step-000050/MANIFEST.json")), "the first checkpoint")
    folder = run_folder(store)
    (folder / "run.json").unlink()
    shutil.rmtree(folder / "checkpoints" / "step-000050")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, (out, err)
    assert "lost this run's run.json" in out, out
    assert (folder / "run.json").exists()
    step = json.loads((folder / "status.json").read_text())["step"]
    again = spawn("run", str(path), "--store", str(store), "--quiet", "--max-steps", str(step + 50))
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0 and f"resumed from step-{step:06d}" in out, (out, err)


# -- bundles that reach outside themselves -------------------------------------------------------


def bundle_of(tmp_path: Path) -> Path:
    path = project(tmp_path / "p")
    bundle = tmp_path / "bundle"
    assert cli("bundle", str(path), "-o", str(bundle))[0] == 0
    return bundle


@pytest.mark.parametrize("main_path", ["../../../../etc/passwd", "/etc/passwd", "source/../../x.lisp", "a//b.lisp"])
def test_a_bundle_whose_main_leaves_it_is_refused_before_anything_is_read(tmp_path: Path, main_path: str) -> None:
    bundle = bundle_of(tmp_path)
    manifest = json.loads((bundle / "bundle.json").read_text())
    manifest["main"] = main_path
    (bundle / "bundle.json").write_text(json.dumps(manifest))
    code, out, err = cli("run", str(bundle), "--store", str(tmp_path / "runs"))
    assert code == 4, (code, out, err)
    assert "inside it" in err or "outside the bundle" in err, err
    assert "root:" not in out + err  # /etc/passwd was never read, let alone echoed
    assert not (tmp_path / "runs").exists()


def test_a_bundle_with_keys_that_climb_out_is_refused(tmp_path: Path) -> None:
    """On an object store a key may say anything: `source/../../evil` must not be written
    outside the temporary project."""
    bundle = bundle_of(tmp_path)
    memory = Store.open("memory://hostile-bundle")
    for file in bundle.rglob("*"):
        if file.is_file():
            memory.write_bytes(str(file.relative_to(bundle)), file.read_bytes())
    memory.fs.pipe_file("/hostile-bundle/source/../../evil.txt", b"x")
    code, out, err = cli("run", "memory://hostile-bundle", "--store", str(tmp_path / "runs"))
    assert code == 4 and "bundle refused" in err, (code, err)
    assert not Path("/evil.txt").exists() and not (Path(os.path.dirname(os.getcwd())) / "evil.txt").exists()


def test_a_malformed_bundle_json_is_exit_4_and_run_bundle_leaves_no_temporary_project(tmp_path: Path) -> None:
    import tempfile

    bundle = bundle_of(tmp_path)
    before = set(Path(tempfile.gettempdir()).glob(f"sexpgpu-bundle-{os.getpid()}-*"))
    code, _, err = cli("run", str(bundle), "--store", str(tmp_path / "runs"), "--quiet")
    assert code == 0, err
    assert set(Path(tempfile.gettempdir()).glob(f"sexpgpu-bundle-{os.getpid()}-*")) == before
    (bundle / "bundle.json").write_text("{not json")
    code, _, err = cli("run", str(bundle), "--store", str(tmp_path / "runs"))
    assert code == 4 and "bundle.json is malformed" in err, err


def test_unpacking_streams_files(tmp_path: Path) -> None:
    """A 96 MB data file in a bundle is copied without being held in memory: the unpacking
    process's peak memory grows by far less than the file."""
    bundle = bundle_of(tmp_path)
    (bundle / "source" / "big.bin").write_bytes(os.urandom(1 << 20) * 96)
    program = f"""
import re
from sexpgpu.bundle import unpacked
def peak_kb():  # VmHWM, this process's own (ru_maxrss starts at the parent's peak: tests/peak_memory.py)
    return int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1))
before = peak_kb()
with unpacked({str(bundle)!r}) as b:
    assert (b.root / "big.bin").stat().st_size == 96 << 20
print((peak_kb() - before) * 1024)
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip().splitlines()[-1]) < 32 << 20, done.stdout


# -- checkpoints are read only after they are checked ------------------------------------------


def trained(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A run of 60 steps with checkpoints at 40 and 50 and 60 kept: (run file, store, folder)."""
    path = project(tmp_path / "p", steps=60, every=10)
    store = tmp_path / "runs"
    assert cli("run", str(path), "--store", str(store), "--quiet")[0] == 0
    return path, store, run_folder(store)


def republish(checkpoint: Path, file: str, data: bytes) -> None:
    """Replace FILE with DATA under a manifest that matches it (a careful tamperer)."""
    (checkpoint / file).write_bytes(data)
    manifest = Manifest.model_validate_json((checkpoint / "MANIFEST.json").read_text())
    import hashlib

    manifest.files[file] = FileEntry(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (checkpoint / "MANIFEST.json").write_text(manifest.model_dump_json())


def resume_continues_from(path: Path, store: Path, step: str) -> str:
    code, out, err = cli("run", str(path), "--store", str(store), "--resume", "latest", "--quiet")
    assert code == 0, (out, err)
    assert f"resumed from {step}" in out, out
    return out + err


def special_file(kind: str, where: Path) -> None:
    where.unlink()
    if kind == "dev-zero":
        where.symlink_to("/dev/zero")
    else:
        os.mkfifo(where)


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_a_checkpoint_file_that_is_not_a_regular_file_is_refused_not_read(tmp_path: Path, kind: str) -> None:
    path, store, folder = trained(tmp_path)
    special_file(kind, folder / "checkpoints" / "step-000060" / "params.safetensors")
    code, out, _ = cli("checkpoint", str(folder), "verify", "--json")
    assert code == 6, out
    rows = {r["name"]: r for r in json.loads(out)["checkpoints"]}
    assert rows["step-000060"]["corrupt"] and "not a regular file" in rows["step-000060"]["reason"], rows
    assert "not a regular file" in resume_continues_from(path, store, "step-000050")


@pytest.mark.parametrize("damage", ["header", "shapes", "state"])
def test_a_malformed_checkpoint_under_a_matching_manifest_is_refused_and_skipped(tmp_path: Path, damage: str) -> None:
    path, store, folder = trained(tmp_path)
    latest = folder / "checkpoints" / "step-000060"
    if damage == "header":
        republish(latest, "params.safetensors", b"\xff" * 8 + b"{broken")
    elif damage == "shapes":
        republish(latest, "params.safetensors", encode_tensors({"net.layers.0.w": np.zeros((3, 3), np.float32)}))
    else:
        republish(latest, "state.json", b'{"step": "sixty"}')
    code, out, _ = cli("checkpoint", str(folder), "verify")
    assert code == 6 and "step-000060  CORRUPT" in out, out
    resume_continues_from(path, store, "step-000050")


def test_a_latest_that_points_outside_is_skipped_with_a_warning(tmp_path: Path) -> None:
    path, store, folder = trained(tmp_path)
    (folder / "checkpoints" / "LATEST").write_text("../../../../etc")
    code, out, _ = cli("checkpoint", str(folder), "verify")
    assert code == 6 and "not a checkpoint folder" in out, out
    resume_continues_from(path, store, "step-000060")


def test_pruning_unpublishes_before_it_deletes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kill in the middle of a deletion leaves an unpublished folder, never a published
    checkpoint that fails verify: here the recursive delete dies after the MANIFEST went."""
    from sexpgpu.runtime import checkpoint

    _, store_path, folder = trained(tmp_path)
    store = Store.open(str(store_path))
    original = Store.delete

    def dies_on_folders(self: Store, path: str, recursive: bool = False, missing_ok: bool = True) -> None:
        if recursive:
            raise KeyboardInterrupt("killed while deleting")
        original(self, path, recursive=recursive, missing_ok=missing_ok)

    monkeypatch.setattr(Store, "delete", dies_on_folders)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.prune(store, folder.name, keep=1)
    monkeypatch.setattr(Store, "delete", original)
    infos = list_checkpoints(store, folder.name, verify=True)
    published = [i for i in infos if (folder / "checkpoints" / i.name / "MANIFEST.json").exists()]
    assert all(i.valid for i in published), infos
    assert any(not i.valid for i in infos)  # the one being deleted: unpublished, never loaded


# -- loader sources stay where the experiment is ------------------------------------------------


@pytest.mark.parametrize("source", ['(text "/etc/passwd")', '(text "~/.bashrc")', '(text "/proc/self/environ")', '(csv "link.csv")', '(csv "pipe.csv")'])
def test_a_source_outside_the_project_is_a_data_error(tmp_path: Path, source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "do-not-leak-7f3a")
    path = project(tmp_path / "p", source=source)
    (tmp_path / "outside.csv").write_text("x_0,x_1,y\n" + "0.1,0.2,1\n" * 100)
    (tmp_path / "p" / "link.csv").symlink_to(tmp_path / "outside.csv")
    os.mkfifo(tmp_path / "p" / "pipe.csv")
    cache = tmp_path / "cache"
    monkeypatch.setenv("SEXPGPU_CACHE", str(cache))
    code, out, err = cli("run", str(path), "--store", str(tmp_path / "runs"))
    assert code == 5, (code, out, err)
    assert "--data-root" in err or "not a regular file" in err, err
    assert not cache.exists() or "do-not-leak-7f3a" not in "".join(p.read_bytes().decode("latin-1") for p in cache.rglob("*") if p.is_file())


def test_a_declared_data_root_lets_a_source_in(tmp_path: Path) -> None:
    data = tmp_path / "datasets"
    data.mkdir()
    rng = np.random.default_rng(0)
    (data / "d.csv").write_text("x_0,x_1,y\n" + "".join(f"{a:.3f},{b:.3f},{int(a > b)}\n" for a, b in rng.normal(size=(128, 2))))
    path = project(tmp_path / "p", source=f'(csv "{data / "d.csv"}")', steps=5)
    assert cli("run", str(path), "--store", str(tmp_path / "runs"))[0] == 5
    code, _, err = cli("run", str(path), "--store", str(tmp_path / "runs"), "--data-root", str(data))
    assert code == 0, err


# -- one writer per run folder -----------------------------------------------------------------


def test_concurrent_writers_never_interleave(tmp_path: Path) -> None:
    """Four `run`s of one slug at once: one takes the folder and trains, the other three exit
    4 naming the holder; the holder, stopped once they are gone, exits 75 (resumable) with
    one unbroken history. The run is far longer than the race, so nobody arrives after it
    ended."""
    path = project(tmp_path / "p", steps=10_000_000, every=50)
    store = tmp_path / "runs"
    procs = [spawn("run", str(path), "--store", str(store), "--quiet") for _ in range(4)]
    wait_for(lambda: sum(p.poll() is not None for p in procs) == 3, "three of the four runs refused")
    (holder,) = [p for p in procs if p.poll() is None]
    for loser in (p for p in procs if p is not holder):
        err = loser.stderr.read() if loser.stderr else ""
        assert loser.returncode == 4 and "being written by another attempt" in err, (loser.returncode, err)
    wait_for(lambda: any(store.glob("*/checkpoints/LATEST")), "the holder's first checkpoint")
    holder.send_signal(signal.SIGTERM)
    assert holder.wait(timeout=120) == 75, holder.stderr.read() if holder.stderr else ""
    events = [json.loads(line) for line in (run_folder(store) / "events.jsonl").read_text().splitlines()]
    assert sum(e["kind"] == "run.start" for e in events) == 1
    steps = [e["step"] for e in events if e["kind"] == "step"]
    assert steps == list(range(10, steps[-1] + 1, 10)) and steps[-1] >= 50


def test_the_lease_of_a_dead_writer_is_taken_over_at_once(tmp_path: Path) -> None:
    """A run SIGKILLed after its first checkpoint leaves its lease; the same command right
    away takes it over (its process is gone) and resumes."""
    path = project(tmp_path / "p", steps=20000, every=20)
    store = tmp_path / "runs"
    proc = spawn("run", str(path), "--store", str(store), "--quiet")
    wait_for(lambda: any(store.glob("*/checkpoints/step-000020/MANIFEST.json")), "the first checkpoint")
    proc.kill()
    proc.wait()
    assert (run_folder(store) / "lease.json").exists()
    code, out, err = cli("run", str(path), "--store", str(store), "--quiet", "--max-steps", "40")
    assert code == 0 and "resumed from step-" in out, (out, err)
    assert not (run_folder(store) / "lease.json").exists()  # released at the end


# -- a stop request at every phase -----------------------------------------------------------


SPIN = '(format t "compiling~%")\n(defvar *spin* (let ((n 0)) (dotimes (i 20000000) (setq n (+ n 1))) n))\n'


def test_sigterm_while_compiling_stops_at_once_with_nothing_written(tmp_path: Path) -> None:
    path = project(tmp_path / "p", head=SPIN)
    store = tmp_path / "runs"
    proc = spawn("run", str(path), "--store", str(store), "--max-eval-steps", "1000000000")
    assert proc.stderr is not None and proc.stderr.readline() == "compiling\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    assert "stopped by SIGTERM before training" in proc.stderr.read()
    assert not store.exists()


@pytest.mark.parametrize("phase", ["started", "training", "checkpointed"])
def test_sigterm_after_the_run_started_stops_resumably(tmp_path: Path, phase: str) -> None:
    path = project(tmp_path / "p", steps=100000, every=30)
    store = tmp_path / "runs"
    proc = spawn("run", str(path), "--store", str(store), "--quiet")
    events: dict[str, Callable[[], bool]] = {
        "started": lambda: any(store.glob("*/run.json")),
        "training": lambda: any(store.glob("*/status.json")) and status_of(store).get("step", 0) > 0,
        "checkpointed": lambda: any(store.glob("*/checkpoints/step-000030/MANIFEST.json")),
    }
    wait_for(events[phase], phase)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, (out, err)
    status = status_of(store)
    assert status["state"] == "stopped" and "stopped by SIGTERM" in status["summary"]["reason"], status
    if status["step"] > 0:  # the stop step is checkpointed: nothing since the last one is lost
        assert status["last_checkpoint"] == f"step-{status['step']:06d}", status
