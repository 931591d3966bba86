"""Hostile input to the tasks around a build (issue 17): AMI artifact IDs and S3 names (ami.export), CloudStack
names (cloudstack.template-register). Every value either comes out in a form that cannot escape its place (a key
prefix above its bucket, a control character into a request or a message) or is refused with a clean ValueError."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from imagebuilder.core import grammar
from imagebuilder.providers.ami.export import artifact_pairs
from imagebuilder.providers.cloudstack.template_register import name_of


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_artifact_ids_parse_to_grammar_checked_pairs_or_fail_cleanly(text: str) -> None:
    try:
        pairs = artifact_pairs(text)
    except ValueError as exc:
        assert "\n" not in str(exc).replace(repr(text[:60]), "")
        return
    for region, image in pairs:
        assert grammar.aws_region(region) == region and grammar.ami_id(image) == image


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=70))
def test_bucket_and_prefix_grammars_never_let_a_path_escape(text: str) -> None:
    try:
        prefix = grammar.s3_prefix(text)
    except ValueError:
        prefix = None
    if prefix is not None:
        assert not prefix.startswith("/") and ".." not in prefix.split("/") and "\n" not in prefix
    try:
        bucket = grammar.s3_bucket(text)
    except ValueError:
        return
    assert 3 <= len(bucket) <= 63 and "/" not in bucket and ".." not in bucket


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_cloudstack_names_are_printable_and_bounded_or_refused(text: str) -> None:
    try:
        name = name_of(text, "template")
    except ValueError as exc:
        assert "\n" not in str(exc).replace(repr(text[:60]), "")
        return
    assert 1 <= len(name) <= 255 and name == name.strip()
    assert not any(ord(c) < 0x20 or ord(c) == 0x7F for c in name)
