"""Scratch space: a private folder per run in the temp dir, and working disks in memory when they fit."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from imagebuilder.core.disk import places
from imagebuilder.core.disk.deadruns import sweep_once, sweep_scratch
from imagebuilder.core.disk.releasing import remove_tree
from imagebuilder.core.progress import Say
from imagebuilder.core.runs import run_tag

#: memory a working disk in memory leaves free for everything else on the host
SCRATCH_RESERVE = 2 * 1024**3


_scratch_reserved: dict[Path, int] = {}


def _mem_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


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
        st = os.statvfs(places.SHM)
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
    if in_memory and places.SHM.is_dir():
        with places.LOCK:
            sweep_scratch()  # first: what dead runs hold there is memory this run may need
            reserved = sum(_scratch_reserved.values())
            try:
                st = os.statvfs(places.SHM)
                shm_free = st.f_bavail * st.f_frsize
            except OSError:
                shm_free = 0
            room = min(shm_free, _mem_available()) - reserved
            if room >= size + SCRATCH_RESERVE:
                chosen = Path(tempfile.mkdtemp(prefix=f"image-builder-{run_tag()}-",
                                               dir=places.SHM))  # fmt: skip
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
            with places.LOCK:
                _scratch_reserved.pop(chosen, None)
