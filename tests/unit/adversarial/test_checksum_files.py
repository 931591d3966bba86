"""A ``.sha256`` beside an image is a file a build wrote (issue 43): one that is a symbolic link (to a secret file,
say) is refused without being read, and a content that is not a digest is never quoted in the message."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagebuilder.core.errors import InputError
from imagebuilder.publish.images import check_checksum

SECRET = "aws_secret_access_key = wJalr-never-shown-7731"


def _image(tmp_path: Path) -> Path:
    image = tmp_path / "node.gz"
    image.write_bytes(b"image bytes")
    (tmp_path / "credentials").write_text(SECRET + "\n")
    return image


def test_a_checksum_file_that_is_a_link_is_never_read(tmp_path: Path) -> None:
    image = _image(tmp_path)
    image.with_name("node.gz.sha256").symlink_to(tmp_path / "credentials")
    with pytest.raises(InputError) as err:
        check_checksum(image)
    assert "symbolic link" in str(err.value) and "wJalr" not in str(err.value)


@pytest.mark.parametrize("content", [SECRET, "x" * 64 + "  node.gz", "\x1b[2J", ""])
def test_a_checksum_that_is_not_a_digest_is_not_quoted(tmp_path: Path, content: str) -> None:
    image = _image(tmp_path)
    image.with_name("node.gz.sha256").write_text(content)
    with pytest.raises(InputError) as err:
        check_checksum(image)
    said = str(err.value)
    assert "wJalr" not in said and "x" * 64 not in said and "\x1b" not in said, said


def test_a_wrong_digest_is_quoted(tmp_path: Path) -> None:
    image = _image(tmp_path)
    image.with_name("node.gz.sha256").write_text("ab" * 32 + "  node.gz\n")
    with pytest.raises(InputError) as err:
        check_checksum(image)
    assert "ab" * 32 in str(err.value), "a digest is what the user needs to see"


def test_a_checksum_file_in_upper_case_is_the_same_digest(tmp_path: Path) -> None:
    """sha256sum -c takes a digest in either case; so does a publish (the digest it returns is lower case)."""
    import hashlib

    image = _image(tmp_path)
    digest = hashlib.sha256(b"image bytes").hexdigest()
    image.with_name("node.gz.sha256").write_text(f"{digest.upper()}  node.gz\n")
    assert check_checksum(image) == digest
