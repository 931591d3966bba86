"""Create a mirror: a release manifest and every node artifact it names, copied to a directory that keeps the
upstream URL paths.

``https://host/a/b.yaml`` is ``<mirror>/a/b.yaml``, so one directory, copied to an air-gapped site and served or
used in place, answers for every upstream URL (see :class:`imagebuilder.core.fetch.Mirror`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from imagebuilder.core import disk, fetch, progress
from imagebuilder.core.fetch import Expected, Mirror
from imagebuilder.core.files import atomic_write, sha256_file
from imagebuilder.core.progress import Transfers
from imagebuilder.release.manifest import NodeArtifact, ReleaseManifest, parse_manifest
from imagebuilder.release.product import Pinned

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


def mirror_items(manifest: ReleaseManifest, extra: Sequence[NodeArtifact] = ()) -> list[tuple[str, dict[str, str]]]:
    """(url, hashes) of every node artifact file the manifest names (images: their OCI tarballs), and of ``extra``
    (a product release's runtime tarballs): sha256, and sha512 where the source states it."""
    items: dict[str, dict[str, str]] = {}
    for a in (*manifest.artifacts, *extra):
        url = a.archive_uri if a.kind == "image" else a.uri
        if url and a.sha256:
            items.setdefault(url, {"sha256": a.sha256, **({"sha512": a.sha512} if a.sha512 else {})})
    return list(items.items())


def create_mirror(
    manifest_url: str,
    dest: Path,
    *,
    source: Mirror | None = None,
    transfers: Transfers | None = None,
    pinned: Pinned | None = None,
) -> tuple[ReleaseManifest, list[MirrorItem]]:
    """Copy a release manifest and every node artifact it names into ``dest``, keeping the URL paths; with
    ``pinned`` (``--<product>-release``) also the product's release index and bundle manifest, as read, and the
    runtime tarballs the bundle ships for the line.

    Each file is checksum-verified (sha256, and sha512 where stated); a file already in ``dest`` with the right sha256
    is kept (reruns converge).
    """
    dest.mkdir(parents=True, exist_ok=True)
    # the downloads a killed run left half-written anywhere in the tree (a live run's are kept)
    disk.release(disk.stale_partials(dest, recursive=True))
    target_mirror = Mirror(str(dest.resolve()))
    location = source.locate(manifest_url) if source else manifest_url
    raw = fetch.read(location, what="release manifest")
    manifest = parse_manifest(raw.decode("utf-8"), location)
    documents = [(manifest_url, raw)]
    if pinned is not None:
        for url, what in ((pinned.index_url, "release index"), (pinned.bundle_url, "bundle manifest")):
            documents.append((url, fetch.read(source.locate(url) if source else url, what=what)))
    results = []
    # every location is resolved (and an escaping one refused) before anything is written
    plan = [(url, hashes, Path(target_mirror.locate(url)), source.locate(url) if source else url)
            for url, hashes in mirror_items(manifest, pinned.runtime if pinned else ())]  # fmt: skip
    targets = [(Path(target_mirror.locate(url)), data) for url, data in documents]
    for url, hashes, target, origin in plan:
        sha = hashes["sha256"]
        if file_sha256(target) == sha:
            results.append(MirrorItem(url, sha, target, "verified", target.stat().st_size))
            continue
        fetch.download(
            origin, target, Expected(None, hashes), progress=progress.start(transfers, url.rsplit("/", 1)[-1])
        )
        results.append(MirrorItem(url, sha, target, "downloaded", target.stat().st_size))
    # the documents last: a mirror that names an artifact holds it
    for target, data in targets:
        with atomic_write(target, "wb") as fh:
            fh.write(data)
    return manifest, results
