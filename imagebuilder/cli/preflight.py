"""``preflight``: check this host before a build (spec 4.3, 8); each failure names its fix."""

from __future__ import annotations

from invoke.context import Context

from imagebuilder.cli import _help as helptext
from imagebuilder.cli import flags
from imagebuilder.cli._common import cli_task, task
from imagebuilder.core.hostinfo import CHECKS


@task(
    help={
        "os": "OS to build: {=built_os_names}",
        "hypervisor": "provider: {=providers}",
        "skip_check": f"skip these checks (comma-separated or repeated): {', '.join(CHECKS)}",
        "min_disk_gb": "free disk the build workspace needs, in GiB (default {=min_disk_gb}, spec 8)",
        "packer": "the packer binary builds run (default: packer on PATH): its version and plugins are shown",
        "packer_plugins": "folder of Packer plugin binaries a build would install missing plugins from",
        "arch": "the image's architecture: {=arches} (its programs must run here: qemu-user)",
    },
    iterable=["skip_check"],
)
@cli_task
def preflight(
    c: Context,
    os: str = "",
    hypervisor: str = "",
    skip_check: list[str] | None = None,
    min_disk_gb: str | None = None,
    packer: str | None = None,
    packer_plugins: str | None = None,
    arch: str = "",
) -> None:
    """Check this host before a build: OS, arch (and for an arm64 image, qemu-user), disk, CPUs, memory, tools,
    Packer and its plugins, /dev/kvm, SSH config, proxy.

    Examples:
        image-builder preflight --os ubuntu --hypervisor baremetal
    """
    flags.required(os, "--os", helptext.render("{=built_os_names}"))
    flags.required(hypervisor, "--hypervisor", helptext.render("{=providers}"))
    from imagebuilder.core.arch import ARCH_NAMES, check_arch
    from imagebuilder.core.hostinfo import check_skips
    from imagebuilder.release.catalog import load_catalog

    catalog = load_catalog()
    catalog.os(os)
    catalog.provider(hypervisor)
    target = check_arch(arch) if arch else ARCH_NAMES[0]
    skips = flags.listed(skip_check, "--skip-check")
    check_skips(skips)
    min_disk = flags.integer(min_disk_gb, "--min-disk-gb", 1, 10_000_000) if min_disk_gb is not None else None
    plugin_dir = flags.existing_dir(packer_plugins, "--packer-plugins") if packer_plugins else None
    from imagebuilder.host.preflight import require

    require(os, hypervisor, skips, min_disk, say=print, packer=packer, plugins=plugin_dir, arch=target)
