"""``release.build``: a Kubernetes release built from upstream source, in the distro's manifest format."""

from __future__ import annotations

from invoke.context import Context

from imagebuilder.cli import flags
from imagebuilder.cli._common import cli_task, status_line, task


@task(
    iterable=["arch"],
    help={
        "kubernetes": "the Kubernetes release to build, e.g. {=demo_kubernetes} ({=oldest_source_release} or newer)",
        "containerd": "the containerd release the node runtime is built from (default: the one the line's bundle "
        "names, config/release-channels.yaml: {=newest_containerd}); runc is the one it pins",
        "dest": "directory to lay the release out in, at its URLs' paths (default ./release)",
        "base_url": "where the release will be served from (default: a name that never resolves; read it from "
        "the directory or a mirror)",
        "arch": "the architectures to build, comma-separated or repeated: {=arches}, or both (one manifest "
        "lists both, as the distro's do; arm64 is cross-compiled: Debian's gcc-aarch64-linux-gnu for its C parts)",
        "dry_run": "check the flags and the tools (go, gcc and the cross gcc; apt-get until Debian's packages are "
        "cached) and print what would be built; build nothing",
    },
)
@cli_task
def build(
    c: Context, kubernetes: str = "", dest: str = "release", base_url: str = "", containerd: str = "",
    arch: list[str] | None = None, dry_run: bool = False,
) -> None:  # fmt: skip
    """Build a Kubernetes release from upstream source: binaries, etcd, CoreDNS, pause, the node's container runtime
    (containerd, runc, crictl), CNI plugins and the control-plane images, in the distro's manifest format (cached by
    version).

    Examples:
        image-builder release.build --kubernetes {=demo_kubernetes} --dest release --dry-run
    """
    from imagebuilder.release.k8sversion import parse_version

    # the flags first: a bad one is answered before the recipe is imported
    version, minor, _ = parse_version(flags.required(kubernetes, "--kubernetes", "v1.<minor>.<patch>"))
    out = flags.dest_dir(dest, "--dest")
    from imagebuilder.core.arch import check_arches
    from imagebuilder.release.source import DEFAULT_BASE_URL, check_host, manifest_url, release_runtime, source_cache

    arches = check_arches(flags.listed(arch, "--arch"))

    runtime = release_runtime(minor, containerd or None)

    base = flags.base_url(base_url, "--base-url") if base_url else DEFAULT_BASE_URL
    check_host(arches)
    from imagebuilder.release.source import check_published, containerd_module

    # a version nobody released is bad input, answered before anything is built (the dry run asks too)
    check_published("k8s.io/kubernetes", version, "--kubernetes", "kubernetes")
    check_published(containerd_module(runtime.containerd), runtime.containerd, "--containerd", "containerd")
    url = manifest_url(base, f"1-{minor}")
    if dry_run:
        print(f"would build Kubernetes {version} from k8s.io/kubernetes@{version} for {', '.join(arches)} "
              f"(cache: {source_cache()})")  # fmt: skip
        print(f"would build its runtime: containerd {runtime.containerd} with the runc it pins, crictl "
              f"{runtime.crictl}")  # fmt: skip
        print(f"would write the release under {out.resolve()}; its manifest: {url}")
        return
    from imagebuilder.release.source import build_release

    with status_line("release.build") as status:
        release = build_release(version, out, base_url=base, containerd=runtime.containerd, say=status,
                                arches=arches)  # fmt: skip
    print(f"architectures: {', '.join(release.arches)}")
    for comp in release.components:
        print(f"{comp.name:<12} {comp.version:<10} from {comp.source}")
    print(f"manifest:  {release.manifest_path}\nurl:       {release.manifest_url}")
    print("every artifact is labelled in the manifest as built from upstream source by image-builder")
    channel = release.channel
    more = f" --arch {','.join(release.arches)}" if release.arches != ("amd64",) else ""
    print(f"use it:    image-builder mirror.create --release-channel {channel} --release-manifest {url} "
          f"--source {out} --dest MIRROR{more}")  # fmt: skip
    for name in release.arches:
        print(f"           image-builder build --os ubuntu --hypervisor baremetal --release-channel {channel} "
              f"--release-manifest {url} --mirror {out}{'' if name == 'amd64' else ' --arch ' + name}")  # fmt: skip
