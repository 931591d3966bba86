"""``image.publish``'s local checks, in process (issue 63): what :mod:`imagebuilder.publish.images` accepts, what
it refuses and in which words, before the repository is touched.

tests/integration/test_publish.py runs the task against folders and moto's S3 with python-tuf's and tuftool's
clients; it cannot say which check refused a file, nor that nothing was written when one did. Mutation testing
found the module reached by no unit test at all (13% of its mutants killed)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from securesystemslib.signer import CryptoSigner

from imagebuilder.attest import provenance
from imagebuilder.core.errors import InputError
from imagebuilder.publish import repository
from imagebuilder.publish.images import check_checksum, companions, image_targets, publish_images
from imagebuilder.publish.storage import open_store

SIGNER = CryptoSigner.generate_ed25519()
OTHER = CryptoSigner.generate_ed25519()


def _image(folder: Path, name: str = "node-amd64.gz", *, data: bytes = b"a node image", sign: bool = True) -> Path:
    """An image as a build writes it: its .sha256 (upper case, as some tools write it), SBOM and signed provenance."""
    folder.mkdir(parents=True, exist_ok=True)
    image = folder / name
    image.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    image.with_name(name + ".sha256").write_text(f"{digest.upper()}  {name}\n")
    sbom = provenance.companion(image, ".spdx.json")
    sbom.write_text('{"spdxVersion": "SPDX-2.3"}\n')
    doc = {
        "_type": provenance.STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": digest}}],
        "predicateType": provenance.PREDICATE_TYPE,
        "predicate": {"runDetails": {"byproducts": [{"name": sbom.name, "digest": {
            "sha256": hashlib.sha256(sbom.read_bytes()).hexdigest()}}]}},
    }  # fmt: skip
    envelope = provenance.sign(doc, SIGNER) if sign else provenance.unsigned(doc)
    provenance.write(provenance.companion(image, provenance.SUFFIX), envelope)
    return image


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, Path]:
    keys = tmp_path / "keys"
    repository.make_keys(keys, dict.fromkeys(repository.ROLES, 1), "ed25519")
    loaded = repository.load_keys(keys, repository.ROLES)
    folder = tmp_path / "repo"
    repository.init(open_store(str(folder)), loaded, dict.fromkeys(repository.ROLES, 1), repository.expiry(None))
    return folder, keys


def _refused(call: Callable[..., object], *args: object, **kwargs: object) -> InputError:
    with pytest.raises(InputError) as raised:
        call(*args, **kwargs)
    return raised.value


def test_an_image_becomes_three_targets_named_after_it(tmp_path: Path) -> None:
    image = _image(tmp_path)
    digest = hashlib.sha256(b"a node image").hexdigest()
    assert check_checksum(image) == digest
    assert companions(image) == (tmp_path / "node-amd64.spdx.json", tmp_path / "node-amd64.intoto.json")
    targets = image_targets(image, "", SIGNER.public_key)
    assert [(t.name, t.path, t.sha256) for t in targets] == [
        ("node-amd64.gz", image, digest),
        ("node-amd64.spdx.json", tmp_path / "node-amd64.spdx.json", None),
        ("node-amd64.intoto.json", tmp_path / "node-amd64.intoto.json", None),
    ]
    named = image_targets(image, "ubuntu-1-36.gz", None)
    assert [t.name for t in named] == ["ubuntu-1-36.gz", "ubuntu-1-36.spdx.json", "ubuntu-1-36.intoto.json"]


def test_a_checksum_file_that_is_missing_a_link_empty_or_another_s(tmp_path: Path) -> None:
    image = _image(tmp_path)
    sums = tmp_path / "node-amd64.gz.sha256"
    cases: dict[str, tuple[Callable[[], object], str]] = {
        "missing": (lambda: None, "has no node-amd64.gz.sha256 file beside it"),
        "link": (lambda: sums.symlink_to(tmp_path / "node-amd64.spdx.json"),
                 "has no node-amd64.gz.sha256 file beside it (a symbolic link)"),
        "empty": (lambda: sums.write_text(""), "node-amd64.gz.sha256 says no SHA-256, the image's SHA-256 is "),
        "not a digest": (lambda: sums.write_text("secret text\n"),
                         "node-amd64.gz.sha256 says something that is not a SHA-256 of it, the image's SHA-256 is "),
        "another's": (lambda: sums.write_text("0" * 64 + "  node-amd64.gz\n"),
                      f"node-amd64.gz.sha256 says {'0' * 64}, the image's SHA-256 is "),
    }  # fmt: skip
    for name, (spoil, said) in cases.items():
        sums.unlink(missing_ok=True)
        spoil()
        error = _refused(check_checksum, image)
        exact = name in ("missing", "link")  # the others go on with the image's digest
        assert error.detail == said if exact else error.detail.startswith(said), (name, error.detail)
        assert (error.field, error.source) == ("--image", str(image))
        assert "secret text" not in str(error)
        expected = ("the image's checksum file, as a build writes it" if name in ("missing", "link")
                    else "an image whose .sha256 matches (a partial copy or another build's checksum?)")  # fmt: skip
        assert error.expected == expected


def test_a_checksum_file_that_is_not_text_is_named_as_one(tmp_path: Path) -> None:
    image = _image(tmp_path)
    (tmp_path / "node-amd64.gz.sha256").write_bytes(b"\xff\xfe\x00 not text")
    assert "checksum file" in str(_refused(check_checksum, image))


@pytest.mark.parametrize("missing", [".spdx.json", ".intoto.json"])
def test_an_image_without_its_sbom_or_provenance(tmp_path: Path, missing: str) -> None:
    image = _image(tmp_path)
    (tmp_path / f"node-amd64{missing}").unlink()
    what = "SBOM" if missing == ".spdx.json" else "provenance"
    error = _refused(companions, image)
    assert (error.detail, error.field, error.source) == (f"has no {what} beside it (node-amd64{missing})", "--image",
                                                         str(image))  # fmt: skip
    assert error.expected == "an image as a build writes it: with its .sha256, .spdx.json and .intoto.json"


def test_a_provenance_not_of_this_image_or_not_signed_by_the_key(tmp_path: Path) -> None:
    image = _image(tmp_path)
    error = _refused(image_targets, image, "", OTHER.public_key)
    assert error.detail.startswith("the provenance ") and "is not signed by the key" in error.detail
    assert (error.source, error.field) == (str(tmp_path / "node-amd64.intoto.json"), "--image")
    assert error.expected == "the provenance the build of this very image wrote, signed"
    unsigned = _image(tmp_path / "u", sign=False)
    assert _refused(image_targets, unsigned, "", None).detail.endswith("is not signed")
    other = _image(tmp_path / "o", data=b"another image")
    (tmp_path / "o" / "node-amd64.intoto.json").replace(tmp_path / "node-amd64.intoto.json")
    assert "not node-amd64.gz" in _refused(image_targets, image, "", None).detail
    assert other.exists()


def test_a_bad_target_name_is_refused_naming_its_flag(tmp_path: Path) -> None:
    image = _image(tmp_path)
    assert _refused(image_targets, image, "a/b.gz", None).field == "--target-name"
    bad = _image(tmp_path / "b", name=".hidden.gz")
    assert _refused(image_targets, bad, "", None).field == "--image"


def test_publish_checks_everything_first_and_writes_one_version(repo: tuple[Path, Path], tmp_path: Path) -> None:
    folder, keys = repo
    first, second = _image(tmp_path / "a", "a.gz"), _image(tmp_path / "b", "b.gz", data=b"b")
    before = sorted(p.name for p in (folder / "metadata").iterdir())
    error = _refused(publish_images, [first, first], str(folder), keys)
    assert (error.detail, error.field, error.expected) == ("two images would be published as a.gz", "--image",
                                                           "images of distinct names")  # fmt: skip
    error = _refused(publish_images, [first, second], str(folder), keys, names=["x.gz", "x.gz"])
    assert error.detail == "two images would be published as x.gz"
    error = _refused(publish_images, [first], str(folder), keys, public_key=OTHER.public_key)
    assert "is not signed by the key" in error.detail, "--public-key reaches each image's check"
    assert sorted(p.name for p in (folder / "metadata").iterdir()) == before, "a refusal writes nothing"
    dry = publish_images([first, second], str(folder), keys, dry_run=True)
    assert sorted(p.name for p in (folder / "metadata").iterdir()) == before and dry.change.written
    said: list[str] = []
    sent: list[tuple[str, int]] = []

    def transfers(label: str, total: int) -> Callable[[int], None]:
        sent.append((label, total))
        return lambda n: None

    done = publish_images([first, second], str(folder), keys, public_key=SIGNER.public_key, say=said.append,
                          transfers=transfers)  # fmt: skip
    assert said == [f"uploading {t.name}" for t in done.targets], "the progress protocol reaches the repository"
    assert sent == [(t.name, t.path.stat().st_size) for t in done.targets]
    assert done.signature_checked and [t.name for t in done.targets] == [
        "a.gz", "a.spdx.json", "a.intoto.json", "b.gz", "b.spdx.json", "b.intoto.json"]  # fmt: skip
    assert done.change.versions["targets"] == 2
    targets = json.loads((folder / "metadata" / "2.targets.json").read_text())["signed"]["targets"]
    assert sorted(targets) == sorted(t.name for t in done.targets)
    assert targets["a.gz"]["hashes"]["sha256"] == hashlib.sha256(b"a node image").hexdigest()
    again = publish_images([first, second], str(folder), keys)
    assert not again.signature_checked and again.change.written == [], "a rerun of the same images writes nothing"
    assert again.change.unchanged == [t.name for t in done.targets]
