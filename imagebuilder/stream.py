"""One pass over the bytes: download, verify and transform a large file in a single stream.

python-tuf's ``download_target`` writes a target to a temporary file, reads it back to check it and copies it to
its destination: twice the disk and three passes over gigabytes. Here the bytes are read once from the network;
their length and hashes are checked against what the signed metadata promised while they stream; a transform
(nothing, or lz4 -> gzip for the bare-metal image) writes the result into a temporary file beside the destination;
only a verified result is renamed into place. A dropped connection is resumed with an HTTP ``Range`` request (the
hashes and the transform keep their state, so nothing is read twice), with backoff between attempts.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from imagebuilder.errors import ExternalError

CHUNK = 1024 * 1024
Progress = Callable[[int], None]


class Transform(Protocol):
    def feed(self, data: bytes) -> bytes: ...

    def finish(self) -> bytes: ...


class Copy:
    """The bytes as they come (the OVA)."""

    def feed(self, data: bytes) -> bytes:
        return data

    def finish(self) -> bytes:
        return b""


class Lz4ToGzip:
    """lz4 frames in, gzip out, in bounded memory (spec 4.5 step 5 without the intermediate 'bottlerocket.img').

    gzip comes from ISA-L (``isal``) at its level 1 where installed: several times faster than zlib's default
    level for a disk image, at a modest cost in size; zlib level 1 otherwise.
    """

    def __init__(self, level: int = 1) -> None:
        import lz4.frame

        self._lz4 = lz4.frame.LZ4FrameDecompressor()
        self._gz: Any
        try:
            from isal import isal_zlib

            self._gz = isal_zlib.compressobj(level, isal_zlib.DEFLATED, 31)
        except ImportError:  # pragma: no cover - isal is a dependency; zlib is the fallback
            import zlib

            self._gz = zlib.compressobj(level, zlib.DEFLATED, 31)

    def feed(self, data: bytes) -> bytes:
        out = []
        while data:
            raw = self._lz4.decompress(data)
            if raw:
                out.append(self._gz.compress(raw))
            data = self._lz4.unused_data if self._lz4.eof else b""
            if self._lz4.eof:  # a new frame follows (lz4 files may hold several)
                import lz4.frame

                self._lz4 = lz4.frame.LZ4FrameDecompressor()
        return b"".join(out)

    def finish(self) -> bytes:
        if not self._lz4.eof and self._lz4.needs_input is False:
            raise ExternalError("the lz4 stream ended in the middle of a frame")
        flushed: bytes = self._gz.flush()
        return flushed


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
            while True:
                try:
                    _fetch(http, url, state, expected, transform, out, progress)
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
            out.write(transform.finish())
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
        part.unlink(missing_ok=True)
        http.clear()


@dataclass
class _State:
    """What survives a dropped connection: the hashes so far and the byte count (the transform keeps its own)."""

    hashers: dict[str, hashlib._Hash]
    received: int = 0


def _fetch(
    http: object,
    url: str,
    state: _State,
    expected: Expected,
    transform: Transform,
    out: object,
    progress: Progress | None,
) -> None:
    """One HTTP GET from ``state.received`` on; raises on connection errors (the caller resumes from the state)."""
    offset = state.received
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    res = http.request("GET", url, headers=headers, preload_content=False)  # type: ignore[attr-defined]
    try:
        if res.status == 416 and offset:
            return  # nothing more to send: the caller reports a truncated file
        if res.status not in (200, 206):
            raise ExternalError(f"GET {url}: HTTP {res.status}", hint="check --metadata-url/--targets-url")
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
            out.write(transform.feed(chunk))  # type: ignore[attr-defined]
            state.received += len(chunk)
            if progress:
                progress(len(chunk))
    finally:
        res.release_conn()
