"""A local OVA built offline for real: Packer + QEMU + Ansible from image.base's image inside a network namespace
with nothing but loopback, its OVF and manifest checked, image.verify (testinfra on the mounted image, then a boot
to a login prompt), then imported into vcsim as a tagged template that template.validate accepts. Apart from the
bare-metal build (tests/test_e2e_offline.py) so that a parallel run builds both at once."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from imagebuilder.verify import verify_image
from tests.support.common import ArgvWatcher, run
from tests.support.offline import build, scan_for
from tests.support.vcsim import Vcsim

pytestmark = pytest.mark.timeout(1800)
SECRET = "vc-Pa55-never-logged-7731"


def test_offline_local_ova_is_valid_and_verified(
    offline_ns: str, home: Path, base_image: tuple[Path, str], mirror: Path, tmp_path: Path, vcsim: Vcsim
) -> None:
    image, digest = base_image
    config = tmp_path / "vsphere.json"
    # a local OVA: a source image and no vCenter; the unused password must never show up anywhere
    config.write_text(
        json.dumps({"source_image_url": str(image), "source_image_checksum": f"sha256:{digest}", "password": SECRET})
    )
    out = tmp_path / "out"
    with ArgvWatcher() as argv:
        res = build(offline_ns, home, "vsphere", config, mirror, out)  # the mirror directory
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ova = out / "ubuntu-v1.24.8-eks-5-amd64.ova"
    with tarfile.open(ova) as tar:
        names = tar.getnames()
        assert names[0].endswith(".ovf") and names[1].endswith(".mf") and names[2].endswith(".vmdk")
        ovf = tar.extractfile(names[0]).read().decode()  # type: ignore[union-attr]
        mf = tar.extractfile(names[1]).read().decode()  # type: ignore[union-attr]
    assert 'ovf:capacity="4294967296"' in ovf and "streamOptimized" in ovf
    assert f"SHA256({names[0]})=" in mf and f"SHA256({names[2]})=" in mf
    findings = verify_image(ova)
    assert not [f for f in findings if not f.ok], findings
    assert SECRET not in res.stdout + res.stderr
    assert not scan_for(SECRET, out, home / "work"), "a secret leaked into a file"
    assert not [c for c in argv.seen if SECRET in c], "a secret was in a child's argv"
    # the built OVA becomes a tagged template on vCenter (vcsim) and passes template validation
    imported = run("template.import", "--ova", str(ova), "--os", "ubuntu", "--kubernetes", "1.24", env=vcsim.env)
    assert imported.code == 0, imported.err
    path = "/DC0/vm/Templates/ubuntu-kubernetes-1-24-eks-5"
    valid = run("template.validate", "--template", path, "--os", "ubuntu", "--kubernetes", "1.24", env=vcsim.env)
    assert valid.code == 0, valid.err
