"""Preflight: each failure with its fix (from host facts), and the real gathering on this machine."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from imagebuilder.core.hostinfo import kvm_status
from imagebuilder.host.preflight import GIB, HostFacts
from tests.support.common import run
from tests.support.preflight import GOOD, UBUNTU_BM, catalog

UBUNTU_AMI = catalog.build_pair(catalog.os("ubuntu"), catalog.provider("ami"))


@pytest.mark.slow
def test_gathering_real_facts_on_this_host() -> None:
    facts = HostFacts.gather(UBUNTU_BM)
    assert facts.cpus >= 1 and facts.memory_bytes > 0 and facts.disk_free_bytes > 0
    assert facts.tools["packer"] and "Packer" in facts.tools["packer"]
    assert facts.tools["qemu-img"]
    assert facts.kvm is not None
    assert HostFacts.gather(UBUNTU_AMI).kvm is None  # no QEMU, no KVM probe


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


def test_preflight_arch_checks_that_arm64_programs_run_here(tmp_path: Path) -> None:
    """``preflight --arch arm64`` on this host, where ./scripts/setup.sh registered qemu-user-static's handler: the
    arch check says how arm64 programs run; a pair not built for arm64 and a synonym are refused (exit 2) naming
    why, before any check runs."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    env = {"HOME": str(home)}
    base = ("preflight", "--os", "ubuntu", "--hypervisor", "baremetal", "--skip-check", "host-os", "--skip-check",
            "packer", "--min-disk-gb", "1")  # fmt: skip
    res = run(*base, "--arch", "arm64", env=env)
    assert res.code == 0, res.out + res.err
    assert "[ok  ] arch     x86_64; arm64 programs run by qemu-user (binfmt_misc qemu-aarch64)" in res.out, res.out
    assert "arm64 programs" not in run(*base, env=env).out
    refused = run("preflight", "--os", "ubuntu", "--hypervisor", "vsphere", "--arch", "arm64", env=env)
    assert refused.code == 2 and "ubuntu on vsphere is not built for arm64" in refused.err, refused.err
    assert "[ok" not in refused.out, "refused before any check"
    synonym = run(*base, "--arch", "aarch64", env=env)
    assert synonym.code == 2 and "did you mean 'arm64'" in synonym.err, synonym.err


@pytest.mark.root
def test_the_disk_check_follows_the_work(tmp_path: Path) -> None:
    """A workspace on a small filesystem of its own (a loop-mounted ext4): a build whose work fits passes the disk
    check, one whose work does not is refused before anything starts, naming the folder, the space found and the
    space needed; with no build planned, spec 8's 50 GB is advice (a warning), not a refusal."""
    import json
    import os
    import subprocess

    from imagebuilder.builder.disk_need import disk_need
    from imagebuilder.builder.resolve import make_plan
    from imagebuilder.host.preflight import check_disk
    from imagebuilder.plan.model import BuildRequest

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
