"""A real S3 HTTP endpoint on loopback for tests: moto's server, and a pausable TCP proxy.

`MotoS3` starts moto's threaded server on 127.0.0.1 with a free port (its buckets and
objects live in this process's memory). `PausableProxy` forwards a loopback port to it;
`pause()` closes every open connection and the listening socket, so a client sees a store
that is down (connection refused), while the data stays in moto, and `resume()` listens on
the same port again. `s3_env(endpoint)` is the environment a client needs (test
credentials, a region, `AWS_ENDPOINT_URL`); `make_bucket` creates a bucket through boto3.

Everything binds 127.0.0.1 only; every loop polls with a short timeout and ends on `stop()`
(the context managers call it), so nothing outlives the test that started it.

    with MotoS3() as moto, PausableProxy(moto.port) as proxy:
        env = s3_env(proxy.endpoint)
        make_bucket("data", proxy.endpoint)
        proxy.pause(); ...; proxy.resume()
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import struct
import threading
import time
import uuid
from typing import Iterator, Mapping, Optional

HOST = "127.0.0.1"
REGION = "us-east-1"
ACCESS_KEY = "testing"
SECRET_KEY = "testing"

# Seconds a blocking call waits before it looks at the stop flag again.
POLL = 0.05
# Stop waits at most this long for a thread.
JOIN_TIMEOUT = 5.0


def s3_env(endpoint: str) -> dict[str, str]:
    """The environment of a client of ENDPOINT: test credentials, a region, the endpoint.

    Also clears what would send it elsewhere or slow it down (profiles, instance metadata)."""
    return {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_SESSION_TOKEN": "",
        "AWS_SECURITY_TOKEN": "",
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


@contextlib.contextmanager
def patched_env(values: Mapping[str, str]) -> Iterator[None]:
    """os.environ with VALUES set (an empty value removes the variable), restored after."""
    saved = {key: os.environ.get(key) for key in values}
    try:
        for key, value in values.items():
            if value:
                os.environ[key] = value
            else:
                os.environ.pop(key, None)
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def boto3_client(endpoint: str):  # -> botocore S3 client
    """A plain boto3 S3 client of ENDPOINT (test credentials, no retries to speak of)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=10),
    )


def make_bucket(name: Optional[str], endpoint: str) -> str:
    """Create the bucket NAME (a fresh unique one when None) at ENDPOINT; returns its name."""
    bucket = name or f"test-{uuid.uuid4().hex[:16]}"
    boto3_client(endpoint).create_bucket(Bucket=bucket)
    return bucket


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def wait_listening(port: int, timeout: float = 10.0) -> None:
    """Return once 127.0.0.1:PORT accepts a connection; TimeoutError after TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((HOST, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"nothing listens on {HOST}:{port} after {timeout}s") from None
            time.sleep(POLL)


# ---------------------------------------------------------------------------------------------
# moto


class MotoS3:
    """moto's threaded server on 127.0.0.1, a free port; a context manager."""

    def __init__(self) -> None:
        self._server = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> "MotoS3":
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        server = ThreadedMotoServer(ip_address=HOST, port=0, verbose=False)
        server.start()
        self._server = server
        self.port = int(server.get_host_and_port()[1])
        wait_listening(self.port)
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    def __enter__(self) -> "MotoS3":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


# ---------------------------------------------------------------------------------------------
# The proxy


class PausableProxy:
    """A TCP proxy 127.0.0.1:port -> 127.0.0.1:TARGET_PORT that can be taken down and back.

    `pause()` closes the listening socket and every open connection: a client gets
    "connection refused" until `resume()` listens on the same port again. `connections`
    counts the connections accepted so far; `drop_response_to` cuts one reply. A context manager; `stop()` ends every thread."""

    def __init__(self, target_port: int, port: Optional[int] = None) -> None:
        self.target_port = target_port
        self.port = port or free_port()
        self.connections = 0
        self.dropped = 0  # replies cut by drop_response_to
        self._drop_rule: Optional[tuple[bytes, bytes]] = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener: Optional[socket.socket] = None
        self._accepting: Optional[threading.Thread] = None
        self._pipes: set[threading.Thread] = set()
        self._open: set[socket.socket] = set()

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def paused(self) -> bool:
        return self._listener is None

    # -- life ---------------------------------------------------------------------------------

    def start(self) -> "PausableProxy":
        self._stop.clear()
        self._listen()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._unlisten()
        self._close_all()
        with self._lock:
            pipes = list(self._pipes)
        for pipe in pipes:
            pipe.join(JOIN_TIMEOUT)

    def __enter__(self) -> "PausableProxy":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def pause(self) -> None:
        """The store goes down: refuse new connections and cut the open ones."""
        self._unlisten()
        self._close_all()

    def resume(self) -> None:
        """The store is back on the same port."""
        if self.paused and not self._stop.is_set():
            self._listen()

    def drop_response_to(self, method: bytes, marker: bytes) -> None:
        """Once: forward the next request whose request line starts with METHOD and holds
        MARKER, then cut the connection instead of passing the reply on. The server did the
        work, the client sees a dropped connection (a PUT that landed but reported failure)."""
        with self._lock:
            self._drop_rule = (method, marker)

    @contextlib.contextmanager
    def outage(self, seconds: float) -> Iterator[None]:
        """Down for SECONDS from now, in the background, while the body runs; back after."""
        self.pause()
        timer = threading.Timer(seconds, self.resume)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            timer.join(JOIN_TIMEOUT)
            self.resume()

    # -- listening ----------------------------------------------------------------------------

    def _listen(self) -> None:
        with self._lock:
            if self._listener is not None:
                return
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            deadline = time.monotonic() + 5.0
            while True:
                try:
                    listener.bind((HOST, self.port))
                    break
                except OSError:
                    if time.monotonic() >= deadline:
                        listener.close()
                        raise
                    time.sleep(POLL)
            listener.listen(64)
            listener.settimeout(POLL)
            self._listener = listener
            thread = threading.Thread(
                target=self._accept_loop, args=(listener,), name="s3-proxy-accept", daemon=True
            )
            self._accepting = thread
            thread.start()

    def _unlisten(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            thread, self._accepting = self._accepting, None
        if listener is not None:
            listener.close()
        if thread is not None and thread is not threading.current_thread():
            thread.join(JOIN_TIMEOUT)

    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._stop.is_set() and self._listener is listener:
            try:
                client, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return  # closed by pause/stop
            if self._listener is not listener:
                _close(client)
                return
            try:
                upstream = socket.create_connection((HOST, self.target_port), timeout=5.0)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self.connections += 1
                self._open.update((client, upstream))
                pipe = threading.Thread(
                    target=self._pipe, args=(client, upstream), name="s3-proxy-pipe", daemon=True
                )
                self._pipes.add(pipe)
            pipe.start()

    # -- forwarding ---------------------------------------------------------------------------

    def _pipe(self, client: socket.socket, upstream: socket.socket) -> None:
        pair = {client: upstream, upstream: client}
        cut_reply = False
        try:
            try:
                for sock in pair:
                    sock.setblocking(False)
            except OSError:
                return  # closed under us before the pipe started (the outage cut it)
            while not self._stop.is_set():
                try:
                    readable, _, broken = select.select(list(pair), [], list(pair), POLL)
                except (OSError, ValueError):
                    return  # a socket was closed under us
                if broken:
                    return
                for sock in readable:
                    try:
                        data = sock.recv(65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        return
                    if not data:
                        return
                    if sock is client:
                        cut_reply = cut_reply or self._take_drop_rule(data)
                    elif cut_reply:
                        with self._lock:
                            self.dropped += 1
                        for end in pair:
                            _close(end, reset=True)
                        return
                    if not _send_all(pair[sock], data, self._stop):
                        return
        finally:
            for sock in pair:
                _close(sock)
            with self._lock:
                self._open.difference_update(pair)
                self._pipes.discard(threading.current_thread())

    def _take_drop_rule(self, data: bytes) -> bool:
        with self._lock:
            rule = self._drop_rule
            if rule is None:
                return False
            line = data.split(b"\r\n", 1)[0]
            if line.startswith(rule[0]) and rule[1] in line:
                self._drop_rule = None
                return True
            return False

    def _close_all(self) -> None:
        with self._lock:
            sockets = list(self._open)
            self._open.clear()
        for sock in sockets:
            _close(sock, reset=True)


def _send_all(sock: socket.socket, data: bytes, stop: threading.Event) -> bool:
    view = memoryview(data)
    deadline = time.monotonic() + 30.0
    while view:
        if stop.is_set() or time.monotonic() >= deadline:
            return False
        try:
            sent = sock.send(view)
        except BlockingIOError:
            try:
                select.select([], [sock], [], POLL)
            except (OSError, ValueError):
                return False
            continue
        except OSError:
            return False
        view = view[sent:]
    return True


def _close(sock: socket.socket, reset: bool = False) -> None:
    """Close SOCK; with RESET, abortively (the peer sees a reset, not a clean end)."""
    try:
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
