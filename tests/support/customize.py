"""What the in-process tests (tests/unit/test_customize.py) and the integration tests
(tests/integration/test_customize.py) of customize share."""

from __future__ import annotations

from pathlib import Path


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "customize.yaml"
    path.write_text(text)
    return path
