"""Reader for distro release manifests (``kind: Release``).

A manifest lists components; each has assets with ``os``, ``arch``, ``type`` (Archive or Image) and either an
``archive`` (uri, sha256, sha512) or an ``image`` (uri, sometimes imageDigest). A node image needs a small, fixed
set of linux/amd64 assets; this module finds them by meaning (component, type, os, arch, file name) rather than by
position, so older and newer manifests of the same format work too.

Real manifests are not always tidy: the 1-21-eks-4 release labels the arm64 etcd tarball ``arch: [amd64]`` and
gives it no checksums. Assets are therefore matched on their file name as well as their arch label, and an
artifact without a sha256 is an error, never a silent pass.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from typing import Any, Literal

from imagebuilder.core import fetch, grammar
from imagebuilder.core.errors import InputError
from imagebuilder.core.fetch import Mirror, is_url
from imagebuilder.core.files import parse_yaml_documents

ArtifactKind = Literal["binary", "archive", "image"]

BINARIES = ("kubelet", "kubeadm", "kubectl")
ARCHIVES = {"cni-plugins": "cni-plugins", "etcd": "etcd"}  # artifact -> component
#: shipped by some releases only (the distro's ship no crictl and no runtime; a release built from source ships both,
#: as the reference's bundle does per line): installed when there. The containerd tarball is extracted at / and holds
#: containerd, ctr, containerd-shim-runc-v2, runc and containerd's systemd unit
OPTIONAL_ARCHIVES = {"crictl": "cri-tools", "containerd": "containerd"}
#: the components whose version (gitTag) an image is checked against when the release names it
RUNTIME_COMPONENTS = ("containerd", "runc", "cri-tools")
#: an image reference as registries and containerd take it: host[:port]/path[:tag][@sha256:digest], lowercase path
IMAGE_REF = re.compile(
    r"[a-z0-9]+(?:[.-][a-z0-9]+)*(?::[0-9]{1,5})?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)+"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)
IMAGES = ("pause", "coredns", "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy")
ARCH = "amd64"
OTHER_ARCHES = ("arm64", "arm", "386", "ppc64le", "s390x")


@dataclass(frozen=True)
class NodeArtifact:
    """One thing a node image installs: a binary, an archive or a container image."""

    name: str
    kind: ArtifactKind
    component: str
    uri: str
    sha256: str | None
    #: for images: the OCI image tarball of the same image, when the manifest ships one
    archive_uri: str | None = None
    #: the SHA-512 the source states beside the SHA-256 (a bundle's runtime tarballs): checked too where it is known
    sha512: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "uri": self.uri, "sha256": self.sha256}
        if self.archive_uri:
            out["archive_uri"] = self.archive_uri
        if self.sha512:
            out["sha512"] = self.sha512
        return out


@dataclass(frozen=True)
class ReleaseManifest:
    name: str
    channel: str
    number: int
    kubernetes_version: str
    source: str
    artifacts: tuple[NodeArtifact, ...]
    #: the SHA-256 of the manifest document as read (the provenance names the manifest by it)
    sha256: str | None = None
    #: component name -> its gitTag, for the runtime's components the release names (containerd, runc, cri-tools)
    versions: tuple[tuple[str, str], ...] = ()

    def version_of(self, component: str) -> str | None:
        return dict(self.versions).get(component)

    @property
    def distro(self) -> str | None:
        """The distro part of the release's name (``eks`` in kubernetes-1-24-eks-36, ``source`` for a release built
        from source), or None when the name has another shape."""
        m = re.fullmatch(rf"kubernetes-{re.escape(self.channel)}-([a-z][a-z0-9]*)-{self.number}", self.name)
        return m.group(1) if m else None

    def artifact(self, name: str, kind: ArtifactKind) -> NodeArtifact:
        return next(a for a in self.artifacts if a.name == name and a.kind == kind)


def _map(value: Any) -> dict[str, Any]:
    """A mapping of the manifest, or an empty one where the manifest has something else (a list, a string...)."""
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _assets(doc: dict[str, Any], source: str) -> list[tuple[str, dict[str, Any]]]:
    components = _map(doc.get("status")).get("components")
    if not isinstance(components, list):
        raise InputError("has no status.components list", source=source, field="status.components")
    out = []
    for comp in components:
        if not isinstance(comp, dict):
            continue
        for asset in _list(comp.get("assets")):
            if isinstance(asset, dict):
                out.append((str(comp.get("name", "")), asset))
    return out


def _is_linux_amd64(asset: dict[str, Any]) -> bool:
    arch = _list(asset.get("arch"))
    if asset.get("os") != "linux" or ARCH not in arch:
        return False
    # Trust the file name over the label when they disagree (see the module docstring).
    name = str(asset.get("name", "")) + " " + str(_archive(asset).get("uri", ""))
    return not any(re.search(rf"[-/_]{a}([-/_.]|$)", name) for a in OTHER_ARCHES)


def _archive(asset: dict[str, Any]) -> dict[str, Any]:
    archive = asset.get("archive")
    return archive if isinstance(archive, dict) else {}


def _need_sha256(name: str, asset: dict[str, Any], source: str) -> str:
    sha = _archive(asset).get("sha256")
    if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise InputError(
            f"the linux/amd64 asset for {name} ({asset.get('name')}) has no valid sha256",
            source=source,
            field="status.components[].assets[].archive.sha256",
        )
    return sha


def _missing(what: str, detail: str, source: str) -> InputError:
    return InputError(
        f"no linux/amd64 {what} in the release manifest ({detail})",
        source=source,
        field="status.components",
        expected="a manifest that ships every node artifact",
    )


def parse_manifest(text: str, source: str) -> ReleaseManifest:
    """Parse a release manifest and pick out the node artifacts; errors name the missing artifact."""
    docs = [d for d in parse_yaml_documents(text, source) if isinstance(d, dict) and d.get("kind") == "Release"]
    if len(docs) != 1:
        raise InputError(
            f"expected exactly one document of kind Release, found {len(docs)}", source=source, field="kind"
        )
    doc = docs[0]
    spec = _map(doc.get("spec"))
    channel, number = spec.get("channel"), spec.get("number")
    if not isinstance(channel, str) or not re.fullmatch(r"[0-9]{1,4}-[0-9]{1,4}", channel):
        raise InputError("missing or malformed", source=source, field="spec.channel", expected="<major>-<minor>")
    try:
        number = grammar.integer(number, 0, 10**9)  # ASCII digits, bounded: int() would take "٣" and 10,000 digits
    except ValueError:
        raise InputError(
            "missing or malformed", source=source, field="spec.number", expected="a release number"
        ) from None
    name = str(_map(doc.get("metadata")).get("name") or f"kubernetes-{channel}-{number}")
    assets = _assets(doc, source)

    artifacts: list[NodeArtifact] = []
    for binary in BINARIES:
        found = [
            (c, a)
            for c, a in assets
            if a.get("type") == "Archive" and _is_linux_amd64(a) and str(a.get("name", "")).split("/")[-1] == binary
        ]
        if not found:
            raise _missing(binary, f"an Archive asset named bin/linux/{ARCH}/{binary}", source)
        comp, asset = found[0]
        uri = _archive(asset).get("uri")
        artifacts.append(NodeArtifact(binary, "binary", comp, str(uri), _need_sha256(binary, asset, source)))

    for artifact, component in (ARCHIVES | OPTIONAL_ARCHIVES).items():
        found = [
            (c, a)
            for c, a in assets
            if c == component
            and a.get("type") == "Archive"
            and _is_linux_amd64(a)
            and re.search(r"\.(tar\.gz|tgz)$", str(a.get("name", "")))
        ]
        if not found and artifact in OPTIONAL_ARCHIVES:
            continue
        if not found:
            raise _missing(f"{artifact} tarball", f"component {component}, an Archive *.tar.gz", source)
        comp, asset = found[0]
        uri = _archive(asset).get("uri")
        artifacts.append(NodeArtifact(artifact, "archive", comp, str(uri), _need_sha256(artifact, asset, source)))

    tarballs = {
        str(a.get("name", "")).split("/")[-1].removesuffix(".tar"): a
        for _, a in assets
        if a.get("type") == "Archive" and _is_linux_amd64(a) and str(a.get("name", "")).endswith(".tar")
    }
    for image in IMAGES:
        found = [
            (c, a)
            for c, a in assets
            if a.get("type") == "Image"
            and a.get("name") == f"{image}-image"
            and ARCH in (_list(a.get("arch")) or [ARCH])  # no arch list: a multi-arch image
        ]
        if not found:
            raise _missing(f"{image} image", f"an Image asset named {image}-image", source)
        comp, asset = found[0]
        ref = _map(asset.get("image")).get("uri")
        if not isinstance(ref, str) or not ref:
            raise InputError(f"image {image} has no uri", source=source, field="image.uri")
        if not IMAGE_REF.fullmatch(ref):
            raise InputError(f"image {image}'s uri {ref[:80]!r} is not an image reference", source=source,
                             field="image.uri", expected="registry/path:tag")  # fmt: skip
        digest = _map(asset.get("image")).get("imageDigest")
        tar = tarballs.get(image)
        sha = None
        archive_uri = None
        if tar is not None and _archive(tar).get("sha256"):
            sha, archive_uri = _need_sha256(image, tar, source), str(_archive(tar).get("uri"))
        elif isinstance(digest, str) and digest.startswith("sha256:"):
            sha = digest.removeprefix("sha256:")
        artifacts.append(NodeArtifact(image, "image", comp, ref, sha, archive_uri))

    k8s = [
        c
        for c in _list(_map(doc.get("status")).get("components"))
        if isinstance(c, dict) and c.get("name") == "kubernetes"
    ]
    version = str(k8s[0].get("gitTag", "")) if k8s else ""
    if not re.fullmatch(r"v[0-9]+\.[0-9]+\.[0-9]+", version):
        raise InputError(
            "the kubernetes component has no version gitTag",
            source=source,
            field="status.components[kubernetes].gitTag",
        )
    if not version.startswith(f"v{channel.replace('-', '.')}."):
        raise InputError(
            f"kubernetes {version} does not belong to channel {channel}", source=source, field="spec.channel"
        )
    versions = tuple(
        (str(c["name"]), str(c["gitTag"]))
        for c in _list(_map(doc.get("status")).get("components"))
        if isinstance(c, dict) and c.get("name") in RUNTIME_COMPONENTS and isinstance(c.get("gitTag"), str)
        and re.fullmatch(r"v[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}", c["gitTag"])
    )  # fmt: skip
    return ReleaseManifest(name, channel, int(number), version, source, tuple(artifacts), versions=versions)


def archive_asset(name: str, url: str, data: bytes, description: str) -> dict[str, Any]:
    """A linux/amd64 ``Archive`` asset as the distro's manifests write one, with the checksums of ``data``; for
    the releases this tool writes (stand-in, built from source)."""
    return {
        "arch": [ARCH],
        "archive": {
            "sha256": hashlib.sha256(data).hexdigest(),
            "sha512": hashlib.sha512(data).hexdigest(),
            "uri": url,
        },
        "description": description,
        "name": name,
        "os": "linux",
        "type": "Archive",
    }


def image_asset(name: str, ref: str, description: str, arch: tuple[str, ...] = (ARCH,)) -> dict[str, Any]:
    """An ``Image`` asset (``<name>-image``) as the distro's manifests write one."""
    return {"arch": list(arch), "description": description, "image": {"uri": ref}, "name": f"{name}-image",
            "os": "linux", "type": "Image"}  # fmt: skip


def manifest_location(url_or_path: str, mirror: Mirror | None) -> str:
    """Where to read a manifest from: an upstream URL goes through the mirror when one is given."""
    if is_url(url_or_path) and mirror is not None:
        return mirror.locate(url_or_path)
    return url_or_path


def load_manifest(url_or_path: str, mirror: Mirror | None = None, *, timeout: float = 10.0) -> ReleaseManifest:
    location = manifest_location(url_or_path, mirror)
    data = fetch.read(location, timeout=timeout, what="release manifest")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("release manifest is not UTF-8 text", source=location) from None
    return dataclasses.replace(parse_manifest(text, location), sha256=hashlib.sha256(data).hexdigest())
