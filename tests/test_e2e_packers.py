"""Real builds on the Packers users run, 1.9.4 and 1.16.0 (built from their release sources with their real
plugins), offline in a network namespace with nothing but loopback: the bare-metal build (``--engine packer``: the
qemu and ansible plugins) and the local OVA, the plugins installed from ``--packer-plugins`` into the user's own
plugin folder, image.verify on each output (checks on disk and a boot to a login prompt), and image.diff against
Debian's Packer 1.6.6 output of the same inputs (tests/test_e2e_ova.py keeps 1.6.6's own OVA run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imagebuilder.imagediff import diff_images
from imagebuilder.verify import verify_image
from tests.support import packers
from tests.support.offline import build, in_ns

pytestmark = pytest.mark.timeout(3600)
NAME = "ubuntu-v1.24.8-eks-5-amd64"


def _config(path: Path, base_image: tuple[Path, str]) -> Path:
    image, digest = base_image
    path.write_text(json.dumps({"source_image_url": str(image), "source_image_checksum": f"sha256:{digest}"}))
    return path


@pytest.fixture(scope="module")
def legacy(offline_ns: str, home: Path, base_image: tuple[Path, str], mirror: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Path:  # fmt: skip
    """The bare-metal image of the same inputs built by Debian's Packer 1.6.6 (plugins built in)."""
    work = tmp_path_factory.mktemp("legacy")
    config = _config(work / "baremetal.json", base_image)
    res = build(offline_ns, home, "baremetal", config, mirror, work / "out", "--engine", "packer")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    manifest = json.loads((work / "out" / f"{NAME}.build-manifest.json").read_text())
    assert manifest["tools"]["packer"] == "1.6.6"
    assert {p["action"] for p in manifest["packer_plugins"]} == {"not needed"}, "built into Packer 1.6"
    return work / "out" / f"{NAME}.gz"


@pytest.mark.parametrize("version", packers.MODERN)
def test_a_modern_packer_builds_and_verifies_both_images(
    version: str, offline_ns: str, home: Path, base_image: tuple[Path, str], mirror: Path, legacy: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    packer = packers.packer(version)
    plugins = packers.newest_plugins()
    # the user's own plugin folder (Packer's default under HOME), empty: the build installs into it, offline
    user_plugins = home / ".config/packer/plugins"
    with_packer = ("--engine", "packer", "--packer", str(packer), "--packer-plugins", str(plugins))
    out = tmp_path / "out"
    res = build(offline_ns, home, "baremetal", _config(tmp_path / "baremetal.json", base_image), mirror, out,
                *with_packer)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    manifest = json.loads((out / f"{NAME}.build-manifest.json").read_text())
    assert manifest["tools"]["packer"] == version and manifest["tools"]["packer_path"] == str(packer)
    used = {p["name"]: p["version"] for p in manifest["packer_plugins"]}
    assert used == {"qemu": "1.1.4", "ansible": "1.1.6"}
    assert list(user_plugins.glob("github.com/hashicorp/*/packer-plugin-*_SHA256SUM"))
    gz = out / f"{NAME}.gz"
    findings = verify_image(gz)
    assert not [f for f in findings if not f.ok], findings
    # Packer's generation changes nothing a node sees
    report = diff_images(legacy, gz, work_dir=tmp_path / "diff")
    assert not report.unexpected, "\n".join(map(str, report.unexpected))

    # the local OVA (vSphere without vCenter) on the same Packer; its plugins are installed already
    ova_out = tmp_path / "ova"
    res = build(offline_ns, home, "vsphere", _config(tmp_path / "vsphere.json", base_image), mirror, ova_out,
                "--packer", str(packer))  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "installing Packer plugin" not in res.stdout, "installed once, found on the next build"
    ova = ova_out / f"{NAME}.ova"
    findings = verify_image(ova)
    assert not [f for f in findings if not f.ok], findings


def test_the_user_plugin_folder_is_packers_default(offline_ns: str, home: Path) -> None:
    """What the builds above installed is where Packer itself looks, with no PACKER_PLUGIN_PATH set."""
    packer = packers.packer(packers.MODERN[-1])
    res = in_ns(offline_ns, str(packer), "plugins", "installed", home=home, env={"CHECKPOINT_DISABLE": "1"})
    assert res.returncode == 0 and str(home / ".config/packer/plugins/github.com/hashicorp/qemu") in res.stdout
