"""What a build makes of Packer's output: the pieces every provider's packaging step is built from.

Each provider module says which of these its artifact needs (a raw disk compressed, an OVA, a qcow2 placed, a
Packer manifest read); the pieces themselves keep the guarantees every artifact shares: nothing partial at a
final path, the digest computed while writing, and a disk that would not boot refused before it is packaged.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imagebuilder.bootcheck import check_image
from imagebuilder.errors import ExternalError
from imagebuilder.files import atomic_write, sha256_file
from imagebuilder.hostinfo import require_tools
from imagebuilder.progress import Advance, Say

CHUNK = 4 * 1024 * 1024


@dataclass
class Packaged:
    """The artifact a build produced (None for images that live on the platform: AMIs, Nutanix images)."""

    artifact: Path | None = None
    sha256: str | None = None
    size: int | None = None
    #: facts for the build manifest (e.g. Packer's own manifest of a platform image)
    extra: dict[str, Any] = field(default_factory=dict)


def gzip_parallel(src: Path, dest: Path, *, on_bytes: Advance | None = None) -> tuple[str, int]:
    """Compress ``src`` to ``dest`` with pigz on every core; returns (sha256, size) of the .gz.

    The compressed stream is hashed as it is written, so the result is read once; it lands at ``dest`` only
    when complete.
    """
    pigz = require_tools("pigz")["pigz"]
    digest, size = hashlib.sha256(), 0
    with atomic_write(dest, "wb") as out:
        proc = subprocess.Popen(
            [pigz, "-c", "-p", str(os.cpu_count() or 1), str(src)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert proc.stdout is not None
        read_so_far = 0
        while block := proc.stdout.read(CHUNK):
            out.write(block)
            digest.update(block)
            size += len(block)
            if on_bytes is not None:
                done = _bytes_read(proc.pid, src)
                if done is not None and done > read_so_far:
                    on_bytes(done - read_so_far)
                    read_so_far = done
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.wait() != 0:
            raise ExternalError(f"pigz failed compressing {src}: {err.strip()}")
        if on_bytes is not None:
            on_bytes(max(0, src.stat().st_size - read_so_far))
    return digest.hexdigest(), size


def _bytes_read(pid: int, path: Path) -> int | None:
    """How far a process has read ``path`` (from /proc/PID/fdinfo), for the progress bar."""
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines():
                    if line.startswith("pos:"):
                        return int(line.split()[1])
    except OSError:
        return None
    return None


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


def compress(disk: Path, dest: Path, status: Say) -> Packaged:
    """A raw disk compressed with pigz, with the percentage done reported as it goes."""
    total, done = disk.stat().st_size, 0

    def progress(n: int) -> None:
        nonlocal done
        done += n
        status(f"compressing {total / 2**30:.1f} GiB with pigz: {100 * done // max(total, 1)} %")

    progress(0)
    sha, size = gzip_parallel(disk, dest, on_bytes=progress)
    return Packaged(dest, sha, size)


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
