"""One pass over the bytes: download, verify and transform a large file in a single stream.

python-tuf's ``download_target`` writes a target to a temporary file, reads it back to check it and copies it to
its destination: twice the disk and three passes over gigabytes. Here the bytes are read once from the network;
their length and hashes are checked against what the signed metadata promised while they stream; a transform
(nothing, or lz4 -> gzip for the bare-metal image) writes the result into a temporary file beside the destination;
only a verified result is renamed into place. A dropped connection is resumed with an HTTP ``Range`` request (the
hashes and the transform keep their state, so nothing is read twice), with backoff between attempts.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from imagebuilder.errors import ExternalError

if TYPE_CHECKING:
    import urllib3

CHUNK = 1024 * 1024
#: advances a progress display by a byte count
Progress = Callable[[int], None]
#: given the total byte count (0: unknown), returns the Progress for one transfer
ProgressFactory = Callable[[int], Progress]


class Transform(Protocol):
    """Turns the downloaded bytes into the file written to ``out``."""

    def start(self, out: BinaryIO) -> None: ...

    def feed(self, data: bytes) -> None: ...

    def finish(self) -> None: ...

    def abort(self) -> None:
        """Called after a failure, finished or not: release what ``start`` took."""


class Copy:
    """The bytes as they come (the OVA)."""

    def start(self, out: BinaryIO) -> None:
        self._out = out

    def feed(self, data: bytes) -> None:
        self._out.write(data)

    def finish(self) -> None:
        pass

    def abort(self) -> None:
        pass


class Lz4ToGzip:
    """lz4 frames in, gzip out, in bounded memory (spec 4.5 step 5 without the intermediate 'bottlerocket.img').

    Two stages on two threads, both of which release the GIL in their C code: the caller's thread reads and
    decompresses, a second thread compresses and writes; a short queue between them bounds the memory. gzip comes
    from ISA-L (``isal``) at its level 1: several times faster than zlib's default level on a disk image, at a
    modest cost in size (zlib level 1 where isal is missing).
    """

    def __init__(self, level: int = 1, queue_depth: int = 8) -> None:
        import lz4.frame

        self._lz4 = lz4.frame.LZ4FrameDecompressor()
        self._gz: Any
        try:
            from isal import isal_zlib

            self._gz = isal_zlib.compressobj(level, isal_zlib.DEFLATED, 31)
        except ImportError:  # pragma: no cover - isal is a dependency; zlib is the fallback
            import zlib

            self._gz = zlib.compressobj(level, zlib.DEFLATED, 31)
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=queue_depth)
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._mid_frame = False

    def start(self, out: BinaryIO) -> None:
        def compress() -> None:
            try:
                while (raw := self._queue.get()) is not None:
                    out.write(self._gz.compress(raw))
                out.write(self._gz.flush())
            except BaseException as exc:  # reported on the caller's thread by feed/finish
                self._error = exc

        self._thread = threading.Thread(target=compress, name="gzip", daemon=True)
        self._thread.start()

    def _put(self, item: bytes | None) -> None:
        """Queue for the writer; never blocks on a writer that has stopped."""
        while True:
            if self._error is not None:
                raise self._error
            if self._thread is None or not self._thread.is_alive():
                return
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def feed(self, data: bytes) -> None:
        import lz4.frame

        while True:
            # at most 4 MiB out per call: a megabyte of lz4 can hold gigabytes of zeros (free disk space)
            raw = self._lz4.decompress(data, max_length=4 * CHUNK)
            if raw:
                self._put(raw)
            self._mid_frame = not self._lz4.eof
            if self._lz4.eof:  # a new frame may follow (lz4 files can hold several)
                data = self._lz4.unused_data
                self._lz4 = lz4.frame.LZ4FrameDecompressor()
                if not data:
                    return
            elif self._lz4.needs_input:
                return
            else:
                data = b""  # more output is waiting inside the decompressor

    def finish(self) -> None:
        self._put(None)
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        if self._mid_frame:
            raise ExternalError("the lz4 stream ended in the middle of a frame")

    def abort(self) -> None:
        """Stop the writer after a failure (its output is discarded)."""
        with contextlib.suppress(Exception):  # the writer's own error is not the one being reported
            self._put(None)
        if self._thread is not None:
            self._thread.join(timeout=30)


@dataclass(frozen=True)
class Expected:
    """What the signed metadata promised: the length (None: not known) and hashes (algorithm -> hex) of the bytes."""

    length: int | None
    hashes: dict[str, str]


class VerificationError(ExternalError):
    """The bytes are not the signed ones: nothing was put at the destination."""


def download_verified(
    url: str,
    dest: Path,
    expected: Expected,
    transform: Transform,
    *,
    progress: Progress | None = None,
    attempts: int = 6,
    backoff: float = 0.5,
    timeout: float = 60.0,
) -> Path:
    """Stream ``url`` into ``dest`` through ``transform``; see the module docstring. Returns ``dest``."""
    import urllib3

    http = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=timeout, read=timeout))
    if not expected.hashes:
        raise VerificationError(f"no checksum is known for {url}: it cannot be verified")
    state = _State({alg: hashlib.new(alg) for alg in expected.hashes})
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.part")
    failures = 0
    try:
        with part.open("wb") as out:
            transform.start(out)
            while True:
                try:
                    _fetch(http, url, state, expected, transform, progress)
                except (urllib3.exceptions.HTTPError, OSError) as exc:
                    failures += 1
                    if failures >= attempts:
                        raise ExternalError(
                            f"download of {url} failed after {attempts} attempts at byte {state.received} of "
                            f"{expected.length}: {exc}",
                            hint="check the network or the mirror, then rerun",
                        ) from None
                    time.sleep(backoff * 2 ** (failures - 1))
                    continue
                if expected.length is None or state.received >= expected.length:
                    break  # without a known length, a body that ended cleanly is the whole file
                failures += 1  # the server ended the body early: resume from here
                if failures >= attempts:
                    raise VerificationError(
                        f"{url} is truncated: the server sent {state.received} of the {expected.length} signed bytes"
                    )
                time.sleep(backoff * 2 ** (failures - 1))
            transform.finish()
            for alg, want in expected.hashes.items():
                got = state.hashers[alg].hexdigest()
                if got != want.lower():
                    raise VerificationError(
                        f"{url} failed verification: {alg} is {got}, the signed metadata says {want}",
                        hint="the mirror or a proxy serves other bytes than the repository signed",
                    )
            out.flush()
            os.fsync(out.fileno())
        os.replace(part, dest)
        return dest
    finally:
        transform.abort()
        part.unlink(missing_ok=True)
        http.clear()


@dataclass
class _State:
    """What survives a dropped connection: the hashes so far and the byte count (the transform keeps its own)."""

    hashers: dict[str, hashlib._Hash]
    received: int = 0


def _fetch(
    http: urllib3.PoolManager,
    url: str,
    state: _State,
    expected: Expected,
    transform: Transform,
    progress: Progress | None,
) -> None:
    """One HTTP GET from ``state.received`` on; raises on connection errors (the caller resumes from the state)."""
    offset = state.received
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    res = http.request("GET", url, headers=headers, preload_content=False)
    try:
        if res.status == 416 and offset:
            return  # nothing more to send: the caller reports a truncated file
        if res.status not in (200, 206):
            raise ExternalError(f"GET {url}: HTTP {res.status}", hint="check the URL, or the mirror that serves it")
        skip = offset if res.status == 200 else 0  # the server ignored Range: drop what we already have
        for chunk in res.stream(CHUNK):
            if skip:
                cut = min(skip, len(chunk))
                chunk, skip = chunk[cut:], skip - cut
                if not chunk:
                    continue
            if expected.length is not None and state.received + len(chunk) > expected.length:
                raise VerificationError(
                    f"{url} is larger than the {expected.length} bytes the signed metadata allows",
                    hint="the mirror serves another file under this name",
                )
            for h in state.hashers.values():
                h.update(chunk)
            transform.feed(chunk)
            state.received += len(chunk)
            if progress:
                progress(len(chunk))
    finally:
        res.release_conn()
