"""The static checks of the source (``invoke lint``'s: ruff, ruff's formatter, mypy --strict, ansible-lint), run by
the full suite as tests: beside the other modules on the light worker rather than before the suite with one core
idle (about four minutes of a CI run), and once (the Packer templates' validate and fmt checks are
tests/integration/test_packer.py's)."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from imagebuilder.cli.dev import STATIC_CHECKS
from tests.support.common import BIN, ROOT

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("check", STATIC_CHECKS)
def test_the_source_passes(check: str) -> None:
    program, *args = shlex.split(check)
    res = subprocess.run([str(BIN / program), *args], cwd=ROOT, capture_output=True, text=True, timeout=1200,
                         check=False)  # fmt: skip
    assert res.returncode == 0, f"{check}:\n{res.stdout[-6000:]}{res.stderr[-3000:]}"
