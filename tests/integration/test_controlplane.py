"""The node check's control plane takes its programs from the image (imagebuilder.image.controlplane.image_programs):
from containerd's unpacked layers, the one of the image's version where several layers hold one, and never through a
link that leads out of the image onto the host (this tool runs as root, and it runs what it copies)."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagebuilder.core.errors import ExternalError
from imagebuilder.image.controlplane import PROGRAMS, SNAPSHOTS, image_programs

TAGS = {"etcd": "3.6.8-0", "kube-apiserver": "v1.36.3", "kube-controller-manager": "v1.36.3",
        "kube-scheduler": "v1.36.3"}  # fmt: skip


def _program(layer: Path, name: str, version: str, folder: str = "usr/local/bin") -> Path:
    path = layer / "fs" / folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho '{name} version {version}'\n")
    path.chmod(0o755)
    return path


def _image(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    snapshots = root / SNAPSHOTS
    for index, name in enumerate(PROGRAMS, start=1):
        _program(snapshots / str(index), name, TAGS[name].lstrip("v").split("-")[0])
    return root


def test_each_program_is_copied_out_of_its_layer(tmp_path: Path) -> None:
    root = _image(tmp_path)
    dest = tmp_path / "bin"
    dest.mkdir()
    programs = image_programs(root, TAGS, dest)
    assert set(programs) == set(PROGRAMS)
    for name, path in programs.items():
        assert path.parent == dest and path.stat().st_mode & 0o777 == 0o700
        assert name in path.read_text()


def test_the_version_of_the_images_tag_is_chosen_among_several(tmp_path: Path) -> None:
    root = _image(tmp_path)
    _program(root / SNAPSHOTS / "0", "kube-apiserver", "1.35.9", folder="usr/bin")  # an older image's, found first
    dest = tmp_path / "bin"
    dest.mkdir()
    chosen = image_programs(root, TAGS, dest)["kube-apiserver"]
    assert "1.36.3" in chosen.read_text()


def test_an_image_without_unpacked_layers_says_what_is_missing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "var/lib/containerd").mkdir(parents=True)
    with pytest.raises(ExternalError, match="no unpacked etcd"):
        image_programs(root, TAGS, tmp_path)


@pytest.mark.parametrize("hostile", ["program", "layer", "snapshots"])
def test_a_link_out_of_the_image_is_never_followed(tmp_path: Path, hostile: str) -> None:
    """An image whose program, layer or snapshot folder is a link to the host's files (absolute links resolve on the
    host when the image is mounted): nothing of the host is copied or run."""
    host = tmp_path / "host"
    _program(host, "etcd", "3.6.8")
    (host / "fs" / "usr/local/bin/etcd").write_text("#!/bin/sh\necho HOST\n")
    root = _image(tmp_path)
    snapshots = root / SNAPSHOTS
    etcd_layer = snapshots / str(PROGRAMS.index("etcd") + 1)
    if hostile == "program":
        (etcd_layer / "fs/usr/local/bin/etcd").unlink()
        (etcd_layer / "fs/usr/local/bin/etcd").symlink_to(host / "fs/usr/local/bin/etcd")
    elif hostile == "layer":
        for child in sorted(etcd_layer.rglob("*"), reverse=True):
            child.unlink() if child.is_file() else child.rmdir()
        (etcd_layer / "fs").symlink_to(host / "fs")
    else:
        moved = tmp_path / "elsewhere"
        snapshots.rename(moved)
        snapshots.symlink_to(moved)  # absolute: outside the image's root
    dest = tmp_path / "bin"
    dest.mkdir()
    with pytest.raises(ExternalError, match="no unpacked") as err:
        image_programs(root, TAGS, dest)
    assert "leads outside" in str(err.value)
    assert not any("HOST" in p.read_text() for p in dest.iterdir())
