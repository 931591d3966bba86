"""Destinations no file can be made in (issue 43): ``--dest /proc`` was an internal error (the temp file of the
one atomic writer could not be made). Every task that writes through it now exits 2 naming the folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.inproc import cli


@pytest.mark.parametrize("dest", ["/proc", "/proc/self", "/sys/kernel"])
def test_keys_into_a_folder_no_file_can_be_made_in(dest: str) -> None:
    res = cli("repo.keygen", "--dest", dest)
    assert res.code == 2 and "internal error" not in res.text, res.text
    said = ("cannot write", "not writable", "kernel's")
    assert any(s in res.text for s in said) and dest.split("/")[1] in res.text


def test_keys_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    res = cli("repo.keygen", "--dest", str(tmp_path / "file" / "keys"))
    assert res.code == 2 and "internal error" not in res.text, res.text
    assert (tmp_path / "file").read_text() == "x"
