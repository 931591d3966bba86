"""``cloudstack.*``: after a CloudStack build, its qcow2 registered as a template (spec 1.7)."""

from __future__ import annotations

from invoke.context import Context

from imagebuilder.cli import flags
from imagebuilder.cli._common import cli_task, status_line, task


@task(
    help={
        "url": "where CloudStack downloads the image from (http/https: 'serve' or any web server)",
        "name": "the template's name (idempotent: a template of this name in the zone is not registered again)",
        "zone": "the zone's name, as CloudStack lists it",
        "os_type": "the OS type's description, as CloudStack lists it (e.g. 'Red Hat Enterprise Linux 8.0 (64-bit)')",
        "format": "QCOW2 (default, the CloudStack build's output) or RAW",
        "dry_run": "look up the zone, the OS type and an existing template; register nothing",
    },
)
@cli_task
def template_register(
    c: Context,
    url: str = "",
    name: str = "",
    zone: str = "",
    os_type: str = "",
    format: str = "QCOW2",
    dry_run: bool = False,
) -> None:
    """Register a built image as a CloudStack template and wait until it is Ready; API credentials from
    CLOUDSTACK_ENDPOINT, CLOUDSTACK_KEY and CLOUDSTACK_SECRET.

    Examples:
        image-builder cloudstack.template-register --url http://images.internal/ubuntu.qcow2 \
            --name ubuntu-{=newest_channel} --zone zone1 --os-type 'Ubuntu 22.04 LTS' --dry-run
    """
    from imagebuilder.providers.cloudstack.template_register import FORMATS, TemplateRequest, name_of, register_template

    def named(value: str, flag: str, what: str) -> str:
        return flags.grammar_of(lambda v: name_of(v, what), flags.required(value, flag, f"a {what} name"), flag)

    flags.url(flags.required(url, "--url", "the image's URL"), "--url", ("http", "https"))
    request = TemplateRequest(
        url=url,
        name=named(name, "--name", "template"),
        zone=named(zone, "--zone", "zone"),
        os_type=named(os_type, "--os-type", "OS type"),
        format=flags.choice(format.upper(), "--format", FORMATS),
    )
    with status_line(f"registering {request.name}") as say:
        result = register_template(request, dry_run=dry_run, say=say)
    print(f"zone:     {request.zone} ({result.zone_id})\nos type:  {request.os_type} ({result.os_type_id})")
    what = "registered" if result.created else ("already there" if result.template_id else "would register")
    print(f"template: {request.name} ({result.template_id or '-'}): {what}, {result.status}")
