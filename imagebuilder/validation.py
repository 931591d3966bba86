"""One problem report for every validated file: pydantic's errors as the user reads them.

A file's problems are collected (every one, not the first) as :class:`Problem` rows naming the field as the file
spells it, then raised together as :class:`~imagebuilder.errors.InputErrors` by the reader.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ValidationError


@dataclass(frozen=True)
class Problem:
    field: str
    message: str
    expected: str | None = None


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_MESSAGES = {
    "missing": "required field is missing",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "extra_forbidden": "unknown field",
}


def pydantic_problems(exc: ValidationError, model: type[BaseModel] | None = None) -> list[Problem]:
    """A pydantic error as our problems: the field path as the user writes it, a plain message, and (for a
    missing field of ``model``) what is expected."""
    problems = []
    for err in exc.errors():
        field = _loc(err["loc"])
        kind = err["type"]
        msg = _MESSAGES.get(kind) or str(err["msg"]).removeprefix("Value error, ")
        expected = None
        top = err["loc"][0] if err["loc"] else None
        info = model.model_fields.get(str(top)) if model is not None and top is not None else None
        if kind == "missing" and info is not None:
            expected = info.description
        elif kind == "literal_error":
            msg = f"got {err['input']!r}"
            expected = str(err["msg"]).removeprefix("Input should be ")
        problems.append(Problem(field, msg, expected))
    return problems
