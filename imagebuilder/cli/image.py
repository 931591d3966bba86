"""``image.*``: the OS-2 base image and verification of built images."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from invoke.context import Context

from imagebuilder.cli import flags
from imagebuilder.cli._common import cli_task, status_line, task
from imagebuilder.core.errors import ExternalError, InputError

if TYPE_CHECKING:
    from imagebuilder.builder.verify import Finding
    from imagebuilder.core.progress import Say
    from imagebuilder.flows.images import ImageCustomization
    from imagebuilder.hardening.model import HardeningRequest


@task(
    help={
        "dest": "where to write the qcow2 (and <dest>.sha256)",
        "suite": "Debian suite (default bookworm)",
        "mirror": "Debian archive or a local mirror of it (default http://deb.debian.org/debian)",
        "size_gb": "disk size in GiB (default 4; builds grow it with --disk-gb)",
        "dry_run": "print what would be built; build nothing",
        "arch": "{=arches}: Debian's packages of that architecture (arm64 on another host runs them"
        " through qemu-user-static), GRUB's EFI loader for it",
    },
)
@cli_task
def base(
    c: Context,
    dest: str = "",
    suite: str = "bookworm",
    mirror: str = "http://deb.debian.org/debian",
    size_gb: str = "4",
    dry_run: bool = False,
    arch: str = "",
) -> None:
    """Make a Debian-family cloud-style base image (debootstrap): kernel, cloud-init, openssh-server.

    Examples:
        image-builder image.base --dest base/debian.qcow2 --dry-run
    """
    target = flags.dest_file(flags.required(dest, "--dest", "a path for the qcow2"), "--dest")
    size = flags.integer(size_gb, "--size-gb", 2, 64)
    if not re.fullmatch(r"[a-z][a-z0-9-]{1,30}", suite):
        raise InputError(f"{suite[:40]!r} is not a Debian suite name", field="--suite", expected="e.g. bookworm")
    if mirror.startswith("file://"):
        flags.existing_dir(mirror.removeprefix("file://"), "--mirror")
    else:
        flags.url(mirror, "--mirror", ("http", "https"))
    from imagebuilder.core.arch import ARCH_NAMES, check_arch
    from imagebuilder.core.arch import arch as arch_of

    machine = arch_of(check_arch(arch) if arch else ARCH_NAMES[0])
    from imagebuilder.image.base import BOOTSTRAP, check_prerequisites, make_base_image, packages

    if dry_run:
        check_prerequisites(machine)
        print(f"would build {target.resolve()} (+ .sha256): Debian {suite} {machine.name} from {mirror}, {size} GiB"
              " disk,")  # fmt: skip
        print(f"  debootstrap: {' '.join(BOOTSTRAP)}\n  then apt-get install: {' '.join(packages(machine))}")
        boot = "GRUB on the ESP (UEFI) and extlinux (BIOS)" if machine.bios else "GRUB on the ESP (UEFI only)"
        print(f"  GPT: {boot}, serial console {machine.console}, empty machine-id, no SSH host keys")
        return
    # each step as it starts, also into a pipe (a log a user tees, a test that acts on a step)
    path, digest = make_base_image(
        target, suite=suite, mirror=mirror, size_gb=size, log=lambda text: print(text, flush=True), target=machine
    )
    print(f"base image: {path}\nsha256:     {digest}")
    print(f'use it: "source_image_url": "{path}", "source_image_checksum": "sha256:{digest}"')


def print_findings(findings: list[Finding]) -> None:
    for f in findings:
        print(f"[{'ok  ' if f.ok else 'FAIL'}] {f.name:<20} {f.detail}")


@task(
    flag_aliases={"node_check": ("kubernetes",)},
    help={
        "image": "the built image: .gz (bare metal), .ova, .qcow2 or raw",
        "manifest": "its build manifest (default: <name>.build-manifest.json beside the image)",
        "no_boot": "skip the boot test (offline checks only)",
        "boot_timeout": "seconds to wait for the login prompt (default 600)",
        "node_check": "the node check: run the image's own control plane on this host, boot the image to kubeadm join "
        "it offline, and check the node Ready, kube-proxy, CoreDNS and a test pod Running (needs a real release's "
        "image)",
        "node_timeout": "seconds the node check may take in all (default 2400; TCG is slow)",
        "join": "with --node-check: a second copy of the image joins too, as a second node, and the test pod runs "
        "there",
        "provenance": "check this provenance (<name>.intoto.json) instead of the image's contents: its signature by"
        " --public-key, its subject against the image, the SBOM it names against the file beside it",
        "public_key": "with --provenance: the PEM public key the build signed with (or the signing key's"
        " awskms:/hsm:/pkcs11: reference: its public key is read from the KMS or token)",
        "arch": "{=arch_names}: the architecture the image must be built for (default: the one its build manifest"
        " records); another one recorded is refused before anything is checked",
        "hardening": "scan the image, ours or not, with this ComplianceAsCode profile of its OS, tailored for a"
        " Kubernetes node, as a hardened build does (instead of the other checks); ARF, HTML report and summary"
        " beside the image",
        **flags.HARDENING_HELP,
    },
)
@cli_task
def verify(
    c: Context,
    image: str = "",
    manifest: str = "",
    no_boot: bool = False,
    boot_timeout: str = "600",
    node_check: bool = False,
    node_timeout: str = "2400",
    join: bool = False,
    provenance: str = "",
    public_key: str = "",
    arch: str = "",
    hardening: str = "",
    hardening_content: str = "",
    hardening_min_pass: str = "",
) -> None:
    """Check a built image with testinfra (mounted read-only) and boot it to a login prompt; with --node-check,
    bring a node up on it and check it is Ready; with --provenance, check its signed provenance and SBOM; with
    --hardening, scan it with OpenSCAP.

    Examples:
        image-builder image.verify --image ubuntu.gz --no-boot
        image-builder image.verify --image ubuntu.gz --node-check --join
        image-builder image.verify --image ubuntu.gz --hardening cis_level1_server
    """
    path = flags.existing_file(flags.required(image, "--image", "a built image"), "--image")
    scan = flags.hardening(hardening, hardening_content, hardening_min_pass)
    if scan is not None:
        others = [f for f, v in (("--node-check", node_check), ("--join", join), ("--provenance", provenance),
                                 ("--manifest", manifest), ("--arch", arch)) if v]  # fmt: skip
        if others:
            raise InputError("--hardening scans the image instead of the other checks", field=others[0],
                             expected="--hardening alone, or the other checks without it")  # fmt: skip
        _verify_hardening(path, scan)
        return
    from imagebuilder.core.arch import check_arch

    wanted = check_arch(arch) if arch else None
    if provenance or public_key:
        if wanted:
            raise InputError("--provenance checks the signature, not the image's contents", field="--arch",
                             expected="--arch without --provenance")  # fmt: skip
        _verify_provenance(path, provenance, public_key)
        return
    if node_check and no_boot:
        raise InputError("--node-check boots the image, --no-boot says not to", field="--no-boot",
                         expected="one of them")  # fmt: skip
    if join and not node_check:
        raise InputError("--join is a part of the node check", field="--join", expected="--node-check --join")
    node_seconds = flags.duration(node_timeout, "--node-timeout", 60, 14400)
    boot_seconds = flags.duration(boot_timeout, "--boot-timeout", 10, 7200)
    expected = flags.existing_file(manifest, "--manifest") if manifest else None
    from imagebuilder.builder.verify import verify_image

    with status_line("image.verify") as status:
        findings = verify_image(
            path,
            manifest=expected,
            boot=not no_boot,
            boot_timeout=boot_seconds,
            kubernetes=node_check,
            node_timeout=node_seconds,
            join=join,
            expected_arch=wanted,
            say=status,
        )
    print_findings(findings)
    bad = [f.name for f in findings if not f.ok]
    if bad:
        raise ExternalError(f"image {image} failed: {', '.join(bad)}")
    print(f"image {image}: all {len(findings)} checks passed")


def _verify_hardening(image: Path, request: HardeningRequest) -> None:
    from imagebuilder.hardening.run import scan_any_image, verdict

    name = image.name
    for extension in (".gz", ".ova", ".qcow2", ".vmdk", ".raw", ".img"):
        name = name.removesuffix(extension)
    stem = image.with_name(name)  # the evidence is named as a hardened build names it: <stem>.hardening...
    with status_line("image.verify --hardening") as status:
        result, content = scan_any_image(image, request, stem, say=status)
    print(f"[{'ok  ' if result.pass_rate >= request.min_pass else 'FAIL'}] hardening            {result.describe()}")
    print(f"content:  {content.origin}, {content.datastream.name} (sha256 {content.sha256})")
    if result.evidence:
        print(f"evidence: {result.evidence.summary}, {result.evidence.report}, {result.evidence.arf}")
    verdict(result, request.min_pass)


def _verify_provenance(image: Path, provenance: str, public_key: str) -> None:
    from imagebuilder.attest.keys import load_public_key
    from imagebuilder.attest.provenance import verify as verify_provenance

    statement_file = flags.existing_file(flags.required(provenance, "--provenance", "<name>.intoto.json"),
                                         "--provenance")  # fmt: skip
    key = load_public_key(flags.key(flags.required(public_key, "--public-key", "a PEM public key or a KMS or token"
                                                   " key reference"), "--public-key"))  # fmt: skip
    statement = verify_provenance(statement_file, key, image)
    predicate = statement["predicate"]
    print(f"[ok  ] signature            by key {key.keyid}")
    print(f"[ok  ] subject              {image.name} (sha256 {statement['subject'][0]['digest']['sha256']})")
    for item in predicate["runDetails"].get("byproducts", []):
        print(f"[ok  ] sbom                 {item['name']} (sha256 {item['digest']['sha256']})")
    params = predicate["buildDefinition"]["externalParameters"]
    print(f"built: {', '.join(f'{k}={v}' for k, v in params.items())}")
    print(f"by:    {predicate['runDetails']['builder']['id']} ({predicate['runDetails']['metadata']['invocationId']})")


@task(
    help={
        "image": "the image to publish (its .sha256, .spdx.json and .intoto.json beside it, as a build writes them);"
        " give it again for more images, all published in one repository version",
        "repo": "the TUF repository: a folder, or s3://bucket/prefix (endpoint and credentials from the environment)",
        "keys": "folder of the repository's private keys: targets.pem, snapshot.pem, timestamp.pem (mode 0600)",
        "target_name": "the image's name in the repository (default: its file name; the SBOM and provenance are named"
        " after it); one file name, no folders",
        "public_key": "the PEM public key (or awskms:/hsm:/pkcs11: reference) the build signed the provenance with:"
        " checked before publishing",
        "expires": "days the new metadata stays valid, role=days comma-separated (default targets=90,snapshot=7,"
        "timestamp=1)",
        "dry_run": "check everything (image, SBOM, provenance, keys, repository); upload and sign nothing",
    },
    iterable=["image"],
)
@cli_task
def publish(c: Context, image: list[str] | None = None, repo: str = "", keys: str = "", target_name: str = "",
            public_key: str = "", expires: str = "", dry_run: bool = False) -> None:  # fmt: skip
    """Add images, with their SBOMs and provenances, to a TUF repository in one new version (a rerun of the same
    images changes nothing).

    Examples:
        image-builder image.publish --image ubuntu.gz --repo repo --keys keys --dry-run
    """
    from imagebuilder.cli._common import transfer_bars
    from imagebuilder.cli.repo import print_change

    given = [i for i in (image or []) if i] or [flags.required("", "--image", "a built image")]
    paths = [flags.existing_file(i, "--image") for i in given]
    if target_name and len(paths) > 1:
        raise InputError("--target-name names one image, and several are given", field="--target-name",
                         expected="one --image, or no --target-name")  # fmt: skip
    location = flags.required(repo, "--repo", "a folder or s3://bucket/prefix")
    key_dir = flags.existing_dir(flags.required(keys, "--keys", "the repository's keys folder"), "--keys")
    from imagebuilder.attest.keys import load_public_key
    from imagebuilder.publish.images import publish_images
    from imagebuilder.publish.repository import expiry

    key = load_public_key(flags.key(public_key, "--public-key")) if public_key else None
    days = expiry(expires)
    with transfer_bars() as transfers:
        result = publish_images(paths, location, key_dir, names=[target_name] if target_name else None,
                                public_key=key, days=days, dry_run=dry_run, transfers=transfers, say=print)  # fmt: skip
    if not result.signature_checked:
        print("note: the provenance's signature was not checked (give --public-key)")
    print_change(result.change, dry_run=dry_run)
    names = ", ".join(t.name for t in result.targets)
    if dry_run:
        print(f"targets: {names} (not published: --dry-run)")
    elif result.change.written:
        print(f"published: {names}")
    else:
        print(f"already published: {names} (nothing changed)")


@task(
    help={
        "provenance": "the <name>.intoto.json of the image to rebuild (a chroot-engine build's)",
        "mirror": "the mirror the release's files are read from (default: where the provenance says they were read)",
        "source_image": "the source image file (default: where the provenance says the build read it)",
        "config": "the provider config file the build read (needed when it held a secret; its digest must match)",
        "output_dir": "where the rebuilt image goes (default ./rebuild; never the original's folder)",
        "public_key": "check the provenance's signature with this PEM public key (or KMS/token reference) first",
        "dry_run": "check the provenance and that every input is here with its recorded digest; build nothing",
    },
)
@cli_task
def rebuild(c: Context, provenance: str = "", mirror: str = "", source_image: str = "", config: str = "",
            output_dir: str = "rebuild", public_key: str = "", dry_run: bool = False) -> None:  # fmt: skip
    """Build an image again from what its provenance records and compare: exit 0 "reproduced", exit 1 with the first
    differing file.

    Examples:
        image-builder image.rebuild --provenance ubuntu.gz.intoto.json --dry-run
    """
    path = flags.existing_file(flags.required(provenance, "--provenance", "<name>.intoto.json"), "--provenance")
    source = flags.existing_file(source_image, "--source-image") if source_image else None
    given_config = flags.existing_file(config, "--config") if config else None
    if mirror:
        flags.existing_dir(mirror, "--mirror")
    out = flags.dest_dir(output_dir, "--output-dir")
    if out.resolve() == path.parent.resolve():
        raise InputError("is the folder of the image being checked: the rebuild would replace it", field="--output-dir",
                         expected="another folder")  # fmt: skip
    from imagebuilder.attest.keys import load_public_key
    from imagebuilder.flows.rebuild import rebuild as rebuild_image

    key = load_public_key(flags.key(public_key, "--public-key")) if public_key else None
    with status_line("image.rebuild") as status:
        result = rebuild_image(path, output_dir=out, mirror=mirror or None, source_image=source, config=given_config,
                               public_key=key, dry_run=dry_run, say=print, status=status)  # fmt: skip
    recorded = result.recorded
    if dry_run:
        print(f"would rebuild {recorded.subject} (sha256 {recorded.sha256}): every input is here with its digest")
        return
    print(f"recorded: {recorded.subject}  sha256 {recorded.sha256}")
    print(f"rebuilt:  {result.image}  sha256 {result.sha256}")
    if result.reproduced:
        print("reproduced: the rebuilt image is the same bytes")
        return
    if result.difference is not None:
        d = result.difference
        print(f"first differing file: /{d.path}\n  recorded image: {d.a}\n  rebuilt image:  {d.b}")
    else:
        print("no file differs (or the original image is not beside the provenance): the difference is in the"
              " filesystem's own bytes")  # fmt: skip
    if result.diffoscope:
        print(result.diffoscope)
    raise ExternalError(
        f"not reproduced: the rebuilt image's sha256 is {result.sha256}, the provenance's {recorded.sha256}",
        hint="compare the two with image.diff; report it with both images",
    )


@task(
    help={
        "image": "an image (.gz, raw, qcow2 or OVA; never modified)",
        "against": "the image to compare it with",
        "output": "text (default) or json",
        "any_arch": "compare images of different architectures too (refused by default: everything differs)",
    },
)
@cli_task
def diff(c: Context, image: str = "", against: str = "", output: str = "text", any_arch: bool = False) -> None:
    """Compare two images: packages, files under /etc, enabled units, Kubernetes binaries (exit 1 on a difference
    that two builds of the same inputs should not show).

    Examples:
        image-builder image.diff --image ubuntu.gz --against rebuild/ubuntu.gz
    """
    from imagebuilder.cli._common import print_json

    first = flags.existing_file(flags.required(image, "--image", "an image"), "--image")
    second = flags.existing_file(flags.required(against, "--against", "an image"), "--against")
    flags.choice(output, "--output", ("text", "json"))
    from imagebuilder.image.diff import diff_images

    report = diff_images(first, second, any_arch=any_arch)
    if output == "json":
        print_json({"a": report.a, "b": report.b, "differences": [vars(d) for d in report.differences]})
    else:
        for difference in report.differences:
            print(difference)
        print(f"{len(report.differences)} differences, {len(report.unexpected)} unexpected")
    if report.unexpected:
        raise ExternalError(f"the images differ in {len(report.unexpected)} places (see above)")


@task(
    flag_aliases={"customize": ("file", "f")},
    help={
        "image": "the image to customize: a bare-metal .gz or raw disk, a qcow2, or a local OVA (never modified)",
        "customize": "customize.yaml (spec 4.8): user, CA certificates, registry credentials, extra packages",
        "dest": "the customized image, in the input's format (a .gz stays .gz, an OVA is repacked)",
        "keep_user": "keep the customization user and its key in the image (a way into every clone: warned)",
        "force": "replace an existing --dest (default: an existing one is left alone)",
        "timeout": "seconds to wait for the guest to boot and accept the login (default 1800; TCG is slow)",
        "dry_run": "check the image, the customization file and the host; change nothing",
        "signing_key": "key (PEM file, mode 0600, or awskms:/hsm:/pkcs11: reference) that signs the customized image's"
        " provenance (default:"
        " $IMAGE_BUILDER_SIGNING_KEY; none: no provenance, the SBOM is still written)",
    },
)
@cli_task
def customize(
    c: Context,
    image: str = "",
    customize: str = "",
    dest: str = "",
    keep_user: bool = False,
    force: bool = False,
    timeout: str = "1800",
    dry_run: bool = False,
    signing_key: str = "",
) -> None:
    """Customize a local image (spec 4.8): boot it under QEMU with a NoCloud seed, apply the customize role over
    SSH, clean up, seal, and write the result atomically in the input's format.

    Examples:
        image-builder image.customize --image ubuntu.gz --customize customize.yaml --dest custom/ubuntu.gz --dry-run
    """
    source = flags.existing_file(flags.required(image, "--image", "an image file"), "--image")
    target = flags.dest_file(flags.required(dest, "--dest", "a path for the customized image"), "--dest")
    customize_file = flags.existing_file(
        flags.required(customize, "-f/--customize", "customize.yaml"), "-f/--customize"
    )
    seconds = flags.duration(timeout, "--timeout", 30, 86400)
    from imagebuilder import flows
    from imagebuilder.cli.build import signer_for

    signer = signer_for(signing_key)

    def run(say: Say) -> ImageCustomization:
        return flows.customize_image(source, customize_file, target, keep_user=keep_user, force=force, timeout=seconds,
                                     signer=signer, dry_run=dry_run, say=say)  # fmt: skip

    if dry_run:
        checked = run(print)
        action = "replace" if target.exists() else "write"
        if target.exists() and not force:
            action = "leave alone (exists; --force replaces it)"
        print(f"would customize {source} ({checked.kind}) and {action} {target}")
        c_ = checked.customization
        print(f"  user {c_.user.name} (removed before sealing{'; KEPT with --keep-user' if keep_user else ''})")
        print(f"  CA certificates: {', '.join(n for n, _ in c_.ca_certificates) or 'none'}")
        print(f"  registries: {', '.join(r.host for r in c_.registries) or 'none'}")
        print(f"  packages: {', '.join(c_.packages) or 'none'}")
        return
    with status_line(f"customizing {source.name}") as say:
        result = run(say).result
    assert result is not None
    if result.kept:
        print(f"{target} exists; left alone (--force replaces it)")
        return
    for warning in result.warnings:
        print(f"warning: {warning}")
    print(f"customized image: {result.dest}\nsha256:           {result.sha256}")
    if result.manifest:
        print(f"build manifest:   {result.manifest}")
    print(f"sbom:             {result.sbom}")
    if result.provenance:
        print(f"provenance:       {result.provenance} (signed by key {signer.public_key.keyid if signer else '?'})")
