"""Artifact handling with the real tools: qemu-img, a mirror served over HTTP on 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from imagebuilder.builder.resolve import make_plan
from imagebuilder.core import fetch
from imagebuilder.core.errors import ExternalError
from imagebuilder.core.fetch import Expected, Mirror
from imagebuilder.core.untrusted import Redactor
from imagebuilder.image.apply_customization import input_firmware
from imagebuilder.image.ova import make_ova, ova_firmware
from imagebuilder.plan.model import BuildRequest
from imagebuilder.providers import registry
from imagebuilder.release.catalog import load_catalog
from imagebuilder.release.manifest import load_manifest
from imagebuilder.release.mirror import create_mirror
from imagebuilder.release.standin import STANDIN_NOTE, make_standin_release

CHANNEL = load_catalog().channel("1-24")


def test_redactor_masks_every_secret() -> None:
    redact = Redactor(["s3cret", "longer-s3cret-value", ""])
    assert redact("pw=longer-s3cret-value and s3cret") == "pw=******** and ********"


def test_ova_layout_capacity_and_manifest(tmp_path: Path) -> None:
    disk = tmp_path / "disk.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(disk), "96M"], check=True)
    ova = make_ova(
        disk, tmp_path / "out" / "node.ova", name="node", guest_os_type="ubuntu64Guest", cpus=2, memory_mb=4096
    )
    with tarfile.open(ova) as tar:
        names = tar.getnames()
        assert names == ["node.ovf", "node.mf", "node-disk1.vmdk"]
        tar.extractall(tmp_path / "x", filter="data")
    ovf = (tmp_path / "x" / "node.ovf").read_text()
    assert 'ovf:capacity="100663296"' in ovf and 'vmw:osType="ubuntu64Guest"' in ovf
    vmdk = tmp_path / "x" / "node-disk1.vmdk"
    assert f'ovf:size="{vmdk.stat().st_size}"' in ovf
    for line in (tmp_path / "x" / "node.mf").read_text().splitlines():
        name, digest = line.removeprefix("SHA256(").split(")= ")
        assert hashlib.sha256((tmp_path / "x" / name).read_bytes()).hexdigest() == digest
    info = json.loads(
        subprocess.run(["qemu-img", "info", "--output=json", str(vmdk)], capture_output=True, text=True).stdout
    )
    assert info["format"] == "vmdk" and info["format-specific"]["data"]["create-type"] == "streamOptimized"
    assert sorted(p.name for p in ova.parent.iterdir()) == ["node.ova"]


@pytest.mark.parametrize("firmware", ["bios", "efi"])
def test_an_efi_ova_tells_vsphere_to_boot_it_by_uefi(tmp_path: Path, firmware: str) -> None:
    import xml.etree.ElementTree as ET

    disk = tmp_path / "disk.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(disk), "16M"], check=True)
    ova = make_ova(disk, tmp_path / "node.ova", name="node", firmware=firmware)
    with tarfile.open(ova) as tar:
        ovf = tar.extractfile("node.ovf").read()  # type: ignore[union-attr]
    vmw = "{http://www.vmware.com/schema/ovf}"
    hardware = ET.fromstring(ovf).find(".//{http://schemas.dmtf.org/ovf/envelope/1}VirtualHardwareSection")
    assert hardware is not None
    configs = {c.get(f"{vmw}key"): c.get(f"{vmw}value") for c in hardware.iter(f"{vmw}Config")}
    # VMware's firmware setting, as vSphere itself exports an EFI VM; BIOS is vSphere's default, so nothing is said
    assert configs == ({"firmware": "efi"} if firmware == "efi" else {})
    # read back: image.customize boots an OVA (without a build manifest) with the firmware it asks for
    assert ova_firmware(ova) == firmware and input_firmware(ova) == firmware


def test_packer_producing_nothing_is_a_clear_error(tmp_path: Path, mirror_dir: Path) -> None:
    plan = make_plan(
        BuildRequest(
            os="ubuntu",
            hypervisor="baremetal",
            release_channel="1-24",
            mirror=str(mirror_dir),
            output_dir=str(tmp_path / "out"),
        )
    )
    (tmp_path / "b" / "output").mkdir(parents=True)
    with pytest.raises(ExternalError, match="Packer finished but produced no image"):
        registry.get(plan.provider).package(plan, tmp_path / "b", lambda _: None)


def test_standin_release_is_of_the_real_format(tmp_path: Path) -> None:
    release = make_standin_release(tmp_path, CHANNEL)
    manifest = load_manifest(str(release.manifest_path))
    assert (manifest.channel, manifest.number, manifest.kubernetes_version) == ("1-24", 36, "v1.24.17")
    kubelet = Mirror(str(tmp_path)).locate(manifest.artifact("kubelet", "binary").uri)
    assert STANDIN_NOTE in Path(kubelet).read_text()
    # the bytes (and so the checksums) are the same on every run
    again = make_standin_release(tmp_path / "again", CHANNEL)
    assert release.manifest_path.read_bytes() == again.manifest_path.read_bytes()


def test_mirror_create_verifies_converges_and_rejects_tampering(
    tmp_path: Path, http_server: str, mirror_dir: Path
) -> None:
    make_standin_release(mirror_dir, CHANNEL)  # the HTTP server serves mirror_dir
    dest = tmp_path / "copy"
    manifest, items = create_mirror(CHANNEL.manifest_url, dest, runtime=None, source=Mirror.parse(http_server))
    assert len(items) == 12 and {i.status for i in items} == {"downloaded"}
    assert (dest / "kubernetes-1-24" / "kubernetes-1-24-eks-36.yaml").is_file()
    _, again = create_mirror(CHANNEL.manifest_url, dest, runtime=None, source=Mirror.parse(http_server))
    assert {i.status for i in again} == {"verified"}
    # tamper with one artifact at the source: refused, and nothing lands at its final path
    kubelet_uri = manifest.artifact("kubelet", "binary").uri
    Path(Mirror(str(mirror_dir)).locate(kubelet_uri)).write_bytes(b"#!/bin/sh\necho evil\n")
    target = Path(Mirror(str(dest)).locate(kubelet_uri))
    target.unlink()
    with pytest.raises(ExternalError, match="failed verification"):
        create_mirror(CHANNEL.manifest_url, dest, runtime=None, source=Mirror.parse(http_server))
    assert not target.exists()
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".")]


def test_download_unreachable(tmp_path: Path) -> None:
    with pytest.raises(ExternalError, match=r"cannot fetch http://127.0.0.1:9/nothing: .*after 2 attempts"):
        fetch.download("http://127.0.0.1:9/nothing", tmp_path / "x", Expected(None, {"sha256": "0" * 64}), attempts=2)
    assert list(tmp_path.iterdir()) == []


def test_download_from_a_path_verifies_like_a_url(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"node image bytes")
    digest = hashlib.sha256(b"node image bytes").hexdigest()
    seen: list[int] = []
    out = fetch.download(
        f"file://{src}", tmp_path / "out" / "a.bin", Expected(16, {"sha256": digest}), progress=seen.append
    )
    assert out.read_bytes() == b"node image bytes" and sum(seen) == 16
    with pytest.raises(ExternalError, match="failed verification"):
        fetch.download(str(src), tmp_path / "out" / "b.bin", Expected(None, {"sha256": "0" * 64}))
    with pytest.raises(ExternalError, match="larger than the 4 bytes"):
        fetch.download(str(src), tmp_path / "out" / "c.bin", Expected(4, {"sha256": digest}))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.bin"]
