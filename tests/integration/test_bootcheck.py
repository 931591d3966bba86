"""Boot sectors and filesystem state, on real disk images: small ext4 disks assembled with the real tools (sfdisk,
loop devices, mkfs.ext4, extlinux, syslinux's MBR), then broken the ways images break in the field: a copy taken
while mounted (a journal to replay), a zeroed partition boot sector, a stale pointer to ldlinux.sys. Needs root."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from imagebuilder.core import disk
from imagebuilder.core.errors import ExternalError
from imagebuilder.image.base import EFI_LOADER, ESP_OFFSET, MBR_CANDIDATES, PARTITION_OFFSET, assemble_disk
from imagebuilder.image.bootcheck import check_image, check_raw
from tests.support.common import run

SIZE = 160 * 1024 * 1024  # the 64 MiB ESP and a small root
MBR = next(Path(p) for p in MBR_CANDIDATES if Path(p).is_file())


def minimal_root(root: Path, uuid: str) -> None:
    """What extlinux needs: its folder and a config (the kernel does not matter to the checks)."""
    (root / "boot" / "extlinux").mkdir(parents=True)
    (root / "boot" / "extlinux" / "extlinux.conf").write_text(
        f"DEFAULT l\nLABEL l\n  LINUX /vmlinuz root=UUID={uuid}\n"
    )
    (root / "etc").mkdir()
    (root / "etc" / "hostname").write_text("localhost\n")


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    raw = tmp_path_factory.mktemp("good") / "disk.raw"
    assemble_disk(raw, SIZE, minimal_root, mbr=MBR)
    return raw


def copy(raw: Path, dest: Path) -> Path:
    subprocess.run(["cp", "--sparse=always", str(raw), str(dest)], check=True)
    return dest


def test_an_assembled_disk_passes_and_its_loader_is_followed(good: Path) -> None:
    result = check_raw(good)
    assert result.ok, result.problems
    assert any("boot sector -> /boot/extlinux/ldlinux.sys" in n and "consistent" in n for n in result.notes)
    assert any("e2fsck -fn passed" in n for n in result.notes)
    fields = subprocess.run(["dumpe2fs", "-h", f"{good}?offset={PARTITION_OFFSET}"], capture_output=True, text=True)
    assert "needs_recovery" not in fields.stdout and "Journal start:            0" in fields.stdout
    with good.open("rb") as fh:
        fh.seek(PARTITION_OFFSET)
        vbr = fh.read(512)
    assert vbr[:3] == b"\xeb\x58\x90" and vbr[3:11] == b"SYSLINUX" and vbr[510:] == b"\x55\xaa"


def test_a_zeroed_partition_boot_sector_is_refused(good: Path, tmp_path: Path) -> None:
    raw = copy(good, tmp_path / "zero.raw")
    with raw.open("r+b") as fh:
        fh.seek(PARTITION_OFFSET)
        fh.write(bytes(512))
    result = check_raw(raw)
    assert not result.ok
    assert f"boot sector (sector {PARTITION_OFFSET // 512}) is all zeros" in result.summary()


@contextlib.contextmanager
def mounted_and_written(good: Path, tmp_path: Path) -> Iterator[Path]:
    """A copy of ``good`` mounted with a file just written and synced: what is copied now has a journal to replay."""
    raw = copy(good, tmp_path / "live.raw")
    part = disk.root_partition(raw)
    with disk.loop_device(raw, part.offset, part.length) as dev, disk.mounted(dev, tmp_path / "mnt") as root:
        (root / "etc" / "written-while-mounted").write_text("x\n")
        subprocess.run(["sync"], check=True)
        yield raw


def test_a_copy_taken_while_mounted_is_refused(good: Path, tmp_path: Path) -> None:
    with mounted_and_written(good, tmp_path) as raw:
        dirty = copy(raw, tmp_path / "dirty.raw")
    result = check_raw(dirty)
    assert not result.ok
    assert "not unmounted cleanly (needs_recovery)" in result.summary()
    assert check_raw(raw).ok, "the original, unmounted for real, is clean"


def test_a_stale_pointer_to_ldlinux_is_refused(good: Path, tmp_path: Path) -> None:
    raw = copy(good, tmp_path / "stale.raw")
    with raw.open("r+b") as fh:
        fh.seek(PARTITION_OFFSET)
        vbr = bytearray(fh.read(512))
        start = next(n for n in check_raw(good).notes if n.startswith("SYSLINUX"))
        sector = int(start.split(" at sector ")[1].split(",")[0]) - PARTITION_OFFSET // 512
        at = vbr.find(struct.pack("<I", sector))
        assert at > 0
        vbr[at : at + 4] = struct.pack("<I", sector + 8)
        fh.seek(PARTITION_OFFSET)
        fh.write(vbr)
    result = check_raw(raw)
    assert not result.ok
    assert f"the boot sector loads sector {sector + 8}" in result.summary()


def test_a_damaged_loader_on_disk_is_refused(good: Path, tmp_path: Path) -> None:
    raw = copy(good, tmp_path / "damaged.raw")
    note = next(n for n in check_raw(good).notes if n.startswith("SYSLINUX"))
    sector = int(note.split(" at sector ")[1].split(",")[0])
    with raw.open("r+b") as fh:
        fh.seek((sector + 3) * 512)  # inside the loader, past its first sector
        fh.write(b"\xff" * 512)
    # the bytes on disk are the file's: its checksum (what extlinux patched in) no longer holds
    assert "its checksum does not match" in check_raw(raw).summary()


def mtools(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, env={**os.environ, "MTOOLS_SKIP_CHECK": "1"})


def test_the_assembled_disk_boots_both_ways(good: Path) -> None:
    label, parts = disk.partitions(good)
    assert label == "gpt" and [p.offset for p in parts] == [ESP_OFFSET, PARTITION_OFFSET]
    assert parts[1].bootable, "the root carries the legacy-BIOS-bootable attribute gptmbr.bin follows"
    summary = check_raw(good).summary()
    assert f"UEFI: {EFI_LOADER} on partition 1" in summary and "SYSLINUX: boot sector ->" in summary
    with good.open("rb") as fh:
        assert fh.read(440) == MBR.read_bytes()[:440]


def test_without_bios_code_the_disk_is_uefi_only_and_without_its_efi_loader_nothing_boots(
    good: Path, tmp_path: Path
) -> None:
    raw = copy(good, tmp_path / "nombr.raw")
    with raw.open("r+b") as fh:
        fh.write(bytes(440))
    result = check_raw(raw)
    assert result.ok and "UEFI only: no BIOS boot code" in result.summary()
    mtools("mdel", "-i", f"{raw}@@{ESP_OFFSET}", f"::/{EFI_LOADER}")
    result = check_raw(raw)
    assert not result.ok
    assert f"no BIOS boot code, and no EFI system partition holds {EFI_LOADER}: nothing boots" in result.summary()


def test_an_mbr_disk_without_boot_code_is_refused(tmp_path: Path) -> None:
    raw = tmp_path / "dos.raw"
    with raw.open("wb") as fh:
        fh.truncate(SIZE)
    subprocess.run(["sfdisk", "--quiet", str(raw)], input="label: dos\nstart=2048, type=83\n", text=True, check=True)
    with raw.open("r+b") as fh:
        fh.seek(510)
        fh.write(b"\x55\xaa")
    assert "the MBR holds no boot code and there is no EFI system partition" in check_raw(raw).summary()


def test_grub_pointing_at_an_empty_sector_is_refused(good: Path, tmp_path: Path) -> None:
    raw = copy(good, tmp_path / "grub.raw")
    empty = 40  # past the GPT's entries, before the first partition: left empty
    with raw.open("r+b") as fh:
        code = bytearray(440)
        code[0x180:0x184] = b"GRUB"
        code[0x5C:0x64] = struct.pack("<Q", empty)
        fh.write(code)
    assert f"GRUB's boot code points at sector {empty}, which is empty" in check_raw(raw).summary()
    with raw.open("r+b") as fh:
        fh.seek(empty * 512)
        fh.write(b"\x52" * 512)
    result = check_raw(raw)
    assert result.ok and f"GRUB (BIOS): core image at sector {empty}" in result.summary()


def test_a_gpt_disk_without_bios_code_boots_only_with_an_efi_loader(tmp_path: Path) -> None:
    raw = tmp_path / "uefi.raw"
    with raw.open("wb") as fh:
        fh.truncate(SIZE)
    table = "label: gpt\nstart=2048, size=16MiB, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B\n"
    table += "type=0FC63DAF-8483-4772-8E79-3D69D8477DE4\n"
    subprocess.run(["sfdisk", "--quiet", str(raw)], input=table, text=True, check=True)
    part = disk.root_partition(raw)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-E", f"offset={part.offset}", str(raw), f"{part.size // 2}k"], check=True)
    subprocess.run(["mkfs.fat", "--offset", "2048", str(raw), str(16 * 1024)], check=True, capture_output=True)
    assert "no EFI system partition holds" in check_raw(raw).summary(), "an ESP without a loader boots nothing"
    loader = tmp_path / "BOOTX64.EFI"
    loader.write_bytes(b"MZ" + bytes(1022))
    mtools("mmd", "-i", f"{raw}@@{2048 * 512}", "::/EFI", "::/EFI/BOOT")
    mtools("mcopy", "-i", f"{raw}@@{2048 * 512}", str(loader), "::/EFI/BOOT/BOOTX64.EFI")
    result = check_raw(raw)
    assert result.ok, result.problems
    assert "UEFI only" in result.summary()


def test_formats_are_read_through_one_raw_view(good: Path, tmp_path: Path) -> None:
    qcow2 = tmp_path / "good.qcow2"
    subprocess.run(["qemu-img", "convert", "-O", "qcow2", str(good), str(qcow2)], check=True)
    gz = tmp_path / "good.gz"
    with gz.open("wb") as out:
        subprocess.run(["gzip", "-c", str(good)], stdout=out, check=True)
    assert check_image(qcow2).ok and check_image(gz).ok
    bad = tmp_path / "bad.gz"
    bad.write_bytes(gz.read_bytes()[:2000])
    with pytest.raises(Exception, match="not a complete gzip file"):
        check_image(bad)


def spawn_holder(args: list[str], cwd: Path) -> int:
    """A daemon as a package script leaves one: its own session, not our child once we return."""
    proc = subprocess.Popen(["setsid", "--fork", *args], cwd=cwd, stdin=subprocess.DEVNULL)
    proc.wait()
    for _ in range(50):
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    if os.readlink(f"/proc/{pid}/cwd") == str(cwd) and Path(
                        f"/proc/{pid}/comm"
                    ).read_text().strip() in (
                        "sleep",
                        "tail",
                    ):
                        return int(pid)
                except OSError:
                    continue
        time.sleep(0.1)
    raise AssertionError("the holder did not start")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state != "Z"


def test_a_mount_kept_busy_by_a_leftover_process_still_yields_a_clean_disk(tmp_path: Path) -> None:
    holders: list[int] = []

    def populate(root: Path, uuid: str) -> None:
        minimal_root(root, uuid)
        (root / "var" / "log").mkdir(parents=True)
        (root / "var" / "log" / "daemon.log").write_text("")
        # one with its working directory in the root, one writing a file in it (as a started service would)
        holders.append(spawn_holder(["sleep", "600"], root))
        holders.append(spawn_holder(["tail", "-f", str(root / "var" / "log" / "daemon.log")], root / "var" / "log"))
        (root / "var" / "lib").mkdir()
        (root / "var" / "lib" / "late-write").write_text("y\n")

    raw = tmp_path / "busy.raw"
    result = assemble_disk(raw, SIZE, populate, mbr=MBR)
    assert result.ok
    assert holders and not [p for p in holders if alive(p)], "the leftover processes were stopped"
    assert check_raw(raw).ok
    assert "/busy" not in Path("/proc/mounts").read_text() and str(tmp_path) not in Path("/proc/mounts").read_text()


def test_a_mount_that_cannot_be_released_fails_instead_of_detaching_lazily(tmp_path: Path) -> None:
    def populate(root: Path, uuid: str) -> None:
        minimal_root(root, uuid)
        (root / "sub").mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(root / "sub")], check=True)

    raw = tmp_path / "stuck.raw"
    try:
        with pytest.raises(ExternalError, match="could not be unmounted"):
            assemble_disk(raw, SIZE, populate, mbr=MBR)
        assert os.path.ismount(tmp_path / "mnt"), "never a lazy unmount"
    finally:
        subprocess.run(["umount", str(tmp_path / "mnt" / "sub")], check=False)
        subprocess.run(["umount", str(tmp_path / "mnt")], check=False)
        for line in subprocess.run(["losetup", "-j", str(raw)], capture_output=True, text=True).stdout.splitlines():
            subprocess.run(["losetup", "-d", line.split(":")[0]], check=False)


#: a disk assembled in a child process, which waits, with the root mounted, until the test says go
_ASSEMBLE_AND_WAIT = """
import sys, time
from pathlib import Path
from imagebuilder.core import disk
from imagebuilder.core.errors import ExternalError
from imagebuilder.image.base import MBR_CANDIDATES, assemble_disk
from tests.integration.test_bootcheck import SIZE, minimal_root
raw, private = Path(sys.argv[1]), sys.argv[2] == "private"
if private:
    disk.private_mounts()
def populate(root, uuid):
    minimal_root(root, uuid)
    (root / "etc" / "written").write_text("x" * 100000)
    (raw.parent / "mounted").write_text(str(root))
    while not (raw.parent / "go").exists():
        time.sleep(0.05)
try:
    assemble_disk(raw, SIZE, populate, mbr=next(Path(p) for p in MBR_CANDIDATES if Path(p).is_file()))
except ExternalError as exc:
    print(exc)
    sys.exit(3)
"""


@pytest.mark.parametrize("private", [True, False], ids=["private-mounts", "host-mounts"])
def test_a_mount_namespace_made_meanwhile_leaves_the_disk_clean_only_when_the_mounts_are_private(
    tmp_path: Path, private: bool
) -> None:
    """``ip netns exec`` (the DHCP tests do it), a container or a PrivateTmp service copies every mount there is into
    its new namespace; the copy keeps the root mounted after the assembler unmounted it, and the image's journal
    needs replaying. image.base assembles in mounts of its own (:func:`disk.private_mounts`); without them the
    same sequence makes an unclean disk, which the assembler refuses."""
    raw = tmp_path / "disk.raw"
    child = subprocess.Popen(
        [sys.executable, "-c", _ASSEMBLE_AND_WAIT, str(raw), "private" if private else "host"],
        cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    copy_holder: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "mounted").exists():
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()[0]
            time.sleep(0.05)
        root = (tmp_path / "mounted").read_text()
        copy_holder = subprocess.Popen(["unshare", "--mount", "sleep", "120"])
        ns_mounts = Path(f"/proc/{copy_holder.pid}/mountinfo")
        while Path(f"/proc/{copy_holder.pid}/ns/mnt").resolve() == Path("/proc/self/ns/mnt").resolve():
            time.sleep(0.05)
        assert (f" {root} " in ns_mounts.read_text()) is not private, "the new namespace copied the host's mounts"
        (tmp_path / "go").write_text("")
        out = child.communicate(timeout=120)[0]
    finally:
        if copy_holder is not None:
            copy_holder.kill()
            copy_holder.wait()
        if child.poll() is None:
            child.kill()
    if private:
        assert child.returncode == 0, out
        assert check_raw(raw).ok
    else:
        assert child.returncode == 3, out
        assert "not clean after unmounting" in out and "needs_recovery" in out


def source_config(tmp_path: Path, raw: Path, name: str) -> Path:
    qcow2 = tmp_path / f"{name}.qcow2"
    subprocess.run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(qcow2)], check=True)
    digest = subprocess.run(["sha256sum", str(qcow2)], capture_output=True, text=True, check=True).stdout.split()[0]
    config = tmp_path / f"{name}.json"
    config.write_text(json.dumps({"source_image_url": str(qcow2), "source_image_checksum": f"sha256:{digest}"}))
    return config


@pytest.mark.parametrize(
    ("name", "damage", "message"),
    [
        ("zeroed", lambda fh: (fh.seek(PARTITION_OFFSET), fh.write(bytes(512))), "is all zeros"),
        ("good", None, None),
    ],
)
def test_build_refuses_a_broken_source_image_in_seconds(
    good: Path, tmp_path: Path, name: str, damage: Callable[..., object] | None, message: str | None
) -> None:
    raw = copy(good, tmp_path / f"{name}.raw")
    if damage:
        with raw.open("r+b") as fh:
            damage(fh)
    config = source_config(tmp_path, raw, name)
    out = tmp_path / "out"
    args = ["build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--offline"]
    start = time.monotonic()
    res = run(*args, "--baremetal-config", str(config), "--output-dir", str(out), "--dry-run")
    assert time.monotonic() - start < 30
    if message:
        assert res.code == 2, res.out + res.err
        assert f"{config}: source_image_url: the source image is unfit to build from" in res.err
        assert message in res.err
    else:
        assert res.code == 0, res.err
        assert "source image:" in res.out and "consistent" in res.out
    assert not out.exists(), "a dry run creates nothing"


def test_build_refuses_a_dirty_source_image(good: Path, tmp_path: Path) -> None:
    with mounted_and_written(good, tmp_path) as raw:
        config = source_config(tmp_path, raw, "dirty")
    args = ["build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--offline"]
    res = run(*args, "--baremetal-config", str(config), "--dry-run")
    assert res.code == 2
    assert "was not unmounted cleanly (needs_recovery)" in res.err


def test_tools_are_there() -> None:
    for tool in ("extlinux", "debugfs", "dumpe2fs", "e2fsck", "sfdisk", "qemu-img", "setsid"):
        assert shutil.which(tool), f"{tool} missing: run ./scripts/setup.sh"
