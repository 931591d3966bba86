"""The one validation layer for files: strict models and one problem report.

Every file the tool reads is parsed by :mod:`imagebuilder.core.files` (safe loaders, size limits) and validated against
a :class:`StrictModel` (unknown keys refused, values immutable), or, for a document another tool owns (the product's
cluster specs, a distro's release manifest), a :class:`ForeignModel` of the fields this tool reads. A file's problems
are collected (every one, not the first) as :class:`Problem` rows naming the field as the file spells it, then raised
together as :class:`~imagebuilder.core.errors.InputErrors` (exit 2) by :func:`validated`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from imagebuilder.core.errors import InputError, InputErrors, did_you_mean


class StrictModel(BaseModel):
    """Base of every model a file is validated against: an unknown key is an error, a loaded value never changes,
    and an optional field given as an empty (or blank) string is not set, as the reference tool reads its files:
    ``""`` is its "unset" (a required field given empty is still refused, naming it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _empty_is_unset(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not any(isinstance(v, str) and not v.strip() for v in data.values()):
            return data  # nothing blank: the common case, without a look at the fields (rows by the 100,000)
        fields = cls.model_fields
        return {
            k: v
            for k, v in data.items()
            if not (isinstance(v, str) and not v.strip() and k in fields and not fields[k].is_required())
        }


class ForeignModel(StrictModel):
    """Base of a model of a document another tool owns (the product's cluster specs, a distro's release manifest):
    only the fields this tool reads are modelled and checked, the rest are left alone, because that tool's schema
    grows without this one and its users' files carry all of it. Empty optional values are unset, as in
    :class:`StrictModel`."""

    model_config = ConfigDict(extra="ignore", frozen=True)


M = TypeVar("M", bound=BaseModel)


class FieldProblem(ValueError):
    """What a model's validator raises for a value it refuses: the message and what the field expects, both kept in
    the one problem report (pydantic keeps only a ValueError's message)."""

    def __init__(self, message: str, expected: str | None = None) -> None:
        super().__init__(message)
        self.message, self.expected = message, expected

    @classmethod
    def of(cls, error: InputError) -> FieldProblem:
        """A library check's :class:`InputError` (a grammar, a catalog lookup) as a validator's problem."""
        return cls(error.detail, error.expected)


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


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models a field's type holds: itself, or the items of a list, dict, tuple or union of them."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _model_at(model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model of the mapping at ``loc`` (a list's index or a dict's key passes to its items), or None where no
    one model is known: what names a key there may have, and what each field of it expects."""
    for part in loc:
        if model is None:
            return None
        info = model.model_fields.get(part) if isinstance(part, str) else None
        if info is not None:
            models = _models_in(info.annotation)
            model = models[0] if len(models) == 1 else None
        # else an index, or a dict's key: the items' model is the one already found
    return model


def pydantic_problems(exc: ValidationError, model: type[BaseModel] | None = None) -> list[Problem]:
    """A pydantic error as our problems: the field path as the user writes it, a plain message, for a missing
    field what it expects (its description) and for an unknown key "did you mean", at any depth of ``model``."""
    problems = []
    for err in exc.errors():
        field = _loc(err["loc"])
        kind = err["type"]
        msg = _MESSAGES.get(kind) or str(err["msg"]).removeprefix("Value error, ")
        expected = None
        parent = _model_at(model, err["loc"][:-1]) if err["loc"] else None
        info = parent.model_fields.get(str(err["loc"][-1])) if parent is not None else None
        cause = err.get("ctx", {}).get("error")
        if isinstance(cause, FieldProblem):
            msg, expected = cause.message, cause.expected
        if kind in ("bool_type", "bool_parsing"):
            msg = f"got {err['input']!r}"
        if kind == "string_too_short" and err.get("ctx", {}).get("min_length") == 1:
            msg = _MESSAGES["missing"]  # given empty: not there, as the reference tool reads ""
        if kind in ("missing", "string_too_short", "bool_type", "bool_parsing") and info is not None:
            expected = info.description
        elif kind == "extra_forbidden" and parent is not None:
            msg += did_you_mean(str(err["loc"][-1]), list(parent.model_fields))
        elif kind == "literal_error":
            msg = f"got {err['input']!r}"
            expected = str(err["msg"]).removeprefix("Input should be ")
        problems.append(Problem(field, msg, expected))
    return problems


def model_problems(
    model: type[M], data: object, *, prefix: str = "", context: dict[str, Any] | None = None
) -> tuple[M | None, list[Problem]]:
    """``data`` checked against ``model`` without raising: the model (None when it does not validate) and every
    problem, its field under ``prefix`` (``[3]`` for an item of a list): a mapping's unknown keys (with "did you
    mean"), then the model's own: what :func:`validated` reports, and a list's loader item by item."""

    def at(field: str) -> str:
        return f"{prefix}.{field}" if prefix and field else prefix + field

    if not isinstance(data, Mapping):
        return None, [Problem(prefix, "must be a mapping", ", ".join(model.model_fields))]
    known = list(model.model_fields)
    strict = model.model_config.get("extra") == "forbid"
    unknown = [k for k in data if k not in known] if strict else []
    found = [Problem(at(str(k)), f"unknown field{did_you_mean(str(k), known)}") for k in unknown]
    result: M | None = None
    try:
        result = model.model_validate({k: v for k, v in data.items() if k not in unknown}, context=context)
    except ValidationError as exc:
        found += [Problem(at(p.field), p.message, p.expected) for p in pydantic_problems(exc, model)]
    return (result if not found else None), found


def raise_problems(problems: Iterable[Problem], source: str | Path) -> None:
    """One :class:`InputErrors` naming ``source`` and every problem, when there is any."""
    found = list(problems)
    if found:
        raise InputErrors([InputError(p.message, source=source, field=p.field, expected=p.expected) for p in found])


def validated(
    model: type[M],
    data: Mapping[str, Any],
    source: str | Path,
    *,
    context: dict[str, Any] | None = None,
    problems: Iterable[Problem] = (),
) -> M:
    """``data`` validated against ``model``, or one :class:`InputErrors` naming ``source`` and every problem: the
    ``problems`` the caller found first, unknown top-level keys (with "did you mean"), then the model's own."""
    result, found = model_problems(model, data, context=context)
    raise_problems([*problems, *found], source)
    assert result is not None
    return result
