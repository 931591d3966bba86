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
from imagebuilder.release.manifest import ARCH, NodeArtifact, ReleaseManifest, parse_manifest
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
    up = upstream_runtime(runtime, source, manifest.arch)
    return (*(pinned.runtime if pinned else ()), *up.artifacts), up.sums


def mirror_plan(
    manifests: Sequence[ReleaseManifest],
    dest: Mirror,
    runtime: Runtime | None,
    pinned: Pinned | None,
    source: Mirror | None,
) -> tuple[list[tuple[str, dict[str, str], Path]], tuple[tuple[str, bytes], ...]]:
    """(url, hashes, target in ``dest``) of every file a mirror of a release holds, for each architecture it is
    read for (``manifests``: the release read for each), and the runtime's checksum files (:func:`runtime_extras`).
    The release's own locations are resolved first (an escaping one refused) before anything else is read."""
    own: dict[str, tuple[dict[str, str], Path]] = {}
    for manifest in manifests:
        for url, hashes in mirror_items(manifest):
            own.setdefault(url, (hashes, Path(dest.locate(url))))
    planned = dict(own)
    sums: list[tuple[str, bytes]] = []
    for manifest in manifests:
        extra, arch_sums = runtime_extras(manifest, runtime, pinned, source)
        sums += [s for s in arch_sums if s not in sums]
        for url, hashes in mirror_items(manifest, extra):
            planned.setdefault(url, (hashes, Path(dest.locate(url))))
    return [(url, hashes, target) for url, (hashes, target) in planned.items()], tuple(sums)


def create_mirror(
    manifest_url: str,
    dest: Path,
    *,
    runtime: Runtime | None,
    source: Mirror | None = None,
    transfers: Transfers | None = None,
    pinned: Pinned | None = None,
    arches: Sequence[str] = (ARCH,),
) -> tuple[ReleaseManifest, list[MirrorItem]]:
    """Copy a release manifest and every node artifact it names into ``dest``, keeping the URL paths; with
    ``pinned`` (``--<product>-release``) also the product's release index and bundle manifest, as read, and the
    runtime tarballs the bundle ships for the line; for a release that ships no runtime (the distro's), the line's
    ``runtime`` from its projects' releases and their checksum files (:func:`runtime_extras`; None: builds from
    the mirror take the OS's runtime).

    Each file is checksum-verified (sha256, and sha512 where stated); a file already in ``dest`` with the right sha256
    is kept (reruns converge). ``arches``: the architectures whose artifacts it carries (a manifest without one of
    them is refused, naming what is missing, before anything is downloaded).
    """
    dest.mkdir(parents=True, exist_ok=True)
    # the downloads a killed run left half-written anywhere in the tree (a live run's are kept)
    disk.release(disk.stale_partials(dest, recursive=True))
    target_mirror = Mirror(str(dest.resolve()))
    location = source.locate(manifest_url) if source else manifest_url
    raw = fetch.read(location, what="release manifest")
    manifests = [parse_manifest(raw.decode("utf-8"), location, a) for a in arches]
    manifest = manifests[0]
    documents = [(manifest_url, raw)]
    if pinned is not None:
        for url, what in ((pinned.index_url, "release index"), (pinned.bundle_url, "bundle manifest")):
            documents.append((url, fetch.read(source.locate(url) if source else url, what=what)))
    # every location is resolved (and an escaping one refused) before anything is written
    items, sums = mirror_plan(manifests, target_mirror, runtime, pinned, source)
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
