"""host.prepare (spec 4.3) in a throwaway root: a Debian system made by debootstrap, checked with testinfra's
chroot backend. Never touches the machine running the tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import testinfra

from tests.support.common import run

MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
SUITE = os.environ.get("DEBIAN_SUITE", "bookworm")


@pytest.fixture(scope="module")
def throwaway_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("hostprep") / "root"
    assert shutil.which("debootstrap"), "debootstrap is missing: run ./scripts/setup.sh"
    proc = subprocess.run(
        ["debootstrap", "--variant=minbase", SUITE, str(root), MIRROR], capture_output=True, text=True, timeout=1200
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    shutil.copy("/etc/resolv.conf", root / "etc" / "resolv.conf")
    # the host's KVM device, as a node inside the throwaway root (mode as the kernel creates it)
    os.mknod(root / "dev" / "kvm", 0o600 | 0o020000, os.makedev(10, 232))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def prepare(root: Path, *extra: str) -> tuple[int, str, str]:
    # the first run installs the KVM and libvirt packages into the root: minutes when the other workers' guests
    # share the cores (it took over two here)
    res = run(
        "host.prepare",
        "--root",
        str(root),
        "--hypervisor",
        "baremetal",
        "--http-proxy",
        "http://proxy.example:3128",
        "--no-proxy",
        "localhost,127.0.0.1",
        *extra,
        timeout=900,
    )
    return res.code, res.out, res.err


def test_dry_run_lists_changes_and_changes_nothing(throwaway_root: Path) -> None:
    before = (throwaway_root / "etc" / "passwd").read_text()
    code, out, err = prepare(throwaway_root, "--dry-run")
    assert code == 0, err
    for change in ("install packages:", "create user image-builder", "65-kvm.rules", "/dev/kvm", ".ssh/config"):
        assert change in out
    assert "qemu-system-x86" in out and "libguestfs-tools" in out  # bookworm's name for qemu-kvm
    assert (throwaway_root / "etc" / "passwd").read_text() == before
    assert not (throwaway_root / "etc" / "udev" / "rules.d" / "65-kvm.rules").exists()


def test_prepare_then_verify_with_testinfra(throwaway_root: Path) -> None:
    code, out, err = prepare(throwaway_root)
    assert code == 0, out + err
    host = testinfra.get_host(str(throwaway_root), connection="chroot")

    user = host.user("image-builder")
    assert user.exists and user.shell == "/bin/bash"
    assert {"sudo", "kvm"} <= set(user.groups)
    assert host.file("/home/image-builder").is_directory

    for pkg in ("jq", "unzip", "make", "ansible", "python3-pip", "yq", "qemu-system-x86", "libvirt-daemon-system",
                "libvirt-clients", "virtinst", "cpu-checker", "libguestfs-tools", "libosinfo-bin"):  # fmt: skip
        assert host.package(pkg).is_installed, pkg
    assert host.exists("kvm-ok") and host.exists("virt-install") and host.exists("jq")

    kvm = host.file("/dev/kvm")
    assert host.run("test -c /dev/kvm").rc == 0
    assert kvm.mode == 0o666 and kvm.user == "root" and kvm.group == "kvm"
    assert (
        host.file("/etc/udev/rules.d/65-kvm.rules").content_string.strip() == 'KERNEL=="kvm", GROUP="kvm", MODE="0666"'
    )

    ssh = host.file("/home/image-builder/.ssh/config")
    assert ssh.user == "image-builder" and ssh.mode == 0o600
    assert ssh.content_string.splitlines() == ["HostKeyAlgorithms +ssh-rsa", "PubkeyAcceptedKeyTypes +ssh-rsa"]

    proxy = host.file("/etc/profile.d/image-builder-proxy.sh").content_string
    assert "export HTTP_PROXY='http://proxy.example:3128'" in proxy
    assert "export no_proxy='localhost,127.0.0.1'" in proxy
    assert not host.file("/usr/sbin/policy-rc.d").exists  # the install-time guard is gone


def test_rerun_converges_and_repairs_drift(throwaway_root: Path) -> None:
    code, out, _ = prepare(throwaway_root)
    assert code == 0 and "nothing to change" in out
    # drift: the user leaves group kvm, the device loses its mode, a line of the SSH config is removed
    subprocess.run(
        ["chroot", str(throwaway_root), "gpasswd", "-d", "image-builder", "kvm"], check=True, capture_output=True
    )
    os.chmod(throwaway_root / "dev" / "kvm", 0o600)
    cfg = throwaway_root / "home" / "image-builder" / ".ssh" / "config"
    cfg.write_text("Host *\nHostKeyAlgorithms +ssh-rsa\n")
    code, out, err = prepare(throwaway_root)
    assert code == 0, err
    assert "add image-builder to group kvm" in out and "set /dev/kvm" in out and "PubkeyAcceptedKeyTypes" in out
    assert cfg.read_text().splitlines() == ["Host *", "HostKeyAlgorithms +ssh-rsa", "PubkeyAcceptedKeyTypes +ssh-rsa"]
    assert "nothing to change" in prepare(throwaway_root)[1]


def test_bad_root_is_bad_input(tmp_path: Path) -> None:
    res = run("host.prepare", "--root", str(tmp_path), "--dry-run")
    assert res.code == 2 and "not a root filesystem" in res.err
    # an etc/ without the account files it reads is refused the same way, not a crash
    (tmp_path / "etc").mkdir()
    res = run("host.prepare", "--root", str(tmp_path), "--dry-run")
    assert res.code == 2 and "no etc/passwd" in res.err and "Traceback" not in res.err, res.err
