"""The ``image-builder`` console script: an Invoke Program over the same namespace as tasks.py."""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from invoke.exceptions import Exit, ParseError
from invoke.program import Program

from imagebuilder import __version__
from imagebuilder.cli import namespace
from imagebuilder.core.errors import did_you_mean
from imagebuilder.core.untrusted import message


def friendly_parse_error(exc: ParseError, task_names: list[str]) -> str:
    """Invoke's parse error plus a "did you mean" for a mistyped flag or task name."""
    text = str(exc)
    match = re.match(r"No idea what '([^']+)' is!", text)
    if match:
        word = match.group(1)
        candidates = list(exc.context.flags.keys()) if exc.context is not None and word.startswith("-") else []
        candidates += task_names
        text += did_you_mean(word, candidates)
    return f"error: {text}"


def _parse_tasks_exit_2(self: Program, original: Any) -> None:
    try:
        original(self)
    except ParseError as exc:
        # every name a task answers to: build.build is also plain 'build' (its namespace's default)
        names = [n for k, v in self.collection.task_names.items() for n in (k, *v)] if self.collection else []
        raise Exit(message(friendly_parse_error(exc, names)), code=2) from None
    except ValueError as exc:  # a flag's value Invoke itself could not convert
        raise Exit(message(f"error: a flag has a value of the wrong type: {exc}"), code=2) from None


def exit_2_on_bad_flags() -> None:
    """Make Invoke's own ``invoke`` program exit 2 (not 1) on bad flags, like ``image-builder`` does.

    tasks.py calls this when Invoke loads it, which happens before task flags are parsed. Bad input must exit 2
    whichever front end the user types.
    """
    if getattr(Program.parse_tasks, "_imagebuilder", False):
        return
    original = Program.parse_tasks

    def parse_tasks(self: Program) -> None:
        _parse_tasks_exit_2(self, original)

    parse_tasks._imagebuilder = True  # type: ignore[attr-defined]
    Program.parse_tasks = parse_tasks  # type: ignore[method-assign]


exit_2_on_bad_flags()

program = Program(namespace=namespace, name="image-builder", binary="image-builder", version=__version__)


def main() -> None:
    try:
        program.run()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        # whoever read our output went away (``| head``): not an error to report, and no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
