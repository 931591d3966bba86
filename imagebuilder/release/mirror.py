"""Create a mirror: a release manifest and every node artifact it names, copied to a directory that keeps the
upstream URL paths.

``https://host/a/b.yaml`` is ``<mirror>/a/b.yaml``, so one directory, copied to an air-gapped site and served or
used in place, answers for every upstream URL (see :class:`imagebuilder.core.fetch.Mirror`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from imagebuilder.core import disk, fetch, progress
from imagebuilder.core.fetch import Expected, Mirror
from imagebuilder.core.files import atomic_write, sha256_file
from imagebuilder.core.progress import Transfers
from imagebuilder.release.manifest import ReleaseManifest, parse_manifest

# --- creating a mirror -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MirrorItem:
    url: str
    sha256: str
    path: Path
    status: str  # "downloaded" | "verified" (already there)
    size: int


def file_sha256(path: Path) -> str | None:
    """SHA-256 of a file, or None when it does not exist."""
    return sha256_file(path) if path.is_file() else None


def mirror_items(manifest: ReleaseManifest) -> list[tuple[str, str]]:
    """(url, sha256) of every node artifact file the manifest names (images: their OCI tarballs)."""
    items: list[tuple[str, str]] = []
    for a in manifest.artifacts:
        if a.kind != "image" and a.sha256:
            items.append((a.uri, a.sha256))
        elif a.archive_uri and a.sha256:
            items.append((a.archive_uri, a.sha256))
    return list(dict.fromkeys(items))


def create_mirror(
    manifest_url: str,
    dest: Path,
    *,
    source: Mirror | None = None,
    transfers: Transfers | None = None,
) -> tuple[ReleaseManifest, list[MirrorItem]]:
    """Copy a release manifest and every node artifact it names into ``dest``, keeping the URL paths.

    Each file is checksum-verified; a file already in ``dest`` with the right sha256 is kept (reruns converge).
    """
    dest.mkdir(parents=True, exist_ok=True)
    # the downloads a killed run left half-written anywhere in the tree (a live run's are kept)
    disk.release(disk.stale_partials(dest, recursive=True))
    target_mirror = Mirror(str(dest.resolve()))
    location = source.locate(manifest_url) if source else manifest_url
    raw = fetch.read(location, what="release manifest")
    manifest = parse_manifest(raw.decode("utf-8"), location)
    results = []
    # every location is resolved (and an escaping one refused) before anything is written
    plan = [(url, sha, Path(target_mirror.locate(url)), source.locate(url) if source else url)
            for url, sha in mirror_items(manifest)]  # fmt: skip
    for url, sha, target, origin in plan:
        if file_sha256(target) == sha:
            results.append(MirrorItem(url, sha, target, "verified", target.stat().st_size))
            continue
        fetch.download(
            origin, target, Expected(None, {"sha256": sha}), progress=progress.start(transfers, url.rsplit("/", 1)[-1])
        )
        results.append(MirrorItem(url, sha, target, "downloaded", target.stat().st_size))
    manifest_target = Path(target_mirror.locate(manifest_url))
    with atomic_write(manifest_target, "wb") as fh:
        fh.write(raw)
    return manifest, results
