"""The one problem report, exactly (issue 63): what :mod:`imagebuilder.core.validation` says for each kind of
mistake a file can hold, at every depth of a model: the field as the user writes it, the message, and what the field
expects.

Mutation testing found the report's "expected" half untested: a missing field's description, a literal's choices, a
validator's own expectation or a nested "did you mean" could all be dropped and the suite passed. Each case here
compares whole :class:`Problem` rows."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import Field, ValidationInfo, field_validator

from imagebuilder.core.errors import InputError, InputErrors
from imagebuilder.core.validation import FieldProblem, ForeignModel, Problem, StrictModel, model_problems, validated


class Inner(StrictModel):
    name: str = Field(min_length=1, description="the inner's name")
    mode: Literal["fast", "safe"] = "safe"
    on: bool = Field(False, description="true or false")
    size: int = Field(1, description="its size")
    code: str = Field("ab", min_length=2, description="two letters at least")

    @field_validator("size")
    @classmethod
    def _size(cls, value: int, info: ValidationInfo) -> int:
        limit = (info.context or {}).get("limit", 10)
        if value > limit:
            raise FieldProblem(f"{value} is over {limit}", f"1 to {limit}")
        if value < 0:
            raise ValueError("negative")
        return value


class Other(StrictModel):
    label: str = Field(description="the other's label")


class Outer(StrictModel):
    title: str = Field(description="the outer's title")
    inner: Inner
    items: list[Inner] = Field(default_factory=list)
    by_key: dict[str, Inner] = Field(default_factory=dict)
    maybe: Inner | None = None
    choice: Inner | Other | None = None


class Foreign(ForeignModel):
    kind: str = Field(description="the document's kind")


MISSING = "required field is missing"
CASES = [
    ({}, [Problem("title", MISSING, "the outer's title"), Problem("inner", MISSING, None)]),
    (
        {"title": "t", "inner": {"name": "n"}, "colour": 1, "titel": 2},
        [Problem("colour", "unknown field"), Problem("titel", "unknown field; did you mean 'title'?")],
    ),
    (
        {"title": "t", "inner": {"name": "", "mode": "quick", "on": "perhaps", "size": 11, "nmae": 1}},
        [
            Problem("inner.name", MISSING, "the inner's name"),
            Problem("inner.mode", "got 'quick'", "'fast' or 'safe'"),
            Problem("inner.on", "got 'perhaps'", "true or false"),
            Problem("inner.size", "11 is over 10", "1 to 10"),
            Problem("inner.nmae", "unknown field; did you mean 'name'?"),
        ],
    ),
    (
        {"title": "t", "inner": {"name": "n"}, "items": [{"name": "a"}, {"nam": "b"}], "by_key": {"k": {"on": 3}}},
        [
            Problem("items[1].name", MISSING, "the inner's name"),
            Problem("items[1].nam", "unknown field; did you mean 'name'?"),
            Problem("by_key.k.name", MISSING, "the inner's name"),
            Problem("by_key.k.on", "got 3", "true or false"),
        ],
    ),
    (
        # an optional model (one model or None) is known at its depth; a union of two models is not: no guess
        {"title": "t", "inner": {"name": "n"}, "maybe": {"naem": "x"}, "choice": {"lable": "y"}},
        [
            Problem("maybe.name", MISSING, "the inner's name"),
            Problem("maybe.naem", "unknown field; did you mean 'name'?"),
            Problem("choice.Inner.name", MISSING),
            Problem("choice.Inner.lable", "unknown field"),
            Problem("choice.Other.label", MISSING),
            Problem("choice.Other.lable", "unknown field"),
        ],
    ),
    ({"title": "t", "inner": {"name": "n", "size": -1}}, [Problem("inner.size", "negative")]),
    (
        # too short, but not empty: pydantic's words; a value of no boolean type: what it was
        {"title": "t", "inner": {"name": "n", "code": "a", "on": [1]}},
        [
            Problem("inner.on", "got [1]", "true or false"),
            Problem("inner.code", "String should have at least 2 characters", "two letters at least"),
        ],
    ),
    (
        {"title": 5, "inner": "x", "items": "no"},
        [
            Problem("title", "must be a string"),
            Problem("inner", "Input should be a valid dictionary or instance of Inner"),
            Problem("items", "must be a list"),
        ],
    ),
    ("not a mapping", [Problem("", "must be a mapping", "title, inner, items, by_key, maybe, choice")]),
]


@pytest.mark.parametrize(("data", "expected"), CASES, ids=[str(i) for i in range(len(CASES))])
def test_each_mistake_is_one_whole_problem(data: object, expected: list[Problem]) -> None:
    result, problems = model_problems(Outer, data)
    assert problems == expected
    assert result is None


def test_a_list_item_s_problems_are_under_its_prefix_and_the_context_reaches_the_validators() -> None:
    good = {"title": "t", "inner": {"name": "n", "size": 6}}
    assert model_problems(Outer, good, prefix="[3]", context={"limit": 5}) == (
        None,
        [Problem("[3].inner.size", "6 is over 5", "1 to 5")],
    )
    assert model_problems(Outer, {**good, "x": 1}, prefix="[3]") == (None, [Problem("[3].x", "unknown field")])
    assert model_problems(Outer, "x", prefix="[3]")[1] == [Problem("[3]", "must be a mapping", "title, inner, "
                                                                   "items, by_key, maybe, choice")]  # fmt: skip
    result, problems = model_problems(Outer, good)
    assert problems == [] and result is not None and result.inner.size == 6


def test_an_empty_optional_value_is_unset_and_an_empty_required_one_is_missing() -> None:
    result, problems = model_problems(Outer, {"title": "t", "inner": {"name": "n", "mode": " "}})
    assert problems == [] and result is not None and result.inner.mode == "safe"
    assert model_problems(Inner, {"name": ""})[1] == [Problem("name", MISSING, "the inner's name")]


def test_a_foreign_document_s_other_fields_are_left_alone() -> None:
    result, problems = model_problems(Foreign, {"kind": "Cluster", "spec": {"anything": 1}})
    assert problems == [] and result is not None and result.kind == "Cluster"
    assert model_problems(Foreign, {})[1] == [Problem("kind", MISSING, "the document's kind")]


def test_validated_raises_every_problem_naming_the_file_after_the_caller_s_own() -> None:
    first = Problem("spec", "the caller's own check", "what it wants")
    with pytest.raises(InputErrors) as raised:
        validated(Outer, {"inner": {"name": "n", "size": 6}}, "f.yaml", context={"limit": 5}, problems=[first])
    rows = [(e.field, e.detail, e.expected, str(e.source)) for e in raised.value.errors]
    assert rows == [
        ("spec", "the caller's own check", "what it wants", "f.yaml"),
        ("title", MISSING, "the outer's title", "f.yaml"),
        ("inner.size", "6 is over 5", "1 to 5", "f.yaml"),
    ]
    assert validated(Outer, {"title": "t", "inner": {"name": "n"}}, "f.yaml").title == "t"


def test_a_library_check_s_error_becomes_a_validator_s_problem() -> None:
    problem = FieldProblem.of(InputError("is not a version", field="--x", expected="vX.Y.Z"))
    assert (problem.message, problem.expected, str(problem)) == ("is not a version", "vX.Y.Z", "is not a version")
