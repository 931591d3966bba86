"""The runtime a line's images get when neither their release nor a product bundle names one: containerd, runc and
crictl from each project's own release, at the versions the catalog gives the line (config/release-channels.yaml).

Nothing vouches for these files but the checksum file each project publishes beside them, so that file is read
first (through the mirror when the build has one) and every download is checked against it. A build that wants
stronger pins reads a product bundle (``--<product>-release``), whose runtime tarballs carry their own digests, or a
release built by ``release.build``.
"""

from __future__ import annotations

from dataclasses import dataclass

from imagebuilder.core import fetch, grammar
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.fetch import Mirror
from imagebuilder.release.catalog import Runtime, UpstreamFile, load_catalog
from imagebuilder.release.manifest import NodeArtifact


@dataclass(frozen=True)
class UpstreamArtifacts:
    """The line's runtime as node artifacts (containerd and crictl tarballs, runc's binary), with the checksum files
    that vouch for them as read (a mirror carries them beside the files)."""

    artifacts: tuple[NodeArtifact, ...]
    #: (url, bytes) of each checksum file read
    sums: tuple[tuple[str, bytes], ...]


def upstream_files(runtime: Runtime, arch: str = "amd64") -> tuple[UpstreamFile, ...]:
    """Where each part of ``runtime`` is published (no network)."""
    return load_catalog().upstream_runtime.files(runtime, arch)


def upstream_runtime(runtime: Runtime, mirror: Mirror | None, arch: str = "amd64") -> UpstreamArtifacts:
    """Read the checksum file of each part of ``runtime`` (from ``mirror`` when given) and return the parts as node
    artifacts with those digests. Exit 1 when a checksum file cannot be read or gives no digest for its file."""
    artifacts: list[NodeArtifact] = []
    sums: list[tuple[str, bytes]] = []
    for part in upstream_files(runtime, arch):
        location = mirror.locate(part.sums_url) if mirror else part.sums_url
        try:
            data = fetch.read(location, what=f"{part.name} checksum file")
        except InputError as exc:  # a directory mirror without it: one made before the line's runtime was upstream's
            raise InputError(exc.detail, source=exc.source, field="--mirror",
                             expected="a mirror that holds the line's runtime (rerun mirror.create for the line), "
                             "or --runtime os") from None  # fmt: skip
        name = part.url.rsplit("/", 1)[-1]
        digest = grammar.digest_in_sums(data.decode("utf-8", errors="replace"), name)
        if digest is None:
            raise ExternalError(f"{part.sums_url} gives no SHA-256 for {name}",
                                hint="check the mirror's copy of it, or build with --runtime os")  # fmt: skip
        artifacts.append(NodeArtifact(part.name, part.kind, part.component, part.url, digest))
        sums.append((part.sums_url, data))
    return UpstreamArtifacts(tuple(artifacts), tuple(sums))


__all__ = ["UpstreamArtifacts", "upstream_files", "upstream_runtime"]
