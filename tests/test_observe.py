"""Reading a run folder from the command line: status, logs (resume supersession, --follow),
checkpoint list/show/verify/export (tampered and truncated files), annotate.

Run folders come from training the quickstart for real; every verb runs as a user runs it,
in its own process, on a local folder (memory:// is per process, so it is only exercised
in-process here; S3 is covered by the store's tests)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load as load_tensors

from conftest import REPO
from sexpgpu.cli.main import main
from sexpgpu.cli.observe import event_line, read_safetensors_header, split_run
from sexpgpu.compile.pipeline import compile_file
from sexpgpu.runtime import checkpoint as ck
from sexpgpu.runtime.events import events_prefix
from sexpgpu.runtime.attempt import RunOptions, train
from sexpgpu.runtime.trainer import Trainer
from sexpgpu.runtime.store import Store

QUICKSTART = REPO / "examples" / "quickstart.lisp"


def sexpgpu(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "NO_COLOR": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "sexpgpu", *args], capture_output=True, text=True, timeout=timeout, env=full, cwd=cwd)


def experiment():  # type: ignore[no-untyped-def]
    result = compile_file(QUICKSTART)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    return result.experiment


def ensure_checkpoint(store: Store, slug: str, step: int) -> None:
    """A checkpoint at STEP, written directly if the loop did not write one there."""
    if any(c.step == step for c in ck.list_checkpoints(store, slug)):
        return
    exp = experiment()
    trainer = Trainer(exp)
    for _ in range(step):
        trainer.train_step()
    state = ck.CheckpointState(step=step, slug=slug, source_hash=exp.source_hash, ir_hash=exp.ir_hash, knobs=exp.knob_values())
    latest = f"{slug}/checkpoints/LATEST"
    before = store.read_text(latest) if store.exists(latest) else None
    ck.write_checkpoint(store, slug, step, trainer.params, trainer.states, state)
    if before is not None and int(before.strip().split("-")[1]) > step:
        store.write_text(latest, before)  # an older step written after a newer one: LATEST stays the newest


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quickstart trained for 20 of its 300 steps (truncated by --max-steps), with
    checkpoints at steps 10 and 20."""
    root = tmp_path_factory.mktemp("observe") / "runs"
    result = train(experiment(), RunOptions(store=str(root), max_steps=20, sources={"quickstart.lisp": QUICKSTART.read_bytes()}), say=lambda _: None)
    assert result.exit_code == 0, result.reason
    store = Store.open(str(root))
    ensure_checkpoint(store, result.slug, 20)
    ensure_checkpoint(store, result.slug, 10)
    return root / result.slug


@pytest.fixture
def run_dir(base_run: Path, tmp_path: Path) -> Path:
    """A private copy of the base run, free to tamper with."""
    target = tmp_path / "runs" / base_run.name
    shutil.copytree(base_run, target)
    return target


# -- RUN ----------------------------------------------------------------------------------------


def test_split_run_takes_the_last_segment_as_the_slug(tmp_path: Path) -> None:
    assert split_run("s3://bucket/prefix/exp.base.12345678") == ("s3://bucket/prefix", "exp.base.12345678")
    assert split_run("s3://bucket/exp.base.12345678/") == ("s3://bucket", "exp.base.12345678")
    assert split_run("memory://exp.base.1") == ("memory://", "exp.base.1")
    assert split_run("memory:///runs/exp.base.1") == ("memory:///runs", "exp.base.1")
    folder = tmp_path / "runs" / "exp.base.1"
    folder.mkdir(parents=True)
    assert split_run(str(folder) + "/") == (str(tmp_path / "runs"), "exp.base.1")
    assert split_run("exp.base.1", store="s3://b/p") == ("s3://b/p", "exp.base.1")


def test_a_bare_slug_is_found_in_the_store(run_dir: Path, tmp_path: Path) -> None:
    by_env = sexpgpu("status", run_dir.name, "--json", env={"SEXPGPU_STORE": str(run_dir.parent)}, cwd=tmp_path)
    assert by_env.returncode == 0, by_env.stderr
    by_flag = sexpgpu("status", run_dir.name, "--store", str(run_dir.parent), "--json")
    assert by_flag.returncode == 0, by_flag.stderr
    assert json.loads(by_env.stdout)["state"] == json.loads(by_flag.stdout)["state"] == "truncated"
    by_default = sexpgpu("status", run_dir.name, cwd=run_dir.parent.parent, env={"SEXPGPU_STORE": ""})
    assert by_default.returncode == 0, by_default.stderr  # ./runs


# -- status -------------------------------------------------------------------------------------


def test_status_for_people_and_as_json(run_dir: Path) -> None:
    text = sexpgpu("status", str(run_dir))
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == f"{run_dir.name}  {run_dir}"
    body = "\n".join(lines)
    for label in ("state      truncated", "step       20/20", "metrics    loss ", "heartbeat  ", "attempt    1 on ", "summary    truncated at step 20 by --max-steps (the run asks for 300) (exit 0)", "examples seen 1280"):
        assert label in body, body
    doc = sexpgpu("status", str(run_dir), "--json")
    assert doc.returncode == 0
    assert json.loads(doc.stdout) == json.loads((run_dir / "status.json").read_text())


def test_status_without_a_status_file_exits_2_and_says_where(tmp_path: Path, run_dir: Path) -> None:
    missing = sexpgpu("status", str(tmp_path / "runs" / "nothing.base.00000000"))
    assert missing.returncode == 2
    assert str(tmp_path / "runs" / "nothing.base.00000000" / "status.json") in missing.stderr
    (run_dir / "status.json").unlink()
    gone = sexpgpu("status", str(run_dir), "--json")
    assert gone.returncode == 2 and gone.stdout == ""
    assert str(run_dir / "status.json") in gone.stderr


def test_status_of_a_running_run_shows_eta(run_dir: Path) -> None:
    status = json.loads((run_dir / "status.json").read_text())
    status.update(state="running", step=10, eta_s=125.0, summary=None, last_eval={"val/acc": 0.5})
    (run_dir / "status.json").write_text(json.dumps(status))
    text = sexpgpu("status", str(run_dir)).stdout
    assert "state      running" in text and "eta        2m05s" in text and "last eval  val/acc 0.5" in text
    assert "summary" not in text


# -- logs ---------------------------------------------------------------------------------------


def test_logs_as_json_are_the_stored_lines(run_dir: Path) -> None:
    proc = sexpgpu("logs", str(run_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == (run_dir / "events.jsonl").read_text().splitlines()
    kinds = [json.loads(line)["kind"] for line in proc.stdout.splitlines()]
    assert kinds[0] == "run.start" and kinds[-1] == "run.end" and kinds.count("step") == 2


def test_logs_for_people(run_dir: Path) -> None:
    proc = sexpgpu("logs", str(run_dir))
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert len(lines) == len((run_dir / "events.jsonl").read_text().splitlines())
    step = next(line for line in lines if " step " in line)
    assert "loss " in step and "lr all=0.1" in step and "grad_norm " in step
    assert "run.end" in lines[-1] and "exit_code=0" in lines[-1] and "truncated at step 20 by --max-steps" in lines[-1]


def test_logs_kind_and_tail(run_dir: Path) -> None:
    steps = sexpgpu("logs", str(run_dir), "--json", "--kind", "step")
    assert [json.loads(line)["step"] for line in steps.stdout.splitlines()] == [10, 20]
    both = sexpgpu("logs", str(run_dir), "--json", "--kind", "step", "--kind", "run.start")
    assert [json.loads(line)["kind"] for line in both.stdout.splitlines()] == ["run.start", "step", "step"]
    last = sexpgpu("logs", str(run_dir), "--json", "--kind", "step", "-n", "1")
    assert [json.loads(line)["step"] for line in last.stdout.splitlines()] == [20]


def test_logs_apply_resume_supersession_unless_all(run_dir: Path) -> None:
    store = Store.open(str(run_dir.parent))
    slug = run_dir.name
    later = [
        {"v": 1, "t": "2026-01-01T00:00:00.000Z", "kind": "run.start", "step": 0, "slug": slug, "attempt": 2},
        {"v": 1, "t": "2026-01-01T00:00:01.000Z", "kind": "resume", "step": 10, "from_step": 10, "checkpoint": "checkpoints/step-000010", "attempt": 2},
        {"v": 1, "t": "2026-01-01T00:00:02.000Z", "kind": "step", "step": 20, "loss": 0.5},
        {"v": 1, "t": "2026-01-01T00:00:03.000Z", "kind": "run.end", "step": 20, "exit_code": 0, "reason": "finished"},
    ]
    store.append_lines(events_prefix(slug), [json.dumps(e) for e in later])
    kept = [json.loads(line) for line in sexpgpu("logs", str(run_dir), "--json").stdout.splitlines()]
    steps = [e for e in kept if e["kind"] == "step"]
    assert [(e["step"], e["loss"]) for e in steps] == [(10, steps[0]["loss"]), (20, 0.5)]  # the first attempt's step 20 is gone
    assert [e["kind"] for e in kept].count("run.end") == 2  # attempt history stays
    everything = [json.loads(line) for line in sexpgpu("logs", str(run_dir), "--json", "--all").stdout.splitlines()]
    assert [e["step"] for e in everything if e["kind"] == "step"] == [10, 20, 20]
    assert len(everything) == len((run_dir / "events.jsonl").read_text().splitlines())


def test_logs_follow_stops_at_run_end(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path / "runs"))
    slug = "live.base.00000001"
    store.write_json(f"{slug}/run.json", {"slug": slug})
    store.append_lines(events_prefix(slug), [json.dumps({"v": 1, "t": "2026-01-01T00:00:00.000Z", "kind": "run.start", "step": 0, "slug": slug})])
    env = {**os.environ, "NO_COLOR": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sexpgpu", "logs", str(tmp_path / "runs" / slug), "--follow", "--json", "--interval", "0.05", "--timeout", "30"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert first["kind"] == "run.start"
        store.append_lines(events_prefix(slug), [json.dumps({"v": 1, "t": "2026-01-01T00:00:01.000Z", "kind": "step", "step": 10, "loss": 1.0})])
        assert json.loads(proc.stdout.readline())["step"] == 10
        store.append_lines(events_prefix(slug), [json.dumps({"v": 1, "t": "2026-01-01T00:00:02.000Z", "kind": "run.end", "step": 10, "exit_code": 0, "reason": "finished"})])
        assert json.loads(proc.stdout.readline())["kind"] == "run.end"
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_logs_follow_times_out_and_ends_at_once_on_an_ended_run(tmp_path: Path, run_dir: Path) -> None:
    started = time.monotonic()
    done = sexpgpu("logs", str(run_dir), "--follow", "--interval", "5", "--timeout", "30")
    assert done.returncode == 0 and time.monotonic() - started < 20  # run.end already there
    store = Store.open(str(tmp_path / "runs"))
    slug = "quiet.base.00000002"
    store.append_lines(events_prefix(slug), [json.dumps({"v": 1, "kind": "run.start", "step": 0, "slug": slug})])
    started = time.monotonic()
    waited = sexpgpu("logs", str(tmp_path / "runs" / slug), "--follow", "--interval", "0.1", "--timeout", "0.5")
    assert waited.returncode == 0 and 0.5 <= time.monotonic() - started < 20
    assert waited.stdout.count("run.start") == 1


def test_logs_of_nothing_exits_2(tmp_path: Path) -> None:
    proc = sexpgpu("logs", str(tmp_path / "nope.base.00000000"))
    assert proc.returncode == 2 and "no run at" in proc.stderr


def test_event_line_shows_unknown_kinds_and_keys() -> None:
    line = event_line({"v": 1, "t": "2026-01-01T10:11:12.000Z", "kind": "future.kind", "step": 3, "color": "red", "n": 2.5})
    assert line.startswith("10:11:12") and "future.kind" in line and "color=red" in line and "n=2.5" in line


# -- checkpoint ---------------------------------------------------------------------------------


def test_checkpoint_list(run_dir: Path) -> None:
    proc = sexpgpu("checkpoint", str(run_dir), "list", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    rows = {r["name"]: r for r in doc["checkpoints"]}
    assert {"step-000010", "step-000020"} <= set(rows)
    assert all(r["valid"] and r["reason"] == "" for r in rows.values())
    assert rows["step-000010"]["step"] == 10
    assert doc["latest"] == (run_dir / "checkpoints" / "LATEST").read_text().strip()
    text = sexpgpu("checkpoint", str(run_dir))  # list is the default
    assert text.returncode == 0 and "step-000010" in text.stdout and "LATEST: " in text.stdout


def test_checkpoint_show(run_dir: Path) -> None:
    proc = sexpgpu("checkpoint", str(run_dir), "show", "10", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["valid"] and doc["state"]["step"] == 10 and doc["state"]["slug"] == run_dir.name
    params = load_tensors((run_dir / "checkpoints" / "step-000010" / "params.safetensors").read_bytes())
    assert set(doc["params"]["tensors"]) == set(params)
    for name, array in params.items():
        assert doc["params"]["tensors"][name]["shape"] == list(array.shape)
        assert doc["params"]["tensors"][name]["dtype"] == "F32"
    assert doc["params"]["values"] == 387
    assert doc["optim"]["count"] >= 0 and set(doc["manifest"]["files"]) >= {"params.safetensors", "state.json"}
    text = sexpgpu("checkpoint", str(run_dir), "show", "step-000010")
    assert text.returncode == 0 and "state.json" in text.stdout and "params.safetensors: " in text.stdout
    assert sexpgpu("checkpoint", str(run_dir), "show", "latest").returncode == 0


def test_checkpoint_verify_ok(run_dir: Path) -> None:
    proc = sexpgpu("checkpoint", str(run_dir), "verify", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["ok"] is True
    assert "step-000010  ok" in sexpgpu("checkpoint", str(run_dir), "verify").stdout


def test_export_safetensors_and_npz(run_dir: Path, tmp_path: Path) -> None:
    source = (run_dir / "checkpoints" / "step-000010" / "params.safetensors").read_bytes()
    out = tmp_path / "params.safetensors"
    proc = sexpgpu("checkpoint", str(run_dir), "export", "10", "--format", "safetensors", "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["file"] == str(out)
    assert out.read_bytes() == source
    npz = tmp_path / "params.npz"
    proc = sexpgpu("checkpoint", str(run_dir), "export", "10", "-o", str(npz))  # format from the name
    assert proc.returncode == 0, proc.stderr
    with np.load(npz) as arrays:
        expected = load_tensors(source)
        assert set(arrays.files) == set(expected)
        for name in expected:
            assert arrays[name].dtype == expected[name].dtype
            assert np.array_equal(arrays[name], expected[name])
    default = sexpgpu("checkpoint", str(run_dir), "export", "20", "--format", "npz", cwd=tmp_path)
    assert default.returncode == 0 and (tmp_path / f"{run_dir.name}.step-000020.npz").is_file()


def test_a_tampered_checkpoint(run_dir: Path, tmp_path: Path) -> None:
    params = run_dir / "checkpoints" / "step-000010" / "params.safetensors"
    data = bytearray(params.read_bytes())
    data[-1] ^= 0xFF  # same length, different bytes
    params.write_bytes(bytes(data))
    verify = sexpgpu("checkpoint", str(run_dir), "verify", "--json")
    assert verify.returncode == 6
    rows = {r["name"]: r for r in json.loads(verify.stdout)["checkpoints"]}
    assert rows["step-000010"]["corrupt"] and "sha256" in rows["step-000010"]["reason"]
    assert rows["step-000020"]["valid"]
    text = sexpgpu("checkpoint", str(run_dir), "verify")
    assert text.returncode == 6 and "step-000010  CORRUPT" in text.stdout
    out = tmp_path / "x.safetensors"
    export = sexpgpu("checkpoint", str(run_dir), "export", "10", "-o", str(out))
    assert export.returncode == 6 and not out.exists() and "sha256" in export.stderr
    assert sexpgpu("checkpoint", str(run_dir), "show", "10").returncode == 6
    assert sexpgpu("checkpoint", str(run_dir), "export", "20", "-o", str(out)).returncode == 0


def test_a_truncated_checkpoint(run_dir: Path, tmp_path: Path) -> None:
    params = run_dir / "checkpoints" / "step-000020" / "params.safetensors"
    params.write_bytes(params.read_bytes()[:100])
    verify = sexpgpu("checkpoint", str(run_dir), "verify")
    assert verify.returncode == 6 and "truncated" in verify.stdout
    show = sexpgpu("checkpoint", str(run_dir), "show", "20", "--json")
    assert show.returncode == 6
    doc = json.loads(show.stdout)
    assert not doc["valid"] and "error" in doc["params"]  # the header no longer fits
    export = sexpgpu("checkpoint", str(run_dir), "export", "20", "--format", "npz", "-o", str(tmp_path / "p.npz"))
    assert export.returncode == 6 and not (tmp_path / "p.npz").exists()


def test_an_unpublished_checkpoint_is_not_corrupt(run_dir: Path) -> None:
    (run_dir / "checkpoints" / "step-000010" / "MANIFEST.json").unlink()
    verify = sexpgpu("checkpoint", str(run_dir), "verify")
    assert verify.returncode == 0 and "step-000010  unpublished" in verify.stdout
    listed = json.loads(sexpgpu("checkpoint", str(run_dir), "list", "--json").stdout)
    row = next(r for r in listed["checkpoints"] if r["name"] == "step-000010")
    assert not row["valid"] and not row["published"] and "MANIFEST" in row["reason"]
    assert sexpgpu("checkpoint", str(run_dir), "export", "10").returncode == 6


def test_checkpoint_usage_errors(run_dir: Path) -> None:
    assert sexpgpu("checkpoint", str(run_dir), "show").returncode == 2
    assert sexpgpu("checkpoint", str(run_dir), "verify", "10").returncode == 2
    assert sexpgpu("checkpoint", str(run_dir), "list", "--format", "npz").returncode == 2
    assert sexpgpu("checkpoint", str(run_dir), "show", "banana").returncode == 2
    missing = sexpgpu("checkpoint", str(run_dir), "show", "999")
    assert missing.returncode == 2 and "step-000999" in missing.stderr


def test_safetensors_header_reader() -> None:
    data = ck.encode_tensors({"a.w": np.zeros((2, 3), np.float32), "b": np.arange(4, dtype=np.int32)})
    tensors, meta = read_safetensors_header(data)
    assert tensors == {"a.w": {"dtype": "F32", "shape": [2, 3], "bytes": 24}, "b": {"dtype": "I32", "shape": [4], "bytes": 16}}
    assert meta == {"format": "sexpgpu-1"}
    with pytest.raises(ValueError):
        read_safetensors_header(data[:6])


# -- annotate -----------------------------------------------------------------------------------


def test_annotate(run_dir: Path) -> None:
    proc = sexpgpu("annotate", str(run_dir), "lr looks high; try 0.05", "--json", env={"USER": "ada"})
    assert proc.returncode == 0, proc.stderr
    written = json.loads(proc.stdout)
    assert written["kind"] == "annotation" and written["author"] == "ada" and written["step"] == 20
    last = json.loads((run_dir / "events.jsonl").read_text().splitlines()[-1])
    assert last == written
    shown = sexpgpu("logs", str(run_dir), "--kind", "annotation")
    assert '"lr looks high; try 0.05"' in shown.stdout and "(ada)" in shown.stdout
    assert sexpgpu("annotate", str(run_dir), "   ").returncode == 2
    assert sexpgpu("annotate", str(run_dir.parent / "nope.base.00000000"), "x").returncode == 2


# -- in one process: memory:// -------------------------------------------------------------------


def test_memory_store_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    url = "memory://observe-test"
    result = train(experiment(), RunOptions(store=url, max_steps=10), say=lambda _: None)
    run = f"{url}/{result.slug}"
    assert main(["status", run, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step"] == 10
    assert main(["annotate", run, "from memory"]) == 0
    capsys.readouterr()
    assert main(["logs", run, "--json", "--kind", "annotation"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == "from memory"
    assert main(["checkpoint", run, "verify"]) == 0
    capsys.readouterr()
    assert main(["status", f"{url}/absent.base.00000000"]) == 2
    assert "memory://" in capsys.readouterr().err
    Store.open(url).delete(result.slug, recursive=True)
