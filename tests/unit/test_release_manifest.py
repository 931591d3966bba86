"""The release-manifest reader on the real samples, on older/newer variants, and on broken manifests."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from imagebuilder.core.errors import InputError
from imagebuilder.release.manifest import BINARIES, IMAGES, load_manifest, parse_manifest
from tests.support.common import make_manifest, reference

NEEDED = {(b, "binary") for b in BINARIES} | {("cni-plugins", "archive"), ("etcd", "archive")}
NEEDED |= {(i, "image") for i in IMAGES}


def sample(name: str) -> Path:
    return reference("eksd", name)


@pytest.mark.parametrize(
    ("name", "channel", "number", "version"),
    [("kubernetes-1-19-eks-2.yaml", "1-19", 2, "v1.19.6"), ("kubernetes-1-21-eks-4.yaml", "1-21", 4, "v1.21.2")],
)
def test_real_samples(name: str, channel: str, number: int, version: str) -> None:
    m = load_manifest(str(sample(name)))
    assert (m.channel, m.number, m.kubernetes_version) == (channel, number, version)
    assert {(a.name, a.kind) for a in m.artifacts} == NEEDED
    for a in m.artifacts:
        if a.kind != "image":
            assert a.sha256 and len(a.sha256) == 64
            assert "linux-amd64" in a.uri or "/linux/amd64/" in a.uri, a.uri
    kubelet = m.artifact("kubelet", "binary")
    assert kubelet.uri.endswith(f"/{version}/bin/linux/amd64/kubelet")
    # the OCI tarballs give the control-plane images a sha256
    assert m.artifact("kube-apiserver", "image").sha256
    assert m.artifact("kube-apiserver", "image").archive_uri


def test_known_checksums_from_the_1_21_sample() -> None:
    m = load_manifest(str(sample("kubernetes-1-21-eks-4.yaml")))
    # the amd64 etcd tarball; the manifest also labels the arm64 tarball "amd64" (without checksums)
    etcd = m.artifact("etcd", "archive")
    assert etcd.sha256 == "80f9fc0227c5d62ee4371ce986ebab342ae8e0b156f2cd7240ecea475120a01e"
    assert etcd.uri.endswith("etcd-linux-amd64-v3.4.16.tar.gz")
    cni = m.artifact("cni-plugins", "archive")
    assert cni.sha256 == "5319a01aacc622c3870eb76f6d9c77cd988179dfb56e8d2dc438c339c77a156c"


def _doc(text: str) -> dict:  # type: ignore[type-arg]
    return next(d for d in yaml.safe_load_all(text) if d)


def test_newer_format_with_image_digests_and_extra_fields() -> None:
    doc = _doc(make_manifest("1-27", 9, "v1.27.3"))
    doc["status"]["newField"] = {"x": 1}
    for comp in doc["status"]["components"]:
        comp["commitHash"] = "abc"
        for asset in comp["assets"]:
            if asset["type"] == "Image":
                asset["image"]["imageDigest"] = "sha256:" + "c" * 64
            if "amd64" in asset.get("arch", []):
                asset["arch"] = [*asset["arch"], "riscv64"]
    doc["status"]["components"].append({"name": "new-thing", "assets": [{"name": "x", "type": "Image", "os": "linux"}]})
    m = parse_manifest(yaml.safe_dump(doc), "newer.yaml")
    assert m.kubernetes_version == "v1.27.3" and m.number == 9
    assert m.artifact("pause", "image").sha256 == "c" * 64
    assert m.artifact("coredns", "image").uri.endswith("eks-1-27-9")


@pytest.mark.parametrize(
    ("drop", "named"),
    [
        ("bin/linux/amd64/kubelet", "kubelet"),
        ("bin/linux/amd64/kubeadm", "kubeadm"),
        ("cni-plugins-linux-amd64-v0.8.7.tar.gz", "cni-plugins"),
        ("etcd-linux-amd64-v3.4.16.tar.gz", "etcd tarball"),
        ("pause-image", "pause image"),
        ("coredns-image", "coredns image"),
        ("kube-proxy-image", "kube-proxy image"),
    ],
)
def test_missing_artifact_is_named(drop: str, named: str) -> None:
    doc = _doc(make_manifest("1-24", 36, "v1.24.17"))
    for comp in doc["status"]["components"]:
        comp["assets"] = [a for a in comp["assets"] if a["name"] != drop]
    with pytest.raises(InputError) as exc:
        parse_manifest(yaml.safe_dump(doc), "m.yaml")
    assert named in str(exc.value)
    assert "m.yaml" in str(exc.value)


def test_image_without_arch_list_is_multi_arch() -> None:
    doc = _doc(make_manifest("1-24", 36, "v1.24.17"))
    for comp in doc["status"]["components"]:
        for a in comp["assets"]:
            if a["name"] == "pause-image":
                del a["arch"]
            if a["name"] == "coredns-image":
                a["arch"] = ["arm64"]
    with pytest.raises(InputError, match="coredns image"):
        parse_manifest(yaml.safe_dump(doc), "m.yaml")


def test_missing_sha256_is_an_error() -> None:
    doc = _doc(make_manifest("1-24", 36, "v1.24.17"))
    for comp in doc["status"]["components"]:
        for a in comp["assets"]:
            if a["name"] == "bin/linux/amd64/kubectl":
                del a["archive"]["sha256"]
    with pytest.raises(InputError, match=r"kubectl.*sha256"):
        parse_manifest(yaml.safe_dump(doc), "m.yaml")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("kind: Bundles\nspec: {}\n", "kind Release"),
        ("kind: Release\nspec: {channel: '1-24'}\nstatus: {components: []}\n", "spec.number"),
        ("kind: Release\nspec: {channel: '1.24', number: 1}\n", "spec.channel"),
        ("kind: Release\nspec: {channel: '1-24', number: 1}\n", "status.components"),
        ("kind: Release\n  bad: [\n", "invalid YAML at line"),
    ],
)
def test_malformed_manifests(text: str, match: str) -> None:
    with pytest.raises(InputError, match=match):
        parse_manifest(text, "m.yaml")


def test_version_must_belong_to_channel() -> None:
    text = make_manifest("1-24", 36, "v1.24.17").replace("channel: 1-24", "channel: 1-23")
    with pytest.raises(InputError, match="does not belong to channel 1-23"):
        parse_manifest(text, "m.yaml")


def test_a_field_of_the_wrong_type_is_named_where_it_is() -> None:
    """Issue 47: the manifest is read through its model (the fields a build reads, the distro's others ignored), so
    a value of the wrong type is bad input naming its place, wherever it is, instead of being passed over."""
    doc = _doc(make_manifest("1-24", 36, "v1.24.17"))
    doc["status"]["components"][1]["assets"][0]["arch"] = "amd64"
    doc["status"]["components"][2]["gitTag"] = 7
    doc["metadata"]["labels"] = {"anything": ["the distro's own"]}
    with pytest.raises(InputError) as err:
        parse_manifest(yaml.safe_dump(doc), "m.yaml")
    found = [(e.field, e.detail) for e in getattr(err.value, "errors", [err.value])]
    assert found == [("status.components[1].assets[0].arch", "must be a list"),
                     ("status.components[2].gitTag", "must be a string")], found  # fmt: skip
