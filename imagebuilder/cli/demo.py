"""``demo``: the offline flow end to end (base image, mirror, bare-metal build, image.verify)."""

from __future__ import annotations

from invoke.context import Context

from imagebuilder.cli import flags
from imagebuilder.cli._common import StepClock, cli_task, status_line, task
from imagebuilder.cli.image import print_findings
from imagebuilder.core.errors import ExternalError


@task(
    help={
        "dest": "working directory for the base image, mirror and output (default ./demo)",
        "release_channel": "with --standin: the stand-in release's channel (default {=demo_standin_channel})",
        "kubernetes": "the Kubernetes release built from source (default {=demo_kubernetes}, with the line's"
        " containerd: {=newest_containerd})",
        "standin": "the quick flow: a stand-in release (its binaries are scripts), verified to a login prompt",
        "disk_gb": "image disk size in GiB (default 4: a demo image)",
        "no_boot": "skip the boot test and the node check of the built image",
        "skip_check": "preflight checks to skip (comma-separated or repeated)",
        "dry_run": "print the steps; do nothing",
        "engine": "auto (default: the fastest this host supports), chroot or packer",
        "signing_key": "key that signs the image's provenance, as build takes it (a PEM file, awskms:..., hsm:... or"
        " pkcs11:...; default: $IMAGE_BUILDER_SIGNING_KEY; none: unsigned)",
        "hardening": "harden the demo's image with this ComplianceAsCode profile (cis_level1_server...), scan it, and"
        " prove it still a node (docs/hardening.md)",
        **flags.HARDENING_HELP,
    },
    iterable=["skip_check"],
)
@cli_task
def demo(
    c: Context,
    dest: str = "demo",
    release_channel: str = "",
    kubernetes: str = "",
    standin: bool = False,
    disk_gb: str = "4",
    no_boot: bool = False,
    skip_check: list[str] | None = None,
    dry_run: bool = False,
    engine: str = "auto",
    signing_key: str = "",
    hardening: str = "",
    hardening_content: str = "",
    hardening_min_pass: str = "",
) -> None:
    """Run the offline flow end to end: base image, Kubernetes built from source, mirror, bare-metal build, and a
    node brought up on the image (--standin: a stand-in release, verified to a login prompt).

    Examples:
        image-builder demo --dry-run
        image-builder demo --standin --dry-run
        image-builder demo --hardening cis_level1_server --dry-run
    """
    from imagebuilder.core.errors import InputError
    from imagebuilder.core.hostinfo import check_skips

    out = flags.dest_dir(dest, "--dest")
    size = flags.integer(disk_gb, "--disk-gb", 4, 2048)
    flags.choice(engine, "--engine", ("auto", "chroot", "packer"))
    skips = flags.listed(skip_check, "--skip-check")
    check_skips(skips)  # here, so a dry run refuses what the real run would
    from imagebuilder.cli.build import signer_for

    signer = signer_for(signing_key or None)  # read now: a bad key exits 2 before the base image is made
    harden = flags.hardening(hardening, hardening_content, hardening_min_pass)
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.release.k8sversion import parse_version

    if standin and kubernetes:
        raise InputError("--kubernetes chooses the release built from source; --standin uses none",
                         field="--kubernetes", expected="one of them")  # fmt: skip
    if release_channel and not standin:
        raise InputError("the demo builds Kubernetes from source, whose version gives the channel",
                         field="--release-channel", expected="--kubernetes VERSION, or --standin")  # fmt: skip
    # the given values are checked before the demo's modules are imported (a mistyped flag is answered at once)
    if release_channel:
        load_catalog().channel(release_channel)
    if kubernetes:
        load_catalog().channel(f"1-{parse_version(kubernetes)[1]}", "--kubernetes")
    from imagebuilder.flows.demo import DEMO_KUBERNETES, STANDIN_CHANNEL, demo_steps, run_demo

    channel = release_channel or STANDIN_CHANNEL
    version = kubernetes or DEMO_KUBERNETES
    if dry_run:
        for step in demo_steps(out, channel=channel, disk_gb=size, boot=not no_boot, engine=engine, standin=standin,
                               kubernetes=version, hardening=harden):  # fmt: skip
            print(f"would run: {step}")
        return
    clock = StepClock()
    with status_line("demo") as status:
        result = run_demo(
            out,
            channel=channel,
            kubernetes=version,
            standin=standin,
            disk_gb=size,
            boot=not no_boot,
            skip_checks=tuple(skips),
            engine=engine,
            signer=signer,
            hardening=harden,
            say=clock,
            status=status,
        )
    clock.done()
    print_findings(result.findings)
    bad = [f.name for f in result.findings if not f.ok]
    if bad:
        raise ExternalError(f"the demo image failed verification: {', '.join(bad)}")
    print(f"\ndemo image: {result.build.artifact}\nmanifest:   {result.build.manifest}")
    hardened = result.build.extra.get("hardening") or {}
    if hardened.get("scan"):
        scan = hardened["scan"]
        print(f"hardening:  {hardened['profile']}: {scan['pass_rate']}% of {scan['applicable']} applicable rules pass")
