"""Transforms applied to bytes as they stream (:func:`imagebuilder.core.fetch.download` feeds them).

A transform writes what it makes of the bytes into the temporary file the download renames into place once every
hash matched: :class:`Copy` the bytes as they come, :class:`Lz4ToGzip` the bare-metal image recompressed in one pass.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
import zlib
from typing import Any, BinaryIO, Protocol, cast

from isal import isal_zlib

from imagebuilder.core.errors import ExternalError

CHUNK = 1024 * 1024
#: zlib's level that a member-per-MiB disk's members are deflated at. ISA-L's level 2 (2026-11-30 .. 2026-12-07) was
#: 4.5 times faster, but not the same bytes in every process: twice in the suite, under load, an image rebuilt from
#: its provenance differed from the original in one member whose data was the same (from byte 122: the block's
#: Huffman header), and no test in one process made the other member again. A reproducible image cannot depend on
#: that; CPython's zlib gives the same member for the same bytes everywhere (99 against 445 MB/s of one core, 0.336
#: against 0.343 of the size, on a built image's data, 2026-12-07)
MEMBER_LEVEL = 1
#: the codec's short name: the member store keeps each codec's members apart under it (an ISA-L store is not used)
MEMBER_CODEC = f"zlib-{MEMBER_LEVEL}"
#: what a damaged or cut stream raises from :func:`inflater`'s object
INFLATE_ERRORS: tuple[type[Exception], ...] = (cast(type[Exception], isal_zlib.error),)


def member_codec() -> str:
    """What :func:`gzip_member` deflates with, as build manifests record it (the bytes of a member depend on it)."""
    return f"zlib {zlib.ZLIB_RUNTIME_VERSION}, level {MEMBER_LEVEL}"


def gzip_member(data: bytes) -> bytes:
    """``data`` as one complete gzip member, deflated by zlib (no name, no time: the same bytes give the same
    member in every process, which is what lets a disk's zero MiBs be one known member, its other MiBs be shared by
    images, and an image be rebuilt to the same bytes)."""
    compressor = zlib.compressobj(MEMBER_LEVEL, zlib.DEFLATED, 31)
    return compressor.compress(data) + compressor.flush()


@functools.cache
def zero_member(length: int) -> bytes:
    """``length`` zero bytes as :func:`gzip_member` deflates them: every zero MiB of a member-per-MiB disk."""
    return gzip_member(bytes(length))


class Inflater(Protocol):
    """What :func:`inflater` returns (ISA-L's decompression object, zlib's surface)."""

    eof: bool
    unused_data: bytes
    unconsumed_tail: bytes

    def decompress(self, data: bytes, max_length: int = 0, /) -> bytes: ...


def inflater() -> Inflater:
    """A decompressor of one gzip member, ISA-L's: about twice as fast as zlib's on a disk's data and five times on
    its zeros (measured here)."""
    return cast(Inflater, isal_zlib.decompressobj(31))


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
    from ISA-L (``isal``, a dependency of the package) at its level 1: several times faster than zlib's default
    level on a disk image, at a modest cost in size.
    """

    def __init__(self, level: int = 1, queue_depth: int = 8) -> None:
        import lz4.frame

        self._lz4 = lz4.frame.LZ4FrameDecompressor()
        self._gz: Any = isal_zlib.compressobj(level, isal_zlib.DEFLATED, 31)
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
