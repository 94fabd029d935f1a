"""The dashboard's HTTP server: a few HTML pages (one shell, drawn by static/app.js), the
vendored uPlot, and a JSON API over the store, all read-only.

| path | what |
| --- | --- |
| `/`, `/run/SLUG`, `/sweep/NAME` | the pages (the runs table, one run, one sweep) |
| `/api/runs` | every run's record (sexpgpu/results/listing.py) |
| `/api/run/SLUG` | the record, run.json, status.json and the names under source/ |
| `/api/run/SLUG/curves[?points=B&series=NAME]` | every series against step, downsampled to B spans (sexpgpu/results/curves.py; `points=all`: every point) |
| `/api/run/SLUG/events` | the events, resumes applied (of the step events, the latest 1,000) |
| `/api/run/SLUG/source/NAME` | one source file as compiled |
| `/api/run/SLUG/live` | server-sent events: the record and the points added since the last message |
| `/api/sweep/NAME[?file=F&page=P&per_page=N]` | the sweep's points and the curves of page P's points, downsampled |

It listens on 127.0.0.1 only and answers only requests addressed to it there (a Host of
127.0.0.1:PORT or localhost:PORT: a page elsewhere cannot reach it through DNS rebinding).
Nothing shown comes from the server as HTML: every value reaches the page as JSON and is
put in the page as text.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Callable, Optional
from urllib.parse import parse_qs, unquote, urlsplit

from ..results.curves import DEFAULT_BUCKETS, Curves
from ..results.readers import RunReaders
from ..results.listing import READERS, RecordCache, read_quietly, record_of
from ..runtime.runfolder import RunFolder, RunInfo
from ..runtime.status import Status
from ..runtime.store import NotARegularFile, Store, UnexpectedSize, dump_json, is_store_failure, store_problem

HOST = "127.0.0.1"
SOURCE_LIMIT = 4 << 20  # bytes of one source file shown
REREAD_EVERY = 10  # live pages re-read the events every this many ticks even when status.json did not change
PER_PAGE = 50  # points of a sweep whose curves one page shows
MAX_BUCKETS = 100_000

STATIC: dict[str, str] = {  # name -> content type; nothing else under static/ is served
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
    "uPlot.LICENSE": "text/plain; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
PAGE = re.compile(r"^/(?:|run/[^/]+|sweep/[^/]+)$")
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class NotFound(Exception):
    """What the request names is not in the store: 404."""


def static_bytes(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def folder_name(text: str) -> str:
    """A run folder's name from a URL segment; NotFound for one that cannot name a folder."""
    name = unquote(text)
    if not name or "/" in name or "\\" in name or name.startswith(".") or name != name.strip():
        raise NotFound(f"no run folder is called {name!r}")
    return name


def buckets_of(query: dict[str, list[str]]) -> Optional[int]:
    """`?points=B`: the spans a series is downsampled to (DEFAULT_BUCKETS when not given);
    `points=all`: None, every point; a bad value is a 400 (BadRequest)."""
    text = query.get("points", [None])[0]
    if text is None:
        return DEFAULT_BUCKETS
    if text == "all":
        return None
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_BUCKETS:  # isdigit alone takes ² (int() does not)
        raise BadRequest(f"points={text}: give a number of points from 1 to {MAX_BUCKETS:,}, or all")
    return int(text)


def number_of(query: dict[str, list[str]], name: str, default: int) -> int:
    text = query.get(name, [None])[0]
    if text is None:
        return default
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise BadRequest(f"{name}={text}: give a whole number from 1")
    return int(text)


class BadRequest(Exception):
    """A query parameter that does not read: 400."""


class Dashboard:
    """The documents the API serves, read from STORE on each request: run.json and
    status.json whole (both capped; a listing reads them only when they changed), the events
    incrementally (one reader per run, kept for the runs read most recently: a request reads
    only what the run logged since the last)."""

    def __init__(self, store: Store, interval_s: float = 1.0) -> None:
        self.store = store
        self.interval_s = interval_s
        self.closing = threading.Event()
        self.readers = RunReaders(store)
        self.records = RecordCache(store)

    # -- documents ----------------------------------------------------------------------------

    def runs(self) -> dict[str, Any]:
        return {"store": self.store.url, "runs": [r.model_dump(mode="json") for r in self.records.records()]}

    def _read(self, slug: str) -> tuple[RunFolder, Optional[RunInfo], Optional[Status], list[str]]:
        folder = RunFolder(self.store, slug)
        problems: list[str] = []
        info: Optional[RunInfo] = read_quietly("run.json", folder.read_run_info, problems)
        status: Optional[Status] = read_quietly("status.json", folder.read_status, problems)
        if info is None and status is None and not problems:
            raise NotFound(f"no run at {folder.url} (no run.json, no status.json)")
        return folder, info, status, problems

    def run(self, slug: str) -> dict[str, Any]:
        folder, info, status, problems = self._read(slug)
        try:
            sources = folder.list_sources()
        except FileNotFoundError:
            sources = []
        return {"store": self.store.url, "record": record_of(folder, info, status, problems).model_dump(mode="json"),
                "info": info.model_dump(mode="json") if info is not None else None,
                "status": status.model_dump(mode="json") if status is not None else None,
                "sources": sources}

    def curves(self, slug: str, buckets: Optional[int] = DEFAULT_BUCKETS, only: Optional[str] = None) -> Curves:
        self._read(slug)
        return self.readers.curves(slug, buckets, only)

    def events(self, slug: str) -> dict[str, Any]:
        self._read(slug)
        events, warnings, steps = self.readers.events_and_count(slug)
        return {"events": events, "warnings": warnings, "step_events": steps}

    def source(self, slug: str, name: str) -> dict[str, Any]:
        folder, *_ = self._read(slug)
        if name not in folder.list_sources():
            raise NotFound(f"{folder.url} has no source/{name}")
        data = self.store.read_bytes(folder.path(f"source/{name}"), limit=SOURCE_LIMIT)
        return {"name": name, "text": data.decode("utf-8", errors="replace")}

    def sweep(self, name: str, file: Optional[str] = None, page: int = 1, per_page: int = PER_PAGE,
              buckets: Optional[int] = DEFAULT_BUCKETS) -> str:
        """The sweep's document, as JSON text: every point's record (each record's text made
        once, when it was read), and the curves of the points of PAGE (PER_PAGE a page, in
        point order), downsampled to BUCKETS."""
        points = [(r, text) for r, text in self.records.records_and_json(sweep=name) if file is None or r.file == file]
        if not points:
            raise NotFound(f"no run of a sweep {name!r} in {self.store.url}" + (f" from {file}" if file else ""))
        points.sort(key=lambda pair: (pair[0].file or "", pair[0].point if pair[0].point is not None else -1, pair[0].slug))
        pages = -(-len(points) // per_page)
        page = min(page, pages)
        shown = [r for r, _ in points[(page - 1) * per_page: page * per_page]]
        with ThreadPoolExecutor(max_workers=min(READERS, len(shown)), thread_name_prefix="sexpgpu-ui") as pool:
            curves = list(pool.map(lambda r: self.readers.curves(r.slug, buckets), shown))
        head = dump_json({"store": self.store.url, "sweep": name, "file": file, "page": page, "pages": pages, "per_page": per_page,
                          "shown": [r.slug for r in shown], "curves": {r.slug: c for r, c in zip(shown, curves)}})
        return head[:-1] + ',"points":[' + ",".join(text for _, text in points) + "]}"

    # -- live ---------------------------------------------------------------------------------

    def live(self, slug: str, send: Callable[[str], None]) -> None:
        """Until the page goes or the server closes: each tick, read status.json; when it
        changed (and on the tick after, for events flushed after it), and every few ticks in
        any case, read the events and send what is new. A tick that sends nothing sends a
        comment, so that a closed page is noticed."""
        folder, info, _, _ = self._read(slug)
        sent: dict[str, tuple[int, int, Optional[float]]] = {}
        last: Optional[str] = None
        pending = True
        tick = 0
        while not self.closing.is_set():
            problems: list[str] = []
            status: Optional[Status] = read_quietly("status.json", folder.read_status, problems)
            fingerprint = status.model_dump_json() if status is not None else None
            changed = fingerprint != last or tick == 0
            if changed or pending or tick % REREAD_EVERY == 0:
                curves, reset = self.readers.since(slug, sent, DEFAULT_BUCKETS)
                if changed or curves.series or reset:
                    record = record_of(folder, info, status, problems)
                    send(_sse({"record": record.model_dump(mode="json"), "series": [s.model_dump(mode="json") for s in curves.series],
                               "reset": reset or tick == 0, "events": curves.events, "last_step": curves.last_step,
                               "warnings": curves.warnings}))
                else:
                    send(": nothing new\n\n")
            else:
                send(": nothing new\n\n")
            pending = changed
            last = fingerprint
            tick += 1
            self.closing.wait(self.interval_s)


def _sse(document: Any) -> str:
    return f"event: update\ndata: {dump_json(document)}\n\n"


# ---------------------------------------------------------------------------------------------
# HTTP


class Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, dashboard: Dashboard, port: int = 0) -> None:
        self.dashboard = dashboard
        super().__init__((HOST, port), Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/"

    def close(self) -> None:
        """Stop serving: live pages end at their next tick."""
        self.dashboard.closing.set()
        self.shutdown()
        self.server_close()


class Handler(BaseHTTPRequestHandler):
    server: Server
    server_version = "sexpgpu-ui"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # a line per request is noise; errors reach the page as JSON

    def _allowed_host(self) -> bool:
        host = (self.headers.get("Host") or "").lower()
        return host in (f"127.0.0.1:{self.server.port}", f"localhost:{self.server.port}")

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        if not self._allowed_host():
            self._send(HTTPStatus.MISDIRECTED_REQUEST, b"this server answers only 127.0.0.1 and localhost\n", "text/plain; charset=utf-8")
            return
        url = urlsplit(self.path)
        try:
            self._route(url.path, parse_qs(url.query))
        except NotFound as exc:
            self._json({"error": str(exc)}, HTTPStatus.NOT_FOUND)
        except BadRequest as exc:
            self._json({"error": str(exc)}, HTTPStatus.BAD_REQUEST)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the page went away
        except (NotARegularFile, UnexpectedSize) as exc:  # one file of one run, which the message names
            self._json({"error": str(exc)}, HTTPStatus.BAD_GATEWAY)
        except Exception as exc:
            if is_store_failure(exc):
                self._json({"error": store_problem(self.server.dashboard.store.url, exc)}, HTTPStatus.BAD_GATEWAY)
                return
            # a fault of the dashboard itself: the page is told, and the server's stderr has the traceback
            traceback.print_exc(file=sys.stderr)
            self._json({"error": f"the dashboard failed on {url.path} ({type(exc).__name__}: {exc}); "
                                 "the traceback is on the server's stderr: please report it"}, HTTPStatus.INTERNAL_SERVER_ERROR)

    def _route(self, path: str, query: dict[str, list[str]]) -> None:
        board = self.server.dashboard
        if path == "/favicon.ico":  # what a browser asks for without looking at the page
            self._send(HTTPStatus.OK, static_bytes("favicon.svg"), STATIC["favicon.svg"], cache="max-age=3600")
            return
        if PAGE.match(path):
            self._send(HTTPStatus.OK, static_bytes("index.html"), "text/html; charset=utf-8")
            return
        if path.startswith("/static/") and path[len("/static/"):] in STATIC:
            name = path[len("/static/"):]
            self._send(HTTPStatus.OK, static_bytes(name), STATIC[name], cache="max-age=3600")
            return
        if path == "/api/runs":
            self._json(board.runs())
            return
        parts = path.split("/")
        if len(parts) >= 4 and parts[:3] == ["", "api", "run"]:
            slug = folder_name(parts[3])
            rest = parts[4:]
            if not rest:
                self._json(board.run(slug))
            elif rest == ["curves"]:
                self._json(board.curves(slug, buckets_of(query), query.get("series", [None])[0]).model_dump(mode="json"))
            elif rest == ["events"]:
                self._json(board.events(slug))
            elif rest[0] == "source" and len(rest) > 1:
                self._json(board.source(slug, "/".join(unquote(p) for p in rest[1:])))
            elif rest == ["live"]:
                self._live(slug)
            else:
                raise NotFound(f"nothing at {path}")
            return
        if len(parts) == 4 and parts[:3] == ["", "api", "sweep"]:
            file = query.get("file", [None])[0]
            text = board.sweep(unquote(parts[3]), file, number_of(query, "page", 1), number_of(query, "per_page", PER_PAGE), buckets_of(query))
            self._send(HTTPStatus.OK, text.encode("utf-8"), "application/json; charset=utf-8")
            return
        raise NotFound(f"nothing at {path}")

    def _live(self, slug: str) -> None:
        board = self.server.dashboard
        board._read(slug)  # a 404 before the stream starts
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-store")
        self._security_headers()
        self.end_headers()

        def send(text: str) -> None:
            self.wfile.write(text.encode("utf-8"))
            self.wfile.flush()

        send(f"retry: {max(500, int(board.interval_s * 2000))}\n\n")
        try:
            board.live(slug, send)
        except Exception as exc:  # the stream has begun: say it in the stream, then end it
            if not is_store_failure(exc) or isinstance(exc, (BrokenPipeError, ConnectionResetError)):
                raise
            said = str(exc) if isinstance(exc, (NotARegularFile, UnexpectedSize)) else store_problem(board.store.url, exc)
            send(f"event: problem\ndata: {json.dumps(said)}\n\n")

    def _json(self, document: Any, status: HTTPStatus = HTTPStatus.OK) -> None:
        self._send(status, dump_json(document).encode("utf-8"), "application/json; charset=utf-8")

    def _security_headers(self) -> None:
        for name, value in SECURITY_HEADERS.items():
            self.send_header(name, value)

    def _send(self, status: HTTPStatus, body: bytes, content_type: str, cache: str = "no-store") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", cache)
        self._security_headers()
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

