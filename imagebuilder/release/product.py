"""``build --<product>-release vX.Y.Z`` (or ``<PRODUCT>_RELEASE_VERSION``; names from the profile, as the reference
tool spells them): build the image a given product release pins.

The reference tool reads the product's release index (``kind: Release``, ``spec.releases[]`` of ``{version,
bundleManifestUrl}``), then that release's bundle manifest (``kind: Bundles``), whose versions bundle for the
Kubernetes minor names the distro release manifest (``eksD.manifestUrl``). That manifest is what the build then
uses, exactly as if it had been given with ``--release-manifest``; the same versions bundle names the line's container
runtime (``eksD.containerd``, ``eksD.crictl``: tarballs with their sha256 and sha512), which the image gets instead of
the OS's. With a mirror every document is read from it
(mirrors keep upstream paths), so an air-gapped site pins a release too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from imagebuilder.core import fetch
from imagebuilder.core.errors import InputError, did_you_mean
from imagebuilder.core.fetch import Mirror
from imagebuilder.core.files import parse_yaml_documents
from imagebuilder.release.catalog import ReleaseChannel
from imagebuilder.release.manifest import NodeArtifact
from imagebuilder.release.profile import load_profile


def flag() -> str:
    """The reference tool's flag, ``--<product short name>-release``."""
    return f"--{load_profile().product.short_name}-release"


def env_name() -> str:
    """The reference tool's variable, ``<PRODUCT>_RELEASE_VERSION``."""
    return f"{load_profile().product.env_prefix}_RELEASE_VERSION"


_VERSION = re.compile(r"v[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}(-[0-9A-Za-z.-]{1,64})?", re.ASCII)  # ASCII digits only


def release_index_url() -> str:
    return f"https://{load_profile().hosts.assets}/releases/eks-a/manifest.yaml"


def check_version(value: str, where: str | None = None) -> str:
    if not _VERSION.fullmatch(value):
        raise InputError(
            f"'{value[:40]}' is not a release version",
            field=where or flag(),
            expected="vMAJOR.MINOR.PATCH, e.g. v0.21.3",
        )
    return value


def requested_release(given: str | None) -> str | None:
    """The product release a task pins: the flag's value, else the reference tool's variable (``<PRODUCT>_RELEASE_
    VERSION``), each checked (exit 2 naming the one that is wrong, the variable even when the flag wins); None: none."""
    import os

    env_release = os.environ.get(env_name()) or None
    if env_release:
        check_version(env_release, env_name())
    return check_version(given) if given else env_release


def _document(url: str, mirror: Mirror | None, what: str) -> tuple[Any, str]:
    where = mirror.locate(url) if mirror else url
    data = fetch.read(where, timeout=30, what=what)
    docs = parse_yaml_documents(data.decode("utf-8", errors="replace"), where)
    return (docs[0] if docs else None), where


@dataclass(frozen=True)
class Pinned:
    """What a product release pins for one release line: the distro release manifest, and the container runtime its
    bundle ships for that line (``eksD.containerd`` and ``eksD.crictl``: absent from older bundles)."""

    version: str
    index_url: str
    bundle_url: str
    manifest_url: str
    #: the runtime's tarballs (names ``containerd`` and ``crictl``), with the sha256 and sha512 the bundle states
    runtime: tuple[NodeArtifact, ...] = ()
    #: component -> version, read off the tarballs' paths (``.../containerd/v2.3.1/...``): containerd, cri-tools
    versions: tuple[tuple[str, str], ...] = ()

    def version_of(self, component: str) -> str | None:
        return dict(self.versions).get(component)

    @property
    def ships_runtime(self) -> bool:
        """The bundle ships the line's containerd (older bundles name none: the line's own is taken then)."""
        return any(a.name == "containerd" for a in self.runtime)


#: the bundle's runtime: field under ``eksD`` -> (artifact name, component: the URL's segment before the version)
_BUNDLE_RUNTIME = {"containerd": ("containerd", "containerd"), "crictl": ("crictl", "cri-tools")}
_URI = re.compile(r"https?://[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?/[A-Za-z0-9._~/%+-]{1,1000}")


def _bundle_runtime(eksd: dict[str, Any], where: str, minor: str) -> tuple[tuple[NodeArtifact, ...], dict[str, str]]:
    artifacts: list[NodeArtifact] = []
    versions: dict[str, str] = {}
    for key, (name, component) in _BUNDLE_RUNTIME.items():
        entry = eksd.get(key)
        if entry is None or entry == "":  # an older bundle: the line's runtime comes from the catalog
            continue
        field = f"versionsBundles[kubeVersion={minor}].eksD.{key}"
        if not isinstance(entry, dict):
            raise InputError("is not an artifact", source=where, field=field, expected="{uri, sha256, sha512}")
        uri, sha256, sha512 = entry.get("uri"), entry.get("sha256"), entry.get("sha512")
        if not isinstance(uri, str) or not _URI.fullmatch(uri) or ".." in uri.split("/"):
            raise InputError(f"{str(uri)[:80]!r} is not an artifact URL", source=where, field=f"{field}.uri",
                             expected="an http(s) URL of the tarball")  # fmt: skip
        if not isinstance(sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise InputError("missing or not a SHA-256", source=where, field=f"{field}.sha256",
                             expected="64 lower-case hex digits")  # fmt: skip
        if sha512 not in (None, "") and (not isinstance(sha512, str) or not re.fullmatch(r"[0-9a-f]{128}", sha512)):
            raise InputError("not a SHA-512", source=where, field=f"{field}.sha512",
                             expected="128 lower-case hex digits")  # fmt: skip
        artifacts.append(NodeArtifact(name, "archive", component, uri, sha256, sha512=sha512 or None))
        found = re.search(rf"/{component}/(v[0-9]+\.[0-9]+\.[0-9]+)/", uri)
        if found:
            versions[component] = found.group(1)
    return tuple(artifacts), versions


def pinned_for(version: str, channel: ReleaseChannel, mirror: Mirror | None, *, index_url: str | None = None) -> Pinned:
    """What product release ``version`` pins for ``channel``: its distro manifest and its bundle's runtime."""
    index_at = index_url or release_index_url()
    index, where = _document(index_at, mirror, "release index")
    releases = index.get("spec", {}).get("releases") if isinstance(index, dict) else None
    if not isinstance(releases, list):
        raise InputError("not a release index (no spec.releases)", source=where)
    urls = {r.get("version"): r.get("bundleManifestUrl") for r in releases if isinstance(r, dict)}
    known = [v for v in urls if isinstance(v, str)]
    if version not in urls:
        raise InputError(
            f"release {version} is not in the release index{did_you_mean(version, known)}",
            field=flag(),
            source=where,
            expected=f"one of {', '.join(known[-5:])}" if known else None,
        )
    bundle_url = urls[version]
    if not isinstance(bundle_url, str) or not bundle_url.startswith(("https://", "http://")):
        raise InputError(f"release {version} has no bundle manifest URL", source=where, field="spec.releases")
    bundles, bwhere = _document(bundle_url, mirror, "bundle manifest")
    minor = channel.name.replace("-", ".")
    vbs = bundles.get("spec", {}).get("versionsBundles") if isinstance(bundles, dict) else None
    if not isinstance(vbs, list):
        raise InputError("not a bundle manifest (no spec.versionsBundles)", source=bwhere)
    for vb in vbs:
        if isinstance(vb, dict) and str(vb.get("kubeVersion")) == minor:
            found = vb.get("eksD")
            eksd: dict[str, Any] = found if isinstance(found, dict) else {}
            url = eksd.get("manifestUrl")
            if not isinstance(url, str) or not url.startswith(("https://", "http://")):
                raise InputError(
                    f"the {minor} bundle has no distro manifest URL", source=bwhere, field="eksD.manifestUrl"
                )
            runtime, versions = _bundle_runtime(eksd, bwhere, minor)
            return Pinned(version, index_at, bundle_url, url, runtime, tuple(sorted(versions.items())))
    have = sorted(str(vb.get("kubeVersion")) for vb in vbs if isinstance(vb, dict))
    raise InputError(
        f"release {version} does not ship Kubernetes {minor}",
        field="--release-channel",
        source=bwhere,
        expected=f"one of {', '.join(have)}",
    )


def distro_manifest_for(
    version: str, channel: ReleaseChannel, mirror: Mirror | None, *, index_url: str | None = None
) -> str:
    """The distro release manifest URL that product release ``version`` pins for ``channel``."""
    return pinned_for(version, channel, mirror, index_url=index_url).manifest_url


__all__ = [
    "Pinned",
    "check_version",
    "distro_manifest_for",
    "env_name",
    "flag",
    "pinned_for",
    "release_index_url",
    "requested_release",
]
