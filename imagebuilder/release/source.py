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
from imagebuilder.core.arch import ARCHES, Arch
from imagebuilder.core.errors import ExternalError, InputError, did_you_mean
from imagebuilder.core.files import atomic_write, held, partial_prefix, run_checked, sha256_file
from imagebuilder.core.hostinfo import require_tools, tool_version
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
CNI_MODULE = "github.com/containernetworking/plugins"
#: the version every plugin says (``bridge version``), stamped as upstream's scripts/release.sh does
CNI_STAMP = f"-X {CNI_MODULE}/pkg/utils/buildversion.BuildVersion={CNI_PLUGINS_VERSION}"
CNI_PLUGINS = ("main/bridge", "main/host-device", "main/ipvlan", "main/loopback", "main/macvlan", "main/ptp",
               "main/vlan", "ipam/host-local", "ipam/static", "meta/bandwidth", "meta/firewall", "meta/portmap",
               "meta/sbr", "meta/tuning", "meta/vrf")  # fmt: skip

#: Debian's packages kube-proxy's image is made of besides its binary: iptables and every library it links
IPTABLES_PACKAGES = ("iptables", "libip4tc2", "libip6tc2", "libxtables12", "libmnl0", "libnetfilter-conntrack3",
                     "libnfnetlink0", "libnftnl11", "libc6", "libgcc-s1")  # fmt: skip
#: Debian's packages runc is linked with for another architecture: libseccomp's static library and headers
SECCOMP_PACKAGES = ("libseccomp-dev", "libseccomp2")
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
    components: tuple[Component, ...]  # this host's architecture's (or the first built)
    arches: tuple[str, ...] = ("amd64",)


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


def _arch_folder(name: str, target: Arch) -> Path:
    """A component's cache folder: ``name`` for amd64 (as before issue 46, so those builds stay cached), with the
    architecture after it for another."""
    return source_cache() / (name if target.name == "amd64" else f"{name}-{target.name}")


def _arch_key(target: Arch) -> dict[str, Any]:
    """The architecture's part of a component's cache key (none for amd64: the keys written before it stay valid)."""
    return {} if target.name == "amd64" else {"arch": target.name}


def cross_compiler(target: Arch) -> str:
    """The C compiler that builds for ``target`` on this host: gcc natively, Debian's cross gcc otherwise."""
    return "gcc" if target.native else f"{target.machine}-linux-gnu-gcc"


def _compiler_path(target: Arch) -> str:
    """Where :func:`cross_compiler` is (exit 1 naming it when it is not installed)."""
    name = cross_compiler(target)
    return require_tools(name)[name]


def _seccomp_library(target: Arch) -> str:
    """libseccomp's static library in the unpacked Debian root of ``target``."""
    return f"usr/lib/{_multiarch(target)}/libseccomp.a"


#: the file that says kube-proxy's iptables root is whole
IPTABLES_MARK = "usr/sbin/xtables-nft-multi"


def cached_output(folder: Path, key: dict[str, Any], outputs: tuple[str, ...]) -> Path | None:
    """``folder/bin`` when a build of the same ``key`` left every one of ``outputs`` there, else None."""
    stamp, bin_dir = folder / "inputs.json", folder / "bin"
    want = json.dumps(key, sort_keys=True)
    built = stamp.is_file() and stamp.read_text() == want and all((bin_dir / o).is_file() for o in outputs)
    return bin_dir if built else None


def cached_build(folder: Path, key: dict[str, Any], outputs: tuple[str, ...], build: Callable[[Path], None]) -> Path:
    """``folder/bin`` holding ``outputs``, built by ``build(bin_dir)`` unless a build of the same ``key`` is there.
    One builder at a time (``<folder>.lock``): another run asking meanwhile waits, then takes what it built."""
    found = cached_output(folder, key, outputs)
    if found is not None:
        return found  # built before from the same inputs
    with held(folder.with_name(f"{folder.name}.lock")):
        found = cached_output(folder, key, outputs)
        if found is not None:
            return found  # built meanwhile, by the run that held the lock
        _fresh(folder)
        bin_dir = folder / "bin"
        bin_dir.mkdir()
        build(bin_dir)
        missing = [o for o in outputs if not (bin_dir / o).is_file()]
        if missing:
            raise ExternalError(f"the build of {folder.name} made no {', '.join(missing)}")
        with atomic_write(folder / "inputs.json") as fh:
            fh.write(json.dumps(key, sort_keys=True))
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


def _kubernetes(go: _Go, version: str, minor: int, patch: int, target: Arch) -> Path:
    folder = _arch_folder(f"kubernetes-{version}", target)
    key = {"recipe": BUILD_RECIPE, "module": "k8s.io/kubernetes", "version": version, "go": go.version,
           **_arch_key(target)}  # fmt: skip

    def build(bin_dir: Path) -> None:
        go.say(f"kubernetes {version} ({target.name}): building from source (about 7 minutes on 2 cores with an "
               "empty Go cache)")  # fmt: skip
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
               *(f"./cmd/{b}" for b in KUBE_BINARIES), cwd=src, what=f"kubernetes {version}", log=log,
               env={"GOARCH": target.name})  # fmt: skip
        # the pause container's binary: upstream's C source, static, as build/pause/Makefile compiles it (with the
        # cross compiler for another architecture, as its Makefile does)
        pause_version = _pause_version(src)
        gcc = _compiler_path(target)
        run_checked(gcc, "-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{pause_version}-{DISTRO}",
                    "-o", str(bin_dir / "pause"), str(src / "build/pause/linux/pause.c"))  # fmt: skip
        shutil.rmtree(src)
        shutil.rmtree(fetch)

    return cached_build(folder, key, (*KUBE_BINARIES, "pause"), build)


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
    go: _Go,
    name: str,
    module: str,
    version: str,
    packages: Mapping[str, str],
    recipe: Recipe = Recipe(),
    target: Arch = ARCHES["amd64"],
) -> Path:
    folder = _arch_folder(f"{name}-{version}", target)
    key = {"recipe": BUILD_RECIPE, "module": module, "version": version, "go": go.version, "packages": dict(packages),
           **recipe.key(), **_arch_key(target)}  # fmt: skip
    recipe = dataclasses.replace(recipe, env=(*recipe.env, ("GOARCH", target.name)))

    def build(_: Path) -> None:
        go.say(f"{name} {version} ({target.name}): building {module}@{version}")
        _wrapper_build(go, folder, module, version, packages, recipe)

    return cached_build(folder, key, tuple(packages), build)


def module_dir(module: str, version: str, go: _Go | None = None) -> Path:
    """``module@version``'s folder in the Go module cache (read-only), downloaded from the proxy when not there."""
    go = go or _Go(silent)
    scratch = Path(tempfile.mkdtemp(prefix="module-"))
    try:
        (scratch / "go.mod").write_text("module image-builder.invalid/files\n\ngo 1.21\n")
        info = json.loads(go.output("mod", "download", "-json", f"{module}@{version}", cwd=scratch))
    finally:
        shutil.rmtree(scratch)
    if not isinstance(info, dict) or "Dir" not in info:
        raise ExternalError(f"the Go module proxy has no {module}@{version}: {str(info.get('Error', ''))[:200]}",
                            hint="check the version exists (go list -m -versions " + module + ")")  # fmt: skip
    return Path(info["Dir"])


def _module_file(go: _Go, module: str, version: str, path: str) -> str:
    """One file of ``module@version`` as the Go module proxy serves it (its module cache keeps it)."""
    target = module_dir(module, version, go) / path
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


def _cgo_env(target: Arch, say: Say) -> tuple[tuple[str, str], ...]:
    """cgo's environment for runc (libseccomp, found by pkg-config): the host's for its own architecture; for another,
    Debian's cross gcc and that architecture's libseccomp unpacked from its packages (pkg-config looks there only)."""
    if target.native:
        return (("CGO_ENABLED", "1"),)
    root = _debian_root("libseccomp-debian", SECCOMP_PACKAGES, {}, (_seccomp_library(target),), target, say)
    return (("CGO_ENABLED", "1"), ("CC", _compiler_path(target)),
            ("PKG_CONFIG_LIBDIR", str(root / "usr/lib" / _multiarch(target) / "pkgconfig")),
            ("PKG_CONFIG_SYSROOT_DIR", str(root)))  # fmt: skip


def _runtime(go: _Go, containerd: str, crictl: str, target: Arch = ARCHES["amd64"]) -> RuntimeBuild:
    module = containerd_module(containerd)
    values = (("Version", containerd), ("Revision", f"{DISTRO}-{containerd}"), ("Package", module))
    stamp = " ".join(f"-X {module}/version.{k}={v}" for k, v in values)
    containerd_bin = _go_component(go, "containerd", module, containerd,
                                   {o: f"{module}/{p}" for o, p in CONTAINERD_BINARIES.items()},
                                   Recipe(CONTAINERD_TAGS, stamp), target)  # fmt: skip
    runc = _runc_version(go, containerd)
    runc_bin = _go_component(go, "runc", "github.com/opencontainers/runc", runc,
                             {"runc": "github.com/opencontainers/runc"},
                             Recipe(RUNC_TAGS, f"-X main.gitCommit={DISTRO}-{runc} -extldflags -static",
                                    _cgo_env(target, go.say)), target)  # fmt: skip
    crictl_bin = _go_component(
        go,
        "crictl",
        "sigs.k8s.io/cri-tools",
        crictl,
        {"crictl": "sigs.k8s.io/cri-tools/cmd/crictl"},
        Recipe(ldflags=f"-X sigs.k8s.io/cri-tools/pkg/version.Version={crictl.lstrip('v')}"),
        target,
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


def needed_tools(arches: tuple[str, ...] = ("amd64",)) -> tuple[str, ...]:
    """The host tools a build of ``arches`` needs: Go and each architecture's C compiler always (Go checks every
    cache hit's inputs; the pause binary and runc are C; another architecture's is Debian's cross gcc), pkg-config
    for runc's libseccomp, apt-get and dpkg-deb while Debian's packages of an architecture are not cached yet. The
    dry run asks for the same."""
    tools = ["go", "pkg-config"]
    for name in arches:
        target = ARCHES[name]
        tools.append(cross_compiler(target))
        roots = [_arch_folder("iptables-debian", target) / "bin" / IPTABLES_MARK]
        if not target.native:
            roots.append(_arch_folder("libseccomp-debian", target) / "bin" / _seccomp_library(target))
        if not all(r.is_file() for r in roots):
            tools += ["apt-get", "dpkg-deb"]
    return tuple(dict.fromkeys(tools))


def check_host(arches: tuple[str, ...]) -> None:
    """Exit 1 naming what this host lacks to build ``arches``: the tools, and for a release without this host's own
    architecture, the emulation its kubeadm runs under (``kubeadm config images list`` names the images)."""
    cross = [cross_compiler(ARCHES[a]) for a in arches if not ARCHES[a].native]
    missing = [c for c in cross if tool_version(c, ()) is None]
    if missing:
        packages = ", ".join(f"gcc-{t.removesuffix('-gcc')}" for t in missing)
        raise ExternalError(f"{', '.join(missing)} (the cross compiler) is not installed",
                            hint=f"run ./scripts/setup.sh (Debian packages {packages})")  # fmt: skip
    require_tools(*needed_tools(arches))
    if not any(ARCHES[a].native for a in arches):
        ARCHES[arches[0]].require_emulation()


def _multiarch(target: Arch) -> str:
    """Debian's multiarch folder name of ``target`` (``x86_64-linux-gnu``, ``aarch64-linux-gnu``)."""
    return f"{target.machine}-linux-gnu"


def _apt_download(packages: tuple[str, ...], target: Arch, folder: Path) -> None:
    """``apt-get download`` of ``packages`` into ``folder`` through the host's package sources (which may be a local
    mirror). Another architecture's come through an apt state of that architecture alone, kept beside them: the
    host's dpkg is not told of a foreign architecture, nothing is installed."""
    apt = require_tools("apt-get")["apt-get"]
    if target.native:
        run_checked(apt, "download", *packages, cwd=str(folder))
        return
    state = folder / "apt-state"
    for sub in ("lists/partial", "cache/archives/partial"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    (state / "status").touch()
    options = [f"-oDir::State::Lists={state / 'lists'}", f"-oDir::Cache={state / 'cache'}",
               f"-oDir::State::status={state / 'status'}", f"-oAPT::Architecture={target.name}",
               f"-oAPT::Architectures::={target.name}"]  # fmt: skip
    try:
        run_checked(apt, "-q", *options, "update", timeout=600)
        run_checked(apt, "-q", *options, "download", *packages, cwd=str(folder))
    finally:
        shutil.rmtree(state, ignore_errors=True)


def _debian_root(
    name: str, packages: tuple[str, ...], links: Mapping[str, str], outputs: tuple[str, ...], target: Arch, say: Say
) -> Path:
    """Debian's ``packages`` of ``target`` unpacked into one folder (``dpkg-deb -x``), with ``links``; cached."""
    folder = _arch_folder(name, target)
    key = {"recipe": BUILD_RECIPE, "packages": packages, "links": links, **_arch_key(target)}

    def build(root: Path) -> None:
        dpkg_deb = require_tools("dpkg-deb")["dpkg-deb"]
        debs = folder / "debs"
        debs.mkdir()
        say(f"{name} ({target.name}): apt-get download {' '.join(packages)}")
        _apt_download(packages, target, debs)
        for deb in sorted(debs.glob("*.deb")):
            run_checked(dpkg_deb, "-x", str(deb), str(root))
        for link, link_target in links.items():
            (root / link).unlink(missing_ok=True)
            (root / link).symlink_to(link_target)
        (folder / "packages.txt").write_text("".join(f"{d.name}\n" for d in sorted(debs.glob("*.deb"))))
        shutil.rmtree(debs)

    return cached_build(folder, key, outputs, build)


def _iptables(say: Say, target: Arch = ARCHES["amd64"]) -> Path:
    """Debian's iptables and its libraries unpacked into one folder, with the names kube-proxy runs."""
    return _debian_root("iptables-debian", IPTABLES_PACKAGES, IPTABLES_LINKS,
                        (IPTABLES_MARK, *IPTABLES_LINKS), target, say)  # fmt: skip


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
    arch: str = "amd64",
) -> bytes:
    """An image of ``files`` (path in the image -> binary) on the base layer, and ``under`` it a layer of its own."""
    layer = {path: Entry(binary.read_bytes(), 0o755) for path, binary in files.items()}
    labels = {
        "org.opencontainers.image.description": LABEL,
        "org.opencontainers.image.source": source,
        "org.opencontainers.image.version": _tag(ref),
    }
    layers = (_base_layer(), *((under,) if under else ()), layer)
    return docker_archive(ImageSpec(ref, layers, (entrypoint,), labels, user, arch))


def _asset(name: str, url: str, data: bytes, description: str, arch: str) -> dict[str, Any]:
    return archive_asset(name, url, data, f"{description}, {LABEL}", arch)


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
        if int(containerd.lstrip("v").split(".")[0]) not in CONTAINERD_MODULE:
            raise InputError(f"containerd {containerd}: this tool builds containerd 1.x and 2.x only",
                             field="--containerd", expected="a containerd v1.x or v2.x release tag")  # fmt: skip
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


@dataclass(frozen=True)
class _Built:
    """One architecture's components (each a cached folder of binaries)."""

    target: Arch
    kube: Path
    etcd: Path
    etcdctl: Path
    coredns: Path
    cni: Path
    runtime: RuntimeBuild
    iptables: Path

    def folders(self) -> tuple[Path, ...]:
        runtime = self.runtime
        return (self.kube, self.etcd, self.etcdctl, self.coredns, runtime.crictl_bin, self.cni, self.iptables,
                runtime.containerd_bin, runtime.runc_bin)  # fmt: skip


def _build_arch(
    go: _Go, version: str, minor: int, patch: int, runtime_versions: Runtime, target: Arch, images: dict[str, str]
) -> _Built:
    """Every component of the release for ``target`` (``images``: what kubeadm asks for, filled in by the first)."""
    kube = _kubernetes(go, version, minor, patch, target)
    if not images:
        images.update(kubeadm_images(kube / "kubeadm", version))
    etcd_version = "v" + _tag(images["etcd"]).split("-")[0]
    coredns_version = _tag(images["coredns"])
    etcd = _go_component(go, "etcd", "go.etcd.io/etcd/server/v3", etcd_version,
                         {"etcd": "go.etcd.io/etcd/server/v3"}, target=target)  # fmt: skip
    etcdctl = _go_component(go, "etcdctl", "go.etcd.io/etcd/etcdctl/v3", etcd_version,
                            {"etcdctl": "go.etcd.io/etcd/etcdctl/v3"}, target=target)  # fmt: skip
    coredns = _go_component(go, "coredns", "github.com/coredns/coredns", coredns_version,
                            {"coredns": "github.com/coredns/coredns"}, target=target)  # fmt: skip
    runtime = _runtime(go, runtime_versions.containerd, runtime_versions.crictl, target)
    cni = _go_component(go, "cni-plugins", CNI_MODULE, CNI_PLUGINS_VERSION,
                        {p.rsplit("/", 1)[1]: f"{CNI_MODULE}/plugins/{p}" for p in CNI_PLUGINS},
                        Recipe(ldflags=CNI_STAMP), target)  # fmt: skip
    return _Built(target, kube, etcd, etcdctl, coredns, cni, runtime, _iptables(go.say, target))


def build_release(
    kubernetes: str,
    dest: Path,
    *,
    base_url: str = DEFAULT_BASE_URL,
    containerd: str | None = None,
    say: Say = silent,
    arches: tuple[str, ...] = ("amd64",),
) -> SourceRelease:
    """Build (or take from the cache) every component of ``kubernetes`` for each of ``arches`` (names the caller
    checked) and lay the release out under ``dest``: one manifest listing every architecture's assets, as the
    distro's do."""
    version, minor, patch = parse_version(kubernetes)
    runtime_versions = release_runtime(minor, containerd)
    go = _Go(say)
    images: dict[str, str] = {}
    # this host's own architecture first: its kubeadm names the images without emulation
    order = sorted(dict.fromkeys(arches), key=lambda a: not ARCHES[a].native)
    built = {a: _build_arch(go, version, minor, patch, runtime_versions, ARCHES[a], images) for a in order}
    first = built[order[0]]
    runtime = first.runtime
    etcd_version = "v" + _tag(images["etcd"]).split("-")[0]
    coredns_version = _tag(images["coredns"])
    crictl_version = runtime.crictl
    channel = f"1-{minor}"
    k8s_source = f"k8s.io/kubernetes@{version}"
    etcd_source = f"go.etcd.io/etcd/server/v3@{etcd_version}"
    coredns_source = f"github.com/coredns/coredns@{coredns_version}"
    crictl_source = f"sigs.k8s.io/cri-tools@{crictl_version}"
    containerd_source = f"{containerd_module(runtime.containerd)}@{runtime.containerd}"
    runc_source = f"github.com/opencontainers/runc@{runtime.runc}"

    def lay_out_arch(out: Path, b: _Built, components: dict[str, list[dict[str, Any]]]) -> None:
        """One architecture's files at their URLs' paths under ``out`` and its assets in ``components``."""
        arch = b.target.name
        base = f"{base_url.rstrip('/')}/kubernetes-{channel}/releases/{RECIPE}/artifacts"
        kube_base = f"{base}/kubernetes/{version}/bin/linux/{arch}"

        def add(component: str, name: str, url: str, data: bytes, description: str) -> None:
            _write(out, url, data)
            components[component].append(_asset(name, url, data, description, arch))

        for binary in KUBE_BINARIES:
            add("kubernetes", f"bin/linux/{arch}/{binary}", f"{kube_base}/{binary}", (b.kube / binary).read_bytes(),
                f"{binary} binary for linux/{arch} from {k8s_source}")  # fmt: skip
        image_files: dict[str, tuple[str, bytes, str]] = {}  # name -> (component, tar, url)
        iptables = tree_entries(b.iptables, skip=("usr/share",))
        for name in CONTROL_PLANE_IMAGES:
            under = iptables if name == "kube-proxy" else None
            tar = _image(images[name], {f"usr/local/bin/{name}": b.kube / name}, f"/usr/local/bin/{name}",
                         k8s_source, under=under, arch=arch)  # fmt: skip
            image_files[name] = ("kubernetes", tar, f"{kube_base}/{name}.tar")
        # upstream's pause image runs as 65535 and its binary sits at the root
        pause = _image(images["pause"], {"pause": b.kube / "pause"}, "/pause", f"{k8s_source} build/pause",
                       "65535:65535", arch=arch)  # fmt: skip
        image_files["pause"] = ("kubernetes", pause, f"{kube_base}/pause.tar")
        etcd_files = {"usr/local/bin/etcd": b.etcd / "etcd", "usr/local/bin/etcdctl": b.etcdctl / "etcdctl"}
        etcd_tar = _image(images["etcd"], etcd_files, "/usr/local/bin/etcd", etcd_source, arch=arch)
        image_files["etcd"] = ("etcd", etcd_tar, f"{base}/etcd/{etcd_version}/bin/linux/{arch}/etcd.tar")
        coredns_tar = _image(images["coredns"], {"coredns": b.coredns / "coredns"}, "/coredns", coredns_source,
                             arch=arch)  # fmt: skip
        image_files["coredns"] = ("coredns", coredns_tar,
                                  f"{base}/coredns/{coredns_version}/bin/linux/{arch}/coredns.tar")  # fmt: skip
        for name, (component, tar, url) in image_files.items():
            add(component, f"bin/linux/{arch}/{name}.tar", url, tar, f"{name} linux/{arch} image tar (docker-archive)")

        etcd_name = f"etcd-linux-{arch}-{etcd_version}.tar.gz"
        etcd_tgz = gzip.compress(layer_tar({
            f"etcd-{etcd_version}-linux-{arch}/etcd": Entry((b.etcd / "etcd").read_bytes(), 0o755),
            f"etcd-{etcd_version}-linux-{arch}/etcdctl": Entry((b.etcdctl / "etcdctl").read_bytes(), 0o755),
        }), mtime=0)  # fmt: skip
        add("etcd", etcd_name, f"{base}/etcd/{etcd_version}/{etcd_name}", etcd_tgz,
            f"etcd tarball for linux/{arch} from {etcd_source}")  # fmt: skip
        cni_name = f"cni-plugins-linux-{arch}-{CNI_PLUGINS_VERSION}.tar.gz"
        cni_tgz = gzip.compress(layer_tar({f"./{p.name}": Entry(p.read_bytes(), 0o755)
                                           for p in sorted(b.cni.iterdir())}), mtime=0)  # fmt: skip
        add("cni-plugins", cni_name, f"{base}/plugins/{CNI_PLUGINS_VERSION}/{cni_name}", cni_tgz,
            f"cni-plugins tarball for linux/{arch} from {CNI_MODULE}@{CNI_PLUGINS_VERSION}")  # fmt: skip
        crictl_name = f"crictl-{crictl_version}-linux-{arch}.tar.gz"
        crictl_tgz = gzip.compress(layer_tar({"crictl": Entry((b.runtime.crictl_bin / "crictl").read_bytes(),
                                                              0o755)}), mtime=0)  # fmt: skip
        add("cri-tools", crictl_name, f"{base}/cri-tools/{crictl_version}/{crictl_name}", crictl_tgz,
            f"crictl tarball for linux/{arch} from {crictl_source}")  # fmt: skip
        containerd_name = f"containerd-{runtime.containerd}-linux-{arch}.tar.gz"
        add("containerd", containerd_name, f"{base}/containerd/{runtime.containerd}/{containerd_name}",
            runtime_tarball(b.runtime),
            f"containerd tarball for linux/{arch} from {containerd_source} with runc from {runc_source} and "
            "containerd's systemd unit (extracted at /)")  # fmt: skip
        add(
            "runc",
            f"bin/linux/{arch}/runc",
            f"{base}/runc/{runtime.runc}/bin/linux/{arch}/runc",
            (b.runtime.runc_bin / "runc").read_bytes(),
            f"runc binary for linux/{arch} from {runc_source}",
        )

    def lay_out(out: Path) -> None:
        """The release's files at their URLs' paths under ``out``: binaries, tarballs, image tars, the manifest."""
        components: dict[str, list[dict[str, Any]]] = {"kubernetes": [], "etcd": [], "coredns": [], "cni-plugins": [],
                                                       "cri-tools": [], "containerd": [], "runc": []}  # fmt: skip
        for name in sorted(built, key=lambda a: list(ARCHES).index(a)):
            lay_out_arch(out, built[name], components)
        # an image asset names every architecture its tars are there for, once (the distro's are multi-arch)
        listed = tuple(sorted(built, key=lambda a: list(ARCHES).index(a)))
        for name in (*CONTROL_PLANE_IMAGES, "pause"):
            components["kubernetes"].append(image_asset(name, images[name], f"{name} container image, {LABEL}",
                                                        listed))  # fmt: skip
        for name in ("etcd", "coredns"):
            components[name].append(image_asset(name, images[name], f"{name} container image, {LABEL}", listed))
        tags = {"kubernetes": version, "etcd": etcd_version, "coredns": coredns_version,
                "cni-plugins": CNI_PLUGINS_VERSION, "cri-tools": crictl_version, "containerd": runtime.containerd,
                "runc": runtime.runc}  # fmt: skip
        name = f"kubernetes-{channel}-{DISTRO}-{RECIPE}"
        newest = max(p.stat().st_mtime for p in first.kube.iterdir())
        date = dt.datetime.fromtimestamp(newest, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
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
                "date": date,
            },
        }
        _write(out, manifest_url(base_url, channel), yaml.safe_dump(manifest, sort_keys=False).encode())

    # the laid-out release is cached too, by every component's inputs: a rerun only copies what the folder lacks
    url = manifest_url(base_url, channel)
    rel = urlsplit(url).path.lstrip("/")
    inputs = [(f.parent / "inputs.json").read_text() for a in order for f in built[a].folders()]
    key = {"recipe": RECIPE, "layout": 2, "arches": order, "base_url": base_url, "inputs": inputs}
    say(f"laying out release kubernetes-{channel}-{DISTRO}-{RECIPE} ({', '.join(order)}) under {dest}")
    layout = source_cache() / "-".join([f"release-{version}", *(a for a in order if a != "amd64")])
    _publish(cached_build(layout, key, (rel,), lay_out), dest)
    components = (
        Component("kubernetes", version, k8s_source, first.kube),
        Component("etcd", etcd_version, etcd_source, first.etcd),
        Component("coredns", coredns_version, coredns_source, first.coredns),
        Component("cri-tools", crictl_version, crictl_source, runtime.crictl_bin),
        Component("cni-plugins", CNI_PLUGINS_VERSION, f"{CNI_MODULE}@{CNI_PLUGINS_VERSION}", first.cni),
        Component("containerd", runtime.containerd, containerd_source, runtime.containerd_bin),
        Component("runc", runtime.runc, runc_source, runtime.runc_bin),
    )
    path = safe_join(dest, urlsplit(url).path.lstrip("/"))
    return SourceRelease(channel, RECIPE, version, url, path, dest, images, components, tuple(order))


__all__ = [
    "DEFAULT_BASE_URL",
    "RuntimeBuild",
    "SourceRelease",
    "build_release",
    "build_runtime",
    "kubeadm_images",
    "parse_version",
]
