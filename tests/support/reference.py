"""What the in-process tests (tests/unit/test_reference_parity.py) and the integration tests
(tests/integration/test_reference_parity.py) of reference parity share."""

from __future__ import annotations

from pathlib import Path

from tests.support.common import reference

ISO_SHA = "ea5f349d492fed819e5086d351de47261c470fc794f7124805d176d69ddf1fcd"


#: "For RHEL images, add the following fields"
RHEL = {
    "iso_url": "https://mirror.example.com/rhel/rhel-8.10-x86_64-dvd.iso",
    "iso_checksum": ISO_SHA,
    "iso_checksum_type": "sha256",
    "rhel_username": "rhsm-user",
    "rhel_password": "Rh-Pa55-parity-2",
}


#: "Red Hat Satellite Support"
SATELLITE = {
    "rhsm_server_hostname": "satellite.example.com",
    "rhsm_server_release_version": "8.10",
    "rhsm_activation_key": "ak-Parity-5",
    "rhsm_org_id": "Example_Org",
}


def pinned_mirror(tmp_path: Path) -> Path:
    """A mirror holding the product's release index, one release's bundle manifest (the product's own test data)
    and the distro manifest its 1.21 bundle pins (a real one), at their upstream paths."""
    import yaml

    mirror = tmp_path / "mirror"
    bundles = yaml.safe_load(reference("eksa", "bundles-testdata.yaml").read_text())
    for vb in bundles["spec"]["versionsBundles"]:
        url = vb["eksD"]["manifestUrl"]
        if url.startswith("embed:///testdata/"):  # the test data embeds them; a real bundle points at the distro host
            name = url.rsplit("/", 1)[-1]
            vb["eksD"]["manifestUrl"] = f"https://distro.eks.amazonaws.com/{name.rsplit('-eks-', 1)[0]}/{name}"
    (mirror / "releases/bundles/99").mkdir(parents=True)
    (mirror / "releases/bundles/99/manifest.yaml").write_text(yaml.safe_dump(bundles))
    index = {"apiVersion": "anywhere.eks.amazonaws.com/v1alpha1", "kind": "Release", "spec": {"releases": [
        {"version": "v0.20.9", "bundleManifestUrl": "https://anywhere-assets.eks.amazonaws.com/releases/bundles/98/manifest.yaml"},
        {"version": "v0.21.3", "bundleManifestUrl": "https://anywhere-assets.eks.amazonaws.com/releases/bundles/99/manifest.yaml"},
    ]}}  # fmt: skip
    (mirror / "releases/eks-a").mkdir(parents=True)
    (mirror / "releases/eks-a/manifest.yaml").write_text(yaml.safe_dump(index))
    (mirror / "kubernetes-1-21").mkdir()
    real = reference("eksd", "kubernetes-1-21-eks-4.yaml").read_text()
    (mirror / "kubernetes-1-21" / "kubernetes-1-21-eks-4.yaml").write_text(real)
    from tests.support.runtime_cases import standin_upstream_runtime

    standin_upstream_runtime(mirror, "1-21")  # its bundle names no runtime for 1.21: the line's own, from upstream
    return mirror
