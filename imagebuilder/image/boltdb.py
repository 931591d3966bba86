"""A reader of bbolt files, enough to list the images containerd holds in an image at rest, and to set the
times containerd recorded in them (a reproducible image must not carry the build's clock).

Why: ``image.verify`` checks an image mounted read-only, where no containerd can run, yet a node fails first on a
preloaded image under the wrong name. containerd keeps its metadata in one bbolt file
(``/var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db``: buckets ``v1`` / namespace / ``images`` / name);
this reads that file as bbolt lays it out (go.etcd.io/bbolt: page.go, bucket.go, db.go) and never writes.

A file that is not bbolt, or whose pages lead outside it, is an :class:`ExternalError` naming the file.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from imagebuilder.core.errors import ExternalError

MAGIC = 0xED0CDAED
_PAGE_HEADER = struct.Struct("<QHHI")  # id, flags, count, overflow
_META = struct.Struct("<IIIIQQQQQQ")  # magic, version, page size, flags, root, sequence, freelist, pgid, txid, sum
_BRANCH = struct.Struct("<IIQ")  # pos, ksize, pgid
_LEAF = struct.Struct("<IIII")  # flags, pos, ksize, vsize
_BUCKET = struct.Struct("<QQ")  # root, sequence
BRANCH, LEAF = 0x01, 0x02
BUCKET_LEAF = 0x01
MAX_DEPTH = 32
CONTAINERD_DB = "var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db"


def _fnv64a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


class BoltFile:
    """One bbolt file, read whole (containerd's metadata is kilobytes to megabytes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = path.read_bytes()
        metas = [m for m in (self._meta(0), self._meta(1)) if m is not None]
        if not metas:
            raise ExternalError(f"{path} is not a bbolt database (no valid meta page)")
        self.page_size, self.root, self.sequence = max(metas)[1:]

    def _meta(self, index: int) -> tuple[int, int, int, int] | None:
        """(txid, page size, root bucket page, its sequence) of meta page ``index``, or None when it is not a
        valid one."""
        size = 4096 if index == 0 else self._meta_page_size()
        start = index * size + _PAGE_HEADER.size
        if size <= 0 or start + _META.size > len(self.data):
            return None
        fields = _META.unpack_from(self.data, start)
        magic, _, page_size, _, root, sequence, _, _, txid, checksum = fields
        if magic != MAGIC or _fnv64a(self.data[start : start + _META.size - 8]) != checksum:
            return None
        return txid, page_size, root, sequence

    def _meta_page_size(self) -> int:
        if len(self.data) < _PAGE_HEADER.size + _META.size:
            return 0
        return int(_META.unpack_from(self.data, _PAGE_HEADER.size)[2])

    def _page(self, pgid: int) -> memoryview:
        start = pgid * self.page_size
        if pgid < 2 or start + _PAGE_HEADER.size > len(self.data):
            raise ExternalError(f"{self.path}: page {pgid} lies outside the file")
        overflow = _PAGE_HEADER.unpack_from(self.data, start)[3]
        return memoryview(self.data)[start : start + (overflow + 1) * self.page_size]

    def _items(self, page: memoryview, depth: int = 0) -> Iterator[tuple[bytes, bytes, int]]:
        """(key, value, flags) of every leaf element under ``page``, in key order."""
        if depth > MAX_DEPTH:  # a B+tree of a few levels: deeper is a loop of pages
            raise ExternalError(f"{self.path}: its pages nest deeper than {MAX_DEPTH} levels (a damaged file)")
        _, flags, count, _ = _PAGE_HEADER.unpack_from(page, 0)
        for i in range(count):
            at = _PAGE_HEADER.size + i * _LEAF.size
            if flags & BRANCH:
                pos, ksize, child = _BRANCH.unpack_from(page, at)
                yield from self._items(self._page(child), depth + 1)
            elif flags & LEAF:
                leaf_flags, pos, ksize, vsize = _LEAF.unpack_from(page, at)
                key = bytes(page[at + pos : at + pos + ksize])
                yield key, bytes(page[at + pos + ksize : at + pos + ksize + vsize]), leaf_flags
            else:
                raise ExternalError(f"{self.path}: a page of kind {flags:#x} where a bucket's page was expected")

    def _bucket_page(self, value: bytes) -> memoryview:
        root, _ = _BUCKET.unpack_from(value, 0)
        return memoryview(value)[_BUCKET.size :] if root == 0 else self._page(root)  # root 0: an inline bucket

    def bucket(self, *path: str) -> dict[bytes, tuple[bytes, bool]]:
        """The entries of the bucket at ``path`` (key -> (value, is a bucket)); empty when it does not exist. A
        damaged file (an element or page beyond its end, a loop of pages) is an :class:`ExternalError`."""
        try:
            return self._bucket(*path)
        except struct.error as exc:
            raise ExternalError(f"{self.path}: a page ends before its elements do ({exc}): a damaged file") from None

    def _bucket(self, *path: str) -> dict[bytes, tuple[bytes, bool]]:
        page = self._page(self.root)
        for name in path:
            found = next((v for k, v, f in self._items(page) if k == name.encode() and f & BUCKET_LEAF), None)
            if found is None:
                return {}
            page = self._bucket_page(found)
        return {k: (v, bool(f & BUCKET_LEAF)) for k, v, f in self._items(page)}


#: the keys under which containerd (metadata, and its snapshotters' storage) keeps a Go ``time.Time``
TIME_KEYS = (b"createdat", b"updatedat")
#: seconds from 0001-01-01 (Go's zero time) to the Unix epoch
_GO_EPOCH = 62135596800
META_PAGE, FREELIST_PAGE = 0x04, 0x10
VERSION = 2


def go_time(epoch: int) -> bytes:
    """``time.Unix(epoch, 0).UTC().MarshalBinary()``: version 1, seconds since year 1, nanoseconds, offset -1 (UTC)."""
    return struct.pack(">bqih", 1, epoch + _GO_EPOCH, 0, -1)


@dataclass
class Bucket:
    """A bucket as data: its sequence and its entries (key -> value, or a nested bucket)."""

    sequence: int = 0
    items: dict[bytes, bytes | Bucket] = field(default_factory=dict)


def read_tree(path: Path) -> Bucket:
    """Every bucket and value of the bbolt file ``path``, as data (the layout of its pages is left behind)."""
    bolt = BoltFile(path)

    def load(page: memoryview, sequence: int, depth: int) -> Bucket:
        if depth > MAX_DEPTH:
            raise ExternalError(f"{path}: its buckets nest deeper than {MAX_DEPTH} levels (a damaged file)")
        out = Bucket(sequence)
        for key, value, flags in bolt._items(page):
            if flags & BUCKET_LEAF:
                _, seq = _BUCKET.unpack_from(value, 0)
                out.items[key] = load(bolt._bucket_page(value), seq, depth + 1)
            else:
                out.items[key] = value
        return out

    try:
        return load(bolt._page(bolt.root), bolt.sequence, 0)
    except struct.error as exc:
        raise ExternalError(f"{path}: a page ends before its elements do ({exc}): a damaged file") from None


def set_times(tree: Bucket, epoch: int) -> int:
    """Set every ``createdat``/``updatedat`` value (a UTC Go time) under ``tree`` to ``epoch``; returns how many."""
    stamp, count = go_time(epoch), 0
    for key, value in tree.items.items():
        if isinstance(value, Bucket):
            count += set_times(value, epoch)
        elif key in TIME_KEYS and len(value) == len(stamp) and value[:1] == b"\x01":
            tree.items[key] = stamp
            count += 1
    return count


class _Writer:
    """Lays a :class:`Bucket` out as bbolt pages, the same way for the same data: every bucket's own pages after its
    nested buckets', in key order, leaves filled in key order, no inline buckets, no free pages."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.pages: list[tuple[int, bytes]] = []  # (first page id, bytes)
        self.next = 3  # 0 and 1: the meta pages; 2: the (empty) freelist

    def _page(self, flags: int, count: int, body: bytes) -> int:
        size = _PAGE_HEADER.size + len(body)
        span = -(-size // self.page_size)
        pgid, self.next = self.next, self.next + span
        data = _PAGE_HEADER.pack(pgid, flags, count, span - 1) + body
        self.pages.append((pgid, data.ljust(span * self.page_size, b"\0")))
        return pgid

    def _leaf(self, elements: list[tuple[bytes, bytes, int]]) -> int:
        heads, data = b"", b""
        for i, (key, value, flags) in enumerate(elements):
            pos = (len(elements) - i) * _LEAF.size + len(data)
            heads += _LEAF.pack(flags, pos, len(key), len(value))
            data += key + value
        return self._page(LEAF, len(elements), heads + data)

    def _branch(self, children: list[tuple[bytes, int]]) -> int:
        heads, data = b"", b""
        for i, (key, pgid) in enumerate(children):
            pos = (len(children) - i) * _BRANCH.size + len(data)
            heads += _BRANCH.pack(pos, len(key), pgid)
            data += key
        return self._page(BRANCH, len(children), heads + data)

    def bucket(self, tree: Bucket) -> int:
        """Write ``tree``'s pages; returns its root page id."""
        elements: list[tuple[bytes, bytes, int]] = []
        for key in sorted(tree.items):
            value = tree.items[key]
            if isinstance(value, Bucket):
                elements.append((key, _BUCKET.pack(self.bucket(value), value.sequence), BUCKET_LEAF))
            else:
                elements.append((key, value, 0))
        room = self.page_size - _PAGE_HEADER.size
        level: list[tuple[bytes, int]] = []
        chunk: list[tuple[bytes, bytes, int]] = []
        used = 0
        for element in elements:
            need = _LEAF.size + len(element[0]) + len(element[1])
            if chunk and used + need > room:
                level.append((chunk[0][0], self._leaf(chunk)))
                chunk, used = [], 0
            chunk.append(element)
            used += need
        if chunk or not level:
            level.append((chunk[0][0] if chunk else b"", self._leaf(chunk)))
        while len(level) > 1:  # branch pages over the leaves, as many levels as it takes
            parents: list[tuple[bytes, int]] = []
            group: list[tuple[bytes, int]] = []
            used = 0
            for child in level:
                need = _BRANCH.size + len(child[0])
                if group and used + need > room:
                    parents.append((group[0][0], self._branch(group)))
                    group, used = [], 0
                group.append(child)
                used += need
            parents.append((group[0][0], self._branch(group)))
            level = parents
        return level[0][1]


def write_tree(path: Path, tree: Bucket, page_size: int = 4096) -> None:
    """``tree`` as a new bbolt file at ``path`` (replacing it atomically): the same data gives the same bytes,
    whatever order the pages of the file it was read from were written in. bbolt opens it as any of its own."""
    writer = _Writer(page_size)
    root = writer.bucket(tree)
    out = bytearray(writer.next * page_size)
    for pgid in (0, 1):  # two meta pages, as bbolt writes them: the newer (txid 1) is the one read
        meta = _META.pack(MAGIC, VERSION, page_size, 0, root, tree.sequence, 2, writer.next, pgid, 0)
        meta = meta[:-8] + struct.pack("<Q", _fnv64a(meta[:-8]))
        out[pgid * page_size : pgid * page_size + _PAGE_HEADER.size + len(meta)] = (
            _PAGE_HEADER.pack(pgid, META_PAGE, 0, 0) + meta
        )
    out[2 * page_size : 2 * page_size + _PAGE_HEADER.size] = _PAGE_HEADER.pack(2, FREELIST_PAGE, 0, 0)
    for pgid, data in writer.pages:
        out[pgid * page_size : pgid * page_size + len(data)] = data
    tmp = path.with_name(path.name + ".rewrite")
    tmp.write_bytes(bytes(out))
    st = path.stat()
    os.chown(tmp, st.st_uid, st.st_gid)
    os.chmod(tmp, stat.S_IMODE(st.st_mode))
    os.replace(tmp, path)


def rewrite(path: Path, epoch: int) -> int:
    """Rewrite the bbolt file ``path`` with its data only, laid out by :class:`_Writer`, its times set to
    ``epoch``; returns how many times were set."""
    bolt = BoltFile(path)
    tree = read_tree(path)
    count = set_times(tree, epoch)
    write_tree(path, tree, bolt.page_size)
    return count


def containerd_images(root: Path, namespace: str = "k8s.io") -> dict[str, str]:
    """The images containerd holds in ``namespace`` of the filesystem at ``root``: name -> the digest it points at
    (none when the filesystem has no containerd metadata)."""
    db = root / CONTAINERD_DB
    if not db.is_file():
        return {}
    bolt = BoltFile(db)
    out = {}
    for key in bolt.bucket("v1", namespace, "images"):
        name = key.decode(errors="replace")
        target = bolt.bucket("v1", namespace, "images", name, "target")
        out[name] = target.get(b"digest", (b"", False))[0].decode(errors="replace")
    return dict(sorted(out.items()))
