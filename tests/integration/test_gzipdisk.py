"""The bare-metal image's gzip (imagebuilder/image/gzipdisk.py): one member per MiB, zero MiBs never compressed, and a
member store that images of one OS layer share. Decoded by the real gzip and zcat as well as Python's reader."""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
import threading
from pathlib import Path

import pytest

from imagebuilder.core.stream import gzip_member
from imagebuilder.image import gzipdisk
from imagebuilder.image.gzipdisk import MemberStore, gzip_disk
from tests.support.gzipdisk import MiB, count_hashing, disk_like, origin_of


def gunzipped_sha(gz: Path) -> str:
    out = subprocess.run(["sh", "-c", f"zcat -- '{gz}' | sha256sum"], capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


def test_round_trip_through_the_real_gzip_with_holes_zeros_and_a_short_tail(tmp_path: Path) -> None:
    size = 9 * MiB + 4321  # a short last member
    src = disk_like(
        tmp_path / "disk.raw",
        size,
        {0: os.urandom(MiB + 17), 3 * MiB: bytes(MiB), 5 * MiB + 100: b"x" * 5000, 9 * MiB: os.urandom(4321)},
    )
    seen: list[int] = []
    result = gzip_disk(src, tmp_path / "out" / "disk.gz", on_bytes=seen.append)
    gz = tmp_path / "out" / "disk.gz"
    assert hashlib.sha256(gz.read_bytes()).hexdigest() == result.sha256 and gz.stat().st_size == result.size
    assert subprocess.run(["gzip", "-t", str(gz)]).returncode == 0
    assert gunzipped_sha(gz) == hashlib.sha256(src.read_bytes()).hexdigest()
    with gzip.open(gz) as fh:  # Python's reader reads every member too
        assert fh.read() == src.read_bytes()
    assert sum(seen) == size
    # the MiBs with data: 0, 1 (the 17 bytes), 5, 9; the written zeros at 3 and the holes are zero members
    assert result.data_members == 4 and result.reused == 0
    assert sorted(p.name for p in gz.parent.iterdir()) == ["disk.gz"]


def test_a_sibling_image_reuses_what_it_shares_with_the_first(tmp_path: Path) -> None:
    layer = {0: os.urandom(MiB), MiB: os.urandom(MiB), 2 * MiB: os.urandom(MiB), 3 * MiB: os.urandom(MiB)}
    one = disk_like(tmp_path / "one.raw", 8 * MiB, {**layer, 6 * MiB: b"kubernetes 1.23"})
    two = disk_like(tmp_path / "two.raw", 8 * MiB, {**layer, 6 * MiB: b"kubernetes 1.24"})
    store = MemberStore.beside(tmp_path / "os-layer.qcow2")
    assert store.directory == (tmp_path / "os-layer.members").resolve()
    gzip_disk(one, tmp_path / "one.gz", store=store)
    second = gzip_disk(two, tmp_path / "two.gz", store=store)
    assert (second.data_members, second.reused) == (5, 4)  # only its own MiB is compressed
    assert gunzipped_sha(tmp_path / "two.gz") == hashlib.sha256(two.read_bytes()).hexdigest()


def test_a_wrong_or_damaged_member_in_the_store_is_never_used(tmp_path: Path) -> None:
    data = os.urandom(MiB)
    src = disk_like(tmp_path / "disk.raw", 2 * MiB, {0: data})
    store = MemberStore.at(tmp_path / "store")
    key = hashlib.sha256(data).hexdigest()
    planted = store.path_of(key)
    planted.parent.mkdir(parents=True)
    good = gzip_member(data)
    sealed = hashlib.sha256(good).digest() + good
    damaged = bytearray(sealed)
    damaged[1000:5000] = bytes(4000)  # a block the device never wrote
    short = gzip_member(data[:1000])
    for bad in (
        good,  # no digest in front
        sealed[:-9],  # cut
        bytes(damaged),
        hashlib.sha256(short).digest() + short,  # whole, but of other bytes
        b"",
        b"not gzip at all",
    ):
        planted.write_bytes(bad)
        result = gzip_disk(src, tmp_path / "out.gz", store=store)
        assert result.reused == 0
        assert gunzipped_sha(tmp_path / "out.gz") == hashlib.sha256(src.read_bytes()).hexdigest()
        assert planted.read_bytes() == sealed  # replaced by the right one
    assert gzip_disk(src, tmp_path / "out.gz", store=store).reused == 1


def test_images_packaged_at_once_compress_each_shared_member_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = {i * MiB: os.urandom(MiB) for i in range(6)}
    disks = [disk_like(tmp_path / f"{n}.raw", 8 * MiB, {**shared, 7 * MiB: f"image {n}".encode()}) for n in range(3)]
    calls: list[int] = []
    real = gzip_member
    lock = threading.Lock()

    def counting(data: bytes) -> bytes:
        with lock:
            calls.append(len(data))
        return real(data)

    monkeypatch.setattr(gzipdisk, "gzip_member", counting)
    store = MemberStore.at(tmp_path / "store")
    threads = [threading.Thread(target=gzip_disk, args=(d, d.with_suffix(".gz")), kwargs={"store": store})
               for d in disks]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 6 + 3  # each shared MiB once, each image's own MiB once
    for d in disks:
        assert gunzipped_sha(d.with_suffix(".gz")) == hashlib.sha256(d.read_bytes()).hexdigest()


def test_an_empty_disk_is_an_empty_gzip_file(tmp_path: Path) -> None:
    src = tmp_path / "empty.raw"
    src.write_bytes(b"")
    gzip_disk(src, tmp_path / "empty.gz")
    assert subprocess.run(["gzip", "-t", str(tmp_path / "empty.gz")]).returncode == 0
    assert gzip.decompress((tmp_path / "empty.gz").read_bytes()) == b""


def test_priming_a_layer_leaves_its_images_only_their_own_mibs_to_compress(tmp_path: Path) -> None:
    layer = disk_like(tmp_path / "layer.raw", 8 * MiB, {i * MiB: os.urandom(MiB) for i in (0, 1, 2, 5)})
    image = tmp_path / "image.raw"
    image.write_bytes(layer.read_bytes())
    with image.open("r+b") as fh:
        fh.seek(7 * MiB)
        fh.write(b"this image's own bytes")
    store = MemberStore.at(tmp_path / "store")
    gzipdisk.prime(layer, store, workers=2)
    assert sum(1 for p in store.directory.rglob("*") if p.is_file()) == 4
    result = gzip_disk(image, tmp_path / "image.gz", store=store)
    assert (result.data_members, result.reused) == (5, 4)
    assert gunzipped_sha(tmp_path / "image.gz") == hashlib.sha256(image.read_bytes()).hexdigest()


def test_an_image_compared_with_its_primed_layer_hashes_only_its_own_mibs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packaging an image copied from a finished layer: a MiB equal to the layer's at the same offset takes the key
    the primer recorded there, without hashing it; a changed MiB (in place, or moved) is hashed, and the .gz is the
    same bytes as with no store at all."""
    chunks = {i: os.urandom(MiB) for i in range(6)}
    layer = disk_like(tmp_path / "layer.raw", 8 * MiB, {i * MiB: chunks[i] for i in (0, 1, 2, 3, 5)})
    image = tmp_path / "image.raw"
    image.write_bytes(layer.read_bytes())
    with image.open("r+b") as fh:
        fh.seek(1 * MiB + 5)
        fh.write(b"this image's own bytes")  # changed in place
        fh.seek(7 * MiB)
        fh.write(chunks[0])  # the layer's MiB 0, at another offset: a member the store has, under its real key
    store = MemberStore.at(tmp_path / "store")
    base = gzipdisk.Base(layer)
    gzipdisk.prime(layer, store, base=base)
    assert sorted(base.keys) == [i * MiB for i in (0, 1, 2, 3, 5)]
    hashed = count_hashing(monkeypatch)
    result = gzip_disk(image, tmp_path / "image.gz", store=store, base=base)
    monkeypatch.undo()
    assert hashed.count(MiB) == 2  # MiB 1 (changed) and MiB 7 (not the layer's there); 0, 2, 3, 5 compared
    assert (result.data_members, result.reused) == (6, 5)
    plain = gzip_disk(image, tmp_path / "plain.gz")
    assert (tmp_path / "image.gz").read_bytes() == (
        tmp_path / "plain.gz"
    ).read_bytes() and plain.sha256 == result.sha256
    assert gunzipped_sha(tmp_path / "image.gz") == hashlib.sha256(image.read_bytes()).hexdigest()


def test_a_changed_copy_takes_the_members_of_the_mibs_its_origin_still_holds(tmp_path: Path) -> None:
    """image.customize: the input .gz gives its members to the MiBs the customization left as they were; only the
    changed MiBs are compressed, and the output is byte for byte what compressing it all gives."""
    before = {0: os.urandom(3 * MiB), 5 * MiB: os.urandom(MiB), 8 * MiB: os.urandom(100)}
    src = disk_like(tmp_path / "before.raw", 8 * MiB + 100, before)
    gz = tmp_path / "in.gz"
    gzip_disk(src, gz)
    changed = disk_like(tmp_path / "after.raw", 8 * MiB + 100, {**before, MiB + 7: b"changed", 6 * MiB: b"new"})
    origin = origin_of(gz, tmp_path)
    assert origin is not None and sorted(origin.members) == [i * MiB for i in range(9)]
    with origin:
        result = gzip_disk(changed, tmp_path / "out.gz", origin=origin)
    # data MiBs: 0, 1 (changed), 2, 5, 6 (new), 8 (the short tail); 0, 2, 5 and 8 come from the input
    assert (result.data_members, result.reused) == (6, 4)
    plain = gzip_disk(changed, tmp_path / "plain.gz")
    assert (tmp_path / "out.gz").read_bytes() == (tmp_path / "plain.gz").read_bytes()
    assert (plain.data_members, plain.reused) == (6, 0)
    assert gunzipped_sha(tmp_path / "out.gz") == hashlib.sha256(changed.read_bytes()).hexdigest()


def test_an_origin_member_is_taken_only_when_it_inflates_to_the_very_mib(tmp_path: Path) -> None:
    """A member that holds other bytes (another disk's, or damaged after it was read) is never copied: that MiB is
    compressed from the disk instead."""
    data = {0: os.urandom(MiB), MiB: os.urandom(MiB), 2 * MiB: os.urandom(MiB)}
    src = disk_like(tmp_path / "disk.raw", 3 * MiB, data)
    gz = tmp_path / "in.gz"
    # the input's first member holds other bytes than the disk's first MiB (a whole, valid member)
    gz.write_bytes(gzip_member(os.urandom(MiB)) + gzip_member(data[MiB]) + gzip_member(data[2 * MiB]))
    origin = origin_of(gz, tmp_path)
    assert origin is not None
    with origin:
        assert origin.member(0, data[0]) is None
        assert origin.member(MiB, data[2 * MiB]) is None, "a member at another offset is not the MiB's"
        assert origin.member(MiB, data[MiB][:-1]) is None, "nor one of another length"
        assert origin.member(MiB, data[MiB]) is not None
        # the last member damaged after the input was read: it no longer inflates to its MiB (a bad checksum)
        damaged = origin.members[2 * MiB]
        with gz.open("r+b") as fh:
            fh.seek(damaged.offset + damaged.length // 2)
            fh.write(bytes([fh.read(1)[0] ^ 0xFF]))
        assert origin.member(2 * MiB, data[2 * MiB]) is None
        result = gzip_disk(src, tmp_path / "out.gz", origin=origin)
    assert (result.data_members, result.reused) == (3, 1)
    assert gunzipped_sha(tmp_path / "out.gz") == hashlib.sha256(src.read_bytes()).hexdigest()
