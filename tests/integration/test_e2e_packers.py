"""Bare-metal images and a local OVA built offline for real on the modern Packers users run, inside a network namespace
with nothing but loopback, from image.base's image and the mirror: Packer 1.9.4 and 1.16.0, built from their
release sources with their real plugins, the plugins installed offline from ``--packer-plugins`` into the user's own
plugin folder. Each Packer builds the bare-metal image (``--engine packer``: the qemu and ansible plugins), a first run
of it killed midway; the newest also builds the local OVA, which boots to a login prompt and becomes a tagged
template on vCenter (vcsim) that template.validate accepts. image.verify passes on each, and image.diff finds no
unexpected difference between the two Packer generations' bare-metal images of the same inputs. (CI time: each
Packer build is minutes of a core under TCG, so the OVA, whose Packer run differs from the bare-metal one only in its
post-processing, is built once.)

Debian's Packer 1.6.6 (plugins built in) has its own run: the bare-metal source-release build of
tests/integration/test_e2e_offline.py, apart from this module so that a parallel run builds both at once."""

from __future__ import annotations

import json
import random
import subprocess
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from imagebuilder.attest.provenance import payload_of
from imagebuilder.attest.sbom import package_names
from imagebuilder.build.verify import verify_image
from imagebuilder.image.diff import diff_images
from tests.support import packers
from tests.support.attest import check_sbom
from tests.support.common import BIN, ROOT, ArgvWatcher, run, run_folders, tagged, vm_turn
from tests.support.offline import build, in_ns, ns_env, scan_for
from tests.support.vcsim import Vcsim

pytestmark = pytest.mark.timeout(3600)
SECRET = "vc-Pa55-never-logged-7731"
NAME = "ubuntu-v1.24.17-eks-36-amd64"


def _config(path: Path, base_image: tuple[Path, str]) -> Path:
    """A bare-metal or local OVA config: a source image (and for the OVA no vCenter, and a password that is not
    used and must never show up anywhere)."""
    image, digest = base_image
    config = {"source_image_url": str(image), "source_image_checksum": f"sha256:{digest}"}
    path.write_text(json.dumps({**config, "password": SECRET} if path.name == "vsphere.json" else config))
    return path


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
    proc = subprocess.Popen(
        args, cwd=ROOT, env=ns_env(home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
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
    version: str, offline_ns: str, home: Path, base_image: tuple[Path, str], mirror: Path, vcsim: Vcsim,
    built_images: KeptImages, tmp_path: Path,
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
    # image.verify on disk (the bare-metal image's UEFI loader included); the newest Packer's OVA below, from the
    # same playbook, boots, and tests/integration/test_e2e_offline.py boots a bare-metal image of its own under UEFI
    # (CI time)
    findings = verify_image(out / f"{NAME}.gz", boot=False)
    assert not [f for f in findings if not f.ok], findings
    assert {"UEFI loader", "kubelet binary", "containerd enabled"} <= {f.name for f in findings}
    # kept for the comparison after both builds (a passed test's tmp_path is removed when it ends)
    built_images.keep(version, out / f"{NAME}.gz")
    # Packer itself lists what the build installed, from its default folder (no PACKER_PLUGIN_PATH)
    listed = in_ns(offline_ns, str(packer), "plugins", "installed", home=home, env={"CHECKPOINT_DISABLE": "1"})
    assert listed.returncode == 0 and str(user_plugins / "github.com/hashicorp/qemu") in listed.stdout
    if version == packers.MODERN[-1]:
        _the_local_ova_boots_and_becomes_a_template(offline_ns, home, packer, base_image, mirror, vcsim, tmp_path)


def _the_local_ova_boots_and_becomes_a_template(
    ns: str, home: Path, packer: Path, base_image: tuple[Path, str], mirror: Path, vcsim: Vcsim, tmp_path: Path
) -> None:
    """The local OVA on the same Packer: its plugins are installed already, so the build finds them (no flag); its
    config holds a vCenter password it does not use, which must show up in no output, file or child's argv."""
    ova_out = tmp_path / "ova"
    with ArgvWatcher() as argv:
        res = build(ns, home, "vsphere", _config(tmp_path / "vsphere.json", base_image), mirror, ova_out,
                    "--packer", str(packer))  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "installing Packer plugin" not in res.stdout and "qemu 1.1.4 installed" in res.stdout
    ova = ova_out / f"{NAME}.ova"
    with tarfile.open(ova) as tar:
        names = tar.getnames()
        assert names[0].endswith(".ovf") and names[1].endswith(".mf") and names[2].endswith(".vmdk")
        ovf = tar.extractfile(names[0]).read().decode()  # type: ignore[union-attr]
        mf = tar.extractfile(names[1]).read().decode()  # type: ignore[union-attr]
    assert 'ovf:capacity="4294967296"' in ovf and "streamOptimized" in ovf
    assert f"SHA256({names[0]})=" in mf and f"SHA256({names[2]})=" in mf
    # the OVA boots (image.verify, every check)
    with vm_turn():
        findings = verify_image(ova)
    assert not [f for f in findings if not f.ok], findings
    assert "boot" in {f.name for f in findings}
    # issue 31 on a Packer build: the sbom role ran in the build VM and handed the package list over; without
    # --signing-key the provenance is written unsigned (and says so), never signed by anything else
    ova_manifest = json.loads((ova_out / f"{NAME}.build-manifest.json").read_text())
    doc = check_sbom(ova_out / f"{NAME}.spdx.json", ova)
    assert "openssh-server" in package_names(doc), sorted(package_names(doc))[:20]
    # the line's runtime from its projects' releases (the OS's package purged): listed by its binaries' digests
    runtime = {p["name"] for p in doc["packages"] if str(p.get("SPDXID", "")).startswith("SPDXRef-Runtime-")}
    assert {"containerd", "runc", "crictl"} <= runtime and "containerd" not in package_names(doc), runtime
    assert ova_manifest["sbom"]["packages"] == len(package_names(doc))
    assert ova_manifest["provenance"]["signed_by"] is None
    envelope = json.loads((ova_out / f"{NAME}.intoto.json").read_text())
    assert envelope["signatures"] == [] and payload_of(envelope)["subject"][0]["name"] == ova.name
    output = res.stdout + res.stderr
    assert "UNSIGNED: give --signing-key" in output
    assert SECRET not in output
    assert not scan_for(SECRET, ova_out, home / "work"), "a secret leaked into a file"
    assert not [c for c in argv.seen if SECRET in c], "a secret was in a child's argv"
    # the built OVA becomes a tagged template on vCenter (vcsim) and passes template validation
    imported = run("template.import", "--ova", str(ova), "--os", "ubuntu", "--kubernetes", "1.24", env=vcsim.env)
    assert imported.code == 0, imported.err
    path = "/DC0/vm/Templates/ubuntu-kubernetes-1-24-eks-36"
    valid = run("template.validate", "--template", path, "--os", "ubuntu", "--kubernetes", "1.24", env=vcsim.env)
    assert valid.code == 0, valid.err


@dataclass
class KeptImages:
    """The bare-metal image each modern Packer's test built, by version, moved into a folder of the module's for the
    comparison after both (a passed test's tmp_path is removed when it ends)."""

    folder: Path
    images: dict[str, Path] = field(default_factory=dict)

    def keep(self, version: str, image: Path) -> None:
        self.images[version] = image.rename(self.folder / f"{version}.gz")


@pytest.fixture(scope="module")
def built_images(tmp_path_factory: pytest.TempPathFactory) -> KeptImages:
    return KeptImages(tmp_path_factory.mktemp("modern-images"))


def test_both_packer_generations_build_the_same_image(built_images: KeptImages, tmp_path: Path) -> None:
    """Packer's generation changes nothing a node sees: 1.9 (the last with plugins bundled, the reference tool's)
    and 1.16 (every builder a plugin) built the same inputs."""
    missing = [v for v in packers.MODERN if v not in built_images.images]
    assert not missing, (
        f"run with the builds before it (test_a_modern_packer_builds_and_verifies_both_images): {missing}"
    )
    report = diff_images(built_images.images["1.9.4"], built_images.images["1.16.0"], work_dir=tmp_path / "diff")
    assert not report.unexpected, "\n".join(map(str, report.unexpected))
