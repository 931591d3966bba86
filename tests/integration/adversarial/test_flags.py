"""Hostile and careless flag values, for every task that takes a typed flag, a destination or a URL.

Each case must exit 2, name the flag, print no traceback and create nothing. Run in-process (tests.support.inproc);
test_console_script_agrees runs a sample through the real console script."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.common import run
from tests.support.inproc import cli


def test_console_script_agrees(tmp_path: Path) -> None:
    """A sample through the real console script and through invoke: same status, no traceback (run() checks)."""
    for program in ("image-builder", "invoke"):
        for args in (["serve", "--dir", ".", "--port", "abc"], ["dhcp.verify", "--interface", "lo", "--timeout", "x"]):
            res = run(*args, program=program)
            assert res.code == 2 and args[-2] in res.err, (program, res.err)


@pytest.mark.parametrize(
    ("says", "why"),
    [
        ("Packer v0.1.0", "older than 1.6.6"),
        ("Packer v1.6.5", "older than 1.6.6"),
        ("Packer v1." + "9" * 5000 + ".0", "did not print a Packer version"),
        ("Packer v1.\u0669.4", "did not print a Packer version"),  # an Arabic-Indic digit
    ],
)
def test_a_packer_below_the_floor_or_unreadable_is_refused_at_plan_time(tmp_path: Path, says: str, why: str) -> None:
    """--packer names a binary: what it says of its version is held to the floor the templates are built on (Debian's
    1.6.6, docs/packer.md) before anything is planned on it (outside review: a Packer saying v0.1.0 was planned)."""
    fake = tmp_path / "bin" / "packer"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' '{says}'\n")
    fake.chmod(0o755)
    res = cli("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--packer",
              str(fake), "--engine", "packer", "--dry-run", cwd=tmp_path)  # fmt: skip
    assert res.code == 2 and "--packer" in res.err and why in res.err, res.text
    assert len(res.err) < 2000, "a long version is not echoed whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]
