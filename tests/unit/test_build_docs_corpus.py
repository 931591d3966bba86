"""The reference tool's build documentation, as its users copy it (tests/data/build-docs/, verbatim; provenance in
tests/data/README.md): every key it uses is known here, and every placeholder is refused with a message naming the
file, the field and the shape expected (exit 2, no traceback). Filled with real values, and with the docs' own JSON
slips fixed (a trailing comma, a '...', '#' comments), each example is accepted."""

from __future__ import annotations

import re

import pytest

from tests.support.common import reference
from tests.support.docs_corpus import VERDICTS, dry_run


@pytest.mark.parametrize("name", sorted(VERDICTS))
def test_the_documented_example_verbatim_gets_its_verdict(name: str) -> None:
    os_name, provider, refused = VERDICTS[name]
    path = reference("build-docs", name)
    res = dry_run(os_name, provider, path)
    assert res.code == 2, res.out
    assert "unknown field" not in res.err  # every key the docs use is one this tool reads
    lines = [ln for ln in res.err.splitlines() if ln.startswith("error:")]
    assert lines and all(str(path) in ln for ln in lines), res.err
    if refused == {"json"}:
        assert re.search(r"invalid JSON at line \d+, column \d+", res.err), res.err
        return
    named = {m.group(1) for ln in lines if (m := re.match(rf"error: {re.escape(str(path))}: (\w+):", ln))}
    assert named == refused, res.err
