"""`sexpgpu ui [STORE]`: serve the read-only dashboard of a store on 127.0.0.1
(sexpgpu/dashboard/) until Ctrl-C."""

from __future__ import annotations

import argparse
import sys
import threading
import webbrowser

from ..outcome import Exit
from ..results import locate
from ..runtime.store import is_store_failure, store_problem
from .common import fail_usage


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("ui")
    p.add_argument("store", nargs="?", default=None, metavar="STORE", help="a folder or URL (default $SEXPGPU_STORE or ./runs)")
    p.add_argument("--port", type=int, default=0, metavar="N", help="the port on 127.0.0.1 (default: a free one)")
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="how often a live page reads status.json (default 1)")
    p.add_argument("--open", action="store_true", help="open the dashboard in this machine's browser")
    p.set_defaults(run=run_ui)


def run_ui(args: argparse.Namespace) -> int:
    from ..dashboard.server import Dashboard, Server

    if not 0 <= args.port <= 65535:
        fail_usage(f"--port {args.port}: use a port from 1 to 65535, or 0 for a free one")
    if not args.interval > 0:
        fail_usage("--interval needs a positive number of seconds")
    url = args.store or locate.default_store()
    try:
        store = locate.open_store(url, must_exist=True)
        store.folders()  # a store that cannot be read says so now, not in the browser
    except locate.NoStore as exc:
        print(f"sexpgpu: {exc}", file=sys.stderr)
        return Exit.USAGE
    except locate.CannotOpen as exc:
        print(f"sexpgpu: {exc}", file=sys.stderr)
        return Exit.CANNOT_START
    except Exception as exc:
        if not is_store_failure(exc):
            raise
        print(f"sexpgpu: {store_problem(url, exc)}", file=sys.stderr)
        return Exit.CANNOT_START
    try:
        server = Server(Dashboard(store, interval_s=args.interval), port=args.port)
    except OSError as exc:
        print(f"sexpgpu: cannot listen on 127.0.0.1:{args.port} ({exc.strerror or exc}); choose another --port, or 0 for a free one", file=sys.stderr)
        return Exit.CANNOT_START
    print(f"sexpgpu ui: {server.url}  (the store {store.url}, read-only; Ctrl-C stops)", flush=True)
    if args.open:
        threading.Thread(target=webbrowser.open, args=(server.url,), daemon=True).start()
    serving = threading.Thread(target=server.serve_forever, name="sexpgpu-ui", daemon=True)
    serving.start()
    try:
        serving.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return Exit.OK
