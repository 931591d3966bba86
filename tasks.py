"""Invoke entry point (`invoke --list`). The tasks live in imagebuilder/cli/, one module per namespace;
`image-builder <task>` runs the same namespace."""

from imagebuilder.cli import namespace as ns
from imagebuilder.cli.program import exit_2_on_bad_flags

exit_2_on_bad_flags()

__all__ = ["ns"]
