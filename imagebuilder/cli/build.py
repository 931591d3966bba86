"""``build`` and ``build.matrix``: validate every input and plan (``--dry-run``), or build one image or many
(spec 4.1). The flags the two share are declared once (:data:`SHARED`), with their checks (:func:`_shared`); the rules
of a request live in the library (:mod:`imagebuilder.plan.request`), so a flow called from Python refuses what these
refuse."""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from invoke.context import Context

from imagebuilder.cli import flags
from imagebuilder.cli._common import cli_task, print_json, raw, status_line, task
from imagebuilder.core.errors import InputError, require_flags

if TYPE_CHECKING:
    from securesystemslib.signer import Signer

    from imagebuilder.customization.model import Customization
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
    "hardening": "harden the image with this ComplianceAsCode profile of its OS (cis_level1_server,"
    " cis_level2_server...), tailored for a Kubernetes node, and scan its finished disk (docs/hardening.md)",
    "signing_key": "key that signs the build's provenance: a private key file (PEM: ed25519, ECDSA or RSA; mode"
    " 0600), awskms:<key id|alias/name|ARN>, or hsm:<id>[?label=<token>] / pkcs11:token=<label>;id=<id> (PIN in"
    " $IMAGE_BUILDER_HSM_PIN) (default: $IMAGE_BUILDER_SIGNING_KEY; none: the provenance is written unsigned)",
    **flags.HARDENING_HELP,
}


#: the config flags, by provider name or alias (``--<name>-config``)
CONFIG_FLAGS = ("vsphere", "platform", "cloudstack", "orchestrator", "nutanix", "hci", "ami", "baremetal")

#: the flags ``build`` and ``build.matrix`` share, with their defaults: declared once, both tasks' signatures are
#: made with them (:func:`_with_shared`), and :func:`_shared` checks them once for both
SHARED: dict[str, Any] = {
    "os_version": None, **{f"{name}_config": None for name in CONFIG_FLAGS}, "release_manifest": None,
    "mirror": None, "output_dir": "output", "dry_run": False, "offline": False, "skip_check": None,
    "min_disk_gb": None, "disk_gb": None, "keep_on_error": False, "customize": None, "files_config": None,
    "ansible_verbosity": None, "firmware": None, "engine": None, "runtime": None, "packer": None,
    "packer_plugins": None, "signing_key": None, "hardening": None, "hardening_content": None,
    "hardening_min_pass": None,
}  # fmt: skip


def _with_shared(body: Callable[..., Any]) -> Callable[..., Any]:
    """``body`` (which takes ``**shared``) with the shared flags in its signature, where Invoke reads its flags."""
    own = inspect.signature(body)
    params = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
               for name, default in SHARED.items()]  # fmt: skip
    body.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
    return body


@dataclass(frozen=True)
class _Shared:
    """The shared flags, checked: what both tasks hand to their flows."""

    request: BuildRequest
    skips: list[str]
    min_disk: int | None
    plugins: Path | None
    signer: Signer | None
    customization: Customization | None
    customize: str | None
    packer: str | None
    dry_run: bool
    keep_on_error: bool


def _shared(values: dict[str, Any], *, single: dict[str, Any]) -> _Shared:
    """The shared flags checked, in the order that answers a mistyped name before anything heavy loads (the
    start-up benchmark): the names (``single``: build's own --os, --hypervisor, --release-channel, --arch, --name...;
    empty for a matrix), the skips, the folders, the key, then the request."""
    from imagebuilder.core.arch import check_arch
    from imagebuilder.core.hostinfo import check_skips
    from imagebuilder.release.catalog import load_catalog

    catalog = load_catalog()
    names = ((single.get("os"), catalog.os), (single.get("hypervisor"), catalog.provider),
             (single.get("release_channel"), catalog.channel), (single.get("arch"), check_arch))  # fmt: skip
    for value, lookup in names:
        if value:
            lookup(value)
    skips = flags.listed(values["skip_check"], "--skip-check")
    check_skips(skips)  # here, so a dry run refuses what the real run would
    min_disk_gb = values["min_disk_gb"]
    min_disk = flags.integer(min_disk_gb, "--min-disk-gb", 1, 10_000_000) if min_disk_gb is not None else None
    customize = values["customize"]
    customize_file = flags.existing_file(customize, "--customize") if customize else None
    flags.dest_dir(values["output_dir"], "--output-dir")
    plugins = flags.existing_dir(values["packer_plugins"], "--packer-plugins") if values["packer_plugins"] else None
    signer = signer_for(values["signing_key"])
    request = _request(values, single)
    from imagebuilder.customization.model import load_customization

    return _Shared(request=request, skips=skips, min_disk=min_disk, plugins=plugins, signer=signer,
                   customization=load_customization(customize_file) if customize_file else None,
                   customize=customize, packer=values["packer"], dry_run=values["dry_run"],
                   keep_on_error=values["keep_on_error"])  # fmt: skip


def _request(values: dict[str, Any], single: dict[str, Any]) -> BuildRequest:
    """The build request of the shared flags and ``single`` (build's own; empty for a matrix, whose entries are
    filled in when it is expanded)."""
    from imagebuilder.core.arch import ARCH_NAMES
    from imagebuilder.plan.request import config_files

    configs, arch_configs = config_files({name: values[f"{name}_config"] for name in CONFIG_FLAGS})
    disk_gb, files_config, verbosity = values["disk_gb"], values["files_config"], values["ansible_verbosity"]
    disk = flags.integer(disk_gb, "--disk-gb", 4, 2048) if disk_gb is not None else None
    files = str(flags.existing_file(files_config, "--files-config")) if files_config else None
    level = flags.integer(verbosity, "--ansible-verbosity", 0, 6) if verbosity else 0
    runtime = flags.choice(values["runtime"], "--runtime", ("release", "os")) if values["runtime"] else None
    from imagebuilder.plan.model import BuildRequest
    from imagebuilder.release.product import requested_release

    hardening = flags.hardening(values["hardening"], values["hardening_content"], values["hardening_min_pass"])

    request = BuildRequest(
        os=single.get("os"), hypervisor=single.get("hypervisor"), release_channel=single.get("release_channel"),
        os_version=values["os_version"], release_manifest=values["release_manifest"], mirror=values["mirror"],
        name=single.get("name"), output_dir=values["output_dir"], offline=values["offline"], disk_gb=disk,
        files_config=files, ansible_verbosity=level, eksa_release=requested_release(single.get("eksa_release")),
        firmware=values["firmware"], engine=values["engine"], runtime=runtime, configs=configs,
        arch_configs=arch_configs, hardening=hardening,
    )  # fmt: skip
    if not single:  # build.matrix: each entry's architecture, when the matrix is expanded
        return request
    # a single build: its architecture's config, the others' left out (the plan records the one it used)
    chosen = request.for_arch(single.get("arch") or ARCH_NAMES[0])
    return dataclasses.replace(chosen, arch=single.get("arch"))


@task(help=HELP, iterable=["skip_check"], default=True)
@_with_shared
@cli_task
def build(
    c: Context,
    os: str | None = None,
    hypervisor: str | None = None,
    release_channel: str | None = None,
    name: str | None = None,
    output: str = "text",
    eksa_release: str | None = None,
    arch: str | None = None,
    **shared: Any,
) -> None:
    """Build a node image for an OS, provider and release channel (spec 4.1).

    Examples:
        image-builder build --os ubuntu --hypervisor baremetal --release-channel {=newest_channel} --offline --dry-run
        image-builder build --os ubuntu --hypervisor vsphere --release-channel {=newest_channel} \
            --vsphere-config vsphere.json --offline --dry-run
    """
    # the required flags first: a command missing them is answered before anything heavy is imported
    require_flags(("--os", os), ("--hypervisor", hypervisor), ("--release-channel", release_channel))
    flags.choice(output, "--output", ("text", "json"))
    values = {**SHARED, **shared}
    single = {"os": os, "hypervisor": hypervisor, "release_channel": release_channel, "name": name,
              "eksa_release": eksa_release, "arch": arch}  # fmt: skip
    checked = _shared(values, single=single)
    # imported once the flags are known good: a mistyped flag is answered without them
    from imagebuilder import flows

    customization = checked.customization
    prepared = flows.prepare_build(checked.request, customization=customization, packer=checked.packer,
                                   plugins=checked.plugins, dry_run=checked.dry_run, say=print)  # fmt: skip
    plan, tools, need, source_check = prepared.plan, prepared.tools, prepared.need, prepared.source_check
    if output == "json":
        summary = customization.summary() if customization else None
        print_json({"dry_run": checked.dry_run, **plan.to_json(), "source_image_check": source_check,
                    "customization": summary, "packer": tools.to_json() if tools else None,
                    "estimate": {"seconds": dict(prepared.estimate.steps), "measured": prepared.estimate.measured}
                    if prepared.estimate else None,
                    "disk_need": {"bytes": need.total, "workspace": str(need.workspace),
                                  "parts": {what: size for what, _, size in need.parts}}})  # fmt: skip
    else:
        print(plan.render_text())
        print(f"disk: {need.describe()}, under {need.workspace} (the output under {need.output})")
        if tools:
            print("\n".join(tools.lines()))
        if source_check:
            print(f"source image: {source_check}")
        if prepared.estimate:
            print(f"estimate: {prepared.estimate.describe()}")
        if customization:
            c_ = customization.summary()
            print(f"customization: CA {c_['ca_certificates'] or 'none'}, registries {c_['registries'] or 'none'}, "
                  f"packages {c_['packages'] or 'none'}")  # fmt: skip
    if checked.dry_run:
        return
    with status_line(f"building {plan.output_name}") as status:
        result = flows.run_build(prepared, skip_checks=checked.skips, min_disk_gb=checked.min_disk,
                                 keep_on_error=checked.keep_on_error, signer=checked.signer, say=print,
                                 status=status)  # fmt: skip
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
@_with_shared
@cli_task
def matrix(
    c: Context,
    os: list[str] | None = None,
    hypervisor: list[str] | None = None,
    pairs: list[str] | None = None,
    release_channel: list[str] | None = None,
    arch: list[str] | None = None,
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
    **shared: Any,
) -> None:
    """Build many images at once: every pair and channel, one OS layer per OS shared by its channels.

    Examples:
        image-builder build.matrix --pairs ubuntu:baremetal,ubuntu:vsphere --release-channel {=newest_channel} \
            --vsphere-config vsphere.json --offline --dry-run
    """
    from imagebuilder.core.arch import check_arches
    from imagebuilder.plan.request import check_matrix, matrix_pairs
    from imagebuilder.release.catalog import load_catalog

    values = {**SHARED, **shared}
    pair_list = matrix_pairs(flags.listed(pairs, "--pairs"), flags.listed(os, "--os"),
                             flags.listed(hypervisor, "--hypervisor"))  # fmt: skip
    if not pair_list:
        require_flags(("--os", os), ("--hypervisor", hypervisor))
    channels = flags.comma_list(release_channel, "--release-channel")
    check_matrix(values["release_manifest"], channels)
    arches = check_arches(flags.listed(arch, "--arch"))
    catalog = load_catalog()  # the names first: a mistyped one is answered before the build modules load
    for os_name, provider in pair_list:
        catalog.os(os_name)
        catalog.provider(provider)
    for channel in channels:
        catalog.channel(channel)
    n_jobs = flags.integer(jobs, "--jobs", 1, 64) if jobs else None
    if emit:
        flags.choice(emit, "--emit", ("github-actions", "gitlab-ci"))
    for name, value in (("--ci-publish", ci_publish), ("--ci-concurrency", ci_concurrency),
                        ("--ci-sign", ci_sign or None)):  # fmt: skip
        if value is not None and not emit:
            raise InputError(f"{name} shapes the emitted pipeline", field=name, expected="--emit too, or no " + name)
    concurrency = flags.integer(ci_concurrency, "--ci-concurrency", 1, 1000) if ci_concurrency is not None else None
    publish_to = flags.publish_destination(ci_publish, "--ci-publish") if ci_publish is not None else None
    labels = flags.listed(runs_on, "--runs-on") or ["self-hosted", "linux", "x64"]
    if emit_file:
        flags.dest_file(emit_file, "--emit-file")
    if emit:
        from imagebuilder.builder.ci_emit import CiOptions

        # its own rules (a published image is signed) before the shared flags' heavier checks
        options = CiOptions(runs_on=tuple(labels), publish=publish_to, concurrency=concurrency, sign=ci_sign)
    checked = _shared(values, single={})
    from imagebuilder import flows

    if emit:
        options = dataclasses.replace(options, min_disk_gb=checked.min_disk)
        text = flows.emit_matrix(emit, checked.request, pair_list, channels, customize=checked.customize,
                                 options=options, arches=arches)  # fmt: skip
        if emit_file:
            from imagebuilder.core.files import atomic_write

            with atomic_write(flags.dest_file(emit_file, "--emit-file")) as fh:
                fh.write(text)
            print(f"wrote {emit_file}")
        else:
            print(text, end="")
        return
    prepared = flows.prepare_matrix(checked.request, pair_list, channels, customization=checked.customization,
                                    packer=checked.packer, plugins=checked.plugins, dry_run=checked.dry_run,
                                    say=print, arches=arches)  # fmt: skip
    if prepared.tools:
        print("\n".join(prepared.tools.lines()))
    if checked.dry_run:
        for source_check in prepared.source_checks:
            print(f"source image: {source_check}")
        for p in prepared.plans:
            print(f"would build {p.output_name}  ({p.os} {p.os_version.version} on {p.provider}, {p.channel.name},"
                  f" engine {p.engine})")  # fmt: skip
        print(f"in parallel: up to {prepared.parallelism(n_jobs)} at once")
        return
    cache = Path(layer_cache).resolve() if layer_cache else None
    with status_line("matrix") as status:
        rows = flows.run_matrix(prepared, skip_checks=checked.skips, min_disk_gb=checked.min_disk, jobs=n_jobs,
                                force=force, layer_cache=cache, layer_only=layer_only,
                                keep_on_error=checked.keep_on_error, signer=checked.signer, say=print,
                                status=status)  # fmt: skip
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
