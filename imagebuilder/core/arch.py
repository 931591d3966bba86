"""What differs between the architectures a node image is built for (issue 46), in one table.

Every layer asks here instead of spelling ``amd64`` or ``x86_64`` itself: the Debian and Kubernetes name, the
kernel package, GRUB's EFI target and the removable-media loader name UEFI firmware looks for, the serial console
QEMU's machine gives the guest, the QEMU system emulator and its UEFI firmware, the ELF machine of the binaries, and
how this host runs the architecture's programs (natively, or through qemu-user-static registered with binfmt_misc:
a chroot into an arm64 root on an amd64 host runs every program of it emulated).
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from imagebuilder.core.errors import ExternalError, InputError

#: where the kernel exposes binfmt_misc's handlers (mounted by ./scripts/setup.sh where it is not)
BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")


@dataclass(frozen=True)
class Arch:
    """One architecture's facts."""

    #: as Kubernetes, Debian and the release manifests name it
    name: str
    #: as ``uname -m`` and ELF tools name it
    machine: str
    #: ELF header ``e_machine``
    elf_machine: int
    #: Debian's kernel package
    kernel_package: str
    #: GRUB's EFI platform (``grub-mkimage -O``) and the Debian package of its modules
    grub_target: str
    grub_package: str
    #: the loader at the removable-media path, which UEFI firmware boots without an NVRAM entry
    efi_loader: str
    #: whether the image also boots by legacy BIOS (SYSLINUX's extlinux); arm64 machines boot UEFI only
    bios: bool
    #: the serial console of QEMU's machine for it (the boot test reads it)
    console: str
    #: QEMU's system emulator, and the machine and CPU it gives the guest
    qemu: str
    qemu_machine: tuple[str, ...]
    #: QEMU's UEFI firmware image (``-bios``: where Debian's package puts it), its name and its package
    uefi: tuple[str, ...]
    uefi_name: str
    firmware_package: str
    #: the binfmt_misc handler qemu-user-static registers for it (runs its programs on another host)
    binfmt: str

    @property
    def native(self) -> bool:
        """This host runs its programs without emulation."""
        return platform.machine() in (self.machine, self.name)

    def emulation_problem(self) -> str | None:
        """Why this host cannot run the architecture's programs (a chroot into its root), or None. A foreign
        architecture needs qemu-user-static's handler registered with the F flag: the kernel then opens the
        emulator once, so it runs inside a chroot that does not have it."""
        if self.native:
            return None
        handler = BINFMT_DIR / self.binfmt
        if not (BINFMT_DIR / "register").exists():
            return f"binfmt_misc is not mounted ({BINFMT_DIR}): {self.name} programs cannot run on this host"
        try:
            text = handler.read_text()
        except OSError:
            return f"no binfmt_misc handler {self.binfmt}: {self.name} programs cannot run on this host"
        lines = text.splitlines()
        if "enabled" not in lines:
            return f"the binfmt_misc handler {self.binfmt} is disabled"
        flags = next((ln.split(None, 1)[1] for ln in lines if ln.startswith("flags:") and " " in ln), "")
        if "F" not in flags:
            return f"the binfmt_misc handler {self.binfmt} lacks the F flag: it cannot run inside a chroot"
        return None

    def require_emulation(self) -> None:
        """Exit 1 naming the package and the setup step when :meth:`emulation_problem` finds one."""
        problem = self.emulation_problem()
        if problem:
            hint = (f"run ./scripts/setup.sh (it installs qemu-user-static and registers {self.binfmt} with"
                    f" binfmt_misc, from /usr/lib/binfmt.d/{self.binfmt}.conf)")  # fmt: skip
            raise ExternalError(problem, hint=hint)

    def firmware(self) -> Path:
        """QEMU's UEFI firmware for it; exit 1 naming the package when missing."""
        found = next((Path(p) for p in self.uefi if Path(p).is_file()), None)
        if found is None:
            raise ExternalError(f"{self.uefi_name} (UEFI firmware for QEMU) is not installed: looked for "
                                + ", ".join(self.uefi), hint=f"run ./scripts/setup.sh (Debian package"
                                f" {self.firmware_package})")  # fmt: skip
        return found


ARCHES: dict[str, Arch] = {
    "amd64": Arch(
        name="amd64", machine="x86_64", elf_machine=62, kernel_package="linux-image-amd64",
        grub_target="x86_64-efi", grub_package="grub-efi-amd64-bin", efi_loader="EFI/BOOT/BOOTX64.EFI", bios=True,
        console="ttyS0", qemu="qemu-system-x86_64", qemu_machine=(),
        uefi=("/usr/share/ovmf/OVMF.fd", "/usr/share/qemu/OVMF.fd"), uefi_name="OVMF", firmware_package="ovmf",
        binfmt="qemu-x86_64",
    ),
    "arm64": Arch(
        name="arm64", machine="aarch64", elf_machine=183, kernel_package="linux-image-arm64",
        grub_target="arm64-efi", grub_package="grub-efi-arm64-bin", efi_loader="EFI/BOOT/BOOTAA64.EFI", bios=False,
        console="ttyAMA0", qemu="qemu-system-aarch64", qemu_machine=("-machine", "virt", "-cpu", "max"),
        uefi=("/usr/share/qemu-efi-aarch64/QEMU_EFI.fd",), uefi_name="AAVMF", firmware_package="qemu-efi-aarch64",
        binfmt="qemu-aarch64",
    ),
}  # fmt: skip


#: the architectures a node image is built for, as Kubernetes and Debian name them (issue 46); the first is the
#: default. The one home of the names, their synonyms and their checks (issue 61).
ARCH_NAMES = tuple(ARCHES)
#: what people also call them (uname -m, RPM, Docker's platform variants): refused, with the name to use
ARCH_SYNONYMS = {"x86_64": "amd64", "x86-64": "amd64", "x64": "amd64", "aarch64": "arm64", "arm64v8": "arm64",
                 "armv8": "arm64"}  # fmt: skip
#: every architecture Kubernetes publishes binaries for, built here or not: a release manifest's artifacts are sorted
#: by these (an artifact that names another architecture is not this one's)
PUBLISHED_ARCHES = ("amd64", "arm64", "arm", "386", "ppc64le", "s390x")


def check_arch(value: str, flag: str = "--arch") -> str:
    """``value`` if it is one of :data:`ARCH_NAMES`, else an error naming the one meant."""
    from imagebuilder.core.errors import did_you_mean

    if value in ARCH_NAMES:
        return value
    meant = ARCH_SYNONYMS.get(value.lower())
    hint = f"; did you mean '{meant}'?" if meant else did_you_mean(value.lower(), ARCH_NAMES)
    raise InputError(f"{value[:40]!r} is not an architecture this tool builds{hint}", field=flag,
                     expected=" or ".join(ARCH_NAMES))  # fmt: skip


def check_arches(values: list[str], flag: str = "--arch") -> tuple[str, ...]:
    """Each of ``values`` checked by :func:`check_arch`; none given means the default (amd64)."""
    return tuple(check_arch(v, flag) for v in values) or (ARCH_NAMES[0],)


def arch(name: str) -> Arch:
    """The facts of ``name`` (a value the caller has checked: :func:`check_arch`)."""
    return ARCHES[name]


def recorded(plan: Mapping[str, object], source: object) -> Arch:
    """The architecture a build manifest's ``plan`` records (one written before issue 46 records none: amd64); exit 2
    naming ``source`` for another value."""
    name = plan.get("arch") or "amd64"
    if not isinstance(name, str) or name not in ARCHES:
        raise InputError(f"records arch {str(name)[:40]!r}", source=str(source), field="plan.arch",
                         expected=" or ".join(ARCHES))  # fmt: skip
    return ARCHES[name]


def root_arch(root: Path) -> str | None:
    """What the programs of the system mounted at ``root`` are for: the architecture of ``/usr/bin/env`` (coreutils'
    own file on every Debian-family image, never a link), ``ELF machine N`` for another one, None when it is no ELF
    file."""
    found = elf_machine(root / "usr/bin/env")
    if found is None:
        return None
    return next((a.name for a in ARCHES.values() if a.elf_machine == found), f"ELF machine {found}")


def elf_machine(path: Path) -> int | None:
    """The ELF machine of the file at ``path`` (62 x86-64, 183 AArch64), or None for a file that is not ELF."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    return int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")


__all__ = ["ARCHES", "Arch", "arch", "elf_machine", "recorded", "root_arch"]
