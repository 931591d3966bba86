"""Preflight: each failure with its fix, from host facts given in process (the real gathering on this machine and
the task: tests/integration/test_preflight.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from imagebuilder.builder.packer_plugins import PluginState, Version, requirements_for
from imagebuilder.core import arch as arch_module
from imagebuilder.core.errors import InputError
from imagebuilder.core.hostinfo import CHECKS, KvmStatus, kvm_status
from imagebuilder.host.preflight import GIB, run_checks
from tests.support.preflight import GOOD, UBUNTU_BM, catalog

REDHAT_CS = catalog.build_pair(catalog.os("redhat"), catalog.provider("cloudstack"))


def by_name(checks: list) -> dict:  # type: ignore[type-arg]
    return {c.name: c for c in checks}


def test_the_packer_check_shows_each_plugin_and_fails_on_a_missing_one() -> None:
    assert GOOD.packer is not None and not isinstance(GOOD.packer, str)
    ok = by_name(run_checks(UBUNTU_BM, GOOD))["packer"]
    assert ok.status == "ok" and "packer 1.9.4 (/usr/bin/packer)" in ok.detail and "qemu 1.1.4 installed" in ok.detail
    qemu, ansible = requirements_for(["qemu"])
    missing = dataclasses.replace(GOOD.packer, states=(PluginState(qemu, "missing", (Version.parse("1.0.5"),)),
                                                      PluginState(ansible, "packer init")))  # fmt: skip
    check = by_name(run_checks(UBUNTU_BM, dataclasses.replace(GOOD, packer=missing)))["packer"]
    assert check.status == "fail" and "qemu: MISSING, needs github.com/hashicorp/qemu >= 1.0.9, installed: 1.0.5" in (
        check.detail
    )
    assert "install qemu" in (check.fix or "") and "'packer init' will install" in check.detail
    pending = dataclasses.replace(GOOD.packer, states=(PluginState(ansible, "packer init"),))
    assert by_name(run_checks(UBUNTU_BM, dataclasses.replace(GOOD, packer=pending)))["packer"].status == "warn"
    broken = by_name(run_checks(UBUNTU_BM, dataclasses.replace(GOOD, packer="'x version' printed nothing")))
    assert broken["packer"].status == "fail" and "--packer PATH" in (broken["packer"].fix or "")


def test_a_good_host_passes_every_check() -> None:
    checks = run_checks(UBUNTU_BM, GOOD)
    assert [c.name for c in checks] == list(CHECKS)
    assert {c.status for c in checks} == {"ok"}


@pytest.mark.parametrize(
    ("change", "name", "fix"),
    [
        ({"os_release": {"ID": "ubuntu", "VERSION_ID": "20.04"}}, "host-os", "22.04"),
        ({"os_release": {"ID": "fedora", "VERSION_ID": "39"}}, "host-os", "--skip-check host-os"),
        ({"machine": "aarch64"}, "arch", "AMD64"),
        ({"cpus": 1}, "cpus", "2 vCPUs"),
        ({"memory_bytes": 4 * GIB}, "memory", "8 GB"),
        ({"tools": {"packer": None, "ansible-playbook": "2.15", "ssh-keygen": "x"}}, "tools", "setup.sh"),
    ],
)
def test_each_failure_names_its_fix(change: dict, name: str, fix: str) -> None:  # type: ignore[type-arg]
    checks = by_name(run_checks(UBUNTU_BM, dataclasses.replace(GOOD, **change)))
    assert checks[name].status == "fail"
    assert fix in (checks[name].fix or "")
    assert [c for c in checks.values() if c.status == "fail"] == [checks[name]]


def test_missing_ssh_rsa_lines_warn_with_the_fix() -> None:
    check = by_name(run_checks(UBUNTU_BM, dataclasses.replace(GOOD, ssh_config="HostKeyAlgorithms +ssh-rsa\n")))
    assert check["ssh-rsa"].status == "warn"
    assert "PubkeyAcceptedKeyTypes" in check["ssh-rsa"].detail and "host.prepare" in (check["ssh-rsa"].fix or "")


def test_redhat_images_need_a_redhat_family_host() -> None:
    checks = by_name(run_checks(REDHAT_CS, GOOD))
    assert checks["host-os"].status == "fail" and "rhel 8.4+" in checks["host-os"].detail
    rocky = dataclasses.replace(GOOD, os_release={"ID": "rocky", "VERSION_ID": "8.9"})
    assert by_name(run_checks(REDHAT_CS, rocky))["host-os"].status == "ok"
    old = dataclasses.replace(GOOD, os_release={"ID": "rhel", "VERSION_ID": "8.2"})
    assert by_name(run_checks(REDHAT_CS, old))["host-os"].status == "fail"


def test_unusable_kvm_warns_and_falls_back_to_tcg() -> None:
    facts = dataclasses.replace(GOOD, kvm=KvmStatus(False, "/dev/kvm refuses to create a virtual machine"))
    kvm = by_name(run_checks(UBUNTU_BM, facts))["kvm"]
    assert kvm.status == "warn" and "TCG" in kvm.detail and "group kvm" in (kvm.fix or "")
    assert KvmStatus(False, "x").accelerator == "tcg"


def test_min_disk_is_configurable_and_skips_are_named_only() -> None:
    small = dataclasses.replace(GOOD, disk_free_bytes=20 * GIB, cpus=1)
    checks = by_name(run_checks(UBUNTU_BM, small, min_disk_gb=15, skip=("cpus",)))
    assert checks["disk"].status == "ok" and checks["cpus"].status == "skipped"
    with pytest.raises(InputError, match="did you mean 'memory'"):
        run_checks(UBUNTU_BM, GOOD, skip=("memroy",))


def test_proxy_credentials_are_masked() -> None:
    facts = dataclasses.replace(GOOD, env={"HTTPS_PROXY": "http://alice:s3cret@proxy:3128"})
    proxy = by_name(run_checks(UBUNTU_BM, facts))["proxy"]
    assert "s3cret" not in proxy.detail and "http://alice:********@proxy:3128" in proxy.detail
    # the one redactor of every message (core.grammar): a token alone and a query's values go too
    for value, secret in (("http://TOKEN123@proxy:3128", "TOKEN123"), ("http://proxy:3128/?key=k3y", "k3y")):
        facts = dataclasses.replace(GOOD, env={"HTTPS_PROXY": value})
        assert secret not in by_name(run_checks(UBUNTU_BM, facts))["proxy"].detail


def test_kvm_probe_is_real_and_can_be_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    # the ioctls only: the boot probe starts QEMU (integration tests run it), unless a run on this boot cached it
    status = kvm_status(probe=False)
    assert status.accelerator in ("kvm", "tcg") and status.reason
    assert not kvm_status("/dev/no-such-kvm").usable
    monkeypatch.setenv("IMAGE_BUILDER_ACCEL", "tcg")
    assert kvm_status().accelerator == "tcg"


def _binfmt(root: Path, handler: str | None) -> Path:
    """A binfmt_misc folder as the kernel shows it: ``register`` and, when given, the qemu-aarch64 handler's text."""
    root.mkdir()
    (root / "register").write_text("")
    if handler is not None:
        (root / "qemu-aarch64").write_text(handler)
    return root


@pytest.mark.parametrize(
    ("handler", "problem"),
    [
        (None, "no binfmt_misc handler qemu-aarch64"),
        ("disabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: POCF\n", "is disabled"),
        ("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: P\n", "lacks the F flag"),
    ],
)
def test_an_arm64_image_needs_its_programs_to_run_here_and_the_fix_names_the_package(
    handler: str | None, problem: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arch_module, "BINFMT_DIR", _binfmt(tmp_path / "binfmt_misc", handler))
    check = by_name(run_checks(UBUNTU_BM, GOOD, target="arm64"))["arch"]
    assert check.status == "fail" and problem in check.detail and "arm64 images" in check.detail, check
    assert "qemu-user-static" in (check.fix or "") and "qemu-aarch64" in (check.fix or "")
    # an amd64 image on the same host needs none of it
    assert by_name(run_checks(UBUNTU_BM, GOOD))["arch"].status == "ok"


def test_an_arm64_image_on_a_host_that_runs_arm64_programs_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handler = "enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: POCF\n"
    monkeypatch.setattr(arch_module, "BINFMT_DIR", _binfmt(tmp_path / "binfmt_misc", handler))
    check = by_name(run_checks(UBUNTU_BM, GOOD, target="arm64"))["arch"]
    assert check.status == "ok" and "arm64 programs run by qemu-user" in check.detail, check
