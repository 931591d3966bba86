"""The release-manifest parser on a real EKS-D manifest, exactly (issue 63): what it picks out, and the words, field
and expectation of each refusal when one piece of the manifest is spoilt.

The distro's manifest of 1-21 release 4 (tests/data/eksd) is read as it is, then with one thing taken away or
broken at a time. Mutation testing found the parser's refusals untested word for word (68% of its mutants killed):
a refusal could lose its field, its source or the architecture it names and the suite passed."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from imagebuilder.core.errors import InputError, InputErrors
from imagebuilder.release.manifest import parse_manifest
from tests.support.common import reference

TEXT = reference("eksd", "kubernetes-1-21-eks-4.yaml").read_text()
DOC: dict[str, Any] = next(d for d in yaml.safe_load_all(TEXT) if d and d.get("kind") == "Release")
MANIFEST = "kubernetes-1-21-eks-4.yaml"
BASE = "https://distro.eks.amazonaws.com/kubernetes-1-21/releases/4/artifacts"


def _assets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for c in doc["status"]["components"] for a in c["assets"]]


def _drop(doc: dict[str, Any], keep: Callable[[dict[str, Any]], bool]) -> None:
    for component in doc["status"]["components"]:
        component["assets"] = [a for a in component["assets"] if keep(a)]


def _asset(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(a for a in _assets(doc) if a["name"] == name)


def test_the_real_manifest_s_node_artifacts() -> None:
    manifest = parse_manifest(TEXT, MANIFEST)
    assert (manifest.name, manifest.channel, manifest.number, manifest.arch) == ("kubernetes-1-21-eks-4", "1-21", 4,
                                                                                  "amd64")  # fmt: skip
    assert manifest.date == "2021-08-19T20:14:48Z" and manifest.versions == ()
    rows = [(a.name, a.kind, a.component) for a in manifest.artifacts]
    assert rows == [
        ("kubelet", "binary", "kubernetes"), ("kubeadm", "binary", "kubernetes"), ("kubectl", "binary", "kubernetes"),
        ("cni-plugins", "archive", "cni-plugins"), ("etcd", "archive", "etcd"),
        ("pause", "image", "kubernetes"), ("coredns", "image", "coredns"), ("etcd", "image", "etcd"),
        ("kube-apiserver", "image", "kubernetes"), ("kube-controller-manager", "image", "kubernetes"),
        ("kube-scheduler", "image", "kubernetes"), ("kube-proxy", "image", "kubernetes"),
    ]  # fmt: skip
    by = {(a.name, a.kind): a for a in manifest.artifacts}
    kubelet = by[("kubelet", "binary")]
    assert kubelet.uri == f"{BASE}/kubernetes/v1.21.2/bin/linux/amd64/kubelet"
    assert kubelet.sha256 == _asset(DOC, "bin/linux/amd64/kubelet")["archive"]["sha256"]
    assert by[("cni-plugins", "archive")].uri == f"{BASE}/plugins/v0.8.7/cni-plugins-linux-amd64-v0.8.7.tar.gz"
    apiserver = by[("kube-apiserver", "image")]
    assert apiserver.uri == "public.ecr.aws/eks-distro/kubernetes/kube-apiserver:v1.21.2-eks-1-21-4"
    assert apiserver.archive_uri == f"{BASE}/kubernetes/v1.21.2/bin/linux/amd64/kube-apiserver.tar"
    assert apiserver.sha256 == _asset(DOC, "bin/linux/amd64/kube-apiserver.tar")["archive"]["sha256"]
    assert apiserver.to_json() == {"name": "kube-apiserver", "kind": "image", "uri": apiserver.uri,
                                   "sha256": apiserver.sha256, "archive_uri": apiserver.archive_uri}  # fmt: skip
    pause = by[("pause", "image")]
    assert (pause.sha256, pause.archive_uri) == (None, None) and pause.to_json() == {
        "name": "pause", "kind": "image", "uri": pause.uri, "sha256": None}  # fmt: skip


def _spoilt(spoil: Callable[[dict[str, Any]], None], arch: str = "amd64") -> InputError:
    doc = copy.deepcopy(DOC)
    spoil(doc)
    with pytest.raises(InputError) as raised:
        parse_manifest(yaml.safe_dump(doc), MANIFEST, arch)
    assert not isinstance(raised.value, InputErrors)
    assert raised.value.source == MANIFEST
    return raised.value


FOR_AMD64 = "a manifest that ships every node artifact for amd64"


def test_a_missing_binary_archive_or_image_is_named_with_the_asset_looked_for() -> None:
    e = _spoilt(lambda d: _drop(d, lambda a: a["name"] != "bin/linux/amd64/kubelet"))
    assert (e.detail, e.field, e.expected) == (
        "no linux/amd64 kubelet in the release manifest (an Archive asset named bin/linux/amd64/kubelet)",
        "status.components", FOR_AMD64)  # fmt: skip
    e = _spoilt(lambda d: _drop(d, lambda a: not a["name"].startswith("cni-plugins-linux-amd64")))
    assert e.detail == ("no linux/amd64 cni-plugins tarball in the release manifest (component cni-plugins, an "
                        "Archive *.tar.gz)")  # fmt: skip
    e = _spoilt(lambda d: _drop(d, lambda a: a["name"] != "coredns-image"))
    assert (e.detail, e.field) == ("no linux/amd64 coredns image in the release manifest (an Image asset named "
                                   "coredns-image)", "status.components")  # fmt: skip


def test_an_arm64_build_of_an_amd64_only_manifest_says_how_to_get_one() -> None:
    assert parse_manifest(TEXT, MANIFEST, "arm64").artifacts[0].uri.endswith("/bin/linux/arm64/kubelet")
    e = _spoilt(lambda d: _drop(d, lambda a: a["name"] != "bin/linux/arm64/kubelet"), "arm64")
    assert (e.detail, e.expected) == (
        "no linux/arm64 kubelet in the release manifest (an Archive asset named bin/linux/arm64/kubelet)",
        "a manifest that ships every node artifact for arm64 (or 'image-builder release.build --arch arm64')",
    )
    # an architecture the manifests label but no node image is built for: no hint to build it
    e = _spoilt(lambda d: None, "s390x")
    assert e.expected == "a manifest that ships every node artifact for s390x"


def test_a_checksum_that_is_not_a_sha256_is_named_with_its_asset() -> None:
    def spoil(d: dict[str, Any]) -> None:
        _asset(d, "bin/linux/amd64/kubeadm")["archive"]["sha256"] = "ABC"

    e = _spoilt(spoil)
    assert (e.detail, e.field) == ("the linux/amd64 asset for kubeadm (bin/linux/amd64/kubeadm) has no valid sha256",
                                   "status.components[].assets[].archive.sha256")  # fmt: skip

    def spoil_tar(d: dict[str, Any]) -> None:
        _asset(d, "bin/linux/amd64/kube-proxy.tar")["archive"]["sha256"] = "0" * 63 + "g"

    assert _spoilt(spoil_tar).detail == ("the linux/amd64 asset for kube-proxy (bin/linux/amd64/kube-proxy.tar) has "
                                         "no valid sha256")  # fmt: skip


def test_an_image_without_a_reference_or_with_a_bad_one() -> None:
    def no_uri(d: dict[str, Any]) -> None:
        del _asset(d, "pause-image")["image"]["uri"]

    e = _spoilt(no_uri)
    assert (e.detail, e.field, e.expected) == ("image pause has no uri", "image.uri", None)

    def bad(d: dict[str, Any]) -> None:
        _asset(d, "pause-image")["image"]["uri"] = "not a ref " + "x" * 100

    e = _spoilt(bad)
    assert (e.detail, e.field, e.expected) == (
        f"image pause's uri {('not a ref ' + 'x' * 100)[:80]!r} is not an image reference", "image.uri",
        "registry/path:tag")  # fmt: skip


def test_the_document_its_components_and_its_kubernetes_version() -> None:
    with pytest.raises(InputError) as raised:
        parse_manifest(TEXT + "\n---\n" + yaml.safe_dump(DOC), MANIFEST)
    assert (raised.value.detail, raised.value.field) == ("expected exactly one document of kind Release, found 2",
                                                         "kind")  # fmt: skip
    assert raised.value.source == MANIFEST
    e = _spoilt(lambda d: d["status"].pop("components"))
    assert (e.detail, e.field) == ("has no status.components list", "status.components")

    def no_tag(d: dict[str, Any]) -> None:
        next(c for c in d["status"]["components"] if c["name"] == "kubernetes")["gitTag"] = "1.21.2"

    e = _spoilt(no_tag)
    assert (e.detail, e.field) == ("the kubernetes component has no version gitTag",
                                   "status.components[kubernetes].gitTag")  # fmt: skip

    def other_line(d: dict[str, Any]) -> None:
        next(c for c in d["status"]["components"] if c["name"] == "kubernetes")["gitTag"] = "v1.22.0"

    e = _spoilt(other_line)
    assert (e.detail, e.field) == ("kubernetes v1.22.0 does not belong to channel 1-21", "spec.channel")
    with pytest.raises(ValueError, match="unknown architecture 'sparc'"):
        parse_manifest(TEXT, MANIFEST, "sparc")


def _problems(spoil: Callable[[dict[str, Any]], None]) -> list[tuple[str | None, str, str | None]]:
    doc = copy.deepcopy(DOC)
    spoil(doc)
    with pytest.raises(InputErrors) as raised:
        parse_manifest(yaml.safe_dump(doc), MANIFEST)
    return [(e.field, e.detail, e.expected) for e in raised.value.errors]


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [("channel", "1.21", "<major>-<minor>"), ("channel", 121, "<major>-<minor>"),
     ("channel", "12345-1", "<major>-<minor>"), ("number", "x", "a release number"),
     ("number", -1, "a release number"), ("number", 10**9 + 1, "a release number"),
     ("number", "٣", "a release number")],
)  # fmt: skip
def test_a_malformed_channel_or_number_is_named(field: str, value: object, expected: str) -> None:
    def spoil(d: dict[str, Any]) -> None:
        d["spec"][field] = value

    assert _problems(spoil) == [(f"spec.{field}", "missing or malformed", expected)]


@pytest.mark.parametrize("number", [0, 10**9, "7"])
def test_a_release_number_at_its_bounds(number: object) -> None:
    doc = copy.deepcopy(DOC)
    doc["spec"]["number"] = number
    assert parse_manifest(yaml.safe_dump(doc), MANIFEST).number == int(str(number))


def test_an_asset_is_linux_and_of_the_arch_by_label_and_by_file_name() -> None:
    def not_linux(d: dict[str, Any]) -> None:
        _asset(d, "bin/linux/amd64/kubectl")["os"] = "windows"

    assert _spoilt(not_linux).detail.startswith("no linux/amd64 kubectl ")

    def unlabelled(d: dict[str, Any]) -> None:
        _asset(d, "bin/linux/amd64/kubectl")["arch"] = ["arm64"]

    assert _spoilt(unlabelled).detail.startswith("no linux/amd64 kubectl ")

    def named_for_arm64(d: dict[str, Any]) -> None:  # labelled amd64, its file arm64's: the file name is trusted
        asset = _asset(d, "bin/linux/amd64/kubectl")
        asset["archive"]["uri"] = asset["archive"]["uri"].replace("/amd64/", "/arm64/")

    assert _spoilt(named_for_arm64).detail.startswith("no linux/amd64 kubectl ")


def test_an_optional_archive_after_a_missing_one_and_the_runtime_s_version() -> None:
    """No crictl (the distro ships none), but a containerd tarball: the one after the missing one is still found."""
    from imagebuilder.release.manifest import NodeArtifact, archive_asset

    doc = copy.deepcopy(DOC)
    url = "https://example.org/containerd-linux-amd64.tar.gz"
    doc["status"]["components"].append({"name": "containerd", "gitTag": "v1.7.27", "assets": [
        archive_asset("containerd-linux-amd64.tar.gz", url, b"containerd", "containerd tarball")]})  # fmt: skip
    manifest = parse_manifest(yaml.safe_dump(doc), MANIFEST)
    assert [(a.name, a.uri) for a in manifest.artifacts if a.component == "containerd"] == [("containerd", url)]
    assert manifest.versions == (("containerd", "v1.7.27"),) and manifest.source == MANIFEST
    with_512 = NodeArtifact("containerd", "archive", "containerd", url, "a" * 64, sha512="b" * 128)
    assert with_512.to_json() == {"name": "containerd", "kind": "archive", "uri": url, "sha256": "a" * 64,
                                  "sha512": "b" * 128}  # fmt: skip


def test_an_archive_s_checksum_and_a_broken_document_name_the_manifest() -> None:
    def spoil(d: dict[str, Any]) -> None:
        _asset(d, next(a["name"] for a in _assets(d) if a["name"].startswith("etcd-linux-amd64")))["archive"][
            "sha256"] = None  # fmt: skip

    e = _spoilt(spoil)
    assert e.detail.startswith("the linux/amd64 asset for etcd (etcd-linux-amd64-") and e.source == MANIFEST
    with pytest.raises(InputError) as raised:
        parse_manifest("kind: Release\nspec: [", MANIFEST)
    assert raised.value.source == MANIFEST
    doc = copy.deepcopy(DOC)
    doc["spec"]["channel"] = "1.21"
    with pytest.raises(InputErrors) as errors:
        parse_manifest(yaml.safe_dump(doc), MANIFEST)
    assert {str(e.source) for e in errors.value.errors} == {MANIFEST}
