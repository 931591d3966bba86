"""``image.base``: a Debian-family, cloud-style base disk image made with debootstrap.

Why: official Ubuntu cloud images cannot be downloaded on air-gapped sites (or on these test machines), but the
Debian archive (or a local mirror of it) can be reached. The image has the shape of a cloud image: a root ext4
partition, a kernel, cloud-init (NoCloud, ConfigDrive, VMware...) rendering the network with netplan, predictable
interface names (``ens*``), openssh-server, and a serial console, so Packer's qemu builder and ``image.customize``
start from it exactly as they would from an Ubuntu cloud image.

Like Ubuntu's cloud images it boots both ways, so one base image serves ``--firmware bios`` and ``--firmware efi``:
a GPT disk whose EFI system partition holds GRUB at the removable-media path (``EFI/BOOT/BOOTX64.EFI``, which UEFI
firmware finds without an NVRAM entry), and whose root partition carries the legacy-BIOS-bootable attribute that
SYSLINUX's GPT MBR follows to extlinux. Both loaders read one kernel command line.

An arm64 base (``--arch arm64``, issue 46) is made on any host: debootstrap installs Debian's arm64 packages and
runs their scripts through qemu-user-static (binfmt_misc), and the ESP holds GRUB's arm64 loader
(``EFI/BOOT/BOOTAA64.EFI``, built from the modules of the root's own grub-efi-arm64-bin); arm64 machines boot UEFI
only, so it has no BIOS boot code, and its console is the PL011 UART of QEMU's ``virt`` machine (``ttyAMA0``).

Everything the node roles install is baked in, so a build from this image needs no network at all. The disk is
assembled on loop devices mapped at the partitions' offsets (no partition device nodes, no udev needed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from imagebuilder.core import disk
from imagebuilder.core.arch import Arch
from imagebuilder.core.arch import arch as arch_of
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import atomic_write, partial_prefix, run_checked, sha256_file
from imagebuilder.core.hostinfo import require_tools
from imagebuilder.core.progress import Say
from imagebuilder.image.bootcheck import DiskCheck, check_raw

MIB = 1024 * 1024
ESP_OFFSET, ESP_SIZE = MIB, 64 * MIB  # the EFI system partition: sector 2048, FAT32
PARTITION_OFFSET = ESP_OFFSET + ESP_SIZE  # the root partition, last so that cloud-init's growpart can grow it
#: SYSLINUX's MBR for GPT disks: it boots the partition with the legacy-BIOS-bootable attribute
MBR_CANDIDATES = ("/usr/lib/syslinux/mbr/gptmbr.bin", "/usr/lib/SYSLINUX/gptmbr.bin", "/usr/share/syslinux/gptmbr.bin")
ESP_GUID = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
LINUX_GUID = "0FC63DAF-8483-4772-8E79-3D69D8477DE4"
LAYOUT = (
    "label: gpt\n"
    f"start={ESP_OFFSET // 512}, size={ESP_SIZE // 512}, type={ESP_GUID}, name=ESP\n"
    f"start={PARTITION_OFFSET // 512}, type={LINUX_GUID}, attrs=LegacyBIOSBootable, name=root\n"
)
#: the removable-media path: what UEFI firmware boots from a disk that has no NVRAM entry (a fresh VM's); the
#: amd64 one (each architecture's: :attr:`Arch.efi_loader`)
AMD64 = arch_of("amd64")
EFI_LOADER = AMD64.efi_loader
#: what the EFI loader carries: the image has no GRUB module directory to load more from at boot
GRUB_EFI_MODULES = (
    "part_gpt", "part_msdos", "fat", "ext2", "search", "search_fs_uuid", "normal", "configfile", "linux", "gzio",
    "echo", "test", "serial", "terminal", "all_video", "boot",
)  # fmt: skip
#: the kernel command line both loaders boot with (serial console for the boot test and the build's log), with the
#: architecture's serial console
KERNEL_ARGS = "ro console=tty0 console={console},115200n8"

#: dpkg's setting, in the root while it is made, that skips its fsyncs
UNSAFE_IO = "image-builder-unsafe-io"
#: what debootstrap installs itself (it configures these without a running system)
BOOTSTRAP = ["systemd-sysv", "udev", "kmod", "procps", "iproute2", "isc-dhcp-client", "e2fsprogs"]
#: the rest of the base OS plus every package the node roles want (installed with apt in the chroot), so a
#: build from this image needs no package archive
PACKAGES = [
    "openssh-server", "sudo", "python3", "python3-apt", "cloud-init", "cloud-guest-utils",
    "ca-certificates", "conntrack", "curl", "ebtables", "ethtool", "iptables", "jq", "socat", "tar",
    "apt-transport-https", "nfs-common", "containerd", "open-vm-tools",
    # the system bus and logind, as on a cloud image: without them systemctl's poweroff cannot reach logind
    # ("Failed to connect to bus") and falls back to a non-blocking low-level shutdown
    "dbus", "libpam-systemd",
    # the network as on Ubuntu cloud images: cloud-init renders netplan for systemd-networkd (ifupdown cannot match
    # interface names by pattern, and spec 4.8's metadata matches ens*), and systemd-resolved takes the name
    # servers DHCP gives (networkd alone writes no resolv.conf: a node had none, and CoreDNS, which forwards to the
    # node's, stopped with "no nameservers found"; the node check found it)
    "netplan.io", "systemd-resolved",
]  # fmt: skip


def _run(*args: str, log: Say | None = None, timeout: int = 3600, env: dict[str, str] | None = None) -> str:
    if log:
        log("$ " + " ".join(args))
    return run_checked(*args, timeout=timeout, env=env)


def packages(target: Arch) -> list[str]:
    """What apt installs in the root for ``target``: :data:`PACKAGES`, its kernel, and on a foreign architecture
    GRUB's EFI modules for it (the host's grub-mkimage builds the loader from them)."""
    return [target.kernel_package, *PACKAGES, *(() if target.native else (target.grub_package,))]


def _configure(root: Path, uuid: str, target: Arch) -> None:
    boot = root / "boot"
    kernels = sorted(boot.glob("vmlinuz-*"))
    initrds = sorted(boot.glob("initrd.img-*"))
    if not kernels or not initrds:
        raise ExternalError(f"debootstrap installed no kernel/initrd ({target.kernel_package})")
    (root / "etc" / "fstab").write_text(f"UUID={uuid} / ext4 defaults,errors=remount-ro 0 1\n")
    (root / "etc" / "hostname").write_text("localhost\n")
    # debootstrap copied the host's: the node's is systemd-resolved's stub, as its package links it and as on Ubuntu
    # cloud images (the kubelet then hands pods the upstream servers of /run/systemd/resolve/resolv.conf)
    resolv = root / "etc" / "resolv.conf"
    resolv.unlink(missing_ok=True)
    resolv.symlink_to("../run/systemd/resolve/stub-resolv.conf")
    # predictable interface names (ens3 under QEMU, ens192 on vSphere), as on Ubuntu cloud images: spec 4.8's
    # network config matches ens*
    (root / "etc" / "network" / "interfaces.d").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "cloud" / "cloud.cfg.d" / "90-image-builder-base.cfg").write_text(
        "# image-builder base image: look for NoCloud/ConfigDrive/VMware seeds, fall back to none\n"
        "datasource_list: [NoCloud, ConfigDrive, VMware, OVF, None]\n"
        "system_info:\n  network:\n    renderers: [netplan]\n"
    )
    _write_boot_configs(root, uuid, kernels[-1].name, initrds[-1].name, target)
    # a clone must not share the identity of this image
    (root / "etc" / "machine-id").write_text("")
    for key in (root / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()
    shutil.rmtree(root / "var" / "cache" / "apt" / "archives", ignore_errors=True)
    (root / "var" / "cache" / "apt" / "archives" / "partial").mkdir(parents=True, exist_ok=True)


def _write_boot_configs(root: Path, uuid: str, kernel: str, initrd: str, target: Arch) -> None:
    """extlinux.conf (BIOS, where the architecture has it) and GRUB's grub.cfg (UEFI): the same kernel, initrd and
    command line."""
    args = f"root=UUID={uuid} {KERNEL_ARGS.format(console=target.console)}"
    if target.bios:
        extlinux = root / "boot" / "extlinux"
        extlinux.mkdir(parents=True, exist_ok=True)
        (extlinux / "extlinux.conf").write_text(
            "DEFAULT linux\nTIMEOUT 1\nPROMPT 0\n"
            f"LABEL linux\n  LINUX /boot/{kernel}\n  INITRD /boot/{initrd}\n  APPEND {args}\n"
        )
    grub = root / "boot" / "grub"
    grub.mkdir(parents=True, exist_ok=True)
    # GRUB's own serial driver is a PC UART's; on arm64 the firmware's console already is the serial port
    terminal = ("serial --unit=0 --speed=115200\nterminal_input console serial\nterminal_output console serial\n"
                if target.bios else "")  # fmt: skip
    (grub / "grub.cfg").write_text(
        "set timeout=1\n" + terminal + "menuentry 'linux' {\n"
        f"  search --no-floppy --fs-uuid --set=root {uuid}\n"
        f"  linux /boot/{kernel} {args}\n"
        f"  initrd /boot/{initrd}\n"
        "}\n"
    )


def _install_efi_loader(
    root: Path, uuid: str, esp_dev: str, esp_uuid: str, work: Path, log: Say | None, target: Arch
) -> None:
    """GRUB on the ESP at the architecture's removable-media path, finding the root by its UUID and reading
    /boot/grub/grub.cfg; the ESP in /etc/fstab (``nofail``: a node that lost it still boots by BIOS).

    The ESP is written with mtools, not mounted: no vfat driver is needed on the build host. The loader is made by
    the host's grub-mkimage from the host's modules for its own architecture, from the root's for another."""
    name = target.efi_loader.rsplit("/", 1)[1]
    early, loader = work / "grub-early.cfg", work / name
    early.write_text(f"search --no-floppy --fs-uuid --set=root {uuid}\nset prefix=($root)/boot/grub\n")
    modules = Path("/usr/lib/grub") / target.grub_target
    if not target.native:
        modules = root / "usr/lib/grub" / target.grub_target
    wanted = [m for m in GRUB_EFI_MODULES if target.bios or m != "serial"]
    try:
        _run("grub-mkimage", "-d", str(modules), "-O", target.grub_target, "-o", str(loader), "-p", "/boot/grub",
             "-c", str(early), *wanted, log=log)  # fmt: skip
        mtools = {"MTOOLS_SKIP_CHECK": "1"}
        folder = "::/" + target.efi_loader.rsplit("/", 1)[0]
        _run("mmd", "-i", esp_dev, "::/EFI", folder, log=log, env=mtools)
        _run("mcopy", "-i", esp_dev, str(loader), f"::/{target.efi_loader}", log=log, env=mtools)
    finally:
        early.unlink(missing_ok=True)
        loader.unlink(missing_ok=True)
    (root / "boot" / "efi").mkdir(parents=True, exist_ok=True)
    fstab = root / "etc" / "fstab"
    if fstab.parent.is_dir():
        lines = [ln for ln in (fstab.read_text().splitlines() if fstab.exists() else []) if "/boot/efi" not in ln]
        fstab.write_text("".join(f"{ln}\n" for ln in [*lines, f"UUID={esp_uuid} /boot/efi vfat umask=0077,nofail 0 0"]))


def assemble_disk(
    raw: Path,
    size: int,
    populate: Callable[[Path, str], None],
    *,
    mbr: Path | None,
    log: Say | None = None,
    target: Arch = AMD64,
) -> DiskCheck:
    """Partition and format ``raw`` (:data:`LAYOUT`), fill its root with ``populate(root, uuid)``, and make it
    bootable by UEFI, and by BIOS where ``target`` has it (``mbr``: SYSLINUX's boot code; None without BIOS).

    The order is what makes the result safe to copy: GRUB's EFI loader is written to the ESP and extlinux installs
    its loader while the root filesystem is mounted;
    then everything still running in it is stopped and it is unmounted for real (never lazily) and the loop device
    detached, so the journal is checkpointed and empty; the filesystem is checked (``e2fsck -fn``, no
    ``needs_recovery``); only then are the boot sectors written (the partition's, as extlinux made it, and the
    MBR), last, onto a disk nothing has mounted. The result is checked like any image (:mod:`bootcheck`): boot
    signatures, and the boot sector pointing at ``ldlinux.sys`` as it lies on disk. Any failure raises.
    """
    with raw.open("wb") as fh:
        fh.truncate(size)
    subprocess.run(["sfdisk", "--quiet", str(raw)], input=LAYOUT, text=True, check=True)
    _, (esp, part) = disk.partitions(raw)
    with (
        disk.loop_device(raw, esp.offset, esp.length) as esp_dev,
        disk.loop_device(raw, part.offset, part.length) as dev,
    ):
        _run("mkfs.vfat", "-F", "32", "-n", "ESP", esp_dev, log=log)
        # -p: the device itself, never blkid's cache (which may still hold a reused loop device's last filesystem)
        esp_uuid = _run("blkid", "-p", "-s", "UUID", "-o", "value", esp_dev).strip()
        # extlinux reads ext4 without the 64bit and metadata_csum_seed features
        _run("mkfs.ext4", "-q", "-F", "-L", "root", "-O", "^64bit,^metadata_csum_seed", dev, log=log)
        uuid = _run("blkid", "-p", "-s", "UUID", "-o", "value", dev).strip()
        with disk.mounted(dev, raw.parent / "mnt", log=log) as root:
            populate(root, uuid)
            _install_efi_loader(root, uuid, esp_dev, esp_uuid, raw.parent, log, target)
            if mbr is not None:
                _run("extlinux", "--install", str(root / "boot" / "extlinux"), log=log)
            subprocess.run(["sync"], check=False)
            with open(dev, "rb") as fh:
                boot_sector = fh.read(512)
    fs = check_raw(raw, boot=False)
    if not fs.ok:
        raise ExternalError(
            "the base image's filesystem is not clean after unmounting: " + "; ".join(fs.problems),
            hint="rerun image.base; nothing was written to the destination",
        )
    if mbr is not None:
        with raw.open("r+b") as fh:
            fh.seek(part.offset)
            fh.write(boot_sector)
            fh.seek(0)
            fh.write(mbr.read_bytes()[:440])
            fh.flush()
            os.fsync(fh.fileno())
    result = check_raw(raw, deep=False)
    if result.ok and target.name not in result.uefi_arches:
        result.problems.append(f"no {target.efi_loader} on the EFI system partition")
    if not result.ok:
        raise ExternalError(
            "the base image would not boot: " + "; ".join(result.problems),
            hint="rerun image.base; nothing was written to the destination",
        )
    if log:
        log("checked: " + result.summary())
    return result


def check_prerequisites(target: Arch = AMD64) -> Path | None:
    """What ``image.base`` needs of this host for ``target`` (the dry run checks the same); returns syslinux's MBR
    code (None for an architecture without BIOS)."""
    if os.geteuid() != 0:
        raise ExternalError("image.base needs root (loop devices, mount, debootstrap)", hint="run it as root")
    require_tools("debootstrap", "losetup", "mkfs.ext4", "mkfs.vfat", "sfdisk", "grub-mkimage", "qemu-img", "e2fsck",
                  "debugfs", "mmd", "mcopy", "mdir", *(("extlinux",) if target.bios else ()))  # fmt: skip
    target.require_emulation()  # debootstrap runs the root's package scripts: under qemu-user on another host
    if target.native and not (Path("/usr/lib/grub") / target.grub_target).is_dir():
        raise ExternalError(f"GRUB's {target.grub_target} modules are missing",
                            hint=f"run ./scripts/setup.sh ({target.grub_package})")  # fmt: skip
    if not target.bios:
        return None
    mbr = next((Path(p) for p in MBR_CANDIDATES if Path(p).is_file()), None)
    if mbr is None:
        raise ExternalError("syslinux's gptmbr.bin is missing", hint="run ./scripts/setup.sh (package syslinux-common)")
    return mbr


def make_base_image(
    dest: Path,
    *,
    suite: str = "bookworm",
    mirror: str = "http://deb.debian.org/debian",
    size_gb: int = 4,
    log: Say | None = None,
    target: Arch = AMD64,
) -> tuple[Path, str]:
    """Build the base image of ``target`` at ``dest`` (qcow2) and ``dest.sha256``; returns the path and its
    sha256."""
    mbr = check_prerequisites(target)
    if not 2 <= size_gb <= 64:
        raise InputError(f"{size_gb} GiB is not a usable base image size", field="--size-gb", expected="2 to 64")
    dest = dest.resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    # what a killed run of this task left: its half-made image beside dest (with the disk it mounted there), its
    # debootstrap and apt still running, its loops
    disk.release(disk.leftovers(outputs=(dest.parent,)))
    # the disk's mounts in a namespace of this process's own: a copy taken by another program's new namespace
    # would keep the root mounted, unclean, after it is unmounted here (seen beside a test run's ip netns exec)
    disk.private_mounts()

    def populate(root: Path, uuid: str) -> None:
        # dpkg without an fsync per file while the root is made (debootstrap's second stage, apt): the disk is
        # synced and checked once it is unmounted; the setting is removed before the image is finished
        unsafe_io = root / "etc" / "dpkg" / "dpkg.cfg.d" / UNSAFE_IO
        unsafe_io.parent.mkdir(parents=True, exist_ok=True)
        unsafe_io.write_text("force-unsafe-io\n")
        _run(
            "debootstrap",
            f"--arch={target.name}",
            "--variant=minbase",
            f"--include={','.join(BOOTSTRAP)}",
            suite,
            str(root),
            mirror,
            log=log,
            timeout=3600,
            env={"DEBIAN_FRONTEND": "noninteractive"},
        )
        with disk.chroot_mounts(root, log=log):
            _run("chroot", str(root), "apt-get", "update", "-qq", log=log)
            # the initramfs once, after every package that adds to it is in: the kernel's own hook (INITRD=No) and
            # the triggers' updates (no initramfs yet: nothing to update) would make it twice, each a quarter of an
            # hour of emulated shell for an arm64 image
            _run(
                "chroot", str(root), "apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages(target),
                log=log, timeout=3600, env={"DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C", "INITRD": "No"},
            )  # fmt: skip
            for version in sorted(p.name for p in (root / "lib" / "modules").iterdir()):
                _run("chroot", str(root), "update-initramfs", "-c", "-k", version, log=log, timeout=3600,
                     env={"LC_ALL": "C"})  # fmt: skip
            _run("chroot", str(root), "apt-get", "clean", log=log)
        unsafe_io.unlink()
        _configure(root, uuid, target)

    with tempfile.TemporaryDirectory(prefix=partial_prefix(dest), suffix=".tmp", dir=dest.parent) as tmp:
        work = Path(tmp)
        raw = work / "disk.raw"
        assemble_disk(raw, size_gb * 1024**3, populate, mbr=mbr, log=log, target=target)
        tmp_out = work / "base.qcow2"
        _run("qemu-img", "convert", "-O", "qcow2", str(raw), str(tmp_out), log=log)
        raw.unlink()
        digest = sha256_file(tmp_out)
        os.replace(tmp_out, dest)
    with atomic_write(dest.with_name(dest.name + ".sha256")) as fh:
        fh.write(f"{digest}  {dest.name}\n")
    return dest, digest
