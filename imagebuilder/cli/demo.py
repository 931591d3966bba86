"""``demo``: the offline flow end to end (base image, mirror, bare-metal build, image.verify)."""

from __future__ import annotations

from invoke.context import Context
from invoke.tasks import task

from imagebuilder.cli import flags
from imagebuilder.cli._common import cli_task, status_line
from imagebuilder.cli.image import print_findings
from imagebuilder.errors import ExternalError


@task(
    help={
        "dest": "working directory for the base image, mirror and output (default ./demo)",
        "release_channel": "release channel to build (default 1-24)",
        "disk_gb": "image disk size in GiB (default 4: a demo image)",
        "no_boot": "skip the boot test of the built image",
        "skip_check": "preflight check to skip (repeatable)",
        "dry_run": "print the steps; do nothing",
        "engine": "auto (default: the fastest this host supports), chroot or packer",
    },
    iterable=["skip_check"],
    auto_shortflags=False,
)
@cli_task
def demo(
    c: Context,
    dest: str = "demo",
    release_channel: str = "1-24",
    disk_gb: str = "4",
    no_boot: bool = False,
    skip_check: list[str] | None = None,
    dry_run: bool = False,
    engine: str = "auto",
) -> None:
    """Run the offline flow end to end: base image, mirror, bare-metal build, image.verify."""
    from imagebuilder.catalog import load_catalog
    from imagebuilder.demo import demo_steps, run_demo

    out = flags.dest_dir(dest, "--dest")
    size = flags.integer(disk_gb, "--disk-gb", 4, 2048)
    load_catalog().channel(release_channel)
    flags.choice(engine, "--engine", ("auto", "chroot", "packer"))
    if dry_run:
        for step in demo_steps(out, channel=release_channel, disk_gb=size, boot=not no_boot, engine=engine):
            print(f"would run: {step}")
        return
    with status_line("demo") as status:
        result = run_demo(
            out,
            channel=release_channel,
            disk_gb=size,
            boot=not no_boot,
            skip_checks=tuple(skip_check or ()),
            engine=engine,
            say=print,
            status=status,
        )
    print_findings(result.findings)
    bad = [f.name for f in result.findings if not f.ok]
    if bad:
        raise ExternalError(f"the demo image failed verification: {', '.join(bad)}")
    print(f"\ndemo image: {result.build.artifact}\nmanifest:   {result.build.manifest}")
