"""The mounts that make a disk's root a place to run an OS's package tools and Ansible in, put back exactly as they
were."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from imagebuilder.core.disk.releasing import stop_holders, unmount
from imagebuilder.core.files import run_checked
from imagebuilder.core.progress import Say

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
