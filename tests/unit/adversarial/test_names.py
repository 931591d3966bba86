"""Names from outside never write outside the destination, read in process: the hostile names that reach a
destination folder are refused before anything is written (the hostile manifests served by real servers to the
tasks: tests/integration/adversarial/test_names.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagebuilder.core.errors import InputError
from imagebuilder.core.safepath import safe_join
from tests.support.hostile_names import HOSTILE_NAMES


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_safe_join_refuses_every_escape(tmp_path: Path, name: str) -> None:
    with pytest.raises(InputError):
        safe_join(tmp_path / "dest", name)


def test_safe_join_refuses_a_link_that_leads_out(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "link").symlink_to(tmp_path)
    with pytest.raises(InputError, match="symbolic link"):
        safe_join(dest, "link/x")
    (dest / "loop").symlink_to(dest / "loop")  # a loop fails at open time, inside the destination
    assert dest.resolve() in safe_join(dest, "loop/x").parents
    assert safe_join(dest, "sub/file") == dest.resolve() / "sub" / "file"
