"""Transforms applied to bytes as they stream (:func:`imagebuilder.core.fetch.download` feeds them).

A transform writes what it makes of the bytes into the temporary file the download renames into place once every
hash matched: :class:`Copy` the bytes as they come, :class:`Lz4ToGzip` the bare-metal image recompressed in one pass.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
from typing import Any, BinaryIO, Protocol, cast

import isal
from isal import isal_zlib

from imagebuilder.core.errors import ExternalError

CHUNK = 1024 * 1024
#: ISA-L's level that a member-per-MiB disk's members are deflated at (python-isal's default): 17 times zlib's
#: default level 6 (which pigz uses) on a disk's MiBs here, for 6 % more bytes (414 against 25 MiB/s of one core,
#: 0.464 against 0.439 of the size, measured on the base image's data, 2026-11-30); packaging had been most of a
#: chroot build's time
MEMBER_LEVEL = 2
#: the codec's short name: the member store keeps each codec's members apart under it
MEMBER_CODEC = f"isal-{MEMBER_LEVEL}"
#: what a damaged or cut stream raises from :func:`inflater`'s object
INFLATE_ERRORS: tuple[type[Exception], ...] = (cast(type[Exception], isal_zlib.error),)


def member_codec() -> str:
    """What :func:`gzip_member` deflates with, as build manifests record it (the bytes of a member depend on it)."""
    return f"isal {isal.__version__}, level {MEMBER_LEVEL}"


def gzip_member(data: bytes) -> bytes:
    """``data`` as one complete gzip member, deflated by ISA-L (no name, no time: the same bytes give the same
    member, which is what lets a disk's zero MiBs be one known member and its other MiBs be shared by images).
    isal is a dependency of the package; there is no fallback, whose other bytes would make a build's output
    depend on the machine."""
    compressor = isal_zlib.compressobj(MEMBER_LEVEL, isal_zlib.DEFLATED, 31)
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
