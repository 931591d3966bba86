"""Reproducible images: two chroot builds of the same inputs give the same bytes (issue 45).

Why it takes more than running the same playbook twice: a filesystem written by the kernel carries the run in
every byte it chose. The block allocator places files by timing (delayed allocation, per-CPU groups), every inode
gets a change time no program can set and a random generation, the journal keeps commit times, and the superblock
the mount times; inside the files, containerd's metadata carries the import's clock and its garbage collector's
timing. So the engine does not keep the filesystem it provisioned. Once the image is sealed it:

1. normalizes the tree (:func:`normalize_tree`): containerd's bbolt databases written again from their data alone
   (:func:`imagebuilder.image.boltdb.rewrite`: stale pages, the order of the import's transactions and bbolt's own
   page order, which follows Go's map order, leave nothing) with their times set to SOURCE_DATE_EPOCH; run-specific
   files removed (containerd's instance UUID, random seeds, the ldconfig auxiliary cache); every file's modification
   and access time clamped to SOURCE_DATE_EPOCH, as Debian's reproducible-builds work does;
2. makes a new root filesystem of the tree (:func:`make_filesystem`) with ``mke2fs -d``, which adds files in
   sorted order from the tree alone: the source filesystem's UUID (the boot loader and fstab name it), features,
   block and inode sizes, inode count, label, reserved blocks and journal size; a hash seed from the inputs
   digest; ``E2FSPROGS_FAKE_TIME`` = SOURCE_DATE_EPOCH for every time e2fsprogs writes; no host ``mke2fs.conf``.
   Change times (which ``mke2fs -d`` copies from the tree) are then set with debugfs. That is done for the OS
   layer (the build's OS part, a phase of its own, clamped to :func:`layer_epoch`); the image's filesystem is the
   layer's with the build's changes applied (:func:`apply_tree`, :mod:`imagebuilder.image.fsdelta`), so that every
   block the image's own part did not reach stays where the layer has it (the images of a release share them);
3. where the source partition boots by EXTLINUX, points the installed ``ldlinux.sys`` and the partition's boot
   sector at where mke2fs put the file (:func:`patch_ldlinux`, what ``extlinux --install`` records, done without
   mounting: a mount leaves the kernel's block choices in the filesystem); the journal is added last by tune2fs
   (zeroed, at a fixed place);
4. writes the filesystem into the partition (:func:`imagebuilder.core.disk.write_partition`); the partition table
   and the other partitions are the source image's, unchanged by a build.

SOURCE_DATE_EPOCH (:func:`source_date_epoch`) is the user's ``SOURCE_DATE_EPOCH`` when set, else the release
manifest's date; the provenance records it, so a rebuild uses the same one.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import os
import stat
import struct
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from imagebuilder.core import disk, grammar
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import run_checked
from imagebuilder.core.hostinfo import tool_search_path
from imagebuilder.core.progress import Say, silent
from imagebuilder.core.untrusted import printable
from imagebuilder.image import fsdelta
from imagebuilder.image.boltdb import rewrite
from imagebuilder.image.bootcheck import EXT_PATCH_AREA, LDLINUX_MAGIC, PATCH_AREA, SECTOR_EXTENT

#: what the regeneration runs on the build host (the chroot engine's check and its dry run require them)
TOOLS = ("mke2fs", "debugfs", "tune2fs", "dumpe2fs", "e2fsck")
#: containerd's bbolt files: its metadata, and its snapshotters' storage
BOLT_FILES = (
    "var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db",
    "var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/metadata.db",
    "var/lib/containerd/io.containerd.snapshotter.v1.native/metadata.db",
)
#: files whose bytes are the run's (random or its clock) and that the system makes again when missing
RUN_FILES = (
    "var/lib/containerd/io.containerd.grpc.v1.introspection/uuid",  # containerd's instance UUID (random)
    "var/lib/systemd/random-seed",
    "var/cache/ldconfig/aux-cache",
    "var/cache/debconf/config.dat-old",
    "var/cache/debconf/templates.dat-old",
    "var/lib/dpkg/status-old",
    "var/lib/dpkg/diversions-old",
    "etc/ld.so.cache~",
    # apt's binary caches record the times its sources had when it made them (apt makes them again when missing)
    "var/cache/apt/pkgcache.bin",
    "var/cache/apt/srcpkgcache.bin",
)
#: the features a filesystem has only while in use, or that the journal step adds back
_TRANSIENT = {"needs_recovery", "has_journal"}
SECTOR = 512
#: the inode flag extlinux sets on ldlinux.sys (a file the boot sector points into must not move)
IMMUTABLE = 0x10
#: where extlinux installers put ldlinux.sys (as :mod:`imagebuilder.image.bootcheck` looks for it)
EXTLINUX_DIRS = ("boot/extlinux", "boot/syslinux", "extlinux", "syslinux", "boot", "")


#: SOURCE_DATE_EPOCH of the build whose outputs this thread packages (:func:`dated`); None elsewhere
_EPOCH: ContextVar[int | None] = ContextVar("source_date_epoch", default=None)


@contextmanager
def dated(epoch: int | None) -> Iterator[None]:
    """Within this block, what this thread packages (an OVA's members) carries ``epoch`` as its time."""
    token = _EPOCH.set(epoch)
    try:
        yield
    finally:
        _EPOCH.reset(token)


def source_date() -> int | None:
    """The SOURCE_DATE_EPOCH of the build being packaged (:func:`dated`), or None."""
    return _EPOCH.get()


def source_date_epoch(release_date: str | None, fallback: int) -> int:
    """SOURCE_DATE_EPOCH: the environment's (reproducible-builds.org's convention), else the release's date, else
    ``fallback`` (the build's start: the provenance records it, and a rebuild sets it in the environment)."""
    given = os.environ.get("SOURCE_DATE_EPOCH", "")
    if given:
        try:
            return grammar.integer(given, 0, 2**32 - 1)
        except ValueError:
            raise InputError(f"'{printable(given, 40)}' is not a time", field="SOURCE_DATE_EPOCH",
                             expected="seconds since 1970 (an integer)") from None  # fmt: skip
    if not release_date:
        return fallback
    try:
        when = dt.datetime.fromisoformat(release_date.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(f"'{release_date[:40]}' is not a date", field="status.date",
                         expected="an RFC 3339 time, e.g. 2024-05-01T00:00:00Z") from None  # fmt: skip
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0, int(when.timestamp()))


def hash_seed(content_digest: str) -> str:
    """The directory-hash seed of the new filesystem: a UUID made from the build's content digest."""
    return str(uuid.UUID(bytes=hashlib.sha256(b"image-builder hash seed\0" + content_digest.encode()).digest()[:16]))


def _run(*args: str, env: dict[str, str] | None = None, log: Say = silent) -> str:
    log("$ " + " ".join(args))
    return run_checked(*args, env={**os.environ, "PATH": tool_search_path(), **(env or {})}, timeout=3600)


def _e2fs_env(epoch: int) -> dict[str, str]:
    # no host mke2fs.conf: the features are the source's, named one by one; every time e2fsprogs writes is epoch
    return {"MKE2FS_CONFIG": "/dev/null", "E2FSPROGS_FAKE_TIME": str(epoch), "LC_ALL": "C", "TZ": "UTC"}


def normalize_tree(root: Path, epoch: int, *, log: Say = silent, untouched_ns: int | None = None) -> None:
    """Make the provisioned tree at ``root`` free of the run's bytes (step 1 of the module docstring). ``root`` is
    the image's root filesystem mounted read-write, nothing mounted below it that is not the image's.
    ``untouched_ns``: the change time of what the build started from (its OS layer's), whose times stay."""
    for rel in RUN_FILES:
        path = root / rel
        if path.is_file() and not path.is_symlink():
            path.unlink()
    _truncate_logs(root / "var" / "log")
    for rel in BOLT_FILES:
        db = root / rel
        if db.is_file() and not db.is_symlink():
            log(f"{rel}: rewritten with its data only, {rewrite(db, epoch)} times set to SOURCE_DATE_EPOCH")
    clamp_times(root, epoch, untouched_ns=untouched_ns)


def _truncate_logs(folder: Path) -> None:
    """Every log emptied, as image-builder's sysprep does: each line a package manager or a service wrote during the
    build starts with the time it was written (apt's history, dpkg's log, wtmp), which no other run repeats."""
    if not folder.is_dir() or folder.is_symlink():
        return
    device = folder.stat().st_dev
    for path, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(path, d))]
        for name in files:
            st = os.lstat(os.path.join(path, name))
            if stat.S_ISREG(st.st_mode) and st.st_dev == device and st.st_size:
                os.truncate(os.path.join(path, name), 0)


def clamp_times(root: Path, epoch: int, *, untouched_ns: int | None = None) -> None:
    """Every file's modification time at most ``epoch``, and its access time equal to it (symlinks themselves
    too); ``root``'s filesystem only. A file whose change time is ``untouched_ns`` is the OS layer's, not written
    by this build: it keeps the layer's times (clamped to the layer's own epoch when the layer was made)."""
    device = root.stat().st_dev
    stack = [root]
    while stack:
        folder = stack.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                if st.st_dev != device:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    stack.append(Path(entry.path))
                if st.st_ctime_ns == untouched_ns:
                    continue
                when = min(st.st_mtime_ns, epoch * 10**9)
                # an immutable file (extlinux's ldlinux.sys) keeps its times: the source image's
                with contextlib.suppress(PermissionError):
                    os.utime(entry.path, ns=(when, when), follow_symlinks=False)
        st = folder.stat()
        if st.st_ctime_ns == untouched_ns:
            continue
        # a folder's own times last: writing its entries' times does not change them, but be exact
        when = min(st.st_mtime_ns, epoch * 10**9)
        os.utime(folder, ns=(when, when), follow_symlinks=False)


def fs_parameters(device: str) -> tuple[list[str], int | None]:
    """The mke2fs arguments that make a filesystem like the one on ``device`` (UUID, label, features, sizes), and
    its journal's size in MiB (None: it has none), from one read of its superblock."""
    sb = disk.ext_superblock(device)
    try:
        features = [f for f in sb["Filesystem features"].split() if f not in _TRANSIENT]
        blocks, block_size = int(sb["Block count"]), int(sb["Block size"])
        reserved = int(sb.get("Reserved block count", "0"))
        args = [
            "-t", "ext4", "-F", "-q",
            "-U", sb["Filesystem UUID"],
            "-b", str(block_size),
            "-I", sb.get("Inode size", "256"),
            "-N", sb["Inode count"],
            "-m", f"{100 * reserved / blocks:.4f}",
            "-O", ",".join(["none", *features]),
        ]  # fmt: skip
    except (KeyError, ValueError) as exc:
        raise ExternalError(f"cannot read the root filesystem's parameters ({exc})", hint="is it ext4?") from None
    label = sb.get("Filesystem volume name", "<none>")
    if label and label != "<none>":
        args += ["-L", label]
    return args, _journal_mib(sb)


def _journal_mib(sb: dict[str, str]) -> int | None:
    if "has_journal" not in sb.get("Filesystem features", "").split():
        return None
    size = sb.get("Journal size", "")
    number, _, unit = size.partition(" ") if " " in size else (size.rstrip("MKG"), "", size[-1:])
    try:
        value = float(number)
    except ValueError:
        return 64
    unit = unit.strip().upper()[:1] or "M"
    return max(4, int(value / 1024 if unit == "K" else value * 1024 if unit == "G" else value))


def _extlinux_dir(tree: Path) -> str | None:
    return next((d for d in EXTLINUX_DIRS if (tree / d / "ldlinux.sys").is_file()), None)


def make_filesystem(
    tree: Path,
    dest: Path,
    *,
    size: int,
    like: str,
    epoch: int,
    seed: str,
    vbr: bytes | None,
    log: Say = silent,
) -> None:
    """A new ext4 filesystem of ``tree`` at ``dest`` (``size`` bytes), made like the one on the device ``like``
    (steps 2 and 3 of the module docstring). ``vbr``: the source partition's EXTLINUX boot sector, when it boots
    that way."""
    env = _e2fs_env(epoch)
    params, journal = fs_parameters(like)
    with dest.open("wb") as fh:
        fh.truncate(size)
    _run("mke2fs", *params, "-E", f"hash_seed={seed},lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0",
         "-d", str(tree), str(dest), env=env, log=log)  # fmt: skip
    _set_change_times(dest, epoch, env, log)
    if vbr is not None:
        ldlinux = _extlinux_dir(tree)
        if ldlinux is None:
            raise ExternalError("the source image boots by EXTLINUX but the built tree has no ldlinux.sys",
                                hint="did a role remove /boot/extlinux?")  # fmt: skip
        place_extlinux(dest, "/" + f"{ldlinux}/ldlinux.sys".lstrip("/"), vbr, env, log)
    if journal is not None:
        _run("tune2fs", "-J", f"size={journal}", str(dest), env=env, log=log)
    _fsck(dest, env)


def _extents(sectors: list[int]) -> list[tuple[int, int]]:
    """The (first sector, count) runs the EXTLINUX boot code loads ``sectors`` by, as its installer forms them:
    consecutive sectors in one run while it stays under 64 KiB and within one 64 KiB segment of the load address
    (the loader lands at 0x8000, one sector after another)."""
    runs: list[tuple[int, int]] = []
    address = 0x8000
    base = address
    for sector in sectors:
        if runs:
            first, count = runs[-1]
            size = (count + 1) * SECTOR
            if sector == first + count and size < 65536 and (address ^ (base + size - 1)) & 0xFFFF0000 == 0:
                runs[-1] = (first, count + 1)
                address += SECTOR
                continue
        base = address
        runs.append((sector, 1))
        address += SECTOR
    return runs


def patch_ldlinux(ld: bytearray, vbr: bytearray, sectors: list[int]) -> None:
    """Point ``ld`` (an installed ldlinux.sys) and the boot sector ``vbr`` at ``sectors``, where the file now lies
    (partition-relative, in file order): what ``extlinux --install`` writes after it has placed the file, done
    without mounting the filesystem (a mount would leave the kernel's choices in it). The loader's size fields,
    directory and ADV contents are the installed file's; the sector runs, the ADV pointers, the boot sector's
    pointer to the first sector and the checksum are made again. :mod:`imagebuilder.image.bootcheck` checks the
    result as it checks any EXTLINUX disk."""
    at = bytes(ld).find(struct.pack("<I", LDLINUX_MAGIC), 0, 1024)
    if at < 0:
        raise ExternalError("ldlinux.sys has no patch area: not an EXTLINUX loader", hint="rebuild the base image")
    _, _, data_sectors, adv_sectors, dwords, _, _, epa = PATCH_AREA.unpack_from(ld, at)
    adv_ptr, _, _, _, _, secptr, secptrcnt, p0, p1, _ = EXT_PATCH_AREA.unpack_from(ld, epa)
    total = data_sectors + adv_sectors
    if adv_sectors != 2 or len(sectors) < total or dwords * 4 > len(ld) or max(p0, p1) + 4 > 510:
        raise ExternalError("ldlinux.sys's patch area does not fit the file", hint="rebuild the base image")
    struct.pack_into("<I", vbr, p0, sectors[0] & 0xFFFFFFFF)
    struct.pack_into("<I", vbr, p1, sectors[0] >> 32)
    runs = _extents(sectors[1:data_sectors])
    if len(runs) > secptrcnt:
        raise ExternalError(f"ldlinux.sys lies in {len(runs)} runs; the loader holds {secptrcnt}",
                            hint="a filesystem this fragmented cannot boot by EXTLINUX")  # fmt: skip
    ld[secptr : secptr + SECTOR_EXTENT.size * secptrcnt] = bytes(SECTOR_EXTENT.size * secptrcnt)
    for n, (first, count) in enumerate(runs):
        SECTOR_EXTENT.pack_into(ld, secptr + SECTOR_EXTENT.size * n, first, count)
    struct.pack_into("<QQ", ld, adv_ptr, sectors[data_sectors], sectors[data_sectors + 1])
    struct.pack_into("<I", ld, at + 16, 0)
    checksum = LDLINUX_MAGIC
    for (word,) in struct.iter_unpack("<I", bytes(ld[: dwords * 4])):
        checksum = (checksum - word) & 0xFFFFFFFF
    struct.pack_into("<I", ld, at + 16, checksum)


def place_extlinux(image: Path, path: str, vbr: bytes, env: dict[str, str], log: Say) -> None:
    """Make the filesystem ``image`` boot by EXTLINUX again: ldlinux.sys at ``path`` patched where mke2fs put it,
    the boot sector written before the superblock, the file immutable as extlinux leaves it."""
    block_size = int(disk.ext_superblock(str(image))["Block size"])
    per_block = block_size // SECTOR
    blocks = [int(b) for b in _run("debugfs", "-R", f"blocks {path}", str(image), env=env).split()]
    stat_text = _run("debugfs", "-R", f"stat {path}", str(image), env=env)
    size = int(stat_text.split("Size: ")[1].split()[0])
    flags = int(stat_text.split("Flags: ")[1].split()[0], 16)
    sectors = [b * per_block + i for b in blocks for i in range(per_block)][: -(-size // SECTOR)]
    with image.open("r+b") as fh:
        ld = bytearray()
        for block in blocks:
            fh.seek(block * block_size)
            ld += fh.read(block_size)
        ld = ld[:size]
        boot = bytearray(vbr)
        patch_ldlinux(ld, boot, sectors)
        for n, sector in enumerate(sectors):
            fh.seek(sector * SECTOR)
            fh.write(ld[n * SECTOR : (n + 1) * SECTOR])
        fh.seek(0)
        fh.write(boot)
    _debugfs(image, [f"sif {path} flags {flags | IMMUTABLE:#x}"], env, log)
    log(f"{path}: EXTLINUX patched for sectors {sectors[0]}.. ({len(sectors)}), boot sector written")


def _debugfs(image: Path, commands: Sequence[str | bytes], env: dict[str, str], log: Say) -> None:
    script = image.with_name(image.name + ".debugfs")
    # bytes: a name in the image is any bytes but a slash and NUL
    script.write_bytes(b"".join((c.encode() if isinstance(c, str) else c) + b"\n" for c in commands))
    try:
        log(f"$ debugfs -w -f {script} {image} ({len(commands)} commands)")
        proc = subprocess.run(["debugfs", "-w", "-f", str(script), str(image)], capture_output=True,
                              env={**os.environ, "PATH": tool_search_path(), **env}, check=False)  # fmt: skip
        stderr = proc.stderr.decode(errors="replace")
        errors = [ln for ln in stderr.splitlines() if ln and not ln.startswith("debugfs ")]
        if proc.returncode != 0 or errors:
            raise ExternalError(f"debugfs could not change the new root filesystem: {'; '.join(errors[:3])}",
                                hint="read the build log")  # fmt: skip
    finally:
        script.unlink(missing_ok=True)


def _set_change_times(image: Path, epoch: int, env: dict[str, str], log: Say) -> None:
    """Every used inode's change time = ``epoch`` (``mke2fs -d`` copies the tree's, which only the kernel sets).

    mke2fs numbers the inodes it makes one after another from the first non-reserved one, so the used inodes are
    1 to the count in use plus the free reserved ones: checked against the superblock before anything is set."""
    sb = disk.ext_superblock(str(image))
    total, free = int(sb["Inode count"]), int(sb["Free inodes"])
    first = int(sb.get("First inode", "11"))
    used = total - free
    last = used + first - 11  # inodes 1..10 are reserved and counted as used, 11 is lost+found
    probe = _run("debugfs", "-R", f"ffi {first}", str(image), env=env)
    free_from = int(probe.split()[-1]) if probe.split() and probe.split()[-1].isdigit() else -1
    if free_from != last + 1:
        raise ExternalError(f"the new filesystem's inodes are not 1..{last} (first free: {free_from})",
                            hint="mke2fs numbered them otherwise; report this with the build log")  # fmt: skip
    commands = [f"sif <{ino}> ctime @{epoch}" for ino in range(2, last + 1) if ino == 2 or ino >= first]
    _debugfs(image, commands, env, log)


def layer_epoch(device: str) -> int:
    """The time an OS layer's files are clamped to: when the source image's root filesystem was made (its
    superblock's ``s_mkfs_time``). A layer is shared by the images of every channel, whose SOURCE_DATE_EPOCHs
    differ, so its own is a fact of what it is made of; each image then clamps again to its own."""
    with open(device, "rb") as fh:
        fh.seek(1024)
        sb = fh.read(1024)
    made: int = struct.unpack_from("<I", sb, 0x108)[0]
    written: int = struct.unpack_from("<I", sb, 0x30)[0]
    return made or written


def _check(tree: dict[bytes, fsdelta.Node], image: Path, mnt: Path, log: Say) -> None:
    """The changed filesystem holds the tree: every file, its kind, owner, mode, times, size, target and attributes
    (a socket aside: no filesystem image keeps one)."""
    with disk.loop_device(image, 0, image.stat().st_size, read_only=True) as dev, \
            disk.mounted(dev, mnt, "ro", "noload"):  # fmt: skip
        made = fsdelta.scan(mnt)
    wanted = {p: n for p, n in tree.items() if n.kind != "s"}
    wrong = list(fsdelta.differences(wanted, made))
    if wrong:
        raise ExternalError(f"the changed root filesystem does not hold the built tree: {'; '.join(wrong[:5])}",
                            hint="report this with the build log; it names the first differences")  # fmt: skip
    log(f"checked: the changed filesystem holds the tree's {len(made)} files")


def apply_tree(base_fs: Path, tree: Path, dest: Path, *, epoch: int, log: Say = silent,
               untouched_ns: int | None = None) -> fsdelta.Script:  # fmt: skip
    """``dest``: the filesystem ``base_fs`` changed to hold ``tree`` (:mod:`imagebuilder.image.fsdelta`; a file
    whose change time is ``untouched_ns`` is taken as the base's without reading it); raises
    :class:`~imagebuilder.image.fsdelta.Unsupported` for a tree the changes cannot express."""
    env = _e2fs_env(epoch)
    started = time.monotonic()
    work = dest.parent / "delta"
    work.mkdir(parents=True, exist_ok=True)
    try:
        with disk.loop_device(base_fs, 0, base_fs.stat().st_size, read_only=True) as dev, \
                disk.mounted(dev, work / "base", "ro", "noload") as base_root:  # fmt: skip
            base, wanted = fsdelta.scan(base_root), fsdelta.scan(tree)
            script = fsdelta.changes(base_root, base, tree, wanted, epoch=epoch, work=work, untouched_ns=untouched_ns)
            log(f"compared the trees in {time.monotonic() - started:.1f} s")
            disk.copy_sparse(base_fs, dest)
            for name, value in script.values:
                (work / name).write_bytes(value)
            _debugfs(dest, script.commands, env, log)
            log(f"applied the changes at {time.monotonic() - started:.1f} s")
        _fsck(dest, env)
        _check(wanted, dest, work / "check", log)
    finally:
        disk.remove_tree(work)
    log(f"the layer's filesystem changed: {script.removed} removed, {script.written} written, "
        f"{script.changed} changed in place, in {time.monotonic() - started:.1f} s; every other block where the layer "
        "has it")  # fmt: skip
    return script


def _fsck(image: Path, env: dict[str, str]) -> None:
    check = subprocess.run(["e2fsck", "-fn", str(image)], capture_output=True, text=True, check=False,
                           env={**os.environ, "PATH": tool_search_path(), **env})  # fmt: skip
    if check.returncode != 0:
        raise ExternalError(f"the rebuilt root filesystem is not clean: {check.stdout[-400:]}",
                            hint="rerun with --keep-on-error and read the build log")  # fmt: skip


def rebuild_root(raw: Path, part: disk.Partition, root: Path, device: str, work: Path, *, epoch: int, seed: str,
                 base: Path | None = None, log: Say = silent) -> Path:  # fmt: skip
    """Steps 1 to 3 for the root filesystem mounted at ``root`` from ``device`` (partition ``part`` of ``raw``):
    returns the new filesystem's file (in ``work``), to be written into the partition once ``root`` is unmounted.
    With ``base`` (the filesystem the build started from, an OS layer's), the new filesystem is ``base`` with the
    build's changes (:func:`apply_tree`) instead of the tree laid out afresh."""
    with raw.open("rb") as fh:
        fh.seek(part.offset)
        vbr = fh.read(512)
    boots_extlinux = vbr[3:11] in (b"SYSLINUX", b"EXTLINUX")
    # what the layer holds has its change time (layer_epoch, set by _set_change_times) until the build writes it
    untouched = layer_epoch(str(base)) * 10**9 if base is not None else None
    normalize_tree(root, epoch, log=log, untouched_ns=untouched)
    tree = work / "tree"
    tree.mkdir(parents=True, exist_ok=True)
    dest = work / "root.ext4"
    # the root filesystem alone: a bind mount that is not recursive shows none of the mounts below it (the ESP)
    with disk.mounted(str(root), tree, "bind", log=log):
        _run("mount", "-o", "remount,bind,ro", str(tree), log=log)
        if base is not None:
            try:
                apply_tree(base, tree, dest, epoch=epoch, log=log, untouched_ns=untouched)
                return dest
            except fsdelta.Unsupported as exc:
                log(f"laying the whole tree out afresh: {exc}")
                dest.unlink(missing_ok=True)
                clamp_times(root, epoch)  # the layer's files too: mke2fs -d copies every time the tree has
        make_filesystem(tree, dest, size=part.length, like=device, epoch=epoch, seed=seed,
                        vbr=vbr if boots_extlinux else None, log=log)  # fmt: skip
    return dest
