"""Preflight: each failure with its fix (from host facts), and the real gathering on this machine."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from imagebuilder.build.packer_plugins import PackerInfo, PluginCheck, PluginState, Version, requirements_for
from imagebuilder.core.errors import InputError
from imagebuilder.core.hostinfo import CHECKS, KvmStatus, kvm_status
from imagebuilder.host.preflight import GIB, HostFacts, run_checks
from imagebuilder.release.catalog import load_catalog
from tests.support.common import run

catalog = load_catalog()
UBUNTU_BM = catalog.build_pair(catalog.os("ubuntu"), catalog.provider("baremetal"))
REDHAT_CS = catalog.build_pair(catalog.os("redhat"), catalog.provider("cloudstack"))
UBUNTU_AMI = catalog.build_pair(catalog.os("ubuntu"), catalog.provider("ami"))

GOOD = HostFacts(
    os_release={"ID": "ubuntu", "VERSION_ID": "22.04", "PRETTY_NAME": "Ubuntu 22.04.4 LTS"},
    machine="x86_64",
    cpus=2,
    memory_bytes=int(7.7 * GIB),
    disk_path=Path("/var"),
    disk_free_bytes=60 * GIB,
    tools={"packer": "Packer v1.9.4", "ansible-playbook": "2.15", "ssh-keygen": "/usr/bin/ssh-keygen"},
    kvm=KvmStatus(True, "usable"),
    ssh_config="Host *\nHostKeyAlgorithms +ssh-rsa\nPubkeyAcceptedKeyTypes +ssh-rsa\n",
    packer=PluginCheck(
        PackerInfo("/usr/bin/packer", (1, 9, 4)),
        Path("/root/.config/packer/plugins"),
        (
            PluginState(requirements_for(["qemu"])[0], "installed", (Version.parse("1.1.4"),)),
            PluginState(requirements_for(["qemu"])[1], "installed", (Version.parse("1.1.6"),)),
        ),
    ),
)


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


@pytest.mark.slow
def test_gathering_real_facts_on_this_host() -> None:
    facts = HostFacts.gather(UBUNTU_BM)
    assert facts.cpus >= 1 and facts.memory_bytes > 0 and facts.disk_free_bytes > 0
    assert facts.tools["packer"] and "Packer" in facts.tools["packer"]
    assert facts.tools["qemu-img"]
    assert facts.kvm is not None
    assert HostFacts.gather(UBUNTU_AMI).kvm is None  # no QEMU, no KVM probe


def test_kvm_probe_is_real_and_can_be_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    status = kvm_status()
    assert status.accelerator in ("kvm", "tcg") and status.reason
    assert not kvm_status("/dev/no-such-kvm").usable
    monkeypatch.setenv("IMAGE_BUILDER_ACCEL", "tcg")
    assert kvm_status().accelerator == "tcg"


@pytest.mark.root
def test_the_kvm_probe_is_kept_for_the_later_runs_of_this_boot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The boot probe costs seconds under nested virtualization: a later run (nothing in its memory) reuses the
    answer while nothing it depends on changed, and never trusts a file others could have written."""
    from imagebuilder.core import hostinfo

    monkeypatch.setattr(hostinfo, "PROBE_CACHE_DIR", tmp_path / "run")
    monkeypatch.setattr(hostinfo, "_PROBED", {})
    first = kvm_status()  # probes for real (QEMU under KVM) and keeps the answer
    kept = tmp_path / "run" / "kvm-probe.json"
    assert kept.stat().st_mode & 0o777 == 0o600 and (tmp_path / "run").stat().st_mode & 0o777 == 0o700
    calls: list[float] = []

    def probe(timeout: float) -> str:
        calls.append(timeout)
        return "probed again"

    monkeypatch.setattr(hostinfo, "_kvm_boot_probe", probe)
    monkeypatch.setattr(hostinfo, "_PROBED", {})
    assert kvm_status() == first and not calls, "a later run of this boot reuses the answer"
    # what it depends on changed (another boot, the device's mode or owner, the QEMU binary): probed again
    kept.write_text(kept.read_text().replace(str(hostinfo._probe_key("/dev/kvm")), "0" * 64))
    monkeypatch.setattr(hostinfo, "_PROBED", {})
    assert kvm_status().reason == "probed again" and len(calls) == 1
    # the answer written then is the probe's; a copy others may write is ignored, and so is a malformed one
    for text, mode in (kept.read_text().replace('"probed again"', "null"), 0o666), ("{not json", 0o600):
        kept.write_text(text)
        kept.chmod(mode)
        monkeypatch.setattr(hostinfo, "_PROBED", {})
        assert kvm_status().reason == "probed again"
    assert len(calls) == 3 and kept.stat().st_mode & 0o777 == 0o600


def test_preflight_cli(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    env = {"HOME": str(home)}
    res = run(
        "preflight",
        "--os",
        "ubuntu",
        "--hypervisor",
        "ami",
        "--skip-check",
        "host-os",
        "--min-disk-gb",
        "999999",
        env=env,
    )
    assert res.code == 1 and "[FAIL] disk" in res.out and "fix: free space" in res.out
    assert "[WARN] ssh-rsa" in res.out and "preflight failed: disk" in res.err
    ok = run(
        "preflight", "--os", "os2", "--hypervisor", "ami", "--skip-check", "host-os", "--min-disk-gb", "1", env=env
    )
    assert ok.code == 0, ok.out + ok.err
    assert run("preflight", "--os", "ubuntu", "--hypervisor", "ami", "--skip-check", "nope", env=env).code == 2


@pytest.mark.root
def test_the_disk_check_follows_the_work(tmp_path: Path) -> None:
    """A workspace on a small filesystem of its own (a loop-mounted ext4): a build whose work fits passes the disk
    check, one whose work does not is refused before anything starts, naming the folder, the space found and the
    space needed; with no build planned, spec 8's 50 GB is advice (a warning), not a refusal."""
    import json
    import os
    import subprocess

    from imagebuilder.build.disk_need import disk_need
    from imagebuilder.build.plan import BuildRequest
    from imagebuilder.build.resolve import make_plan
    from imagebuilder.host.preflight import check_disk

    mounts = {}
    for name, size in (("small", "600M"), ("roomy", "16G")):
        backing = tmp_path / f"{name}.img"
        subprocess.run(["truncate", "-s", size, str(backing)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(backing)], check=True)
        mnt = tmp_path / name
        mnt.mkdir()
        subprocess.run(["mount", "-o", "loop", str(backing), str(mnt)], check=True)
        mounts[name] = mnt
    try:
        config = tmp_path / "bm.json"
        src = tmp_path / "source.qcow2"
        subprocess.run(["qemu-img", "create", "-f", "qcow2", str(src), "4G"], check=True, capture_output=True)
        digest = subprocess.run(["sha256sum", str(src)], capture_output=True, text=True, check=True).stdout.split()[0]
        config.write_text(json.dumps({"source_image_url": str(src), "source_image_checksum": f"sha256:{digest}"}))
        for name, fits in (("small", False), ("roomy", True)):
            env = {**os.environ, "IMAGE_BUILDER_WORKSPACE": str(mounts[name] / "work")}
            os.environ["IMAGE_BUILDER_WORKSPACE"] = env["IMAGE_BUILDER_WORKSPACE"]
            try:
                plan = make_plan(BuildRequest(os="ubuntu", hypervisor="baremetal", release_channel="1-24",
                                              configs={"baremetal": str(config)}, offline=True, disk_gb=4,
                                              engine="packer", output_dir=str(mounts[name] / "out")))  # fmt: skip
                need = disk_need(plan)
                facts = dataclasses.replace(GOOD, disk_path=mounts[name], need=need,
                                            disk_free_bytes=os.statvfs(mounts[name]).f_bavail * 4096)  # fmt: skip
                check = check_disk(facts, None, 50)
            finally:
                del os.environ["IMAGE_BUILDER_WORKSPACE"]
            assert (check.status == "ok") is fits, check
            assert str(mounts[name]) in check.detail and "this build needs" in check.detail
            if not fits:
                assert "GiB free under" in check.detail and "IMAGE_BUILDER_WORKSPACE" in (check.fix or "")
                # the real run stops there: preflight, before the workspace or the output is made
                res = run("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24",
                          "--baremetal-config", str(config), "--offline", "--disk-gb", "4", "--engine", "packer",
                          "--output-dir", str(mounts[name] / "out"), env=env)  # fmt: skip
                assert res.code != 0 and "[FAIL] disk" in res.out and "preflight failed" in res.err, res.out + res.err
                assert not (mounts[name] / "out").exists() and not (mounts[name] / "work").exists()
        advice = check_disk(dataclasses.replace(GOOD, disk_free_bytes=10 * GIB), None, 50)
        assert advice.status == "warn" and "spec 8" in advice.detail
        # host.prepare gives spec 8's figure as advice for the workspace's filesystem, and still prepares the host
        from imagebuilder.host.prepare import disk_advice

        small = disk_advice(mounts["small"] / "work")
        assert small is not None and "50 GB" in small and str(mounts["small"]) in small
        (tmp_path / "host" / "etc").mkdir(parents=True)
        (tmp_path / "host" / "etc" / "group").write_text("root:x:0:\n")
        (tmp_path / "host" / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
        res = run("host.prepare", "--root", str(tmp_path / "host"), "--dry-run",
                  env={**os.environ, "IMAGE_BUILDER_WORKSPACE": str(mounts["roomy"] / "work")})  # fmt: skip
        assert "advice: spec 8" in res.out and str(mounts["roomy"]) in res.out, res.out + res.err
    finally:
        for mnt in mounts.values():
            subprocess.run(["umount", str(mnt)], check=False)
