"""Issue 64's pure parts: what a repository write sweeps from a folder (a gone writer's temporary files only, never
a live one's nor any other file) and which request paths ``serve`` refuses as hidden. The kills themselves, in a
folder and in S3, are in tests/integration/test_repository_kills.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuilder.core.runs import start_time
from imagebuilder.host.serve import hidden
from imagebuilder.publish.storage import FolderStore


def _dead_pid() -> int:
    """A pid no process has now."""
    pid = 4_000_000
    while start_time(pid) is not None:
        pid -= 1
    return pid


def test_a_write_sweeps_a_gone_writer_s_temporary_files_and_nothing_else(tmp_path: Path) -> None:
    dead, live = _dead_pid(), os.getpid()
    files = {
        "targets/.ab12.ubuntu.gz.{dead}-k3j9x.tmp": "swept",
        "metadata/.timestamp.json.{dead}-zz_1.tmp": "swept",
        "targets/.ab12.ubuntu.gz.{live}-abcde.tmp": "kept: its writer runs",
        "targets/ab12.ubuntu.gz": "kept: a target",
        "metadata/3.targets.json": "kept: metadata",
        ".notes.{dead}-abc.tmp": "kept: not in targets/ or metadata/",
        "targets/.hidden-by-user": "kept: not a writer's name",
    }
    for name in files:
        path = tmp_path / name.format(dead=dead, live=live)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    store = FolderStore(tmp_path)
    with store.writing() as swept:
        assert sorted(swept) == sorted(n.format(dead=dead, live=live) for n, why in files.items() if why == "swept")
    for name, why in files.items():
        assert (tmp_path / name.format(dead=dead, live=live)).exists() == (why != "swept"), name


def test_a_write_into_a_folder_not_made_yet_sweeps_nothing_and_makes_nothing(tmp_path: Path) -> None:
    with FolderStore(tmp_path / "new").writing() as swept:
        assert swept == []
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("name", [".timestamp.json.12-ab.tmp", ".image-builder.lock", ".git", ".x"])
def test_serve_hides_every_dot_file(name: str) -> None:
    assert hidden(name)


@given(st.text(min_size=1, max_size=40).filter(lambda n: not n.startswith(".")))
def test_serve_hides_no_name_that_is_not_a_dot_file(name: str) -> None:
    assert not hidden(name)
    assert not hidden(".") and not hidden("..")  # the safe join judges these
