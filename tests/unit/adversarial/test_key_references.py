"""Property tests of the KMS and token key references (issue 45): whatever text a ``--signing-key``, ``--new-key``
or ``<role>.uri`` carries, it is a file path, a reference that parses to exactly what it says, or exit 2 naming the
flag; a PIN never survives into an error message; nothing reaches a KMS or token before the grammar is met."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagebuilder.attest.signers import is_reference, kms_key_id, token_key
from imagebuilder.core.errors import InputError

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=300)
UUID = st.uuids().map(str)
ALIAS = st.from_regex(r"alias/[A-Za-z0-9/_-]{1,40}", fullmatch=True)


@settings(max_examples=400)
@given(TEXT)
def test_any_kms_text_parses_or_is_refused_naming_the_flag(text: str) -> None:
    ref = "awskms:" + text
    try:
        key, region = kms_key_id(ref, "--signing-key")
    except InputError as exc:
        assert exc.exit_code == 2 and exc.field == "--signing-key"
        assert "\n" not in str(exc)[:200]
        return
    # what parses is only ids, aliases and ARNs: no whitespace, quotes, control characters or '..'
    assert key == text and all(c.isalnum() or c in "/_-:" for c in key)
    assert region is None or key.startswith("arn:aws")


@given(UUID | ALIAS)
def test_kms_ids_and_aliases_are_taken_as_they_are(key: str) -> None:
    assert kms_key_id(f"awskms:{key}", "--new-key") == (key, None)


@given(UUID, st.sampled_from(["us-east-1", "eu-west-3", "ap-southeast-2", "us-gov-west-1"]))
def test_an_arn_gives_its_region(key: str, region: str) -> None:
    arn = f"arn:aws:kms:{region}:123456789012:key/{key}"
    assert kms_key_id(f"awskms:{arn}", "--signing-key") == (arn, region)


@settings(max_examples=400)
@given(st.sampled_from(["hsm:", "pkcs11:"]), TEXT)
def test_any_token_text_parses_or_is_refused(scheme: str, text: str) -> None:
    try:
        key = token_key(scheme + text, "--signing-key")
    except InputError as exc:
        assert exc.exit_code == 2
        assert exc.field in ("--signing-key",)
        return
    assert 0 <= key.key_id < 2**32
    assert key.label is None or (1 <= len(key.label) <= 32 and key.label.isprintable())
    assert key.module is None or key.module.startswith("/")


@given(st.integers(1, 2**32 - 1), st.from_regex(r"[A-Za-z0-9 _.-]{1,32}", fullmatch=True))
def test_the_rfc7512_form_and_securesystemslibs_name_the_same_key(key_id: int, label: str) -> None:
    from urllib.parse import quote, urlencode

    raw = key_id.to_bytes((key_id.bit_length() + 7) // 8, "big")
    pct = "".join(f"%{b:02x}" for b in raw)
    a = token_key(f"pkcs11:token={quote(label)};id={pct}", "--signing-key")
    b = token_key(f"hsm:{key_id}?{urlencode({'label': label})}", "--signing-key")
    assert (a.key_id, a.label) == (b.key_id, b.label) == (key_id, label)


@given(st.from_regex(r"[0-9]{4,12}", fullmatch=True), st.sampled_from(["pin-value", "pin-source"]))
def test_a_pin_in_the_uri_is_refused_and_never_repeated(pin: str, attr: str) -> None:
    uri = f"pkcs11:token=t;id=%02;{attr}={pin}" if attr == "pin-value" else f"pkcs11:token=t;id=%02?{attr}={pin}"
    with pytest.raises(InputError) as exc:
        token_key(uri, "--signing-key")
    assert "carries the PIN" in str(exc.value) and pin not in str(exc.value)


@given(TEXT)
def test_a_path_is_never_taken_for_a_reference_unless_it_says_so(text: str) -> None:
    if is_reference(text):
        assert text.split(":", 1)[0] in ("awskms", "hsm", "pkcs11")
    assert not is_reference("./awskms:alias/x") and not is_reference("/keys/hsm:2")
