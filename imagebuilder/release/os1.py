"""OS-1 images over TUF (spec 1.2, 4.5 "D1"): names, the pinned root, the signed metadata, the verified target.

``root.json`` comes from the OS-1 cache host (or ``--root``) and must match the SHA-512 pinned in the profile (or
``--root-sha512``); the metadata and the target then go through :mod:`imagebuilder.release.tufclient`, the path
every TUF download takes (the metal image is converted lz4 -> gzip on the way).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from imagebuilder.core import fetch
from imagebuilder.core.errors import InputError
from imagebuilder.core.fetch import Expected
from imagebuilder.core.progress import Transfers
from imagebuilder.core.safepath import safe_join
from imagebuilder.core.stream import Copy, Lz4ToGzip, Transform
from imagebuilder.release import tufclient
from imagebuilder.release.os1_variants import VARIANTS
from imagebuilder.release.profile import load_profile
from imagebuilder.release.tufclient import TufRepository

OS1_EXPIRED = "the mirror is stale; refresh it from the OS-1 repository"


@dataclass(frozen=True)
class Os1Target:
    variant: str
    kubernetes: str
    name: str
    metadata_url: str
    targets_url: str

    @property
    def output_name(self) -> str:
        """The file written: the OVA as published; the metal image as ``<name without .lz4>.gz``."""
        return self.name.removesuffix(".lz4") + ".gz" if self.name.endswith(".lz4") else self.name

    def transform(self) -> Transform:
        return Lz4ToGzip() if self.name.endswith(".lz4") else Copy()

    @property
    def repository(self) -> TufRepository:
        return TufRepository(self.metadata_url, self.targets_url, OS1_EXPIRED)


def os1_target(
    variant: str, kubernetes: str, metadata_url: str | None = None, targets_url: str | None = None
) -> Os1Target:
    """Names and URLs of spec 4.5 for ``variant`` (vsphere|baremetal) and ``kubernetes`` (1.21 ... 1.24)."""
    from imagebuilder.release.catalog import load_catalog

    if variant not in VARIANTS:
        raise InputError(f"'{variant}' is not a variant", field="--variant", expected=" or ".join(VARIANTS))
    catalog = load_catalog()
    channel = catalog.channel_for_kubernetes(kubernetes, "--release-channel")
    p = load_profile()
    os1 = p.os1
    name_variant = os1.vsphere_variant if variant == "vsphere" else os1.baremetal_variant
    values = {
        "os": next(o.name for o in catalog.operating_systems.values() if o.kind == "OS-1"),
        "variant": name_variant,
        "kubernetes": channel.minor,
        "version": p.versions.os1_image,
        "extension": "ova" if variant == "vsphere" else "img.lz4",
        "os1_updates": p.hosts.os1_updates,
    }
    return Os1Target(
        variant=variant,
        kubernetes=channel.minor,
        name=os1.target_name.format(**values),
        metadata_url=tufclient.slash(metadata_url or os1.metadata_url.format(**values)),
        targets_url=tufclient.slash(targets_url or os1.targets_url.format(**values)),
    )


def root_url() -> str:
    p = load_profile()
    return p.os1.root_url.format(os1_cache=p.hosts.os1_cache)


def pinned_root(root: str | None, root_sha512: str | None) -> bytes:
    """The root role: ``root`` (a file or URL) or the cache host's, checked against the pinned SHA-512."""
    source = root or root_url()
    data = fetch.read(source, timeout=30, what="root.json")
    return tufclient.pinned(data, root_sha512 or load_profile().os1.root_sha512, source)


def target_info(target: Os1Target, root: bytes) -> tuple[Expected, str]:
    """Refresh the signed metadata and return the target's signed length/hashes and its download URL."""
    return tufclient.target_info(target.repository, target.name, root)


def download(target: Os1Target, dest_dir: Path, root: bytes, transfers: Transfers | None = None) -> Path:
    dest = safe_join(dest_dir, target.output_name)
    return tufclient.download(target.repository, target.name, dest, root, target.transform(), transfers)
