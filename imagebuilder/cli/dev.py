"""Developer tasks: ``lint`` and ``test`` (the README's test command is ``invoke test``)."""

from __future__ import annotations

import sys
from pathlib import Path

from invoke.context import Context
from invoke.tasks import task

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@task(auto_shortflags=False)
def lint(c: Context) -> None:
    """Static checks of what we ship: ruff, ruff format --check, mypy."""
    with c.cd(str(ROOT)):
        c.run(f"{BIN}/ruff check .")
        c.run(f"{BIN}/ruff format --check .")
        c.run(f"{BIN}/mypy")


@task(
    help={
        "k": "only tests matching this pytest -k expression",
        "no_lint": "skip the static checks",
    },
    auto_shortflags=False,
)
def test(c: Context, k: str = "", no_lint: bool = False) -> None:
    """Run the whole test suite (static checks, then pytest against the real components)."""
    if not no_lint:
        lint(c)
    select = f" -k '{k}'" if k else ""
    with c.cd(str(ROOT)):
        c.run(f"{BIN}/python -m pytest{select}", pty=False)
