"""``<name>.spdx.json``: an SPDX 2.3 document of a node image.

What it lists, and from where: every installed package from the image's own database (name, version,
architecture, PURL, declared license when known), the Kubernetes artifacts from the release manifest with the
SHA-256 and URL the build verified them against, the container runtime's binaries with their digests, and the
source image with its digest. The image itself is the
document's one described package; everything else is ``CONTAINS``-ed by it, and it is a ``DESCENDANT_OF`` the
image it was built or customized from. Written as data (never templated), validated in tests by the SPDX
project's own tools.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from imagebuilder import __version__
from imagebuilder.attest.packages import Inventory, Package
from imagebuilder.release.profile import load_profile

SPDX_VERSION = "SPDX-2.3"
MEDIA_TYPE = "application/spdx+json"
IMAGE_ID = "SPDXRef-Image"
_NOASSERTION = "NOASSERTION"
#: which runtime version (the plan's containerd, runc, crictl) each runtime binary states
RUNTIME_VERSION_OF = {"containerd": "containerd", "ctr": "containerd", "containerd-shim-runc-v2": "containerd",
                      "runc": "runc", "crictl": "crictl"}  # fmt: skip


@dataclass(frozen=True)
class Component:
    """Something the image carries that is not a package of its OS: a Kubernetes binary, archive or image."""

    name: str
    kind: str  #: binary, archive or image (the release manifest's kinds), or input (what the build used)
    uri: str
    sha256: str | None
    #: what it is, when not a Kubernetes artifact (a build input: the hardening content)
    comment: str | None = None


@dataclass(frozen=True)
class Origin:
    """The image this one was made from: the source image of a build, or the input of ``image.customize``."""

    uri: str
    digests: dict[str, str]  #: algorithm (sha256, sha512) -> hex
    comment: str


def _spdx_id(prefix: str, index: int, name: str) -> str:
    return f"SPDXRef-{prefix}-{index}-" + (re.sub(r"[^A-Za-z0-9.-]", "-", name)[:60] or "x")


def purl(inventory: Inventory, package: Package) -> str:
    """The package URL (purl-spec): ``pkg:deb/ubuntu/openssl@3.0.2-0ubuntu1?arch=amd64&distro=ubuntu-22.04``."""
    version = quote(package.version, safe="")
    qualifiers = [f"arch={quote(package.arch, safe='')}"] if package.arch else []
    if inventory.kind == "rpm" and ":" in package.version:
        epoch, _, rest = package.version.partition(":")
        version, qualifiers = quote(rest, safe=""), [*qualifiers, f"epoch={quote(epoch, safe='')}"]
    qualifiers.append(f"distro={quote(inventory.distro, safe='')}-{quote(inventory.distro_version, safe='')}")
    return f"pkg:{inventory.kind}/{quote(inventory.distro, safe='')}/{quote(package.name, safe='')}@{version}?" + (
        "&".join(sorted(qualifiers))
    )


def _checksums(digests: dict[str, str]) -> list[dict[str, str]]:
    names = {"sha256": "SHA256", "sha512": "SHA512", "sha1": "SHA1"}
    return [{"algorithm": names[a], "checksumValue": v.lower()} for a, v in sorted(digests.items()) if a in names]


def _download_location(uri: str) -> str:
    return uri if re.match(r"^(https?|ftp)://[^\s]+$", uri) else _NOASSERTION


def _package(spdx_id: str, name: str, **fields: Any) -> dict[str, Any]:
    return {
        "SPDXID": spdx_id,
        "name": name,
        "downloadLocation": _NOASSERTION,
        "filesAnalyzed": False,
        "licenseConcluded": _NOASSERTION,
        "licenseDeclared": _NOASSERTION,
        "copyrightText": _NOASSERTION,
        **fields,
    }


def _component(index: int, c: Component) -> dict[str, Any]:
    fields: dict[str, Any] = {"downloadLocation": _download_location(c.uri),
                              "comment": c.comment or f"Kubernetes {c.kind}"}  # fmt: skip
    if c.kind == "image":  # a container image reference: registry/repository:tag, pinned by its digest
        repository, tag = c.uri.rsplit(":", 1) if ":" in c.uri.rsplit("/", 1)[-1] else (c.uri, "")
        fields["primaryPackagePurpose"] = "CONTAINER"
        if c.sha256:
            qualifiers = f"repository_url={quote(repository, safe='/')}"
            if tag:
                qualifiers += f"&tag={quote(tag, safe='')}"
            fields["externalRefs"] = [{
                "referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                "referenceLocator": f"pkg:oci/{quote(repository.split('/')[-1], safe='')}@sha256%3A{c.sha256}?"
                + qualifiers,
            }]  # fmt: skip
    else:
        fields["primaryPackagePurpose"] = {"binary": "APPLICATION", "input": "OTHER"}.get(c.kind, "ARCHIVE")
    if c.sha256:
        fields["checksums"] = _checksums({"sha256": c.sha256})
    return _package(_spdx_id("Input" if c.kind == "input" else "Kubernetes", index, c.name), c.name, **fields)


def document(
    *,
    name: str,
    sha256: str,
    inventory: Inventory,
    components: Iterable[Component] = (),
    carry: Iterable[dict[str, Any]] = (),
    origin: Origin | None = None,
    annotations: Iterable[str] = (),
    created: dt.datetime | None = None,
    runtime_versions: dict[str, str] | None = None,
    arch: str = "amd64",
) -> dict[str, Any]:
    """The SPDX document of the image file ``name`` with digest ``sha256``: its OS packages (``inventory``), its
    Kubernetes ``components`` (or entries ``carry``-ed from the document of the image it was made from), and the
    image it descends from. The runtime's binaries the image holds (``inventory.runtime``) are listed with their
    digests, and with their versions where ``runtime_versions`` (containerd, runc, crictl) states them; ``arch``: the
    architecture the image is for, named in its description."""
    when = (created or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    tool = f"Tool: image-builder-{__version__}"
    image: dict[str, Any] = _package(
        IMAGE_ID, name, checksums=_checksums({"sha256": sha256}), primaryPackagePurpose="OPERATING-SYSTEM",
        comment=f"a Kubernetes node image ({inventory.distro} {inventory.distro_version}, linux/{arch})",
    )  # fmt: skip
    notes = [
        {"annotationDate": when, "annotationType": "OTHER", "annotator": tool, "comment": text} for text in annotations
    ]
    if notes:
        image["annotations"] = notes
    packages = [image]
    relationships = [
        {"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES", "relatedSpdxElement": IMAGE_ID}
    ]

    def contains(pkg: dict[str, Any]) -> None:
        packages.append(pkg)
        relationships.append(
            {"spdxElementId": IMAGE_ID, "relationshipType": "CONTAINS", "relatedSpdxElement": pkg["SPDXID"]}
        )

    for i, p in enumerate(inventory.packages):
        contains(_package(
            _spdx_id("Package", i, p.name), p.name, versionInfo=p.version,
            licenseDeclared=p.license or _NOASSERTION,
            **({"sourceInfo": f"built from source package {p.source}"} if p.source else {}),
            externalRefs=[{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                           "referenceLocator": purl(inventory, p)}],
        ))  # fmt: skip
    for i, c in enumerate(components):
        contains(_component(i, c))
    for i, (path, digest) in enumerate(sorted(inventory.runtime.items())):
        binary = path.rsplit("/", 1)[-1]
        version = (runtime_versions or {}).get(RUNTIME_VERSION_OF.get(binary, ""))
        contains(_package(_spdx_id("Runtime", i, binary), binary, checksums=_checksums({"sha256": digest}),
                          primaryPackagePurpose="APPLICATION", comment=f"container runtime binary {path}",
                          **({"versionInfo": version} if version else {})))  # fmt: skip
    for pkg in carry:
        contains(dict(pkg))
    if origin is not None:
        packages.append(_package(
            "SPDXRef-Origin", origin.uri.rsplit("/", 1)[-1] or origin.uri,
            downloadLocation=_download_location(origin.uri),
            checksums=_checksums(origin.digests), comment=origin.comment,
        ))  # fmt: skip
        relationships.append(
            {"spdxElementId": IMAGE_ID, "relationshipType": "DESCENDANT_OF", "relatedSpdxElement": "SPDXRef-Origin"}
        )
    namespace = load_profile().attestations.spdx_namespace.format(name=quote(name, safe=""), sha256=sha256 or "none")
    return {
        "spdxVersion": SPDX_VERSION,
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": name,
        "documentNamespace": namespace,
        "creationInfo": {"created": when, "creators": [tool]},
        "documentDescribes": [IMAGE_ID],
        "packages": packages,
        "relationships": relationships,
    }


def carried(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The Kubernetes components a document lists, as they are: ``image.customize`` adds no Kubernetes artifact, so
    the customized image's document carries the input's entries unchanged."""
    return [p for p in doc.get("packages", []) if str(p.get("SPDXID", "")).startswith("SPDXRef-Kubernetes-")]


def package_names(doc: dict[str, Any]) -> dict[str, str]:
    """OS package name -> version, as the document lists them."""
    return {
        p["name"]: p.get("versionInfo", "")
        for p in doc.get("packages", [])
        if str(p.get("SPDXID", "")).startswith("SPDXRef-Package-")
    }
