"""A stand-in distro release: a manifest of the real format and small stand-in artifacts at the upstream paths.

The real artifacts cannot be downloaded on air-gapped machines (nor on these test machines), yet the offline
flow (mirror, build, verify) must run end to end. Everything here is labelled a stand-in: the binaries are shell
scripts that say so, the images are one-file images. Checksums are real, so every verification runs for real.
Only ``invoke demo`` and the tests use it; a real build uses the channel's manifest or ``--release-manifest``.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from imagebuilder.core.files import atomic_write
from imagebuilder.release.catalog import ReleaseChannel
from imagebuilder.release.imagearchive import Entry, ImageSpec, docker_archive
from imagebuilder.release.manifest import ARCH, IMAGES, archive_asset, image_asset
from imagebuilder.release.profile import load_profile

STANDIN_NOTE = "image-builder stand-in artifact: not a real Kubernetes binary"
IMAGE_REPOS = {
    "pause": "kubernetes/pause",
    "coredns": "coredns/coredns",
    "etcd": "etcd-io/etcd",
    "kube-apiserver": "kubernetes/kube-apiserver",
    "kube-controller-manager": "kubernetes/kube-controller-manager",
    "kube-scheduler": "kubernetes/kube-scheduler",
    "kube-proxy": "kubernetes/kube-proxy",
}


@dataclass(frozen=True)
class StandinRelease:
    manifest_url: str
    manifest_path: Path
    root: Path


def _script(name: str, version: str, arch: str = ARCH) -> bytes:
    what = STANDIN_NOTE if arch == ARCH else f"{STANDIN_NOTE}, {arch}"
    return f'#!/bin/sh\n# {what}\necho "{name} {version} ({what})"\n'.encode()


def _tar_gz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    # a fixed mtime keeps the bytes (and so the checksums) the same on every run
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o755, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def image_archive(ref: str, arch: str = ARCH) -> bytes:
    """A one-layer image of ``arch`` in docker-archive form, which ``ctr images import`` accepts on a node of it."""
    layer = {"standin.txt": Entry(f"{ref}\n{STANDIN_NOTE}\n".encode())}
    labels = {"org.opencontainers.image.description": STANDIN_NOTE}
    return docker_archive(ImageSpec(ref, (layer,), labels=labels, arch=arch))


def _asset(name: str, url: str, data: bytes, arch: str = ARCH) -> dict[str, object]:
    return archive_asset(name, url, data, f"{name} ({STANDIN_NOTE})", arch)


@dataclass(frozen=True)
class ReleaseRuntime:
    """A real container runtime a stand-in release may carry, as tarballs: containerd's (with runc) and crictl's, in
    whatever layout the caller packed them, with the versions they are of."""

    containerd_tarball: bytes
    crictl_tarball: bytes
    containerd: str
    runc: str
    crictl: str


def make_standin_release(
    dest: Path, channel: ReleaseChannel, runtime: ReleaseRuntime | None = None, arches: tuple[str, ...] = (ARCH,)
) -> StandinRelease:
    """Write a stand-in release for ``channel`` under ``dest`` at the upstream URL paths, with the artifacts of each
    of ``arches`` (as the distro's manifests carry amd64 and arm64 side by side); with ``runtime`` (amd64), it ships
    that runtime as release.build's releases do (components ``containerd``, ``runc`` and ``cri-tools``)."""
    profile = load_profile()
    version, number, ch = channel.kubernetes_version, channel.release, channel.name
    base = f"https://{profile.hosts.distro}/kubernetes-{ch}/releases/{number}/artifacts"
    tag = f"{version}-{profile.distro.name}-{ch}-{number}"
    files: dict[str, bytes] = {}
    components: dict[str, list[dict[str, object]]] = {"kubernetes": [], "cni-plugins": [], "etcd": [], "coredns": []}

    cni_version, etcd_version = "v1.1.1", "v3.5.6"
    for arch in arches:
        for binary in ("kubelet", "kubeadm", "kubectl"):
            url = f"{base}/kubernetes/{version}/bin/linux/{arch}/{binary}"
            files[url] = _script(binary, version, arch)
            components["kubernetes"].append(_asset(f"bin/linux/{arch}/{binary}", url, files[url], arch))
        cni_name = f"cni-plugins-linux-{arch}-{cni_version}.tar.gz"
        cni_url = f"{base}/plugins/{cni_version}/{cni_name}"
        files[cni_url] = _tar_gz(
            {f"./{p}": _script(p, cni_version, arch) for p in ("bridge", "host-local", "loopback")}
        )
        components["cni-plugins"].append(_asset(cni_name, cni_url, files[cni_url], arch))
        etcd_name = f"etcd-linux-{arch}-{etcd_version}.tar.gz"
        etcd_url = f"{base}/etcd/{etcd_version}/{etcd_name}"
        files[etcd_url] = _tar_gz(
            {f"etcd-{etcd_version}-linux-{arch}/{b}": _script(b, etcd_version, arch) for b in ("etcd", "etcdctl")}
        )
        components["etcd"].append(_asset(etcd_name, etcd_url, files[etcd_url], arch))

    for image in IMAGES:
        ref = f"{profile.distro.image_registry}/{IMAGE_REPOS[image]}:{tag}"
        component = {"pause": "kubernetes", "etcd": "etcd", "coredns": "coredns"}.get(image, "kubernetes")
        for arch in arches:  # the stand-in image for each platform: it runs nothing
            url = f"{base}/kubernetes/{version}/bin/linux/{arch}/{image}.tar"
            files[url] = image_archive(ref, arch)
            components[component].append(_asset(f"bin/linux/{arch}/{image}.tar", url, files[url], arch))
        description = f"{image} container image ({STANDIN_NOTE})"
        components[component].append(image_asset(image, ref, description, ("amd64", "arm64")))
    git_tags = {"kubernetes": version, "cni-plugins": cni_version, "etcd": etcd_version, "coredns": "v1.8.7"}
    if runtime is not None:
        for component, name, data, tag in (
            ("containerd", "containerd-linux-amd64.tar.gz", runtime.containerd_tarball, runtime.containerd),
            ("cri-tools", "cri-tools-linux-amd64.tar.gz", runtime.crictl_tarball, runtime.crictl),
        ):
            url = f"{base}/{component}/{tag}/{name}"
            files[url] = data
            components[component] = [archive_asset(name, url, data, f"{component} {tag}")]
            git_tags[component] = tag
        components["runc"], git_tags["runc"] = [], runtime.runc  # inside containerd's tarball
    manifest = {
        "apiVersion": profile.distro.manifest_api_version,
        "kind": "Release",
        "metadata": {"name": profile.release_name(ch, number), "annotations": {"description": STANDIN_NOTE}},
        "spec": {"channel": ch, "number": number},
        "status": {
            "components": [{"assets": a, "gitTag": git_tags[n], "name": n} for n, a in components.items()],
            "date": "2022-12-01T00:00:00Z",
        },
    }
    manifest_url = channel.manifest_url
    files[manifest_url] = yaml.safe_dump(manifest, sort_keys=False).encode()
    for url, data in files.items():
        target = dest / urlsplit(url).path.lstrip("/")
        with atomic_write(target, "wb") as fh:
            fh.write(data)
    return StandinRelease(manifest_url, dest / urlsplit(manifest_url).path.lstrip("/"), dest)
