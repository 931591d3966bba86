"""One number grammar (issue 43): every count, threshold, expiry and release number a user or a file gives is ASCII
digits of bounded length, checked before ``int()`` sees it. ``str.isdigit()`` takes superscripts (``²``) that
``int()`` then refuses (an internal error), and ``int()`` itself takes other scripts' digits (``٣`` is 3) and
numbers of any length; each of those is refused here with exit 2 naming the flag or the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import assume, given
from hypothesis import strategies as st

from imagebuilder.cli.repo import _counts
from imagebuilder.core.errors import InputError
from imagebuilder.publish.repository import expiry
from imagebuilder.release.manifest import parse_manifest
from tests.support.common import reference
from tests.support.inproc import cli

#: digits that are not ASCII: some that int() takes (other scripts', full-width), some it refuses (superscripts)
FOREIGN = ["٣", "３", "²", "߁", "᠑", "𝟙", "1²", "٣0", "1_0", "+3", "0x3", "1e3", "-1"]
HUGE = "9" * 10_000


def _not_ascii_number(text: str) -> bool:
    return not (text.isascii() and text.isdigit())


@pytest.mark.parametrize("value", [*FOREIGN, HUGE])
def test_expiry_and_key_counts_take_ascii_digits_only(value: str) -> None:
    with pytest.raises(InputError) as err:
        expiry(f"timestamp={value}")
    assert err.value.field == "--expires" and HUGE not in str(err.value)
    with pytest.raises(InputError) as err:
        _counts(f"root={value}", "--threshold", {"root": 1})
    assert err.value.field == "--threshold" and HUGE not in str(err.value)


@given(st.text(alphabet=st.characters(categories=["Nd", "No", "Nl"]), min_size=1, max_size=6))
def test_any_unicode_digit_string_is_refused_unless_ascii(value: str) -> None:
    assume(_not_ascii_number(value))
    with pytest.raises(InputError):
        expiry(f"timestamp={value}")
    with pytest.raises(InputError):
        _counts(f"targets={value}", "--threshold", {"targets": 1})


@pytest.mark.parametrize("number", ["٣", "²", HUGE, "1_0", True, 3.0, None])
def test_a_release_number_that_is_not_ascii_digits_names_the_field(number: object) -> None:
    doc = yaml.safe_load(reference("eksd", "kubernetes-1-21-eks-4.yaml").read_text())
    doc["spec"]["number"] = number
    with pytest.raises(InputError) as err:
        parse_manifest(yaml.safe_dump(doc, allow_unicode=True), "m.yaml")
    assert err.value.field == "spec.number" and HUGE not in str(err.value)


@pytest.mark.parametrize("channel", ["１-21", "1-٢1", "1-21 ", "9" * 50 + "-1"])
def test_a_release_channel_that_is_not_ascii_digits_names_the_field(channel: str) -> None:
    doc = yaml.safe_load(reference("eksd", "kubernetes-1-21-eks-4.yaml").read_text())
    doc["spec"]["channel"] = channel
    with pytest.raises(InputError) as err:
        parse_manifest(yaml.safe_dump(doc, allow_unicode=True), "m.yaml")
    assert err.value.field == "spec.channel"


@pytest.mark.parametrize("value", ["²", "٣", HUGE])
def test_repo_flags_exit_2_on_foreign_digits(tmp_path: Path, value: str) -> None:
    (tmp_path / "keys").mkdir()
    res = cli("repo.init", "--repo", str(tmp_path / "repo"), "--keys", str(tmp_path / "keys"), "--threshold",
              f"root={value}", "--dry-run")  # fmt: skip
    assert res.code == 2, res.text
    assert "--threshold" in res.text and "internal error" not in res.text and HUGE not in res.text


@pytest.mark.parametrize("version", ["v1.３4.2", "v1.34.٢", "1.²4.0", "v1." + "3" * 5000 + ".1", "v1.34." + "9" * 5000])
def test_a_kubernetes_version_is_ascii_digits_of_bounded_length(version: str) -> None:
    """``--kubernetes`` of release.build: another script's digits were planned as a version (int() takes them), and
    5,000 digits were past int()'s own limit (an internal error)."""
    res = cli("release.build", "--kubernetes", version, "--dry-run")
    assert res.code == 2 and "--kubernetes" in res.text and "internal error" not in res.text, res.text[:300]
    assert "is not a Kubernetes release" in res.text and "3" * 100 not in res.text and "9" * 100 not in res.text
