"""`sexpgpu runs [STORE]`: the table and --json of a store made by real runs, --sort,
--filter, --sweep, runs that are being written or do not read, and a store on a real S3
(moto's server on loopback) with many runs, read with only a folder listing and run.json and
status.json per run."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import REPO
from results_store import STEPS, SWEEP_POINTS, MadeStore, make_store
from sexpgpu.cli.main import main
from sexpgpu.results import listing
from sexpgpu.results.listing import Filter, RunRecord
from sexpgpu.runtime.runfolder import RunFolder
from sexpgpu.runtime.status import Status
from sexpgpu.runtime.store import Store


def sexpgpu(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "sexpgpu", *args], capture_output=True, text=True, timeout=120, env=full, cwd=cwd)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> MadeStore:
    return make_store(tmp_path_factory.mktemp("runs-cli") / "runs")


def in_process(*args: str) -> tuple[int, str, str]:
    """The CLI in this process (what a subprocess runs, without its start-up): exit code,
    stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def records(made: MadeStore, *args: str) -> list[RunRecord]:
    code, out, err = in_process("runs", str(made.root), "--json", *args)
    assert code == 0, err
    return [RunRecord.model_validate(item) for item in json.loads(out)]


# -- the table and the records ------------------------------------------------------------------


def test_the_table_has_a_row_per_run_and_the_columns_the_issue_asks_for(made: MadeStore) -> None:
    done = sexpgpu("runs", str(made.root))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = lines[0].split()
    assert header == ["slug", "file", "selection", "lr", "width", "state", "steps", "loss", "acc", "val/loss", "val/acc", "started", "duration", "device"]
    rows = lines[1:]
    assert len(rows) == len(made.slugs)
    for slug in made.slugs:
        row = next(r for r in rows if r.startswith(slug + " "))
        assert f" finished  {STEPS}/{STEPS} " in row and row.endswith(" cpu"), row
    point = next(r for r in rows if r.startswith(made.points[2]))
    assert " base grid-2 " in point
    assert done.stderr == ""


def test_json_records_carry_train_and_eval_metrics_from_status_json(made: MadeStore) -> None:
    found = {r.slug: r for r in records(made)}
    assert set(found) == set(made.slugs)
    store = Store.open(str(made.root))
    for slug, record in found.items():
        status = RunFolder(store, slug).read_status()
        assert status is not None
        assert record.state == "finished" and record.step == STEPS and record.steps == STEPS
        assert record.metrics == status.metrics and set(record.metrics) == {"loss", "acc"}
        assert record.eval == status.last_eval and set(record.eval) == {"val/loss", "val/acc"}
        assert record.started == status.started and record.device == "cpu" and record.file == str(made.file)
        assert record.duration_s is not None and record.duration_s >= 0
        assert record.reason == "finished" and record.exit_code == 0 and record.problem is None
    assert found[made.slugs[1]].knobs["lr"] == 0.3
    assert [found[p].point for p in made.points] == list(range(SWEEP_POINTS))
    assert {found[p].sweep for p in made.points} == {"grid"}


def test_sort_reverse_and_filters(made: MadeStore) -> None:
    by_loss = records(made, "--sort", "loss")
    losses = [r.metrics["loss"] for r in by_loss]
    assert losses == sorted(losses)  # type: ignore[type-var]
    by_acc = records(made, "--sort", "val/acc", "--reverse")
    accs = [r.eval["val/acc"] for r in by_acc]
    assert accs == sorted(accs, reverse=True)  # type: ignore[type-var]
    assert {r.slug for r in records(made, "--filter", "state=finished")} == set(made.slugs)
    assert records(made, "--filter", "state=running") == []
    wide = records(made, "--filter", "width=8")
    assert {r.slug for r in wide} == {made.points[0], made.points[2]}
    fast = records(made, "--filter", "lr>=0.2", "--filter", "sweep=grid")
    assert {r.slug for r in fast} == {made.points[2], made.points[3]}
    assert {r.slug for r in records(made, "--filter", "lr!=0.1")} == set(made.slugs[1:])
    best = min(losses)  # type: ignore[type-var]
    assert [r.slug for r in records(made, "--filter", f"loss<={best!r}")] == [by_loss[0].slug]


def test_sweep_lists_its_points_in_point_order(made: MadeStore) -> None:
    assert [r.slug for r in records(made, "--sweep", "grid")] == made.points
    code, out, _ = in_process("runs", str(made.root), "--sweep", "grid")
    assert code == 0 and [line.split()[0] for line in out.splitlines()[1:]] == made.points
    code, out, err = in_process("runs", str(made.root), "--sweep", "nope")
    assert code == 0 and out == "" and "no runs of sweep nope in " in err


@pytest.mark.parametrize("args,message", [
    (("--sort", "lss"), "no run here has 'lss'; keys: slug, file,"),
    (("--filter", "stat=finished"), "no run here has 'stat'"),
    (("--filter", "state"), "--filter state: write KEY=VALUE"),
    (("--filter", "loss<abc"), "< compares numbers; 'abc' is not one"),
    (("--filter", "=x"), "the KEY before = is empty"),
])
def test_bad_keys_and_filters_are_usage_errors(made: MadeStore, args: tuple[str, ...], message: str) -> None:
    code, _, err = in_process("runs", str(made.root), *args)
    assert code == 2 and message in err, err


def test_a_missing_store_is_exit_2_and_an_empty_one_says_so(tmp_path: Path) -> None:
    missing = sexpgpu("runs", str(tmp_path / "nope"))
    assert missing.returncode == 2 and f"no store at {tmp_path / 'nope'}: the folder does not exist" in missing.stderr
    (tmp_path / "empty").mkdir()
    empty = sexpgpu("runs", str(tmp_path / "empty"))
    assert empty.returncode == 0 and empty.stdout == "" and f"no runs in {tmp_path / 'empty'}" in empty.stderr
    (tmp_path / "runs").mkdir()
    default = sexpgpu("runs", cwd=tmp_path, env={"SEXPGPU_STORE": ""})
    assert default.returncode == 0 and f"no runs in {tmp_path / 'runs'}" in default.stderr
    by_env = sexpgpu("runs", "--json", cwd=tmp_path, env={"SEXPGPU_STORE": str(tmp_path / "empty")})
    assert by_env.returncode == 0 and json.loads(by_env.stdout) == []


# -- runs being written, and files that do not read --------------------------------------------


def test_runs_being_written_or_unreadable_are_shown_not_crashed_on(made: MadeStore, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    store = Store.open(str(root))
    source = Store.open(str(made.root))
    info = RunFolder(source, made.slugs[0]).read_run_info()
    status = RunFolder(source, made.slugs[0]).read_status()
    assert status is not None
    # a run that has written run.json and no status yet (it is compiling)
    store.write_json("tiny.base.00000001/run.json", info.model_copy(update={"slug": "tiny.base.00000001"}))
    # a running one, in the middle of its steps
    store.write_json("tiny.base.00000002/run.json", info.model_copy(update={"slug": "tiny.base.00000002"}))
    store.write_json("tiny.base.00000002/status.json", Status(state="running", step=10, steps=40, metrics={"loss": 1.5}))
    # a status.json cut short by something other than sexpgpu (sexpgpu publishes whole files)
    store.write_json("tiny.base.00000003/run.json", info.model_copy(update={"slug": "tiny.base.00000003"}))
    store.write_bytes("tiny.base.00000003/status.json", status.model_dump_json().encode()[:40])
    # a status with no run.json, and a state this version does not know
    store.write_bytes("tiny.base.00000004/status.json", json.dumps({"v": 1, "state": "pruned", "step": 7}).encode())
    # not runs: only a lease (nothing written yet), the Ray driver's ledger folder, a hidden folder
    store.write_json("tiny.base.00000005/lease.json", {"holder": "x"})
    store.write_json("sweeps/tiny.grid/sweep.json", {"points": []})
    store.write_json(".trash/run.json", {})
    done = sexpgpu("runs", str(root), "--json")
    assert done.returncode == 0, done.stderr
    found = {r["slug"]: r for r in json.loads(done.stdout)}
    assert set(found) == {f"tiny.base.0000000{i}" for i in (1, 2, 3, 4)}
    assert found["tiny.base.00000001"]["state"] is None and found["tiny.base.00000001"]["problem"] is None
    assert found["tiny.base.00000002"]["state"] == "running" and found["tiny.base.00000002"]["step"] == 10
    assert found["tiny.base.00000003"]["state"] is None and found["tiny.base.00000003"]["problem"].startswith("status.json does not read (ValidationError:")
    # the state is an open string: a version that knows `pruned` shows it, this one says it cannot read it
    unknown = found["tiny.base.00000004"]
    assert unknown["state"] == "pruned" or unknown["problem"].startswith("status.json does not read (ValidationError:"), unknown
    assert unknown["problem"].endswith("no run.json")
    table = sexpgpu("runs", str(root))
    assert table.returncode == 0
    rows = {line.split()[0]: line for line in table.stdout.splitlines()[1:]}
    assert set(rows) == set(found)
    assert "  -  " in rows["tiny.base.00000001"]  # no state yet
    assert "sexpgpu: warning: tiny.base.00000003: status.json does not read (ValidationError:" in table.stderr


# -- the library: keys, filters, sorting ---------------------------------------------------------


def test_filters_parse_every_operator_and_compare_numbers_as_numbers() -> None:
    record = RunRecord(slug="a.base.1", folder="/x", state="finished", metrics={"loss": 0.5}, eval={"val/acc": 0.9}, knobs={"lr": 0.1, "act": "relu", "flag": True})
    assert Filter.parse("lr=0.10").matches(record)
    assert Filter.parse("val/acc>=0.9").matches(record) and not Filter.parse("val/acc>0.9").matches(record)
    assert Filter.parse("loss<1").matches(record) and Filter.parse("loss!=0.4").matches(record)
    assert Filter.parse("act=relu").matches(record) and not Filter.parse("act=gelu").matches(record)
    assert Filter.parse("flag=true").matches(record)
    assert Filter.parse("knobs.lr=0.1").matches(record)
    assert not Filter.parse("sweep=grid").matches(record) and Filter.parse("sweep!=grid").matches(record)
    assert Filter.parse("variant=base").matches(record)
    assert Filter.parse("a<=1").op == "<=" and Filter.parse("act=a<b").op == "="  # the first operator splits


def test_sorting_puts_missing_values_last_both_ways() -> None:
    rows = [RunRecord(slug=s, folder="/", metrics=m) for s, m in (("a", {"loss": 2.0}), ("b", {}), ("c", {"loss": 1.0}))]
    assert [r.slug for r in listing.sort_records(rows, "loss")] == ["c", "a", "b"]
    assert [r.slug for r in listing.sort_records(rows, "loss", reverse=True)] == ["a", "c", "b"]


# -- S3: many runs, read with a listing and two small reads each ---------------------------------

sys.path.insert(0, str(Path(__file__).parent))
from s3_server import MotoS3, make_bucket, patched_env, s3_env  # noqa: E402

MANY = 120


@pytest.fixture(scope="module")
def s3_store(made: MadeStore) -> Iterator[tuple[str, dict[str, str]]]:
    """A bucket with one run trained on it through the CLI and MANY more made of its files."""
    pytest.importorskip("s3fs")
    with MotoS3() as moto:
        env = s3_env(moto.endpoint)
        bucket = make_bucket(None, moto.endpoint)
        url = f"s3://{bucket}/team"
        with patched_env(env):
            from results_store import quietly

            assert quietly("run", str(made.file), "--store", url, "--quiet", "--set", "steps=10") == 0
            store = Store.open(url)
            (trained,) = store.folders()
            info = RunFolder(store, trained).read_run_info()
            status = RunFolder(store, trained).read_status()
            assert status is not None
            for i in range(MANY):
                slug = f"tiny.base.c{i:07d}"
                store.write_json(f"{slug}/run.json", info.model_copy(update={"slug": slug, "knobs": {**info.knobs, "lr": i / 1000}}))
                store.write_json(f"{slug}/status.json", status.model_copy(update={"step": i, "metrics": {"loss": 1.0 + i}}))
            store.write_json("tiny.base.half/run.json", info.model_copy(update={"slug": "tiny.base.half"}))
            store.write_json("sweeps/tiny.grid/sweep.json", {"points": []})
            yield url, env


def test_runs_on_s3_lists_many_runs(s3_store: tuple[str, dict[str, str]]) -> None:
    url, env = s3_store
    done = sexpgpu("runs", url, "--json", env=env)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert len(found) == MANY + 2
    assert {r["slug"] for r in found if r["state"] is None} == {"tiny.base.half"}
    trained = next(r for r in found if not r["slug"].startswith("tiny.base.c") and r["slug"] != "tiny.base.half")
    assert trained["state"] == "finished" and trained["step"] == 10 and set(trained["eval"]) == {"val/loss", "val/acc"}
    assert all(r["folder"].startswith(url + "/") for r in found)
    table = sexpgpu("runs", url, "--filter", "lr>=0.1", "--sort", "loss", env=env)
    assert table.returncode == 0, table.stderr
    assert len(table.stdout.splitlines()) == 1 + (MANY - 100) + 2  # the trained run and the half-written one have lr 0.1


def test_a_listing_reads_only_run_json_and_status_json(s3_store: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """One folder listing, then per run only its two files: never the recursive walk, never
    the events or the checkpoints."""
    url, env = s3_store
    calls: list[tuple[str, Any]] = []
    for name in ("read_bytes", "exists", "list", "folders", "read_lines"):
        original = getattr(Store, name)

        def recording(self: Store, *args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            calls.append((_name, args[0] if args else ""))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(Store, name, recording)
    with patched_env(env):
        found = listing.RecordCache(Store.open(url), remember=False).records()
    assert len(found) == MANY + 2
    assert calls.count(("folders", "")) == 1
    assert {c[0] for c in calls} == {"folders", "read_bytes"}, sorted({c[0] for c in calls})
    reads = [c[1] for c in calls if c[0] == "read_bytes"]
    assert all(path.rsplit("/", 1)[1] in ("run.json", "status.json") for path in reads), reads
    assert len(reads) == 2 * (MANY + 3)  # sweeps/ too: it has neither file
