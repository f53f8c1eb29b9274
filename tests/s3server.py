"""A real S3-compatible server for the tests: moto's server, started on 127.0.0.1 on a free
port, in-memory, one per test session (`s3` fixture in conftest.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class S3Server:
    def __init__(self, log: Path, authenticate: bool = False):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from moto.server import main; main()", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # authenticate: every request's credentials are checked (moto knows none: all are refused)
            env={**os.environ, **({"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if authenticate else {})},
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.endpoint, timeout=1)
                break
            except urllib.error.HTTPError:
                break  # it answers (an authenticating server refuses the anonymous request)
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto's S3 server did not start (see {log})") from None
                time.sleep(0.2)
        self.env = {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    def client(self):
        import botocore.session

        return botocore.session.get_session().create_client(
            "s3",
            region_name="us-east-1",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def bucket(self, prefix: str = "b") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def upload(self, folder: Path, uri: str) -> None:
        """Every file under `folder` to the prefix `uri` (s3://bucket/prefix), same layout."""
        bucket, _, prefix = uri[len("s3://") :].partition("/")
        client = self.client()
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file():
                key = "/".join(filter(None, [prefix, path.relative_to(folder).as_posix()]))
                client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())

    def download(self, uri: str, folder: Path) -> None:
        download(uri, folder)  # the test's environment points at this server (conftest's `s3`)

    def keys(self, uri: str) -> list[str]:
        bucket, _, prefix = uri[len("s3://") :].partition("/")
        out = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            out += [o["Key"][len(prefix) :].lstrip("/") for o in page.get("Contents", [])]
        return sorted(out)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


def with_env(env: dict):
    """A context manager setting `env` in os.environ for this process (restored after)."""
    from contextlib import contextmanager

    @contextmanager
    def manager():
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    return manager()


_METHODS = {b"GET", b"HEAD", b"PUT", b"POST", b"DELETE"}


class CountingProxy:
    """A TCP relay in front of the server on 127.0.0.1, counting the bytes that flow from the
    server to its clients (bodies, headers, listings: all a client reads from the store).
    `latency`: seconds each request waits before it reaches the server (a remote store's
    round trip; a local server answers in a millisecond)."""

    def __init__(self, target_port: int, latency: float = 0.0):
        import threading

        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._target = target_port
        self.latency = latency
        self._lock = threading.Lock()
        self.downstream = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self._target))
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, counted: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                if not counted and self.latency and data.split(b" ", 1)[0] in _METHODS:
                    time.sleep(self.latency)  # a request begins
                dst.sendall(data)
                if counted:
                    with self._lock:
                        self.downstream += len(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._listener.close()


def download(uri: str, folder: Path) -> None:
    """Every object under `uri` into `folder`, same layout, from the store the AWS
    environment names (reassembler.storage)."""
    from reassembler import storage

    for rel in storage.list_files(uri, "", recursive=True):
        target = Path(folder) / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(storage.read_bytes(storage.join(uri, rel)))
