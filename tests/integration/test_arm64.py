"""arm64 node images on this amd64 host (issue 46), against the real components: Debian's arm64 packages installed
by debootstrap through qemu-user-static and binfmt_misc, GRUB's arm64 EFI loader, and a boot under
qemu-system-aarch64 with AAVMF (TCG) to a login prompt; ``build --arch arm64``'s plan against a mirror."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from imagebuilder.core.arch import arch, elf_machine
from imagebuilder.core.disk import mounted_root, raw_view
from imagebuilder.image.bootcheck import check_raw
from tests.support.common import BIN, ROOT, run

ARM64 = arch("arm64")
pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def arm64_base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """``image.base --arch arm64`` for real (and how long it took: debootstrap runs every package script under
    qemu-user)."""
    dest = tmp_path_factory.mktemp("arm64") / "debian-arm64.qcow2"
    start = time.monotonic()
    proc = subprocess.run([str(BIN / "image-builder"), "image.base", "--arch", "arm64", "--dest", str(dest)],
                          cwd=ROOT, capture_output=True, text=True, timeout=5400, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "--arch=arm64" in proc.stdout and "-O arm64-efi" in proc.stdout, proc.stdout[-3000:]
    return dest, time.monotonic() - start


def test_the_arm64_base_is_an_arm64_system_that_boots_by_uefi_only(arm64_base: tuple[Path, float]) -> None:
    image, seconds = arm64_base
    print(f"image.base --arch arm64: {seconds:.0f} s")
    with raw_view(image) as raw:
        check = check_raw(raw)
        assert check.ok, check.problems
        assert check.uefi_arches == ["arm64"] and "UEFI only: no BIOS boot code" in check.notes, check.notes
        with mounted_root(raw) as root:
            for program in ("usr/bin/bash", "usr/lib/systemd/systemd", "usr/sbin/sshd", "usr/bin/python3"):
                assert elf_machine((root / program).resolve()) == ARM64.elf_machine, program
            assert sorted(p.name for p in (root / "boot").glob("vmlinuz-*"))[-1].endswith("-arm64")
            grub = (root / "boot/grub/grub.cfg").read_text()
            assert "console=ttyAMA0" in grub and "serial --unit" not in grub
            assert not (root / "boot/extlinux").exists()
            assert (root / "usr/lib/grub/arm64-efi/linux.mod").is_file()


@pytest.mark.qemu
def test_the_arm64_base_boots_under_qemu_system_aarch64_with_aavmf(arm64_base: tuple[Path, float]) -> None:
    from imagebuilder.build.verify import boot_test

    found = boot_test(arm64_base[0], timeout=1800, machine=ARM64)
    assert found.ok, found.detail
    assert "UEFI, AAVMF" in found.detail and "tcg" in found.detail
    print(f"arm64 boot: {found.detail}")


def test_the_dry_run_says_what_an_arm64_base_is(tmp_path: Path) -> None:
    res = run("image.base", "--arch", "arm64", "--dest", str(tmp_path / "b.qcow2"), "--dry-run")
    assert res.code == 0, res.err
    assert "bookworm arm64" in res.out and "linux-image-arm64" in res.out and "grub-efi-arm64-bin" in res.out
    assert "UEFI only" in res.out and "ttyAMA0" in res.out
    assert not (tmp_path / "b.qcow2").exists()
    bad = run("image.base", "--arch", "aarch64", "--dest", str(tmp_path / "b.qcow2"), "--dry-run")
    assert bad.code == 2 and "did you mean 'arm64'" in bad.err


def test_build_plans_arm64_from_the_manifest_and_refuses_it_at_the_engine(mirror_dir: Path) -> None:
    """The plan resolves arm64 first (the release's arm64 artifacts, the line's runtime for arm64: a mirror made for
    amd64 lacks it, and says so), then the engines refuse: nothing is built half-right under an arm64 name until
    they build it."""
    args = ["build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--arch", "arm64",
            "--dry-run", "--mirror", str(mirror_dir), "--offline"]  # fmt: skip
    res = run(*args)
    assert res.code == 2 and "containerd-1.7.28-linux-arm64.tar.gz.sha256sum" in res.err, res.out + res.err
    assert "not found" in res.err and "--mirror" in res.err
    res = run(*args, "--runtime", "os")
    assert res.code == 2 and "--arch: the packer engine does not build arm64 images yet" in res.err, res.err
