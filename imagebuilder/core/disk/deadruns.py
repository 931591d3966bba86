"""What runs that are gone left behind (killed by SIGKILL, the OOM killer, a power cut): the processes they started,
their mounts and loop devices, their scratch folders, workspaces and half-written outputs; found by the run identity
each carries, and released through :mod:`.releasing`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from imagebuilder.core.disk import places
from imagebuilder.core.disk.releasing import detach_loop, mounts, mounts_under, remove_tree, unmount
from imagebuilder.core.errors import ExternalError
from imagebuilder.core.files import PARTIAL_SUFFIXES, partial_owner
from imagebuilder.core.runs import RUN_ENV, gone, start_time, stat_fields, tag_owner


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


def _same_device(path: Path, device: int) -> bool:
    try:
        return os.lstat(path).st_dev == device
    except OSError:
        return False


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
    device = os.stat(folder).st_dev
    for top, dirs, files in os.walk(folder, onerror=failed):
        here = Path(top)
        # one filesystem, as find -xdev: a mount below an output folder (a build's own, a network share) is not its
        dirs[:] = [d for d in dirs if here / d not in _NOT_OUTPUTS and _same_device(here / d, device)]
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


def stale_scratch() -> list[Leftover]:
    """The folders runs that died made on /dev/shm and in the temp dir (``image-builder-<pid>-s<start>-*``: a working
    disk, a decompressed image, a mount point, Packer's temp files, an SSH key) and what still holds them: mounts
    below them, with the loop devices they mount, and loop devices over files in them, found by their backing file
    whether it still exists or was deleted since (a sweep that removed the folder first left them unfindable by the
    folder). A live run's resources are never listed."""
    found: list[Leftover] = []
    roots = [f"{root}/" for root in places.run_roots()]
    shm_dev = places.shm_device()

    def owner(path: str) -> int | None:
        root = next((r for r in roots if path.startswith(r)), None)
        return places.run_of(path[len(root) :].split("/", 1)[0]) if root else None

    for target, source in sorted(mounts(), key=lambda m: -len(m[0])):  # the deepest first
        pid = owner(target)
        if pid is not None:
            found.append(Leftover("mount", target, pid, source))
    for dev, back, fs in _loop_backings():
        pid = owner(back)
        if pid is None and shm_dev is not None and fs == shm_dev and back.startswith("/"):
            pid = owner(f"{places.SHM}{back}")  # named from the tmpfs's root: its mount was in a namespace now gone
        if pid is not None:
            found.append(Leftover("loop device", dev, pid, back))
    for root in places.run_roots():
        for stale in sorted(root.glob("image-builder-*-*")):
            pid = places.run_of(stale.name)
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
    sources = dict(mounts())
    for target in sorted(mounts_under(folder), key=len, reverse=True):  # the deepest first
        if not _unmount_dead(target, sources.get(target, "")):
            return False
    base = os.path.realpath(folder)
    for dev, back, _ in _loop_backings():
        if back.startswith(base + "/"):
            detach_loop(dev)
    return True


def sweep_scratch() -> None:
    """Release what runs that died left in memory: their scratch directories and the loop devices on them, and the
    processes they started that may still use them."""
    release(stale_processes() + stale_scratch())


_swept = False


def sweep_once() -> None:
    """Release what dead runs left (:func:`stale_processes`, :func:`stale_scratch`), once per run: at the start of
    every task that takes such resources, before it takes its own."""
    global _swept
    with places.LOCK:
        if not _swept:
            sweep_scratch()
            _swept = True
