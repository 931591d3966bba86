"""Where runs make their named folders (memory, then the temp dir) and how such a folder names the run that made it:
what scratch space takes and what the sweep of dead runs looks at."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

from imagebuilder.core.runs import gone

#: where working disks live when they fit in memory: the tmpfs every Linux host mounts there
SHM = Path("/dev/shm")  # noqa: S108 (each run makes a private 0700 directory of its own in it)


#: held while scratch space is counted or swept
LOCK = threading.Lock()


def run_of(name: str) -> int | None:
    """The pid of the run that made a scratch directory (``image-builder-<pid>-s<start>-<random>``) when that run is
    gone, else None (alive, or not such a name)."""
    parts = name.split("-")
    if len(parts) < 4 or parts[0] != "image" or parts[1] != "builder" or not parts[2].isdigit():
        return None
    start = parts[3][1:] if parts[3].startswith("s") and parts[3][1:].isdigit() else None
    return int(parts[2]) if gone(int(parts[2]), start) else None


def shm_device() -> str | None:
    try:
        dev = SHM.stat().st_dev
    except OSError:
        return None
    return f"{os.major(dev)}:{os.minor(dev)}"


def run_roots() -> tuple[Path, ...]:
    """Where runs make their named folders (:func:`scratch_dir`, :func:`run_tempdir`): memory, then the temp dir."""
    return tuple(dict.fromkeys((SHM, Path(tempfile.gettempdir()))))
