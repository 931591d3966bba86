"""Where builds keep their temporary files.

Each build gets a directory under the workspace root; it is removed when the build ends (kept with
``--keep-on-error``). Anything the user wants to keep (e.g. the AMI ``manifest_output``) must live outside it.
"""

from __future__ import annotations

import os
from pathlib import Path


def workspace_root() -> Path:
    """``$IMAGE_BUILDER_WORKSPACE``, else ``$XDG_CACHE_HOME/image-builder/work`` (``~/.cache/...``)."""
    env = os.environ.get("IMAGE_BUILDER_WORKSPACE")
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "image-builder" / "work"
