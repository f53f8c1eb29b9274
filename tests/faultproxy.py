"""A fault-injecting HTTP proxy in front of the test S3 server, on 127.0.0.1 only.

The job talks to it as to any S3 endpoint (AWS_ENDPOINT_URL): each request is read whole,
then either answered by the proxy itself with a fault, or forwarded to moto's server and
its answer relayed, possibly broken on the way back. What happens to a request is decided
by the rules in force, in order, with one seeded random generator, so a test can say "503
SlowDown on 10% of requests" or "reset every GET mid-body" and get the same draws each run
(the order in which concurrent requests draw is the only thing left to chance).

Faults, as object storage at scale produces them:
- `status`: an S3 error answer (503 SlowDown, 500 InternalError, ...) with S3's XML body;
  `after=True` forwards the request first (the store applied it, the answer is lost).
- `reset`: the answer's headers and half its body, then a TCP reset.
- `short_range`: a ranged GET answered 503 with an XML body longer than the range asked.
- `burst`: every request refused with 503 SlowDown for `seconds` from the first request
  after the rule is added (a throttling burst).
- `latency`: every request waits `seconds` before it is forwarded (a remote store).

Requests are classed as S3 operations: GET, HEAD, PUT, COPY (a PUT with
x-amz-copy-source), DELETE (one object, or POST ?delete: a batch), LIST, POST (multipart).
`stats` counts requests, faults, and the time requests spent in the proxy (for the mean
number in flight). With `normalize`, the proxy forwards each path with its `.` and `..`
segments resolved, as many HTTP front ends of an S3-compatible store do: a key holding
`..` then names another key.
"""

from __future__ import annotations

import http.client
import random
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

OPERATIONS = ("GET", "HEAD", "PUT", "COPY", "DELETE", "LIST", "POST")


@dataclass
class Rule:
    kind: str  # status | reset | short_range | burst | latency
    rate: float = 1.0
    ops: tuple[str, ...] = OPERATIONS
    status: int = 503
    code: str = "SlowDown"
    after: bool = False  # status: forward first, then lose the answer
    seconds: float = 0.0  # burst: how long; latency: the delay
    key: str | None = None  # only requests whose path holds this text
    limit: int | None = None  # at most this many faults from this rule
    fired: int = 0
    started: float | None = None  # burst: when its first request came


@dataclass
class Stats:
    requests: int = 0
    faults: dict = field(default_factory=dict)
    busy_seconds: float = 0.0  # summed over requests: time from read to answered
    by_op: dict = field(default_factory=dict)
    log: list = field(default_factory=list)  # (start, end, op, path) of every request


def s3_error(status: int, code: str, pad: int = 0) -> bytes:
    request_id = uuid.uuid4().hex.upper()
    host_id = "x" * pad
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{_MESSAGES.get(code, code)}</Message>"
        f"<RequestId>{request_id}</RequestId><HostId>{host_id}</HostId></Error>"
    ).encode()


_MESSAGES = {
    "SlowDown": "Please reduce your request rate.",
    "InternalError": "We encountered an internal error. Please try again.",
    "ServiceUnavailable": "Service is unable to handle request.",
}


class FaultProxy:
    def __init__(self, target_port: int, seed: int = 0, normalize: bool = False):
        self.target_port = target_port
        self.random = random.Random(seed)
        self.rules: list[Rule] = []
        self.stats = Stats()
        self.normalize = normalize
        self._lock = threading.Lock()
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ rules

    def add(self, kind: str, **kw) -> Rule:
        rule = Rule(kind, **kw)
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self.rules = []

    def reset_stats(self) -> None:
        with self._lock:
            self.stats = Stats()

    def _decide(self, op: str, ranged: int | None, path: str) -> Rule | None:
        with self._lock:
            self.stats.requests += 1
            self.stats.by_op[op] = self.stats.by_op.get(op, 0) + 1
            now = time.monotonic()
            for rule in self.rules:
                if op not in rule.ops or (rule.limit is not None and rule.fired >= rule.limit):
                    continue
                if rule.key is not None and rule.key not in path:
                    continue
                if rule.kind == "latency":
                    continue  # applied to every request, below
                if rule.kind == "burst":
                    if rule.started is None:
                        rule.started = now
                    if now - rule.started < rule.seconds:
                        return self._fire(rule)
                    continue
                if rule.kind == "short_range" and ranged is None:
                    continue
                if self.random.random() < rule.rate:
                    return self._fire(rule)
            return None

    def _fire(self, rule: Rule) -> Rule:
        rule.fired += 1
        name = rule.kind if rule.kind != "status" else f"{rule.status} {rule.code}"
        self.stats.faults[name] = self.stats.faults.get(name, 0) + 1
        return rule

    def _latency(self, op: str) -> float:
        with self._lock:
            return sum(r.seconds for r in self.rules if r.kind == "latency" and op in r.ops)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _operation(method: str, path: str, headers) -> str:
    parts = urlsplit(path)
    query = parse_qs(parts.query, keep_blank_values=True)
    key = parts.path.lstrip("/").partition("/")[2]
    if method == "PUT" and headers.get("x-amz-copy-source"):
        return "COPY"
    if method == "POST" and "delete" in query:
        return "DELETE"
    if method == "GET" and not key:
        return "LIST"
    return method


def _normalized(path: str) -> str:
    """`path` with its dot segments removed (RFC 3986 5.2.4), the query kept."""
    parts = urlsplit(path)
    out: list[str] = []
    for segment in parts.path.split("/"):
        if segment == "..":
            if len(out) > 1:
                out.pop()
        elif segment != ".":
            out.append(segment)
    return "/".join(out) + (f"?{parts.query}" if parts.query else "")


def _range_length(headers) -> int | None:
    value = headers.get("Range")
    if not value or not value.startswith("bytes="):
        return None
    first, _, last = value[len("bytes=") :].partition("-")
    try:
        return int(last) - int(first) + 1
    except ValueError:
        return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: FaultProxy

    def log_message(self, *args) -> None:  # quiet
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _handle(self) -> None:
        started = time.monotonic()
        method = self.command
        body = self._body()
        op = _operation(method, self.path, self.headers)
        owner = self.owner
        delay = owner._latency(op)
        if delay:
            time.sleep(delay)
        rule = owner._decide(op, _range_length(self.headers) if method == "GET" else None, self.path)
        try:
            if rule is not None and rule.kind in ("status", "burst", "short_range") and not rule.after:
                pad = 0
                if rule.kind == "short_range":
                    pad = (_range_length(self.headers) or 0) + 64
                code = "SlowDown" if rule.kind != "status" else rule.code
                status = 503 if rule.kind != "status" else rule.status
                self._send(status, [("Content-Type", "application/xml")], s3_error(status, code, pad), method)
                return
            status, headers, data = self._forward(method, body)
            if rule is not None and rule.kind == "status":  # applied, the answer lost
                self._send(rule.status, [("Content-Type", "application/xml")], s3_error(rule.status, rule.code), method)
                return
            if rule is not None and rule.kind == "reset":
                self._reset(status, headers, data, method)
                return
            self._send(status, headers, data, method)
        finally:
            with owner._lock:
                ended = time.monotonic()
                owner.stats.busy_seconds += ended - started
                owner.stats.log.append((started, ended, op, self.path))

    def _forward(self, method: str, body: bytes):
        conn = getattr(self, "_upstream", None)
        if conn is None:
            conn = self._upstream = http.client.HTTPConnection("127.0.0.1", self.owner.target_port, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("expect", "transfer-encoding")}
        headers["Content-Length"] = str(len(body))
        for attempt in range(2):  # the kept connection may have been closed by the server
            try:
                conn.request(method, _normalized(self.path) if self.owner.normalize else self.path, body, headers)
                resp = conn.getresponse()
                data = resp.read()
                break
            except (http.client.HTTPException, OSError):
                conn.close()
                if attempt:
                    raise
        out = [(k, v) for k, v in resp.getheaders() if k.lower() not in ("transfer-encoding", "connection")]
        return resp.status, out, data

    def _send(self, status: int, headers, data: bytes, method: str) -> None:
        self.send_response_only(status)
        has_length = False
        for k, v in headers:
            if k.lower() == "content-length":
                if method == "HEAD":
                    self.send_header(k, v)
                    has_length = True
                continue
            if k.lower() in ("date", "server"):
                continue
            self.send_header(k, v)
        if not has_length:
            self.send_header("Content-Length", str(0 if method == "HEAD" else len(data)))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(data)
        self.wfile.flush()

    def _reset(self, status: int, headers, data: bytes, method: str) -> None:
        """The headers and half the body, then a TCP reset (RST, not FIN)."""
        if method != "HEAD" and data:
            self.send_response_only(status)
            for k, v in headers:
                if k.lower() not in ("date", "server", "content-length"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        for f in (self.wfile, self.rfile, self.connection):  # the socket closes with its last file
            try:
                f.close()
            except OSError:
                pass

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle

    def handle(self) -> None:
        try:
            super().handle()
        except (OSError, ValueError):
            pass  # the connection was reset on purpose, or by the client

    def finish(self) -> None:
        try:
            super().finish()
        except (OSError, ValueError):
            pass
