"""The one safe-join: a name that comes from outside becomes a path that stays inside its destination.

Names arrive from manifests (hook entries, artifact URIs), archives (OVA members), TUF target names and remote
listings. Each of them is somebody else's text and this tool runs as root, so a name is never trusted to stay where
it is put: ``..``, absolute paths, NUL bytes, backslashes taken for separators elsewhere, over-long components and
symbolic links already inside the destination would all write somewhere else. Every caller that turns an outside
name into a path goes through :func:`safe_join`.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from imagebuilder.core.errors import InputError

#: a path component longer than this cannot be created on Linux filesystems
NAME_MAX = 255
#: a whole relative name longer than this is refused (PATH_MAX is 4096 including the destination)
RELATIVE_MAX = 1024


def check_relative(name: str, *, what: str = "name") -> PurePosixPath:
    """The relative POSIX path ``name`` stands for, or :class:`InputError` saying why it cannot be one."""
    problem = None
    if not name:
        problem = "is empty"
    elif "\0" in name:
        problem = "contains a NUL byte"
    elif any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name):
        problem = "contains a control character"
    elif "\\" in name:
        problem = "contains a backslash"
    elif name.startswith("/"):
        problem = "is absolute"
    elif len(name.encode()) > RELATIVE_MAX:
        problem = f"is longer than {RELATIVE_MAX} bytes"
    if problem is None:
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if not parts:
            problem = "names no file"
        elif ".." in parts:
            problem = "climbs out with '..'"
        elif any(len(p.encode()) > NAME_MAX for p in parts):
            problem = f"has a component longer than {NAME_MAX} bytes"
    if problem is not None:
        raise InputError(f"{what} {name[:80]!r} {problem}", expected="a relative path inside the destination")
    return PurePosixPath(*parts)


def safe_join(dest: Path, name: str, *, what: str = "name") -> Path:
    """``dest / name``, guaranteed to lie inside ``dest`` even after following the links that exist today.

    Raises :class:`InputError` (exit 2: the manifest or archive is the input at fault) for any name that would
    leave ``dest``. The destination itself may not exist yet."""
    relative = check_relative(name, what=what)
    base = Path(os.path.realpath(dest))
    target = base.joinpath(*relative.parts)
    # a symbolic link already inside the destination must not lead out of it either
    resolved = Path(os.path.realpath(target))
    if resolved != base and base not in resolved.parents:
        raise InputError(
            f"{what} {name[:80]!r} leads outside {dest} through a symbolic link",
            expected="a relative path inside the destination",
        )
    return target
