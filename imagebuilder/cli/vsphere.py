"""``vsphere.*``: the build user and its rights (spec 2.4, 4.6, 4.7), and the server's certificate thumbprint."""

from __future__ import annotations

from invoke.context import Context

from imagebuilder.cli import _vsphere, flags
from imagebuilder.cli._common import cli_task, task
from imagebuilder.core.errors import InputError


@task(
    name="setup-user",
    help={
        "file": "user.yaml (spec 2.4): the user, group, roles and the objects they get rights on",
        "password": "password of the new user: -, @FILE or env:VAR (a literal value works but shows in ps)",
        "force": "the user exists: overwrite the group's permissions and reset role privileges to the lists",
        "dry_run": "print the diff between vCenter and user.yaml; change nothing",
        "thumbprint": _vsphere.CONNECTION_HELP["thumbprint"],
    },
)
@cli_task
def setup_user(
    c: Context, file: str = "", password: str = "", force: bool = False, dry_run: bool = False, thumbprint: str = ""
) -> None:
    """Create the SSO user, group, three roles and their permissions from user.yaml (spec 2.4, 4.6, 4.7).

    Examples:
        image-builder vsphere.setup-user --file user.yaml --password env:VSPHERE_NEW_PASSWORD --dry-run
    """
    user_file = flags.existing_file(flags.required(file, "--file", "-f user.yaml"), "--file")
    from imagebuilder.vsphere.connection import target_from
    from imagebuilder.vsphere.userconfig import load_user_config

    cfg = load_user_config(user_file)
    if bool(password) == bool(force):
        raise InputError(
            "give exactly one of --password and --force",
            field="--password/--force",
            expected="--password to create the user, or --force to update an existing setup (mutually exclusive)",
        )
    secret = flags.secret(password, "--password") if password else None
    target = target_from(cfg.server, cfg.insecure, thumbprint or None, {})  # user.yaml names its vCenter
    from imagebuilder.vsphere.access import apply, global_permission_step, plan_setup_user  # pyVmomi: once needed
    from imagebuilder.vsphere.session import connect

    with connect(target, f"setting up {cfg.username}@{cfg.domain} on {target.server}") as vs:
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
)
@cli_task
def thumbprint(c: Context, server: str = "") -> None:
    """Print the SHA1 thumbprint of the vCenter certificate, as the cluster spec's thumbprint field wants it.

    Examples:
        image-builder vsphere.thumbprint --server vcenter.internal
    """
    from imagebuilder.vsphere.connection import server_thumbprint

    print(server_thumbprint(_vsphere.target(server, True, "")))
