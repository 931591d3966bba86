"""``mirror.create``: an air-gap mirror of a release (spec 8: everything works from a local mirror)."""

from __future__ import annotations

from invoke.context import Context

from imagebuilder.cli import _help as helptext
from imagebuilder.cli import flags
from imagebuilder.cli._common import cli_task, status_line, task, transfer_bars


@task(
    iterable=["arch", "hardening_product"],
    help={
        "release_channel": "channel whose release manifest to mirror: {=channels} (config/release-channels.yaml)",
        "eksa_release": "mirror what this product release pins for the channel, vX.Y.Z: its release index, bundle, the"
        " distro manifest and the runtime tarballs the bundle ships (default: {=product_release_env})",
        "dest": "mirror directory (created; upstream URL paths are kept)",
        "release_manifest": "mirror this manifest (URL) instead of the channel's",
        "source": "read from this mirror (directory or URL) instead of upstream",
        "dry_run": "read the manifest and list what would be downloaded; write nothing",
        "packer_plugins": "also copy the Packer plugin binaries in this folder into the mirror (packer-plugins/), where"
        " builds from the mirror find them",
        "runtime": "the runtime the builds from this mirror take, as build --runtime: release (default: for a release"
        " that ships none, the line's containerd, runc and crictl from their projects' releases, with their checksum"
        " files) or os (the OS's package: none is carried)",
        "arch": "the architectures whose artifacts it carries, comma-separated or repeated: {=arches}, or both",
        "hardening_product": "also carry the ComplianceAsCode data streams of these products for build --hardening"
        " (debian12, ubuntu2204, rhel9...; comma-separated or repeated), built from {=hardening_content} (cached)",
        "hardening_content": "with --hardening-product: take the data streams from this folder instead of building"
        " them",
    },
)
@cli_task
def create(
    c: Context,
    release_channel: str = "",
    dest: str = "",
    release_manifest: str = "",
    source: str = "",
    dry_run: bool = False,
    packer_plugins: str = "",
    eksa_release: str = "",
    runtime: str = "",
    arch: list[str] | None = None,
    hardening_product: list[str] | None = None,
    hardening_content: str = "",
) -> None:
    """Download a release manifest and every node artifact it names, checksum-verified, keeping URL paths.

    Examples:
        image-builder mirror.create --release-channel {=newest_channel} --dest mirror --dry-run
    """
    from imagebuilder.core.arch import check_arches
    from imagebuilder.core.errors import InputError
    from imagebuilder.core.fetch import Mirror
    from imagebuilder.release.catalog import load_catalog

    channel = load_catalog().channel(
        flags.required(release_channel, "--release-channel", helptext.render("{=channels}"))
    )
    from imagebuilder.release.product import flag, pinned_for, requested_release

    arches = list(check_arches(flags.listed(arch, "--arch")))
    os_runtime = flags.choice(runtime or "release", "--runtime", ("release", "os")) == "os"
    line_runtime = None if os_runtime else channel.runtime
    version = requested_release(eksa_release)
    out = flags.dest_dir(dest, "--dest")
    if version and release_manifest:
        raise InputError(f"{flag()} and --release-manifest both choose the release manifest", field=flag(),
                         expected="one of them")  # fmt: skip
    url = flags.url_or_file(release_manifest, "--release-manifest") if release_manifest else channel.manifest_url
    src = Mirror.parse(source, "--source") if source else None
    pinned = pinned_for(version, channel, src) if version else None
    if pinned is not None:
        url = pinned.manifest_url
    plugin_dir = flags.existing_dir(packer_plugins, "--packer-plugins") if packer_plugins else None
    from imagebuilder.builder.packer_plugins import MIRROR_FOLDER, copy_plugins, plugin_binaries
    from imagebuilder.release.manifest import load_manifest
    from imagebuilder.release.mirror import create_mirror, file_sha256, mirror_plan

    products = flags.listed(hardening_product, "--hardening-product")
    if products:
        from imagebuilder.hardening import content as cac
        from imagebuilder.hardening.model import cac_name

        for product in products:
            flags.grammar_of(lambda v: cac_name(v, "product"), product, "--hardening-product")
    if hardening_content and not products:
        raise InputError("--hardening-content says where the data streams come from, and no product is asked for",
                         field="--hardening-content", expected="--hardening-product PRODUCT with it")  # fmt: skip
    content_dir = flags.existing_dir(hardening_content, "--hardening-content") if hardening_content else None
    plugins = plugin_binaries(plugin_dir) if plugin_dir else {}
    if packer_plugins and not plugins:
        raise InputError(f"{packer_plugins} holds no Packer plugin binaries", field="--packer-plugins",
                         expected="a folder of packer-plugin-<name> binaries")  # fmt: skip
    if dry_run:
        for kind, plugin in sorted(plugins.items()):
            print(f"{'would copy':<15} {out / MIRROR_FOLDER / plugin.path.name}  ({kind} {plugin.version})")
        for product in products:
            print(f"{'would carry':<15} {out / cac.MIRROR_FOLDER / cac.datastream_name(product)}")
        manifests = [load_manifest(url, src, arch=a) for a in arches]
        target = Mirror(str(out.resolve()))
        planned, _ = mirror_plan(manifests, target, line_runtime, pinned, src)
        for _url, hashes, path in planned:
            state = "present" if file_sha256(path) == hashes["sha256"] else "would download"
            print(f"{state:<15} {path}")
        return
    with transfer_bars() as transfers:
        manifest, items = create_mirror(url, out, runtime=line_runtime, source=src, transfers=transfers,
                                        pinned=pinned, arches=arches)  # fmt: skip
    copied = copy_plugins(plugins, out) if plugins else []
    if products:
        with status_line("mirror.create") as status:
            carried = cac.copy_to_mirror(out, products, content_dir, say=status)
        for content in carried:
            path = out / cac.MIRROR_FOLDER / cac.datastream_name(content.product)
            print(f"{'hardening':<10} {path.stat().st_size:>12} {path}  ({content.origin})")
    for item in items:
        print(f"{item.status:<10} {item.size:>12} {item.path}")
    for plugin in copied:
        print(f"{'plugin':<10} {plugin.path.stat().st_size:>12} {plugin.path}  ({plugin.type} {plugin.version})")
    fetched = sum(1 for i in items if i.status == "downloaded")
    pins = f" as product release {pinned.version} pins it (with its bundle's runtime)" if pinned else ""
    print(f"mirror of {manifest.name}{pins} ({', '.join(arches)}) in {dest}: {len(items)} artifacts ({fetched}"
          " downloaded, all sha256-verified)")  # fmt: skip
    release = f" {flag()} {pinned.version}" if pinned else ""
    print(f"use it: image-builder build ...{release} --mirror {dest}")
