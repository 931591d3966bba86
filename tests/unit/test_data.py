"""The reference data in tests/data is the data its README describes: every file pinned, nothing unlisted."""

from __future__ import annotations

import hashlib

from tests.support.common import DATA


def test_reference_data_matches_its_pins() -> None:
    pinned = dict(reversed(line.split("  ", 1)) for line in (DATA / "SHA256SUMS").read_text().splitlines())
    present = {p.relative_to(DATA).as_posix() for p in DATA.glob("*/*") if p.is_file()}
    assert present == set(pinned), "tests/data changed: update SHA256SUMS and the provenance in tests/data/README.md"
    readme = (DATA / "README.md").read_text()
    for name, digest in pinned.items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name
        assert f"`{name}`" in readme, f"{name} has no provenance line"
