"""The release-manifest reader on the real samples, on older/newer variants, and on broken manifests."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.fetch import Mirror
from imagebuilder.release.manifest import BINARIES, IMAGES, load_manifest

NEEDED = {(b, "binary") for b in BINARIES} | {("cni-plugins", "archive"), ("etcd", "archive")}
NEEDED |= {(i, "image") for i in IMAGES}


def test_sources_file_mirror_dir_and_url(mirror_dir: Path, http_server: str) -> None:
    url = "https://distro.eks.amazonaws.com/kubernetes-1-24/kubernetes-1-24-eks-36.yaml"
    from_dir = load_manifest(url, Mirror.parse(str(mirror_dir)))
    from_http_mirror = load_manifest(url, Mirror.parse(http_server))
    from_url = load_manifest(f"{http_server}/kubernetes-1-24/kubernetes-1-24-eks-36.yaml")
    from_file = load_manifest(str(mirror_dir / "kubernetes-1-24" / "kubernetes-1-24-eks-36.yaml"))
    assert from_dir.artifacts == from_http_mirror.artifacts == from_url.artifacts == from_file.artifacts
    assert from_dir.kubernetes_version == "v1.24.17"
    assert from_http_mirror.source.startswith(http_server)


def test_unreachable_and_missing_sources(http_server: str, tmp_path: Path) -> None:
    with pytest.raises(ExternalError) as exc:
        load_manifest(f"{http_server}/nope.yaml")
    assert exc.value.exit_code == 1 and "HTTP 404" in str(exc.value) and "local mirror" in str(exc.value)
    with pytest.raises(InputError) as missing:
        load_manifest(str(tmp_path / "nope.yaml"))
    assert missing.value.exit_code == 2
    with pytest.raises(InputError):
        Mirror.parse(str(tmp_path / "no-such-mirror"))
