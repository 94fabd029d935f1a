"""`bundle FILE -o DIR|URL`: one self-contained directory that runs anywhere."""

from __future__ import annotations

import argparse
import sys

from ..bundle import BundleError, is_bundle, make_bundle
from ..outcome import AttemptOutcome, Exit
from ..runtime.runfolder import run_slug
from ..runtime.store import Store
from ..session import Session, Settings, store_check
from .common import Console, existing_file, print_json
from .flags import add_data_root_flag, add_rank_flags, add_selection_flags, data_roots_from, devices_from, selection_from


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    b = sub.add_parser("bundle")
    b.add_argument("file")
    b.add_argument("-o", "--out", required=True, metavar="DIR|URL")
    b.add_argument("--device", action="append", dest="devices", default=None, help="devices the run asks for (default cpu)")
    b.add_argument("--json", action="store_true")
    add_selection_flags(b)
    b.set_defaults(run=run_bundle)


def run_bundle(args: argparse.Namespace) -> int:
    path = existing_file(args.file)
    try:
        manifest, _ = make_bundle(path, selection_from(args), args.out, args.devices)
    except BundleError as exc:
        print(f"sexpgpu: bundle: {exc}", file=sys.stderr)
        return exc.code
    if args.json:
        print_json(manifest.model_dump(mode="json"))
    else:
        copied = sum(d.bytes or 0 for d in manifest.data if d.copied)
        print(f"{manifest.slug}  {args.out}")
        print(f"source: {manifest.main}; data: {len(manifest.data)} source(s), {copied:,} bytes copied; IR {manifest.ir_hash[:12]}")
    return Exit.OK


def register_submit(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    s = sub.add_parser("submit")
    s.add_argument("bundle", metavar="BUNDLE")
    s.add_argument("--ray", required=True, metavar="ADDRESS", help="the cluster (e.g. 10.0.0.5:6379, or auto)")
    s.add_argument("--store", required=True, metavar="URL", help="where the run folder goes (workers must reach it: s3://...)")
    s.add_argument("--max-preemptions", type=int, default=None, metavar="N")
    s.add_argument("--json", action="store_true")
    add_rank_flags(s)
    add_data_root_flag(s)
    s.set_defaults(run=run_submit)


def run_submit(args: argparse.Namespace) -> int:
    if not is_bundle(args.bundle):
        print(f"sexpgpu: {args.bundle} is not a bundle (no bundle.json); make one with `sexpgpu bundle FILE -o DIR`", file=sys.stderr)
        return Exit.USAGE
    try:
        import ray

        from orchestration.attempts import worker_env
        from orchestration.submit import SubmitRefused, submit
    except ImportError as exc:
        print(f"sexpgpu: submit needs the cluster extra (pip install -e '.[cluster]'): {exc}", file=sys.stderr)
        return Exit.CANNOT_START
    devices = devices_from(args)
    # the ranks' programs must check (the batch splits over W) before anything is sent
    session = Session(Settings(store=args.store, world=devices.count), Console())
    checked = session.with_bundle(args.bundle, lambda compiled: AttemptOutcome(exit_code=Exit.OK, reason="checks", slug=run_slug(compiled.experiment)))
    if checked.exit_code != Exit.OK or checked.slug is None:
        return int(checked.exit_code)
    slug = checked.slug
    problem = store_check(args.store)
    if problem is not None:
        print(f"sexpgpu: cannot start here: {problem}", file=sys.stderr)
        return Exit.CANNOT_START
    store = Store.open(args.store)
    target = f"{store.url_of(slug)}/bundle"
    source, out = Store.open(args.bundle), Store.open(target)
    for name in source.list(""):
        out.write_bytes(name, source.read_bytes(name))  # the bundle travels with the run folder
    try:
        ray.init(address=args.ray, namespace="sexpgpu", include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    except Exception as exc:  # the cluster is the finding
        print(f"sexpgpu: cannot reach the Ray cluster at {args.ray}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return Exit.CANNOT_START
    problem = devices.software() or devices.feasible(ray.cluster_resources())
    if problem is not None:
        print(f"sexpgpu: cannot start here: {problem}", file=sys.stderr)
        return Exit.CANNOT_START
    try:
        submit(target, args.store, slug, args.max_preemptions, worker_env(), devices, data_roots_from(args))
    except SubmitRefused as exc:  # its first write to the store: the store the job would write
        print(f"sexpgpu: cannot start here: the run's supervisor cannot write the store: {exc}", file=sys.stderr)
        return Exit.CANNOT_START
    except ray.exceptions.RayError as exc:  # the supervisor did not start (a timeout, a dead worker)
        print(f"sexpgpu: the run's supervisor did not start on the cluster: {type(exc).__name__}: {exc}", file=sys.stderr)
        return Exit.CANNOT_START
    url = store.url_of(slug)
    if args.json:
        print_json({"slug": slug, "run": url, "bundle": target})
    else:
        print(f"{slug}  submitted; follow it with: sexpgpu logs {url} --follow")
    return Exit.OK
