"""What the in-process tests (tests/unit/test_source_release.py) and the integration tests
(tests/integration/test_source_release.py) of source release share."""

from __future__ import annotations

from pathlib import Path

from imagebuilder.release.manifest import parse_manifest


def release_images(manifest_path: Path) -> dict[str, str]:
    manifest = parse_manifest(manifest_path.read_text(), str(manifest_path))
    return {a.name: a.uri for a in manifest.artifacts if a.kind == "image"}
