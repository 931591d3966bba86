"""``release.build``: a complete Kubernetes release built from upstream source, in the distro's manifest format.

Why: the distro's artifacts cannot be downloaded everywhere (air-gapped sites, these test machines), some sites must
build Kubernetes from source, and some need a version the distro does not publish. The release this makes is
consumed exactly as the distro's is (``mirror.create --source DIR``, ``build --release-manifest``), and it is
labelled, in the manifest and in every image, as built from upstream source by this tool: never the distro's.

What is built, all through the Go module proxy (no git, no other host):
- ``k8s.io/kubernetes`` at the tag: kubelet, kubeadm, kubectl, kube-apiserver, kube-controller-manager,
  kube-scheduler, kube-proxy. The module's ``replace k8s.io/<x> => ./staging/...`` lines are dropped and each
  staging module required at its published ``v0.<minor>.<patch>``, since the proxy's copy has no git tree to
  stamp versions from; the version is set with the same ``-X`` flags ``hack/lib/version.sh`` passes.
- the pause binary from the tree's own C source (``build/pause/linux/pause.c``), compiled static as upstream does;
- etcd, CoreDNS (the versions this kubeadm asks for: ``kubeadm config images list``), crictl (cri-tools of the
  same minor) and the CNI plugins, each through a small wrapper module (``go install`` refuses modules with
  replace directives);
- the control-plane, kube-proxy, pause, etcd and CoreDNS images as docker-archive tarballs
  (:mod:`imagebuilder.release.imagearchive`), named exactly as this kubeadm asks for them, so a node needs no registry.

Each component is cached under ``~/.cache/image-builder/source-release`` by its inputs (version, recipe, Go
version): a second run only lays the release out again (seconds).

kube-proxy's image holds iptables (nf_tables and legacy) and the libraries it links, from Debian's packages
(``apt-get download`` through the host's package sources, which may be a local mirror; cached), as upstream bases
it on a distroless image with iptables.
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from imagebuilder.core import progress
from imagebuilder.core.errors import ExternalError
from imagebuilder.core.files import atomic_write, partial_prefix, run_checked, sha256_file
from imagebuilder.core.hostinfo import require_tools
from imagebuilder.core.paths import cache_root
from imagebuilder.core.progress import Say, silent
from imagebuilder.core.safepath import safe_join
from imagebuilder.release.imagearchive import Entry, ImageSpec, docker_archive, layer_tar, tree_entries
from imagebuilder.release.k8sversion import parse_version
from imagebuilder.release.manifest import archive_asset, image_asset
from imagebuilder.release.profile import load_profile

#: the release number of what this tool lays out: bump it when a release's content changes (2: kube-proxy's image
#: holds iptables)
RECIPE = 2
#: how the components are built, part of every component's cache key: bump it when a component is built otherwise
#: (other flags), so nothing built the old way is reused
BUILD_RECIPE = 1
#: the distro part of the release name: ``kubernetes-1-34-source-1``
DISTRO = "source"
#: where the release's URIs point (a reserved name that never resolves: the release is read from a directory or
#: a mirror; ``--base-url`` names a real server that serves the folder)
DEFAULT_BASE_URL = "https://kubernetes-source.invalid"
LABEL = "built from upstream source by image-builder (not a distro artifact)"

KUBE_BINARIES = ("kubelet", "kubeadm", "kubectl", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                 "kube-proxy")  # fmt: skip
CONTROL_PLANE_IMAGES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy")
CNI_PLUGINS_VERSION = "v1.9.1"
CNI_PLUGINS = ("main/bridge", "main/host-device", "main/ipvlan", "main/loopback", "main/macvlan", "main/ptp",
               "main/vlan", "ipam/host-local", "ipam/static", "meta/bandwidth", "meta/firewall", "meta/portmap",
               "meta/sbr", "meta/tuning", "meta/vrf")  # fmt: skip

#: Debian's packages kube-proxy's image is made of besides its binary: iptables and every library it links
IPTABLES_PACKAGES = ("iptables", "libip4tc2", "libip6tc2", "libxtables12", "libmnl0", "libnetfilter-conntrack3",
                     "libnfnetlink0", "libnftnl11", "libc6", "libgcc-s1")  # fmt: skip
#: the commands kube-proxy runs, on the nf_tables backend (Debian's default; its alternatives never run here)
IPTABLES_LINKS = {
    f"usr/sbin/{t}{s}": f"{t}-nft{s}" for t in ("iptables", "ip6tables") for s in ("", "-save", "-restore")
}


@dataclass(frozen=True)
class Component:
    """What one component was built from, for the manifest and the docs."""

    name: str
    version: str
    source: str  # module@version (or a file of it)
    bin_dir: Path


@dataclass(frozen=True)
class SourceRelease:
    channel: str
    number: int
    kubernetes_version: str
    manifest_url: str
    manifest_path: Path
    root: Path
    images: dict[str, str]  # image name -> the reference kubeadm asks for
    components: tuple[Component, ...]


def source_cache() -> Path:
    return cache_root() / "source-release"


# --- Go -------------------------------------------------------------------------------------------------------


class _Go:
    """``go`` with the environment every build here uses: no cgo (static binaries), modules from the proxy
    (``-mod=mod``: the proxy's copies carry no vendor folder we use), the toolchain a module asks for fetched from
    the proxy when this one is older (``GOTOOLCHAIN=auto``)."""

    def __init__(self, say: Say) -> None:
        self.go = require_tools("go")["go"]
        flags = os.environ.get("GOFLAGS", "")
        self.env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": f"{flags} -mod=mod".strip(),
                    "GOTOOLCHAIN": os.environ.get("GOTOOLCHAIN") or "auto"}  # fmt: skip
        self.say = say
        self.version = run_checked(self.go, "version", env=self.env).strip()

    def run(self, *args: str, cwd: Path, what: str, log: Path) -> int:
        """Run ``go args`` in ``cwd``; its output goes to ``log``, each package it compiles (``-v``) is progress."""
        seen = {"packages": 0, "said": 0.0}

        def pick(line: str) -> str | None:  # one report every few seconds, not one per package
            seen["packages"] += 1
            if not line or time.monotonic() - seen["said"] < 5:
                return None
            seen["said"] = time.monotonic()
            return f"{what}: {int(seen['packages'])} packages so far ({line[:60]})"

        with log.open("a") as fh:
            status = progress.follow([self.go, *args], env=self.env, log=fh, redact=lambda s: s, cwd=cwd,
                                     say=self.say, pick=pick)  # fmt: skip
        if status != 0:
            tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-8:])
            raise ExternalError(f"go {' '.join(args[:2])} failed for {what} (exit {status}): {tail}",
                                hint=f"the whole output is in {log}; check the Go module proxy is reachable "
                                     "(GOPROXY) and this Go can build the module")  # fmt: skip
        return status

    def output(self, *args: str, cwd: Path) -> str:
        return run_checked(self.go, *args, env={**self.env, "PWD": str(cwd)}, cwd=str(cwd))


def _fresh(folder: Path) -> Path:
    if folder.exists():
        _make_writable(folder)
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def _make_writable(folder: Path) -> None:
    """The module cache's files are read-only; a copy we change (or remove) must be writable."""
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root) / name
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | 0o200)
    folder.chmod(folder.stat().st_mode | 0o200)


def _cached(folder: Path, key: dict[str, Any], outputs: tuple[str, ...], build: Callable[[Path], None]) -> Path:
    """``folder/bin`` holding ``outputs``, built by ``build(bin_dir)`` unless a build of the same ``key`` is there."""
    stamp = folder / "inputs.json"
    bin_dir = folder / "bin"
    want = json.dumps(key, sort_keys=True)
    if stamp.is_file() and stamp.read_text() == want and all((bin_dir / o).is_file() for o in outputs):
        return bin_dir  # built before from the same inputs
    _fresh(folder)
    bin_dir.mkdir()
    build(bin_dir)
    missing = [o for o in outputs if not (bin_dir / o).is_file()]
    if missing:
        raise ExternalError(f"the build of {folder.name} made no {', '.join(missing)}")
    with atomic_write(stamp) as fh:
        fh.write(want)
    return bin_dir


def _wrapper_build(go: _Go, folder: Path, module: str, version: str, packages: Mapping[str, str]) -> None:
    """Build ``packages`` (output name -> package path) of ``module@version`` through a wrapper module, into
    ``folder/bin``: the module's own replace directives do not apply there, as ``go install`` would insist."""
    work = folder / "wrapper"
    work.mkdir()
    log = folder / "build.log"
    (work / "go.mod").write_text("module image-builder.invalid/wrapper\n\ngo 1.21\n")
    go.run("get", f"{module}@{version}", cwd=work, what=f"{module}@{version}", log=log)
    for out, package in packages.items():
        go.run("build", "-v", "-trimpath", "-ldflags=-s -w", "-o", str(folder / "bin" / out), package,
               cwd=work, what=f"{out} {version}", log=log)  # fmt: skip
    shutil.rmtree(work)


# --- the components -------------------------------------------------------------------------------------------


def _kubernetes(go: _Go, version: str, minor: int, patch: int) -> Path:
    folder = source_cache() / f"kubernetes-{version}"
    key = {"recipe": BUILD_RECIPE, "module": "k8s.io/kubernetes", "version": version, "go": go.version}

    def build(bin_dir: Path) -> None:
        go.say(f"kubernetes {version}: building from source (about 7 minutes on 2 cores with an empty Go cache)")
        log = folder / "build.log"
        fetch = folder / "fetch"
        fetch.mkdir()
        (fetch / "go.mod").write_text("module image-builder.invalid/fetch\n\ngo 1.21\n")
        go.say(f"kubernetes {version}: downloading k8s.io/kubernetes@{version} from the Go module proxy")
        info = json.loads(go.output("mod", "download", "-json", f"k8s.io/kubernetes@{version}", cwd=fetch))
        src = folder / "src"
        shutil.copytree(info["Dir"], src, symlinks=True)
        _make_writable(src)
        for leftover in ("go.work", "go.work.sum", "vendor"):
            path = src / leftover
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
        mod = json.loads(go.output("mod", "edit", "-json", cwd=src))
        staging = [r["Old"]["Path"] for r in mod.get("Replace") or [] if r["New"]["Path"].startswith("./staging/")]
        edits = [a for m in staging for a in (f"-dropreplace={m}", f"-require={m}@v0.{minor}.{patch}")]
        if edits:
            go.output("mod", "edit", *edits, cwd=src)
        go.say(f"kubernetes {version}: {len(staging)} staging modules required at v0.{minor}.{patch}; go mod tidy")
        go.run("mod", "tidy", cwd=src, what="go mod tidy", log=log)
        pkg = "k8s.io/component-base/version"
        client = "k8s.io/client-go/pkg/version"
        values = {"gitVersion": version, "gitMajor": "1", "gitMinor": str(minor), "gitTreeState": "clean"}
        ldflags = " ".join(f"-X {p}.{k}={v}" for p in (pkg, client) for k, v in values.items())
        go.run("build", "-v", "-trimpath", "-ldflags", f"-s -w {ldflags}", "-o", f"{bin_dir}/",
               *(f"./cmd/{b}" for b in KUBE_BINARIES), cwd=src, what=f"kubernetes {version}", log=log)  # fmt: skip
        # the pause container's binary: upstream's C source, static, as build/pause/Makefile compiles it
        pause_version = _pause_version(src)
        gcc = require_tools("gcc")["gcc"]
        run_checked(gcc, "-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{pause_version}-{DISTRO}",
                    "-o", str(bin_dir / "pause"), str(src / "build/pause/linux/pause.c"))  # fmt: skip
        shutil.rmtree(src)
        shutil.rmtree(fetch)

    return _cached(folder, key, (*KUBE_BINARIES, "pause"), build)


def _pause_version(src: Path) -> str:
    text = (src / "build/pause/Makefile").read_text()
    m = re.search(r"^TAG \?= (\S+)$", text, re.M)
    if m is None:
        raise ExternalError("build/pause/Makefile names no TAG: the tree's layout changed")
    return m.group(1)


def kubeadm_images(kubeadm: Path, version: str) -> dict[str, str]:
    """What this kubeadm pulls for ``version``: image name (``etcd``, ``coredns``...) -> reference."""
    out = run_checked(str(kubeadm), "config", "images", "list", "--kubernetes-version", version)
    refs = [line.strip() for line in out.splitlines() if line.strip()]
    images = {ref.rsplit(":", 1)[0].rsplit("/", 1)[-1]: ref for ref in refs}
    want = {*CONTROL_PLANE_IMAGES, "pause", "etcd", "coredns"}
    if set(images) != want:
        raise ExternalError(f"kubeadm {version} lists {sorted(images)}, expected {sorted(want)}")
    return images


def _tag(ref: str) -> str:
    return ref.rsplit(":", 1)[1]


def _go_component(go: _Go, name: str, module: str, version: str, packages: Mapping[str, str]) -> Path:
    folder = source_cache() / f"{name}-{version}"
    key = {"recipe": BUILD_RECIPE, "module": module, "version": version, "go": go.version, "packages": dict(packages)}

    def build(_: Path) -> None:
        go.say(f"{name} {version}: building {module}@{version}")
        _wrapper_build(go, folder, module, version, packages)

    return _cached(folder, key, tuple(packages), build)


def _crictl_version(go: _Go, minor: int) -> str:
    """cri-tools is released per Kubernetes minor: the newest v1.<minor>.x the proxy has (else the newest), asked
    once and remembered, so a rerun needs no proxy."""
    remembered = source_cache() / f"crictl-for-1.{minor}.txt"
    if remembered.is_file():
        return remembered.read_text().strip()
    scratch = Path(tempfile.mkdtemp(prefix="crictl-"))
    try:
        (scratch / "go.mod").write_text("module image-builder.invalid/versions\n\ngo 1.21\n")
        out = go.output("list", "-m", "-versions", "sigs.k8s.io/cri-tools", cwd=scratch).split()[1:]
    finally:
        shutil.rmtree(scratch)
    same = [v for v in out if v.startswith(f"v1.{minor}.")]
    if not same and not out:
        raise ExternalError("the Go module proxy lists no sigs.k8s.io/cri-tools version")
    version = (same or out)[-1]
    with atomic_write(remembered) as fh:
        fh.write(version + "\n")
    return version


def needed_tools() -> tuple[str, ...]:
    """The host tools a build needs: Go and gcc always (Go checks every cache hit's inputs), apt-get and dpkg-deb
    while kube-proxy's iptables is not cached yet. The dry run asks for the same."""
    cached = (source_cache() / "iptables-debian" / "bin" / "usr/sbin/xtables-nft-multi").is_file()
    return ("go", "gcc") if cached else ("go", "gcc", "apt-get", "dpkg-deb")


def _iptables(say: Say) -> Path:
    """Debian's iptables and its libraries unpacked into one folder, with the names kube-proxy runs."""
    folder = source_cache() / "iptables-debian"
    key = {"recipe": BUILD_RECIPE, "packages": IPTABLES_PACKAGES, "links": IPTABLES_LINKS}

    def build(root: Path) -> None:
        tools = require_tools("apt-get", "dpkg-deb")
        debs = folder / "debs"
        debs.mkdir()
        say(f"kube-proxy image: apt-get download {' '.join(IPTABLES_PACKAGES)}")
        run_checked(tools["apt-get"], "download", *IPTABLES_PACKAGES, cwd=str(debs))
        for deb in sorted(debs.glob("*.deb")):
            run_checked(tools["dpkg-deb"], "-x", str(deb), str(root))
        for link, target in IPTABLES_LINKS.items():
            (root / link).unlink(missing_ok=True)
            (root / link).symlink_to(target)
        (folder / "packages.txt").write_text("".join(f"{d.name}\n" for d in sorted(debs.glob("*.deb"))))
        shutil.rmtree(debs)

    return _cached(folder, key, ("usr/sbin/xtables-nft-multi", *IPTABLES_LINKS), build)


# --- the release ----------------------------------------------------------------------------------------------


def _base_layer() -> dict[str, Entry]:
    """What a distroless base gives a static binary: users, a writable /tmp, name-service order."""
    return {
        "etc/passwd": Entry(
            b"root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:"
            b"/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
        ),
        "etc/group": Entry(b"root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"),
        "etc/nsswitch.conf": Entry(b"hosts: files dns\n"),
        "tmp": Entry(None, 0o1777),
        "root": Entry(None, 0o700),
        "home/nonroot": Entry(None, 0o700),
    }


def _image(
    ref: str,
    files: dict[str, Path],
    entrypoint: str,
    source: str,
    user: str = "",
    under: dict[str, Entry] | None = None,
) -> bytes:
    """An image of ``files`` (path in the image -> binary) on the base layer, and ``under`` it a layer of its own."""
    layer = {path: Entry(binary.read_bytes(), 0o755) for path, binary in files.items()}
    labels = {
        "org.opencontainers.image.description": LABEL,
        "org.opencontainers.image.source": source,
        "org.opencontainers.image.version": _tag(ref),
    }
    layers = (_base_layer(), *((under,) if under else ()), layer)
    return docker_archive(ImageSpec(ref, layers, (entrypoint,), labels, user))


def _asset(name: str, url: str, data: bytes, description: str) -> dict[str, Any]:
    return archive_asset(name, url, data, f"{description}, {LABEL}")


def _write(dest: Path, url: str, data: bytes) -> None:
    """One file of the release at its URL's path; an identical file is left as it is (reruns converge)."""
    target = safe_join(dest, urlsplit(url).path.lstrip("/"), what=f"the path of {url}")
    same_size = target.is_file() and target.stat().st_size == len(data)
    if same_size and sha256_file(target) == hashlib.sha256(data).hexdigest():
        return
    with atomic_write(target, "wb") as fh:
        fh.write(data)


def _publish(layout: Path, dest: Path) -> None:
    """Copy the cached layout into ``dest``: a file already there with the same size and modification time (the
    copy keeps it) is left alone, as rsync's quick check does; anything else is replaced atomically."""
    for source in sorted(p for p in layout.rglob("*") if p.is_file()):
        target = safe_join(dest, source.relative_to(layout).as_posix())
        st = source.stat()
        if target.is_file() and (target.stat().st_size, target.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{partial_prefix(target)}copy.part")
        try:
            shutil.copy2(source, tmp)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)


def manifest_url(base_url: str, channel: str) -> str:
    return f"{base_url.rstrip('/')}/kubernetes-{channel}/kubernetes-{channel}-{DISTRO}-{RECIPE}.yaml"


def build_release(kubernetes: str, dest: Path, *, base_url: str = DEFAULT_BASE_URL, say: Say = silent) -> SourceRelease:
    """Build (or take from the cache) every component of ``kubernetes`` and lay the release out under ``dest``."""
    version, minor, patch = parse_version(kubernetes)
    go = _Go(say)
    kube = _kubernetes(go, version, minor, patch)
    images = kubeadm_images(kube / "kubeadm", version)
    etcd_version = "v" + _tag(images["etcd"]).split("-")[0]
    coredns_version = _tag(images["coredns"])
    etcd = _go_component(go, "etcd", "go.etcd.io/etcd/server/v3", etcd_version,
                         {"etcd": "go.etcd.io/etcd/server/v3"})  # fmt: skip
    etcdctl = _go_component(go, "etcdctl", "go.etcd.io/etcd/etcdctl/v3", etcd_version,
                            {"etcdctl": "go.etcd.io/etcd/etcdctl/v3"})  # fmt: skip
    coredns = _go_component(go, "coredns", "github.com/coredns/coredns", coredns_version,
                            {"coredns": "github.com/coredns/coredns"})  # fmt: skip
    crictl_version = _crictl_version(go, minor)
    crictl = _go_component(go, "crictl", "sigs.k8s.io/cri-tools", crictl_version,
                           {"crictl": "sigs.k8s.io/cri-tools/cmd/crictl"})  # fmt: skip
    cni_module = "github.com/containernetworking/plugins"
    cni = _go_component(go, "cni-plugins", cni_module, CNI_PLUGINS_VERSION,
                        {p.rsplit("/", 1)[1]: f"{cni_module}/plugins/{p}" for p in CNI_PLUGINS})  # fmt: skip

    channel = f"1-{minor}"
    k8s_source = f"k8s.io/kubernetes@{version}"
    etcd_source = f"go.etcd.io/etcd/server/v3@{etcd_version}"
    coredns_source = f"github.com/coredns/coredns@{coredns_version}"
    crictl_source = f"sigs.k8s.io/cri-tools@{crictl_version}"
    iptables_root = _iptables(say)

    def lay_out(out: Path) -> None:
        """The release's files at their URLs' paths under ``out``: binaries, tarballs, image tars, the manifest."""
        base = f"{base_url.rstrip('/')}/kubernetes-{channel}/releases/{RECIPE}/artifacts"
        kube_base = f"{base}/kubernetes/{version}/bin/linux/amd64"
        components: dict[str, list[dict[str, Any]]] = {"kubernetes": [], "etcd": [], "coredns": [], "cni-plugins": [],
                                                       "cri-tools": []}  # fmt: skip
        for binary in KUBE_BINARIES:
            url = f"{kube_base}/{binary}"
            data = (kube / binary).read_bytes()
            _write(out, url, data)
            components["kubernetes"].append(
                _asset(f"bin/linux/amd64/{binary}", url, data, f"{binary} binary for linux/amd64 from {k8s_source}")
            )
        image_files: dict[str, tuple[str, bytes, str]] = {}  # name -> (component, tar, url)
        iptables = tree_entries(iptables_root, skip=("usr/share",))
        for name in CONTROL_PLANE_IMAGES:
            under = iptables if name == "kube-proxy" else None
            tar = _image(images[name], {f"usr/local/bin/{name}": kube / name}, f"/usr/local/bin/{name}", k8s_source,
                         under=under)  # fmt: skip
            image_files[name] = ("kubernetes", tar, f"{kube_base}/{name}.tar")
        # upstream's pause image runs as 65535 and its binary sits at the root
        pause = _image(images["pause"], {"pause": kube / "pause"}, "/pause", f"{k8s_source} build/pause", "65535:65535")
        image_files["pause"] = ("kubernetes", pause, f"{kube_base}/pause.tar")
        etcd_files = {"usr/local/bin/etcd": etcd / "etcd", "usr/local/bin/etcdctl": etcdctl / "etcdctl"}
        etcd_tar = _image(images["etcd"], etcd_files, "/usr/local/bin/etcd", etcd_source)
        image_files["etcd"] = ("etcd", etcd_tar, f"{base}/etcd/{etcd_version}/bin/linux/amd64/etcd.tar")
        coredns_tar = _image(images["coredns"], {"coredns": coredns / "coredns"}, "/coredns", coredns_source)
        image_files["coredns"] = (
            "coredns",
            coredns_tar,
            f"{base}/coredns/{coredns_version}/bin/linux/amd64/coredns.tar",
        )
        for name, (component, tar, url) in image_files.items():
            _write(out, url, tar)
            components[component].append(_asset(f"bin/linux/amd64/{name}.tar", url, tar,
                                                 f"{name} linux/amd64 image tar (docker-archive)"))  # fmt: skip
            components[component].append(image_asset(name, images[name], f"{name} container image, {LABEL}"))

        etcd_name = f"etcd-linux-amd64-{etcd_version}.tar.gz"
        etcd_tgz = gzip.compress(layer_tar({
            f"etcd-{etcd_version}-linux-amd64/etcd": Entry((etcd / "etcd").read_bytes(), 0o755),
            f"etcd-{etcd_version}-linux-amd64/etcdctl": Entry((etcdctl / "etcdctl").read_bytes(), 0o755),
        }), mtime=0)  # fmt: skip
        url = f"{base}/etcd/{etcd_version}/{etcd_name}"
        _write(out, url, etcd_tgz)
        components["etcd"].insert(
            0, _asset(etcd_name, url, etcd_tgz, f"etcd tarball for linux/amd64 from {etcd_source}")
        )
        cni_name = f"cni-plugins-linux-amd64-{CNI_PLUGINS_VERSION}.tar.gz"
        cni_tgz = gzip.compress(layer_tar({f"./{p.name}": Entry(p.read_bytes(), 0o755) for p in sorted(cni.iterdir())}),
                                mtime=0)  # fmt: skip
        url = f"{base}/plugins/{CNI_PLUGINS_VERSION}/{cni_name}"
        _write(out, url, cni_tgz)
        components["cni-plugins"].append(
            _asset(
                cni_name, url, cni_tgz, f"cni-plugins tarball for linux/amd64 from {cni_module}@{CNI_PLUGINS_VERSION}"
            )
        )
        crictl_name = f"crictl-{crictl_version}-linux-amd64.tar.gz"
        crictl_tgz = gzip.compress(layer_tar({"crictl": Entry((crictl / "crictl").read_bytes(), 0o755)}), mtime=0)
        url = f"{base}/cri-tools/{crictl_version}/{crictl_name}"
        _write(out, url, crictl_tgz)
        components["cri-tools"].append(
            _asset(crictl_name, url, crictl_tgz, f"crictl tarball for linux/amd64 from {crictl_source}")
        )

        tags = {"kubernetes": version, "etcd": etcd_version, "coredns": coredns_version,
                "cni-plugins": CNI_PLUGINS_VERSION, "cri-tools": crictl_version}  # fmt: skip
        name = f"kubernetes-{channel}-{DISTRO}-{RECIPE}"
        manifest = {
            "apiVersion": load_profile().distro.manifest_api_version,
            "kind": "Release",
            "metadata": {
                "name": name,
                "annotations": {
                    "description": f"Kubernetes {version}, {LABEL}",
                    "image-builder/built-with": f"image-builder {load_profile().versions.image_builder}, {go.version}",
                    "image-builder/recipe": str(RECIPE),
                },
            },
            "spec": {"channel": channel, "number": RECIPE},
            "status": {
                "components": [{"assets": assets, "gitTag": tags[n], "name": n} for n, assets in components.items()],
                "date": dt.datetime.fromtimestamp(max(p.stat().st_mtime for p in kube.iterdir()), dt.UTC).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                ),
            },
        }
        _write(out, manifest_url(base_url, channel), yaml.safe_dump(manifest, sort_keys=False).encode())

    # the laid-out release is cached too, by every component's inputs: a rerun only copies what the folder lacks
    url = manifest_url(base_url, channel)
    rel = urlsplit(url).path.lstrip("/")
    folders = (kube, etcd, etcdctl, coredns, crictl, cni, iptables_root)
    key = {"recipe": RECIPE, "base_url": base_url, "inputs": [(f.parent / "inputs.json").read_text() for f in folders]}
    say(f"laying out release kubernetes-{channel}-{DISTRO}-{RECIPE} under {dest}")
    _publish(_cached(source_cache() / f"release-{version}", key, (rel,), lay_out), dest)
    built = (
        Component("kubernetes", version, k8s_source, kube),
        Component("etcd", etcd_version, etcd_source, etcd),
        Component("coredns", coredns_version, coredns_source, coredns),
        Component("cri-tools", crictl_version, crictl_source, crictl),
        Component("cni-plugins", CNI_PLUGINS_VERSION, f"{cni_module}@{CNI_PLUGINS_VERSION}", cni),
    )
    path = safe_join(dest, urlsplit(url).path.lstrip("/"))
    return SourceRelease(channel, RECIPE, version, url, path, dest, images, built)


__all__ = ["DEFAULT_BASE_URL", "SourceRelease", "build_release", "kubeadm_images", "parse_version"]
