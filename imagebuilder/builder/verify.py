"""``image.verify``: check a built image the way a cluster will meet it.

Three parts:
- the disk: boot sectors and bootloader consistent, filesystems cleanly unmounted (:mod:`imagebuilder.image.bootcheck`);
- offline: the image's root filesystem is mounted read-only and testinfra (chroot backend) checks what the
  build promised: Kubernetes binaries with the release manifest's checksums, containerd and kubelet enabled, swap
  off, sysctls and modules configured, and nothing of the build VM left (machine-id, SSH host keys, cloud-init
  state, build user, passwords);
- boot: a throwaway copy boots under QEMU until a login prompt appears on the serial console.
The expected checksums come from the build manifest written beside the image.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imagebuilder.core.arch import Arch, arch, elf_machine, recorded
from imagebuilder.core.disk import mounted_root, raw_view, run_tempdir
from imagebuilder.core.errors import InputError
from imagebuilder.core.files import parse_json, read_text
from imagebuilder.core.hostinfo import KvmStatus, kvm_status
from imagebuilder.core.progress import Say, silent
from imagebuilder.image import emulation, qemu
from imagebuilder.image.apply_customization import manifest_beside
from imagebuilder.image.boltdb import containerd_images
from imagebuilder.image.bootcheck import check_raw
from imagebuilder.providers import registry
from imagebuilder.providers.base import BUILD_USER
from imagebuilder.release.catalog import Firmware, config_version_of
from imagebuilder.release.manifest import RUNTIME_BINARIES as OWN_BINARIES


@dataclass(frozen=True)
class Finding:
    name: str
    ok: bool
    detail: str


def expectations(image: Path, manifest: Path | None = None) -> dict[str, Any]:
    """The build manifest written beside the image (``<name>.build-manifest.json``)."""
    path = manifest or manifest_beside(image)
    if not path.is_file():
        raise InputError("build manifest not found", source=path, expected="the manifest written by the build")
    data = parse_json(read_text(path, "build manifest"), path)
    if not isinstance(data, dict) or not isinstance(data.get("plan"), dict):
        raise InputError("not a build manifest (no 'plan' object)", source=path, expected="the build's manifest")
    plan = data["plan"]
    if not isinstance(plan.get("artifacts"), list) or not isinstance(plan.get("provider"), str):
        raise InputError("the build manifest's plan has no artifacts or provider", source=path)
    return data


def offline_checks(root: Path, expected: dict[str, Any]) -> list[Finding]:
    import testinfra  # imported here: a test dependency, needed only when verifying

    host = testinfra.get_host(str(root), connection="chroot")
    plan = expected["plan"]
    provider = registry.PROVIDERS.get(plan["provider"])
    build_user = provider.build_user if provider else BUILD_USER
    findings: list[Finding] = []

    def add(name: str, ok: bool, detail: str) -> None:
        findings.append(Finding(name, bool(ok), detail))

    for artifact in plan["artifacts"]:
        if artifact["kind"] != "binary" or artifact["name"] in OWN_BINARIES:  # the runtime's: runtime_digests
            continue
        f = host.file(f"/usr/bin/{artifact['name']}")
        ok = f.exists and f.mode & 0o111 and f.sha256sum == artifact["sha256"]
        add(
            f"{artifact['name']} binary",
            ok,
            f"/usr/bin/{artifact['name']} sha256 {'matches' if ok else 'DIFFERS from'} the manifest",
        )
    add("cni plugins", host.file("/opt/cni/bin/bridge").exists, "/opt/cni/bin/bridge")
    findings.append(architecture_check(root, plan))
    findings.extend(runtime_checks(host, plan))
    findings.extend(runtime_digests(root, plan))
    for unit in ("containerd", "kubelet"):
        state = host.run(f"systemctl is-enabled {unit}.service").stdout.strip()
        add(f"{unit} enabled", state == "enabled", f"systemctl is-enabled {unit}: {state or 'unknown'}")
    findings.extend(kubelet_needs(host, root, plan))
    machine_id = host.file("/etc/machine-id")
    add("machine-id empty", machine_id.exists and machine_id.size == 0, "/etc/machine-id")
    keys = host.run("ls /etc/ssh/ssh_host_* 2>/dev/null").stdout.split()
    add("no SSH host keys", not keys, "none" if not keys else " ".join(keys))
    instances = host.run("ls -A /var/lib/cloud/instances 2>/dev/null").stdout.split()
    add("cloud-init cleaned", not instances, "/var/lib/cloud/instances empty" if not instances else str(instances))
    if provider is None or provider.removes_build_user:
        add("no build user", not host.user(build_user).exists, f"user {build_user} absent")
    add("no build sudo rule", not host.file(f"/etc/sudoers.d/{build_user}").exists, f"/etc/sudoers.d/{build_user}")
    shadow = host.file("/etc/shadow").content_string
    with_password = [
        ln.split(":")[0]
        for ln in shadow.splitlines()
        if ln.count(":") > 2 and ln.split(":")[1][:1] not in ("", "*", "!")
    ]
    add(
        "no passwords",
        not with_password,
        "every account locked" if not with_password else f"passwords: {with_password}",
    )
    add("no seal script left", not host.file("/usr/local/sbin/image-builder-seal").exists, "seal step ran")
    return findings


#: the binaries a node runs, by where the roles put them (the CNI plugins: every file of /opt/cni/bin)
NODE_PROGRAMS = ("usr/bin/kubelet", "usr/bin/kubeadm", "usr/bin/kubectl", "usr/bin/crictl", "usr/local/bin/containerd",
                 "usr/bin/containerd", "usr/local/sbin/runc", "usr/sbin/runc", "usr/local/bin/containerd-shim-runc-v2",
                 "usr/bin/containerd-shim-runc-v2", "usr/bin/bash", "usr/lib/systemd/systemd")  # fmt: skip


def architecture_check(root: Path, plan: dict[str, Any]) -> Finding:
    """Every node binary is an ELF program for the image's architecture (a kubelet for another one would install
    and never run). A program that is not ELF at all (a release's stand-in script) is named, not failed."""
    machine = recorded(plan, "the build manifest")
    cni = root / "opt/cni/bin"
    paths = [root / p for p in NODE_PROGRAMS] + (sorted(cni.iterdir()) if cni.is_dir() else [])
    found = {str(p.relative_to(root)): elf_machine(p) for p in paths if p.is_file() and not p.is_symlink()}
    wrong = sorted(p for p, m in found.items() if m is not None and m != machine.elf_machine)
    scripts = sorted(p for p, m in found.items() if m is None)
    programs = sum(1 for m in found.values() if m is not None)
    if wrong:
        return Finding("architecture", False, f"not {machine.machine} programs: {', '.join(wrong[:8])}")
    note = f"; not ELF (stand-ins?): {', '.join(scripts[:8])}" if scripts else ""
    return Finding("architecture", programs > 0, f"{programs} node programs are {machine.machine} ELF{note}")


#: where the containerd role (files/install-runtime.sh) and the kubernetes role put each runtime binary a release's
#: tarball holds, by the tarball's artifact name and the binary's file name
RUNTIME_PLACES = {
    "containerd": {"containerd": "usr/local/bin/containerd", "ctr": "usr/local/bin/ctr",
                   "containerd-shim-runc-v2": "usr/local/bin/containerd-shim-runc-v2", "runc": "usr/local/sbin/runc"},
    "crictl": {"crictl": "usr/bin/crictl"},
}  # fmt: skip

#: where each runtime binary of the release lands, how it states its version, and the plan's field that names the
#: version it must state
RUNTIME_BINARIES = (
    ("containerd", "/" + RUNTIME_PLACES["containerd"]["containerd"], "containerd --version", "containerd"),
    ("runc", "/" + RUNTIME_PLACES["containerd"]["runc"], "runc --version", "runc"),
    ("crictl", "/" + RUNTIME_PLACES["crictl"]["crictl"], "crictl --version", "crictl"),
)


def runtime_checks(host: Any, plan: dict[str, Any]) -> list[Finding]:
    """The container runtime is the one the plan named: the release's containerd, runc and crictl at their
    versions (each binary asked, as ``kubelet --version`` is), no second containerd or runc from the OS's packages,
    and containerd's config in the version that containerd writes as current (2 for 1.x, 3 for 2.0-2.2, 4 from
    2.3 on)."""
    runtime = plan.get("runtime") or {}
    out: list[Finding] = []
    path = "/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin"
    said = host.run(f"env PATH={path} containerd --version")
    text = (said.stdout or said.stderr).strip()
    out.append(Finding("containerd", said.rc == 0, f"'containerd --version': {text[:100] or said.rc}"))
    if runtime.get("source") == "release":
        for name, where, command, key in RUNTIME_BINARIES:
            want = runtime.get(key)
            if not want:
                continue
            said = host.run(f"{where} --version" if name != "crictl" else command)
            got = (said.stdout or said.stderr).strip()
            ok = said.rc == 0 and re.search(rf"(^|\s)v?{re.escape(want.lstrip('v'))}(\s|$)", got) is not None
            out.append(Finding(f"{name} version", ok, f"{where}: {got.splitlines()[0][:90] if got else said.rc}"
                               + ("" if ok else f" (the release's is {want})")))  # fmt: skip
        doubles = [p for p in ("/usr/bin/containerd", "/usr/sbin/runc", "/usr/bin/runc") if host.file(p).exists]
        out.append(Finding("one runtime", not doubles, "no OS containerd or runc beside the release's" if not doubles
                           else f"the OS's runtime is still there: {', '.join(doubles)}"))  # fmt: skip
    config = host.file("/etc/containerd/config.toml")
    toml = config.content_string if config.exists else ""
    version = re.search(r"^version\s*=\s*([0-9]+)\s*$", toml, re.M)
    stated = re.search(r"\sv?([0-9]+\.[0-9]+\.[0-9]+)", text)
    want_version = config_version_of(stated.group(1)) if stated else None
    got_version = int(version.group(1)) if version else None
    out.append(Finding("containerd config version", want_version is not None and got_version == want_version,
                       f"{config.path}: version {got_version} for containerd {stated.group(1) if stated else '?'}"
                       + ("" if got_version == want_version else f" (it reads version {want_version})")))  # fmt: skip
    return out


def runtime_digests(root: Path, plan: dict[str, Any]) -> list[Finding]:
    """The runtime's binaries in the image are the ones in the release's tarballs, byte for byte: each tarball (its
    sha256 the manifest's) is read from the build's directory mirror, and each binary it holds is compared with the
    file the roles installed from it. A tarball that is not on this machine (a build from upstream or an HTTP
    mirror) is not fetched: the finding says so."""
    import hashlib
    import tarfile

    from imagebuilder.core.fetch import Mirror
    from imagebuilder.core.files import sha256_file

    runtime = plan.get("runtime") or {}
    if runtime.get("source") != "release":
        return []
    archives = [a for a in plan["artifacts"] if a["kind"] == "archive" and a["name"] in RUNTIME_PLACES]
    mirror = Mirror(plan["mirror"]) if plan.get("mirror") else None
    out: list[Finding] = []
    for a in archives:
        local = Path(mirror.locate(a["uri"])) if mirror and mirror.is_local else None
        if local is None or not local.is_file() or sha256_file(local) != a["sha256"]:
            out.append(Finding(f"{a['name']} binaries", True, f"not compared: the release's {a['name']} tarball is "
                               f"not on this machine ({a['uri']})"))  # fmt: skip
            continue
        compared: list[str] = []
        differ: list[str] = []
        with tarfile.open(local) as tar:
            for member in tar.getmembers():
                place = RUNTIME_PLACES[a["name"]].get(member.name.rsplit("/", 1)[-1])
                if place is None or not member.isfile():
                    continue
                fh = tar.extractfile(member)
                want = hashlib.sha256(fh.read()).hexdigest() if fh else ""
                target = root / place
                got = sha256_file(target) if target.is_file() and not target.is_symlink() else "absent"
                (compared if got == want else differ).append(f"/{place}")
        ok = bool(compared) and not differ
        said = f"{', '.join(compared)} are the tarball's" if ok else \
            f"differ from the release's {a['name']} tarball: {', '.join(differ) or 'none found'}"  # fmt: skip
        out.append(Finding(f"{a['name']} binaries", ok, said))
    for a in plan["artifacts"]:  # a runtime binary of its own (runc's release): its sha256 is the plan's
        if a["kind"] == "binary" and a["name"] in OWN_BINARIES:
            place = RUNTIME_PLACES["containerd"][a["name"]]
            target = root / place
            got = sha256_file(target) if target.is_file() and not target.is_symlink() else "absent"
            out.append(Finding(f"{a['name']} binary", got == a["sha256"], f"/{place} sha256 "
                               + ("matches" if got == a["sha256"] else "DIFFERS from") + f" {a['uri']}"))  # fmt: skip
    return out


#: what the kubelet needs of a node, as kubernetes-sigs/image-builder's goss checks it: file -> lines it must hold
SYSCTLS = ("net.bridge.bridge-nf-call-iptables = 1", "net.ipv4.ip_forward = 1")
MODULES = ("overlay", "br_netfilter")
CRI_SOCKET = "unix:///run/containerd/containerd.sock"
#: how each binary states its version (a stand-in script states it whatever it is asked)
VERSION_COMMANDS = {"kubelet": "kubelet --version", "kubeadm": "kubeadm version -o short",
                    "kubectl": "kubectl version --client"}  # fmt: skip


def kubelet_needs(host: Any, root: Path, plan: dict[str, Any]) -> list[Finding]:
    """Modules, sysctls, swap, containerd's cgroup driver and sandbox image, crictl's endpoint, the Kubernetes
    binaries' versions and every image the release preloads under its exact name."""
    out: list[Finding] = []
    fstab = host.file("/etc/fstab").content_string if host.file("/etc/fstab").exists else ""
    swaps = [ln for ln in fstab.splitlines() if ln.split() and not ln.startswith("#") and "swap" in ln.split()[2:3]]
    out.append(Finding("swap off", not swaps, "no swap in /etc/fstab" if not swaps else f"swap entries: {swaps}"))
    sysctl = host.file("/etc/sysctl.d/99-kubernetes.conf")
    lines = {" ".join(ln.split()) for ln in sysctl.content_string.splitlines()} if sysctl.exists else set()
    missing = [s for s in SYSCTLS if s not in lines]
    out.append(Finding("sysctls", not missing, f"{sysctl.path}: " + ("; ".join(SYSCTLS) if not missing
                                                                     else f"missing {missing}")))  # fmt: skip
    modules = host.file("/etc/modules-load.d/k8s.conf")
    loaded = set(modules.content_string.split()) if modules.exists else set()
    absent = [m for m in MODULES if m not in loaded]
    out.append(Finding("kernel modules", not absent, f"{modules.path}: " + (" ".join(MODULES) if not absent
                                                                           else f"missing {absent}")))  # fmt: skip
    config = host.file("/etc/containerd/config.toml")
    toml = config.content_string if config.exists else ""
    systemd = re.search(r"^\s*SystemdCgroup\s*=\s*true\s*$", toml, re.M) is not None
    out.append(
        Finding(
            "containerd cgroups",
            systemd,
            "SystemdCgroup = true"
            if systemd
            else f"{config.path} does not set SystemdCgroup = true (the kubelet's driver is systemd)",
        )
    )
    images = {a["name"]: a for a in plan["artifacts"] if a["kind"] == "image"}
    if "pause" in images:
        want = images["pause"]["uri"]
        m = re.search(r"^\s*sandbox(?:_image)?\s*=\s*[\"']([^\"']*)[\"']", toml, re.M)
        got = m.group(1) if m else None
        out.append(
            Finding(
                "sandbox image",
                got == want,
                f"containerd's sandbox image {got} "
                + ("is the release's pause" if got == want else f"is not the release's {want}"),
            )
        )
    crictl = host.file("/etc/crictl.yaml")
    endpoint = crictl.exists and f"runtime-endpoint: {CRI_SOCKET}" in crictl.content_string
    out.append(Finding("crictl endpoint", endpoint, f"/etc/crictl.yaml: runtime-endpoint {CRI_SOCKET}" if endpoint
                       else "/etc/crictl.yaml does not point crictl at containerd"))  # fmt: skip
    version = plan.get("kubernetes_version") or ""
    for binary, command in VERSION_COMMANDS.items():
        said = host.run(command)
        text = (said.stdout or said.stderr).strip()
        ok = said.rc == 0 and re.search(rf"(^|\s){re.escape(version)}(\s|$|\+|-)", text) is not None
        out.append(Finding(f"{binary} version", ok, f"'{command}': {text.splitlines()[0][:80] if text else said.rc}"
                           + ("" if ok else f" (the manifest's is {version})")))  # fmt: skip
    preloaded = containerd_images(root)
    # the images the release ships a tarball for are imported by every build (the others, pulled by an online build
    # from their registry, are not checked here)
    wanted = [a["uri"] for a in images.values() if a.get("archive_uri")]
    missing_images = [ref for ref in wanted if ref not in preloaded]
    out.append(Finding("preloaded images", not missing_images,
                       f"all {len(wanted)} in containerd (k8s.io) under the manifest's names" if not missing_images
                       else f"not in containerd: {', '.join(missing_images)}"))  # fmt: skip
    return out


def boot_test(
    image: Path,
    *,
    timeout: float = 600,
    kvm: KvmStatus | None = None,
    firmware: Firmware = "bios",
    machine: Arch | None = None,
) -> Finding:
    """Boot a throwaway copy under QEMU (``-snapshot``) until a login prompt shows on the serial console."""
    with raw_view(image) as raw:
        return boot_raw(raw, timeout=timeout, kvm=kvm, firmware=firmware, machine=machine)


def boot_raw(
    raw: Path,
    *,
    timeout: float = 600,
    kvm: KvmStatus | None = None,
    firmware: Firmware = "bios",
    machine: Arch | None = None,
) -> Finding:
    """:func:`boot_test` on a raw disk (QEMU's ``-snapshot`` leaves it untouched), by BIOS (SeaBIOS) or by UEFI
    (OVMF, as a ``--firmware efi`` image boots on the machines it is built for); ``machine``: an arm64 image boots
    under qemu-system-aarch64 with AAVMF. Emulated (TCG), a throwaway copy boots whose systemd waits for devices as
    long as emulation needs (:mod:`imagebuilder.image.emulation`)."""
    machine = machine or arch("amd64")
    kvm = kvm or kvm_status()
    with run_tempdir("boot") as tmp, contextlib.ExitStack() as stack:
        how = ""
        if emulation.emulated(machine, kvm):
            raw, how = emulation.patched_copy(raw, Path(tmp), machine)
        guest = stack.enter_context(
            qemu.running(raw, serial=Path(tmp) / "serial.log", snapshot=True, kvm=kvm, firmware=firmware,
                         machine=machine)
        )  # fmt: skip
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if "login:" in guest.console(0):
                took = time.monotonic() - start
                return Finding(
                    "boot", True, f"login prompt after {took:.0f} s ({guest.how}{'; ' + how if how else ''})"
                )
            if reason := guest.exited():
                return Finding("boot", False, f"{reason} before a login prompt")
            time.sleep(1)
        tail = guest.console().replace("\n", " | ")
        return Finding("boot", False, f"no login prompt within {timeout:.0f} s; console ends: {tail}")


def verify_image(
    image: Path,
    *,
    manifest: Path | None = None,
    boot: bool = True,
    boot_timeout: float = 600,
    kubernetes: bool = False,
    node_timeout: float = 2400,
    join: bool = False,
    expected_arch: str | None = None,
    say: Say = silent,
) -> list[Finding]:
    """Every check of an image; ``kubernetes``: the node check (:mod:`imagebuilder.image.nodecheck`) in place of the
    plain boot test, which it includes. ``expected_arch``: the architecture the caller expects (``image.verify
    --arch``): a manifest recording another one is refused before any check, as a script that picked the other
    architecture's file in a folder holding both would otherwise boot and pass it."""
    source = manifest or manifest_beside(image)
    expected = expectations(image, source)
    firmware: Firmware = "efi" if expected["plan"].get("firmware") == "efi" else "bios"
    machine = recorded(expected["plan"], source)
    if expected_arch is not None and machine.name != expected_arch:
        raise InputError(f"{image.name} is built for {machine.name}, not {expected_arch}", source=source,
                         field="plan.arch",
                         expected=f"{expected_arch} (--arch), or --arch {machine.name}")  # fmt: skip
    firmware = "efi" if not machine.bios else firmware  # an arm64 image boots by UEFI alone
    # one raw view serves every part: a .gz or an OVA is decompressed or converted once, not three times
    with raw_view(image) as raw:
        disk_check = check_raw(raw)
        findings = [Finding("disk", disk_check.ok, disk_check.summary())]
        if firmware == "efi":
            ok = machine.name in disk_check.uefi_arches
            findings.append(
                Finding("UEFI loader", ok, "built for UEFI: "
                        + (f"the EFI system partition holds {machine.efi_loader}" if ok
                           else f"no EFI system partition with {machine.efi_loader}, UEFI firmware boots nothing"))
            )  # fmt: skip
        with mounted_root(raw) as root:
            findings += offline_checks(root, expected)
        if kubernetes:
            from imagebuilder.image.nodecheck import node_check

            steps = node_check(raw, expected, firmware=firmware, timeout=node_timeout, join=join, say=say)
            findings += [Finding(s.name, s.ok, f"{s.detail} [{s.seconds:.0f} s]") for s in steps]
        elif boot:
            findings.append(boot_raw(raw, timeout=boot_timeout, firmware=firmware, machine=machine))
    return findings
