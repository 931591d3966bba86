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
from imagebuilder.release.catalog import Runtime
from imagebuilder.release.manifest import NodeArtifact, ReleaseManifest, parse_manifest
from imagebuilder.release.product import Pinned
from imagebuilder.release.upstream import upstream_runtime

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


def runtime_extras(
    manifest: ReleaseManifest, runtime: Runtime | None, pinned: Pinned | None, source: Mirror | None
) -> tuple[tuple[NodeArtifact, ...], tuple[tuple[str, bytes], ...]]:
    """What a mirror carries besides the manifest's artifacts for the node's runtime, as a build from it reads it:
    the product bundle's runtime tarballs when it ships them, else nothing when the release ships its own, else
    the line's ``runtime`` from its projects' releases with the checksum files that vouch for it (as read); None:
    the builds from the mirror take the OS's runtime (``build --runtime os``)."""
    if pinned is not None and pinned.ships_runtime:
        return pinned.runtime, ()
    if manifest.ships_runtime or runtime is None:
        return (pinned.runtime if pinned else ()), ()
    up = upstream_runtime(runtime, source)
    return (*(pinned.runtime if pinned else ()), *up.artifacts), up.sums


def mirror_plan(
    manifest: ReleaseManifest, dest: Mirror, runtime: Runtime | None, pinned: Pinned | None, source: Mirror | None
) -> tuple[list[tuple[str, dict[str, str], Path]], tuple[tuple[str, bytes], ...]]:
    """(url, hashes, target in ``dest``) of every file a mirror of ``manifest`` holds, and the runtime's checksum
    files (:func:`runtime_extras`). The release's own locations are resolved first (an escaping one refused) before
    anything else is read."""
    own = [(url, hashes, Path(dest.locate(url))) for url, hashes in mirror_items(manifest)]
    extra, sums = runtime_extras(manifest, runtime, pinned, source)
    known = {url for url, _, _ in own}
    more = [(url, hashes, Path(dest.locate(url))) for url, hashes in mirror_items(manifest, extra) if url not in known]
    return own + more, sums


def create_mirror(
    manifest_url: str,
    dest: Path,
    *,
    runtime: Runtime | None,
    source: Mirror | None = None,
    transfers: Transfers | None = None,
    pinned: Pinned | None = None,
) -> tuple[ReleaseManifest, list[MirrorItem]]:
    """Copy a release manifest and every node artifact it names into ``dest``, keeping the URL paths; with
    ``pinned`` (``--<product>-release``) also the product's release index and bundle manifest, as read, and the
    runtime tarballs the bundle ships for the line; for a release that ships no runtime (the distro's), the line's
    ``runtime`` from its projects' releases and their checksum files (:func:`runtime_extras`; None: builds from
    the mirror take the OS's runtime).

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
    # every location is resolved (and an escaping one refused) before anything is written
    items, sums = mirror_plan(manifest, target_mirror, runtime, pinned, source)
    documents += sums
    results = []
    plan = [(url, hashes, target, source.locate(url) if source else url) for url, hashes, target in items]
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
