"""Views of disk images: sparse copies, the member-per-MiB gzip read back sparse, and a raw view of any image format
qemu-img reads (never one that reads other files)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from imagebuilder.core.disk.scratch import run_tempdir, scratch_dir
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import run_checked
from imagebuilder.core.stream import INFLATE_ERRORS, Inflater, inflater, zero_member

_ZERO = bytes(1024 * 1024)


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
    as they were). Zero bytes after the last member are padding, as gzip has them.

    A member-per-MiB disk (as the tool writes its images) holds every zero MiB as the same known member
    (:func:`imagebuilder.core.stream.zero_member`): that member is seeked over without being inflated, most of a
    fresh disk. The others are inflated by ISA-L (:func:`imagebuilder.core.stream.inflater`).
    Measured on a disk of 6 GiB, 2.2 of them data: 32 s of CPU with zlib inflating every member, the zero MiBs about
    half of it; any image.verify, image.diff or test that reads a .gz starts here."""
    members: list[GzipMember] = []
    block = bytearray()  # the MiB being filled, written (or seeked over) when full
    at = start = raw = 0  # bytes of src consumed; where the current member starts, in src and in dest
    inflating: Inflater | None = None
    zero = zero_member(len(_ZERO))
    buf, ended = b"", False
    errors: tuple[type[Exception], ...] = (*INFLATE_ERRORS, EOFError)
    try:
        with src.open("rb") as fin, dest.open("wb") as fout:
            while True:
                if not ended and len(buf) < len(zero):  # a whole zero member to compare at a member's start
                    more = fin.read(len(_ZERO))
                    ended = not more
                    buf += more
                if inflating is None:  # between members: padding, the next member, or the end
                    kept = buf.lstrip(b"\0")
                    at += len(buf) - len(kept)
                    buf, start = kept, at
                    if not buf:
                        if ended:
                            break
                        continue
                    if not block and buf.startswith(zero):  # a zero MiB at a MiB's start: seek over it
                        fout.seek(len(_ZERO), 1)
                        members.append(GzipMember(start, len(zero), raw, len(_ZERO)))
                        at, raw, buf = at + len(zero), raw + len(_ZERO), buf[len(zero) :]
                        continue
                    inflating = inflater()
                out = inflating.decompress(buf, len(_ZERO) - len(block))
                tail = inflating.unused_data if inflating.eof else inflating.unconsumed_tail
                at, buf = at + len(buf) - len(tail), tail
                block += out
                if len(block) == len(_ZERO):
                    _put_block(fout, block)
                if inflating.eof:
                    end = fout.tell() + len(block)
                    members.append(GzipMember(start, at - start, raw, end - raw))
                    raw, inflating = end, None
                elif ended and not out and not buf:
                    raise EOFError("the file ends inside a member")
            _put_block(fout, block)
            fout.truncate()
    except errors as exc:
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


_PUNCH_HOLE, _KEEP_SIZE = 0x02, 0x01  # fallocate(2)'s FALLOC_FL_PUNCH_HOLE and FALLOC_FL_KEEP_SIZE


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
    """The raw disk ``src`` copied to ``dest`` extent by extent, its holes left holes: within the kernel
    (``copy_file_range``: no trip through this process, half the CPU of ``qemu-img convert`` here) where it can, and
    through this process where it cannot (the two on filesystems of different types, as /dev/shm and /tmp can be)."""
    with src.open("rb") as fin, dest.open("wb") as fout:
        size = os.fstat(fin.fileno()).st_size
        in_kernel = True
        for start, end in data_extents(fin.fileno(), size):
            offset = start
            while offset < end:
                if in_kernel:
                    try:
                        copied = os.copy_file_range(fin.fileno(), fout.fileno(), end - offset, offset, offset)
                    except OSError as exc:
                        if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):
                            raise
                        in_kernel = False
                        continue
                else:
                    chunk = os.pread(fin.fileno(), min(end - offset, 4 << 20), offset)
                    copied = os.pwrite(fout.fileno(), chunk, offset) if chunk else 0
                if copied == 0:
                    raise OSError(errno.EIO, f"{src} ended early")
                offset += copied
        fout.truncate(size)


def write_partition(fs_image: Path, raw: Path, offset: int, length: int) -> None:
    """Replace ``length`` bytes of ``raw`` from ``offset`` (a partition) with the file ``fs_image`` of that size:
    the range is made a hole first, then the image's data copied into it within the kernel, so every byte of the
    partition is the image's (its holes read as zeros) and nothing outside it changes."""
    if fs_image.stat().st_size != length:
        raise ValueError(f"{fs_image} is {fs_image.stat().st_size} bytes, the partition {length}")
    with fs_image.open("rb") as fin, raw.open("r+b") as fout:
        try:
            fallocate = ctypes.CDLL(None, use_errno=True).fallocate
            fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long)
            punched = fallocate(fout.fileno(), _PUNCH_HOLE | _KEEP_SIZE, offset, length) == 0
        except (OSError, AttributeError):
            punched = False
        if not punched:  # a filesystem that cannot punch holes: zeros written
            zeros = bytes(1 << 20)
            fout.seek(offset)
            for at in range(0, length, len(zeros)):
                fout.write(zeros[: min(len(zeros), length - at)])
            fout.flush()
        for start, end in data_extents(fin.fileno(), length):
            at = start
            while at < end:
                copied = os.copy_file_range(fin.fileno(), fout.fileno(), end - at, at, offset + at)
                if copied == 0:
                    raise OSError(errno.EIO, f"{fs_image} ended early")
                at += copied
        os.fsync(fout.fileno())


def read_partition(raw: Path, offset: int, length: int, dest: Path) -> None:
    """The ``length`` bytes of ``raw`` from ``offset`` (a partition) as the file ``dest``, copied within the kernel,
    its holes left holes: what :func:`write_partition` writes back."""
    with raw.open("rb") as fin, dest.open("wb") as fout:
        fout.truncate(length)
        size = os.fstat(fin.fileno()).st_size
        for start, end in data_extents(fin.fileno(), size):
            start, end = max(start, offset), min(end, offset + length)
            at = start
            while at < end:
                copied = os.copy_file_range(fin.fileno(), fout.fileno(), end - at, at, at - offset)
                if copied == 0:
                    raise OSError(errno.EIO, f"{raw} ended early")
                at += copied


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
