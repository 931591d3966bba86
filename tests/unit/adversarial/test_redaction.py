"""One URL redaction for every message (issue 43): a password, a user part that stands alone (a token, as in
``s3://TOKEN@bucket/p``) and every query value are hidden, by the function that takes one URL and by the one that
takes a whole message, whatever the URL's other parts. Property-based over the URL's parts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuilder.core.untrusted import MASK, masked, redact_url

#: what a secret is made of here: long enough not to occur by chance in the rest of the URL
secrets = st.text(
    alphabet="ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz0123456789-_.~%+", min_size=12, max_size=40
)
hosts = st.sampled_from(["bucket", "host.example", "10.0.2.2:8888", "[::1]:443", "h"])
schemes = st.sampled_from(["s3", "https", "http", "oci", "git+https"])
paths = st.sampled_from(["", "/", "/p", "/a/b.yaml", "/x%20y"])


@given(scheme=schemes, token=secrets, host=hosts, path=paths)
def test_a_lone_user_part_is_hidden(scheme: str, token: str, host: str, path: str) -> None:
    url = f"{scheme}://{token}@{host}{path}"
    for said in (redact_url(url), masked(f"cannot reach {url}: refused")):
        assert token not in said and f"{MASK}@{host}" in said, said


@given(scheme=schemes, user=st.sampled_from(["u", "proxyuser", "robot"]), secret=secrets, host=hosts, path=paths)
def test_a_password_is_hidden_and_the_user_kept(scheme: str, user: str, secret: str, host: str, path: str) -> None:
    url = f"{scheme}://{user}:{secret}@{host}{path}"
    for said in (redact_url(url), masked(f"GET {url} failed")):
        assert secret not in said and f"{user}:{MASK}@" in said, said


@given(scheme=schemes, host=hosts, values=st.lists(secrets, min_size=1, max_size=4), bare=st.booleans())
def test_every_query_value_is_hidden(scheme: str, host: str, values: list[str], bare: bool) -> None:
    query = "&".join(v if bare and i == 0 else f"k{i}={v}" for i, v in enumerate(values))
    url = f"{scheme}://{host}/o?{query}#frag"
    for said in (redact_url(url), masked(f"({url})")):
        assert not any(v in said for v in values), said
        assert said.count(MASK) == len(values) and "#frag" in said


@pytest.mark.parametrize(
    "text", ["/srv/mirror/a.yaml", "https://host.example/a/b.yaml", "user@host", "s3://bucket/prefix"]
)
def test_what_holds_no_secret_is_left_as_it_is(text: str) -> None:
    assert redact_url(text) == text and masked(text) == text
