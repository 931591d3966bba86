"""An emulated guest's throwaway copy (imagebuilder.image.emulation), on the run's real base image: its systemd waits
15 minutes for devices (seen in a real boot under TCG, where a device that never comes shows its job's 15min), the
node check's amd64 copy boots with ``tsc=reliable`` on every kernel line (GRUB's and EXTLINUX's), the image itself is
untouched, and a link in a hostile image never leads the copy's writes onto the host."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from imagebuilder.core.arch import arch
from imagebuilder.core.disk import copy_sparse, mounted_root, raw_view
from imagebuilder.core.errors import InputError
from imagebuilder.core.files import sha256_file
from imagebuilder.image import emulation, qemu
from tests.support.common import vm_turn

pytestmark = [pytest.mark.root, pytest.mark.timeout(1800)]
AMD64 = arch("amd64")


def test_the_copy_waits_for_devices_boots_with_the_clock_and_leaves_the_image_as_it_was(
    base_image: tuple[Path, str], tmp_path: Path
) -> None:
    with raw_view(base_image[0], work_dir=tmp_path) as raw:
        before = sha256_file(raw)
        copy, detail = emulation.patched_copy(raw, tmp_path, AMD64, clock=True)
        assert sha256_file(raw) == before, "the image is never changed"
    assert detail == "systemd waits 900 s for devices, booted with tsc=reliable (emulated under TCG)", detail
    with mounted_root(copy) as root:
        drop_in = root / emulation.DEVICE_DROP_IN
        assert "[Unit]\nJobRunningTimeoutSec=900\n" in drop_in.read_text()
        assert oct(drop_in.stat().st_mode & 0o777) == "0o644" and drop_in.stat().st_uid == 0
        grub = (root / "boot/grub/grub.cfg").read_text()
        extlinux = (root / "boot/extlinux/extlinux.conf").read_text()
    kernel_lines = [line for line in grub.splitlines() if line.split()[:1] == ["linux"]]
    kernel_lines += [line for line in extlinux.splitlines() if line.split()[:1] == ["APPEND"]]
    assert len(kernel_lines) == 2 and all(line.split().count("tsc=reliable") == 1 for line in kernel_lines)
    # a plain boot test's copy gets the wait and no clock
    with raw_view(base_image[0], work_dir=tmp_path / "plain") as raw:
        plain, detail = emulation.patched_copy(raw, tmp_path / "plain", AMD64)
    assert detail == "systemd waits 900 s for devices (emulated under TCG)", detail
    with mounted_root(plain) as root:
        assert "tsc=reliable" not in (root / "boot/grub/grub.cfg").read_text()


def test_a_link_in_the_image_never_leads_the_copys_writes_onto_the_host(
    base_image: tuple[Path, str], tmp_path: Path
) -> None:
    """A hostile image whose /etc/systemd/system is a link to a folder of the host's (absolute, as a link in an
    image names it): the copy is refused, naming the image's folder, and nothing is written on the host."""
    host = tmp_path / "host-systemd"
    host.mkdir()
    hostile = tmp_path / "hostile.raw"
    with raw_view(base_image[0], work_dir=tmp_path) as raw:
        copy_sparse(raw, hostile)
    with mounted_root(hostile, writable=True) as root:
        systemd = root / "etc/systemd/system"
        systemd.rename(root / "etc/systemd/system.real")
        os.symlink(str(host), systemd)
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(InputError) as refused:
        emulation.patched_copy(hostile, work, AMD64)
    assert "the image's systemd folder" in str(refused.value) and "symbolic link" in str(refused.value)
    assert list(host.iterdir()) == [], "nothing written through the link"


@pytest.mark.qemu
def test_an_emulated_boot_waits_15_minutes_for_a_device(base_image: tuple[Path, str], tmp_path: Path) -> None:
    """The copy of an image whose fstab names a disk that never comes, booted under TCG: systemd's job for that
    device runs against 15 minutes, not its 1min 30s (which Debian 12's systemd still gave it with the kernel's
    systemd.default_timeout_start_sec=900: measured). The guest is stopped once the job's wait shows."""
    with raw_view(base_image[0], work_dir=tmp_path) as raw:
        copy = emulation.patched_copy(raw, tmp_path, AMD64).path
    with mounted_root(copy, writable=True) as root, (root / "etc/fstab").open("a") as fstab:
        fstab.write("UUID=dead-beef /mnt/never vfat defaults 0 0\n")
    shown = ""
    with vm_turn(), qemu.running(copy, serial=tmp_path / "serial.log", snapshot=True, cpus=1) as guest:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and not shown:
            jobs = [line for line in guest.console(0).splitlines() if "Job dev-disk-by" in line and "running (" in line]
            shown = jobs[-1] if jobs else ""
            assert not guest.exited(), guest.console()
            time.sleep(2)
    assert shown, f"no job for the missing device shown within 15 minutes: {guest.console()[-2000:]}"
    assert shown.rstrip().endswith("/ 15min)"), shown


def test_the_emulated_arm64_cpu_is_one_this_qemu_runs() -> None:
    """The CPU options an emulated arm64 guest gets are ones this host's qemu-system-aarch64 accepts: it starts with
    them (paused, no disk) and quits when its monitor says so."""
    import subprocess

    args = emulation.machine_args(arch("arm64"))
    assert "max,pauth-impdef=on" in args
    res = subprocess.run(["qemu-system-aarch64", *args, "-accel", "tcg", "-display", "none", "-nodefaults", "-S",
                          "-monitor", "stdio"], input="info status\nquit\n", capture_output=True, text=True,
                         timeout=60, check=False)  # fmt: skip
    assert res.returncode == 0 and "VM status: paused" in res.stdout, res.stdout + res.stderr
