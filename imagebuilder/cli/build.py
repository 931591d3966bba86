"""``build``: validate every input and plan (``--dry-run``), or run the build (spec 4.1)."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from invoke.context import Context

from imagebuilder.cli import flags
from imagebuilder.cli._common import cli_task, print_json, raw, status_line, task
from imagebuilder.core.errors import InputError, require_flags

if TYPE_CHECKING:
    from securesystemslib.signer import Signer

    from imagebuilder.plan.model import BuildRequest

HELP = {
    "os": "OS to build: {=built_os_names}; the OS-1 image is downloaded (download.bottlerocket), not built",
    "hypervisor": "provider: {=providers}",
    "release_channel": "distro release channel: {=channels} ({=newest_minor} works too; 1-24-eks-5 names one release"
    " of a line)",
    "os_version": "OS version: {=os_versions}",
    "vsphere_config": "vSphere build config file (JSON, spec 2.3)",
    "platform_config": "alias of --vsphere-config",
    "cloudstack_config": "CloudStack build config file (JSON)",
    "orchestrator_config": "alias of --cloudstack-config",
    "nutanix_config": "Nutanix build config file (JSON)",
    "hci_config": "alias of --nutanix-config",
    "ami_config": "AMI build config file (JSON)",
    "baremetal_config": "bare metal build config file (JSON; optional for ubuntu); with --arch, per architecture:"
    " FILE,arm64=ARM64-FILE (each architecture's source image)",
    "release_manifest": "release manifest (path or URL) to use instead of the channel's; its channel must match",
    "mirror": "local mirror (directory or URL) that keeps upstream URL paths, for air-gapped sites",
    "name": "output image name, without extension (default <os>-v<k8s>-<distro>-<n>-<arch>)",
    "arch": "the image's architecture: {=arches} (ubuntu on baremetal; docs/arm64.md)",
    "output_dir": "directory for the output image, checksum and build manifest (default ./output)",
    "dry_run": "validate every input and print the plan; build nothing",
    "output": "plan format: text (default) or json",
    "offline": "do not fetch the release manifest from the network (mirrors are still read)",
    "skip_check": "skip this preflight check (comma-separated or repeated; see 'image-builder preflight --help')",
    "min_disk_gb": "free disk the build workspace needs, in GiB (default {=min_disk_gb}, spec 8)",
    "disk_gb": "size of the image's disk in GiB (default {=disk_gb}, spec 8)",
    "keep_on_error": "keep the build workspace when the build fails (it is removed otherwise)",
    "customize": "customize.yaml (spec 4.8): CA certificates, registry credentials, extra packages baked in",
    "ansible_verbosity": "Ansible's verbosity in the build log, 0 (default) to 6 (the reference tool's flag)",
    "eksa_release": "build what this product release pins, vX.Y.Z (default: {=product_release_env}, else the"
    " channel's manifest)",
    "firmware": "bios or efi (UEFI: ubuntu on baremetal, where it is the default, and vsphere; redhat on baremetal)",
    "engine": "packer (default: a VM), chroot (a build from a source image, provisioned without a VM) or auto"
    " (chroot for such a build when KVM is unusable here)",
    "runtime": "the container runtime: release (default: the containerd tarball the release or the product bundle"
    " ships for its line, with its runc; else the line's containerd, runc and crictl from their projects' releases,"
    " config/release-channels.yaml) or os (the OS's containerd package; warned about where it cannot run the line's"
    " Kubernetes)",
    "packer": "the packer binary to run (default: packer on PATH); {=packers_tested} are tested",
    "packer_plugins": "folder of Packer plugin binaries (packer-plugin-<name>) to install missing plugins from, for"
    " air-gapped sites (default: the mirror's copy, else 'packer init'); Packer 1.7+",
    "files_config": "the reference tool's files.json: {additional_files_list: [{src, dest, owner, group, mode}]}",
    "signing_key": "key that signs the build's provenance: a private key file (PEM: ed25519, ECDSA or RSA; mode"
    " 0600), awskms:<key id|alias/name|ARN>, or hsm:<id>[?label=<token>] / pkcs11:token=<label>;id=<id> (PIN in"
    " $IMAGE_BUILDER_HSM_PIN) (default: $IMAGE_BUILDER_SIGNING_KEY; none: the provenance is written unsigned)",
}


#: the config flags, by provider name or alias (``--<name>-config``)
CONFIG_FLAGS = ("vsphere", "platform", "cloudstack", "orchestrator", "nutanix", "hci", "ami", "baremetal")


def _config_flags(values: dict[str, Any]) -> dict[str, str | None]:
    """The config files a task was given, by the provider name or alias of their flag."""
    return {name: values[f"{name}_config"] for name in CONFIG_FLAGS}


def _request(
    given: dict[str, str | None],
    *,
    disk_gb: str | None,
    files_config: str | None,
    eksa_release: str | None,
    ansible_verbosity: str | None,
    **fields: Any,
) -> BuildRequest:
    """The build request of ``build``'s and ``build.matrix``'s shared flags (config files by provider or alias)."""

    from imagebuilder.core.arch import ARCH_NAMES, check_arch
    from imagebuilder.release.catalog import load_catalog

    catalog = load_catalog()
    # the names first: a mistyped --os is answered before anything heavy is imported (the start-up benchmark)
    names = ((fields.get("os"), catalog.os), (fields.get("hypervisor"), catalog.provider),
             (fields.get("release_channel"), catalog.channel), (fields.get("arch"), check_arch))  # fmt: skip
    for value, lookup in names:
        if value:
            lookup(value)

    configs: dict[str, str] = {}
    arch_configs: dict[str, dict[str, str]] = {}
    for key, value in given.items():
        if value:
            real = catalog.provider(key).name  # config/matrix.yaml owns the aliases
            if real in configs or any(real in c for c in arch_configs.values()):
                raise InputError(f"--{real}-config given twice (once as --{key}-config)", field=f"--{key}-config")
            for arch, path in _arch_configs(value, f"--{key}-config").items():
                if arch is None:
                    configs[real] = path
                else:
                    arch_configs.setdefault(arch, {})[real] = path
    disk = flags.integer(disk_gb, "--disk-gb", 4, 2048) if disk_gb is not None else None
    files = str(flags.existing_file(files_config, "--files-config")) if files_config else None
    verbosity = flags.integer(ansible_verbosity, "--ansible-verbosity", 0, 6) if ansible_verbosity else 0
    from imagebuilder.plan.model import BuildRequest
    from imagebuilder.release.product import requested_release

    request = BuildRequest(
        configs=configs,
        arch_configs=arch_configs,
        disk_gb=disk,
        files_config=files,
        eksa_release=requested_release(eksa_release),
        ansible_verbosity=verbosity,
        **fields,
    )
    if "arch" not in fields:  # build.matrix: each entry's, when the matrix is expanded
        return request
    # a single build: its architecture's config, the others' left out (the plan records the one it used)
    single = request.for_arch(fields["arch"] or ARCH_NAMES[0])
    return dataclasses.replace(single, arch=fields["arch"])


#: ``<arch>=`` at the start of a config flag's entry (a word: a path's own ``=`` elsewhere is a path's)
_ARCH_ENTRY = re.compile(r"([A-Za-z0-9_-]+)=(.*)", re.S)


def _arch_configs(value: str, flag: str) -> dict[str | None, str]:
    """A config flag's value: a path (every architecture's), or comma-separated entries each ``<arch>=<path>`` or a
    path for the others (``bm.json,arm64=bm-arm64.json``): a matrix of both architectures needs a source image of
    each. A value with no entry naming an architecture (or a synonym: refused with the name to use) is one path,
    commas and all, as before."""
    from imagebuilder.core.arch import ARCH_NAMES, ARCH_SYNONYMS, check_arch

    def named(part: str) -> bool:
        m = _ARCH_ENTRY.fullmatch(part)
        return m is not None and (m.group(1).lower() in ARCH_NAMES or m.group(1).lower() in ARCH_SYNONYMS)

    parts = value.split(",")
    if not any(named(p.strip()) for p in parts):
        return {None: value}
    out: dict[str | None, str] = {}
    for part in (p.strip() for p in parts):
        m = _ARCH_ENTRY.fullmatch(part)
        arch = check_arch(m.group(1), flag) if m is not None and named(part) else None
        path = m.group(2) if arch is not None and m is not None else part
        if not path:
            raise InputError(f"an entry names no file: {part!r}", field=flag, expected="<arch>=<file> or <file>")
        if arch in out:
            what = f"the {arch} config" if arch else "the config of every other architecture"
            raise InputError(f"names {what} twice", field=flag, expected="each architecture once")
        out[arch] = path
    return out


@task(help=HELP, iterable=["skip_check"], default=True)
@cli_task
def build(
    c: Context,
    os: str | None = None,
    hypervisor: str | None = None,
    release_channel: str | None = None,
    os_version: str | None = None,
    vsphere_config: str | None = None,
    platform_config: str | None = None,
    cloudstack_config: str | None = None,
    orchestrator_config: str | None = None,
    nutanix_config: str | None = None,
    hci_config: str | None = None,
    ami_config: str | None = None,
    baremetal_config: str | None = None,
    release_manifest: str | None = None,
    mirror: str | None = None,
    name: str | None = None,
    output_dir: str = "output",
    dry_run: bool = False,
    output: str = "text",
    offline: bool = False,
    skip_check: list[str] | None = None,
    min_disk_gb: str | None = None,
    disk_gb: str | None = None,
    keep_on_error: bool = False,
    customize: str | None = None,
    files_config: str | None = None,
    ansible_verbosity: str | None = None,
    eksa_release: str | None = None,
    firmware: str | None = None,
    engine: str | None = None,
    runtime: str | None = None,
    packer: str | None = None,
    packer_plugins: str | None = None,
    signing_key: str | None = None,
    arch: str | None = None,
) -> None:
    """Build a node image for an OS, provider and release channel (spec 4.1).

    Examples:
        image-builder build --os ubuntu --hypervisor baremetal --release-channel {=newest_channel} --offline --dry-run
        image-builder build --os ubuntu --hypervisor vsphere --release-channel {=newest_channel} \
            --vsphere-config vsphere.json --offline --dry-run
    """
    from imagebuilder.core.hostinfo import check_skips

    # the required flags first: a command missing them is answered before anything heavy is imported
    require_flags(("--os", os), ("--hypervisor", hypervisor), ("--release-channel", release_channel))
    flags.choice(output, "--output", ("text", "json"))
    skips = flags.comma_list(skip_check, "--skip-check") if skip_check else []
    check_skips(skips)  # here, so a dry run refuses what the real run would
    min_disk = flags.integer(min_disk_gb, "--min-disk-gb", 1, 10_000_000) if min_disk_gb is not None else None
    flags.dest_dir(output_dir, "--output-dir")
    plugin_dir = flags.existing_dir(packer_plugins, "--packer-plugins") if packer_plugins else None
    signer = signer_for(signing_key)
    given = _config_flags(locals())
    request = _request(
        given,
        os=os,
        hypervisor=hypervisor,
        release_channel=release_channel,
        os_version=os_version,
        release_manifest=release_manifest,
        mirror=mirror,
        name=name,
        output_dir=output_dir,
        offline=offline,
        disk_gb=disk_gb,
        files_config=files_config,
        eksa_release=eksa_release,
        ansible_verbosity=ansible_verbosity,
        firmware=firmware,
        engine=engine,
        runtime=flags.choice(runtime, "--runtime", ("release", "os")) if runtime else None,
        arch=arch,
    )
    # imported once the flags are known good: a mistyped flag is answered without them
    from imagebuilder import flows
    from imagebuilder.customization.model import load_customization

    customization = load_customization(flags.existing_file(customize, "--customize")) if customize else None
    prepared = flows.prepare_build(request, customization=customization, packer=packer, plugins=plugin_dir,
                                   dry_run=dry_run, say=print)  # fmt: skip
    plan, tools, need, checked = prepared.plan, prepared.tools, prepared.need, prepared.source_check
    if output == "json":
        summary = customization.summary() if customization else None
        print_json({"dry_run": dry_run, **plan.to_json(), "source_image_check": checked, "customization": summary,
                    "packer": tools.to_json() if tools else None,
                    "disk_need": {"bytes": need.total, "workspace": str(need.workspace),
                                  "parts": {what: size for what, _, size in need.parts}}})  # fmt: skip
    else:
        print(plan.render_text())
        print(f"disk: {need.describe()}, under {need.workspace} (the output under {need.output})")
        if tools:
            print("\n".join(tools.lines()))
        if checked:
            print(f"source image: {checked}")
        if customization:
            c_ = customization.summary()
            print(f"customization: CA {c_['ca_certificates'] or 'none'}, registries {c_['registries'] or 'none'}, "
                  f"packages {c_['packages'] or 'none'}")  # fmt: skip
    if dry_run:
        return
    with status_line(f"building {plan.output_name}") as status:
        result = flows.run_build(prepared, skip_checks=skips, min_disk_gb=min_disk,
                                 keep_on_error=keep_on_error, signer=signer, say=print, status=status)  # fmt: skip
    if result.artifact:
        print(f"image:    {result.artifact}\nsha256:   {result.sha256}")
    print(f"manifest: {result.manifest}\nlog:      {result.log}")
    print_attestations(result.manifest.parent, result.extra)


def signer_for(signing_key: str | None) -> Signer | None:
    """The provenance's signer, read now: a missing or exposed key exits 2 before anything starts."""
    path = flags.signing_key(signing_key)
    if path is None:
        return None
    from imagebuilder.attest.keys import load_signer

    return load_signer(path, "--signing-key" if signing_key else flags.SIGNING_KEY_ENV)


def print_attestations(out_dir: Path, extra: dict[str, Any]) -> None:
    if extra.get("sbom"):
        print(f"sbom:     {out_dir / extra['sbom']['name']} ({extra['sbom']['packages']} packages)")
    prov = extra.get("provenance")
    if prov:
        signed = f"signed by key {prov['signed_by']}" if prov["signed_by"] else "UNSIGNED: give --signing-key"
        print(f"provenance: {out_dir / prov['name']} ({signed})")


MATRIX_HELP = {
    **{k: v for k, v in HELP.items() if k not in ("name", "output", "release_manifest", "eksa_release", "arch")},
    "release_manifest": "release manifest (path or URL) to build instead of the channel's (a release built from"
    " source, a distro's newer one): with one --release-channel, the manifest's",
    "arch": "architectures, comma-separated or repeated: {=arches}, or both (each entry for each; a pair not"
    " built for one is refused naming why; give each its source image: --baremetal-config FILE,arm64=ARM64-FILE)",
    "os": "OSes, comma-separated or repeated (each with each --hypervisor); or use --pairs",
    "hypervisor": "providers, comma-separated or repeated",
    "pairs": "os:provider pairs, comma-separated or repeated (ubuntu:baremetal,ubuntu:vsphere), instead of"
    " --os/--hypervisor",
    "release_channel": "release channels, comma-separated or repeated: each of {=channels}",
    "jobs": "builds at once (default: what this host's cores and memory hold)",
    "force": "rebuild outputs whose build manifest records the same inputs (default: skipped)",
    "layer_cache": "where OS layers are kept (default ~/.cache/image-builder/layers; $IMAGE_BUILDER_LAYER_CACHE)",
    "layer_only": "build (or find) the OS layers only: a CI job that the per-image jobs share",
    "emit": "github-actions or gitlab-ci: write the CI definition that runs this matrix, one build per job",
    "emit_file": "where --emit writes (default: stdout)",
    "runs_on": "runner labels of the emitted jobs, comma-separated or repeated (default self-hosted,linux,x64)",
    "ci_publish": "with --emit and --ci-sign: a last job publishes every image in one repository version"
    " (image.publish) to this folder or s3://bucket/prefix (credentials from the CI's secrets, never in the URL)",
    "ci_concurrency": "with --emit: image jobs at once (GitHub's max-parallel; GitLab: the runners' limit)",
    "ci_sign": "with --emit: every build signs its provenance with the key in the CI's secret"
    " IMAGE_BUILDER_SIGNING_KEY",
    "dry_run": "validate every entry and print the matrix; build nothing",
}


@task(help=MATRIX_HELP, iterable=["skip_check", "os", "hypervisor", "pairs", "release_channel", "arch", "runs_on"])
@cli_task
def matrix(
    c: Context,
    os: list[str] | None = None,
    hypervisor: list[str] | None = None,
    pairs: list[str] | None = None,
    release_channel: list[str] | None = None,
    os_version: str | None = None,
    vsphere_config: str | None = None,
    platform_config: str | None = None,
    cloudstack_config: str | None = None,
    orchestrator_config: str | None = None,
    nutanix_config: str | None = None,
    hci_config: str | None = None,
    ami_config: str | None = None,
    baremetal_config: str | None = None,
    mirror: str | None = None,
    output_dir: str = "output",
    offline: bool = False,
    disk_gb: str | None = None,
    customize: str | None = None,
    files_config: str | None = None,
    ansible_verbosity: str | None = None,
    firmware: str | None = None,
    engine: str | None = None,
    runtime: str | None = None,
    keep_on_error: bool = False,
    jobs: str | None = None,
    force: bool = False,
    layer_cache: str | None = None,
    layer_only: bool = False,
    emit: str | None = None,
    emit_file: str | None = None,
    runs_on: list[str] | None = None,
    ci_publish: str | None = None,
    ci_concurrency: str | None = None,
    ci_sign: bool = False,
    dry_run: bool = False,
    skip_check: list[str] | None = None,
    min_disk_gb: str | None = None,
    packer: str | None = None,
    packer_plugins: str | None = None,
    signing_key: str | None = None,
    arch: list[str] | None = None,
    release_manifest: str | None = None,
) -> None:
    """Build many images at once: every pair and channel, one OS layer per OS shared by its channels.

    Examples:
        image-builder build.matrix --pairs ubuntu:baremetal,ubuntu:vsphere --release-channel {=newest_channel} \
            --vsphere-config vsphere.json --offline --dry-run
    """
    from imagebuilder.release.catalog import load_catalog

    parse_list = flags.comma_list

    if pairs and (os or hypervisor):
        raise InputError("--pairs and --os/--hypervisor both list what to build", field="--pairs", expected="one")
    if pairs:
        pair_list = []
        for item in parse_list(pairs, "--pairs"):
            os_name, sep, provider = item.partition(":")
            if not sep or not os_name or not provider:
                raise InputError(f"{item!r} is not os:provider", field="--pairs", expected="e.g. ubuntu:baremetal")
            pair_list.append((os_name, provider))
    else:
        pair_list = [(o, h) for o in parse_list(os, "--os") for h in parse_list(hypervisor, "--hypervisor")]
    channels = parse_list(release_channel, "--release-channel")
    if release_manifest is not None and len(channels) != 1:
        raise InputError(
            f"one release manifest names one release, and the matrix has {len(channels)} channels",
            field="--release-manifest",
            expected="one --release-channel: the manifest's",
        )
    from imagebuilder.core.arch import check_arches

    arches = check_arches(parse_list(arch, "--arch") if arch else [])
    catalog = load_catalog()  # the names first: a mistyped one is answered before the build modules load
    for os_name, provider in pair_list:
        catalog.os(os_name)
        catalog.provider(provider)
    for channel in channels:
        catalog.channel(channel)
    n_jobs = flags.integer(jobs, "--jobs", 1, 64) if jobs else None
    from imagebuilder.core.hostinfo import check_skips

    skips = flags.comma_list(skip_check, "--skip-check") if skip_check else []
    check_skips(skips)  # here, so a dry run refuses what the real run would
    min_disk = flags.integer(min_disk_gb, "--min-disk-gb", 1, 10_000_000) if min_disk_gb is not None else None
    if emit:
        flags.choice(emit, "--emit", ("github-actions", "gitlab-ci"))
    for name, value in (("--ci-publish", ci_publish), ("--ci-concurrency", ci_concurrency),
                        ("--ci-sign", ci_sign or None)):  # fmt: skip
        if value is not None and not emit:
            raise InputError(f"{name} shapes the emitted pipeline", field=name, expected="--emit too, or no " + name)
    concurrency = flags.integer(ci_concurrency, "--ci-concurrency", 1, 1000) if ci_concurrency is not None else None
    publish_to = flags.publish_destination(ci_publish, "--ci-publish") if ci_publish is not None else None
    if publish_to and not ci_sign:  # image.publish takes signed provenance only
        raise InputError(
            "a published image's provenance must be signed",
            field="--ci-publish",
            expected="--ci-sign too (the jobs sign with the secret IMAGE_BUILDER_SIGNING_KEY)",
        )
    labels = parse_list(runs_on, "--runs-on") if runs_on else ["self-hosted", "linux", "x64"]
    if emit_file:
        flags.dest_file(emit_file, "--emit-file")
    customize_file = flags.existing_file(customize, "--customize") if customize else None
    flags.dest_dir(output_dir, "--output-dir")
    signer = signer_for(signing_key)
    given = _config_flags(locals())
    request = _request(
        given,
        os=None,
        hypervisor=None,
        release_channel=None,
        os_version=os_version,
        release_manifest=release_manifest,
        mirror=mirror,
        output_dir=output_dir,
        offline=offline,
        disk_gb=disk_gb,
        files_config=files_config,
        eksa_release=None,
        ansible_verbosity=ansible_verbosity,
        firmware=firmware,
        engine=engine,
        runtime=flags.choice(runtime, "--runtime", ("release", "os")) if runtime else None,
    )
    from imagebuilder import flows
    from imagebuilder.customization.model import load_customization

    customization = load_customization(customize_file) if customize_file else None
    if emit:
        from imagebuilder.builder.ci_emit import CiOptions

        options = CiOptions(runs_on=tuple(labels), publish=publish_to, concurrency=concurrency, sign=ci_sign,
                            min_disk_gb=min_disk)  # fmt: skip
        text = flows.emit_matrix(emit, request, pair_list, channels, customize=customize, options=options,
                                 arches=arches)  # fmt: skip
        if emit_file:
            from imagebuilder.core.files import atomic_write

            with atomic_write(flags.dest_file(emit_file, "--emit-file")) as fh:
                fh.write(text)
            print(f"wrote {emit_file}")
        else:
            print(text, end="")
        return
    plugin_dir = flags.existing_dir(packer_plugins, "--packer-plugins") if packer_plugins else None
    prepared = flows.prepare_matrix(request, pair_list, channels, customization=customization, packer=packer,
                                    plugins=plugin_dir, dry_run=dry_run, say=print, arches=arches)  # fmt: skip
    if prepared.tools:
        print("\n".join(prepared.tools.lines()))
    if dry_run:
        for checked in prepared.source_checks:
            print(f"source image: {checked}")
        for p in prepared.plans:
            print(f"would build {p.output_name}  ({p.os} {p.os_version.version} on {p.provider}, {p.channel.name},"
                  f" engine {p.engine})")  # fmt: skip
        print(f"in parallel: up to {prepared.parallelism(n_jobs)} at once")
        return
    cache = Path(layer_cache).resolve() if layer_cache else None
    with status_line("matrix") as status:
        rows = flows.run_matrix(prepared, skip_checks=skips, min_disk_gb=min_disk, jobs=n_jobs, force=force,
                                layer_cache=cache, layer_only=layer_only, keep_on_error=keep_on_error, signer=signer,
                                say=print, status=status)  # fmt: skip
    print_matrix(rows)
    failed = [r.plan.output_name for r in rows if r.status == "failed"]
    if failed:
        from imagebuilder.core.errors import ExternalError

        raise ExternalError(f"{len(failed)} of {len(rows)} builds failed: {', '.join(failed)}")


def print_matrix(rows: list[Any]) -> None:
    """One summary table of a matrix run."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from imagebuilder.core.untrusted import masked, printable

    table = Table(title="build.matrix")
    for column in ("image", "engine", "OS layer", "result", "seconds", "output / why"):
        table.add_column(column)
    for r in rows:
        cells = (r.plan.output_name, r.plan.engine, r.layer, r.status, f"{r.seconds:.0f}", r.detail)
        table.add_row(*(escape(masked(printable(str(cell), 2000))) for cell in cells))
    Console(width=200, file=raw(sys.stdout)).print(table)  # the terminal's own: the cells are made printable above
