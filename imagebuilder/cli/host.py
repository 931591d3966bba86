"""``host.prepare``: make this machine an image-builder host (spec 4.3), rerunnable; ``host.clean``: release what
killed runs left behind."""

from __future__ import annotations

from invoke.context import Context

from imagebuilder.cli import flags
from imagebuilder.cli._common import cli_task, task
from imagebuilder.core import grammar


@task(
    help={
        "hypervisor": "providers this host builds for (comma-separated or repeated); baremetal/cloudstack add the QEMU"
        " packages",
        "user": "the dedicated build user to create (default from config/host.yaml: {=build_user})",
        "root": "filesystem to prepare (default /; a chroot directory for testing)",
        "http_proxy": "HTTP_PROXY for the build user's shells (spec 4.3)",
        "https_proxy": "HTTPS_PROXY for the build user's shells",
        "no_proxy": "NO_PROXY for the build user's shells",
        "dry_run": "print what would change; change nothing",
    },
    iterable=["hypervisor"],
)
@cli_task
def prepare(
    c: Context,
    hypervisor: list[str] | None = None,
    user: str = "",
    root: str = "/",
    http_proxy: str = "",
    https_proxy: str = "",
    no_proxy: str = "",
    dry_run: bool = False,
) -> None:
    """Prepare this machine as a build host (spec 4.3): user, packages, kvm, SSH config, proxy. Rerunnable.

    Examples:
        image-builder host.prepare --hypervisor baremetal --hypervisor vsphere --dry-run
    """
    from imagebuilder.release.catalog import load_catalog

    catalog = load_catalog()
    providers = tuple(catalog.provider(h).name for h in flags.listed(hypervisor, "--hypervisor"))
    if user:
        flags.grammar_of(grammar.linux_user, user, "--user")
    for flag, value in (("--http-proxy", http_proxy), ("--https-proxy", https_proxy)):
        if value:
            flags.url(value, flag, ("http", "https"), credentials=True)
    if no_proxy:
        flags.grammar_of(grammar.no_proxy_list, no_proxy, "--no-proxy")
    root_dir = flags.existing_dir(root, "--root")
    from imagebuilder.host.prepare import HostPrep, apply, disk_advice, proxies_from

    prep = HostPrep(root_dir, user=user or None, providers=providers)
    actions = prep.actions(proxies_from(http_proxy, https_proxy, no_proxy))
    advice = disk_advice()
    if advice:
        print(advice)
    if not actions:
        print(f"host prepared: nothing to change in {prep.root}")
        return
    if dry_run:
        print(f"would change {prep.root}:")
        for a in actions:
            print(f"  - {a.describe}")
        return
    done = 0
    for action, changed in apply(actions):
        print(f"- {action.describe}" + ("" if changed else ": already done"))
        done += changed
    print(f"host prepared: {done} change(s) in {prep.root}")


@task(help={"dry_run": "list what would be released, with the run that left each; release nothing",
            "output_dir": "also look for half-written outputs of killed runs in this folder (repeatable)"},
      iterable=["output_dir"])  # fmt: skip
@cli_task
def clean(c: Context, dry_run: bool = False, output_dir: list[str] | None = None) -> None:
    """Release what runs that were killed (SIGKILL, out of memory, power cut) left behind: the processes they
    started (Packer, QEMU, Ansible), their in-memory scratch directories, the loop devices still attached to them,
    their build workspaces and (with --output-dir, subfolders included) their half-written outputs and downloads.
    A live run's resources are never touched.

    Examples:
        image-builder host.clean --output-dir output --dry-run
    """
    folders = [flags.output_folder(d, "--output-dir") for d in output_dir or []]
    from imagebuilder.core.disk import leftovers, release
    from imagebuilder.core.errors import ExternalError
    from imagebuilder.core.paths import workspace_root

    unreadable: list[str] = []
    found = leftovers(workspaces=workspace_root(), outputs=tuple(folders), recursive=True, unreadable=unreadable)
    not_read = ExternalError(
        f"could not read {len(unreadable)} folder(s), so what they hold was not looked at: "
        + "; ".join(unreadable[:5]) + (f" (and {len(unreadable) - 5} more)" if len(unreadable) > 5 else ""),
        hint="run host.clean as root, or name folders it can read with --output-dir",
    )  # fmt: skip
    if not found:
        if unreadable:
            raise not_read
        print("nothing left behind by runs that are gone")
        return
    for item in found:
        print(f"{'would release' if dry_run else 'release'}: {item}")
    if dry_run:
        if unreadable:
            raise not_read
        return
    kept = release(found)
    print(f"released {len(found) - len(kept)} of {len(found)}")
    if unreadable and not kept:
        raise not_read
    if kept:
        hint = "stop what uses them (see 'losetup -l', 'findmnt' and 'ps'), then run host.clean again"
        raise ExternalError("still in use, so kept: " + "; ".join(map(str, kept)), hint=hint)
