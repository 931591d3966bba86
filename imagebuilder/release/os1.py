"""OS-1 images over TUF (spec 1.2, 4.5 "D1"): names, the pinned root, the signed metadata, the verified target.

1. ``root.json`` comes from the OS-1 cache host (or ``--root``) and must match the SHA-512 pinned in the profile
   (or ``--root-sha512``): it is the trust anchor, so it is checked before anything else is believed.
2. python-tuf's ``Updater`` refreshes the metadata from there, walking root rotations forward, checking signatures,
   versions (no rollback) and expiry; the metadata is kept per repository in the workspace, so a later run notices
   a rollback too.
3. The target's signed length and hashes go to :func:`imagebuilder.core.fetch.download`, which streams it
   once (for bare metal: lz4 -> gzip on the way) and renames only a verified result into place.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from imagebuilder.core import fetch, grammar
from imagebuilder.core import progress as _progress
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.fetch import Expected
from imagebuilder.core.paths import workspace_root
from imagebuilder.core.progress import Transfers
from imagebuilder.core.safepath import safe_join
from imagebuilder.core.stream import Copy, Lz4ToGzip, Transform
from imagebuilder.release.profile import load_profile
from imagebuilder.release.tuffetch import TufFetcher

VARIANTS = ("vsphere", "baremetal")


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


def os1_target(
    variant: str, kubernetes: str, metadata_url: str | None = None, targets_url: str | None = None
) -> Os1Target:
    """Names and URLs of spec 4.5 for ``variant`` (vsphere|baremetal) and ``kubernetes`` (1.21 ... 1.24)."""
    from imagebuilder.release.catalog import load_catalog

    if variant not in VARIANTS:
        raise InputError(f"'{variant}' is not a variant", field="--variant", expected=" or ".join(VARIANTS))
    catalog = load_catalog()
    channel = catalog.channel_for_kubernetes(kubernetes)
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
        metadata_url=_slash(metadata_url or os1.metadata_url.format(**values)),
        targets_url=_slash(targets_url or os1.targets_url.format(**values)),
    )


def _slash(url: str) -> str:
    return url if url.endswith("/") else url + "/"


def root_url() -> str:
    p = load_profile()
    return p.os1.root_url.format(os1_cache=p.hosts.os1_cache)


def pinned_root(root: str | None, root_sha512: str | None) -> bytes:
    """The root role: ``root`` (a file or URL) or the cache host's, checked against the pinned SHA-512."""
    want = (root_sha512 or load_profile().os1.root_sha512).strip().lower()
    if not grammar.is_hex_digest(want, "sha512"):
        raise InputError(f"'{want}' is not a SHA-512", field="--root-sha512", expected="128 hex digits")
    source = root or root_url()
    data = fetch.read(source, timeout=30, what="root.json")
    got = hashlib.sha512(data).hexdigest()
    if got != want:
        raise ExternalError(
            f"root.json from {source} has SHA-512 {got}, not the pinned {want}: it is not trusted",
            hint="check the root file and the SHA-512 the OS-1 documentation gives (--root-sha512 overrides the pin)",
        )
    return data


def metadata_dir(target: Os1Target) -> Path:
    """Trusted metadata kept between runs (rollback protection), per repository."""
    key = hashlib.sha256(target.metadata_url.encode()).hexdigest()[:16]
    path = workspace_root() / "tuf" / key
    path.mkdir(parents=True, exist_ok=True)
    return path


def target_info(target: Os1Target, root: bytes) -> tuple[Expected, str]:
    """Refresh the signed metadata and return the target's signed length/hashes and its download URL."""
    from tuf.api import exceptions
    from tuf.ngclient.updater import Updater

    try:
        updater = Updater(
            metadata_dir=str(metadata_dir(target)),
            metadata_base_url=target.metadata_url,
            target_base_url=target.targets_url,
            bootstrap=root,
            fetcher=TufFetcher(),
        )
        updater.refresh()
        info = updater.get_targetinfo(target.name)
    except exceptions.ExpiredMetadataError as exc:
        raise ExternalError(
            f"the repository's signed metadata has expired: {exc}",
            hint="the mirror is stale; refresh it from the OS-1 repository",
        ) from None
    except exceptions.BadVersionNumberError as exc:
        raise ExternalError(
            f"rollback refused: {exc}", hint="the repository serves older metadata than this host has already seen"
        ) from None
    except exceptions.UnsignedMetadataError as exc:
        raise ExternalError(
            f"the repository's metadata is not properly signed: {exc}",
            hint="the mirror or a proxy altered it; do not use it",
        ) from None
    except exceptions.RepositoryError as exc:
        raise ExternalError(f"the repository's metadata failed verification: {type(exc).__name__}: {exc}") from None
    except exceptions.DownloadError as exc:
        # python-tuf's DownloadError often has an empty message; its cause says what happened
        reason = str(exc) or str(exc.__cause__ or exc.__context__ or "") or type(exc).__name__
        raise ExternalError(
            f"fetching metadata from {target.metadata_url} failed: {reason}",
            hint="check --metadata-url and the network",
        ) from None
    except ValueError as exc:  # a root that is not TUF metadata
        raise ExternalError(f"root.json is not valid TUF root metadata: {exc}") from None
    if info is None:
        raise ExternalError(
            f"the repository has no target {target.name}",
            hint="check --variant and --kubernetes (KUBEVERSION)",
        )
    # with consistent snapshots the repository stores targets under "<hash>.<name>" (python-tuf's own rule)
    path = info.get_prefixed_paths()[0] if _consistent_snapshot(target) else info.path
    return Expected(info.length, dict(info.hashes)), target.targets_url + quote(path)


def _consistent_snapshot(target: Os1Target) -> bool:
    """From the root the Updater trusts now (after any rotation), which it keeps as ``root.json``."""
    # the documented import; tuf re-exports Root without marking it for type checkers
    from tuf.api.metadata import Metadata, Root  # type: ignore[attr-defined]

    root = Metadata[Root].from_file(str(metadata_dir(target) / "root.json"))
    return bool(root.signed.consistent_snapshot)


def download(target: Os1Target, dest_dir: Path, root: bytes, transfers: Transfers | None = None) -> Path:
    expected, url = target_info(target, root)
    advance = _progress.start(transfers, target.name, expected.length or 0)
    dest = safe_join(dest_dir, target.output_name)
    return fetch.download(url, dest, expected, target.transform(), progress=advance)
