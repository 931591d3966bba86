"""A read-only reader of bbolt files, enough to list the images containerd holds in an image at rest.

Why: ``image.verify`` checks an image mounted read-only, where no containerd can run, yet a node fails first on a
preloaded image under the wrong name. containerd keeps its metadata in one bbolt file
(``/var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db``: buckets ``v1`` / namespace / ``images`` / name);
this reads that file as bbolt lays it out (go.etcd.io/bbolt: page.go, bucket.go, db.go) and never writes.

A file that is not bbolt, or whose pages lead outside it, is an :class:`ExternalError` naming the file.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
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
        self.page_size, self.root = max(metas)[1:]

    def _meta(self, index: int) -> tuple[int, int, int] | None:
        """(txid, page size, root bucket page) of meta page ``index``, or None when it is not a valid one."""
        size = 4096 if index == 0 else self._meta_page_size()
        start = index * size + _PAGE_HEADER.size
        if size <= 0 or start + _META.size > len(self.data):
            return None
        fields = _META.unpack_from(self.data, start)
        magic, _, page_size, _, root, _, _, _, txid, checksum = fields
        if magic != MAGIC or _fnv64a(self.data[start : start + _META.size - 8]) != checksum:
            return None
        return txid, page_size, root

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
