"""The bare-metal image's gzip (imagebuilder/image/gzipdisk.py), in process: one member per MiB, zero MiBs never
compressed, and a member store that images of one OS layer share, read back by Python's reader (the real gzip and
zcat, and real disks: tests/integration/test_gzipdisk.py)."""

from __future__ import annotations

import gzip
import hashlib
import os
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagebuilder.core.disk import gunzip_sparse
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.stream import gzip_member, zero_member
from imagebuilder.image import gzipdisk
from imagebuilder.image.gzipdisk import MemberStore, gzip_disk
from tests.support.gzipdisk import MiB, count_hashing, disk_like, origin_of


def test_the_same_disk_gives_the_same_bytes_with_or_without_a_store(tmp_path: Path) -> None:
    src = disk_like(tmp_path / "disk.raw", 6 * MiB, {0: os.urandom(2 * MiB), 4 * MiB: os.urandom(10)})
    plain = gzip_disk(src, tmp_path / "a.gz")
    store = MemberStore.at(tmp_path / "store")
    first = gzip_disk(src, tmp_path / "b.gz", store=store)
    again = gzip_disk(src, tmp_path / "c.gz", store=store)
    assert plain.sha256 == first.sha256 == again.sha256
    assert (first.data_members, first.reused) == (3, 0)
    assert (again.data_members, again.reused) == (3, 3)


def test_a_checked_member_is_trusted_until_its_file_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store file checked once (and over a second old then) is not hashed again while it is the same file; damaged
    in place afterwards (a newer time), it is checked again, refused and replaced."""
    data = os.urandom(MiB)
    src = disk_like(tmp_path / "disk.raw", MiB, {0: data})
    store = MemberStore.at(tmp_path / "store")
    gzip_disk(src, tmp_path / "a.gz", store=store)  # writes the member
    key = hashlib.sha256(data).hexdigest()
    stored = store.path_of(key)
    old = stored.stat().st_mtime_ns - 10**10
    os.utime(stored, ns=(old, old))
    sealed = stored.read_bytes()
    hashed = count_hashing(monkeypatch)
    assert gzip_disk(src, tmp_path / "b.gz", store=store).reused == 1  # checked: the seal is hashed
    seals = [n for n in hashed if n == len(sealed) - 32]
    assert len(seals) == 1
    hashed.clear()
    assert gzip_disk(src, tmp_path / "c.gz", store=store).reused == 1  # the same file: trusted
    assert [n for n in hashed if n == len(sealed) - 32] == []
    damaged = bytearray(sealed)
    damaged[1000:5000] = bytes(4000)
    with stored.open("r+b") as fh:  # in place: the same inode and size, a new time
        fh.write(damaged)
    assert gzip_disk(src, tmp_path / "d.gz", store=store).reused == 0
    monkeypatch.undo()
    assert stored.read_bytes() == sealed
    assert (tmp_path / "d.gz").read_bytes() == (tmp_path / "a.gz").read_bytes()


def test_a_missing_disk_fails_cleanly_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(ExternalError, match="cannot compress"):
        gzip_disk(tmp_path / "missing.raw", tmp_path / "out" / "disk.gz")
    assert not (tmp_path / "out" / "disk.gz").exists()
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    size=st.integers(min_value=0, max_value=5 * MiB + 7),
    writes=st.lists(
        st.tuples(st.integers(min_value=0, max_value=5 * MiB), st.binary(min_size=1, max_size=3000)), max_size=6
    ),
)
def test_any_sparse_layout_round_trips(tmp_path: Path, size: int, writes: list[tuple[int, bytes]]) -> None:
    """Holes, data and zeros anywhere, member boundaries crossed or not: the .gz holds exactly the disk."""
    src = tmp_path / "p.raw"
    with src.open("wb") as fh:
        fh.truncate(size)
        for offset, chunk in writes:
            if offset < size:
                fh.seek(offset)
                fh.write(chunk[: size - offset])
    result = gzip_disk(src, tmp_path / "p.gz", store=MemberStore.at(tmp_path / "store"))
    assert gzip.decompress((tmp_path / "p.gz").read_bytes()) == src.read_bytes()
    assert result.size == (tmp_path / "p.gz").stat().st_size


def test_a_base_belongs_to_one_disk(tmp_path: Path) -> None:
    layer = disk_like(tmp_path / "layer.raw", MiB, {0: os.urandom(MiB)})
    with pytest.raises(ValueError, match="is not"):
        gzipdisk.prime(layer, MemberStore.at(tmp_path / "store"), base=gzipdisk.Base(tmp_path / "other.raw"))


def test_priming_stops_when_told(tmp_path: Path) -> None:
    """A matrix interrupted by Ctrl-C does not wait for the rest of its layer to be compressed."""
    layer = disk_like(tmp_path / "layer.raw", 4 * MiB, {i * MiB: os.urandom(MiB) for i in range(4)})
    store = MemberStore.at(tmp_path / "store")
    stop = threading.Event()
    stop.set()
    gzipdisk.prime(layer, store, stop=stop)
    assert not store.directory.exists()


def test_a_gzip_that_is_not_one_member_per_mib_is_no_origin(tmp_path: Path) -> None:
    raw = os.urandom(3 * MiB)
    (tmp_path / "one.gz").write_bytes(gzip.compress(raw))  # one member for it all, as gzip and pigz write it
    assert origin_of(tmp_path / "one.gz", tmp_path) is None
    # a file that ends inside a member, or is no gzip at all, is refused where it is decompressed: no origin arises
    (tmp_path / "cut.gz").write_bytes(gzip_member(raw[:MiB]) + gzip_member(raw[MiB : 2 * MiB])[:-9])
    (tmp_path / "not.gz").write_bytes(b"plain text\n")
    for bad in ("cut.gz", "not.gz"):
        with pytest.raises(InputError, match="not a complete gzip file"):
            origin_of(tmp_path / bad, tmp_path)
    # zero bytes after the last member are padding, as gzip reads them: the member before them is the origin's
    (tmp_path / "padded.gz").write_bytes(gzip_member(raw[:MiB]) + b"\0" * 512)
    origin = origin_of(tmp_path / "padded.gz", tmp_path)
    assert origin is not None and list(origin.members) == [0]


def _gzip_parts(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """A gzip file of any members (empty, zeros, random or repetitive, around a MiB or several; the zero MiB as the
    tool writes it, which is seeked over unread, at a MiB's start or not), with zero padding between some of them,
    and what it decompresses to."""
    gz, raw = b"", b""
    for _ in range(draw(st.integers(0, 4))):
        size = draw(st.sampled_from([0, 1, 1000, MiB - 1, MiB, MiB + 1, 2 * MiB + 17]))
        kind = draw(st.sampled_from(["zeros", "random", "text", "the tool's zero MiB"]))
        data = bytes(size) if kind == "zeros" else os.urandom(size) if kind == "random" else (b"node " * size)[:size]
        if kind == "the tool's zero MiB":
            data = bytes(MiB)
            gz += zero_member(MiB)
        else:
            gz += gzip.compress(data, compresslevel=draw(st.integers(1, 9)), mtime=0)
        gz += bytes(draw(st.sampled_from([0, 0, 1, 4096])))
        raw += data
    return gz, raw


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.composite(_gzip_parts)(), cut=st.integers(1, 64))
def test_gunzip_sparse_gives_what_gzip_gives_and_where_each_member_lies(
    tmp_path: Path, parts: tuple[bytes, bytes], cut: int
) -> None:
    """The one pass that decompresses a .gz input also finds its members: the output is what Python's gzip reads,
    its zero MiBs are holes, each member found decompresses alone to its part, and a file cut short is refused."""
    gz, raw = parts
    src, dest = tmp_path / "in.gz", tmp_path / "out.raw"
    src.write_bytes(gz)
    members = gunzip_sparse(src, dest)
    assert dest.read_bytes() == raw == gzip.decompress(gz)
    data_mibs = sum(1 for i in range(0, len(raw), MiB) if raw[i : i + MiB].strip(b"\0"))
    assert dest.stat().st_blocks * 512 <= (data_mibs + 1) * MiB, "zero MiBs stay holes"
    assert sum(m.raw_length for m in members) == len(raw)
    assert [m.raw_offset for m in members] == sorted(m.raw_offset for m in members)
    for m in members:
        assert gzip.decompress(gz[m.offset : m.offset + m.length]) == raw[m.raw_offset : m.raw_offset + m.raw_length]
    if members:  # cut inside the last member: 1 to all but one of its bytes kept (none kept is a whole file)
        last = members[-1]
        src.write_bytes(gz[: last.offset + 1 + (cut - 1) % (last.length - 1)])
        with pytest.raises(InputError, match="not a complete gzip file"):
            gunzip_sparse(src, dest)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    mibs=st.integers(1, 5),
    tail=st.integers(0, 3000),
    writes=st.lists(st.tuples(st.integers(0, 6 * MiB), st.binary(min_size=1, max_size=64)), max_size=6),
)
def test_any_change_to_a_disk_packages_to_what_compressing_it_all_gives(
    tmp_path: Path, mibs: int, tail: int, writes: list[tuple[int, bytes]]
) -> None:
    size = mibs * MiB + tail
    base = os.urandom(size)
    (tmp_path / "a.raw").write_bytes(base)
    gz = tmp_path / "a.gz"
    gzip_disk(tmp_path / "a.raw", gz)
    after = bytearray(base)
    for offset, chunk in writes:
        offset %= size
        after[offset : offset + len(chunk)] = chunk[: size - offset]
    (tmp_path / "b.raw").write_bytes(bytes(after))
    origin = origin_of(gz, tmp_path)
    assert origin is not None
    with origin:
        kept = gzip_disk(tmp_path / "b.raw", tmp_path / "b.gz", origin=origin)
    plain = gzip_disk(tmp_path / "b.raw", tmp_path / "c.gz")
    assert kept.sha256 == plain.sha256
    changed = {i for i in range(0, size, MiB) if after[i : i + MiB] != base[i : i + MiB]}
    assert kept.reused == plain.data_members - len(changed)


def test_the_zero_mib_the_reader_skips_is_the_one_the_writer_writes(tmp_path: Path) -> None:
    """gunzip_sparse seeks over the member image.gzipdisk writes for every zero MiB without inflating it: the two
    must stay the same bytes (a codec changed on one side only would make every zero MiB inflated again, slowly)."""
    assert gzip_member(bytes(MiB)) == zero_member(MiB) == zero_member(gzipdisk.MEMBER)
    assert gzip.decompress(zero_member(MiB)) == bytes(MiB)
    # and a disk's zero MiB as gzip_disk writes it is that member
    raw = tmp_path / "zeros.raw"
    raw.write_bytes(bytes(2 * MiB) + b"data" + bytes(MiB - 4))
    gzip_disk(raw, tmp_path / "zeros.gz")
    written = (tmp_path / "zeros.gz").read_bytes()
    assert written.startswith(zero_member(MiB) * 2) and gzip.decompress(written) == raw.read_bytes()


def test_a_member_depends_on_its_bytes_only() -> None:
    """The same MiB deflates to the same member in any run (no name, no time in the header), the reproducible
    builds' premise; the codec is the build manifest's to record."""
    data = os.urandom(MiB)
    member = gzip_member(data)
    assert member == gzip_member(data) and member[4:8] == b"\0\0\0\0", member[:10].hex()  # MTIME zero
    assert member[3] == 0, "no FNAME, no comment, no extra field"
    assert gzip.decompress(member) == data
