"""A filesystem changed to hold a tree (:mod:`imagebuilder.image.fsdelta`): what a reproducible image is, its OS
layer's filesystem with the build's changes. Real e2fsprogs on real filesystems: a base laid out by ``mke2fs -d``
from one tree, changed by debugfs to hold another (removed, added, rewritten, re-linked, retyped files; new owners,
modes, times and extended attributes; names with spaces, quotes and bytes that are not UTF-8), then mounted and
compared with the tree, file by file and byte by byte. Untouched files keep their blocks; the same inputs give the
same bytes; names the script cannot say are refused, and any other name reaches the filesystem exactly."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagebuilder.core import disk
from imagebuilder.core.files import sha256_file
from imagebuilder.image import fsdelta
from imagebuilder.image.reproducible import _debugfs, _e2fs_env, _set_change_times, apply_tree, layer_epoch

EPOCH = 1669852800
SEED = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
BIG = 3 * 1024 * 1024
#: an Ubuntu cloud image's root filesystem's (what reproducible.fs_parameters names to mke2fs)
FEATURES = (
    "none,ext_attr,resize_inode,dir_index,filetype,extent,flex_bg,sparse_super,large_file,huge_file,dir_nlink,"
    "extra_isize,metadata_csum"
)


def _mkfs(tree: Path, dest: Path, size_mib: int = 64) -> Path:
    with dest.open("wb") as fh:
        fh.truncate(size_mib * 1024 * 1024)
    subprocess.run(["mke2fs", "-t", "ext4", "-F", "-q", "-b", "4096", "-I", "256", "-O", FEATURES,
                    "-E", f"hash_seed={SEED},root_owner=0:0", "-d", str(tree), str(dest)], check=True,
                   capture_output=True, env={**os.environ, **_e2fs_env(EPOCH)})  # fmt: skip
    return dest


def _write(path: Path, data: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)


def _base(root: Path) -> None:
    _write(root / "etc/keep", b"unchanged\n")
    _write(root / "etc/same-size", b"AAAA" * 100)
    _write(root / "etc/grow", b"short")
    _write(root / "etc/meta", b"owner, mode and times change")
    _write(root / "usr/bin/big", os.urandom(BIG), 0o755)
    _write(root / "usr/bin/a", b"linked twice")
    os.link(root / "usr/bin/a", root / "usr/bin/b")
    _write(root / "usr/bin/c", b"a group that shrinks")
    os.link(root / "usr/bin/c", root / "usr/bin/d")
    _write(root / "var/lib/gone/deep/file", b"a folder removed with what it holds")
    _write(root / "etc/was-file", b"becomes a folder")
    _write(root / "etc/was-dir/child", b"its folder becomes a symlink")
    _write(root / "sp ace" / 'q"uote', b"a name the script quotes")
    _write(root / os.fsdecode(b"caf\xe9"), b"a name that is not UTF-8")
    os.symlink("keep", root / "etc/link")
    os.symlink("a", root / "etc/relink")
    os.mkfifo(root / "etc/fifo")
    os.mknod(root / "etc/null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    with (root / "var/sparse").open("wb") as fh:
        fh.write(b"head")
        fh.seek(2 * 1024 * 1024)
        fh.write(b"tail")
    os.setxattr(root / "usr/bin/big", "security.capability",
                bytes.fromhex("0100000200200000000000000000000000000000"))  # cap_net_raw+ep, as ping has  # fmt: skip
    os.setxattr(root / "etc/keep", "user.note", b"before")
    os.setxattr(root / "etc/meta", "user.removed", b"x")
    for path in sorted(root.rglob("*"), reverse=True):
        os.utime(path, ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789), follow_symlinks=False)


def _change(root: Path) -> None:
    (root / "etc/same-size").write_bytes(b"BBBB" * 100)
    (root / "etc/grow").write_bytes(b"much longer than before " * 500)
    os.chown(root / "etc/meta", 1000, 1001)
    (root / "etc/meta").chmod(0o4750)
    os.removexattr(root / "etc/meta", "user.removed")
    os.setxattr(root / "etc/meta", "user.added", b"new")
    os.setxattr(root / "etc/keep", "user.note", b"after")
    (root / "usr/bin/d").unlink()
    shutil.rmtree(root / "var/lib/gone")
    (root / "etc/was-file").unlink()
    _write(root / "etc/was-file/inside", b"now a folder")
    shutil.rmtree(root / "etc/was-dir")
    os.symlink("/usr/bin", root / "etc/was-dir")
    (root / "etc/relink").unlink()
    os.symlink("a much longer target than fits in the inode itself, sixty bytes or more", root / "etc/relink")
    _write(root / "new/sub/file", b"added")
    _write(root / "new/one", b"a new group")
    os.link(root / "new/one", root / "new/two")
    os.symlink("sub/file", root / "new/link")
    os.mkfifo(root / "new/fifo")
    for path in sorted(root.rglob("*"), reverse=True):
        if path.lstat().st_mtime_ns > 1_600_000_000_123_456_789:
            os.utime(path, ns=(EPOCH * 10**9, EPOCH * 10**9), follow_symlinks=False)
    os.utime(root / "etc/meta", ns=(1_650_000_000_000_000_005, 1_650_000_000_000_000_005))


def _files(root: Path) -> dict[bytes, tuple[bytes, int]]:
    """Each regular file's bytes and which of the tree's inodes it is (numbered by first path)."""
    numbers: dict[int, int] = {}
    out = {}
    for path, node in sorted(fsdelta.scan(root).items()):
        if node.kind == "f":
            numbers.setdefault(node.ino, len(numbers))
            out[path] = ((root / os.fsdecode(path)).read_bytes(), numbers[node.ino])
    return out


@pytest.fixture
def trees(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    """The base filesystem, its tree, and the changed tree mounted read-only as the engine has it (a bind mount
    remounted read-only: reading it changes no access time)."""
    base, tree = tmp_path / "base", tmp_path / "tree"
    base.mkdir()
    _base(base)
    subprocess.run(["cp", "-a", "--preserve=all", f"{base}/.", str(tree)], check=True)
    _change(tree)
    with disk.mounted(str(tree), tmp_path / "tree-ro", "bind") as view:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
        yield _mkfs(base, tmp_path / "base.ext4"), base, view


def _blocks(image: Path, path: str) -> str:
    return subprocess.run(["debugfs", "-R", f"blocks {path}", str(image)], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


@pytest.mark.root
def test_the_changed_filesystem_holds_the_tree_and_keeps_every_untouched_block(
    trees: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    base_fs, _, tree = trees
    dest = tmp_path / "out" / "root.ext4"
    dest.parent.mkdir()
    notes: list[str] = []
    script = apply_tree(base_fs, tree, dest, epoch=EPOCH, log=notes.append)  # checks the metadata itself
    assert any(n.startswith("checked: the changed filesystem holds the tree's") for n in notes), notes
    assert script.removed >= 6 and script.written >= 10 and script.changed >= 3, script
    with disk.loop_device(dest, 0, dest.stat().st_size, read_only=True) as dev, \
            disk.mounted(dev, tmp_path / "mnt", "ro", "noload") as mnt:  # fmt: skip
        assert _files(mnt) == _files(tree), "every file's bytes, and which files are one inode"
        made = fsdelta.scan(mnt)
    assert made[b"etc/meta"].xattrs == ((b"user.added", b"new"),)
    assert made[b"etc/meta"].mode == 0o4750 and (made[b"etc/meta"].uid, made[b"etc/meta"].gid) == (1000, 1001)
    assert made[b"etc/meta"].mtime_ns == 1_650_000_000_000_000_005
    assert made[b"usr/bin/big"].xattrs[0][0] == b"security.capability"
    assert made[b"etc/null"].kind == "c" and made[b"etc/null"].rdev == os.makedev(1, 3)
    assert made[b"etc/was-dir"].target == b"/usr/bin" and made[b"etc/was-file"].kind == "d"
    assert made[b"usr/bin/c"].nlink == 1 and made[b"new/one"].nlink == 2
    # what no change reached is where the base has it: the same blocks, so the same compressed MiBs
    assert _blocks(dest, "/usr/bin/big") == _blocks(base_fs, "/usr/bin/big") != ""
    fsck = subprocess.run(["e2fsck", "-fn", str(dest)], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout
    # the same base and tree, the same bytes
    again = tmp_path / "again" / "root.ext4"
    again.parent.mkdir()
    apply_tree(base_fs, tree, again, epoch=EPOCH)
    assert sha256_file(again) == sha256_file(dest)
    assert not (dest.parent / "delta").exists(), "the work folder (base mount, attribute values) is removed"


@pytest.mark.root
def test_a_name_with_a_line_break_is_not_put_in_a_script(trees: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, base, _ = trees
    tree = tmp_path / "lines"
    _write(tree / "etc" / "two\nlines", b"x")
    with pytest.raises(fsdelta.Unsupported, match="line break"):
        fsdelta.changes(base, fsdelta.scan(base), tree, fsdelta.scan(tree), epoch=EPOCH, work=tmp_path)


NAMES = st.binary(min_size=1, max_size=60).filter(
    lambda n: b"/" not in n and b"\0" not in n and n not in (b".", b"..", b"lost+found")
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(NAMES, min_size=1, max_size=4, unique=True))
def test_any_name_reaches_the_filesystem_exactly_or_is_refused(tmp_path: Path, names: list[bytes]) -> None:
    """Names are the image's (a package's files, a role's): whatever bytes they are, the script the changes are
    written in creates exactly that name, or is refused (a line break, which no debugfs command can carry)."""
    work = tmp_path / os.urandom(4).hex()
    empty, tree = work / "empty", work / "tree"
    empty.mkdir(parents=True)
    tree.mkdir()
    for n, name in enumerate(names):
        (tree / os.fsdecode(name)).write_bytes(b"content %d" % n)
    if any(b"\n" in n or b"\r" in n for n in names):
        with pytest.raises(fsdelta.Unsupported):
            fsdelta.changes(empty, fsdelta.scan(empty), tree, fsdelta.scan(tree), epoch=EPOCH, work=work)
        return
    script = fsdelta.changes(empty, fsdelta.scan(empty), tree, fsdelta.scan(tree), epoch=EPOCH, work=work)
    image = _mkfs(empty, work / "fs.ext4", size_mib=8)
    _debugfs(image, script.commands, _e2fs_env(EPOCH), lambda _t: None)
    listing = subprocess.run(["debugfs", "-R", "ls -p /", str(image)], capture_output=True, check=True).stdout
    found = {line.split(b"/")[5] for line in listing.splitlines() if line.count(b"/") >= 7}
    assert found - {b".", b"..", b"lost+found"} == set(names)
    for n, name in enumerate(names):
        cat = subprocess.run(["debugfs", "-R", f"cat {os.fsdecode(b'/' + name)}", str(image)], capture_output=True)
        if name.split() == [name] and b'"' not in name:  # -R splits its one command at white space
            assert cat.stdout == b"content %d" % n


@pytest.mark.root
def test_on_a_mounted_copy_of_the_base_only_what_the_build_wrote_is_read_and_changed(tmp_path: Path) -> None:
    """What the engine has: the tree is a copy of the layer's filesystem, mounted and changed by the build. A file
    the build did not write is still the layer's inode with the layer's change time, and is taken as it is; a file
    rewritten in place with its size and times put back is still found (its change time moved); a file only read
    (its access time moved) is not a change."""
    base = tmp_path / "base"
    base.mkdir()
    _base(base)
    base_fs = _mkfs(base, tmp_path / "base.ext4")
    _set_change_times(base_fs, EPOCH, _e2fs_env(EPOCH), lambda _t: None)  # as the layer's are
    untouched = layer_epoch(str(base_fs)) * 10**9
    assert untouched == EPOCH * 10**9, "the layer's time is when its filesystem was made"
    copy = tmp_path / "copy.ext4"
    disk.copy_sparse(base_fs, copy)
    dest = tmp_path / "out" / "root.ext4"
    dest.parent.mkdir()
    with disk.loop_device(copy, 0, copy.stat().st_size) as dev, disk.mounted(dev, tmp_path / "root") as root:
        same = root / "etc/same-size"
        before = same.stat()
        same.write_bytes(b"CCCC" * 100)
        os.utime(same, ns=(before.st_atime_ns, before.st_mtime_ns))
        _write(root / "etc/new", b"new")
        (root / "usr/bin/big").read_bytes()
        os.utime(root / "etc", ns=(EPOCH * 10**9, EPOCH * 10**9))
        with disk.mounted(str(root), tmp_path / "view", "bind") as view:
            subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
            script = apply_tree(base_fs, view, dest, epoch=EPOCH, untouched_ns=untouched)
            wanted = _files(view)
    assert (script.removed, script.written) == (1, 2), script  # etc/same-size again, and etc/new
    assert script.changed == 1, "etc itself (its entries and times); nothing only read"
    with disk.loop_device(dest, 0, dest.stat().st_size, read_only=True) as dev, \
            disk.mounted(dev, tmp_path / "mnt", "ro", "noload") as mnt:  # fmt: skip
        assert _files(mnt) == wanted
        assert (mnt / "etc/same-size").read_bytes() == b"CCCC" * 100
