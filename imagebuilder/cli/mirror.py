"""``mirror.create``: an air-gap mirror of a release (spec 8: everything works from a local mirror)."""

from __future__ import annotations

from pathlib import Path

from invoke.context import Context
from invoke.tasks import task
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from imagebuilder.cli._common import cli_task
from imagebuilder.errors import InputError
from imagebuilder.mirror import Mirror, create_mirror
from imagebuilder.model import load_catalog


@task(
    help={
        "release_channel": "channel whose release manifest to mirror: 1-21 .. 1-24",
        "dest": "mirror directory (created; upstream URL paths are kept)",
        "release_manifest": "mirror this manifest (URL) instead of the channel's",
        "source": "read from this mirror (directory or URL) instead of upstream",
    },
    auto_shortflags=False,
)
@cli_task
def create(c: Context, release_channel: str = "", dest: str = "", release_manifest: str = "", source: str = "") -> None:
    """Download a release manifest and every node artifact it names, checksum-verified, keeping URL paths."""
    if not release_channel or not dest:
        raise InputError("required flags missing", field="--release-channel, --dest")
    channel = load_catalog().channel(release_channel)
    url = release_manifest or channel.manifest_url
    src = Mirror.parse(source, "--source") if source else None
    with Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), transient=True
    ) as progress:
        bar = progress.add_task("mirroring", total=None)
        manifest, items = create_mirror(
            url,
            Path(dest),
            source=src,
            on_item=lambda u, _: progress.update(bar, description=u.rsplit("/", 1)[-1][:40]),
            on_bytes=lambda n: progress.advance(bar, n),
        )
    for item in items:
        print(f"{item.status:<10} {item.size:>12} {item.path}")
    fetched = sum(1 for i in items if i.status == "downloaded")
    print(f"mirror of {manifest.name} in {dest}: {len(items)} artifacts ({fetched} downloaded, all sha256-verified)")
    print(f"use it: image-builder build ... --mirror {dest}")
