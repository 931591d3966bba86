"""``docs``: regenerate the parts of ``docs/`` that come from the code."""

from __future__ import annotations

from invoke.context import Context

from imagebuilder.cli._common import cli_task, task


@task(
    help={
        "dir": "the documentation folder to update (default: the checkout's docs/)",
        "dry_run": "say which pages would change; write nothing",
    },
)
@cli_task
def docs(c: Context, dir: str = "", dry_run: bool = False) -> None:
    """Regenerate the generated sections of docs/: the config reference from the models, the module table from the
    module docstrings, the names and flag names from the catalog and the tasks.

    Examples:
        image-builder docs --dry-run
    """
    from imagebuilder.cli import flags
    from imagebuilder.core import paths

    folder = flags.existing_dir(dir, "--dir") if dir else paths.require_checkout("docs") / "docs"
    from imagebuilder.cli._help import CLI_SECTIONS
    from imagebuilder.docs import update_docs

    changed = update_docs(folder, write=not dry_run, extra=tuple(CLI_SECTIONS))
    if not changed:
        print(f"up to date: {folder}")
    for page in changed:
        print(f"{'would update' if dry_run else 'updated'}: {page}")
