"""What the in-process tests (tests/unit/test_properties.py) and the integration tests
(tests/integration/test_properties.py) of properties share."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, event, settings

from imagebuilder.core.errors import InputError
from imagebuilder.host.dhcp import DhcpConfig, Pool, resolve

SLOW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def mutate(doc: object, path: list[int], replacement: object) -> object:
    """``doc`` with the node chosen by ``path`` (indices into each level's children) replaced."""
    if not path:
        return replacement
    if isinstance(doc, dict) and doc:
        keys = list(doc)
        key = keys[path[0] % len(keys)]
        return {**doc, key: mutate(doc[key], path[1:], replacement)}
    if isinstance(doc, list) and doc:
        i = path[0] % len(doc)
        return [*doc[:i], mutate(doc[i], path[1:], replacement), *doc[i + 1 :]]
    return replacement


def accepted(data: dict[str, object]) -> Pool | None:
    """The pool of a drawn config, or None when the config is refused (exit 2 at the CLI, nothing rendered)."""
    try:
        pool = resolve(DhcpConfig.model_validate(data))
    except (InputError, ValueError):
        event("refused")
        return None
    event("accepted")
    return pool


#: the branches each property reached in its run (:func:`reaches`), by property
_TALLY: dict[str, Counter[str]] = {}
_CURRENT: list[str] = []


def branch(name: str) -> None:
    """Record that the running property reached ``name`` (``positive``: its accepted input's assertions; anything
    else: a refusal), as a Hypothesis event too (shown by ``--hypothesis-show-statistics``)."""
    event(name)
    if _CURRENT:
        _TALLY[_CURRENT[-1]][name] += 1


def reaches(share: float = 0.5) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Around a ``@given`` property (above its ``@settings``, which must stay on the ``@given``): after all its
    examples, fail unless its positive branch (``branch("positive")``) was reached in at least ``share`` of them. A
    property whose strategy draws input its parser refuses almost always checks almost nothing; this makes that a
    failure, not a pass."""

    def wrap(test: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(test)
        def run(*args: Any, **kwargs: Any) -> None:
            name = f"{test.__module__}.{test.__qualname__}"
            _TALLY[name] = Counter()
            _CURRENT.append(name)
            try:
                test(*args, **kwargs)
            finally:
                _CURRENT.pop()
            tally = _TALLY.pop(name)
            total = sum(tally.values())
            assert total and tally["positive"] >= share * total, (
                f"the property reached its positive branch in {tally['positive']} of {total} examples ({dict(tally)}),"
                f" under {share:.0%}: its strategy must draw what the parser accepts"
            )

        return run

    return wrap
