"""What the vSphere task modules (``vsphere``, ``template``, ``cluster``) share: connection flags and their help.

Credentials are read from the environment only (spec 5): ``<PREFIX>_VSPHERE_USERNAME``/``_PASSWORD`` (the prefix
comes from the profile) or ``GOVC_USERNAME``/``GOVC_PASSWORD`` (and ``GOVC_URL``, ``GOVC_INSECURE`` for the server).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from imagebuilder.cli import _help as helptext
from imagebuilder.cli import flags

if TYPE_CHECKING:
    from imagebuilder.release.catalog import OperatingSystem, ReleaseChannel
    from imagebuilder.vsphere.connection import Target

CONNECTION_HELP = {
    "server": "vCenter host, IP or URL (default: GOVC_URL)",
    "insecure": "do not verify the vCenter certificate (default: GOVC_INSECURE)",
    "thumbprint": "trust a self-signed vCenter certificate with this SHA1 thumbprint (see vsphere.thumbprint)",
}
OS_HELP = "the template's OS family: {=os_names}"
KUBE_HELP = "the template's release line: {=channels} (or {=minors})"
TEMPLATE_HELP = {
    "template": "inventory path of the template: /<dc>/vm/<folder>/<name>",
    "os": OS_HELP,
    "release_channel": KUBE_HELP,
    **CONNECTION_HELP,
}


def target(server: str, insecure: str | bool | None, thumbprint: str) -> Target:
    """The vCenter of the connection flags, falling back to ``GOVC_URL``, ``GOVC_INSECURE``, ``GOVC_THUMBPRINT``."""
    from imagebuilder.vsphere.connection import target_from

    return target_from(server or None, flags.switch(insecure, "--insecure"), thumbprint or None, os.environ)


def os_channel(os_name: str, release_channel: str) -> tuple[OperatingSystem, ReleaseChannel]:
    from imagebuilder.release.catalog import load_catalog

    catalog = load_catalog()
    return (
        catalog.os(flags.required(os_name, "--os", helptext.render(OS_HELP))),
        catalog.channel_for_kubernetes(
            flags.required(release_channel, "--release-channel", helptext.render(KUBE_HELP)), "--release-channel"
        ),
    )


def template_args(template: str, os_name: str, release_channel: str) -> tuple[OperatingSystem, ReleaseChannel]:
    """The template flags every template task takes: its path, then its OS and Kubernetes version."""
    flags.required(template, "--template", TEMPLATE_HELP["template"])
    return os_channel(os_name, release_channel)


def report(path: str, done: list[str], kept: list[str], warnings: list[str]) -> None:
    print(f"template {path}")
    for line in done:
        print(f"  + {line}")
    for line in kept:
        print(f"  = {line}")
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
