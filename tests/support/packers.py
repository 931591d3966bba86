"""The modern Packers (1.9.4, 1.16.0) and their plugins, as ../shared/tools/build-packer.sh builds them from the
release sources (``.ci/run`` does, into ~/.cache/packer-from-source), and the plugin floors that
scripts/build_plugin_floors.py builds from the Go module proxy. A test that needs them skips on a developer's
machine without them, and fails in CI (``CI=true``), where they must be there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

MODERN = ("1.9.4", "1.16.0")
#: where .ci/run builds them (overridable: IMAGE_BUILDER_PACKERS, IMAGE_BUILDER_PLUGIN_FLOORS)
PACKERS = Path(os.environ.get("IMAGE_BUILDER_PACKERS", Path.home() / ".cache/packer-from-source"))
FLOORS = Path(os.environ.get("IMAGE_BUILDER_PLUGIN_FLOORS", Path.home() / ".cache/image-builder/packer-plugin-floors"))


def _need(path: Path, what: str) -> Path:
    if path.exists():
        return path
    message = f"{what} is missing at {path}: run .ci/run's step (scripts/modern-packers.sh)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def packer(version: str) -> Path:
    """The path of Packer ``version`` built from its release source."""
    return _need(PACKERS / "bin" / f"packer-{version}", f"Packer {version}")


def newest_plugins() -> Path:
    """The folder of the newest plugins (the releases in ../shared/packer-src), as --packer-plugins takes it."""
    return _need(PACKERS / "plugins" / "packer-plugin-ansible", "the newest Packer plugins").parent


def floor_plugins() -> Path:
    """The folder of the plugins at the versions the templates' required_plugins floors name."""
    return _need(FLOORS / "packer-plugin-ansible", "the floor Packer plugins").parent
