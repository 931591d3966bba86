"""Local OVAs and bare-metal images built offline for real on every Packer users run, inside a network namespace with
nothing but loopback, from image.base's image and the mirror:

- Debian's Packer 1.6.6 (plugins built in): the local OVA, its OVF and manifest checked, image.verify (testinfra on
  the mounted image, then a boot to a login prompt), then imported into vcsim as a tagged template that
  template.validate accepts (its bare-metal build is tests/test_e2e_offline.py's);
- Packer 1.9.4 and 1.16.0, built from their release sources with their real plugins: the bare-metal build
  (``--engine packer``: the qemu and ansible plugins) and the local OVA, the plugins installed offline from
  ``--packer-plugins`` into the user's own plugin folder, image.verify on each, and image.diff of each OVA against
  1.6.6's (the same inputs: no unexpected difference between the Packer generations).

Apart from the bare-metal source-release build (tests/test_e2e_offline.py) so that a parallel run builds both at
once."""

from __future__ import annotations

import json
import os
import random
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from imagebuilder.attest.provenance import payload_of
from imagebuilder.attest.sbom import package_names
from imagebuilder.build.verify import verify_image
from imagebuilder.image.diff import diff_images
from tests.support import packers
from tests.support.attest import check_sbom
from tests.support.common import BIN, ROOT, ArgvWatcher, run, run_folders, tagged, vm_turn
from tests.support.offline import build, in_ns, scan_for
from tests.support.vcsim import Vcsim

pytestmark = pytest.mark.timeout(3600)
SECRET = "vc-Pa55-never-logged-7731"
NAME = "ubuntu-v1.24.8-eks-5-amd64"


def _config(path: Path, base_image: tuple[Path, str]) -> Path:
    """A bare-metal or local OVA config: a source image (and for the OVA no vCenter, and a password that is not
    used and must never show up anywhere)."""
    image, digest = base_image
    config = {"source_image_url": str(image), "source_image_checksum": f"sha256:{digest}"}
    path.write_text(json.dumps({**config, "password": SECRET} if path.name == "vsphere.json" else config))
    return path


@dataclass(frozen=True)
class LegacyOva:
    ova: Path
    out: Path
    output: str
    argv: frozenset[str]


@pytest.fixture(scope="module")
def legacy_ova(offline_ns: str, home: Path, base_image: tuple[Path, str], mirror: Path,
               tmp_path_factory: pytest.TempPathFactory) -> LegacyOva:  # fmt: skip
    """The local OVA built by Debian's Packer 1.6.6 (the mirror directory), with every child's argv watched."""
    work = tmp_path_factory.mktemp("legacy")
    out = work / "out"
    with ArgvWatcher() as argv:
        res = build(offline_ns, home, "vsphere", _config(work / "vsphere.json", base_image), mirror, out)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return LegacyOva(out / f"{NAME}.ova", out, res.stdout + res.stderr, frozenset(argv.seen))


def test_offline_local_ova_is_valid_and_verified(legacy_ova: LegacyOva, home: Path, vcsim: Vcsim) -> None:
    ova = legacy_ova.ova
    manifest = json.loads((legacy_ova.out / f"{NAME}.build-manifest.json").read_text())
    assert manifest["tools"]["packer"] == "1.6.6"
    assert {p["action"] for p in manifest["packer_plugins"]} == {"not needed"}, "built into Packer 1.6"
    with tarfile.open(ova) as tar:
        names = tar.getnames()
        assert names[0].endswith(".ovf") and names[1].endswith(".mf") and names[2].endswith(".vmdk")
        ovf = tar.extractfile(names[0]).read().decode()  # type: ignore[union-attr]
        mf = tar.extractfile(names[1]).read().decode()  # type: ignore[union-attr]
    assert 'ovf:capacity="4294967296"' in ovf and "streamOptimized" in ovf
    assert f"SHA256({names[0]})=" in mf and f"SHA256({names[2]})=" in mf
    with vm_turn():
        findings = verify_image(ova)
    assert not [f for f in findings if not f.ok], findings
    # issue 31 on a Packer build: the sbom role ran in the build VM and handed the package list over; without
    # --signing-key the provenance is written unsigned (and says so), never signed by anything else
    doc = check_sbom(legacy_ova.out / f"{NAME}.spdx.json", ova)
    assert {"containerd", "openssh-server"} <= set(package_names(doc)), sorted(package_names(doc))[:20]
    assert manifest["sbom"]["packages"] == len(package_names(doc)) and manifest["provenance"]["signed_by"] is None
    envelope = json.loads((legacy_ova.out / f"{NAME}.intoto.json").read_text())
    assert envelope["signatures"] == [] and payload_of(envelope)["subject"][0]["name"] == ova.name
    assert "UNSIGNED: give --signing-key" in legacy_ova.output
    assert SECRET not in legacy_ova.output
    assert not scan_for(SECRET, legacy_ova.out, home / "work"), "a secret leaked into a file"
    assert not [c for c in legacy_ova.argv if SECRET in c], "a secret was in a child's argv"
    # the built OVA becomes a tagged template on vCenter (vcsim) and passes template validation
    imported = run("template.import", "--ova", str(ova), "--os", "ubuntu", "--kubernetes", "1.24", env=vcsim.env)
    assert imported.code == 0, imported.err
    path = "/DC0/vm/Templates/ubuntu-kubernetes-1-24-eks-5"
    valid = run("template.validate", "--template", path, "--os", "ubuntu", "--kubernetes", "1.24", env=vcsim.env)
    assert valid.code == 0, valid.err


#: where each Packer's first bare-metal run is killed: Packer waiting for the guest's SSH (Packer and QEMU running),
#: and Ansible provisioning it (Ansible and its ssh as well)
KILL_AT = {"1.9.4": "Waiting for SSH", "1.16.0": "TASK ["}


def oom_kill(
    ns: str, home: Path, config: Path, mirror: Path, out: Path, flags: tuple[str, ...], point: str
) -> int:  # fmt: skip
    """Start the bare-metal build, read its output up to ``point``, then SIGKILL the image-builder process alone;
    returns its pid (the run whose tag its children carry)."""
    args = ["ip", "netns", "exec", ns, str(BIN / "image-builder"), "build", "--os", "ubuntu", "--hypervisor",
            "baremetal", "--release-channel", "1-24", "--baremetal-config", str(config), "--mirror", str(mirror),
            "--offline", "--output-dir", str(out), "--disk-gb", "4", "--min-disk-gb", "10", *flags]  # fmt: skip
    env = {**os.environ, "HOME": str(home), "IMAGE_BUILDER_WORKSPACE": str(home / "work")}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # ip netns exec execs image-builder: the same process
        seen.append(line)
        if point in line:
            break
    else:
        raise AssertionError(f"the build ended before {point!r}:\n{''.join(seen[-40:])}")
    time.sleep(random.Random(29).uniform(0, 3))
    proc.kill()
    proc.wait()
    proc.stdout.close()
    return proc.pid


@pytest.mark.parametrize("version", packers.MODERN)
def test_a_modern_packer_builds_and_verifies_both_images(
    version: str, offline_ns: str, home: Path, base_image: tuple[Path, str], mirror: Path, legacy_ova: LegacyOva,
    tmp_path: Path,
) -> None:  # fmt: skip
    packer = packers.packer(version)
    plugins = packers.newest_plugins()
    # the user's own plugin folder (Packer's default under HOME): the first build installs into it, offline
    user_plugins = home / ".config/packer/plugins"
    for old in user_plugins.rglob("packer-plugin-*") if user_plugins.exists() else ():
        old.unlink()  # the other Packer's run installed them: this one installs its own way (1.9 layout, 1.16 CLI)
    out = tmp_path / "out"
    flags = ("--engine", "packer", "--packer", str(packer), "--packer-plugins", str(plugins))
    # issue 29, the Packer engine: a first run killed as the out-of-memory killer kills (that process alone) at a
    # point of its own progress; its Packer and QEMU (and, at TASK, Ansible) run on, and the build below must end
    # them and release what the killed run held before it starts its own
    point = KILL_AT[version]
    config = _config(tmp_path / "baremetal.json", base_image)
    with vm_turn():
        killed = oom_kill(offline_ns, home, config, mirror, out, flags, point)
    assert [p for p in tagged(killed) if "qemu-system" in p], f"QEMU runs on after its run was killed at {point}"
    for old in user_plugins.rglob("packer-plugin-*"):
        old.unlink()  # the killed run installed them: the build below installs them again
    res = build(offline_ns, home, "baremetal", _config(tmp_path / "baremetal.json", base_image), mirror, out, *flags)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert tagged(killed) == [] and run_folders(killed) == [], (tagged(killed), run_folders(killed))
    assert not list((home / "work").iterdir()), "the killed run's workspace is released, the build's removed"
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    assert (
        "installing Packer plugin qemu 1.1.4" in res.stdout and "installing Packer plugin ansible 1.1.6" in res.stdout
    )
    manifest = json.loads((out / f"{NAME}.build-manifest.json").read_text())
    assert manifest["tools"]["packer"] == version and manifest["tools"]["packer_path"] == str(packer)
    assert {p["name"]: p["version"] for p in manifest["packer_plugins"]} == {"qemu": "1.1.4", "ansible": "1.1.6"}
    assert len(list(user_plugins.glob("github.com/hashicorp/*/packer-plugin-*_SHA256SUM"))) == 2
    gz = out / f"{NAME}.gz"
    with vm_turn():
        findings = verify_image(gz)
    assert not [f for f in findings if not f.ok], findings

    # the local OVA on the same Packer: its plugins are installed already, so the build finds them (no flag)
    ova_out = tmp_path / "ova"
    res = build(offline_ns, home, "vsphere", _config(tmp_path / "vsphere.json", base_image), mirror, ova_out,
                "--packer", str(packer))  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "installing Packer plugin" not in res.stdout and "qemu 1.1.4 installed" in res.stdout
    ova = ova_out / f"{NAME}.ova"
    with vm_turn():
        findings = verify_image(ova)
    assert not [f for f in findings if not f.ok], findings
    # Packer's generation changes nothing a node sees: the same inputs as 1.6.6's OVA
    report = diff_images(legacy_ova.ova, ova, work_dir=tmp_path / "diff")
    assert not report.unexpected, "\n".join(map(str, report.unexpected))
    # Packer itself lists what the builds installed, from its default folder (no PACKER_PLUGIN_PATH)
    listed = in_ns(offline_ns, str(packer), "plugins", "installed", home=home, env={"CHECKPOINT_DISABLE": "1"})
    assert listed.returncode == 0 and str(user_plugins / "github.com/hashicorp/qemu") in listed.stdout
