"""The task namespace shared by ``invoke`` (through tasks.py) and the ``image-builder`` program.

One module per namespace; each task parses flags, calls the library and prints.
"""

from __future__ import annotations

from invoke.collection import Collection

from imagebuilder.cli import build as _build
from imagebuilder.cli import config as _config


def make_namespace() -> Collection:
    ns = Collection()
    ns.add_task(_build.build)
    ns.add_collection(Collection.from_module(_config, name="config"))
    return ns


namespace = make_namespace()
