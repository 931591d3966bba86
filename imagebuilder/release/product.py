"""``build --<product>-release vX.Y.Z`` (or ``<PRODUCT>_RELEASE_VERSION``; names from the profile, as the reference
tool spells them): build the image a given product release pins.

The reference tool reads the product's release index (``kind: Release``, ``spec.releases[]`` of ``{version,
bundleManifestUrl}``), then that release's bundle manifest (``kind: Bundles``), whose versions bundle for the
Kubernetes minor names the distro release manifest (``eksD.manifestUrl``). That manifest is what the build then
uses, exactly as if it had been given with ``--release-manifest``. With a mirror every document is read from it
(mirrors keep upstream paths), so an air-gapped site pins a release too.
"""

from __future__ import annotations

import re
from typing import Any

from imagebuilder.core import fetch
from imagebuilder.core.errors import InputError, did_you_mean
from imagebuilder.core.fetch import Mirror
from imagebuilder.core.files import parse_yaml_documents
from imagebuilder.release.catalog import ReleaseChannel
from imagebuilder.release.profile import load_profile


def flag() -> str:
    """The reference tool's flag, ``--<product short name>-release``."""
    return f"--{load_profile().product.short_name}-release"


def env_name() -> str:
    """The reference tool's variable, ``<PRODUCT>_RELEASE_VERSION``."""
    return f"{load_profile().product.env_prefix}_RELEASE_VERSION"


_VERSION = re.compile(r"v\d{1,4}\.\d{1,4}\.\d{1,4}(-[0-9A-Za-z.-]{1,64})?")


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


def _document(url: str, mirror: Mirror | None, what: str) -> tuple[Any, str]:
    where = mirror.locate(url) if mirror else url
    data = fetch.read(where, timeout=30, what=what)
    docs = parse_yaml_documents(data.decode("utf-8", errors="replace"), where)
    return (docs[0] if docs else None), where


def distro_manifest_for(
    version: str, channel: ReleaseChannel, mirror: Mirror | None, *, index_url: str | None = None
) -> str:
    """The distro release manifest URL that product release ``version`` pins for ``channel``."""
    index, where = _document(index_url or release_index_url(), mirror, "release index")
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
            url = (vb.get("eksD") or {}).get("manifestUrl")
            if not isinstance(url, str) or not url.startswith(("https://", "http://")):
                raise InputError(
                    f"the {minor} bundle has no distro manifest URL", source=bwhere, field="eksD.manifestUrl"
                )
            return url
    have = sorted(str(vb.get("kubeVersion")) for vb in vbs if isinstance(vb, dict))
    raise InputError(
        f"release {version} does not ship Kubernetes {minor}",
        field="--release-channel",
        source=bwhere,
        expected=f"one of {', '.join(have)}",
    )


__all__ = ["check_version", "distro_manifest_for", "env_name", "flag", "release_index_url"]
