"""A raw disk compressed to gzip in members of one MiB each, so that images built on one OS layer compress the
layer's bytes once between them.

Why members: a bare-metal image is a 4 GiB or larger raw disk, and pigz spent most of a chroot build compressing it
(28 of 48 s here). The images of a ``build.matrix`` share an OS layer and differ from it in a few MiB (the
Kubernetes binaries, the sealed files): 1694 of the 1718 non-zero MiBs of a channel's disk are byte for byte the
layer's. A gzip file may hold any number of members one after another (RFC 1952, 2.2), and every reader
(gunzip, zcat, Python's gzip, Go's compress/gzip as the bare-metal provisioner uses) reads them as one stream. So
each MiB of the disk becomes one member: a MiB that is a hole or all zeros is the same small member every time and
is never compressed; any other MiB is compressed by zlib at level 1 (:data:`~imagebuilder.core.stream.MEMBER_LEVEL`,
which says why not ISA-L) on every core, and with a :class:`MemberStore` it is compressed once for every image that
has it, across threads and runs.

The gzip wrapper writes no name and no time into a member, so a member depends on its bytes only: the same disk
gives the same .gz, with or without a store. Each member restarts its dictionary, which costs under 0.1 % in size at
this member size.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, ClassVar

from imagebuilder.core import disk
from imagebuilder.core.errors import ExternalError
from imagebuilder.core.files import atomic_write
from imagebuilder.core.progress import Advance
from imagebuilder.core.stream import INFLATE_ERRORS, MEMBER_CODEC, gzip_member, inflater, zero_member

#: the bytes of the disk each member holds
MEMBER = 1 << 20
_ZEROS = bytes(MEMBER)


def _sealed(member: bytes) -> bytes:
    """A member as the store keeps it: its own SHA-256 first, so that a damaged or cut file is never used."""
    return hashlib.sha256(member).digest() + member


def _holds(member: bytes, data: bytes) -> bool:
    """Whether the member's trailer gives the length of ``data`` (what it holds, modulo 2**32)."""
    (size,) = struct.unpack("<I", member[-4:])
    return bool(size == len(data) & 0xFFFFFFFF)


def _unsealed(blob: bytes, data: bytes) -> bytes | None:
    """The member in a store file, when the file is whole and the member holds as many bytes as ``data``."""
    member = blob[32:]
    if len(member) < 18 or hashlib.sha256(member).digest() != blob[:32]:
        return None
    return member if _holds(member, data) else None


class MemberStore:
    """Compressed members on disk, named by the SHA-256 of the bytes they hold.

    One store serves every image built on one OS layer (it lives beside the layer). Within this process a member
    is compressed by one thread only: the others that need it meanwhile wait for that one instead of compressing it
    again, which is what lets two images packaged at once split the layer's work between them. A member file is
    written atomically with the member's own SHA-256 in front, and used only when that digest and the member's
    length field match (anything else is compressed again and replaced), so a crash or a damaged file never puts
    wrong bytes into an image."""

    _open: ClassVar[dict[Path, MemberStore]] = {}
    _open_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._pending: dict[str, Future[bytes]] = {}
        #: the files whose seal this process checked, by key: (inode, size, mtime) as they were then
        self._checked: dict[str, tuple[int, int, int]] = {}

    @classmethod
    def beside(cls, layer: Path) -> MemberStore:
        """The store of the images built on the OS layer ``layer``: ``<layer name>.members`` beside it."""
        return cls.at(layer.with_name(layer.stem + ".members"))

    @classmethod
    def at(cls, directory: Path) -> MemberStore:
        """The store in ``directory``, the same object for every caller in this process."""
        key = directory.resolve()
        with cls._open_lock:
            store = cls._open.get(key)
            if store is None:
                store = cls._open[key] = MemberStore(key)
            return store

    def path_of(self, key: str) -> Path:
        """Where the member of the MiB whose SHA-256 is ``key`` is kept."""
        # under the codec's level: a store filled by another codec (ISA-L's level 2 before 2026-12-07) gives no member
        # to a build, whose .gz must depend on its disk's bytes only, not on what a cache held
        return self.directory / MEMBER_CODEC / key[:2] / key

    def member(self, data: bytes, key: str | None = None) -> tuple[bytes, bool]:
        """The gzip member of ``data``, and whether it was reused: from the store or from the thread compressing it
        now (True), or compressed here (False). ``key`` is the SHA-256 of ``data`` where the caller knows it."""
        key = key or hashlib.sha256(data).hexdigest()
        with self._lock:
            pending = self._pending.get(key)
            if pending is None:
                self._pending[key] = mine = Future[bytes]()
        if pending is not None:
            return pending.result(), True
        try:
            member = self._read(key, data)
            reused = member is not None
            if member is None:
                member = gzip_member(data)
                path = self.path_of(key)
                path.parent.mkdir(parents=True, exist_ok=True)
                with atomic_write(path, "wb", sync=False) as fh:  # checked when read: no sync per member
                    fh.write(_sealed(member))
            mine.set_result(member)
            return member, reused
        except BaseException as exc:
            mine.set_exception(exc)
            raise
        finally:
            with self._lock:
                del self._pending[key]

    def _read(self, key: str, data: bytes) -> bytes | None:
        """The stored member of ``data``, checked against its seal unless this process already checked that very
        file, unchanged since (the images of a matrix read every member of their layer: hashing each again cost a
        second of CPU per image). As git does for its index, a file is remembered only once its modification time
        is over a second old when checked, so that any later change gives it a newer time, whatever the
        timestamps' granularity."""
        try:
            with open(self.path_of(key), "rb") as fh:
                st = os.fstat(fh.fileno())
                blob = fh.read()
        except OSError:
            return None
        seen = (st.st_ino, st.st_size, st.st_mtime_ns)
        if self._checked.get(key) == seen:
            trusted = blob[32:]
            return trusted if len(trusted) >= 18 and _holds(trusted, data) else None
        member = _unsealed(blob, data)
        if member is not None and st.st_mtime_ns < time.time_ns() - 1_000_000_000:
            self._checked[key] = seen
        return member


def _offsets(size: int, extents: list[tuple[int, int]]) -> Iterator[tuple[int, int, bool]]:
    """(offset, length, holds data) of each member of a ``size``-byte disk whose data lies in ``extents``."""
    i = 0
    for offset in range(0, size, MEMBER):
        end = min(offset + MEMBER, size)
        while i < len(extents) and extents[i][1] <= offset:
            i += 1
        yield offset, end - offset, i < len(extents) and extents[i][0] < end


@dataclass
class Compressed:
    """A .gz written by :func:`gzip_disk`: its digest and size, and how many of its members held data and how many
    of those came from the store instead of being compressed (zero members are neither)."""

    sha256: str
    size: int
    data_members: int = 0
    reused: int = 0


@dataclass(frozen=True)
class Base:
    """A raw disk that no longer changes (a finished OS layer) and, as :func:`prime` reads it, the key (SHA-256) of
    the MiB at each offset, so that the images copied from it are packaged by comparing their MiBs with its own
    instead of hashing each one (:func:`gzip_disk`). It lives as long as the disk: a later disk at the same path
    gets a new one."""

    disk: Path
    keys: dict[int, str] = field(default_factory=dict)


def prime(
    src: Path, store: MemberStore, *, workers: int = 1, stop: threading.Event | None = None, base: Base | None = None
) -> None:
    """Put the member of every MiB of the raw disk ``src`` that holds data into ``store``, at a low priority.

    Run beside the builds of the images made from ``src``, it uses the CPU time they leave idle, so that less is
    left to compress when they are packaged. It goes from the last MiB to the first, against the packagers'
    direction, so the two meet once instead of waiting on each other. ``stop`` ends it early (Ctrl-C).

    ``base`` (whose disk is ``src``, which then must not change) is told the key of each MiB read."""
    if base is not None and base.disk != src:
        raise ValueError(f"{base.disk} is not {src}")
    with open(src, "rb") as fh:
        fd = fh.fileno()
        size = os.fstat(fd).st_size
        offsets = [(o, n) for o, n, has_data in _offsets(size, disk.data_extents(fd, size)) if has_data][::-1]

        def work(share: list[tuple[int, int]]) -> None:
            with contextlib.suppress(OSError):  # nice is per thread on Linux
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
            for offset, length in share:
                if stop is not None and stop.is_set():
                    return
                data = os.pread(fd, length, offset)
                if data != _ZEROS[:length]:
                    key = hashlib.sha256(data).hexdigest()
                    store.member(data, key)
                    if base is not None:
                        base.keys[offset] = key

        with ThreadPoolExecutor(workers, thread_name_prefix="prime") as pool:
            for done in [pool.submit(work, offsets[i::workers]) for i in range(workers)]:
                done.result()


class Origin:
    """The .gz a disk was decompressed from, when it is one member per MiB (as :func:`gzip_disk` writes): a changed
    copy of that disk (``image.customize``'s output) is packaged by taking the input's member of each MiB it left as
    it was, instead of compressing that MiB again.

    A member is taken only when it decompresses to exactly the MiB being packaged (inflating is several times
    cheaper than deflating), so a damaged input or a member whose checksum happens to match never puts other bytes
    into the output. Made by :meth:`of` from what decompressing the input found, read within ``with origin:``."""

    def __init__(self, gz: Path, members: dict[int, disk.GzipMember]) -> None:
        self.gz = gz
        #: each member of a MiB or less, by the raw offset it starts at
        self.members = members
        self._fh: BinaryIO | None = None

    @classmethod
    def of(cls, gz: Path, members: list[disk.GzipMember]) -> Origin | None:
        """``gz`` with its ``members``, as :func:`imagebuilder.core.disk.gunzip_sparse` found them when it
        decompressed it; None when none of them is a MiB or less (one member for it all, as gzip and pigz write)."""
        spans = {m.raw_offset: m for m in members if m.raw_length <= MEMBER}
        return cls(gz, spans) if spans else None

    def __enter__(self) -> Origin:
        self._fh = self.gz.open("rb")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def member(self, offset: int, data: bytes) -> bytes | None:
        """The input's member at ``offset`` when it holds exactly ``data`` (within ``with origin:``)."""
        span = self.members.get(offset)
        if span is None or span.raw_length != len(data) or self._fh is None:
            return None
        blob = os.pread(self._fh.fileno(), span.length, span.offset)
        try:
            inflating = inflater()
            same = inflating.decompress(blob, len(data) + 1) == data and inflating.eof and not inflating.unused_data
        except INFLATE_ERRORS:
            return None
        return blob if same else None


def gzip_disk(
    src: Path,
    dest: Path,
    *,
    store: MemberStore | None = None,
    base: Base | None = None,
    origin: Origin | None = None,
    on_bytes: Advance | None = None,
) -> Compressed:
    """Compress the raw disk ``src`` to ``dest``; the .gz is hashed as it is written.

    Members are made on every core and written in order; at most a few per core are held in memory. ``dest`` is
    written beside its final name and renamed when complete, so a failure leaves nothing there.

    ``base`` is the unchanging disk ``src`` was copied from, primed into ``store``: a MiB equal to the base's at the
    same offset has the key recorded there, so it is compared (a fifth of the CPU time of hashing it).

    ``origin`` is the member-per-MiB .gz ``src`` was decompressed from before it changed: a MiB it still holds at
    the same offset is its member, taken as it is (counted as reused)."""
    workers = os.cpu_count() or 1
    digest, written = hashlib.sha256(), 0
    data_members = reused_members = 0
    keys = base.keys if store is not None and base is not None else {}
    try:
        with (
            open(src, "rb") as fh,
            open(base.disk if base is not None else src, "rb") as base_fh,
            atomic_write(dest, "wb", uncache=True) as out,
            ThreadPoolExecutor(workers) as pool,
        ):
            fd, base_fd = fh.fileno(), base_fh.fileno()
            size = os.fstat(fd).st_size

            def make(offset: int, length: int) -> tuple[bytes, bool | None]:
                """The member at ``offset``, and None for zeros, else whether the store gave it."""
                data = os.pread(fd, length, offset)
                if len(data) != length:
                    raise OSError(f"{src} changed while it was compressed")
                if data == _ZEROS[:length]:
                    return zero_member(length), None
                kept = origin.member(offset, data) if origin is not None else None
                if kept is not None:
                    return kept, True
                if store is None:
                    return gzip_member(data), False
                key = keys.get(offset)
                if key is not None and os.pread(base_fd, length, offset) == data:
                    return store.member(data, key)
                return store.member(data)

            window: deque[tuple[Future[tuple[bytes, bool | None]], int]] = deque()

            def drain(keep: int) -> None:
                nonlocal written, data_members, reused_members
                while len(window) > keep:
                    future, length = window.popleft()
                    member, reused = future.result()
                    data_members += reused is not None
                    reused_members += reused is True
                    out.write(member)
                    digest.update(member)
                    written += len(member)
                    if on_bytes is not None:
                        on_bytes(length)

            for offset, length, has_data in _offsets(size, disk.data_extents(fd, size)):
                if has_data:
                    window.append((pool.submit(make, offset, length), length))
                else:  # a hole: nothing to read
                    hole: Future[tuple[bytes, bool | None]] = Future()
                    hole.set_result((zero_member(length), None))
                    window.append((hole, length))
                drain(4 * workers)
            if size == 0:  # an empty disk is still a gzip file
                out.write(member := zero_member(0))
                digest.update(member)
                written += len(member)
            drain(0)
    except OSError as exc:
        raise ExternalError(f"cannot compress {src}: {exc.strerror or exc}", hint="is the disk still there?") from None
    return Compressed(digest.hexdigest(), written, data_members, reused_members)
