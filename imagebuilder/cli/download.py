"""``download.*``: OS-1 images over TUF (spec 4.5) and the bare-metal boot assets (spec 1.8)."""

from __future__ import annotations

import os
from pathlib import Path

from invoke.context import Context

from imagebuilder.cli import _help as helptext
from imagebuilder.cli import flags
from imagebuilder.cli._common import cli_task, task, transfer_bars

KUBE_HELP = "the release line: {=channels} (or {=minors}; default: KUBEVERSION from the environment)"


@task(
    flag_aliases={"release_channel": ("kubernetes",)},
    help={
        "variant": "vsphere (the OVA) or baremetal (the raw image, written as gzip)",
        "release_channel": KUBE_HELP,
        "dest": "directory to write into (default ./os1; may already exist)",
        "root": "root.json to start from: a file or URL (default: the OS-1 cache host's)",
        "root_sha512": "SHA-512 root.json must have (default: the one pinned in config/profile.yaml)",
        "metadata_url": "TUF metadata URL (default per spec 4.5, e.g. a local mirror)",
        "targets_url": "TUF targets URL (default per spec 4.5)",
        "dry_run": "check the root and the signed metadata, print the target; download nothing",
    },
)
@cli_task
def bottlerocket(
    c: Context,
    variant: str = "",
    release_channel: str = "",
    dest: str = "os1",
    root: str = "",
    root_sha512: str = "",
    metadata_url: str = "",
    targets_url: str = "",
    dry_run: bool = False,
) -> None:
    """Download an OS-1 image over TUF: pinned root, verified metadata, one verified pass (spec 4.5).

    Examples:
        image-builder download.bottlerocket --variant baremetal --release-channel {=newest_channel} --dry-run
    """
    from imagebuilder.release.os1_variants import VARIANTS

    flags.choice(flags.required(variant, "--variant", " or ".join(VARIANTS)), "--variant", VARIANTS)
    kube = flags.required(
        release_channel or os.environ.get("KUBEVERSION"),
        "--release-channel",
        helptext.render("{=channels}, or KUBEVERSION set"),
    )
    out = flags.dest_dir(dest, "--dest")
    for flag, value in (("--metadata-url", metadata_url), ("--targets-url", targets_url)):
        if value:
            flags.url(value, flag, ("http", "https"))
    if root:
        flags.url_or_file(root, "--root")
    if root_sha512:  # a malformed pin is the user's input: exit 2 before root.json is fetched
        root_sha512 = flags.hex_digest(root_sha512, "--root-sha512", "sha512")
    from imagebuilder.release.os1 import download, os1_target, pinned_root  # python-tuf: once the flags are known good

    target = os1_target(variant, kube, metadata_url or None, targets_url or None)
    print(f"target:   {target.name}\nmetadata: {target.metadata_url}\ntargets:  {target.targets_url}")
    trusted = pinned_root(root or None, root_sha512 or None)
    if dry_run:  # the root and the signed metadata are checked; the image is not downloaded
        from imagebuilder.release.os1 import target_info

        expected, url = target_info(target, trusted)
        print(f"verified: {expected.length} bytes at {url}, {', '.join(expected.hashes)} signed")
        print(f"output:   {out / target.output_name} (not written: --dry-run)")
        return
    with transfer_bars() as transfers:
        path = download(target, out, trusted, transfers)
    print(f"wrote {path} (verified against the signed metadata)")
    if variant == "baremetal":
        from imagebuilder.host.serve import served_url

        print(f"osImageURL: {served_url(path.name)} (once 'image-builder serve --dir {dest}' runs)")


@task(
    help={
        "dest": "directory to write vmlinuz-x86_64 and initramfs-x86_64 into (default ./hook)",
        "manifest": "bundle manifest file or URL (default: the profile's bundle on the assets host)",
        "dry_run": "read the manifest and print what would be downloaded; download nothing",
    },
)
@cli_task
def hook(c: Context, dest: str = "hook", manifest: str = "", dry_run: bool = False) -> None:
    """Download the bare-metal boot kernel and ramdisk of the bundle, verified (spec 1.8).

    Examples:
        image-builder download.hook --dest hook --dry-run
    """
    out = flags.dest_dir(dest, "--dest")
    location = flags.url_or_file(manifest, "--manifest") if manifest else None
    from imagebuilder.release.hook import destinations, download_hook, load_hook_assets

    assets = load_hook_assets(location)
    if dry_run:
        for asset, target in zip(assets, destinations(out, assets), strict=True):
            sums = ", ".join(asset.hashes) or "the .sha512/.sha256 file published beside it"
            print(f"{asset.uri} -> {target} (verified by {sums})")
        return

    with transfer_bars() as transfers:
        paths = download_hook(out, assets, transfers)
    for path in paths:
        print(f"wrote {path} (verified)")
    from imagebuilder.host.serve import served_url

    print(
        f"hookImagesURLPath: {served_url(Path(dest).name)} (once 'image-builder serve --dir {Path(dest).parent}' runs)"
    )


@task(
    help={
        "repo": "the repository's URL (http/https: a server or a bucket's web endpoint) or folder, as image.publish "
        "wrote it (metadata/ and targets/ under it)",
        "root": "the repository's root.json to start from (a file or URL): the one repo.init made, or a later one",
        "root_sha512": "the SHA-512 root.json must have (repo.init printed it); checked first when given",
        "target": "the target to download, as published (e.g. ubuntu-v1.29.9-eks-1-29-20-amd64.gz)",
        "dest": "directory to write into (default .; may already exist)",
        "dry_run": "check the root and the signed metadata, print the target; download nothing",
    },
)
@cli_task
def image(c: Context, repo: str = "", root: str = "", root_sha512: str = "", target: str = "", dest: str = ".",
          dry_run: bool = False) -> None:  # fmt: skip
    """Download any target of a TUF repository image.publish made: the same verified, resumable path as OS-1.

    Examples:
        image-builder download.image --repo http://images.internal/repo --root root.json --target ubuntu.gz --dry-run
    """
    location = flags.required(repo, "--repo", "the repository's URL or folder")
    name = flags.required(target, "--target", "a target name")
    root_source = flags.url_or_file(flags.required(root, "--root", "the repository's root.json"), "--root")
    out = flags.dest_dir(dest, "--dest")
    pin = flags.hex_digest(root_sha512, "--root-sha512", "sha512") if root_sha512 else ""
    from imagebuilder.core.fetch import read
    from imagebuilder.core.safepath import safe_join
    from imagebuilder.release import tufclient

    repository = tufclient.published(location)
    trusted = tufclient.root_metadata(read(root_source, timeout=30, what="root.json"), root_source)
    if pin:
        trusted = tufclient.pinned(trusted, pin, root_source)
    destination = safe_join(out, name, what="the target's name")
    if dry_run:
        expected, url = tufclient.target_info(repository, name, trusted)
        print(f"verified: {name}: {expected.length} bytes at {url}, {', '.join(expected.hashes)} signed")
        print(f"output:   {destination} (not written: --dry-run)")
        return
    with transfer_bars() as transfers:
        path = tufclient.download(repository, name, destination, trusted, transfers=transfers)
    print(f"wrote {path} (verified against the signed metadata)")
