"""All unmounting and detaching, for the live path (a mount or loop a block took) and for what dead runs left: a mount
is released only for real (whatever still holds it stopped first, never lazily), a loop device detached and waited
for."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from imagebuilder.core.errors import ExternalError
from imagebuilder.core.progress import Say


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
    """Detach a loop device and wait until the kernel has let it go: detaching is asynchronous, and a device someone
    still has open (udev's probe of a device just made) is only marked to go when they close it. Up to
    :data:`DETACH_WAIT` seconds: on a loaded host a probe at a low priority took more than the 5 s this once waited
    (a test saw the image's loop device still attached after the tool returned)."""
    subprocess.run(["losetup", "-d", dev], check=False, capture_output=True)
    backing = Path(f"/sys/block/{Path(dev).name}/loop/backing_file")
    deadline = time.monotonic() + DETACH_WAIT
    while backing.exists() and time.monotonic() < deadline:
        time.sleep(0.1)


#: how long :func:`detach_loop` waits for the kernel to let a device go, in seconds
DETACH_WAIT = 60.0


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


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` (from /proc/self/mountinfo)."""
    base = os.path.realpath(path)
    return [target for target, _ in mounts() if target == base or target.startswith(base + "/")]


def remove_tree(path: Path) -> list[str]:
    """Remove ``path`` unless something is still mounted below it (a bound /dev would be the host's own device
    nodes); returns what is still mounted, and then removes nothing."""
    left = mounts_under(path)
    if not left:
        shutil.rmtree(path, ignore_errors=True)
    return left


def mounts() -> list[tuple[str, str]]:
    """Every mount of this namespace as (mount point, source), from /proc/self/mountinfo."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            rest = fields[fields.index("-") + 1 :] if "-" in fields else []
            found.append((fields[4].encode().decode("unicode_escape"), rest[1] if len(rest) > 1 else ""))
    return found
