"""``docs``: regenerate the parts of README.md that come from the code."""

from __future__ import annotations

from invoke.context import Context
from invoke.tasks import task

from imagebuilder.cli._common import cli_task


@task(
    help={
        "readme": "README file to update (default: the project's README.md)",
        "dry_run": "say whether the README would change; write nothing",
    },
    auto_shortflags=False,
)
@cli_task
def docs(c: Context, readme: str = "", dry_run: bool = False) -> None:
    """Regenerate the README's config reference from the config models."""
    from imagebuilder import paths
    from imagebuilder.cli import flags

    path = flags.existing_file(readme, "--readme") if readme else paths.require_checkout("docs") / "README.md"
    from imagebuilder.docs import update_readme

    if dry_run:
        print(f"{'would update' if update_readme(path, write=False) else 'up to date'}: {path}")
        return
    print(f"{'updated' if update_readme(path) else 'up to date'}: {path}")
