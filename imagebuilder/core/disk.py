"""The one disk helper: raw views of images, partition tables, loop devices and mounts.

Why one module: a disk image is attached, mounted and released in three places (``image.base`` assembles one,
``image.verify`` inspects one, the boot checks read one), and the way a mount is released decides whether the image
is safe to ship. An unmount that gives up and detaches lazily leaves the filesystem mounted while the image is
copied, with a journal that the first boot replays over whatever was written to the disk behind the kernel's back
(the boot sector). So a mount is released only for real: whatever still holds it is stopped first, and if it still
cannot be unmounted the operation fails, naming the holders, instead of carrying on.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import PARTIAL_SUFFIXES, partial_owner, run_checked
from imagebuilder.core.progress import Say
from imagebuilder.core.runs import RUN_ENV, gone, run_tag, start_time, stat_fields, tag_owner

SECTOR = 512
_ZERO = bytes(1024 * 1024)
#: partition types that hold a Linux filesystem (MBR id, GPT type GUID)
LINUX_TYPES = ("83", "0FC63DAF-8483-4772-8E79-3D69D8477DE4")


@dataclass(frozen=True)
class GzipMember:
    """Where one member of a gzip file lies: ``offset`` and ``length`` in the file, ``raw_offset`` and
    ``raw_length`` in what it decompresses to."""

    offset: int
    length: int
    raw_offset: int
    raw_length: int


def gunzip_sparse(src: Path, dest: Path) -> list[GzipMember]:
    """Decompress a .gz disk image, seeking over zero MiBs so the raw file stays sparse, and say where each of its
    gzip members lies, found in the same pass (``image.customize`` takes the input's members for the MiBs it leaves
    as they were). Zero bytes after the last member are padding, as gzip has them."""
    members: list[GzipMember] = []
    block = bytearray()  # the MiB being filled, written (or seeked over) when full
    at = start = raw = 0  # bytes of src consumed; where the current member starts, in src and in dest
    inflater: zlib._Decompress | None = None
    buf, ended = b"", False
    try:
        with src.open("rb") as fin, dest.open("wb") as fout:
            while True:
                if not buf:
                    buf = fin.read(len(_ZERO))
                    ended = not buf
                if inflater is None:  # between members: padding, the next member, or the end
                    if ended:
                        break
                    kept = buf.lstrip(b"\0")
                    at += len(buf) - len(kept)
                    buf, start = kept, at
                    if not buf:
                        continue
                    inflater = zlib.decompressobj(31)
                out = inflater.decompress(buf, len(_ZERO) - len(block))
                tail = inflater.unused_data if inflater.eof else inflater.unconsumed_tail
                at, buf = at + len(buf) - len(tail), tail
                block += out
                if len(block) == len(_ZERO):
                    _put_block(fout, block)
                if inflater.eof:
                    end = fout.tell() + len(block)
                    members.append(GzipMember(start, at - start, raw, end - raw))
                    raw, inflater = end, None
                elif ended and not out and not buf:
                    raise EOFError("the file ends inside a member")
            _put_block(fout, block)
            fout.truncate()
    except (zlib.error, EOFError) as exc:
        raise InputError(
            f"not a complete gzip file ({exc})", source=src, expected="a gzip-compressed raw disk"
        ) from None
    return members


def _put_block(fout: IO[bytes], block: bytearray) -> None:
    """Write ``block`` at the file's position, or seek over it when it is all zeros; empty it."""
    if block == _ZERO[: len(block)]:
        fout.seek(len(block), 1)
    else:
        fout.write(block)
    block.clear()


def data_extents(fd: int, size: int) -> list[tuple[int, int]]:
    """(start, end) of the parts of an open file that hold data: a sparse disk's holes are never read. A
    filesystem that cannot say (no SEEK_DATA) gets the whole file as one extent."""
    extents: list[tuple[int, int]] = []
    offset = 0
    try:
        while offset < size:
            try:
                start = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # only a hole is left
                    break
                raise
            offset = os.lseek(fd, start, os.SEEK_HOLE)
            extents.append((start, offset))
    except (OSError, AttributeError):
        return [(0, size)] if size else []
    return extents


def copy_sparse(src: Path, dest: Path) -> None:
    """The raw disk ``src`` copied to ``dest`` extent by extent within the kernel (``copy_file_range``: no trip
    through this process, half the CPU of ``qemu-img convert`` here), its holes left holes. Raises OSError where the
    kernel cannot (two filesystems of different types), for the caller to copy another way."""
    with src.open("rb") as fin, dest.open("wb") as fout:
        size = os.fstat(fin.fileno()).st_size
        for start, end in data_extents(fin.fileno(), size):
            offset = start
            while offset < end:
                copied = os.copy_file_range(fin.fileno(), fout.fileno(), end - offset, offset, offset)
                if copied == 0:
                    raise OSError(errno.EIO, f"{src} ended early")
                offset += copied
        fout.truncate(size)


@contextlib.contextmanager
def raw_view(image: Path, *, work_dir: Path | None = None) -> Iterator[Path]:
    """A raw view of a .gz, .ova, .vmdk, .qcow2 or raw image; temporary copies are removed afterwards.

    A raw image is used in place (read only by the callers); other formats are decompressed or converted into a
    temporary directory (under ``work_dir`` when given: the build's workspace, not /tmp). A temporary copy is never
    flushed to the device (``qemu-img -t unsafe``): it is read back from the page cache and deleted."""
    if not image.is_file():
        raise InputError("image not found", source=image)
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="image-raw-", dir=work_dir) if work_dir else run_tempdir("raw") as tmp:
        work = Path(tmp)
        out = work / "disk.raw"
        if image.name.endswith(".gz"):
            gunzip_sparse(image, out)
            yield out
            return
        if image.name.endswith(".ova"):
            try:
                with tarfile.open(image) as tar:
                    members = tar.getmembers()
                    if not members or not members[0].name.endswith(".ovf"):
                        raise InputError("the OVF descriptor is not the first file of the OVA", source=image)
                    vmdk = next((m for m in members if m.isfile() and m.name.endswith(".vmdk")), None)
                    if vmdk is None:
                        raise InputError("no .vmdk disk in the OVA", source=image)
                    tar.extract(vmdk, work, filter="data")
            except tarfile.TarError as exc:
                raise InputError(f"not a readable OVA (tar): {exc}", source=image) from None
            _qemu_info(work / vmdk.name)  # its disk must not name files outside it (a descriptor's extents)
            run_checked("qemu-img", "convert", "-t", "unsafe", "-O", "raw", str(work / vmdk.name), str(out),
                        timeout=3600)  # fmt: skip
            yield out
            return
        info = _qemu_info(image)
        if info["format"] == "raw":
            yield image
            return
        # in memory when it fits: the e2fsprogs tools that read it flush their file when they close it
        with scratch_dir(work, size=int(str(info.get("virtual-size") or 0))) as where:
            out = where / "disk.raw"
            run_checked("qemu-img", "convert", "-t", "unsafe", "-f", str(info["format"]), "-O", "raw", str(image),
                        str(out), timeout=3600)  # fmt: skip
            yield out


def _qemu_info(image: Path) -> dict[str, object]:
    """What ``qemu-img info`` says of ``image`` (which opens no backing file), refused when reading the image would
    read other files: a backing file, a qcow2 external data file, a VMDK descriptor's extents elsewhere. A disk given
    to the tool must be whole: converting it would copy whatever host file it names into the working copy."""
    try:
        info = json.loads(run_checked("qemu-img", "info", "--output=json", str(image)))
    except ExternalError as exc:
        raise InputError(f"not a disk image qemu-img can read: {exc}", source=image) from None
    if not isinstance(info, dict):
        return {}
    specific = info.get("format-specific")
    data = specific.get("data") if isinstance(specific, dict) else None
    data = data if isinstance(data, dict) else {}
    listed = data.get("extents")
    extents = listed if isinstance(listed, list) else []
    elsewhere = [e.get("filename") for e in extents if isinstance(e, dict) and e.get("filename") != str(image)]
    if info.get("backing-filename") or info.get("full-backing-filename") or data.get("data-file") or elsewhere:
        raise InputError("reads other files (a backing file, an external data file or extents elsewhere); "
                         "they are not read", source=image,
                         expected="a whole image: flatten it first (qemu-img convert -O qcow2 IN OUT)")  # fmt: skip
    return info


def image_format(image: Path) -> str:
    """The format qemu-img reads in ``image`` (raw, qcow2, vmdk...)."""
    return str(_qemu_info(image).get("format"))


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


def detach_backing(image: Path) -> list[str]:
    """Detach every loop device still backed by ``image`` (after the process that attached them died without
    doing so); returns their names."""
    out = subprocess.run(["losetup", "--associated", str(image), "--output", "NAME", "--noheadings", "--list"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    devices = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    for dev in devices:
        detach_loop(dev)
    return devices


def detach_loop(dev: str) -> None:
    """Detach a loop device and wait until the kernel has let it go (detaching is asynchronous)."""
    subprocess.run(["losetup", "-d", dev], check=False, capture_output=True)
    name = Path(dev).name
    for _ in range(50):
        backing = Path(f"/sys/block/{name}/loop/backing_file")
        if not backing.exists():
            return
        time.sleep(0.1)


@dataclass(frozen=True)
class Holder:
    pid: int
    command: str
    why: str  #: root, cwd, open file or mapping

    def __str__(self) -> str:
        return f"{self.pid} ({self.command}: {self.why})"


def holders(mountpoint: Path) -> list[Holder]:
    """Processes that keep ``mountpoint`` busy: their root, working directory, an open file or a mapping in it."""
    mnt = str(mountpoint.resolve())

    def inside(path: str) -> bool:
        return path == mnt or path.startswith(mnt + "/")

    found: list[Holder] = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        proc = Path("/proc") / entry
        why = None
        with contextlib.suppress(OSError):
            for link in ("root", "cwd"):
                if inside(os.readlink(proc / link)):
                    why = link
                    break
            if why is None:
                for fd in os.listdir(proc / "fd"):
                    with contextlib.suppress(OSError):
                        if inside(os.readlink(proc / "fd" / fd)):
                            why = "open file"
                            break
            if why is None:
                for line in (proc / "maps").read_text().splitlines():
                    parts = line.split(maxsplit=5)
                    if len(parts) == 6 and inside(parts[5]):
                        why = "mapping"
                        break
        if why is not None:
            command = ""
            with contextlib.suppress(OSError):
                command = (proc / "comm").read_text().strip()
            found.append(Holder(pid, command, why))
    return found


def stop_holders(mountpoint: Path, *, grace: float = 5.0, log: Say | None = None) -> list[Holder]:
    """Stop every process that holds ``mountpoint``: SIGTERM, then SIGKILL after ``grace`` seconds.

    Package scripts run in a chroot can leave daemons behind (a service started despite policy-rc.d, a helper that
    forked); they keep the filesystem busy. Returns what was found."""
    found = holders(mountpoint)
    if not found:
        return []
    if log:
        log("stopping what still holds " + str(mountpoint) + ": " + ", ".join(str(h) for h in found))
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for h in holders(mountpoint):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(h.pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and holders(mountpoint):
            time.sleep(0.1)
        if not holders(mountpoint):
            break
    return found


def unmount(target: Path, *, attempts: int = 10, log: Say | None = None) -> None:
    """Unmount ``target`` for real: stop its holders, sync, retry; never lazily. Raises when it stays busy."""
    last = ""
    for attempt in range(attempts):
        stop_holders(target, log=log)
        subprocess.run(["sync"], check=False)
        proc = subprocess.run(["umount", str(target)], check=False, capture_output=True, text=True)
        if proc.returncode == 0:
            return
        last = proc.stderr.strip()
        if not os.path.ismount(target):
            return
        time.sleep(min(0.5 * (attempt + 1), 3.0))
    left = ", ".join(str(h) for h in holders(target)) or "no process found (a kernel reference)"
    raise ExternalError(
        f"{target} could not be unmounted ({last}); still held by: {left}",
        hint="stop those processes and rerun; the image was not written",
    )


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
def mounted_root(raw: Path) -> Iterator[Path]:
    """The root partition of a raw disk, mounted read-only without replaying its journal."""
    part = root_partition(raw)
    with (
        run_tempdir("root") as mnt,
        loop_device(raw, part.offset, part.length, read_only=True) as dev,
        mounted(dev, mnt, "ro", "noload"),
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


#: what a chroot gets from the host while it is provisioned: a fresh /proc (its /proc/sys read-only, so nothing in
#: the chroot sets the host's kernel parameters), a read-only /sys, the host's /dev made private (a mount below it
#: does not propagate back to the host's /dev), a new devpts instance, and empty tmpfs /run and /tmp (what
#: package scripts and Ansible leave there is gone when the chroot is released)
CHROOT_MOUNTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("proc", "proc", ("-t", "proc")),
    ("sysfs", "sys", ("-t", "sysfs", "-o", "ro,nosuid,nodev,noexec")),
    ("/dev", "dev", ("--bind",)),
    ("devpts", "dev/pts", ("-t", "devpts", "-o", "newinstance,ptmxmode=0666,mode=0620")),
    ("tmpfs", "run", ("-t", "tmpfs", "-o", "mode=0755,nosuid,nodev")),
    ("tmpfs", "tmp", ("-t", "tmpfs", "-o", "mode=1777,nosuid,nodev")),
)
#: policy-rc.d answering 101: Debian's maintainer scripts start no service in the chroot
POLICY_RC_D = "#!/bin/sh\n# image-builder: no service starts while the image is provisioned in a chroot\nexit 101\n"


@contextlib.contextmanager
def _replaced(path: Path, content: str, perm: int) -> Iterator[None]:
    """``path`` holds ``content`` for the block; afterwards exactly what was there before (a file with its mode, a
    symbolic link with its target, or nothing) is put back."""
    saved: tuple[str, bytes | str, int] | None = None
    if path.is_symlink():
        saved = ("link", os.readlink(path), 0)
    elif path.exists():
        saved = ("file", path.read_bytes(), path.stat().st_mode & 0o7777)
    if saved is not None:
        path.unlink()
    path.write_text(content)
    path.chmod(perm)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        if saved is not None and saved[0] == "link":
            os.symlink(saved[1], path)
        elif saved is not None:
            assert isinstance(saved[1], bytes)
            path.write_bytes(saved[1])
            path.chmod(saved[2])


@contextlib.contextmanager
def chroot_mounts(root: Path, *, log: Say | None = None) -> Iterator[None]:
    """Make ``root`` a place to run an OS's package tools and Ansible in (:data:`CHROOT_MOUNTS`), with the host's
    resolv.conf (for a proxy or mirror by name) and policy-rc.d in place.

    On the way out whatever was started in the chroot is stopped before anything is unmounted, each mount is
    released for real (:func:`unmount`), and resolv.conf and policy-rc.d are exactly what they were."""
    done: list[Path] = []
    resolv = root / "etc" / "resolv.conf"
    host_resolv = Path("/etc/resolv.conf").read_text() if Path("/etc/resolv.conf").is_file() else ""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_replaced(root / "usr" / "sbin" / "policy-rc.d", POLICY_RC_D, 0o755))
        stack.enter_context(_replaced(resolv, host_resolv, 0o644))
        try:
            for source, target, opts in CHROOT_MOUNTS:
                path = root / target
                path.mkdir(parents=True, exist_ok=True)
                run_checked("mount", *opts, source, str(path))
                done.append(path)
                if target == "dev":
                    run_checked("mount", "--make-rprivate", str(path))
                if target == "proc":
                    sysctl = path / "sys"
                    run_checked("mount", "--bind", str(sysctl), str(sysctl))
                    done.append(sysctl)
                    run_checked("mount", "-o", "remount,bind,ro", str(sysctl))
            yield
        finally:
            stop_holders(root, log=log)
            for path in reversed(done):
                unmount(path, log=log)


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` (from /proc/self/mountinfo)."""
    base = os.path.realpath(path)
    return [target for target, _ in _mounts() if target == base or target.startswith(base + "/")]


def remove_tree(path: Path) -> list[str]:
    """Remove ``path`` unless something is still mounted below it (a bound /dev would be the host's own device
    nodes); returns what is still mounted, and then removes nothing."""
    left = mounts_under(path)
    if not left:
        shutil.rmtree(path, ignore_errors=True)
    return left


#: where working disks live when they fit in memory: the tmpfs every Linux host mounts there
SHM = Path("/dev/shm")  # noqa: S108 (each run makes a private 0700 directory of its own in it)
#: memory a working disk in memory leaves free for everything else on the host
SCRATCH_RESERVE = 2 * 1024**3
_scratch_lock = threading.Lock()
_scratch_reserved: dict[Path, int] = {}


def _mem_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _scratch_pid(name: str) -> int | None:
    """The pid of the run that made a scratch directory (``image-builder-<pid>-s<start>-<random>``) when that run is
    gone, else None (alive, or not such a name)."""
    parts = name.split("-")
    if len(parts) < 4 or parts[0] != "image" or parts[1] != "builder" or not parts[2].isdigit():
        return None
    start = parts[3][1:] if parts[3].startswith("s") and parts[3][1:].isdigit() else None
    return int(parts[2]) if gone(int(parts[2]), start) else None


@dataclass(frozen=True)
class Leftover:
    """A resource a run that is gone left behind: what it is, and the pid of that run."""

    kind: str  # "process", "mount", "loop device", "scratch directory", "workspace" or "partial output"
    name: str
    pid: int
    detail: str = ""
    #: a process's own start time: it is killed only while that process still has its pid
    since: str | None = None

    def __str__(self) -> str:
        return f"{self.kind} {self.name}{f' ({self.detail})' if self.detail else ''}, left by run {self.pid}"


def stale_processes() -> list[Leftover]:
    """The processes a run that is gone started (found by :data:`RUN_ENV` in their environment) and that still run:
    a Packer, a QEMU guest or an Ansible that an out-of-memory kill of their run left behind. A live run's children
    are never listed."""
    found: list[Leftover] = []
    me, key = os.getpid(), f"{RUN_ENV}=".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue  # gone meanwhile, or another user's
        tag = next((v[len(key) :] for v in environ.split(b"\0") if v.startswith(key)), None)
        owner = tag_owner(tag.decode("ascii", "replace")) if tag is not None else None
        if owner is None or owner[0] == int(entry.name) or not gone(*owner):
            continue
        since = start_time(int(entry.name))
        if since is not None:
            found.append(Leftover("process", entry.name, owner[0], comm, since))
    return found


def _kill(processes: list[Leftover], *, wait: float = 10.0) -> list[Leftover]:
    """SIGKILL each process that still has the pid and start time it was found with; returns those still there
    after ``wait`` seconds."""
    for item in processes:
        if start_time(int(item.name)) == item.since:
            with contextlib.suppress(OSError):
                os.kill(int(item.name), signal.SIGKILL)
    deadline = time.monotonic() + wait
    alive = processes
    while alive and time.monotonic() < deadline:
        # a killed process is gone, or a zombie its parent has yet to reap (it holds nothing any more)
        alive = [p for p in alive if start_time(int(p.name)) == p.since and not _zombie(int(p.name))]
        if alive:
            time.sleep(0.1)
    return alive


def _zombie(pid: int) -> bool:
    fields = stat_fields(pid)
    return not fields or fields[0] in ("Z", "X")


#: the file in a build workspace that says which run owns it (see :func:`claim`)
RUN_MARKER = ".image-builder-run"


def claim(folder: Path) -> None:
    """Mark ``folder`` (a build workspace) as this run's, so that a later run or ``host.clean`` can tell it was left
    by a run that is gone (killed: no clean-up of its own ran) and release it."""
    folder.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    (folder / RUN_MARKER).write_text(json.dumps({"pid": pid, "start": start_time(pid)}) + "\n")


def unclaim(folder: Path) -> None:
    """Keep ``folder`` for the user (``--keep-on-error``): no sweep removes it after its run."""
    (folder / RUN_MARKER).unlink(missing_ok=True)


def stale_workspaces(root: Path) -> list[Leftover]:
    """The build workspaces under ``root`` whose run is gone (its pid no longer runs, or runs another program
    since); those a user kept (``--keep-on-error``) carry no marker and are left alone."""
    found: list[Leftover] = []
    try:
        entries = sorted(root.iterdir()) if root.is_dir() else []
    except OSError:
        return []
    for folder in entries:
        marker = folder / RUN_MARKER
        if not folder.is_dir() or folder.is_symlink():
            continue
        try:
            owner = json.loads(marker.read_text())
            pid, start = int(owner["pid"]), owner.get("start")
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue
        if gone(pid, start if isinstance(start, str) else None):
            found.append(Leftover("workspace", str(folder), pid))
    return found


#: kernel views no run writes an output into: a search from / does not walk them
_NOT_OUTPUTS = (Path("/proc"), Path("/sys"))


def _partial_names(folder: Path, recursive: bool, unreadable: list[str]) -> list[Path]:
    """The entries of ``folder`` (and below, with ``recursive``) named as partial files are, in name order; every
    folder that could not be read is added to ``unreadable`` and the search goes on past it."""
    found: list[Path] = []

    def partial(name: str) -> bool:  # the glob .*<suffix> of each suffix
        return name.startswith(".") and name.endswith(PARTIAL_SUFFIXES)

    def failed(exc: OSError) -> None:
        unreadable.append(f"{exc.filename or folder}: {exc.strerror or exc}")

    if not recursive:
        try:
            names = os.listdir(folder)
        except OSError as exc:
            failed(exc)
            return []
        return sorted(folder / n for n in names if partial(n))
    for top, dirs, files in os.walk(folder, onerror=failed):
        here = Path(top)
        dirs[:] = [d for d in dirs if here / d not in _NOT_OUTPUTS]
        found += [here / n for n in (*dirs, *files) if partial(n)]
    return sorted(found)


def stale_partials(folder: Path, *, recursive: bool = False, unreadable: list[str] | None = None) -> list[Leftover]:
    """Half-written files in ``folder`` (and its subfolders with ``recursive``: a mirror's tree) that runs killed
    before their rename left: the temporary files and folders named by :func:`imagebuilder.core.files.partial_prefix`
    (an output being written, an OVA being assembled, a download) whose writer no longer runs. Nothing else in the
    folder is looked at. A folder that cannot be read is named in ``unreadable`` (when given), never taken for one
    that holds nothing."""
    found: list[Leftover] = []
    if not folder.is_dir():
        return []
    for entry in _partial_names(folder, recursive, unreadable if unreadable is not None else []):
        pid = partial_owner(entry.name)
        if pid is not None and not entry.is_symlink() and gone(pid, None):
            found.append(Leftover("partial output", str(entry), pid))
    return found


def leftovers(
    *,
    workspaces: Path | None = None,
    outputs: tuple[Path, ...] = (),
    recursive: bool = False,
    unreadable: list[str] | None = None,
) -> list[Leftover]:
    """Everything runs that are gone left (see docs/reliability.md): the processes they started, their
    scratch space in memory with its loop devices, their workspaces under ``workspaces`` and their half-written files
    in ``outputs`` (searched through subfolders with ``recursive``; folders it could not read named in
    ``unreadable``), in the order :func:`release` frees them."""
    found = stale_processes() + stale_scratch()
    if workspaces is not None:
        found += stale_workspaces(workspaces)
    return found + [item for folder in outputs for item in stale_partials(folder, recursive=recursive,
                                                                           unreadable=unreadable)]  # fmt: skip


def _loop_backings() -> list[tuple[str, str, str]]:
    """Every loop device with its backing file as the kernel names it (``... (deleted)`` once it is removed; relative
    to its filesystem's root when the mount it was opened through is gone, as a dead mount namespace's is) and the
    ``major:minor`` of the filesystem that holds it."""
    try:
        out = subprocess.run(["losetup", "--list", "--json", "--output", "NAME,BACK-FILE,BACK-MAJ:MIN"],
                             capture_output=True, text=True, check=False, timeout=30)  # fmt: skip
        devices = json.loads(out.stdout or "{}").get("loopdevices", [])
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return []
    return [(str(d.get("name")), str(d.get("back-file") or ""), str(d.get("back-maj:min") or "").strip())
            for d in devices if isinstance(d, dict)]  # fmt: skip


def _shm_device() -> str | None:
    try:
        dev = SHM.stat().st_dev
    except OSError:
        return None
    return f"{os.major(dev)}:{os.minor(dev)}"


def _run_roots() -> tuple[Path, ...]:
    """Where runs make their named folders (:func:`scratch_dir`, :func:`run_tempdir`): memory, then the temp dir."""
    return tuple(dict.fromkeys((SHM, Path(tempfile.gettempdir()))))


def _mounts() -> list[tuple[str, str]]:
    """Every mount of this namespace as (mount point, source), from /proc/self/mountinfo."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            rest = fields[fields.index("-") + 1 :] if "-" in fields else []
            found.append((fields[4].encode().decode("unicode_escape"), rest[1] if len(rest) > 1 else ""))
    return found


def stale_scratch() -> list[Leftover]:
    """The folders runs that died made on /dev/shm and in the temp dir (``image-builder-<pid>-s<start>-*``: a working
    disk, a decompressed image, a mount point, Packer's temp files, an SSH key) and what still holds them: mounts
    below them, with the loop devices they mount, and loop devices over files in them, found by their backing file
    whether it still exists or was deleted since (a sweep that removed the folder first left them unfindable by the
    folder). A live run's resources are never listed."""
    found: list[Leftover] = []
    roots = [f"{root}/" for root in _run_roots()]
    shm_dev = _shm_device()

    def owner(path: str) -> int | None:
        root = next((r for r in roots if path.startswith(r)), None)
        return _scratch_pid(path[len(root) :].split("/", 1)[0]) if root else None

    for target, source in sorted(_mounts(), key=lambda m: -len(m[0])):  # the deepest first
        pid = owner(target)
        if pid is not None:
            found.append(Leftover("mount", target, pid, source))
    for dev, back, fs in _loop_backings():
        pid = owner(back)
        if pid is None and shm_dev is not None and fs == shm_dev and back.startswith("/"):
            pid = owner(f"{SHM}{back}")  # named from the tmpfs's root: its mount was in a namespace now gone
        if pid is not None:
            found.append(Leftover("loop device", dev, pid, back))
    for root in _run_roots():
        for stale in sorted(root.glob("image-builder-*-*")):
            pid = _scratch_pid(stale.name)
            if pid is None or stale.is_symlink() or not stale.is_dir():
                continue
            if stale.stat().st_uid == os.geteuid():
                found.append(Leftover("scratch directory", str(stale), pid))
    return found


def release(leftovers: list[Leftover]) -> list[Leftover]:
    """Release what the ``stale_*`` functions found: loop devices first (their files are then free), then folders
    and files; returns what could not be released (a loop or a folder still in use)."""
    kept = _kill([item for item in leftovers if item.kind == "process"])  # first: they may hold the rest
    kept += [item for item in leftovers if item.kind == "mount" and not _unmount_dead(item.name, item.detail)]
    loops = [item for item in leftovers if item.kind == "loop device"]
    for item in loops:
        detach_loop(item.name)
    attached = {dev for dev, _, _ in _loop_backings()} if loops else set()
    kept += [item for item in loops if item.name in attached]
    for item in leftovers:
        path = Path(item.name)
        if item.kind in ("loop device", "process", "mount"):
            continue
        if path.is_dir() and not path.is_symlink():
            if not _free(path) or remove_tree(path):
                kept.append(item)
        else:
            path.unlink(missing_ok=True)
    return kept


def _unmount_dead(target: str, source: str) -> bool:
    """Unmount a mount a dead run left, then detach the loop device it mounted (an image mounted for a check, a disk
    being assembled); False when it stays mounted."""
    try:
        unmount(Path(target))
    except ExternalError:
        return False
    if source.startswith("/dev/loop"):
        detach_loop(source)
    return True


def _free(folder: Path) -> bool:
    """Let go of what a dead run still had in ``folder`` (a workspace, a half-made output: image.base assembles its
    disk there): the mounts below it, deepest first, with the loop devices they mount, and the loop devices over files
    in it. False when something stays mounted."""
    sources = dict(_mounts())
    for target in sorted(mounts_under(folder), key=len, reverse=True):  # the deepest first
        if not _unmount_dead(target, sources.get(target, "")):
            return False
    base = os.path.realpath(folder)
    for dev, back, _ in _loop_backings():
        if back.startswith(base + "/"):
            detach_loop(dev)
    return True


def _sweep_scratch() -> None:
    """Release what runs that died left in memory: their scratch directories and the loop devices on them, and the
    processes they started that may still use them."""
    release(stale_processes() + stale_scratch())


_swept = False


def sweep_once() -> None:
    """Release what dead runs left (:func:`stale_processes`, :func:`stale_scratch`), once per run: at the start of
    every task that takes such resources, before it takes its own."""
    global _swept
    with _scratch_lock:
        if not _swept:
            _sweep_scratch()
            _swept = True


@contextlib.contextmanager
def run_tempdir(what: str, *, mode: int = 0o700) -> Iterator[Path]:
    """A private temporary folder named for this run (``image-builder-<pid>-s<start>-<what>-<random>`` in the temp
    dir): whatever a run killed by SIGKILL or the OOM killer leaves in it (a decompressed image, a mount point, an
    SSH key, Packer's files) is found by the next run's :func:`sweep_once` or by ``host.clean`` and released."""
    sweep_once()
    with tempfile.TemporaryDirectory(prefix=f"image-builder-{run_tag()}-{what}-") as tmp:
        os.chmod(tmp, mode)
        yield Path(tmp)


def scratch_fits_in_memory(size: int) -> bool:
    """Whether :func:`scratch_dir` would put a working disk of ``size`` bytes in memory now (a plan's disk need)."""
    try:
        st = os.statvfs(SHM)
        shm_free = st.f_bavail * st.f_frsize
    except OSError:
        return False
    return min(shm_free, _mem_available()) - sum(_scratch_reserved.values()) >= size + SCRATCH_RESERVE


@contextlib.contextmanager
def scratch_dir(fallback: Path, *, size: int, in_memory: bool = True, log: Say | None = None) -> Iterator[Path]:
    """A directory for a build's working disks: a private one in memory (on /dev/shm, removed on the way out) when
    a disk of ``size`` bytes fits there and in the memory the host has free, with :data:`SCRATCH_RESERVE` to
    spare and the other working disks of this process counted at their full size; else ``fallback`` (created; the
    caller removes it with its workspace).

    Why: attaching a loop device makes the kernel write the file's dirty pages to the device first (LOOP_CONFIGURE
    flushes its backing file), so each working copy of a disk written to a disk-backed workspace was written out
    in full before it could be mounted: a second of waiting per build and per image of a matrix, and gigabytes
    written for files that are deleted minutes later. In memory nothing is written and the attach is immediate.
    ``size`` is the disk's full size rather than its data, so a build can never run out of room there."""
    chosen: Path | None = None
    if in_memory and SHM.is_dir():
        with _scratch_lock:
            _sweep_scratch()  # first: what dead runs hold there is memory this run may need
            reserved = sum(_scratch_reserved.values())
            try:
                st = os.statvfs(SHM)
                shm_free = st.f_bavail * st.f_frsize
            except OSError:
                shm_free = 0
            room = min(shm_free, _mem_available()) - reserved
            if room >= size + SCRATCH_RESERVE:
                chosen = Path(tempfile.mkdtemp(prefix=f"image-builder-{run_tag()}-",
                                               dir=SHM))  # fmt: skip
                _scratch_reserved[chosen] = size
            elif log is not None:
                free, kept = max(room, 0) / 2**30, SCRATCH_RESERVE / 2**30
                log(f"working disk on the device: {size / 2**30:.1f} GiB do not fit in memory "
                    f"({free:.1f} GiB free there, {kept:.0f} GiB kept free)")  # fmt: skip
    if chosen is None:
        fallback.mkdir(parents=True, exist_ok=True)
        yield fallback
        return
    if log is not None:
        log(f"working disk in memory ({chosen}): nothing of it is written to the device")
    try:
        yield chosen
    finally:
        try:
            left = remove_tree(chosen)
            if left and log is not None:
                log(f"warning: still mounted, so {chosen} was kept: {', '.join(left)}")
        finally:
            with _scratch_lock:
                _scratch_reserved.pop(chosen, None)
