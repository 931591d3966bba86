"""The use cases: each user-facing flow assembled from the library's steps in one place, with the same gates in the
same order wherever it runs (the command line, the demo, a program of the user's own). A build is planned and
checked (``prepare_build``: the plan with Packer and its plugins checked before anything is fetched, the disk it
needs, and on a dry run the source image and the chroot engine), then gated and run (``run_build``: preflight, then
the build); a matrix is the same for many plans (``prepare_matrix``, ``run_matrix``); the demo is a flow of flows
(``run_demo``); vSphere templates are imported and customized (``import_templates``, ``customize_template``) with
every input checked before the session opens, and a local image is customized (``customize_image``) with every input
checked before its guest boots. A task whose work is more than one library step parses flags,
calls its flow and prints what it returns; a task that is one library call makes it directly (no flow of one step).
Each name below is loaded with its own flow only, so a task imports nothing of the others.

May import: ``core``, ``release``, ``attest``, ``publish``, ``customization``, ``image``, ``hardening``, ``vsphere``,
``plan``,
``providers``, ``builder``, ``host``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from imagebuilder.flows.build import PreparedBuild, prepare_build, run_build
    from imagebuilder.flows.images import ImageCustomization, customize_image
    from imagebuilder.flows.matrix import PreparedMatrix, emit_matrix, prepare_matrix, run_matrix
    from imagebuilder.flows.templates import TemplateRun, customize_template, import_templates

#: each public name and the module of the flow it belongs to: a task imports only the flow it runs
_WHERE = {
    "PreparedBuild": "build",
    "prepare_build": "build",
    "run_build": "build",
    "PreparedMatrix": "matrix",
    "emit_matrix": "matrix",
    "prepare_matrix": "matrix",
    "run_matrix": "matrix",
    "ImageCustomization": "images",
    "customize_image": "images",
    "TemplateRun": "templates",
    "customize_template": "templates",
    "import_templates": "templates",
}
__all__ = [
    "ImageCustomization",
    "PreparedBuild",
    "PreparedMatrix",
    "TemplateRun",
    "customize_image",
    "customize_template",
    "emit_matrix",
    "import_templates",
    "prepare_build",
    "prepare_matrix",
    "run_build",
    "run_matrix",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
