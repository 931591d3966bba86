"""``preflight`` and ``host.prepare``: the image-builder host (spec 4.3, 8)."""

from __future__ import annotations

from invoke.context import Context
from invoke.tasks import task

from imagebuilder import grammar
from imagebuilder.cli import flags
from imagebuilder.cli._common import cli_task
from imagebuilder.hostinfo import CHECKS


@task(
    help={
        "os": "OS to build: ubuntu (os2) or redhat (os3)",
        "hypervisor": "provider: vsphere, cloudstack, nutanix, baremetal or ami (or the spec's kind names)",
        "skip_check": f"skip this check (repeatable): {', '.join(CHECKS)}",
        "min_disk_gb": "free disk the build workspace needs, in GiB (default 50, spec 8)",
    },
    iterable=["skip_check"],
    auto_shortflags=False,
)
@cli_task
def preflight(
    c: Context, os: str = "", hypervisor: str = "", skip_check: list[str] | None = None, min_disk_gb: str | None = None
) -> None:
    """Check this host before a build: OS, arch, disk, CPUs, memory, tools, /dev/kvm, SSH config, proxy."""
    flags.required(os, "--os", "ubuntu or redhat")
    flags.required(hypervisor, "--hypervisor", "vsphere, cloudstack, nutanix, baremetal or ami")
    from imagebuilder.preflight import require

    require(
        os,
        hypervisor,
        skip_check or [],
        flags.integer(min_disk_gb, "--min-disk-gb", 1, 10_000_000) if min_disk_gb is not None else None,
    )


@task(
    help={
        "hypervisor": "providers this host builds for (repeatable); baremetal/cloudstack add the QEMU packages",
        "user": "the dedicated build user to create (default from config/host.yaml: image-builder)",
        "root": "filesystem to prepare (default /; a chroot directory for testing)",
        "http_proxy": "HTTP_PROXY for the build user's shells (spec 4.3)",
        "https_proxy": "HTTPS_PROXY for the build user's shells",
        "no_proxy": "NO_PROXY for the build user's shells",
        "dry_run": "print what would change; change nothing",
    },
    iterable=["hypervisor"],
    auto_shortflags=False,
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
    """Prepare this machine as a build host (spec 4.3): user, packages, kvm, SSH config, proxy. Rerunnable."""
    from imagebuilder.hostprep import HostPrep, proxies_from, require_root_privileges
    from imagebuilder.model import load_catalog

    catalog = load_catalog()
    providers = tuple(catalog.provider(h).name for h in hypervisor or [])
    if user:
        flags.grammar_of(grammar.linux_user, user, "--user")
    for flag, value in (("--http-proxy", http_proxy), ("--https-proxy", https_proxy)):
        if value:
            flags.url(value, flag, ("http", "https"), credentials=True)
    if no_proxy:
        flags.grammar_of(grammar.no_proxy_list, no_proxy, "--no-proxy")
    prep = HostPrep(flags.existing_dir(root, "--root"), user=user or None, providers=providers)
    actions = prep.actions(proxies_from(http_proxy, https_proxy, no_proxy))
    if not actions:
        print(f"host prepared: nothing to change in {prep.root}")
        return
    if dry_run:
        print(f"would change {prep.root}:")
        for a in actions:
            print(f"  - {a.describe}")
        return
    require_root_privileges()
    done = 0
    for a in actions:
        if a.needed():
            print(f"- {a.describe}")
            a.apply()
            done += 1
        else:
            print(f"- {a.describe}: already done")
    print(f"host prepared: {done} change(s) in {prep.root}")
