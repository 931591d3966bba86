"""``vsphere.*``, ``template.*``, ``cluster.*``: vSphere preparation (spec 2.4-2.7, 3, 4.6, 4.7, 7).

Credentials are read from the environment only (spec 5): ``<PREFIX>_VSPHERE_USERNAME``/``_PASSWORD`` (the prefix
comes from the profile) or ``GOVC_USERNAME``/``GOVC_PASSWORD`` (and ``GOVC_URL``, ``GOVC_INSECURE`` for the server).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from invoke.context import Context
from invoke.tasks import task

from imagebuilder.cli import flags
from imagebuilder.cli._common import byte_progress, cli_task
from imagebuilder.errors import ExternalError, InputError

if TYPE_CHECKING:
    from imagebuilder.model import OperatingSystem, ReleaseChannel
    from imagebuilder.vsphere.connection import Target
    from imagebuilder.vsphere.session import VSphere

CONNECTION_HELP = {
    "server": "vCenter host, IP or URL (default: GOVC_URL)",
    "insecure": "do not verify the vCenter certificate (default: GOVC_INSECURE)",
    "thumbprint": "trust a self-signed vCenter certificate with this SHA1 thumbprint (see vsphere.thumbprint)",
}
OS_HELP = "bottlerocket|ubuntu (or os1|os2): the template's OS family"
KUBE_HELP = "Kubernetes minor version of the template: 1.21, 1.22, 1.23 or 1.24"
TEMPLATE_HELP = {
    "template": "inventory path of the template: /<dc>/vm/<folder>/<name>",
    "os": OS_HELP,
    "kubernetes": KUBE_HELP,
    **CONNECTION_HELP,
}


@contextmanager
def connected(target: Target, what: str) -> Iterator[VSphere]:
    from imagebuilder.vsphere.connection import credentials_from_env, external_errors
    from imagebuilder.vsphere.session import VSphere

    credentials = credentials_from_env()
    with external_errors(what), VSphere(target, credentials) as vs:
        yield vs


def _target(server: str, insecure: bool | None, thumbprint: str) -> Target:
    from imagebuilder.vsphere.connection import target_from

    return target_from(server or None, insecure, thumbprint or None, os.environ)


def _target_of(server: str, insecure: bool, thumbprint: str | None) -> Target:
    """A target named by a file (user.yaml, a cluster spec): the environment does not override it."""
    from imagebuilder.vsphere.connection import target_from

    return target_from(server, insecure, thumbprint, {})


def read_secret(value: str, flag: str) -> str:
    """``-`` reads stdin, ``@FILE`` a file, ``env:VAR`` a variable; anything else is the secret itself (and is
    visible in the process list, so a warning says so)."""
    if value == "-":
        secret = sys.stdin.readline().rstrip("\n")
    elif value.startswith("@"):
        try:
            secret = Path(value[1:]).read_text().rstrip("\n")
        except OSError as exc:
            raise InputError(f"cannot read {value[1:]}: {exc.strerror}", field=flag) from None
    elif value.startswith("env:"):
        secret = os.environ.get(value[4:], "")
        if not secret:
            raise InputError(f"environment variable {value[4:]} is empty or unset", field=flag)
    else:
        print(
            f"warning: a secret given on the command line is visible to other users in the process list; "
            f"prefer {flag} @FILE, {flag} - (stdin) or {flag} env:VAR",
            file=sys.stderr,
        )
        secret = value
    if not secret:
        raise InputError("the password is empty", field=flag)
    return secret


# -- vsphere.* ---------------------------------------------------------------------------------------------------


@task(
    help={
        "file": "user.yaml (spec 2.4): the user, group, roles and the objects they get rights on",
        "password": "password of the new user: -, @FILE or env:VAR (a literal value works but shows in ps)",
        "force": "the user exists: overwrite the group's permissions and reset role privileges to the lists",
        "dry_run": "print the diff between vCenter and user.yaml; change nothing",
        "thumbprint": CONNECTION_HELP["thumbprint"],
    },
    auto_shortflags=True,
)
@cli_task
def setup_user(
    c: Context, file: str = "", password: str = "", force: bool = False, dry_run: bool = False, thumbprint: str = ""
) -> None:
    """Create the SSO user, group, three roles and their permissions from user.yaml (spec 2.4, 4.6, 4.7)."""
    from imagebuilder.vsphere.access import apply, global_permission_step, plan_setup_user
    from imagebuilder.vsphere.userconfig import load_user_config

    cfg = load_user_config(flags.existing_file(flags.required(file, "--file", "-f user.yaml"), "--file"))
    if bool(password) == bool(force):
        raise InputError(
            "give exactly one of --password and --force",
            field="--password/--force",
            expected="--password to create the user, or --force to update an existing setup (mutually exclusive)",
        )
    secret = read_secret(password, "--password") if password else None
    target = _target_of(cfg.server, cfg.insecure, thumbprint or None)
    with connected(target, f"setting up {cfg.username}@{cfg.domain} on {target.server}") as vs:
        plan = plan_setup_user(vs, cfg, secret, force)
        for note in plan.notes:
            print(f"note: {note}")
        for step in plan.steps:
            print(step)
        if dry_run:
            print(f"dry run: {len(plan.changes)} change(s) not made")
            return
        apply(plan)
    print(f"{len(plan.changes)} change(s) made")
    print(global_permission_step(cfg))


@task(
    help={"server": "vCenter host, IP or URL (host:port for another port)"},
    auto_shortflags=False,
)
@cli_task
def thumbprint(c: Context, server: str = "") -> None:
    """Print the SHA1 thumbprint of the vCenter certificate, as the cluster spec's thumbprint field wants it."""
    target = _target(server, True, "")
    from imagebuilder.vsphere.connection import server_thumbprint

    print(server_thumbprint(target))


# -- template.* --------------------------------------------------------------------------------------------------


def _template_args(template: str, os_name: str, kubernetes: str) -> tuple[OperatingSystem, ReleaseChannel]:
    if not template:
        raise InputError("required flag missing", field="--template", expected="/<dc>/vm/<folder>/<name>")
    return _os_channel(os_name, kubernetes)


def _os_channel(os_name: str, kubernetes: str) -> tuple[OperatingSystem, ReleaseChannel]:
    from imagebuilder.model import load_catalog

    catalog = load_catalog()
    if not os_name:
        raise InputError("required flag missing", field="--os", expected=OS_HELP)
    if not kubernetes:
        raise InputError("required flag missing", field="--kubernetes", expected=KUBE_HELP)
    return catalog.os(os_name), catalog.channel_for_kubernetes(kubernetes)


@task(
    help={
        "ova": "the OVA: a local path (uploaded with progress) or an http(s) URL (vCenter pulls it)",
        "os": OS_HELP,
        "kubernetes": KUBE_HELP,
        "from_file": "import several templates in one session: a YAML list of {ova, os, kubernetes[, name]}",
        "name": "template name (default: <os>-kubernetes-<maj>-<min>-<distro>-<n>, e.g. ubuntu-kubernetes-1-24-eks-5)",
        "library": "content library (default from the profile; created, datastore backed, when missing)",
        "folder": "VM folder /<dc>/vm/<path> for the template (default /<dc>/vm/Templates; created when missing)",
        "datastore": "/<dc>/datastore/<name> (default: the datacenter's only datastore)",
        "resource_pool": "/<dc>/host/<cluster>[/Resources/<pool>] (default: the datacenter's only cluster)",
        "datacenter": "datacenter (default: from the paths above, or the only one)",
        "snapshot": "take snapshot 'root' (default; --no-snapshot skips it and keeps disk sizes customisable)",
        "jobs": "templates imported at the same time with --from-file (default 4)",
        "dry_run": "print the steps; change nothing",
        **CONNECTION_HELP,
    },
    auto_shortflags=False,
)
@cli_task
def import_ova(
    c: Context,
    ova: str = "",
    os: str = "",
    kubernetes: str = "",
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
    insecure: bool | None = None,
    thumbprint: str = "",
) -> None:
    """Import OVAs as tagged templates: library, deploy (thin, off), OS-1 disk resize, snapshot, template, tags."""
    from imagebuilder.ova import check_ova
    from imagebuilder.vsphere.templates import (
        ImportEntry,
        check_name,
        default_name,
        import_templates,
        load_import_list,
        plan_text,
        resolve_request,
    )

    if from_file:
        if ova or os or kubernetes or name:
            raise InputError(
                "--from-file names the templates itself",
                field="--from-file",
                expected="either --from-file, or --ova/--os/--kubernetes[/--name]",
            )
        entries = load_import_list(from_file)
    else:
        if not ova:
            raise InputError("required flag missing", field="--ova", expected="a local OVA path or an http(s) URL")
        flags.url_or_file(ova, "--ova")
        os_, channel = _os_channel(os, kubernetes)
        entries = [ImportEntry(ova, os_, channel, check_name(name) if name else None)]
    for entry in entries:  # every local OVA is read whole before anything is created on vCenter
        if "://" not in entry.source:
            check_ova(Path(entry.source))
    target = _target(server, insecure, thumbprint)
    first = entries[0]
    with connected(target, f"importing {first.source}") as vs:
        shared = resolve_request(
            vs,
            source=first.source,
            os=first.os,
            channel=first.channel,
            name=first.name,
            library=library or None,
            folder=folder or None,
            datastore=datastore or None,
            resource_pool=resource_pool or None,
            datacenter=datacenter or None,
            snapshot=snapshot,
        )
        reqs = [
            replace(shared, source=e.source, os=e.os, channel=e.channel, name=e.name or default_name(e.os, e.channel))
            for e in entries
        ]
        if dry_run:
            for req in reqs:
                print(f"template {req.path}:")
                for step in plan_text(req):
                    print(f"  {step}")
            return
        outcomes = import_templates(vs, reqs, jobs, byte_progress("upload"))
        warned: set[str] = set()
        for out in outcomes:
            _report(out.path, out.done, out.kept, [w for w in out.warnings if w not in warned])
            warned.update(out.warnings)
        print(
            f"vCenter API calls: {vs.calls.total} ({vs.calls.soap} SOAP, {vs.calls.rest} REST) "
            f"for {len(entries)} template(s)"
        )


def _report(path: str, done: list[str], kept: list[str], warnings: list[str]) -> None:
    print(f"template {path}")
    for line in done:
        print(f"  + {line}")
    for line in kept:
        print(f"  = {line}")
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)


@task(help={**TEMPLATE_HELP, "dry_run": "print the tags; change nothing"}, auto_shortflags=False)
@cli_task
def tag(
    c: Context,
    template: str = "",
    os: str = "",
    kubernetes: str = "",
    dry_run: bool = False,
    server: str = "",
    insecure: bool | None = None,
    thumbprint: str = "",
) -> None:
    """Attach the OS and distro-release tags (categories created when missing) to a self-built template (spec 2.6)."""
    from imagebuilder.vsphere.tags import expected_tags
    from imagebuilder.vsphere.templates import tag_template

    os_, channel = _template_args(template, os, kubernetes)
    if dry_run:
        for t in expected_tags(os_, channel):
            print(f"would tag {template} with {t.name} (category {t.category})")
        return
    with connected(_target(server, insecure, thumbprint), f"tagging {template}") as vs:
        out = tag_template(vs, template, os_, channel)
    _report(out.path, out.done, out.kept, out.warnings)


@task(help=TEMPLATE_HELP, auto_shortflags=False)
@cli_task
def validate(
    c: Context,
    template: str = "",
    os: str = "",
    kubernetes: str = "",
    server: str = "",
    insecure: bool | None = None,
    thumbprint: str = "",
) -> None:
    """Check that a template carries exactly the two tags the product expects (spec 7.1); exit 1 naming the fix."""
    from imagebuilder.vsphere.templates import fix_command, validate_template

    os_, channel = _template_args(template, os, kubernetes)
    with connected(_target(server, insecure, thumbprint), f"validating {template}") as vs:
        problems = validate_template(vs, template, os_, channel)
    if problems:
        raise ExternalError(
            f"template {template} is not valid:\n  " + "\n  ".join(problems),
            hint=fix_command(template, os_, channel),
        )
    print(f"template {template}: valid for {os_.name} on Kubernetes {channel.minor}")


# -- cluster.* ---------------------------------------------------------------------------------------------------


@task(
    help={
        "file": "cluster spec file (repeat -f for several clusters: endpoints and folders must not be shared)",
        "offline": "static checks only; do not connect to vCenter",
    },
    iterable=["file"],
    auto_shortflags=True,
)
@cli_task
def cluster_validate(c: Context, file: list[str] | None = None, offline: bool = False) -> None:
    """Check the vSphere fields of cluster specs (spec 2.5, 7.2): endpoint, thumbprint, pool, folder, template."""
    from imagebuilder.vsphere.clusterspec import check_online, load_cluster_specs

    if not file:
        raise InputError("required flag missing", field="--file", expected="-f cluster.yaml (repeatable)")
    specs = load_cluster_specs([str(flags.existing_file(f, "--file")) for f in file])
    if offline:
        print(f"{len(specs)} cluster spec(s) pass the static checks (--offline: vCenter not contacted)")
        return
    for spec in specs:
        target = _target_of(spec.server, spec.insecure, spec.thumbprint)
        with connected(target, f"checking {spec.source} against {target.server}") as vs:
            for note in check_online(vs, spec):
                print(f"note: {note}")
    print(f"{len(specs)} cluster spec(s) valid, checked against vCenter")
