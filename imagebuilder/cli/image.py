"""``image.*``: the OS-2 base image and verification of built images."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from invoke.context import Context
from invoke.tasks import task

from imagebuilder.cli import flags
from imagebuilder.cli._common import cli_task
from imagebuilder.errors import ExternalError, InputError

if TYPE_CHECKING:
    from imagebuilder.verify import Finding


@task(
    help={
        "dest": "where to write the qcow2 (and <dest>.sha256)",
        "suite": "Debian suite (default bookworm)",
        "mirror": "Debian archive or a local mirror of it (default http://deb.debian.org/debian)",
        "size_gb": "disk size in GiB (default 4; builds grow it with --disk-gb)",
        "dry_run": "print what would be built; build nothing",
    },
    auto_shortflags=False,
)
@cli_task
def base(
    c: Context,
    dest: str = "",
    suite: str = "bookworm",
    mirror: str = "http://deb.debian.org/debian",
    size_gb: str = "4",
    dry_run: bool = False,
) -> None:
    """Make a Debian-family cloud-style base image (debootstrap): kernel, cloud-init, openssh-server."""
    from imagebuilder.baseimage import BOOTSTRAP, PACKAGES, check_prerequisites, make_base_image

    target = flags.dest_file(flags.required(dest, "--dest", "a path for the qcow2"), "--dest")
    size = flags.integer(size_gb, "--size-gb", 2, 64)
    if not re.fullmatch(r"[a-z][a-z0-9-]{1,30}", suite):
        raise InputError(f"{suite[:40]!r} is not a Debian suite name", field="--suite", expected="e.g. bookworm")
    if mirror.startswith("file://"):
        flags.existing_dir(mirror.removeprefix("file://"), "--mirror")
    else:
        flags.url(mirror, "--mirror", ("http", "https"))
    if dry_run:
        check_prerequisites()
        print(f"would build {target.resolve()} (+ .sha256): Debian {suite} from {mirror}, {size} GiB disk,")
        print(f"  debootstrap: {' '.join(BOOTSTRAP)}\n  then apt-get install: {' '.join(PACKAGES)}")
        print("  extlinux (BIOS), serial console, empty machine-id, no SSH host keys")
        return
    path, digest = make_base_image(target, suite=suite, mirror=mirror, size_gb=size, log=print)
    print(f"base image: {path}\nsha256:     {digest}")
    print(f'use it: "source_image_url": "{path}", "source_image_checksum": "sha256:{digest}"')


def print_findings(findings: list[Finding]) -> None:
    for f in findings:
        print(f"[{'ok  ' if f.ok else 'FAIL'}] {f.name:<20} {f.detail}")


@task(
    help={
        "image": "the built image: .gz (bare metal), .ova, .qcow2 or raw",
        "manifest": "its build manifest (default: <name>.build-manifest.json beside the image)",
        "no_boot": "skip the boot test (offline checks only)",
        "boot_timeout": "seconds to wait for the login prompt (default 600)",
    },
    auto_shortflags=False,
)
@cli_task
def verify(c: Context, image: str = "", manifest: str = "", no_boot: bool = False, boot_timeout: str = "600") -> None:
    """Check a built image with testinfra (mounted read-only) and boot it to a login prompt."""
    from imagebuilder.verify import verify_image

    path = flags.existing_file(flags.required(image, "--image", "a built image"), "--image")
    findings = verify_image(
        path,
        manifest=flags.existing_file(manifest, "--manifest") if manifest else None,
        boot=not no_boot,
        boot_timeout=flags.duration(boot_timeout, "--boot-timeout", 10, 7200),
    )
    print_findings(findings)
    bad = [f.name for f in findings if not f.ok]
    if bad:
        raise ExternalError(f"image {image} failed: {', '.join(bad)}")
    print(f"image {image}: all {len(findings)} checks passed")
