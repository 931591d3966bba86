"""Partition tables, loop devices and mounts of a raw disk: read a table, attach a partition, mount it (released by
:mod:`.releasing`), grow the last partition and its filesystem."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from imagebuilder.core.disk.releasing import detach_loop, unmount
from imagebuilder.core.disk.scratch import run_tempdir
from imagebuilder.core.errors import ExternalError
from imagebuilder.core.files import run_checked
from imagebuilder.core.progress import Say

SECTOR = 512

#: unshare(2)'s flag for a mount namespace of one's own
_CLONE_NEWNS = 0x00020000


def private_mounts() -> None:
    """Move this process into a mount namespace of its own, with private propagation, as ``unshare --mount
    --propagation private`` starts a child (the chroot engine's way): from here on the mounts it makes exist
    nowhere else.

    Why: a mount namespace that another program creates on this host meanwhile (``ip netns exec``, a container, a
    service with PrivateTmp) takes a copy of every mount there is, and the copy keeps a filesystem mounted, with a
    journal to replay, after this process unmounted it: an image assembled then is not clean. The namespace is the
    calling thread's and its children's (call it from the thread that mounts); the kernel releases its mounts when
    the process ends, killed or not. Call it after releasing what dead runs left in the host's namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise ExternalError(
            f"cannot make a mount namespace of its own: {os.strerror(err)}",
            hint="run it as root, on a host that allows mount namespaces (unshare --mount)",
        )
    # a namespace copied from a shared "/" (systemd's) would still send its mounts back to the host's
    run_checked("mount", "--make-rprivate", "/")


#: partition types that hold a Linux filesystem (MBR id, GPT type GUID)
LINUX_TYPES = ("83", "0FC63DAF-8483-4772-8E79-3D69D8477DE4")


@dataclass(frozen=True)
class Partition:
    number: int
    start: int  #: first sector
    size: int  #: sectors
    type: str
    bootable: bool

    @property
    def offset(self) -> int:
        return self.start * SECTOR

    @property
    def length(self) -> int:
        return self.size * SECTOR


def partitions(raw: Path) -> tuple[str, list[Partition]]:
    """The partition table of a raw disk: (``dos`` or ``gpt``, partitions)."""
    try:
        table = json.loads(run_checked("sfdisk", "--json", str(raw)))["partitiontable"]
    except ExternalError:
        return "none", []
    parts = [
        Partition(
            number=i + 1,
            start=int(p["start"]),
            size=int(p["size"]),
            type=str(p.get("type", "")).upper(),
            # MBR: the active flag; GPT: the legacy-BIOS-bootable attribute (what gptmbr.bin follows)
            bootable=bool(p.get("bootable", False)) or "LegacyBIOSBootable" in str(p.get("attrs", "")),
        )
        for i, p in enumerate(table.get("partitions", []))
    ]
    return str(table.get("label", "none")), parts


def root_partition(raw: Path) -> Partition:
    """The largest Linux partition (where the root filesystem of our images lives)."""
    _, parts = partitions(raw)
    linux = [p for p in parts if p.type in LINUX_TYPES]
    if not linux:
        raise ExternalError(f"{raw}: no Linux partition in the partition table")
    return max(linux, key=lambda p: p.size)


@contextlib.contextmanager
def loop_device(image: Path, offset: int, size: int, *, read_only: bool = False) -> Iterator[str]:
    """A loop device over ``size`` bytes of ``image`` from ``offset`` (no partition nodes, no udev needed)."""
    args = ["losetup", "--find", "--show", "--offset", str(offset), "--sizelimit", str(size)]
    dev = run_checked(*args, *(["--read-only"] if read_only else []), str(image)).strip()
    try:
        yield dev
    finally:
        detach_loop(dev)


@contextlib.contextmanager
def mounted(source: str, target: Path, *options: str, log: Say | None = None) -> Iterator[Path]:
    """Mount ``source`` at ``target`` for the block; released with :func:`unmount` (never lazily)."""
    target.mkdir(parents=True, exist_ok=True)
    run_checked("mount", *(["-o", ",".join(options)] if options else []), source, str(target))
    try:
        yield target
    except BaseException:
        # the block already failed: release what we can without masking its error
        with contextlib.suppress(ExternalError):
            unmount(target, attempts=3, log=log)
        raise
    unmount(target, log=log)


@contextlib.contextmanager
def mounted_root(raw: Path, *, writable: bool = False) -> Iterator[Path]:
    """The root partition of a raw disk, mounted read-only without replaying its journal; ``writable``: read-write
    (a throwaway copy a caller edits)."""
    part = root_partition(raw)
    with (
        run_tempdir("root") as mnt,
        loop_device(raw, part.offset, part.length, read_only=not writable) as dev,
        mounted(dev, mnt, *(("rw",) if writable else ("ro", "noload"))),
    ):
        yield mnt


def grow_last_partition(raw: Path, size: int, *, log: Say | None = None) -> bool:
    """Make ``raw`` ``size`` bytes and grow its last partition to the end, as Packer's ``disk_size`` and
    cloud-init's growpart do for a VM build. Only a Linux partition that is last on the disk is grown (the
    filesystem afterwards, by :func:`grow_filesystem`); returns whether it was. A disk already this size or larger
    is left as it is."""
    if raw.stat().st_size >= size:
        return False
    with raw.open("r+b") as fh:
        fh.truncate(size)
    label, parts = partitions(raw)
    if label == "gpt":
        # the backup GPT header belongs at the new end of the disk
        run_checked("sfdisk", "--quiet", "--relocate", "gpt-bak-std", str(raw))
    if not parts:
        return False
    last = max(parts, key=lambda p: p.start)
    if last.type not in LINUX_TYPES:
        return False
    if log:
        log(f"growing partition {last.number} to the end of the {size / 2**30:.0f} GiB disk")
    subprocess.run(
        ["sfdisk", "--quiet", "--no-reread", "--no-tell-kernel", "-N", str(last.number), str(raw)],
        input=", +\n", text=True, check=True, capture_output=True,
    )  # fmt: skip
    return True


def ext_superblock(spec: str) -> dict[str, str]:
    """The superblock fields ``dumpe2fs -h`` prints for the ext filesystem at ``spec`` (a device, or
    ``image?offset=N``), by name ("Block count", "Filesystem state", ...). Raises :class:`ExternalError` with
    dumpe2fs's own reason when it cannot read one."""
    proc = subprocess.run(["dumpe2fs", "-h", spec], capture_output=True, text=True, check=False, timeout=120)
    if proc.returncode != 0:
        raise ExternalError(proc.stderr.strip() or f"dumpe2fs exit {proc.returncode}")
    return {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in proc.stdout.splitlines()) if v}


def _ext_geometry(device: str) -> tuple[int, bool] | None:
    """(size in bytes, cleanly unmounted) of the ext filesystem on ``device``, from its superblock."""
    try:
        fields = ext_superblock(device)
        size = int(fields["Block count"]) * int(fields["Block size"])
    except (ExternalError, KeyError, ValueError):
        return None
    return size, fields.get("Filesystem state") == "clean" and "needs_recovery" not in fields.get(
        "Filesystem features", ""
    )


def grow_filesystem(device: str) -> None:
    """Grow the ext4 filesystem on ``device`` to the device's size (checked first, as resize2fs requires).

    A clean filesystem that already fills the device is left alone: an image built on an OS layer (grown when the
    layer was made, and checked with ``e2fsck -fn`` since) would otherwise pay a full check for nothing."""
    geometry = _ext_geometry(device)
    with open(device, "rb") as fh:
        device_size = fh.seek(0, os.SEEK_END)
    if geometry is not None and geometry[1] and device_size - geometry[0] < 1024**2:
        return
    proc = subprocess.run(["e2fsck", "-f", "-p", device], capture_output=True, text=True, check=False)
    if proc.returncode >= 4:  # 1 and 2 mean errors were corrected
        raise ExternalError(f"e2fsck found errors it cannot correct on {device}: {proc.stdout.strip()[-300:]}")
    run_checked("resize2fs", device)
