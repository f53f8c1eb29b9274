"""Object-storage streams (storage/__init__.py opens them): an object read by retried
byte ranges, optionally ahead on threads (`RangeReader`), and a writable stream whose object
appears whole when it is closed, in one PUT or in parts (`Upload`). Every request goes
through s3.py's `request` and so through the retry policy (retry.py).
"""

from __future__ import annotations

import io
import tempfile
from concurrent.futures import ThreadPoolExecutor

from . import retry
from .locations import S3, split
from .s3 import PART_BYTES, SINGLE_PUT_BYTES, UPLOAD_THREADS, client, error_code, filesystem, put, request


class RangeReader(io.RawIOBase):
    """An object read by byte ranges, each range read one retried request. With `ahead`,
    a stream read from start to end: the next `ahead` chunks of `chunk` bytes are fetched
    on threads while the caller works on this one (memory: that many chunks)."""

    def __init__(self, loc: str, chunk: int = 0, ahead: int = 0, size: int | None = None):
        self._loc = loc
        path = loc[len(S3) :]
        if size is None:  # pyarrow's native file: a HEAD for the size, then ranged GETs in C++
            self._native = request(loc, "HEAD", lambda: filesystem().open_input_file(path))
            self._size = self._native.size()
        else:  # the size known (the object was opened before): ranged GETs through botocore, no HEAD
            self._native, self._size = None, size
        self._pos = 0
        self._chunk, self._ahead = chunk, ahead if chunk > 0 else 0
        self._pool: ThreadPoolExecutor | None = None
        self._chunks: dict = {}  # chunk number -> Future of its bytes

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def size(self) -> int:
        return self._size

    def read_at(self, n: int, offset: int) -> bytes:
        n = max(0, min(n, self._size - offset))
        if n == 0:
            return b""
        if self._native is None:
            bucket, key = split(self._loc)
            span = f"bytes={offset}-{offset + n - 1}"
            return request(
                self._loc, "GET", lambda: client().get_object(Bucket=bucket, Key=key, Range=span)["Body"].read()
            )
        native = self._native
        return request(self._loc, "GET", lambda: native.read_at(n, offset))

    def read(self, n: int = -1) -> bytes:
        n = self._size - self._pos if n is None or n < 0 else n
        data = self._read_ahead(n, self._pos) if self._ahead else self.read_at(n, self._pos)
        self._pos += len(data)
        return data

    def _read_ahead(self, n: int, offset: int) -> bytes:
        size, step = self._size, self._chunk
        end = min(size, offset + n)
        first, last = offset // step, (size - 1) // step
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self._ahead, thread_name_prefix="store-ahead")
        for k in [k for k in self._chunks if k < first or k > first + self._ahead]:
            self._chunks.pop(k).cancel()  # behind the reader (or far ahead of a seek back)
        for k in range(first, min(first + self._ahead, last) + 1):
            if k not in self._chunks:
                self._chunks[k] = self._pool.submit(self.read_at, step, k * step)
        out, at = [], offset
        while at < end:
            k = at // step
            if k not in self._chunks:
                self._chunks[k] = self._pool.submit(self.read_at, step, k * step)
            data = self._chunks[k].result()
            piece = data[at - k * step : end - k * step]
            out.append(piece)
            at += len(piece)
        return b"".join(out)

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = {0: 0, 1: self._pos, 2: self._size}[whence] + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        if not self.closed:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
            self._chunks.clear()
            if self._native is not None:
                self._native.close()
        super().close()


class Upload:
    """A writable stream whose object appears whole when it is closed: what is written is
    held in a spooled temporary file, then PUT in one request or, above SINGLE_PUT_BYTES, in
    parts of PART_BYTES on UPLOAD_THREADS threads (each part retried alone). Leaving a `with` block on an
    exception, or `discard()`, uploads nothing."""

    def __init__(self, loc: str):
        self.loc = loc
        self._buffer = tempfile.SpooledTemporaryFile(max_size=PART_BYTES)
        self._size = 0
        self.closed = False

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def write(self, data) -> int:
        n = self._buffer.write(data)
        self._size += n
        return n

    def tell(self) -> int:
        return self._size

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._upload()
        finally:
            self.discard()

    def discard(self) -> None:
        self.closed = True
        self._buffer.close()

    def __enter__(self) -> Upload:
        return self

    def __exit__(self, kind, *_) -> None:
        if kind is None:
            self.close()
        else:
            self.discard()

    def _upload(self) -> None:
        self._buffer.seek(0)
        if self._size <= SINGLE_PUT_BYTES:
            put(self.loc, self._buffer.read())
            return
        bucket, key = split(self.loc)
        started = request(
            self.loc, "CreateMultipartUpload", lambda: client().create_multipart_upload(Bucket=bucket, Key=key)
        )
        upload_id = started["UploadId"]
        try:
            etags = self._parts(bucket, key, upload_id)
            parts = {"Parts": [{"ETag": etag, "PartNumber": k + 1} for k, etag in enumerate(etags)]}

            def complete() -> None:
                try:
                    client().complete_multipart_upload(
                        Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload=parts
                    )
                except Exception as e:
                    # an answer lost after the store completed it: the retry finds no upload
                    if error_code(e) != "NoSuchUpload" or not self._landed(bucket, key):
                        raise

            request(self.loc, "CompleteMultipartUpload", complete)
        except BaseException:
            with retry.short_budget():
                try:
                    client().abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
                except Exception as e:  # noqa: BLE001 - the store expires it; the first error stands
                    retry.log.warning("%s: aborting the multipart upload failed (%s)", self.loc, retry.describe(e))
            raise

    def _landed(self, bucket: str, key: str) -> bool:
        try:
            return client().head_object(Bucket=bucket, Key=key)["ContentLength"] == self._size
        except Exception:  # noqa: BLE001 - not landed, as far as can be told
            return False

    def _parts(self, bucket: str, key: str, upload_id: str) -> list[str]:
        """Upload the parts, UPLOAD_THREADS at once (memory: that many parts)."""
        from collections import deque

        def send(number: int, data: bytes) -> str:
            what = f"UploadPart {number}"
            return request(
                self.loc,
                what,
                lambda: client().upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data)[
                    "ETag"
                ],
            )

        etags: list[str] = []
        with ThreadPoolExecutor(max_workers=UPLOAD_THREADS, thread_name_prefix="store-upload") as pool:
            pending: deque = deque()
            number = 0
            while data := self._buffer.read(PART_BYTES):
                number += 1
                pending.append(pool.submit(send, number, data))
                while len(pending) >= UPLOAD_THREADS:
                    etags.append(pending.popleft().result())
            while pending:
                etags.append(pending.popleft().result())
        return etags
