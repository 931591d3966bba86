"""Shared pieces of the task modules: error-to-exit-status translation and output.

Every task body runs inside :func:`cli_task`, so an :class:`~imagebuilder.errors.ImageBuilderError` becomes a
one-paragraph message on stderr and exit status 2 (bad input) or 1 (external failure), never a traceback.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from invoke.exceptions import Exit

from imagebuilder.errors import ImageBuilderError, InputErrors

F = TypeVar("F", bound=Callable[..., Any])


def format_error(exc: ImageBuilderError) -> str:
    if isinstance(exc, InputErrors):
        return "\n".join(f"error: {e}" for e in exc.errors)
    return f"error: {exc}"


def cli_task(body: F) -> F:
    """Wrap a task body so library errors exit with their status and a clear message."""

    @functools.wraps(body)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return body(*args, **kwargs)
        except ImageBuilderError as exc:
            raise Exit(format_error(exc), code=exc.exit_code) from None

    return wrapper  # type: ignore[return-value]


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
