"""Facts about the build host, read from the host itself (no guessing from names).

Used by the preflight and by rendering (the QEMU accelerator). ``/dev/kvm`` can exist and still be unusable
(no permission, nested virtualisation off, a sandbox that forbids the ioctl); only opening it and asking the
kernel for the KVM API version tells.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from imagebuilder.core.runs import boot_id

#: the preflight checks, by name (imagebuilder.host.preflight runs them; here so the CLI can name them cheaply)
CHECKS = ("host-os", "arch", "disk", "cpus", "memory", "tools", "packer", "kvm", "ssh-rsa", "proxy")


def check_skips(names: tuple[str, ...] | list[str]) -> None:
    """``--skip-check`` names must be checks (a typo would silently skip nothing)."""
    from imagebuilder.core.errors import InputError, did_you_mean

    for name in names:
        if name not in CHECKS:
            raise InputError(f"unknown check '{name[:40]}'{did_you_mean(name, CHECKS)}", field="--skip-check",
                             expected=f"one of {', '.join(CHECKS)}")  # fmt: skip


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
#: syslinux prints this banner on the serial port once it runs: the guest got through real and protected mode
_BOOT_MARKER = b"SYSLINUX"


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


def _probe_disk(directory: Path) -> Path | str:
    """A 1.44 MB FAT disk with syslinux, made without root (mtools); a reason string when tools are missing."""
    tools = {t: shutil.which(t) for t in ("mkfs.fat", "mcopy", "syslinux")}
    missing = [t for t, path in tools.items() if path is None]
    if missing:
        return f"cannot build the KVM probe disk: {', '.join(missing)} missing (run ./scripts/setup.sh)"
    disk, cfg = directory / "probe.img", directory / "syslinux.cfg"
    with disk.open("wb") as fh:
        fh.truncate(1440 * 1024)
    cfg.write_text("SERIAL 0 115200\nPROMPT 0\nTIMEOUT 1\nDEFAULT none\nLABEL none\n  LOCALBOOT -1\n")
    for cmd in (
        [str(tools["mkfs.fat"]), "-n", "PROBE", str(disk)],
        [str(tools["mcopy"]), "-i", str(disk), str(cfg), "::syslinux.cfg"],
        [str(tools["syslinux"]), "--install", str(disk)],
    ):
        if subprocess.run(cmd, capture_output=True, timeout=60, check=False).returncode != 0:
            return f"cannot build the KVM probe disk ({Path(cmd[0]).name} failed)"
    return disk


def _kvm_boot_probe(timeout: float) -> str | None:
    """Boot a bootloader under KVM: None when it runs, else why not.

    Creating a VM and even running the BIOS can succeed where real guests fail: nested KVM without
    "unrestricted guest" support has to emulate some real/protected-mode transitions and stops with
    "KVM internal error ... emulation failure" on a bootloader's first interrupt thunk. Only running one tells.
    """
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        return "qemu-system-x86_64 is not installed"
    from imagebuilder.core.disk import run_tempdir  # the probe's only use of it

    with run_tempdir("kvm-probe") as tmp:
        disk = _probe_disk(Path(tmp))
        if isinstance(disk, str):
            return disk
        serial = Path(tmp) / "serial"
        serial.touch()
        cmd = [qemu, "-accel", "kvm", "-m", "64", "-display", "none", "-nodefaults", "-no-reboot",
               "-serial", f"file:{serial}", "-drive", f"file={disk},format=raw,if=floppy"]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        os.set_blocking(proc.stderr.fileno(), False)
        err = b""
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if _BOOT_MARKER in serial.read_bytes():
                    return None
                err += proc.stderr.read() or b""
                if b"internal error" in err or b"emulation failure" in err:
                    return "a guest under KVM stops with 'KVM internal error: emulation failure' (nested KVM)"
                if proc.poll() is not None:
                    text = err.decode(errors="replace").strip()
                    return f"QEMU with -accel kvm exited: {text.splitlines()[-1] if text else proc.returncode}"
                time.sleep(0.05)
            return f"a bootloader under KVM did not start within {timeout:.0f} s"
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stderr.close()


_PROBED: dict[str, str | None] = {}
#: where a probe's answer is kept for the later runs of this boot (a tmpfs: gone at the next boot)
PROBE_CACHE_DIR = Path("/run/image-builder")


def _probe_key(device: str) -> str | None:
    """What a boot probe's answer depends on, as one key: this boot, the device node (its owner and mode, and when
    they or the node last changed: host.prepare changes them, a reloaded kvm module makes a new node), who asks
    (uid and groups) and the QEMU binary. None when any of it cannot be read (then nothing is reused)."""
    qemu = shutil.which("qemu-system-x86_64")
    boot = boot_id()
    try:
        dev, exe = os.stat(device), os.stat(qemu) if qemu else None
    except OSError:
        return None
    if not boot:
        return None
    parts = [boot, device, dev.st_rdev, dev.st_ino, dev.st_mode, dev.st_uid, dev.st_gid, dev.st_ctime_ns,
             os.getuid(), sorted(os.getgroups()), qemu, exe.st_mtime_ns if exe else None]  # fmt: skip
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _cached_probe(device: str, timeout: float) -> str | None:
    """The boot probe's answer, probed once per boot and kept in :data:`PROBE_CACHE_DIR` for the runs after it.

    Why: under nested virtualization the probe takes seconds of kernel time (7 s on the CI machine) before QEMU
    reports the emulation failure, and every build, boot check and node check asks. Root only (the folder is
    root's, in /run); a file that is not root's own and private is ignored, never trusted."""
    key = _probe_key(device) if os.getuid() == 0 else None
    cache = PROBE_CACHE_DIR / "kvm-probe.json"
    if key is not None:
        with contextlib.suppress(OSError, ValueError, TypeError):
            st = cache.lstat()
            if stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o077:
                kept = json.loads(cache.read_text())
                said = kept.get("key") == key and kept.get("reason", False) if isinstance(kept, dict) else False
                if said is None or (isinstance(said, str) and said):
                    return said
    reason = _kvm_boot_probe(timeout)
    if key is not None:
        from imagebuilder.core.files import atomic_write

        with contextlib.suppress(OSError):
            PROBE_CACHE_DIR.mkdir(mode=0o700, exist_ok=True)
            folder = PROBE_CACHE_DIR.lstat()
            if folder.st_uid == 0 and stat.S_ISDIR(folder.st_mode):
                with atomic_write(cache, perm=0o600, sync=False) as fh:
                    json.dump({"key": key, "reason": reason}, fh)
    return reason


def kvm_status(device: str = "/dev/kvm", *, probe: bool = True, timeout: float = 10.0) -> KvmStatus:
    """Whether QEMU can use KVM here. ``probe`` also boots a bootloader under KVM (a second or two)."""
    forced = os.environ.get("IMAGE_BUILDER_ACCEL", "").lower()
    if forced in ("tcg", "kvm"):
        return KvmStatus(forced == "kvm", f"IMAGE_BUILDER_ACCEL={forced}")
    if not os.path.exists(device):
        return KvmStatus(False, f"{device} does not exist (virtualization disabled in the BIOS or the hypervisor)")
    reason = _kvm_ioctls(device)
    if reason is None and probe:
        if device not in _PROBED:  # a boot probe takes seconds; its answer does not change within a boot
            _PROBED[device] = _cached_probe(device, timeout)
        reason = _PROBED[device]
    if reason:
        return KvmStatus(False, reason)
    return KvmStatus(True, f"{device} usable" + (" (a bootloader ran under KVM)" if probe else ""))


def parse_os_release(text: str) -> dict[str, str]:
    """The key/value pairs of an os-release file's text (quotes removed; lines that assign nothing skipped)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip().isidentifier():
            out[key.strip()] = value.strip().strip("'\"")
    return out


def os_release(root: Path = Path("/")) -> dict[str, str]:
    """The key/value pairs of /etc/os-release (empty when missing)."""
    for rel in ("etc/os-release", "usr/lib/os-release"):
        path = root / rel
        if path.is_file():
            return parse_os_release(path.read_text())
    return {}


def machine() -> str:
    return platform.machine()


def tool_search_path() -> str:
    """PATH for the tools a build runs: this Python's bin directory (the venv's ansible) first, then PATH."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])


def require_tools(*tools: str) -> dict[str, str]:
    """The path of each tool (searched as builds search them); every missing one named at once (exit 1)."""
    from imagebuilder.core.errors import ExternalError

    found = {t: shutil.which(t, path=tool_search_path()) for t in tools}
    missing = [t for t, path in found.items() if path is None]
    if missing:
        raise ExternalError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed",
                            hint="run ./scripts/setup.sh")  # fmt: skip
    return {t: str(path) for t, path in found.items()}


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
