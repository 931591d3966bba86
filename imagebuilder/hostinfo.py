"""Facts about the build host, read from the host itself (no guessing from names).

Used by the preflight and by rendering (the QEMU accelerator). ``/dev/kvm`` can exist and still be unusable
(no permission, nested virtualisation off, a sandbox that forbids the ioctl); only opening it and asking the
kernel for the KVM API version tells.
"""

from __future__ import annotations

import errno
import fcntl
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

KVM_GET_API_VERSION = 0xAE00
KVM_API_VERSION = 12


@dataclass(frozen=True)
class KvmStatus:
    usable: bool
    reason: str

    @property
    def accelerator(self) -> str:
        """The QEMU accelerator to use: kvm when usable, else TCG (software emulation, much slower)."""
        return "kvm" if self.usable else "tcg"


KVM_CREATE_VM = 0xAE01
KVM_CREATE_VCPU = 0xAE41
#: what SeaBIOS prints on its debug port when POST has finished
_POST_DONE = (b"No bootable device", b"Booting from")


def _kvm_ioctls(device: str) -> str | None:
    """None when the kernel lets us create a VM and a vCPU, else why not."""
    try:
        fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):
            return f"{device} is not accessible to this user ({exc.strerror}); add the user to group kvm"
        return f"{device} cannot be opened ({exc.strerror})"
    fds = [fd]
    try:
        version = fcntl.ioctl(fd, KVM_GET_API_VERSION)
        if version != KVM_API_VERSION:
            return f"{device} reports KVM API {version}, expected {KVM_API_VERSION}"
        vm = fcntl.ioctl(fd, KVM_CREATE_VM, 0)
        fds.append(vm)
        fds.append(fcntl.ioctl(vm, KVM_CREATE_VCPU, 0))
    except OSError as exc:
        return f"{device} refuses to create a virtual machine ({exc.strerror}); nested virtualization may be off"
    finally:
        for f in fds:
            os.close(f)
    return None


def _kvm_firmware_probe(timeout: float) -> str | None:
    """Boot QEMU's firmware under KVM and wait for the end of POST: None when it gets there, else why not."""
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        return "qemu-system-x86_64 is not installed"
    with tempfile.TemporaryDirectory(prefix="kvm-probe-") as tmp:
        log = Path(tmp) / "debugcon"
        log.touch()
        cmd = [qemu, "-accel", "kvm", "-m", "32", "-display", "none", "-nodefaults", "-no-reboot",
               "-debugcon", f"file:{log}", "-global", "isa-debugcon.iobase=0x402"]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if any(marker in log.read_bytes() for marker in _POST_DONE):
                    return None
                if proc.poll() is not None:
                    err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace").strip()
                    return f"QEMU with -accel kvm exited: {err.splitlines()[-1] if err else proc.returncode}"
                time.sleep(0.05)
            return f"a VM under KVM did not finish its firmware start within {timeout:.0f} s"
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stderr:
                proc.stderr.close()


def kvm_status(device: str = "/dev/kvm", *, probe: bool = True, timeout: float = 10.0) -> KvmStatus:
    """Whether QEMU can use KVM here. ``probe`` also boots the firmware under KVM (about a second)."""
    forced = os.environ.get("IMAGE_BUILDER_ACCEL", "").lower()
    if forced in ("tcg", "kvm"):
        return KvmStatus(forced == "kvm", f"IMAGE_BUILDER_ACCEL={forced}")
    if not os.path.exists(device):
        return KvmStatus(False, f"{device} does not exist (virtualization disabled in the BIOS or the hypervisor)")
    reason = _kvm_ioctls(device) or (_kvm_firmware_probe(timeout) if probe else None)
    if reason:
        return KvmStatus(False, reason)
    return KvmStatus(True, f"{device} usable" + (" (a VM booted its firmware under KVM)" if probe else ""))


def os_release(root: Path = Path("/")) -> dict[str, str]:
    """The key/value pairs of /etc/os-release (empty when missing)."""
    for rel in ("etc/os-release", "usr/lib/os-release"):
        path = root / rel
        if path.is_file():
            out = {}
            for line in path.read_text().splitlines():
                key, sep, value = line.partition("=")
                if sep:
                    out[key.strip()] = value.strip().strip('"')
            return out
    return {}


def machine() -> str:
    return platform.machine()


def tool_search_path() -> str:
    """PATH for the tools a build runs: this Python's bin directory (the venv's ansible) first, then PATH."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])


def tool_version(tool: str, args: tuple[str, ...] = ("--version",)) -> str | None:
    """First line of ``tool --version``, or None when the tool is not installed."""
    path = shutil.which(tool, path=tool_search_path())
    if path is None:
        return None
    if not args:
        return path
    try:
        proc = subprocess.run([path, *args], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (proc.stdout or proc.stderr).strip()
    return text.splitlines()[0] if text else ""
