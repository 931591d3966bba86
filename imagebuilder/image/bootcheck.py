"""Is a disk image safe to ship, and will its bootloader find what it needs? Checked in seconds, without booting.

Why this exists: an image whose root filesystem was copied while still mounted carries a journal that the kernel
replays at the first boot. The replay writes old copies of metadata blocks back; block 0 of an ext filesystem holds
the partition's boot sector, so a boot sector installed after the journal last saw that block is overwritten with
zeros and the image never boots again, although it booted once (the bootloader runs before any kernel). A boot test
alone finds this late, after a whole build; these checks find it before a VM starts and before an output is
compressed.

What is checked on a raw disk:
- the MBR: boot signature; boot code present (or a GPT disk whose EFI system partition has a loader: UEFI only);
- UEFI: an EFI system partition holds a loader at the removable-media path (``EFI/BOOT/BOOTX64.EFI``), the one
  firmware boots on a disk that has no NVRAM entry yet (every fresh VM and machine a node image meets);
- BIOS bootloaders that we can follow: GRUB's MBR must point at a non-empty core image; a partition boot sector that
  the MBR chains to (the active partition) must not be empty; a SYSLINUX/EXTLINUX boot sector must point at the first
  sector of ``ldlinux.sys``, whose checksum, sector list and contents on disk must agree with the file in the
  filesystem (what ``extlinux --install`` patched);
- every ext2/3/4 filesystem on a Linux partition: cleanly unmounted (state clean, no ``needs_recovery``, journal
  empty) and, with ``deep``, ``e2fsck -fn`` without complaint.
Boot code we do not recognise is reported as a note, never refused: the real firmware may well boot it.
"""

from __future__ import annotations

import os
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from imagebuilder.core.arch import ARCHES
from imagebuilder.core.disk import LINUX_TYPES, SECTOR, Partition, ext_superblock, partitions, raw_view
from imagebuilder.core.errors import ExternalError

LDLINUX_MAGIC = 0x3EB202FE
#: ldlinux.sys's patch area (magic, instance, data sectors, ADV sectors, dwords, checksum, max transfer, offset of the
#: extended patch area), the extended patch area (ADV pointers', directory's, subvolume's offsets and lengths, sector
#: extents' offset and count, the boot sector's two pointer offsets, RAID patch), and one sector extent (lba, count)
PATCH_AREA = struct.Struct("<IIHHIIHH")
EXT_PATCH_AREA = struct.Struct("<10H")
SECTOR_EXTENT = struct.Struct("<QH")
ESP_TYPES = ("EF", "C12A7328-F81F-11D2-BA4B-00A0C93EC93B")
EXT_MAGIC = 0xEF53
#: where extlinux/syslinux installers put ldlinux.sys, most common first
LDLINUX_PATHS = (
    "/boot/extlinux/ldlinux.sys",
    "/boot/syslinux/ldlinux.sys",
    "/extlinux/ldlinux.sys",
    "/syslinux/ldlinux.sys",
    "/boot/ldlinux.sys",
    "/ldlinux.sys",
)
#: GRUB's boot.img keeps the LBA of the first sector of its core image here (``kernel_sector``)
GRUB_KERNEL_SECTOR = 0x5C


@dataclass
class DiskCheck:
    """Problems make an image unfit to ship; notes say what was recognised and checked."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: an EFI system partition holds the removable-media loader: UEFI firmware boots this disk
    uefi: bool = False
    #: the architectures whose removable-media loader it holds (amd64: BOOTX64.EFI, arm64: BOOTAA64.EFI)
    uefi_arches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        return "; ".join(self.problems) if self.problems else "; ".join(self.notes)


class _Disk:
    """Random reads of a raw disk by sector."""

    def __init__(self, raw: Path) -> None:
        self.path = raw
        self.size = raw.stat().st_size

    def read(self, lba: int, count: int = 1) -> bytes:
        with self.path.open("rb") as fh:
            fh.seek(lba * SECTOR)
            return fh.read(count * SECTOR)


def check_image(image: Path, *, deep: bool = True, work_dir: Path | None = None) -> DiskCheck:
    """:func:`check_raw` on any image format the tool handles (.gz, .ova, .qcow2, .vmdk, raw)."""
    with raw_view(image, work_dir=work_dir) as raw:
        return check_raw(raw, deep=deep)


def check_raw(raw: Path, *, deep: bool = True, boot: bool = True) -> DiskCheck:
    """The checks above on a raw disk; ``boot=False`` checks only the filesystems (before boot code is written)."""
    result = DiskCheck()
    disk = _Disk(raw)
    if disk.size < 2 * SECTOR:
        result.problems.append(f"the disk is {disk.size} bytes: no room for a partition table")
        return result
    mbr = disk.read(0)
    label, parts = partitions(raw)
    if boot and mbr[510:512] != b"\x55\xaa":
        result.problems.append("the MBR has no boot signature (55AA): the BIOS will not boot this disk")
    if label == "none" or not parts:
        result.problems.append("no partition table with partitions")
        return result
    if boot:
        _check_bootloader(disk, mbr, label, parts, result)
    for part in parts:
        if part.type in LINUX_TYPES:
            _check_ext(raw, disk, part, deep, result)
    return result


#: where UEFI firmware looks for a loader on a disk without an NVRAM boot entry, by architecture
EFI_REMOVABLE_LOADERS = {a.name: a.efi_loader for a in ARCHES.values()}
EFI_REMOVABLE_LOADER = EFI_REMOVABLE_LOADERS["amd64"]


def _check_esp(disk: _Disk, parts: list[Partition], result: DiskCheck) -> bool:
    """Whether an EFI system partition holds a removable-media loader, and of which architectures (read with
    mtools: no mount, no root)."""
    for part in (p for p in parts if p.type in ESP_TYPES):
        proc = subprocess.run(
            ["mdir", "-b", "-i", f"{disk.path}@@{part.offset}", "::/EFI/BOOT"],
            capture_output=True, check=False, timeout=60, env={**os.environ, "MTOOLS_SKIP_CHECK": "1"},
        )  # fmt: skip
        listed = {line.strip().upper() for line in proc.stdout.decode(errors="replace").splitlines()}
        here = [(a, loader) for a, loader in EFI_REMOVABLE_LOADERS.items() if f"::/{loader}" in listed]
        for a, loader in here:
            result.notes.append(f"UEFI: {loader} on partition {part.number} (EFI system partition)")
            result.uefi_arches.append(a)
        if not here:
            result.notes.append(f"partition {part.number} (EFI system partition) has no {EFI_REMOVABLE_LOADER}"
                                " (nor another architecture's removable-media loader)")  # fmt: skip
    result.uefi = bool(result.uefi_arches)
    return result.uefi


def _check_bootloader(disk: _Disk, mbr: bytes, label: str, parts: list[Partition], result: DiskCheck) -> None:
    uefi = _check_esp(disk, parts, result)
    code = mbr[:440]
    if not any(code):
        if uefi:
            result.notes.append("UEFI only: no BIOS boot code")
        elif any(p.type in ESP_TYPES for p in parts):
            result.problems.append(
                f"no BIOS boot code, and no EFI system partition holds {EFI_REMOVABLE_LOADER}: nothing boots"
            )
        else:
            result.problems.append("the MBR holds no boot code and there is no EFI system partition: nothing boots")
        return
    if b"GRUB" in code:
        (sector,) = struct.unpack_from("<Q", mbr, GRUB_KERNEL_SECTOR)
        if sector == 0 or sector * SECTOR >= disk.size:
            result.problems.append(f"GRUB's boot code points at sector {sector}, which is not on the disk")
        elif not any(disk.read(sector)):
            result.problems.append(f"GRUB's boot code points at sector {sector}, which is empty (no core image)")
        else:
            result.notes.append(f"GRUB (BIOS): core image at sector {sector}")
        return
    active = [p for p in parts if p.bootable]
    if not active:
        result.notes.append("MBR boot code not recognised and no active partition: not followed")
        return
    for part in active:
        vbr = disk.read(part.start)
        where = f"partition {part.number}'s boot sector (sector {part.start})"
        if not any(vbr):
            result.problems.append(f"{where} is all zeros: the MBR chains to it, so the BIOS finds no bootable device")
        elif vbr[510:512] != b"\x55\xaa":
            result.problems.append(f"{where} has no boot signature (55AA)")
        elif vbr[3:11] in (b"SYSLINUX", b"EXTLINUX"):
            _check_syslinux(disk, part, vbr, result)
        else:
            result.notes.append(f"{where}: boot code {vbr[3:11]!r} not recognised, not followed")


def debugfs(raw: Path, part: Partition, request: str) -> subprocess.CompletedProcess[bytes]:
    """One read-only debugfs request on the filesystem of ``part`` of the raw disk ``raw`` (no loop device, no
    root needed)."""
    return subprocess.run(["debugfs", "-R", request, f"{raw}?offset={part.offset}"], capture_output=True,
                          check=False, timeout=120)  # fmt: skip


def _block_size(disk: _Disk, part: Partition) -> int | None:
    sb = disk.read(part.start + 2, 2)  # the superblock: 1024 bytes at byte 1024 of the filesystem
    if len(sb) < 1024 or struct.unpack_from("<H", sb, 56)[0] != EXT_MAGIC:
        return None
    (log_block,) = struct.unpack_from("<I", sb, 24)
    return int(1024 << log_block)


def _check_syslinux(disk: _Disk, part: Partition, vbr: bytes, result: DiskCheck) -> None:
    block_size = _block_size(disk, part)
    if block_size is None:
        result.notes.append(f"SYSLINUX boot sector on partition {part.number} (not ext: ldlinux.sys not followed)")
        return
    for path in LDLINUX_PATHS:
        bmap = debugfs(disk.path, part, f"bmap {path} 0")
        if bmap.returncode == 0 and bmap.stdout.strip().isdigit():
            break
    else:
        result.problems.append(f"partition {part.number} has a SYSLINUX boot sector but no ldlinux.sys")
        return
    first_block = int(bmap.stdout.strip())
    content = debugfs(disk.path, part, f"cat {path}").stdout
    problem = _syslinux_problem(disk, part, vbr, content, first_block * (block_size // SECTOR))
    if problem:
        result.problems.append(f"{path}: {problem}")
    else:
        result.notes.append(
            f"SYSLINUX: boot sector -> {path} at sector {part.start + first_block * (block_size // SECTOR)}, consistent"
        )


def _syslinux_problem(disk: _Disk, part: Partition, vbr: bytes, ld: bytes, first_sector: int) -> str | None:
    """What is wrong between the boot sector, ldlinux.sys's patch area and the sectors on disk (None: nothing)."""
    at = ld.find(struct.pack("<I", LDLINUX_MAGIC), 0, 1024)
    if at < 0 or len(ld) < at + 24:
        return "no LDLINUX patch area (not a syslinux loader, or truncated)"
    _, _, data_sectors, _, dwords, _, _, epa = PATCH_AREA.unpack_from(ld, at)
    if dwords * 4 > len(ld) or epa + 20 > len(ld):
        return "its patch area points outside the file"
    csum = LDLINUX_MAGIC
    for (word,) in struct.iter_unpack("<I", ld[: dwords * 4]):
        csum = (csum - word) & 0xFFFFFFFF
    if csum:
        return "its checksum does not match (the file was changed after extlinux patched it)"
    _, _, _, _, _, secptr, secptrcnt, p0, p1, _ = EXT_PATCH_AREA.unpack_from(ld, epa)
    if max(p0, p1) + 4 > 510:
        return "its patch area points outside the boot sector"
    pointer = struct.unpack_from("<I", vbr, p0)[0] | struct.unpack_from("<I", vbr, p1)[0] << 32
    if pointer != first_sector:
        return (
            f"the boot sector loads sector {pointer} of the partition, but the file starts at sector {first_sector}"
            " (the boot sector is stale or was overwritten)"
        )
    if disk.read(part.start + pointer) != ld[:SECTOR]:
        return f"sector {part.start + pointer} on disk differs from the file's first sector"
    # the rest of the loader, by the sector extents extlinux wrote into the file
    index, wanted = 1, data_sectors - 1
    for n in range(secptrcnt):
        lba, length = SECTOR_EXTENT.unpack_from(ld, secptr + SECTOR_EXTENT.size * n)
        if not length or index > wanted:
            break
        length = min(length, wanted - index + 1)
        if disk.read(part.start + lba, length) != ld[index * SECTOR : (index + length) * SECTOR]:
            return f"sectors {part.start + lba}..+{length} on disk differ from the file (extent {n})"
        index += length
    return None


def _check_ext(raw: Path, disk: _Disk, part: Partition, deep: bool, result: DiskCheck) -> None:
    if _block_size(disk, part) is None:
        result.notes.append(f"partition {part.number}: not ext2/3/4, filesystem state not checked")
        return
    spec = f"{raw}?offset={part.offset}"
    try:
        fields = ext_superblock(spec)
    except ExternalError as exc:
        result.problems.append(f"partition {part.number}: dumpe2fs cannot read the filesystem: {exc}")
        return
    where = f"partition {part.number}'s filesystem"
    features = fields.get("Filesystem features", "").split()
    if "needs_recovery" in features:
        result.problems.append(
            f"{where} was not unmounted cleanly (needs_recovery): the first boot would replay its journal over the disk"
        )
    elif fields.get("Journal start", "0") != "0":
        result.problems.append(f"{where} has a journal to replay (journal start {fields['Journal start']})")
    if fields.get("Filesystem state") != "clean":
        result.problems.append(f"{where} is not clean (state: {fields.get('Filesystem state', 'unknown')})")
    if any(p.startswith(where) for p in result.problems):
        return
    if deep:
        fsck = subprocess.run(["e2fsck", "-fn", spec], capture_output=True, text=True, check=False, timeout=1800)
        if fsck.returncode != 0:
            tail = " | ".join(fsck.stdout.strip().splitlines()[-4:])
            result.problems.append(f"{where} has errors (e2fsck -fn exit {fsck.returncode}): {tail}")
            return
    result.notes.append(f"{where}: clean" + (", e2fsck -fn passed" if deep else ""))
