"""The product profile is the one home of product-specific values."""

from __future__ import annotations

import re
import subprocess

from imagebuilder import __version__
from imagebuilder.release.profile import load_profile
from tests.support.common import ROOT

# Values the spec leaves as placeholders; only config/ may spell them.
PRODUCT_VALUES = [
    r"\beksa\b",
    r"\bEKSA",
    r"eks-anywhere",
    r"amazonaws\.com",
    r"bottlerocket\.aws",
    r"public\.ecr\.aws",
    r"eksdRelease",
    r"vSphereUser",
    r"CloudAdminRole",
]
SHIPPED = ["imagebuilder", "tasks.py", "templates", "packer", "ansible", "cloud-init", "scripts", "bench"]


def test_profile_values() -> None:
    p = load_profile()
    assert p.product.short_name == "eksa"
    assert p.vsphere_user.group == "EKSAUsers"
    assert (p.vsphere_user.global_role, p.vsphere_user.user_role, p.vsphere_user.admin_role) == (
        "EKSAGlobalRole",
        "EKSAUserRole",
        "EKSACloudAdminRole",
    )
    assert p.vsphere_user.api_version == "eks-anywhere.amazon.com/v1"
    assert p.vsphere_user.kind == "vSphereUser"
    assert p.distro.name == "eks"
    assert (p.tags.os_category, p.tags.release_category) == ("os", "eksdRelease")
    assert p.hosts.assets == "anywhere-assets.eks.amazonaws.com"
    assert p.hosts.os1_updates == "updates.bottlerocket.aws"
    assert (p.versions.image_builder, p.versions.bundle, p.versions.os1_image) == ("0.1.2", 25, "v1.10.1")
    assert p.versions.image_builder == __version__


def test_no_shipped_file_hard_codes_product_values() -> None:
    offenders = []
    # what the project ships is what git tracks: generated, ignored output (bench/work, demo/) is not shipped
    tracked = subprocess.run(["git", "ls-files", *SHIPPED], cwd=ROOT, capture_output=True, text=True, check=True)
    for name in tracked.stdout.splitlines():
        f = ROOT / name
        if f.is_file():
            text = f.read_text(errors="replace")
            for pattern in PRODUCT_VALUES:
                for m in re.finditer(pattern, text):
                    line = text.count("\n", 0, m.start()) + 1
                    offenders.append(f"{f.relative_to(ROOT)}:{line}: {m.group(0)}")
    assert not offenders, "product values outside config/:\n" + "\n".join(offenders)
