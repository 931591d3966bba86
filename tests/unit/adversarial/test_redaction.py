"""One URL redaction for every message (issue 43): a password, a user part that stands alone (a token, as in
``s3://TOKEN@bucket/p``) and every query value are hidden, by the function that takes one URL and by the one that
takes a whole message, whatever the URL's other parts. Property-based over the URL's parts."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from imagebuilder.core.untrusted import MASK, masked, redact_url

#: every printable ASCII character but the space, ``?`` and ``#`` (which end a URL's authority in any URL, RFC 3986:
#: a password that holds them is percent-encoded): what a password may hold (``@``, ``:``, ``/``, ``%``, upper
#: case: an AWS secret key holds ``/`` and ``+``)
PRINTABLE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in "?#")
#: a password: any of them, long enough not to occur by chance in the rest of the URL
secrets = st.text(alphabet=PRINTABLE, min_size=12, max_size=40)
#: a user part that stands alone (a token): any of them but ``:``, which would make it ``user:password``
tokens = st.text(alphabet=PRINTABLE.replace(":", ""), min_size=12, max_size=40)
#: a query value: any of them but ``&``, which ends it, and ``?`` again
values_ = st.text(alphabet=PRINTABLE.replace("&", "") + "?", min_size=12, max_size=40)
hosts = st.sampled_from(["bucket", "host.example", "10.0.2.2:8888", "[::1]:443", "h"])
schemes = st.sampled_from(["s3", "https", "http", "oci", "git+https"])
paths = st.sampled_from(["", "/", "/p", "/a/b.yaml", "/x%20y"])


@given(scheme=schemes, token=tokens, host=hosts, path=paths)
def test_a_lone_user_part_is_hidden(scheme: str, token: str, host: str, path: str) -> None:
    url = f"{scheme}://{token}@{host}{path}"
    for said in (redact_url(url), masked(f"cannot reach {url}: refused")):
        assert token not in said and f"{MASK}@{host}" in said, said


@given(scheme=schemes, user=st.sampled_from(["u", "proxyuser", "robot"]), secret=secrets, host=hosts, path=paths)
def test_a_password_is_hidden_and_the_user_kept(scheme: str, user: str, secret: str, host: str, path: str) -> None:
    url = f"{scheme}://{user}:{secret}@{host}{path}"
    for said in (redact_url(url), masked(f"GET {url} failed")):
        assert secret not in said and f"{user}:{MASK}@" in said, said


@given(scheme=schemes, host=hosts, values=st.lists(values_, min_size=1, max_size=4), bare=st.booleans())
def test_every_query_value_is_hidden(scheme: str, host: str, values: list[str], bare: bool) -> None:
    """Every query value, whatever it holds. One limit, drawn around: behind ``host:port``, a value holding ``@``
    makes the URL read as ``user:password@``, and the masking of a password (which may hold ``?``) then takes the
    query with it (the values before the ``@`` hidden, those after it not: a known gap, issue 63's note)."""
    # a value without a name: what it holds up to an ``=`` would be its name (base64's padding is in named values)
    values[0] = values[0].replace("=", "") if bare else values[0]
    assume(len(values[0]) >= 12)
    assume(":" not in host or not any("@" in v for v in values))
    # a value holding ``x:/`` reads as a URL of its own: hidden whole with what follows (more than its value)
    assume(not any(":/" in v for v in values))
    query = "&".join(v if bare and i == 0 else f"k{i}={v}" for i, v in enumerate(values))
    url = f"{scheme}://{host}/o?{query}#frag"
    for said in (redact_url(url), masked(f"({url})")):
        assert not any(v in said for v in values), said
        assert said.count(MASK) == len(values) and "#frag" in said


def test_a_secret_that_holds_a_slash_is_hidden_whole() -> None:
    """An AWS secret key holds ``/`` and ``+``: the part of it after the slash is no path (issue 63's leak)."""
    for text in ("GET s3://AKIAXX/abc+def@bucket/x failed", "s3://tok@en@bucket/p", "https://u:p@ss/w:d@host/x"):
        said = masked(text)
        assert "abc+def" not in said and "AKIAXX" not in said and "en@" not in said and "ss/w" not in said, said
        assert said == redact_url(text) or text.startswith("GET"), said


@pytest.mark.parametrize(
    "text",
    [
        "/srv/mirror/a.yaml",
        "https://host.example/a/b.yaml",
        "user@host",
        "s3://bucket/prefix",
        "oci://registry.example/pause@sha256:" + "ab" * 32,
    ],
)
def test_what_holds_no_secret_is_left_as_it_is(text: str) -> None:
    assert redact_url(text) == text and masked(text) == text
