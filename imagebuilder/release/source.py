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
- etcd, CoreDNS (the versions this kubeadm asks for: ``kubeadm config images list``), and the CNI plugins, each
  through a small wrapper module (``go install`` refuses modules with replace directives);
- the node's container runtime, the versions the line's bundle names (``config/release-channels.yaml``, or
  ``--containerd``): containerd (``containerd``, ``ctr``, ``containerd-shim-runc-v2``, static, with its own systemd
  unit), the runc that containerd release pins (``script/setup/runc-version``; cgo, static, with seccomp) and crictl,
  each stamped with its version as its own Makefile does (``crictl --version`` says 1.36.0, not "unknown");
- the control-plane, kube-proxy, pause, etcd and CoreDNS images as docker-archive tarballs
  (:mod:`imagebuilder.release.imagearchive`), named exactly as this kubeadm asks for them, so a node needs no registry.

Each component is cached under ``~/.cache/image-builder/source-release`` by its inputs (version, recipe, Go
version): a second run only lays the release out again (seconds).

kube-proxy's image holds iptables (nf_tables and legacy) and the libraries it links, from Debian's packages
(``apt-get download`` through the host's package sources, which may be a local mirror; cached), as upstream bases
it on a distroless image with iptables.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from imagebuilder.core import progress
from imagebuilder.core.errors import ExternalError, InputError, did_you_mean
from imagebuilder.core.files import atomic_write, partial_prefix, run_checked, sha256_file
from imagebuilder.core.hostinfo import require_tools
from imagebuilder.core.paths import cache_root
from imagebuilder.core.progress import Say, silent
from imagebuilder.core.safepath import safe_join
from imagebuilder.release.catalog import RUNTIME_VERSION, Runtime, load_catalog, runtime_problem
from imagebuilder.release.imagearchive import Entry, ImageSpec, docker_archive, layer_tar, tree_entries
from imagebuilder.release.k8sversion import parse_version
from imagebuilder.release.manifest import archive_asset, image_asset
from imagebuilder.release.profile import load_profile

#: the release number of what this tool lays out: bump it when a release's content changes (2: kube-proxy's image
#: holds iptables; 3: the release carries its container runtime)
RECIPE = 3
#: how the components are built, part of every component's cache key: bump it when a component is built otherwise
#: (other flags), so nothing built the old way is reused
BUILD_RECIPE = 1
#: containerd as its Makefile builds a static release (``make STATIC=1``), btrfs left out (it needs cgo)
CONTAINERD_TAGS = "urfave_cli_no_docs osusergo netgo static_build no_btrfs"
CONTAINERD_BINARIES = {"containerd": "cmd/containerd", "ctr": "cmd/ctr",
                       "containerd-shim-runc-v2": "cmd/containerd-shim-runc-v2"}  # fmt: skip
#: runc as ``make static`` builds it: cgo (its nsenter is C), seccomp through libseccomp, linked statically
RUNC_TAGS = "seccomp urfave_cli_no_docs netgo osusergo"
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

    def run(self, *args: str, cwd: Path, what: str, log: Path, env: Mapping[str, str] | None = None) -> int:
        """Run ``go args`` in ``cwd``; its output goes to ``log``, each package it compiles (``-v``) is progress."""
        seen = {"packages": 0, "said": 0.0}

        def pick(line: str) -> str | None:  # one report every few seconds, not one per package
            seen["packages"] += 1
            if not line or time.monotonic() - seen["said"] < 5:
                return None
            seen["said"] = time.monotonic()
            return f"{what}: {int(seen['packages'])} packages so far ({line[:60]})"

        with log.open("a") as fh:
            status = progress.follow([self.go, *args], env={**self.env, **(env or {})}, log=fh, redact=lambda s: s,
                                     cwd=cwd, say=self.say, pick=pick)  # fmt: skip
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


@dataclass(frozen=True)
class Recipe:
    """How a wrapper build compiles: build tags, extra ``-ldflags`` (version stamps), extra environment (cgo)."""

    tags: str = ""
    ldflags: str = ""
    env: tuple[tuple[str, str], ...] = ()

    def key(self) -> dict[str, Any]:
        """The part of a component's cache key this recipe adds (nothing for the plain recipe, so the components
        built before recipes existed stay cached)."""
        return {"recipe_flags": [self.tags, self.ldflags, list(self.env)]} if self != Recipe() else {}


def _wrapper_build(
    go: _Go, folder: Path, module: str, version: str, packages: Mapping[str, str], recipe: Recipe = Recipe()
) -> None:
    """Build ``packages`` (output name -> package path) of ``module@version`` through a wrapper module, into
    ``folder/bin``: the module's own replace directives do not apply there, as ``go install`` would insist."""
    work = folder / "wrapper"
    work.mkdir()
    log = folder / "build.log"
    (work / "go.mod").write_text("module image-builder.invalid/wrapper\n\ngo 1.21\n")
    go.run("get", f"{module}@{version}", cwd=work, what=f"{module}@{version}", log=log)
    tags = ["-tags", recipe.tags] if recipe.tags else []
    for out, package in packages.items():
        go.run("build", "-v", "-trimpath", *tags, f"-ldflags=-s -w {recipe.ldflags}".strip(), "-o",
               str(folder / "bin" / out), package, cwd=work, what=f"{out} {version}", log=log,
               env=dict(recipe.env))  # fmt: skip
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
        # a staging module the proxy does not serve at this version (k8s.io/sample-cli-plugin v0.36.3) stays on the
        # tree's own copy: none of the binaries built here imports it, only tests do
        staging = [m for m in staging if m not in _unserved(go, fetch, [f"{m}@v0.{minor}.{patch}" for m in staging])]
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


def _unserved(go: _Go, cwd: Path, modules: list[str]) -> set[str]:
    """The module paths of ``modules`` (``path@version``) the Go module proxy does not serve."""
    proc = subprocess.run([go.go, "mod", "download", "-json", *modules], cwd=cwd, env=go.env, capture_output=True,
                          text=True, check=False)  # fmt: skip
    decoder, text, at, missing = json.JSONDecoder(), proc.stdout, 0, set()
    while at < len(text):
        while at < len(text) and text[at].isspace():
            at += 1
        if at >= len(text):
            break
        info, at = decoder.raw_decode(text, at)
        if isinstance(info, dict) and info.get("Error"):
            missing.add(str(info.get("Path")))
    if proc.returncode != 0 and not missing:
        raise ExternalError(f"go mod download failed: {proc.stderr.strip()[-400:]}",
                            hint="check the Go module proxy is reachable (GOPROXY)")  # fmt: skip
    return missing


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


def _go_component(
    go: _Go, name: str, module: str, version: str, packages: Mapping[str, str], recipe: Recipe = Recipe()
) -> Path:
    folder = source_cache() / f"{name}-{version}"
    key = {"recipe": BUILD_RECIPE, "module": module, "version": version, "go": go.version, "packages": dict(packages),
           **recipe.key()}  # fmt: skip

    def build(_: Path) -> None:
        go.say(f"{name} {version}: building {module}@{version}")
        _wrapper_build(go, folder, module, version, packages, recipe)

    return _cached(folder, key, tuple(packages), build)


def _module_file(go: _Go, module: str, version: str, path: str) -> str:
    """One file of ``module@version`` as the Go module proxy serves it (its module cache keeps it)."""
    scratch = Path(tempfile.mkdtemp(prefix="module-"))
    try:
        (scratch / "go.mod").write_text("module image-builder.invalid/files\n\ngo 1.21\n")
        info = json.loads(go.output("mod", "download", "-json", f"{module}@{version}", cwd=scratch))
    finally:
        shutil.rmtree(scratch)
    if not isinstance(info, dict) or "Dir" not in info:
        raise ExternalError(f"the Go module proxy has no {module}@{version}: {str(info.get('Error', ''))[:200]}",
                            hint="check the version exists (go list -m -versions " + module + ")")  # fmt: skip
    target = Path(info["Dir"]) / path
    if not target.is_file():
        raise ExternalError(f"{module}@{version} has no {path}: its source layout changed")
    return target.read_text()


def _runc_version(go: _Go, containerd: str) -> str:
    """The runc this containerd release pins (its ``script/setup/runc-version``), read once and remembered."""
    remembered = source_cache() / f"runc-for-containerd-{containerd}.txt"
    if remembered.is_file():
        return remembered.read_text().strip()
    pinned = _module_file(go, containerd_module(containerd), containerd,
                          "script/setup/runc-version").strip()  # fmt: skip
    if not re.fullmatch(r"v?[0-9]+\.[0-9]+\.[0-9]+(-rc\.[0-9]+)?", pinned):
        raise ExternalError(f"containerd {containerd} pins runc {pinned[:40]!r}: not a version this tool knows")
    version = pinned if pinned.startswith("v") else f"v{pinned}"
    with atomic_write(remembered) as fh:
        fh.write(version + "\n")
    return version


#: containerd's module path by major version (2.x moved to /v2)
CONTAINERD_MODULE = {1: "github.com/containerd/containerd", 2: "github.com/containerd/containerd/v2"}


def containerd_module(version: str) -> str:
    """The module path of containerd ``version`` (v2.3.1 -> github.com/containerd/containerd/v2)."""
    module = CONTAINERD_MODULE.get(int(version.lstrip("v").split(".")[0]))
    if module is None:
        raise ExternalError(f"containerd {version}: this tool builds containerd 1.x and 2.x only")
    return module


@dataclass(frozen=True)
class RuntimeBuild:
    """The container runtime built from source: containerd (with its unit), the runc it pins, crictl."""

    containerd: str
    runc: str
    crictl: str
    containerd_bin: Path
    runc_bin: Path
    crictl_bin: Path
    unit: str


def _runtime(go: _Go, containerd: str, crictl: str) -> RuntimeBuild:
    module = containerd_module(containerd)
    values = (("Version", containerd), ("Revision", f"{DISTRO}-{containerd}"), ("Package", module))
    stamp = " ".join(f"-X {module}/version.{k}={v}" for k, v in values)
    containerd_bin = _go_component(go, "containerd", module, containerd,
                                   {o: f"{module}/{p}" for o, p in CONTAINERD_BINARIES.items()},
                                   Recipe(CONTAINERD_TAGS, stamp))  # fmt: skip
    runc = _runc_version(go, containerd)
    runc_bin = _go_component(go, "runc", "github.com/opencontainers/runc", runc,
                             {"runc": "github.com/opencontainers/runc"},
                             Recipe(RUNC_TAGS, f"-X main.gitCommit={DISTRO}-{runc} -extldflags -static",
                                    (("CGO_ENABLED", "1"),)))  # fmt: skip
    crictl_bin = _go_component(
        go,
        "crictl",
        "sigs.k8s.io/cri-tools",
        crictl,
        {"crictl": "sigs.k8s.io/cri-tools/cmd/crictl"},
        Recipe(ldflags=f"-X sigs.k8s.io/cri-tools/pkg/version.Version={crictl.lstrip('v')}"),
    )
    unit = _module_file(go, module, containerd, "containerd.service")
    if "ExecStart=/usr/local/bin/containerd" not in unit:
        raise ExternalError(f"containerd {containerd}'s containerd.service does not start /usr/local/bin/containerd")
    return RuntimeBuild(containerd, runc, crictl, containerd_bin, runc_bin, crictl_bin, unit)


#: where the runtime tarball puts each file (extracted at /, as the reference's and cri-containerd's tarballs are)
def runtime_tarball(runtime: RuntimeBuild) -> bytes:
    files = {f"usr/local/bin/{name}": Entry((runtime.containerd_bin / name).read_bytes(), 0o755)
             for name in CONTAINERD_BINARIES}  # fmt: skip
    files["usr/local/sbin/runc"] = Entry((runtime.runc_bin / "runc").read_bytes(), 0o755)
    files["etc/systemd/system/containerd.service"] = Entry(runtime.unit.encode(), 0o644)
    return gzip.compress(layer_tar(files), mtime=0)


def needed_tools() -> tuple[str, ...]:
    """The host tools a build needs: Go and gcc always (Go checks every cache hit's inputs; runc links with gcc),
    pkg-config for runc's libseccomp, apt-get and dpkg-deb while kube-proxy's iptables is not cached yet. The dry
    run asks for the same."""
    cached = (source_cache() / "iptables-debian" / "bin" / "usr/sbin/xtables-nft-multi").is_file()
    return ("go", "gcc", "pkg-config") if cached else ("go", "gcc", "pkg-config", "apt-get", "dpkg-deb")


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


def release_runtime(minor: int, containerd: str | None = None) -> Runtime:
    """The runtime a release of Kubernetes 1.``minor`` carries: its line's (config/release-channels.yaml), with
    ``containerd`` instead of the line's when given. Exit 2 when that containerd cannot run this Kubernetes."""
    runtime = load_catalog().runtime_for_minor(minor)
    if containerd is not None:
        if not RUNTIME_VERSION.fullmatch(containerd):
            raise InputError(f"{containerd[:40]!r} is not a containerd version", field="--containerd",
                             expected="a release tag like v2.3.1")  # fmt: skip
        runtime = dataclasses.replace(runtime, containerd=containerd)
    problem = runtime_problem(runtime.containerd, minor)
    if problem:
        raise InputError(problem, field="--containerd", expected=f"containerd v2.x for Kubernetes 1.{minor}")
    return runtime


#: what ``go list -m`` says of a version the proxy does not serve (as opposed to a proxy it cannot reach)
_NOT_SERVED = re.compile(
    r"404 Not Found|410 Gone|403 Forbidden|not available|unknown revision|invalid version|no matching versions"
)


def check_published(module: str, version: str, field: str, cached_as: str) -> None:
    """Exit 2 before anything is built when the Go module proxy does not serve ``module@version`` (a version that
    was never released, or a typo): ``go list -m module@version`` asks for that version's ``.info``, one request
    answered in well under a second. The proxy's version list is not asked first: it is not exhaustive (this
    machine's proxy lists containerd v2.3.4 .. v2.3.7 and serves v2.3.1 too); it only names the close ones when the
    version is not served. A version built before (the cache's ``<cached_as>-<version>``) needs no proxy."""
    if (source_cache() / f"{cached_as}-{version}" / "inputs.json").is_file():
        return
    go = require_tools("go")["go"]
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": os.environ.get("GOTOOLCHAIN") or "auto"}

    def ask(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([go, "list", "-m", *args], capture_output=True, text=True, env=env,
                              cwd=tempfile.gettempdir(), timeout=120, check=False)  # fmt: skip

    proc = ask(f"{module}@{version}")
    if proc.returncode == 0:
        return
    if not _NOT_SERVED.search(proc.stderr):
        raise ExternalError(f"asking the Go module proxy for {module} {version} failed: "
                            f"{proc.stderr.strip()[-300:]}", hint="check the proxy is reachable (GOPROXY)")  # fmt: skip
    listed = ask("-versions", module)
    versions = listed.stdout.split()[1:] if listed.returncode == 0 else []
    close = [v for v in versions if v.rsplit(".", 1)[0] == version.rsplit(".", 1)[0]] or versions[-5:]
    raise InputError(
        f"{module} {version} is not a published release (the Go module proxy does not serve it)"
        f"{did_you_mean(version, versions)}",
        field=field,
        expected="one of " + ", ".join(close[-6:]) if close else "a published release tag",
    )


def build_runtime(containerd: str, crictl: str, *, say: Say = silent) -> RuntimeBuild:
    """The container runtime alone, built (or taken from the cache) as :func:`build_release` builds a line's:
    containerd ``containerd`` with the runc it pins, and crictl ``crictl``."""
    for what, value in (("--containerd", containerd), ("--crictl", crictl)):
        if not RUNTIME_VERSION.fullmatch(value):
            raise InputError(f"{value[:40]!r} is not a version", field=what, expected="a release tag like v2.3.1")
    return _runtime(_Go(say), containerd, crictl)


def build_release(
    kubernetes: str,
    dest: Path,
    *,
    base_url: str = DEFAULT_BASE_URL,
    containerd: str | None = None,
    say: Say = silent,
) -> SourceRelease:
    """Build (or take from the cache) every component of ``kubernetes`` and lay the release out under ``dest``."""
    version, minor, patch = parse_version(kubernetes)
    runtime_versions = release_runtime(minor, containerd)
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
    runtime = _runtime(go, runtime_versions.containerd, runtime_versions.crictl)
    crictl_version, crictl = runtime.crictl, runtime.crictl_bin
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
                                                       "cri-tools": [], "containerd": [], "runc": []}  # fmt: skip
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

        containerd_source = f"{containerd_module(runtime.containerd)}@{runtime.containerd}"
        runc_source = f"github.com/opencontainers/runc@{runtime.runc}"
        containerd_name = f"containerd-{runtime.containerd}-linux-amd64.tar.gz"
        containerd_tgz = runtime_tarball(runtime)
        url = f"{base}/containerd/{runtime.containerd}/{containerd_name}"
        _write(out, url, containerd_tgz)
        components["containerd"].append(_asset(
            containerd_name, url, containerd_tgz,
            f"containerd tarball for linux/amd64 from {containerd_source} with runc from {runc_source} and "
            "containerd's systemd unit (extracted at /)"))  # fmt: skip
        runc_url = f"{base}/runc/{runtime.runc}/bin/linux/amd64/runc"
        runc_data = (runtime.runc_bin / "runc").read_bytes()
        _write(out, runc_url, runc_data)
        components["runc"].append(_asset("bin/linux/amd64/runc", runc_url, runc_data,
                                         f"runc binary for linux/amd64 from {runc_source}"))  # fmt: skip

        tags = {"kubernetes": version, "etcd": etcd_version, "coredns": coredns_version,
                "cni-plugins": CNI_PLUGINS_VERSION, "cri-tools": crictl_version, "containerd": runtime.containerd,
                "runc": runtime.runc}  # fmt: skip
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
    folders = (kube, etcd, etcdctl, coredns, crictl, cni, iptables_root, runtime.containerd_bin, runtime.runc_bin)
    key = {"recipe": RECIPE, "base_url": base_url, "inputs": [(f.parent / "inputs.json").read_text() for f in folders]}
    say(f"laying out release kubernetes-{channel}-{DISTRO}-{RECIPE} under {dest}")
    _publish(_cached(source_cache() / f"release-{version}", key, (rel,), lay_out), dest)
    built = (
        Component("kubernetes", version, k8s_source, kube),
        Component("etcd", etcd_version, etcd_source, etcd),
        Component("coredns", coredns_version, coredns_source, coredns),
        Component("cri-tools", crictl_version, crictl_source, crictl),
        Component("cni-plugins", CNI_PLUGINS_VERSION, f"{cni_module}@{CNI_PLUGINS_VERSION}", cni),
        Component(
            "containerd",
            runtime.containerd,
            f"{containerd_module(runtime.containerd)}@{runtime.containerd}",
            runtime.containerd_bin,
        ),
        Component("runc", runtime.runc, f"github.com/opencontainers/runc@{runtime.runc}", runtime.runc_bin),
    )
    path = safe_join(dest, urlsplit(url).path.lstrip("/"))
    return SourceRelease(channel, RECIPE, version, url, path, dest, images, built)


__all__ = [
    "DEFAULT_BASE_URL",
    "RuntimeBuild",
    "SourceRelease",
    "build_release",
    "build_runtime",
    "kubeadm_images",
    "parse_version",
]
