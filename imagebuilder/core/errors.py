"""Error classes that carry the exit status the command line reports.

Two kinds matter to a user: their input is wrong (exit 2, fix the flag or file) or something outside us failed
(exit 1, retry or fix the system). Every error we raise is one of these, so the CLI never shows a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable
from difflib import get_close_matches
from pathlib import Path


class ImageBuilderError(Exception):
    """Base class; ``exit_code`` is what the command line exits with."""

    exit_code = 1


class InputError(ImageBuilderError):
    """Bad input: a flag, a config file, a manifest. Names the file and field and what is expected."""

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        source: str | Path | None = None,
        field: str | None = None,
        expected: str | None = None,
    ) -> None:
        self.source = str(source) if source is not None else None
        self.field = field
        self.expected = expected
        self.detail = message
        super().__init__(self._format())

    def _format(self) -> str:
        # a source the user gave may be any length (a 10k-character path): the message names its start and end
        source = self.source if self.source is None or len(self.source) <= 200 else (
            f"{self.source[:120]}...{self.source[-60:]}")  # fmt: skip
        where = ": ".join(p for p in (source, self.field) if p)
        text = f"{where}: {self.detail}" if where else self.detail
        if self.expected:
            text += f" (expected {self.expected})"
        return text


class InputErrors(InputError):
    """Several input errors found in one pass, reported together so the user fixes them in one go."""

    def __init__(self, errors: list[InputError]) -> None:
        self.errors = errors
        Exception.__init__(self, "\n".join(str(e) for e in errors))
        self.source = errors[0].source if errors else None
        self.field = errors[0].field if errors else None
        self.expected = None
        self.detail = str(self)


class ExternalError(ImageBuilderError):
    """An external system failed (network, Packer, vCenter...). ``hint`` says what to try."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(f"{message}\n  try: {hint}" if hint else message)


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """Return ``"; did you mean 'x'?"`` for the closest candidate, or an empty string."""
    match = get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean '{match[0]}'?" if match else ""


def require_flags(*given: tuple[str, object]) -> None:
    """Refuse (exit 2) when any of the required ``(flag, value)`` pairs has no value, naming every missing one at
    once; cheap, so a task calls it before importing what the run needs."""
    missing = [flag for flag, value in given if not value]
    if missing:
        raise InputError(f"required flag{'s' if len(missing) > 1 else ''} missing: {', '.join(missing)}")
