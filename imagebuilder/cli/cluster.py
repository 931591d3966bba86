"""``cluster.validate``: the vSphere fields of cluster specs (spec 2.5, 7.2), statically and against vCenter."""

from __future__ import annotations

from invoke.context import Context

from imagebuilder.cli import flags
from imagebuilder.cli._common import cli_task, task


@task(
    name="validate",
    help={
        "file": "cluster spec file (repeat -f for several clusters: endpoints and folders must not be shared)",
        "offline": "static checks only; do not connect to vCenter",
    },
    iterable=["file"],
)
@cli_task
def validate(c: Context, file: list[str] | None = None, offline: bool = False) -> None:
    """Check the vSphere fields of cluster specs (spec 2.5, 7.2): endpoint, thumbprint, pool, folder, template.

    Examples:
        image-builder cluster.validate --file cluster.yaml --offline
    """
    given = flags.required(file or [], "--file", "-f cluster.yaml (repeatable)")
    files = [str(flags.existing_file(f, "--file")) for f in given]
    from imagebuilder.vsphere.clusterspec import check_all_online, load_cluster_specs

    specs = load_cluster_specs(files)
    if offline:
        print(f"{len(specs)} cluster spec(s) pass the static checks (--offline: vCenter not contacted)")
        return
    for note in check_all_online(specs):
        print(f"note: {note}")
    print(f"{len(specs)} cluster spec(s) valid, checked against vCenter")
