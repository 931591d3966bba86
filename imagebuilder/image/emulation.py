"""What a guest emulated under TCG boots with: a throwaway copy of the disk that tells the guest what real hardware
(or KVM) would have given it. The image itself is never changed.

Why a copy at all: the waits built into an OS are sized for hardware. Under TCG every instruction of the guest is
translated, udev's work included, and the host's other work takes the cores from the guest's vCPU threads:

- systemd waits 90 s for a device unit (the serial console's ``/dev/ttyAMA0``, the EFI partition by UUID) and then
  fails what needs it. An arm64 guest emulated on a busy 2-core host got its console device after that (seen on
  2026-11-29: no getty, so no login prompt ever). The copy waits 15 minutes: a drop-in for every device unit
  (:data:`DEVICE_DROP_IN`). Not the kernel's ``systemd.default_timeout_start_sec=``: Debian 12's systemd booted with
  it still gave a missing fstab device 1min 30s, and with the drop-in 15min (both measured here).
- an arm64 guest on QEMU's ``-cpu max`` computes pointer authentication codes (the kernel signs and checks return
  addresses in every function) by the architected QARMA algorithm, translated instruction by instruction. QEMU's
  implementation-defined algorithm keeps the feature and is cheap (:data:`CPU_OPTIONS`): the arm64 base booted to
  cloud-init in 130 s instead of 306 (measured here, alone; ``cortex-a72``, which has no such feature, 123 s).
- an amd64 kernel under TCG finds its vCPUs' TSCs unsynchronized (the vCPUs are host threads reading the host's TSC
  at different moments) and falls back to the HPET, an emulated device served under QEMU's global lock; Go
  programs read the clock constantly (:data:`CLOCK`, for the node check, whose guest runs Kubernetes).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, NamedTuple

from imagebuilder.core.arch import Arch
from imagebuilder.core.disk import copy_sparse, mounted_root
from imagebuilder.core.hostinfo import KvmStatus, kvm_status
from imagebuilder.core.safepath import safe_join

#: what an emulated guest's ``-cpu`` model takes, by its machine (the module's docstring says why)
CPU_OPTIONS = {"aarch64": ("pauth-impdef=on",)}
#: the kernel is told its TSCs are synchronized, as real hardware's and KVM's are (amd64)
CLOCK = "tsc=reliable"
#: how long the copy's systemd waits for a device, in seconds
DEVICE_WAIT = 900
#: the drop-in every device unit of the copy takes (a unit type's own drop-in folder: systemd 246 and later)
DEVICE_DROP_IN = "etc/systemd/system/device.d/image-builder-emulated.conf"


def machine_args(machine: Arch, kvm: KvmStatus | None = None) -> tuple[str, ...]:
    """``machine``'s QEMU machine and CPU arguments, with the CPU options that make its emulation cheap when it is
    emulated (:data:`CPU_OPTIONS`); under KVM, as the architecture table states them."""
    args = list(machine.qemu_machine)
    extra = CPU_OPTIONS.get(machine.machine, ())
    if extra and "-cpu" in args[:-1] and emulated(machine, kvm):
        at = args.index("-cpu") + 1
        args[at] = ",".join((args[at], *extra))
    return tuple(args)


def emulated(machine: Arch, kvm: KvmStatus | None = None) -> bool:
    """Whether a guest of ``machine`` runs under TCG here (another architecture always does)."""
    return not machine.native or not (kvm or kvm_status()).usable


Syntax = Literal["grub", "bls", "extlinux"]
#: the words that begin a kernel command line in each boot configuration's syntax (EXTLINUX's are case-blind)
_KEYS: dict[str, tuple[str, ...]] = {"grub": ("linux", "linuxefi", "linux16"), "bls": ("options",),
                                     "extlinux": ("append",)}  # fmt: skip


def vcpus(machine: Arch, kvm: KvmStatus | None = None, *, wanted: int = 2, host_cores: int | None = None) -> int:
    """How many vCPUs a guest gets: ``wanted`` under KVM; emulated, one per two host cores (at least one).

    Why: under TCG each vCPU is a host thread that computes all the time it is given, so a guest's two vCPUs take
    both cores of a 2-core host from everything else (the caller, QEMU's own I/O thread, the other guests); and a
    vCPU that waits for another (a lock, a TLB flush) waits for that thread's next slice on the host. What a
    customization or a boot test runs (cloud-init, Ansible's modules, systemd's start-up) is mostly one thread at
    a time. On a host with cores to spare the guest still gets two."""
    if not emulated(machine, kvm):
        return wanted
    cores = host_cores if host_cores is not None else (os.cpu_count() or 1)
    return max(1, min(wanted, cores // 2))


def with_kernel_parameter(text: str, parameter: str, *, syntax: Syntax = "grub") -> tuple[str, int]:
    """``text`` (a GRUB configuration, a Boot Loader Specification entry or an EXTLINUX configuration) with
    ``parameter`` added to every kernel command line it holds (GRUB's ``linux``/``linuxefi`` lines, a BLS entry's
    ``options``, EXTLINUX's ``APPEND``), and how many lines that was. A line that has it already is left as it is."""
    keys = _KEYS[syntax]
    lines, changed = text.splitlines(keepends=True), 0
    for i, line in enumerate(lines):
        words = line.split()
        first = words[0].lower() if words and syntax == "extlinux" else words[0] if words else ""
        if first in keys and parameter not in words[1:]:
            body = line.rstrip("\r\n")
            lines[i] = f"{body} {parameter}{line[len(body) :]}"
            changed += 1
    return "".join(lines), changed


class Copy(NamedTuple):
    """A throwaway copy of an image for an emulated boot: where it is, and what was done to it (the device wait, and
    :data:`CLOCK` on its kernel lines when it was added), for a finding's detail."""

    path: Path
    detail: str


def patched_copy(raw: Path, work: Path, machine: Arch, *, clock: bool = False) -> Copy:
    """A sparse copy of ``raw`` in ``work`` whose systemd waits :data:`DEVICE_WAIT` seconds for devices, and with
    ``clock`` (amd64) whose kernel command lines (GRUB's, BLS entries' and EXTLINUX's: the copy boots by whichever
    the firmware follows) add :data:`CLOCK`. Every path is taken through the one safe-join: a link in the image never
    leads a write onto the host."""
    copy = work / "emulated.raw"
    copy_sparse(raw, copy)
    clock = clock and machine.name == "amd64"
    patched = 0
    with mounted_root(copy, writable=True) as root:
        drop_in = safe_join(root, DEVICE_DROP_IN, what="the image's systemd folder")
        drop_in.parent.mkdir(parents=True, exist_ok=True)
        drop_in.write_text(
            f"# image-builder: an emulated boot's devices appear late\n[Unit]\nJobRunningTimeoutSec={DEVICE_WAIT}\n"
        )
        drop_in.chmod(0o644)
        configs: list[tuple[str, Syntax]] = [(c, "grub") for c in ("boot/grub/grub.cfg", "boot/grub2/grub.cfg")]
        configs += [(c, "extlinux") for c in ("boot/extlinux/extlinux.conf", "boot/syslinux/syslinux.cfg")]
        entries = safe_join(root, "boot/loader/entries", what="the image's boot entries")
        configs += [(f"boot/loader/entries/{c.name}", "bls") for c in sorted(entries.glob("*.conf"))]
        for name, syntax in configs if clock else ():
            config = safe_join(root, name, what="the image's boot configuration")
            if config.is_file() and not config.is_symlink():
                text, changed = with_kernel_parameter(config.read_text(), CLOCK, syntax=syntax)
                if changed:
                    config.write_text(text)
                    patched += changed
    done = f"systemd waits {DEVICE_WAIT} s for devices"
    if clock and not patched:
        return Copy(copy, f"{done}; no kernel command line found to add {CLOCK} to")
    return Copy(copy, f"{done}{', booted with ' + CLOCK if clock else ''} (emulated under TCG)")
