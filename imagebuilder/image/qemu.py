"""A QEMU guest started by this tool (the boot test, ``image.customize``): one command line, one clean-up.

The guest gets a virtio disk, a virtio NIC on QEMU's user network (the host reaches its SSH through a forwarded
port on 127.0.0.1 only), an optional CD (a NoCloud seed), and its serial console in a file the caller reads.
KVM is used when it works, TCG otherwise (see :func:`hostinfo.kvm_status`). The process is killed when the
``with`` block ends, however it ends.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from imagebuilder.core.arch import Arch, arch
from imagebuilder.core.files import run_checked
from imagebuilder.core.hostinfo import KvmStatus, kvm_status, require_tools
from imagebuilder.image import emulation
from imagebuilder.release.catalog import Firmware


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a forward into the guest)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def seed_iso(files: dict[str, str], work: Path) -> Path:
    """A NoCloud seed (an ISO labelled ``cidata``) of ``files`` (meta-data, user-data...), made in ``work``."""
    folder = work / "seed"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o600)
    iso = work / "seed.iso"
    run_checked("xorriso", "-as", "mkisofs", "-quiet", "-o", str(iso), "-V", "cidata", "-J", "-r", str(folder))
    iso.chmod(0o600)
    return iso


@dataclass
class Guest:
    proc: subprocess.Popen[bytes]
    serial: Path
    accelerator: str
    firmware: Firmware = "bios"
    #: the UEFI firmware's name (OVMF, AAVMF)
    uefi_name: str = "OVMF"
    cpus: int = 1

    @property
    def how(self) -> str:
        """How it boots, for a finding: the firmware, the accelerator and the vCPUs (a UEFI image must boot as UEFI
        machines boot it, and TCG explains a slow boot)."""
        firmware = f"UEFI, {self.uefi_name}" if self.firmware == "efi" else "BIOS"
        return f"{firmware}, {self.accelerator}, {self.cpus} vCPU{'s' if self.cpus > 1 else ''}"

    def console(self, tail: int = 400) -> str:
        text = self.serial.read_text(errors="replace") if self.serial.exists() else ""
        return text[-tail:] if tail else text

    def exited(self) -> str | None:
        """Why the guest is gone (QEMU's exit status and last words), or None while it runs."""
        if self.proc.poll() is None:
            return None
        err = self.proc.stderr.read().decode(errors="replace").strip() if self.proc.stderr else ""
        return f"QEMU exited ({self.proc.returncode}){': ' + err[-300:] if err else ''}"

    def wait(self, timeout: float) -> bool:
        """Wait for the guest to power itself off; False at the timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return True
            time.sleep(1)
        return False


@contextlib.contextmanager
def running(
    disk: Path,
    *,
    serial: Path,
    fmt: str = "raw",
    snapshot: bool = False,
    cdrom: Path | None = None,
    ssh_port: int | None = None,
    memory_mb: int = 1024,
    cpus: int | None = None,
    kvm: KvmStatus | None = None,
    firmware: Firmware = "bios",
    machine: Arch | None = None,
) -> Iterator[Guest]:
    """Start a guest on ``disk`` (``snapshot``: writes go to a throwaway overlay) and stop it after the block;
    ``cpus``: its vCPUs (by default two under KVM, and under TCG one per two host cores: each is a host thread,
    :func:`imagebuilder.image.emulation.vcpus`); ``firmware="efi"``: OVMF in place of SeaBIOS, the guest
    boots by UEFI; ``machine``: the guest's architecture (default amd64; another one is
    emulated by its QEMU under TCG, and boots UEFI: arm64 machines have no BIOS)."""
    machine = machine or arch("amd64")
    if not machine.native:
        kvm = KvmStatus(False, f"emulating {machine.name}")
    if not machine.bios:
        firmware = "efi"
    kvm = kvm or kvm_status()
    cpus = cpus or emulation.vcpus(machine, kvm)
    qemu = require_tools(machine.qemu)[machine.qemu]
    serial.touch()
    pairs = ((ssh_port, 22),) if ssh_port else ()
    netdev = "user,id=n0" + "".join(f",hostfwd=tcp:127.0.0.1:{h}-:{g}" for h, g in pairs)
    cmd = [qemu, *emulation.machine_args(machine, kvm), "-accel", kvm.accelerator, "-m", str(memory_mb),
           "-smp", str(cpus), "-display", "none", "-no-reboot", "-nodefaults", "-serial", f"file:{serial}",
           "-drive", f"file={disk},if=virtio,format={fmt}",
           "-netdev", netdev, "-device", "virtio-net-pci,netdev=n0"]  # fmt: skip
    if firmware == "efi":
        cmd += ["-bios", str(machine.firmware())]
    if snapshot:
        cmd.append("-snapshot")
    if cdrom is not None:
        cmd += ["-drive", f"file={cdrom},media=cdrom,readonly=on"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield Guest(proc, serial, kvm.accelerator, firmware, machine.uefi_name, cpus)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stderr:
            proc.stderr.close()
