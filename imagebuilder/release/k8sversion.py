"""Kubernetes release versions as the source-release recipe takes them (``--kubernetes``); light, so a task checks
the flag before it imports the recipe."""

from __future__ import annotations

import re

from imagebuilder.core.errors import InputError

#: the oldest line this recipe knows (the staging modules are published at v0.<minor>.<patch> since long before)
OLDEST_MINOR = 28

_VERSION = re.compile(r"v1\.([0-9]{1,4})\.([0-9]{1,6})")  # ASCII digits, bounded


def parse_version(value: str, flag: str = "--kubernetes") -> tuple[str, int, int]:
    """``v1.34.2`` (or ``1.34.2``) -> (``v1.34.2``, 34, 2); exit 2 for anything else."""
    text = value.strip()
    m = _VERSION.fullmatch(text if text.startswith("v") else f"v{text}")
    if m is None:
        raise InputError(f"{value[:40]!r} is not a Kubernetes release", field=flag, expected="v1.<minor>.<patch>")
    minor, patch = int(m.group(1)), int(m.group(2))
    if minor < OLDEST_MINOR:
        raise InputError(f"v1.{minor} is older than this recipe builds", field=flag,
                         expected=f"v1.{OLDEST_MINOR}.0 or newer")  # fmt: skip
    return m.group(0), minor, patch
