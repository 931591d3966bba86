"""Where things are: the template bundle, the config directory, the build workspace, the checkout.

The bundle (``packer/``, ``ansible/``, ``templates/``, ``cloud-init/``, ``config/``) sits at the top of a checkout;
a wheel carries a copy as ``imagebuilder/_bundle/`` (see setup.py). Every module finds it here, nowhere else.
"""

from __future__ import annotations

import os
from pathlib import Path

from imagebuilder.core.errors import InputError

_PACKAGE = Path(__file__).resolve().parents[1]  # the imagebuilder package (this is imagebuilder/core/paths.py)


def _bundle_root() -> Path:
    shipped = _PACKAGE / "_bundle"
    return shipped if shipped.is_dir() else _PACKAGE.parent


#: the folder holding packer/, ansible/, templates/, cloud-init/ and config/
BUNDLE = _bundle_root()


def checkout_root() -> Path | None:
    """The repository this package runs from, or None for an installed wheel (dev tasks need a checkout)."""
    root = _PACKAGE.parent
    return root if (root / "pyproject.toml").is_file() and (root / "tests").is_dir() else None


def require_checkout(task: str) -> Path:
    """The checkout, for the tasks that work on the repository itself (lint, test, docs)."""
    root = checkout_root()
    if root is None:
        raise InputError(f"'{task}' works on a checkout of the repository; this is an installed package")
    return root


def config_dir() -> Path:
    """The ``config/`` directory (``IMAGE_BUILDER_CONFIG_DIR`` overrides it)."""
    env = os.environ.get("IMAGE_BUILDER_CONFIG_DIR")
    return Path(env) if env else BUNDLE / "config"


def workspace_root() -> Path:
    """Where builds keep their temporary files: ``$IMAGE_BUILDER_WORKSPACE``, else
    ``$XDG_CACHE_HOME/image-builder/work`` (``~/.cache/...``).

    Each build gets a directory under it, removed when the build ends (kept with ``--keep-on-error``); anything
    the user wants to keep (e.g. the AMI ``manifest_output``) must live outside it.
    """
    env = os.environ.get("IMAGE_BUILDER_WORKSPACE")
    if env:
        return Path(env).expanduser()
    return cache_root() / "work"


def cache_root() -> Path:
    """This tool's folder under ``$XDG_CACHE_HOME`` (``~/.cache/image-builder``): work directories, and what is kept
    between runs because it is slow to make (a Kubernetes release built from source)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "image-builder"


def existing_parent(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists: where a folder not made yet will live (its filesystem)."""
    path = path.expanduser().absolute()
    while not path.exists():
        path = path.parent
    return path
