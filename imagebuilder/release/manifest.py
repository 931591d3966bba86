"""Reader for distro release manifests (``kind: Release``).

A manifest lists components; each has assets with ``os``, ``arch``, ``type`` (Archive or Image) and either an
``archive`` (uri, sha256, sha512) or an ``image`` (uri, sometimes imageDigest). A node image needs a small, fixed
set of linux assets of one architecture (amd64 unless a build asks for arm64); this module finds them by meaning
(component, type, os, arch, file name) rather than by position, so older and newer manifests of the same format
work too.

Real manifests are not always tidy: the 1-21-eks-4 release labels the arm64 etcd tarball ``arch: [amd64]`` and
gives it no checksums. Assets are therefore matched on their file name as well as their arch label, and an
artifact without a sha256 is an error, never a silent pass.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, StrictStr

from imagebuilder.core import fetch, grammar
from imagebuilder.core.arch import PUBLISHED_ARCHES
from imagebuilder.core.errors import InputError
from imagebuilder.core.fetch import Mirror, is_url
from imagebuilder.core.files import parse_yaml_documents
from imagebuilder.core.validation import FieldProblem, ForeignModel, validated

ArtifactKind = Literal["binary", "archive", "image"]

BINARIES = ("kubelet", "kubeadm", "kubectl")
ARCHIVES = {"cni-plugins": "cni-plugins", "etcd": "etcd"}  # artifact -> component
#: shipped by some releases only (the distro's ship no crictl and no runtime; a release built from source ships both,
#: as the reference's bundle does per line): installed when there. The containerd tarball is extracted at / and holds
#: containerd, ctr, containerd-shim-runc-v2, runc and containerd's systemd unit
OPTIONAL_ARCHIVES = {"crictl": "cri-tools", "containerd": "containerd"}
#: the components whose version (gitTag) an image is checked against when the release names it
RUNTIME_COMPONENTS = ("containerd", "runc", "cri-tools")
#: binaries of the runtime that come as files of their own (runc's release, beside containerd's tarball, which holds
#: none): the containerd role installs them (/usr/local/sbin), not the kubernetes role (/usr/bin)
RUNTIME_BINARIES = ("runc",)
#: an image reference as registries and containerd take it: host[:port]/path[:tag][@sha256:digest], lowercase path
IMAGE_REF = re.compile(
    r"[a-z0-9]+(?:[.-][a-z0-9]+)*(?::[0-9]{1,5})?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)+"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)
IMAGES = ("pause", "coredns", "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy")
ARCH = "amd64"
#: the architectures release manifests label assets with (Kubernetes' names); a node image is built for the first two


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
    #: the release's date (``status.date``, RFC 3339), when it has one
    date: str | None = None
    #: the architecture ``artifacts`` are for
    arch: str = ARCH

    def version_of(self, component: str) -> str | None:
        return dict(self.versions).get(component)

    @property
    def ships_runtime(self) -> bool:
        """The release carries the node's runtime (a containerd tarball), as release.build's releases do; the
        distro's own do not."""
        return any(a.kind == "archive" and a.name == "containerd" for a in self.artifacts)

    @property
    def distro(self) -> str | None:
        """The distro part of the release's name (``eks`` in kubernetes-1-24-eks-36, ``source`` for a release built
        from source), or None when the name has another shape."""
        m = re.fullmatch(rf"kubernetes-{re.escape(self.channel)}-([a-z][a-z0-9]*)-{self.number}", self.name)
        return m.group(1) if m else None

    def artifact(self, name: str, kind: ArtifactKind) -> NodeArtifact:
        return next(a for a in self.artifacts if a.name == name and a.kind == kind)


def _channel(value: object) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[0-9]{1,4}-[0-9]{1,4}", value):
        raise FieldProblem("missing or malformed", "<major>-<minor>")
    return value


def _number(value: object) -> int:
    try:
        return grammar.integer(value, 0, 10**9)  # ASCII digits, bounded: int() would take "٣" and 10,000 digits
    except ValueError:
        raise FieldProblem("missing or malformed", "a release number") from None


class _Archive(ForeignModel):
    uri: StrictStr | None = None
    sha256: StrictStr | None = None
    sha512: StrictStr | None = None


class _ImageRef(ForeignModel):
    uri: StrictStr | None = None
    imageDigest: StrictStr | None = None


class _Asset(ForeignModel):
    name: StrictStr = ""
    type: StrictStr | None = None
    os: StrictStr | None = None
    arch: list[StrictStr] | None = None
    archive: _Archive | None = None
    image: _ImageRef | None = None

    def linux(self, arch: str) -> bool:
        """A Linux asset for ``arch``: labelled so, and its file name names no other architecture."""
        if self.os != "linux" or arch not in (self.arch or []):
            return False
        # Trust the file name over the label when they disagree (see the module docstring).
        name = self.name + " " + (self.archive.uri or "" if self.archive else "")
        return not any(re.search(rf"[-/_]{a}([-/_.]|$)", name) for a in PUBLISHED_ARCHES if a != arch)

    @property
    def file_name(self) -> str:
        return self.name.split("/")[-1]


class _Component(ForeignModel):
    name: StrictStr = ""
    gitTag: StrictStr | None = None
    assets: list[_Asset] = Field(default_factory=list)


class _Status(ForeignModel):
    components: list[_Component] | None = None
    #: when the distro released it (a YAML timestamp, or its text): a reproducible build's SOURCE_DATE_EPOCH
    date: dt.datetime | StrictStr | None = None


class _Spec(ForeignModel):
    channel: Annotated[object, AfterValidator(_channel)] = Field(None, validate_default=True)
    number: Annotated[object, AfterValidator(_number)] = Field(None, validate_default=True)


class _Metadata(ForeignModel):
    name: StrictStr | None = None


class ReleaseDoc(ForeignModel):
    """The fields of a distro's ``kind: Release`` document that a build reads (the rest are the distro's)."""

    metadata: _Metadata | None = None
    spec: _Spec = Field(description="channel and number")
    status: _Status | None = None


def _need_sha256(name: str, asset: _Asset, source: str, arch: str) -> str:
    sha = asset.archive.sha256 if asset.archive else None
    if sha is None or not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise InputError(
            f"the linux/{arch} asset for {name} ({asset.name}) has no valid sha256",
            source=source,
            field="status.components[].assets[].archive.sha256",
        )
    return sha


def _missing(what: str, detail: str, source: str, arch: str) -> InputError:
    return InputError(
        f"no linux/{arch} {what} in the release manifest ({detail})",
        source=source,
        field="status.components",
        expected=f"a manifest that ships every node artifact for {arch}"
        + (" (or 'image-builder release.build --arch arm64')" if arch == "arm64" else ""),
    )


def _uri(asset: _Asset) -> str:
    return str(asset.archive.uri if asset.archive else None)


def parse_manifest(text: str, source: str, arch: str = ARCH) -> ReleaseManifest:
    """Parse a release manifest (through its model: the fields a build reads) and pick out the node artifacts of
    ``arch`` by meaning; errors name the missing artifact."""
    if arch not in PUBLISHED_ARCHES:
        raise ValueError(f"unknown architecture {arch!r}")  # the caller checked the user's value
    docs = [d for d in parse_yaml_documents(text, source) if isinstance(d, dict) and d.get("kind") == "Release"]
    if len(docs) != 1:
        raise InputError(
            f"expected exactly one document of kind Release, found {len(docs)}", source=source, field="kind"
        )
    doc = validated(ReleaseDoc, docs[0], source)
    channel, number = str(doc.spec.channel), int(str(doc.spec.number))
    name = (doc.metadata.name if doc.metadata else None) or f"kubernetes-{channel}-{number}"
    components = doc.status.components if doc.status else None
    if components is None:
        raise InputError("has no status.components list", source=source, field="status.components")
    assets = [(c.name, a) for c in components for a in c.assets]

    artifacts: list[NodeArtifact] = []
    for binary in BINARIES:
        found = [(c, a) for c, a in assets if a.type == "Archive" and a.linux(arch) and a.file_name == binary]
        if not found:
            raise _missing(binary, f"an Archive asset named bin/linux/{arch}/{binary}", source, arch)
        comp, asset = found[0]
        artifacts.append(NodeArtifact(binary, "binary", comp, _uri(asset), _need_sha256(binary, asset, source, arch)))

    for artifact, component in (ARCHIVES | OPTIONAL_ARCHIVES).items():
        found = [(c, a) for c, a in assets if c == component and a.type == "Archive" and a.linux(arch)
                 and re.search(r"\.(tar\.gz|tgz)$", a.name)]  # fmt: skip
        if not found and artifact in OPTIONAL_ARCHIVES:
            continue
        if not found:
            raise _missing(f"{artifact} tarball", f"component {component}, an Archive *.tar.gz", source, arch)
        comp, asset = found[0]
        checksum = _need_sha256(artifact, asset, source, arch)
        artifacts.append(NodeArtifact(artifact, "archive", comp, _uri(asset), checksum))

    tarballs = {a.file_name.removesuffix(".tar"): a for _, a in assets
                if a.type == "Archive" and a.linux(arch) and a.name.endswith(".tar")}  # fmt: skip
    for image in IMAGES:
        # no arch list: a multi-arch image
        found = [(c, a) for c, a in assets if a.type == "Image" and a.name == f"{image}-image"
                 and arch in (a.arch or [arch])]  # fmt: skip
        if not found:
            raise _missing(f"{image} image", f"an Image asset named {image}-image", source, arch)
        comp, asset = found[0]
        ref = asset.image.uri if asset.image else None
        if not ref:
            raise InputError(f"image {image} has no uri", source=source, field="image.uri")
        if not IMAGE_REF.fullmatch(ref):
            raise InputError(f"image {image}'s uri {ref[:80]!r} is not an image reference", source=source,
                             field="image.uri", expected="registry/path:tag")  # fmt: skip
        digest = asset.image.imageDigest if asset.image else None
        tar = tarballs.get(image)
        sha = None
        archive_uri = None
        if tar is not None and tar.archive is not None and tar.archive.sha256:
            sha, archive_uri = _need_sha256(image, tar, source, arch), _uri(tar)
        elif digest is not None and digest.startswith("sha256:"):
            sha = digest.removeprefix("sha256:")
        artifacts.append(NodeArtifact(image, "image", comp, ref, sha, archive_uri))

    k8s = [c for c in components if c.name == "kubernetes"]
    version = (k8s[0].gitTag or "") if k8s else ""
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
    versions = tuple((c.name, c.gitTag) for c in components if c.name in RUNTIME_COMPONENTS and c.gitTag
                     and re.fullmatch(r"v[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}", c.gitTag))  # fmt: skip
    date = doc.status.date if doc.status else None
    when = date.isoformat() if isinstance(date, dt.datetime) else date
    return ReleaseManifest(name, channel, number, version, source, tuple(artifacts), versions=versions, date=when,
                           arch=arch)  # fmt: skip


def archive_asset(name: str, url: str, data: bytes, description: str, arch: str = ARCH) -> dict[str, Any]:
    """A linux ``Archive`` asset of ``arch`` as the distro's manifests write one, with the checksums of ``data``;
    for the releases this tool writes (stand-in, built from source)."""
    return {
        "arch": [arch],
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


def load_manifest(
    url_or_path: str, mirror: Mirror | None = None, *, timeout: float = 10.0, arch: str = ARCH
) -> ReleaseManifest:
    location = manifest_location(url_or_path, mirror)
    data = fetch.read(location, timeout=timeout, what="release manifest")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("release manifest is not UTF-8 text", source=location) from None
    return dataclasses.replace(parse_manifest(text, location, arch), sha256=hashlib.sha256(data).hexdigest())
