"""The ``image-builder`` program run in this process: the same Invoke Program the console script runs, with its
output captured. Hundreds of hostile inputs run in seconds this way; a handful of tests also run the real console
script as a subprocess (tests.support.common.run) to prove the two agree."""

from __future__ import annotations

import contextlib
import copy
import io
import os
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from invoke.program import Program

from imagebuilder import __version__
from imagebuilder.cli import namespace
from imagebuilder.cli.program import program as _program  # noqa: F401 - installs the exit-2 parse handler


@dataclass
class Outcome:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


@contextlib.contextmanager
def _environ(env: dict[str, str] | None, cwd: Path | None) -> Iterator[None]:
    from imagebuilder.core.fetch import reset_connections

    saved, old_cwd = dict(os.environ), os.getcwd()
    os.environ.update(env or {})
    if cwd:
        os.chdir(cwd)
    reset_connections()  # the fetcher reads the proxy variables once: this run's, not an earlier one's
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        os.chdir(old_cwd)
        reset_connections()  # and the next test's are its own again


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Outcome:
    """Run ``image-builder ARGS``; an exception escaping the program is a test failure (it would be a traceback)."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with _environ(env, cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        # a fresh copy per run: Invoke pops each task's help texts when it first builds its arguments
        program = Program(namespace=copy.deepcopy(namespace), name="image-builder", binary="image-builder",
                          version=__version__)  # fmt: skip
        try:
            program.run(["image-builder", *args], exit=True)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            raise AssertionError(f"image-builder {' '.join(args)} raised:\n{traceback.format_exc()}") from None
    result = Outcome(code, out.getvalue(), err.getvalue())
    assert "Traceback" not in result.text, result.text
    return result
