"""``template.*``: vSphere templates (spec 2.6, 3, 4.6, 7.1): import OVAs as tagged templates, tag a self-built
template, validate a template's tags."""

from __future__ import annotations

from typing import TYPE_CHECKING

from invoke.context import Context

from imagebuilder.cli import _vsphere, flags
from imagebuilder.cli._common import cli_task, status_line, task, transfer_bars
from imagebuilder.core.errors import ExternalError, InputError

if TYPE_CHECKING:
    from imagebuilder.core.progress import Say
    from imagebuilder.flows.templates import TemplateRun


@task(
    flag_aliases={"release_channel": ("kubernetes",)},
    name="import",
    help={
        "ova": "the OVA: a local path (uploaded with progress) or an http(s) URL (vCenter pulls it)",
        "os": _vsphere.OS_HELP,
        "release_channel": _vsphere.KUBE_HELP,
        "from_file": "import several templates in one session: a YAML list of {ova, os, kubernetes[, name]}",
        "name": "template name (default: <os>-kubernetes-<maj>-<min>-<distro>-<n>, e.g. {=template_name_example})",
        "library": "content library (default from the profile; created, datastore backed, when missing)",
        "folder": "VM folder /<dc>/vm/<path> for the template (default /<dc>/vm/Templates; created when missing)",
        "datastore": "/<dc>/datastore/<name> (default: the datacenter's only datastore)",
        "resource_pool": "/<dc>/host/<cluster>[/Resources/<pool>] (default: the datacenter's only cluster)",
        "datacenter": "datacenter (default: from the paths above, or the only one)",
        "snapshot": "take snapshot 'root' (default; --no-snapshot skips it and keeps disk sizes customisable)",
        "jobs": "templates imported at the same time with --from-file (default 4)",
        "dry_run": "print the steps; change nothing",
        **_vsphere.CONNECTION_HELP,
    },
)
@cli_task
def import_ova(
    c: Context,
    ova: str = "",
    os: str = "",
    release_channel: str = "",
    from_file: str = "",
    name: str = "",
    library: str = "",
    folder: str = "",
    datastore: str = "",
    resource_pool: str = "",
    datacenter: str = "",
    snapshot: bool = True,
    jobs: int = 4,
    dry_run: bool = False,
    server: str = "",
    insecure: str | bool | None = None,
    thumbprint: str = "",
) -> None:
    """Import OVAs as tagged templates: library, deploy (thin, off), OS-1 disk resize, snapshot, template, tags.

    Examples:
        image-builder template.import --ova ubuntu.ova --os ubuntu --release-channel {=newest_channel} --dry-run
    """
    if not from_file:  # the flags first: a mistyped one is answered before the vSphere modules load
        flags.url_or_file(flags.required(ova, "--ova", "a local OVA path or an http(s) URL"), "--ova")
        _vsphere.os_channel(os, release_channel)
    tgt = _vsphere.target(server, insecure, thumbprint)
    from imagebuilder import flows
    from imagebuilder.vsphere.templates import ImportEntry, Placement, check_name, load_import_list

    if from_file:
        if ova or os or release_channel or name:
            raise InputError(
                "--from-file names the templates itself",
                field="--from-file",
                expected="either --from-file, or --ova/--os/--release-channel[/--name]",
            )
        entries = load_import_list(from_file)
    else:
        flags.url_or_file(flags.required(ova, "--ova", "a local OVA path or an http(s) URL"), "--ova")
        os_, channel = _vsphere.os_channel(os, release_channel)
        entries = [ImportEntry(ova, os_, channel, check_name(name) if name else None)]
    with transfer_bars() as transfers:
        where = Placement(library or None, folder or None, datastore or None, resource_pool or None,
                          datacenter or None, snapshot)  # fmt: skip
        run = flows.import_templates(tgt, entries, where, jobs=jobs, dry_run=dry_run, transfers=transfers)
    if dry_run:
        print_plan(run)
        return
    warned: set[str] = set()
    for out in run.outcomes:
        _vsphere.report(out.path, out.done, out.kept, [w for w in out.warnings if w not in warned])
        warned.update(out.warnings)
    total, soap, rest = run.calls
    print(f"vCenter API calls: {total} ({soap} SOAP, {rest} REST) for {len(entries)} template(s)")


def print_plan(run: TemplateRun) -> None:
    for path, steps in run.plan:
        print(f"template {path}:")
        for step in steps:
            print(f"  {step}")


@task(
    flag_aliases={"release_channel": ("kubernetes",)},
    help={**_vsphere.TEMPLATE_HELP, "dry_run": "print the tags; change nothing"},
)
@cli_task
def tag(
    c: Context,
    template: str = "",
    os: str = "",
    release_channel: str = "",
    dry_run: bool = False,
    server: str = "",
    insecure: str | bool | None = None,
    thumbprint: str = "",
) -> None:
    """Attach the OS and distro-release tags (categories created when missing) to a self-built template (spec 2.6).

    Examples:
        image-builder template.tag --template /DC0/vm/ubuntu --os ubuntu --release-channel {=newest_channel} --dry-run
    """
    os_, channel = _vsphere.template_args(template, os, release_channel)
    tgt = None if dry_run else _vsphere.target(server, insecure, thumbprint)
    from imagebuilder.vsphere.session import connect
    from imagebuilder.vsphere.tags import expected_tags
    from imagebuilder.vsphere.templates import tag_template

    if dry_run:
        for t in expected_tags(os_, channel):
            print(f"would tag {template} with {t.name} (category {t.category})")
        return
    assert tgt is not None
    with connect(tgt, f"tagging {template}") as vs:
        out = tag_template(vs, template, os_, channel)
    _vsphere.report(out.path, out.done, out.kept, out.warnings)


@task(flag_aliases={"release_channel": ("kubernetes",)}, help=_vsphere.TEMPLATE_HELP)
@cli_task
def validate(
    c: Context,
    template: str = "",
    os: str = "",
    release_channel: str = "",
    server: str = "",
    insecure: str | bool | None = None,
    thumbprint: str = "",
) -> None:
    """Check that a template carries exactly the two tags the product expects (spec 7.1); exit 1 naming the fix.

    Examples:
        image-builder template.validate --template /DC0/vm/ubuntu --os ubuntu --release-channel {=newest_channel}
    """
    os_, channel = _vsphere.template_args(template, os, release_channel)
    tgt = _vsphere.target(server, insecure, thumbprint)
    from imagebuilder.vsphere.session import connect
    from imagebuilder.vsphere.templates import fix_command, validate_template

    with connect(tgt, f"validating {template}") as vs:
        problems = validate_template(vs, template, os_, channel)
    if problems:
        raise ExternalError(
            f"template {template} is not valid:\n  " + "\n  ".join(problems),
            hint=fix_command(template, os_, channel),
        )
    print(f"template {template}: valid for {os_.name} on Kubernetes {channel.minor}")


@task(
    flag_aliases={"release_channel": ("kubernetes",), "customize": ("file", "f")},
    help={
        "template": "the imported OS-2/OS-3 template to start from: /<dc>/vm/<folder>/<name>",
        "customize": "customize.yaml (spec 4.8): user, CA certificates, registry credentials, extra packages",
        "name": "name of the customized template, beside the source (default: <source name>-custom)",
        "os": "the template's OS family: {=built_os_names}",
        "release_channel": _vsphere.KUBE_HELP,
        "resource_pool": "/<dc>/host/<cluster>[/Resources/<pool>] for the clone (default: the only cluster)",
        "snapshot": "take snapshot 'root' (default; --no-snapshot keeps disk sizes customisable)",
        "keep_user": "keep the customization user and its key in the template (a way into every clone: warned)",
        "keep_on_error": "keep the half-made VM when a step fails (default: it is removed)",
        "force": "replace an existing template of that name (default: it is left alone)",
        "timeout": "seconds to wait for the VM's IP and login (default 1800)",
        "dry_run": "check the file, the template and the target; print the steps; change nothing",
        **_vsphere.CONNECTION_HELP,
    },
)
@cli_task
def customize(
    c: Context,
    template: str = "",
    customize: str = "",
    name: str = "",
    os: str = "",
    release_channel: str = "",
    resource_pool: str = "",
    snapshot: bool = True,
    keep_user: bool = False,
    keep_on_error: bool = False,
    force: bool = False,
    timeout: str = "1800",
    dry_run: bool = False,
    server: str = "",
    insecure: str | bool | None = None,
    thumbprint: str = "",
) -> None:
    """Customize a template (spec 4.8): clone, cloud-init via guestinfo, SSH + the customize role, clean up, seal,
    snapshot, template, tags; the user, its key and the user data do not stay in the template.

    Examples:
        image-builder template.customize --template /DC0/vm/ubuntu --customize customize.yaml --os ubuntu \
            --release-channel {=newest_channel} --dry-run
    """
    os_, channel = _vsphere.template_args(template, os, release_channel)
    customize_file = flags.existing_file(
        flags.required(customize, "-f/--customize", "customize.yaml"), "-f/--customize"
    )
    seconds = flags.duration(timeout, "--timeout", 30, 86400)
    tgt = _vsphere.target(server, insecure, thumbprint)
    from imagebuilder import flows
    from imagebuilder.vsphere.apply_customization import CustomizeOptions

    options = CustomizeOptions(name or None, resource_pool or None, snapshot, keep_user, keep_on_error, force, seconds)

    def run(say: Say) -> TemplateRun:
        return flows.customize_template(tgt, template, os_, channel, customize_file, options, dry_run=dry_run, say=say)

    if dry_run:
        print_plan(run(print))
        return
    with status_line(f"customizing {template}") as say:
        (out,) = run(say).outcomes
    _vsphere.report(out.path, out.done, out.kept, out.warnings)
