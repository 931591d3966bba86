"""``image.diff``: what differs between two node images, in the terms a node cares about.

Why: the chroot engine and the Packer engine must make the same image from the same inputs, and a user moving a
build from one to the other (or from one release of this tool to the next) wants the proof. Both images are
mounted read-only (the journal is not replayed) and compared on what decides how a node behaves: the installed
packages and their versions, every file, link and directory under /etc (content, mode, owner), the systemd units
enabled there, the Kubernetes binaries and the images preloaded in containerd (name and digest). Two builds
legitimately differ in a few places that depend on when and how the build ran, not on its inputs; those are listed
in :data:`EXPECTED` with the reason, reported apart, and never hidden.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from imagebuilder.attest.packages import collect
from imagebuilder.core.arch import root_arch
from imagebuilder.core.disk import mounted_root, raw_view
from imagebuilder.core.errors import InputError
from imagebuilder.image.boltdb import containerd_images

#: differences two correct builds of the same inputs show, by path under /etc, with why. A VM build (Packer) boots
#: the image once: cloud-init creates the build user and the seal script deletes it, which leaves traces a chroot
#: build (no user, nothing booted) does not have
_SHADOW_BACKUP = (
    "shadow-utils' backup of the file before its last change: a VM build's last change removed its build user"
)
EXPECTED: dict[str, str] = {
    **{f"etc/{name}-": _SHADOW_BACKUP for name in ("passwd", "group", "shadow", "gshadow", "subuid", "subgid")},
    "etc/sudoers.d": "cloud-init set its mode (0750) when it wrote the build user's sudo rule in a VM build",
}
#: the Kubernetes binaries a node image carries
KUBERNETES_BINARIES = ("usr/bin/kubelet", "usr/bin/kubeadm", "usr/bin/kubectl")


@dataclass(frozen=True)
class Inventory:
    """What :func:`inventory` reads off a mounted image."""

    packages: dict[str, str]
    etc: dict[str, str]
    enabled_units: frozenset[str]
    kubernetes: dict[str, str]
    #: containerd's images (namespace k8s.io): name -> the digest it points at
    images: dict[str, str] = field(default_factory=dict)
    #: the container runtime's binaries: path -> sha256
    runtime: dict[str, str] = field(default_factory=dict)
    #: the architecture its programs are for (``/usr/bin/env``'s ELF machine), or "unknown"
    arch: str = "unknown"


@dataclass(frozen=True)
class Difference:
    kind: str  #: package, etc, unit, kubernetes, runtime (a runtime binary), image (a preloaded one)
    name: str
    a: str | None
    b: str | None
    expected: str | None = None  #: why two correct builds differ here (:data:`EXPECTED`), or None

    def __str__(self) -> str:
        why = f"  [expected: {self.expected}]" if self.expected else ""
        return f"{self.kind:<10} {self.name}: {self.a or '(absent)'}  |  {self.b or '(absent)'}{why}"


@dataclass
class Report:
    a: str
    b: str
    differences: list[Difference] = field(default_factory=list)

    @property
    def unexpected(self) -> list[Difference]:
        return [d for d in self.differences if d.expected is None]


def _packages(root: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Name -> version from the image's package database, and the runtime's binaries (path -> sha256), read by the
    SBOM's collector (one parser for both)."""
    if not ((root / "var/lib/dpkg/status").is_file() or (root / "var/lib/rpm").is_dir()):
        return {}, {}
    found = collect(root)
    return found.versions(), dict(found.runtime)


def _describe(path: Path) -> str:
    st = path.lstat()
    owner = f"{st.st_uid}:{st.st_gid}"
    mode = oct(stat.S_IMODE(st.st_mode))
    if stat.S_ISLNK(st.st_mode):
        return f"link -> {os.readlink(path)}"
    if stat.S_ISDIR(st.st_mode):
        return f"dir {mode} {owner}"
    if stat.S_ISREG(st.st_mode):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        return f"file {digest} {mode} {owner}"
    return f"special {mode} {owner}"


def _etc(root: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    base = root / "etc"
    for dirpath, dirnames, filenames in os.walk(base):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            with contextlib.suppress(OSError):
                out[str(path.relative_to(root))] = _describe(path)
    return out


def _units(root: Path) -> frozenset[str]:
    """Units enabled under /etc/systemd/system: ``<target>.wants/<unit>`` (and ``.requires``)."""
    system = root / "etc" / "systemd" / "system"
    found = set()
    for wants in (*system.glob("*.wants"), *system.glob("*.requires")):
        for unit in wants.iterdir():
            found.add(f"{wants.name}/{unit.name}")
    return frozenset(found)


def inventory(root: Path) -> Inventory:
    """Read the packages, /etc, enabled units and Kubernetes binaries of the image mounted at ``root``."""
    kube = {}
    for rel in KUBERNETES_BINARIES:
        path = root / rel
        kube[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
    packages, runtime = _packages(root)
    return Inventory(packages, _etc(root), _units(root), kube, containerd_images(root), runtime,
                     root_arch(root) or "unknown")  # fmt: skip


def _expected(name: str) -> str | None:
    for prefix, why in EXPECTED.items():
        if name == prefix or name.startswith(prefix + "/"):
            return why
    return None


def compare(a: Inventory, b: Inventory) -> list[Difference]:
    """Every difference between two inventories, expected ones marked."""
    out: list[Difference] = []

    def mapping(kind: str, x: dict[str, str], y: dict[str, str]) -> None:
        for key in sorted(set(x) | set(y)):
            if x.get(key) != y.get(key):
                out.append(Difference(kind, key, x.get(key), y.get(key), _expected(key) if kind == "etc" else None))

    mapping("package", a.packages, b.packages)
    mapping("etc", a.etc, b.etc)
    for unit in sorted(a.enabled_units ^ b.enabled_units):
        there = "enabled" if unit in a.enabled_units else None
        out.append(Difference("unit", unit, there, None if there else "enabled"))
    mapping("kubernetes", a.kubernetes, b.kubernetes)
    mapping("runtime", a.runtime, b.runtime)
    mapping("image", a.images, b.images)
    if a.arch != b.arch:
        out.insert(0, Difference("arch", "/usr/bin/env", a.arch, b.arch))
    return out


def diff_images(a: Path, b: Path, *, work_dir: Path | None = None, any_arch: bool = False) -> Report:
    """Compare two images (any format :func:`raw_view` reads), each mounted read-only in turn. Images of different
    architectures differ in every package and binary: refused (exit 2) unless ``any_arch``."""
    inventories = []
    for image in (a, b):
        with raw_view(image, work_dir=work_dir) as raw, mounted_root(raw) as root:
            inventories.append(inventory(root))
    first, second = inventories
    if first.arch != second.arch and not any_arch:
        raise InputError(f"{a.name} is {first.arch} and {b.name} is {second.arch}: every package and binary differs",
                         field="--against", expected="an image of the same architecture, or --any-arch")  # fmt: skip
    return Report(str(a), str(b), compare(first, second))


def _entry(path: Path) -> str:
    """A file as bytes and metadata see it: type, mode, owner, modification time, content digest or link target."""
    st = path.lstat()
    head = f"{stat.S_IFMT(st.st_mode):o} {stat.S_IMODE(st.st_mode):04o} {st.st_uid}:{st.st_gid} mtime {st.st_mtime_ns}"
    if stat.S_ISLNK(st.st_mode):
        return f"{head} -> {os.readlink(path)}"
    if stat.S_ISREG(st.st_mode):
        h = hashlib.sha256()
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        return f"{head} size {st.st_size} sha256 {h.hexdigest()}"
    return head


def _walk(root: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    device = root.stat().st_dev
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if (Path(folder) / d).lstat().st_dev == device)
        for name in sorted([*dirs, *files]):
            path = Path(folder) / name
            out[str(path.relative_to(root))] = _entry(path)
    return out


@dataclass(frozen=True)
class FileDifference:
    """The first path (in sorted order) whose bytes or metadata differ between two images' root filesystems, and
    (when asked for) a copy of each side's file for a closer look."""

    path: str
    a: str | None
    b: str | None
    copies: tuple[Path, Path] | None = None


def _copy_out(root: Path, rel: str, described: str | None, dest: Path) -> Path:
    src = root / rel
    if src.is_file() and not src.is_symlink():
        shutil.copyfile(src, dest)
    else:  # a link, a folder or nothing: what it is, as text
        dest.write_text(f"{described}\n")
    return dest


def first_difference(a: Path, b: Path, *, work_dir: Path | None = None,
                     copy_to: Path | None = None) -> FileDifference | None:  # fmt: skip
    """Where two images' root filesystems first differ, file by file (content, type, mode, owner, mtime), or None
    when every file is the same (the bytes may still differ: the filesystem's own layout). Both are mounted once,
    read-only; with ``copy_to``, the two versions of the differing file are copied there while they are."""
    with contextlib.ExitStack() as stack:
        roots = [stack.enter_context(mounted_root(stack.enter_context(raw_view(image, work_dir=work_dir))))
                 for image in (a, b)]  # fmt: skip
        left, right = (_walk(root) for root in roots)
        path = next((p for p in sorted(set(left) | set(right)) if left.get(p) != right.get(p)), None)
        if path is None:
            return None
        copies = None
        if copy_to is not None:
            name = Path(path).name
            copies = (_copy_out(roots[0], path, left.get(path), copy_to / f"a-{name}"),
                      _copy_out(roots[1], path, right.get(path), copy_to / f"b-{name}"))  # fmt: skip
        return FileDifference(path, left.get(path), right.get(path), copies)
