"""Stores that fight back, read by `logs`, `plot`, `runs` and the dashboard: events that are
not UTF-8, not JSON or not events (a warning naming the file and the line, the rest read), a
1 GB status.json (refused before it is read: the commands stay small), an events file that is
a symbolic link (the link and its target named, not the store), and an S3 server restarted
empty during a run (the store lost the run's files, not "another attempt").

Events are read incrementally, one reader per run that remembers its byte offset: the unit
tests below show it reads only what was added and waits for a torn last line."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
import pytest

from conftest import REPO, wait_for
from results_store import TINY, quietly, write_file
from sexpgpu.runtime.events import DiagnosticEvent, EventReader, ResumeEvent, StepEvent, WarningEvent, events_prefix
from sexpgpu.runtime.status import STATUS_LIMIT
from sexpgpu.runtime.store import Store

sys.path.insert(0, str(Path(__file__).parent))
import peak_memory  # noqa: E402
from s3_server import MotoS3, PausableProxy, boto3_client, make_bucket, patched_env, s3_env  # noqa: E402

GIGABYTE = 1 << 30
# what a CLI process may grow to while it lists or plots a store with a 1 GB file: the
# interpreter, numpy and the plot extra take ~200 MB; reading the file would take 1 GB more
MEMORY_BOUND_KB = 700 * 1024
def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1", **(env or {})}
    return subprocess.run([sys.executable, "-c", peak_memory.MEASURED_CLI, *args], capture_output=True, text=True, timeout=300, env=full)


def peak_kb(done: subprocess.CompletedProcess[str]) -> int:
    return peak_memory.peak_kb(done.stderr)


def step_line(step: int, loss: float = 0.5) -> str:
    return StepEvent(step=step, loss=loss).to_line()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real run of the tiny MLP (40 steps, a step event every 5): its run folder."""
    base = tmp_path_factory.mktemp("hostile")
    root = base / "runs"
    path = write_file(base / "project")
    assert quietly("run", str(path), "--store", str(root), "--quiet") == 0
    (folder,) = [p for p in root.iterdir() if p.is_dir()]
    return folder


@pytest.fixture
def run(trained: Path, tmp_path: Path) -> Path:
    """A private copy of the trained run folder, in a store of its own."""
    target = tmp_path / "runs" / trained.name
    shutil.copytree(trained, target)
    return target


# -- the reader -----------------------------------------------------------------------------------


def test_the_reader_reads_only_what_was_added_and_waits_for_a_torn_last_line(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path / "runs"))
    slug = "r.base.00000001"
    prefix = events_prefix(slug)
    log = tmp_path / "runs" / slug / "events.jsonl"
    store.append_lines(prefix, [step_line(1), step_line(2)])
    reader = EventReader(store, slug)
    assert [e["step"] for _, e in reader.update()] == [1, 2]
    # bytes already read are not read again: spoiling them in place (past the first line,
    # which the reader keeps to notice a replaced file) goes unnoticed
    data = log.read_bytes()
    second = data.index(b"\n") + 1
    log.write_bytes(data[:second] + b"\xff" * (len(data) - second - 1) + b"\n")
    with open(log, "ab") as handle:
        handle.write((step_line(3) + "\n" + step_line(4)[:20]).encode())  # a whole line, then a torn one
    assert [e["step"] for _, e in reader.update()] == [3]
    assert reader.warnings == []
    with open(log, "ab") as handle:
        handle.write((step_line(4)[20:] + "\n").encode())  # the torn line completed
    assert [e["step"] for _, e in reader.update()] == [4]
    assert reader.update() == []
    assert [e["step"] for e in reader.events()] == [1, 2, 3, 4]
    # a fresh reader reads it all, and says what is wrong where
    fresh = EventReader(store, slug)
    assert [e["step"] for _, e in fresh.update()] == [1, 3, 4]
    assert fresh.warnings == [f"{log}:2: not UTF-8 (byte 0xff at column 1); the line is skipped"]
    # a log that got shorter (a fresh run in the folder) is read again from its start
    seventh = step_line(7)
    log.write_text(seventh + "\n")
    assert [e["step"] for _, e in reader.update()] == [7] and reader.resets == 1 and reader.events() == [json.loads(seventh)]


def test_every_event_as_written_reads_back_valid(tmp_path: Path) -> None:
    """A writer leaves a None out of its line (a resume that started over has no
    `checkpoint`): the reader takes the line as the None it was, not as a bad line."""
    store = Store.open(str(tmp_path / "runs"))
    written = [step_line(5), step_line(10), ResumeEvent(step=0, from_step=0, checkpoint=None).to_line(), step_line(5, 0.25),
               WarningEvent(message="checkpoint skipped").to_line(), DiagnosticEvent(step=5, values={"a": None}).to_line()]
    store.append_lines(events_prefix("r.base.1"), written)
    reader = EventReader(store, "r.base.1")
    assert len(reader.update()) == len(written) and reader.warnings == []
    assert [(e["kind"], e.get("loss")) for e in reader.events()] == [("resume", None), ("step", 0.25), ("warning", None), ("diagnostic", None)]


def test_the_reader_over_s3_reads_each_new_segment_once() -> None:
    pytest.importorskip("s3fs")
    with MotoS3() as moto:
        bucket = make_bucket(None, moto.endpoint)
        with patched_env(s3_env(moto.endpoint)):
            store = Store.open(f"s3://{bucket}/team")
            slug = "r.base.00000001"
            store.append_lines(events_prefix(slug), [step_line(1), "not json"])
            reader = EventReader(store, slug)
            assert [e["step"] for _, e in reader.update()] == [1]
            assert reader.warnings == [f"s3://{bucket}/team/{slug}/events/000000.jsonl:2: not JSON (Expecting value: line 1 column 1 (char 0)); the line is skipped"]
            client = boto3_client(moto.endpoint)
            client.put_object(Bucket=bucket, Key=f"team/{slug}/events/000000.jsonl", Body=b"spoiled, and not read again\n")
            store.append_lines(events_prefix(slug), [step_line(2)])
            assert [e["step"] for _, e in reader.update()] == [2] and len(reader.warnings) == 1


# -- bad lines --------------------------------------------------------------------------------------


BAD_LINES = [
    (b'{"v":1,"t":"2026-01-01T00:00:00.000Z","kind":"step","step":3,"loss":0.5,"note":"caf\xe9"}', "not UTF-8 (byte 0xe9 at column "),
    (b"this is not json", "not JSON (Expecting value"),
    (b'{"v":1,"kind":"step","step":"three"}', "not a valid 'step' event (step: "),
    (b"[1, 2]", "not a JSON object (a JSON list)"),
]


def spoil(events: Path) -> list[str]:
    """BAD_LINES put after the third line of EVENTS; the warnings to expect, by line number."""
    lines = events.read_bytes().splitlines()
    spoiled = lines[:3] + [bad for bad, _ in BAD_LINES] + lines[3:]
    events.write_bytes(b"\n".join(spoiled) + b"\n")
    return [f"{events}:{4 + i}: {what}" for i, (_, what) in enumerate(BAD_LINES)]


def warnings_of(stderr: str) -> list[str]:
    return [line.removeprefix("sexpgpu: warning: ") for line in stderr.splitlines() if line.startswith("sexpgpu: warning: ")]


def assert_warned(found: list[str], expected: list[str]) -> None:
    assert len(found) == len(expected), found
    for line, start in zip(found, expected):
        assert line.startswith(start) and line.endswith("; the line is skipped"), (line, start)


def test_bad_lines_in_events_are_warnings_naming_the_file_and_line(run: Path) -> None:
    expected = spoil(run / "events.jsonl")
    good = sum(1 for line in (run / "events.jsonl").read_bytes().splitlines()) - len(BAD_LINES)
    logs = cli("logs", str(run), "--json", "--all")
    assert logs.returncode == 0, logs.stderr
    assert len(logs.stdout.splitlines()) == good
    assert_warned(warnings_of(logs.stderr), expected)
    plot = cli("plot", str(run), "--terminal")
    assert plot.returncode == 0, plot.stderr
    assert_warned(warnings_of(plot.stderr), expected)
    assert "internal error" not in logs.stderr + plot.stderr


def test_the_dashboard_answers_for_a_run_with_bad_lines(run: Path) -> None:
    expected = spoil(run / "events.jsonl")
    with serving(run.parent) as (url, _):
        events = json.loads(fetch(f"{url}api/run/{run.name}/events"))
        curves = json.loads(fetch(f"{url}api/run/{run.name}/curves"))
    assert_warned(events["warnings"], expected)
    assert_warned(curves["warnings"], expected)
    assert [s["name"] for s in curves["series"]][:2] == ["loss", "acc"] and events["events"][0]["kind"] == "run.start"


# -- a 1 GB status.json -------------------------------------------------------------------------------


def sparse(path: Path, size: int) -> None:
    """PATH replaced by a file of SIZE bytes that takes no room (a hole)."""
    path.unlink()
    with open(path, "wb") as handle:
        handle.truncate(size)


def test_a_gigabyte_status_file_is_refused_unread_and_the_run_still_listed(run: Path) -> None:
    status = run / "status.json"
    sparse(status, GIGABYTE)
    warning = f"{status} is {GIGABYTE:,} bytes, more than the {STATUS_LIMIT:,} it may be: not read"
    runs = cli("runs", str(run.parent))
    assert runs.returncode == 0, runs.stderr
    assert run.name in runs.stdout and "tiny.lisp" in runs.stdout  # listed with what run.json says
    assert warning in runs.stderr
    assert peak_kb(runs) < MEMORY_BOUND_KB
    plot = cli("plot", str(run), "--terminal")
    assert plot.returncode == 0, plot.stderr
    assert warning in plot.stderr
    assert peak_kb(plot) < MEMORY_BOUND_KB
    status_verb = cli("status", str(run))
    assert status_verb.returncode == 1 and status_verb.stderr.startswith(f"sexpgpu: {warning}"), status_verb.stderr


def test_the_dashboard_stays_small_with_a_gigabyte_status_file(run: Path) -> None:
    sparse(run / "status.json", GIGABYTE)
    with serving(run.parent) as (url, pid):
        listing = json.loads(fetch(f"{url}api/runs"))
        page = json.loads(fetch(f"{url}api/run/{run.name}"))
        peak = peak_of(pid)
    (record,) = listing["runs"]
    assert record["slug"] == run.name and record["file"].endswith("tiny.lisp") and "more than the" in record["problem"]
    assert page["status"] is None and page["info"]["ir_hash"]
    assert peak < MEMORY_BOUND_KB


def peak_of(pid: int) -> int:
    """The peak resident memory of process PID so far, in kB (Linux's VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc")


# -- a symbolic link ----------------------------------------------------------------------------------


def test_plot_of_a_symlinked_events_file_names_the_link_and_its_target(run: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.jsonl"
    shutil.move(run / "events.jsonl", elsewhere)
    (run / "events.jsonl").symlink_to(elsewhere)
    for args in (("plot", str(run), "--terminal"), ("logs", str(run))):
        done = cli(*args)
        assert done.returncode == 4, done.stderr
        assert f"{run / 'events.jsonl'} is a symbolic link to {elsewhere}, not a regular file" in done.stderr, done.stderr
        assert "the store" not in done.stderr
    with serving(run.parent) as (url, _):
        try:
            urllib.request.urlopen(f"{url}api/run/{run.name}/curves", timeout=60)
            raise AssertionError("the curves of a run whose events file is a link were served")
        except urllib.error.HTTPError as refused:
            assert refused.code == 502
            assert json.loads(refused.read())["error"].startswith(f"{run / 'events.jsonl'} is a symbolic link to {elsewhere}")
    elsewhere.unlink()
    done = cli("plot", str(run), "--terminal")
    assert done.returncode == 4 and f"a symbolic link to {elsewhere}, which does not exist" in done.stderr, done.stderr


# -- S3 restarted empty -------------------------------------------------------------------------------


def test_an_s3_store_restarted_empty_mid_run_says_it_lost_the_runs_files(tmp_path: Path) -> None:
    """The server goes down, comes back empty with its bucket provisioned again (moto's state
    reset): the run says the store lost its files, checkpoints this step anew and stops
    resumably; it does not blame another attempt."""
    pytest.importorskip("s3fs")
    path = write_file(tmp_path / "project", text=TINY.replace("(defknob steps 40)", "(defknob steps 1000000)")
                      .replace(":log-every 5)", ":log-every 5 :checkpoint (:every 400 :keep 2))"))
    with MotoS3() as moto, PausableProxy(moto.port) as proxy:
        bucket = make_bucket(None, proxy.endpoint)
        env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1", **{k: v for k, v in s3_env(proxy.endpoint).items() if v}}
        process = subprocess.Popen([sys.executable, "-m", "sexpgpu", "run", str(path), "--store", f"s3://{bucket}/team", "--quiet"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            client = boto3_client(moto.endpoint)

            def keys() -> list[str]:
                return [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]

            wait_for(lambda: any(k.endswith("/events/000001.jsonl") for k in keys()), "the run's second events segment")
            proxy.pause()  # the server is down ...
            urllib.request.urlopen(urllib.request.Request(f"{moto.endpoint}/moto-api/reset", method="POST"), timeout=30).read()
            client.create_bucket(Bucket=bucket)  # ... and back, empty, its bucket provisioned again
            proxy.resume()
            out, err = process.communicate(timeout=300)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 75, (out, err)
    assert "the store lost this run's run.json" in out, (out, err)
    assert "another attempt" not in out + err


# -- the dashboard as a process ----------------------------------------------------------------------


class serving:
    """`sexpgpu ui ROOT` in its own process: (its URL, its pid) while it serves."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __enter__(self) -> tuple[str, int]:
        self.process = subprocess.Popen([sys.executable, "-m", "sexpgpu", "ui", str(self.root), "--interval", "0.2"],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env={**os.environ, "PYTHONPATH": str(REPO)})
        assert self.process.stdout is not None
        first = self.process.stdout.readline()
        match = re.match(r"sexpgpu ui: (http://127\.0\.0\.1:\d+/)", first)
        assert match, (first, self.process.stderr.read() if self.process.stderr else "")
        return match.group(1), self.process.pid

    def __exit__(self, *exc_info: object) -> None:
        self.process.terminate()
        self.process.communicate(timeout=30)


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:
        assert response.status == 200
        body: bytes = response.read()
        return body
