"""What the in-process tests (tests/unit/test_gzipdisk.py) and the integration tests
(tests/integration/test_gzipdisk.py) of gzipdisk share."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from imagebuilder.core.disk import gunzip_sparse
from imagebuilder.image import gzipdisk
from imagebuilder.image.gzipdisk import MEMBER

MiB = MEMBER


def disk_like(path: Path, size: int, data: dict[int, bytes]) -> Path:
    """A sparse file of ``size`` bytes with ``data`` written at the given offsets (the rest holes)."""
    with path.open("wb") as fh:
        fh.truncate(size)
        for offset, chunk in data.items():
            fh.seek(offset)
            fh.write(chunk)
    return path


def origin_of(gz: Path, work: Path) -> gzipdisk.Origin | None:
    """``gz`` as image.customize takes it: decompressed once, its members found in that pass."""
    return gzipdisk.Origin.of(gz, gunzip_sparse(gz, work / f"{gz.name}.raw"))


def count_hashing(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From here on, the length of every input gzipdisk hashes with SHA-256, in order."""
    hashed: list[int] = []
    real = hashlib.sha256

    def counting(data: bytes = b"") -> hashlib._Hash:
        hashed.append(len(data))
        return real(data)

    monkeypatch.setattr(gzipdisk.hashlib, "sha256", counting)
    return hashed
