"""The parts of a reproducible image that run quickly against the real tools (issue 45): bbolt's own CLI reads and
checks the databases our writer lays out (containerd opens them with the same library), and each artifact format
is a function of the disk alone: the OVA (qemu-img's VMDK, its random CID fixed; the tar's times and modes) and the
qcow2, made twice in other folders under another umask and time zone."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from imagebuilder.image.boltdb import Bucket, go_time, read_tree, rewrite, write_tree
from tests.support.common import ROOT

BBOLT = ROOT / ".tools" / "bin" / "bbolt"


def _bbolt(*args: str) -> subprocess.CompletedProcess[str]:
    assert BBOLT.is_file(), f"{BBOLT} is missing: run ./scripts/setup.sh --test"
    return subprocess.run([str(BBOLT), *args], capture_output=True, text=True, check=False, timeout=60)


def test_bbolt_checks_and_reads_what_the_writer_lays_out(tmp_path: Path) -> None:
    tree = Bucket(0, {
        b"v1": Bucket(5, {
            b"k8s.io": Bucket(9, {
                b"images": Bucket(0, {f"registry.example/img-{i}:v1".encode(): Bucket(0, {
                    b"createdat": go_time(1_700_000_000 + i), b"target": Bucket(0, {b"digest": b"sha256:" + b"0" * 64}),
                }) for i in range(300)}),
                b"blob": b"x" * 12000,  # an overflow page
            }),
        }),
        b"version": b"\x03",
    })  # fmt: skip
    db = tmp_path / "meta.db"
    db.write_bytes(b"")
    write_tree(db, tree)
    check = _bbolt("check", str(db))
    assert check.returncode == 0 and check.stdout.strip() == "OK", check.stdout + check.stderr
    got = _bbolt("get", str(db), "v1", "k8s.io", "images", "registry.example/img-7:v1", "target", "digest")
    assert got.stdout.strip() == "sha256:" + "0" * 64, got.stderr
    assert len(_bbolt("keys", str(db), "v1", "k8s.io", "images").stdout.split()) == 300
    assert _bbolt("get", str(db), "v1", "k8s.io", "blob").stdout.strip() == "x" * 12000
    # rewriting sets the times and keeps bbolt's view of everything else
    before = db.read_bytes()
    assert rewrite(db, 0) == 300 and db.read_bytes() != before
    assert _bbolt("check", str(db)).stdout.strip() == "OK"
    stamps = {read_tree(db).items[b"v1"].items[b"k8s.io"].items[b"images"].items[k].items[b"createdat"]  # type: ignore[union-attr]
              for k in read_tree(db).items[b"v1"].items[b"k8s.io"].items[b"images"].items}  # type: ignore[union-attr]  # fmt: skip
    assert stamps == {go_time(0)}


def _disk(path: Path) -> Path:
    subprocess.run(["qemu-img", "create", "-f", "raw", str(path), "64M"], check=True, capture_output=True)
    with path.open("r+b") as fh:
        for n in range(0, 64, 7):
            fh.seek(n * 1024 * 1024)
            fh.write(bytes([n]) * 4096)
    return path


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_the_ova_and_the_qcow2_are_functions_of_the_disk(tmp_path: Path, umask: int) -> None:
    from imagebuilder.builder.chroot import finish_disk
    from imagebuilder.image.ova import make_ova
    from imagebuilder.image.reproducible import dated

    disk = _disk(tmp_path / "disk.raw")
    outs = []
    for n, tz in enumerate(("UTC", "Australia/Eucla")):
        folder = tmp_path / f"run-{n}" / ("deeper/" * n)
        folder.mkdir(parents=True)
        old_umask, old_tz = os.umask(umask if n else 0o022), os.environ.get("TZ")
        os.environ["TZ"] = tz
        try:
            with dated(1669852800):
                ova = make_ova(disk, folder / "node.ova", name="node", firmware="efi")
            copy = folder / "disk.raw"
            copy.write_bytes(disk.read_bytes())
            qcow2 = finish_disk(copy, folder / "node.qcow2", "qcow2", lambda _t: None)
        finally:
            os.umask(old_umask)
            if old_tz is None:
                os.environ.pop("TZ", None)
            else:
                os.environ["TZ"] = old_tz
        outs.append((ova.read_bytes(), qcow2.read_bytes()))
    assert outs[0][0] == outs[1][0], "two OVAs of one disk differ"
    assert outs[0][1] == outs[1][1], "two qcow2s of one disk differ"
    with tarfile.open(tmp_path / "run-0" / "node.ova") as tar:
        assert {(m.mtime, m.mode, m.uid, m.uname) for m in tar.getmembers()} == {(1669852800, 0o644, 0, "root")}
