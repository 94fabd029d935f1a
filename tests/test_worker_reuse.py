"""A worker keeps what it compiled for the next points of its sweep: on a real local Ray, one
TrainWorker runs two points of one shape group and the second is bound from the group's
compile (no compile of its own), training what a point's own compile trains; a bundle whose
source or recorded IR no longer match is still refused after its group was compiled."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import unquote

import pytest

from conftest import REPO
from sexpgpu.bundle import write_bundle
from sexpgpu.outcome import Exit
from sexpgpu.session import Compiled, Session, Settings

LRS = [0.01, 0.02, 0.03, 0.04]
RUN = (REPO / "examples" / "quickstart.lisp").read_text().replace(
    "(defknob lr 0.1)", f"(defknob lr 0.1)\n(defsweep grid :lr ({' '.join(map(str, LRS))}))")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Each point's bundle, as the sweep driver writes them (its points compiled by shape group)."""
    root = tmp_path_factory.mktemp("grid")
    (root / ".git").mkdir()
    path = root / "grid.lisp"
    path.write_text(RUN)
    out: dict[int, Path] = {}
    for i, prepared in Session(Settings()).stream_sweep(path, "grid", len(LRS)):
        assert isinstance(prepared, Compiled), prepared
        out[i] = root / f"bundle{i}"
        write_bundle(path, prepared.result, str(out[i]))
    return [out[i] for i in range(len(LRS))]


def request(bundle: Path, store: Path) -> Any:
    from workers.train_worker import AttemptRequest

    return AttemptRequest(bundle=str(bundle), store=str(store), max_steps=2)


@pytest.fixture(scope="module")
def ray_local() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_a_ray_worker_binds_the_second_point_of_a_group_without_compiling(ray_local: Any, bundles: list[Path], tmp_path: Path) -> None:
    from orchestration.attempts import worker_env
    from workers.train_worker import TRAIN_WORKER_OPTIONS, TrainWorker

    ray = ray_local
    worker: Any = TrainWorker.options(num_cpus=1, max_restarts=0, **TRAIN_WORKER_OPTIONS).remote(worker_env())
    first = ray.get(worker.run.remote(request(bundles[1], tmp_path / "ray"), None))
    after_first = ray.get(worker.compile_counts.remote())
    # a point that is not its group's first: the group's first point and its probe, as the driver compiles them
    assert first.exit_code == Exit.OK and (after_first.own, after_first.probes, after_first.bound) == (1, 1, 1), (first, after_first)
    second = ray.get(worker.run.remote(request(bundles[2], tmp_path / "ray"), None))
    after_second = ray.get(worker.compile_counts.remote())
    assert second.exit_code == Exit.OK, second
    assert (after_second.own, after_second.probes) == (1, 1) and after_second.bound == 2 and after_second.projects_kept == 1, after_second
    # what it trained is the point's own: the slug its bundle records, the losses of a worker that compiled it alone
    assert second.slug == json.loads((bundles[2] / "bundle.json").read_text())["slug"]
    ray.kill(worker)  # its CPU is the one the next worker needs
    alone = ray.get(TrainWorker.options(num_cpus=1, max_restarts=0, **TRAIN_WORKER_OPTIONS).remote(worker_env()).run.remote(request(bundles[2], tmp_path / "alone"), None))
    assert alone.slug == second.slug and alone.final_loss == second.final_loss and alone.steps == second.steps == 2


def test_a_bundle_whose_source_changed_is_refused_after_its_group_was_compiled(bundles: list[Path], tmp_path: Path) -> None:
    from workers.train_worker import TrainWorkerImpl

    worker = TrainWorkerImpl()
    assert worker.run(request(bundles[1], tmp_path / "runs")).exit_code == Exit.OK
    edited = tmp_path / "edited"
    shutil.copytree(bundles[2], edited)
    source = edited / "source" / "grid.lisp"
    source.write_text(source.read_text().replace("(nn:mlp 2 64 3)", "(nn:mlp 2 32 3)"))
    refused = worker.run(request(edited, tmp_path / "runs"))
    assert refused.exit_code == Exit.CHECK_FAILED and "refusing to run something else" in refused.reason, refused


def test_a_bundle_recording_another_ir_is_refused_though_its_group_was_compiled(bundles: list[Path], tmp_path: Path) -> None:
    from workers.train_worker import TrainWorkerImpl

    worker = TrainWorkerImpl()
    assert worker.run(request(bundles[1], tmp_path / "runs")).exit_code == Exit.OK
    other = tmp_path / "other"
    shutil.copytree(bundles[2], other)
    manifest = json.loads((other / "bundle.json").read_text())
    manifest["ir_hash"] = "0" * 64
    (other / "bundle.json").write_text(json.dumps(manifest))
    refused = worker.run(request(other, tmp_path / "runs"))
    assert refused.exit_code == Exit.CHECK_FAILED and "refusing to run something else" in refused.reason, refused
    counts = worker.compile_counts()
    assert counts.projects_kept == 1 and counts.own == 2, counts  # its group was there; its own compile refused it


def test_a_worker_started_for_a_device_has_it_open_before_its_first_attempt(bundles: list[Path], tmp_path: Path) -> None:
    """A worker the driver starts ahead (its warm pool) opens its device as it starts; its
    first attempt trains on that device as opened, not on one it opens again."""
    from workers.train_worker import TrainWorkerImpl

    worker = TrainWorkerImpl(device="cpu")
    assert set(worker.opened) == {"cpu"}, worker.opened
    resolved, backend = worker.opened["cpu"]
    assert resolved in ("cpu", "numpy")
    outcome = worker.run(request(bundles[0], tmp_path / "runs"))
    assert outcome.exit_code == Exit.OK, outcome
    assert worker.opened["cpu"][1] is backend
    assert worker.compiles.image is not None  # the system texts were read before the first compile


def test_a_worker_keeps_its_s3_client_and_probes_conditional_writes_once(bundles: list[Path], tmp_path: Path) -> None:
    """Every attempt of one worker goes through one S3 client (made once), whose conditional
    writes (the run's lease) are probed once: two attempts on S3 are sent on that client, with
    one probe between them (a store opened for each attempt probed again and made a client each)."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from s3_server import MotoS3, make_bucket, patched_env, s3_env
    from workers.train_worker import AttemptRequest, TrainWorkerImpl

    with MotoS3() as moto, patched_env(s3_env(moto.endpoint)):
        url = f"s3://{make_bucket(None, moto.endpoint)}/runs"
        worker = TrainWorkerImpl()
        client = worker.stores(url)
        sent: list[str] = []
        client.fs.connect()
        client.fs.s3.meta.events.register("before-send.s3", lambda request, **_: sent.append(f"{request.method} {request.url}"))
        outcomes = [worker.run(AttemptRequest(bundle=str(bundles[i]), store=url, max_steps=1)) for i in (0, 1)]
    assert [o.exit_code for o in outcomes] == [Exit.OK, Exit.OK], outcomes
    put = [r.split(" ", 1)[1].split("?")[0] for r in sent if r.startswith("PUT")]
    probes = [path for path in put if "/.conditional-" in path]
    assert len(probes) == 2, probes  # one probe: a create, and a second create that must fail
    # a look for a run.json or for the next log segment is one request: no LIST for a folder of its name
    listed = [unquote(m.group(1)) for r in sent if (m := re.search(r"[?&]prefix=([^&]*)", r))]
    assert listed and not [prefix for prefix in listed if prefix.endswith(("/run.json/", ".jsonl/"))], listed
    for outcome in outcomes:  # each attempt's lease and status went through the kept client
        for name in ("lease.json", "run.json", "status.json"):
            assert any(path.endswith(f"/runs/{outcome.slug}/{name}") for path in put), (name, put)
