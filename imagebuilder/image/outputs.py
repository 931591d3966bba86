"""What a build makes of Packer's output: the pieces every provider's packaging step is built from.

Each provider module says which of these its artifact needs (a raw disk compressed, an OVA, a qcow2 placed, a
Packer manifest read); the pieces themselves keep the guarantees every artifact shares: nothing partial at a
final path, the digest computed while writing, and a disk that would not boot refused before it is packaged.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imagebuilder.core.errors import ExternalError
from imagebuilder.core.files import sha256_file
from imagebuilder.core.progress import Say
from imagebuilder.image.bootcheck import check_image
from imagebuilder.image.gzipdisk import Base, MemberStore, Origin, gzip_disk


@dataclass
class Packaged:
    """The artifact a build produced (None for images that live on the platform: AMIs, Nutanix images)."""

    artifact: Path | None = None
    sha256: str | None = None
    size: int | None = None
    #: facts for the build manifest (e.g. Packer's own manifest of a platform image)
    extra: dict[str, Any] = field(default_factory=dict)


def place(src: Path, dest: Path) -> Packaged:
    """Move ``src`` to ``dest`` atomically (copying across filesystems)."""
    digest = sha256_file(src)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.tmp")
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return Packaged(dest, digest, dest.stat().st_size)


#: the member store the compression in this thread shares, and the layer's raw disk the image was copied from:
#: those of the OS layer an image was built on, while the runner packages that image (:func:`sharing`); None
#: elsewhere
_STORE: ContextVar[tuple[MemberStore | None, Base | None]] = ContextVar("member_store", default=(None, None))


@contextlib.contextmanager
def sharing(store: MemberStore | None, base: Base | None = None) -> Iterator[None]:
    """Within this block, :func:`compress` in this thread takes members from ``store`` and adds its own to it,
    comparing the disk with ``base`` (the layer's raw disk it is a copy of) where that is known."""
    token = _STORE.set((store, base))
    try:
        yield
    finally:
        _STORE.reset(token)


def compress(disk: Path, dest: Path, status: Say, *, origin: Origin | None = None) -> Packaged:
    """A raw disk compressed to gzip on every core (:mod:`imagebuilder.image.gzipdisk`), with the percentage done
    reported as it goes; within :func:`sharing`, members are shared with the other images of the same OS layer.
    ``origin``: the .gz the disk was decompressed from before it changed; the MiBs it still holds are its members,
    not compressed again (image.customize). The build manifest gets the member counts."""
    total, done, shown = disk.stat().st_size, 0, -1

    def progress(n: int) -> None:
        nonlocal done, shown
        done += n
        percent = 100 * done // max(total, 1)
        if percent != shown:
            shown = percent
            status(f"compressing {total / 2**30:.1f} GiB (gzip, one member per MiB): {percent} %")

    progress(0)
    store, base = _STORE.get()
    with origin or contextlib.nullcontext():
        result = gzip_disk(disk, dest, store=store, base=base, origin=origin, on_bytes=progress)
    members = {"data": result.data_members, "reused": result.reused}
    return Packaged(dest, result.sha256, result.size, extra={"gzip_members": members})


def require_bootable(disk: Path, what: str, *, work_dir: Path) -> None:
    """Fail the build at once when its output would not boot, instead of after compressing it and a boot test."""
    check = check_image(disk, work_dir=work_dir)
    if not check.ok:
        raise ExternalError(
            f"{what} would not boot: " + "; ".join(check.problems),
            hint="read the build log (did the guest power off cleanly?); rerun with --keep-on-error to inspect it",
        )


def qemu_disk(directory: Path, vm_name: str, status: Say) -> Path:
    """The disk Packer's QEMU builder left in ``directory``/output, checked to boot."""
    disk = directory / "output" / vm_name
    if not disk.is_file() or disk.stat().st_size == 0:
        raise ExternalError(
            f"Packer finished but produced no image at {disk}",
            hint="read the build log; rerun with --keep-on-error to inspect the workspace",
        )
    status("checking the image's boot sectors and filesystem")
    require_bootable(disk, "the built image", work_dir=directory)
    return disk


def exported_disk(directory: Path) -> Path:
    """The disk a platform builder exported into ``directory``/output (vSphere: a VMDK)."""
    disks = sorted((directory / "output").glob("*.vmdk"))
    if not disks:
        raise ExternalError(f"Packer exported no disk into {directory / 'output'}", hint="read the build log")
    return disks[0]


def packer_manifest(path: Path) -> Packaged:
    """A platform image: no local artifact; Packer's manifest (the image's id on the platform) goes to ours."""
    if not path.is_file():
        raise ExternalError(f"Packer wrote no manifest at {path}", hint="read the build log")
    return Packaged(extra={"packer_manifest": json.loads(path.read_text())})
