"""What the in-process tests (tests/unit/test_properties.py) and the integration tests
(tests/integration/test_properties.py) of properties share."""

from __future__ import annotations

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
