"""The pieces of reproducible images that need no root (issue 45): the bbolt writer (the same data, the same bytes,
read back as written), the EXTLINUX sector runs, SOURCE_DATE_EPOCH and the location-free content digest."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagebuilder.core.errors import InputError
from imagebuilder.image.boltdb import BoltFile, Bucket, go_time, read_tree, set_times, write_tree
from imagebuilder.image.reproducible import _extents, hash_seed, source_date_epoch

KEYS = st.binary(min_size=1, max_size=40)
# small values, and some larger than a page (an overflow page), made cheaply from a length
VALUES = st.binary(max_size=120) | st.integers(3000, 9000).map(lambda n: bytes([n % 251]) * n)


def buckets(depth: int = 2) -> st.SearchStrategy[Bucket]:
    leaf = st.builds(Bucket, st.integers(0, 2**40), st.dictionaries(KEYS, VALUES, max_size=25))
    if depth == 0:
        return leaf
    return st.builds(Bucket, st.integers(0, 2**40),
                     st.dictionaries(KEYS, VALUES | buckets(depth - 1), max_size=10))  # fmt: skip


def _shuffled(tree: Bucket, rng: random.Random) -> Bucket:
    items = list(tree.items.items())
    rng.shuffle(items)
    return Bucket(tree.sequence, {k: _shuffled(v, rng) if isinstance(v, Bucket) else v for k, v in items})


@settings(max_examples=60, deadline=None)
@given(buckets(), st.integers(0, 2**32))
def test_the_writer_gives_back_what_it_was_given_in_the_same_bytes(tmp_path_factory: pytest.TempPathFactory,
                                                                    tree: Bucket, seed: int) -> None:  # fmt: skip
    work = tmp_path_factory.mktemp("bolt")
    a, b = work / "a.db", work / "b.db"
    for path in (a, b):
        path.write_bytes(b"")
    write_tree(a, tree)
    write_tree(b, _shuffled(tree, random.Random(seed)))  # the order the data came in does not matter
    assert a.read_bytes() == b.read_bytes()
    assert read_tree(a) == tree
    assert BoltFile(a).sequence == tree.sequence


def test_a_bucket_of_thousands_of_keys_gets_branch_pages(tmp_path: Path) -> None:
    tree = Bucket(7, {b"big": Bucket(1, {f"key-{i:06d}".encode(): bytes(i % 50) for i in range(20000)})})
    path = tmp_path / "big.db"
    path.write_bytes(b"")
    write_tree(path, tree)
    assert read_tree(path) == tree
    assert path.stat().st_size > 100 * 4096


def test_times_are_set_where_containerd_keeps_them_and_nowhere_else() -> None:
    now = dt.datetime(2026, 11, 28, 12, 0, tzinfo=dt.UTC)
    stamp = go_time(int(now.timestamp()))
    tree = Bucket(0, {b"v1": Bucket(3, {b"k8s.io": Bucket(0, {
        b"createdat": stamp, b"updatedat": stamp, b"name": b"createdat", b"labels": Bucket(0, {b"createdat": b"x"}),
    })})})  # fmt: skip
    assert set_times(tree, 0) == 2
    inner = tree.items[b"v1"].items[b"k8s.io"]  # type: ignore[union-attr]
    assert inner.items[b"createdat"] == inner.items[b"updatedat"] == go_time(0)  # type: ignore[union-attr]
    assert inner.items[b"name"] == b"createdat"  # type: ignore[union-attr]
    assert inner.items[b"labels"].items[b"createdat"] == b"x"  # type: ignore[union-attr]


def test_go_time_is_gos_binary_form() -> None:
    # what Go 1.26's time.Unix(s, 0).UTC().MarshalBinary() printed for these (run once, by hand: go run)
    assert go_time(0).hex() == "010000000e7791f70000000000ffff"
    assert go_time(1669852800).hex() == "010000000edb19e58000000000ffff"


@given(st.lists(st.integers(0, 2**32), min_size=1, max_size=300), st.booleans())
def test_extlinux_runs_cover_the_sectors_and_keep_the_loaders_limits(sectors: list[int], contiguous: bool) -> None:
    if contiguous:
        sectors = list(range(sectors[0], sectors[0] + len(sectors)))
    runs = _extents(sectors)
    assert [s for first, count in runs for s in range(first, first + count)] == sectors
    address = 0x8000
    for _, count in runs:
        assert count * 512 < 65536
        assert address >> 16 == (address + count * 512 - 1) >> 16, "a run crosses a 64 KiB segment"
        address += count * 512
    if contiguous:  # as few runs as those limits allow
        assert len(runs) <= len(sectors) // 127 + 2


def test_source_date_epoch_is_the_users_else_the_releases_else_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    assert source_date_epoch("2022-12-01T00:00:00Z", 5) == 1669852800
    assert source_date_epoch("2022-12-01T00:00:00+00:00", 5) == 1669852800
    assert source_date_epoch(None, 5) == 5
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert source_date_epoch("2022-12-01T00:00:00Z", 5) == 1700000000
    for bad in ("-1", "1e9", "١٢٣", "99999999999", " 1", "x"):
        monkeypatch.setenv("SOURCE_DATE_EPOCH", bad)
        with pytest.raises(InputError) as err:
            source_date_epoch(None, 5)
        assert err.value.field == "SOURCE_DATE_EPOCH"
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    with pytest.raises(InputError) as err:
        source_date_epoch("yesterday", 5)
    assert err.value.field == "status.date"


def test_the_hash_seed_is_a_uuid_of_the_digest() -> None:
    assert hash_seed("a" * 64) == hash_seed("a" * 64) != hash_seed("b" * 64)
    assert len(hash_seed("a" * 64)) == 36


def test_the_content_digest_ignores_where_things_are_and_follows_what_they_are(tmp_path: Path) -> None:
    from imagebuilder.builder.inputs import content_digest
    from imagebuilder.builder.resolve import make_plan
    from imagebuilder.plan.model import BuildRequest
    from tests.support.common import make_manifest

    def plan(folder: Path, checksum: str) -> object:
        mirror = folder / "mirror" / "kubernetes-1-24" / "kubernetes-1-24-eks-36.yaml"
        mirror.parent.mkdir(parents=True)
        mirror.write_text(make_manifest("1-24", 36, "v1.24.17"))
        config = folder / "bm.json"
        (folder / "base.qcow2").write_bytes(b"a source image")  # only its path and checksum are read here
        config.write_text(f'{{"source_image_url": "{folder}/base.qcow2", "source_image_checksum": "{checksum}"}}')
        return make_plan(BuildRequest(os="ubuntu", hypervisor="baremetal", release_channel="1-24",
                                      configs={"baremetal": str(config)}, mirror=str(folder / "mirror"),
                                      output_dir=str(folder / "out"), offline=True, runtime="os"))  # fmt: skip

    a = plan(tmp_path / "a", "sha256:" + "1" * 64)
    b = plan(tmp_path / "elsewhere" / "b", "sha256:" + "1" * 64)
    c = plan(tmp_path / "c", "sha256:" + "2" * 64)
    assert content_digest(a, None) == content_digest(b, None) != content_digest(c, None)  # type: ignore[arg-type]
