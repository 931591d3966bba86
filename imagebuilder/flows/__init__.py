"""The use cases: each user-facing flow assembled from the library's steps in one place, with the same gates in the
same order wherever it runs (the command line, the demo, a program of the user's own). A build is planned and
checked (``prepare_build``: the plan with Packer and its plugins checked before anything is fetched, the disk it
needs, and on a dry run the source image and the chroot engine), then gated and run (``run_build``: preflight, then
the build); a matrix is the same for many plans (``prepare_matrix``, ``run_matrix``); the demo is a flow of flows
(``run_demo``). The command line parses flags, calls a flow and prints what it returns.

May import: ``core``, ``release``, ``attest``, ``publish``, ``customization``, ``image``, ``vsphere``, ``providers``,
``build``, ``host``.
"""

from __future__ import annotations

from imagebuilder.flows.build import PreparedBuild, prepare_build, run_build
from imagebuilder.flows.matrix import PreparedMatrix, emit_matrix, prepare_matrix, run_matrix

__all__ = [
    "PreparedBuild",
    "PreparedMatrix",
    "emit_matrix",
    "prepare_build",
    "prepare_matrix",
    "run_build",
    "run_matrix",
]
