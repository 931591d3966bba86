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


def test_keygen_dry_run_makes_nothing_and_a_rerun_keeps_every_key(tmp_path: Path) -> None:
    """repo.keygen changes something, so it takes --dry-run: the files it would make, and nothing made. A rerun
    with more keys for a role keeps the keys that exist, byte for byte, and makes only the new one."""
    keys = tmp_path / "keys"
    res = cli("repo.keygen", "--dest", str(keys), "--roles", "root=2", "--dry-run")
    assert res.code == 0, res.text
    assert not keys.exists()
    assert res.text.count("would write") == 5 and "root-2.pem" in res.text
    assert cli("repo.keygen", "--dest", str(keys), "--roles", "root=2").code == 0
    before = {p.name: p.read_bytes() for p in keys.iterdir()}
    assert len(before) == 10 and (keys.stat().st_mode & 0o777) == 0o700
    res = cli("repo.keygen", "--dest", str(keys), "--roles", "root=3", "--dry-run")
    assert res.text.count("would write") == 1 and res.text.count("kept") == 5, res.text
    res = cli("repo.keygen", "--dest", str(keys), "--roles", "root=3")
    assert res.code == 0 and res.text.count("wrote") == 1 and "root-3.pem" in res.text, res.text
    assert all((keys / name).read_bytes() == data for name, data in before.items())
    assert (keys / "root-3.pem").stat().st_mode & 0o777 == 0o600
