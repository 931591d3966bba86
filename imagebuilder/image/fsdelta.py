"""A filesystem made from another by the changes between two trees, with debugfs (libext2fs, one thread).

Why: ``mke2fs -d`` lays a whole tree out afresh, so one file more early in the walk moves every block after it. The
images of a release share their OS layer (:mod:`imagebuilder.builder.matrix`) and, through it, most of their
compressed bytes (:mod:`imagebuilder.image.gzipdisk`); laid out afresh they share almost none. So an image's root
filesystem is its OS layer's filesystem (itself laid out by ``mke2fs -d``) with the build's own changes applied:
what it removed is removed, what it added or rewrote is written into free blocks, what it only touched gets its
new owner, mode, times or extended attributes. Every block no change reached stays where the layer has it.

libext2fs chooses blocks and inodes from the filesystem's state and the order of the operations alone, and the
operations are made in sorted order from the two trees alone: the same layer and the same tree give the same bytes.
Times are SOURCE_DATE_EPOCH (``E2FSPROGS_FAKE_TIME``) for what is written, and the tree's (already clamped) for
what it records.

A tree this cannot express (a name with a line break, a time past 2038) raises :class:`Unsupported`; the caller
then lays the whole tree out afresh, which is as reproducible and only shares less.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

#: the kinds of file a filesystem holds, by their stat type
_KINDS = {stat.S_IFDIR: "d", stat.S_IFREG: "f", stat.S_IFLNK: "l", stat.S_IFCHR: "c", stat.S_IFBLK: "b",
          stat.S_IFIFO: "p", stat.S_IFSOCK: "s"}  # fmt: skip
_CHUNK = 1 << 20


class Unsupported(Exception):
    """The tree holds something the change script cannot express (the caller lays the tree out afresh)."""


@dataclass(frozen=True)
class Node:
    """One file of a tree: what a filesystem records of it (not its inode number or change time)."""

    kind: str
    mode: int  #: permission bits (with setuid, setgid, sticky)
    uid: int
    gid: int
    mtime_ns: int
    #: not compared: reading a file moves it, and an image's files are read as their modification (what is set)
    atime_ns: int = field(compare=False)
    size: int = 0
    rdev: int = 0
    nlink: int = 1
    ino: int = field(compare=False, default=0)
    ctime_ns: int = field(compare=False, default=0)
    target: bytes = b""  #: a symlink's
    xattrs: tuple[tuple[bytes, bytes], ...] = ()


def _xattrs(path: bytes) -> tuple[tuple[bytes, bytes], ...]:
    try:
        names = sorted(os.listxattr(path, follow_symlinks=False))
        return tuple((n.encode(), os.getxattr(path, n, follow_symlinks=False)) for n in names)
    except OSError:  # a filesystem without extended attributes, or a name that vanished
        return ()


def _node(path: bytes, st: os.stat_result) -> Node:
    kind = _KINDS.get(stat.S_IFMT(st.st_mode), "?")
    return Node(kind=kind, mode=stat.S_IMODE(st.st_mode), uid=st.st_uid, gid=st.st_gid, mtime_ns=st.st_mtime_ns,
                atime_ns=st.st_atime_ns, size=st.st_size if kind in "fl" else 0, rdev=st.st_rdev if kind in "cb" else 0,
                nlink=st.st_nlink if kind == "f" else 1, ino=st.st_ino, ctime_ns=st.st_ctime_ns,
                target=os.readlink(path) if kind == "l" else b"", xattrs=_xattrs(path))  # fmt: skip


def scan(root: Path) -> dict[bytes, Node]:
    """Every file of the filesystem mounted at ``root`` (nothing mounted below it), by its path from ``root``
    (``b""`` is ``root`` itself)."""
    top = os.fsencode(root)
    st = os.lstat(top)
    device = st.st_dev
    nodes = {b"": _node(top, st)}
    stack = [b""]
    while stack:
        rel = stack.pop()
        with os.scandir(top + b"/" + rel if rel else top) as entries:
            for entry in entries:
                path = rel + b"/" + entry.name if rel else entry.name
                est = entry.stat(follow_symlinks=False)
                if est.st_dev != device:
                    continue
                nodes[path] = _node(entry.path, est)
                if stat.S_ISDIR(est.st_mode):
                    stack.append(path)
    return nodes


def _open(path: bytes) -> int:
    """``path`` opened to read without changing its access time (a tree that is not mounted read-only would
    otherwise record this very comparison, and the next one would see other times)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NOATIME)
    except PermissionError:  # O_NOATIME is for the file's owner (or root)
        return os.open(path, os.O_RDONLY)


def _same_bytes(a: bytes, b: bytes) -> bool:
    with open(_open(a), "rb") as fa, open(_open(b), "rb") as fb:
        while True:
            x, y = fa.read(_CHUNK), fb.read(_CHUNK)
            if x != y:
                return False
            if not x:
                return True


def _links(nodes: dict[bytes, Node]) -> dict[int, tuple[bytes, ...]]:
    """The paths of each regular file that has more than one (hard links), by inode number."""
    groups: dict[int, list[bytes]] = {}
    for path, node in nodes.items():
        if node.kind == "f" and node.nlink > 1:
            groups.setdefault(node.ino, []).append(path)
    return {ino: tuple(sorted(paths)) for ino, paths in groups.items()}


def _q(text: bytes) -> bytes:
    """``text`` as one argument of a debugfs command (its parser's quoting: a doubled quote is a quote)."""
    if b"\n" in text or b"\r" in text or b"\0" in text:
        raise Unsupported(f"a name with a line break: {text[:60]!r}")
    return b'"' + text.replace(b'"', b'""') + b'"'


def _abs(path: bytes) -> bytes:
    return b"/" + path


def _times(path: bytes, old: Node | None, new: Node, epoch: int) -> list[bytes]:
    """The commands that set ``path``'s modification time to ``new``'s, and its access time to the same (as
    :func:`imagebuilder.image.reproducible.clamp_times` leaves them), where the inode has other ones: ``old``'s, or a
    new inode's (SOURCE_DATE_EPOCH, no nanoseconds)."""
    out = []
    for name, had in ((b"mtime", old.mtime_ns if old else epoch * 10**9),
                      (b"atime", old.atime_ns if old else epoch * 10**9)):  # fmt: skip
        seconds, rest = divmod(new.mtime_ns, 10**9)
        if not 0 <= seconds < 2**31:
            raise Unsupported(f"/{path[:60]!r}: a time outside 1970-2038")
        if seconds != had // 10**9:
            out.append(b"sif %s %s @%d" % (_q(_abs(path)), name, seconds))
        if rest != had % 10**9:
            out.append(b"sif %s %s_extra %d" % (_q(_abs(path)), name, rest << 2))
    return out


@dataclass
class Script:
    """The debugfs commands that turn the first tree's filesystem into the second's, and the files they read."""

    commands: list[bytes] = field(default_factory=list)
    #: (file in the work folder, bytes): extended attribute values, written before debugfs runs
    values: list[tuple[str, bytes]] = field(default_factory=list)
    removed: int = 0
    written: int = 0
    changed: int = 0


def changes(base_root: Path, base: dict[bytes, Node], root: Path, tree: dict[bytes, Node], *, epoch: int,
            work: Path, untouched_ns: int | None = None) -> Script:  # fmt: skip
    """The commands that make the filesystem of ``base`` (scanned at ``base_root``) hold ``tree`` (scanned at
    ``root``); extended attribute values go to files in ``work``.

    ``untouched_ns``: the change time every inode of the base has, when ``tree`` is a mounted copy of it: a file
    of the tree that is still the base's inode with that change time was not written since (any write sets the
    change time to the clock's), so its bytes are not read and compared."""
    broot, troot = os.fsencode(base_root), os.fsencode(root)
    base_links, tree_links = _links(base), _links(tree)

    def group(nodes: dict[bytes, Node], links: dict[int, tuple[bytes, ...]], path: bytes) -> tuple[bytes, ...]:
        node = nodes[path]
        return links.get(node.ino, (path,)) if node.kind == "f" else (path,)

    same_content: dict[int, bool] = {}

    def kept(path: bytes) -> bool:
        """Whether ``path``'s inode in the base stays (its content and links are the tree's)."""
        old, new = base.get(path), tree.get(path)
        if old is None or new is None or old.kind != new.kind:
            return False
        if new.kind == "l":
            return old.target == new.target
        if new.kind in "cb":
            return old.rdev == new.rdev
        if new.kind != "f":
            return True
        if old.size != new.size or group(base, base_links, path) != group(tree, tree_links, path):
            return False
        if untouched_ns is not None and new.ino == old.ino and new.ctime_ns == old.ctime_ns == untouched_ns:
            return True
        if old.ino not in same_content:
            same_content[old.ino] = _same_bytes(broot + b"/" + path, troot + b"/" + path)
        return same_content[old.ino]

    keep = {p for p in tree if p in base and kept(p)}
    script = Script()
    # 1. what the tree no longer has, or has anew: children before their folders
    gone = sorted((p for p in base if p not in keep), reverse=True)
    for path in gone:
        script.commands.append(b"%s %s" % (b"rmdir" if base[path].kind == "d" else b"rm", _q(_abs(path))))
    script.removed = len(gone)
    # 2. what is new: folders before what they hold; a file's other links after its first
    cwd = None
    made: dict[int, bytes] = {}
    for path in sorted(p for p in tree if p not in keep):
        node = tree[path]
        if node.kind == "s":  # a socket is a running program's; mke2fs -d leaves them out too
            continue
        parent, _, name = path.rpartition(b"/")
        if parent != cwd:
            script.commands.append(b"cd %s" % _q(_abs(parent)))
            cwd = parent
        if node.kind == "d":
            script.commands.append(b"mkdir %s" % _q(name))
        elif node.kind == "f" and node.nlink > 1 and node.ino in made:
            script.commands.append(b"ln %s %s" % (_q(_abs(made[node.ino])), _q(_abs(path))))
            continue  # the inode's fields are set once, through its first path
        elif node.kind == "f":
            made[node.ino] = path
            script.commands.append(b"write %s %s" % (_q(troot + b"/" + path), _q(name)))
        elif node.kind == "l":
            script.commands.append(b"symlink %s %s" % (_q(name), _q(node.target)))
        elif node.kind == "p":
            script.commands.append(b"mknod %s p" % _q(name))
        elif node.kind in "cb":
            kind = node.kind.encode()
            script.commands.append(b"mknod %s %s %d %d" % (_q(name), kind, os.major(node.rdev), os.minor(node.rdev)))
        else:
            raise Unsupported(f"/{path[:60]!r}: a file of an unknown kind")
        script.written += 1
        _fields(script, path, None, node, epoch=epoch, work=work)
    # 3. what stays, with its owner, mode, times or attributes changed
    for path in sorted(keep):
        old, new = base[path], tree[path]
        if old != new:
            script.changed += 1
            _fields(script, path, old, new, epoch=epoch, work=work)
    return script


def _fields(script: Script, path: bytes, old: Node | None, new: Node, *, epoch: int, work: Path) -> None:
    """The commands that give ``path``'s inode ``new``'s fields (all of them for a new inode: ``old`` None)."""
    where = _q(_abs(path))
    add = script.commands.append
    if new.kind != "l" and (old is None or old.mode != new.mode):
        add(b"sif %s mode 0%o" % (where, _MODE_BITS[new.kind] | new.mode))
    if old is None or old.uid != new.uid:
        add(b"sif %s uid %d" % (where, new.uid))
    if old is None or old.gid != new.gid:
        add(b"sif %s gid %d" % (where, new.gid))
    script.commands.extend(_times(path, old, new, epoch))
    if new.kind == "f" and new.nlink > 1 and (old is None or old.nlink != new.nlink):
        add(b"sif %s links_count %d" % (where, new.nlink))
    before = dict(old.xattrs) if old is not None else {}
    after = dict(new.xattrs)
    for name in sorted(before.keys() - after.keys()):
        add(b"ea_rm %s %s" % (where, _q(name)))
    for name, value in sorted(after.items()):
        if before.get(name) != value:
            file = f"xattr-{len(script.values)}"
            script.values.append((file, value))
            add(b"ea_set -f %s %s %s" % (_q(os.fsencode(work / file)), where, _q(name)))
    if old is not None:  # what changed an inode set its change time; a new one has SOURCE_DATE_EPOCH already
        add(b"sif %s ctime @%d" % (where, epoch))
        add(b"sif %s ctime_extra 0" % where)


#: the file-type bits of each kind
_MODE_BITS = {kind: bits for bits, kind in _KINDS.items()}


def differences(a: dict[bytes, Node], b: dict[bytes, Node]) -> Iterable[str]:
    """What differs between two scans, as lines (for a check that the changed filesystem holds the tree)."""
    for path in sorted(a.keys() | b.keys()):
        x, y = a.get(path), b.get(path)
        if x is None or y is None:
            yield f"/{path.decode(errors='replace')}: only in {'the tree' if x is None else 'the filesystem'}"
        elif x != y:
            fields = [f for f in Node.__dataclass_fields__ if f != "ino" and getattr(x, f) != getattr(y, f)]
            yield f"/{path.decode(errors='replace')}: {', '.join(fields)} differ"
