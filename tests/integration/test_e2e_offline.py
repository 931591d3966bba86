"""The offline flow for real: a base image made with debootstrap, Kubernetes v1.36.3 (over containerd 2) built from
upstream source (release.build) and served on 127.0.0.1, a mirror of it, built into a bare-metal image by the chroot
engine, customized by image.customize (Ansible in a guest), and a node brought up on the result (image.verify
--kubernetes: the image's own control plane on the host, the image booted to kubeadm join it, node Ready, kube-proxy
and CoreDNS, a pod Running; the second node of image.verify --join is invoke demo's). Beside it, Debian's Packer
1.6.6 + QEMU + Ansible builds inside a network namespace that has nothing but loopback (with the reference tool's
build options: a package from a local APT repository, the public sources disabled, a file from files.json; and build
--customize) a stand-in release of 1-36 that carries the same real runtime (containerd v2.3.1, its runc, crictl
v1.36.0, in the reference bundle's tarball layout), and the chroot engine builds its twin of the same inputs,
compared by image.diff. Packer 1.9 and 1.16 (bare metal and the local OVA, on the stand-in release) run to their
Ansible in tests/integration/test_e2e_packers.py. Slow by nature (QEMU; TCG where KVM cannot run guests)."""

from __future__ import annotations

import concurrent.futures
import json
import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from imagebuilder.attest.keys import generate
from imagebuilder.attest.sbom import package_names
from imagebuilder.builder.verify import verify_image
from imagebuilder.core.disk import mounted_root, raw_view
from imagebuilder.core.files import sha256_file
from imagebuilder.image.diff import diff_images
from imagebuilder.release.catalog import load_catalog
from imagebuilder.release.standin import ReleaseRuntime, StandinRelease, make_standin_release
from tests.support.attest import check_provenance, check_sbom
from tests.support.common import BIN, ROOT, answers, run_folders, tagged, vm_turn, wait_until
from tests.support.offline import build, in_ns, ns_env, scan_for, served_in_ns
from tests.support.pki import make_ca

if TYPE_CHECKING:
    from imagebuilder.release.source import RuntimeBuild, SourceRelease

# a QEMU build under TCG takes minutes; the first test also pays for the base image fixture, and the bare-metal
# test builds three times (the Packer build beside two chroot builds and a customization), then boots a node of
# Kubernetes 1.36, whose control plane under TCG takes minutes to come up
pytestmark = pytest.mark.timeout(4800)
REG_SECRET = "reg-Pa55-never-logged-3319"


def test_the_namespace_has_no_route_out(offline_ns: str, home: Path) -> None:
    res = in_ns(
        offline_ns, "python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 80), timeout=3)", home=home
    )
    assert res.returncode != 0 and "unreachable" in res.stderr.lower()


APT_PORT = 18081
PROBE_PACKAGE = "ib-parity-probe"
PROXY_PORT = 8888
PROXY_SECRET = "px-Pa55-never-logged-5521"
#: the address the guest reaches the namespace's loopback at (QEMU user networking); the namespace's lo gets it too,
#: so one proxy URL serves the build VM and the Ansible controller, as a site proxy does
GUEST_HOST = "10.0.2.2"
#: where runtime_release serves its stand-in in the namespace
RUNTIME_RELEASE_PORT = 18083


@pytest.fixture(scope="module")
def build_proxy(offline_ns: str, apt_repo: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A real HTTP proxy (tinyproxy) with a password, in the namespace; yields its URL and its log."""
    import shutil

    tinyproxy = shutil.which("tinyproxy") or "/usr/bin/tinyproxy"
    assert Path(tinyproxy).exists(), "tinyproxy is missing: run ./scripts/setup.sh --test"
    root = tmp_path_factory.mktemp("proxy")
    log = root / "tinyproxy.log"
    (root / "tinyproxy.conf").write_text(
        f'Port {PROXY_PORT}\nTimeout 600\nLogFile "{log}"\nLogLevel Info\nMaxClients 50\n'
        f'BasicAuth proxyuser {PROXY_SECRET}\nPidFile "{root / "tinyproxy.pid"}"\n'
    )
    subprocess.run(["ip", "netns", "exec", offline_ns, "ip", "addr", "add", f"{GUEST_HOST}/32", "dev", "lo"],
                   check=True)  # fmt: skip
    proc = subprocess.Popen(["ip", "netns", "exec", offline_ns, tinyproxy, "-d", "-c", str(root / "tinyproxy.conf")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://proxyuser:{PROXY_SECRET}@{GUEST_HOST}:{PROXY_PORT}"
    try:
        wait_until(answers("ip", "netns", "exec", offline_ns, "curl", "-sf", "-o", "/dev/null", "-x", url,
                           f"http://127.0.0.1:{APT_PORT}/Packages"), proc, "tinyproxy")  # fmt: skip
        yield url, log
    finally:
        proc.terminate()
        proc.wait()


@pytest.fixture(scope="module")
def apt_repo(offline_ns: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A flat APT repository with one package we build, served on 127.0.0.1 inside the namespace: the guest of a
    build reaches it only through the build proxy (its 127.0.0.1 is its own). Returns the sources.list line."""
    import hashlib

    root = tmp_path_factory.mktemp("apt")
    pkg = root / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "usr/share" / PROBE_PACKAGE).mkdir(parents=True)
    (pkg / "usr/share" / PROBE_PACKAGE / "marker").write_text("installed from the extra repository\n")
    (pkg / "DEBIAN/control").write_text(
        f"Package: {PROBE_PACKAGE}\nVersion: 1.0\nArchitecture: all\nMaintainer: image-builder tests <t@example.org>\n"
        "Description: probe package of the reference-parity build test\n"
    )
    repo = root / "repo"
    repo.mkdir()
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(pkg), str(repo / f"{PROBE_PACKAGE}_1.0_all.deb")],
                   check=True, capture_output=True)  # fmt: skip
    packages = subprocess.run(["dpkg-scanpackages", "--multiversion", "."], cwd=repo, check=True,
                              capture_output=True).stdout  # fmt: skip
    (repo / "Packages").write_bytes(packages)
    digest = hashlib.sha256(packages).hexdigest()
    (repo / "Release").write_text(f"Origin: image-builder-tests\nSHA256:\n {digest} {len(packages)} Packages\n")
    proc = subprocess.Popen(
        ["ip", "netns", "exec", offline_ns, str(BIN / "python"), "-m", "http.server", str(APT_PORT),
         "--bind", "127.0.0.1", "--directory", str(repo)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield f"deb [trusted=yes] http://127.0.0.1:{APT_PORT}/ ./\n"
    finally:
        proc.terminate()
        proc.wait()


@pytest.fixture(scope="module")
def runtime_release(offline_ns: str, source_release: SourceRelease, tmp_path_factory: pytest.TempPathFactory
                    ) -> Iterator[tuple[str, StandinRelease, RuntimeBuild]]:  # fmt: skip
    """A stand-in release of 1-36 that carries the real runtime of its line (containerd v2.3.1, the runc it pins,
    crictl v1.36.0: the ones the release built from source carries, from the same cache), packed as the reference's
    bundle packs them, served in the namespace. Its Kubernetes binaries and images are the stand-in's (scripts,
    one-layer images): the Packer build spends its guest's minutes on what the engines do with a runtime, not on
    sending and importing 776 MB of real images under TCG (about 8 of its 19.5 minutes alone); the real release is
    built by the chroot engine and proven by the node check."""
    from imagebuilder.release import source
    from tests.support.runtime import reference_tarballs

    line = load_catalog().channel("1-36")
    built = source.build_runtime(line.runtime.containerd, line.runtime.crictl)
    containerd, crictl = reference_tarballs(built)
    root = tmp_path_factory.mktemp("runtime-release")
    release = make_standin_release(
        root, line, ReleaseRuntime(containerd, crictl, built.containerd, built.runc, built.crictl)
    )
    with served_in_ns(offline_ns, root, RUNTIME_RELEASE_PORT) as url:
        yield url, release, built


def test_offline_bare_metal_build_is_verified(
    offline_ns: str,
    home: Path,
    base_image: tuple[Path, str],
    apt_repo: str,
    build_proxy: tuple[str, Path],
    source_server: str,
    source_release: SourceRelease,
    runtime_release: tuple[str, StandinRelease, RuntimeBuild],
    tmp_path: Path,
) -> None:
    """Kubernetes built from source (release.build), served in the namespace as a site serves it, mirrored, built by
    the chroot engine, customized and proven by one node (the image booted joins the control plane the host runs from
    the image's own binaries; the second node, ``--join``, is the demo's, beyond CI's time here); beside it, the same
    build inputs on a stand-in release with the same real runtime through the Packer engine and the chroot engine
    give the same image (image.diff)."""
    image, digest = base_image
    manifest_url = source_release.manifest_url
    name = "ubuntu-v1.36.3-source-3-amd64"
    # mirror.create takes the release built from source as it takes the distro's
    mirror_dir = tmp_path / "mirror-src"
    res = in_ns(offline_ns, str(BIN / "image-builder"), "mirror.create", "--release-channel", "1-36",
                "--release-manifest", manifest_url, "--source", source_server, "--dest", str(mirror_dir),
                home=home)  # fmt: skip
    assert res.returncode == 0 and "14 artifacts (14 downloaded, all sha256-verified)" in res.stdout, res.stdout
    release = ("--release-manifest", manifest_url)
    runtime_url, runtime_standin, runtime_built = runtime_release
    config = tmp_path / "baremetal.json"
    # the reference tool's build options: a package from an extra repository with the public ones disabled (the
    # namespace reaches nothing else), and an additional file from files.json
    (tmp_path / "sources.list").write_text(apt_repo)
    (tmp_path / "dns.conf").write_text("[Resolve]\nDNS=10.0.0.2\n")
    (tmp_path / "files.json").write_text(json.dumps({"additional_files_list": [
        {"src": "dns.conf", "dest": "/etc/systemd/resolved.conf.d/dns.conf", "owner": "root", "group": "adm",
         "mode": "0640"}]}))  # fmt: skip
    config.write_text(
        json.dumps({
            "source_image_url": str(image), "source_image_checksum": f"sha256:{digest}",
            "extra_debs": PROBE_PACKAGE, "extra_repos": "sources.list", "disable_public_repos": "true",
            "additional_files_list_file": "files.json", "http_proxy": build_proxy[0],
        })
    )  # fmt: skip
    out = tmp_path / "out"
    # build --customize: a CA baked in at build time (the registry secret must stay out of every file and log)
    make_ca(tmp_path / "build-ca.pem", "Build CA")
    (tmp_path / "build.yaml").write_text(
        "ca_certificates: [build-ca.pem]\nregistries: {'reg.local:5000': {username: u, password: " + REG_SECRET + "}}\n"
    )
    customize = ("--customize", str(tmp_path / "build.yaml"))
    # issue 31: signed provenance from a key a user gives
    generate(tmp_path / "build-key.pem", "ecdsa")
    # Beside the Packer build (whose build VM has one vCPU), so that the test's work takes both cores: the chroot
    # engine's twin of its inputs, then the real release through the chroot engine (no VM, issue 18) from the folder
    # mirror and image.customize on that image (its guest runs Ansible as a site's customization does).
    twin_out, real_out, chroot_home = tmp_path / "twin-out", tmp_path / "real-out", tmp_path / "chroot-home"
    chroot_home.mkdir()
    make_ca(tmp_path / "site-ca.pem", "Site CA", leaf=tmp_path / "site-leaf.pem")
    (tmp_path / "site.yaml").write_text(
        "ca_certificates: [site-ca.pem]\nregistries: {'harbor.site:443': {username: robot, password_env: SITE_PW}}\n"
    )
    real_gz = real_out / f"{name}.gz"
    custom = real_out / "custom" / f"{name}-site.gz"

    def chroot_builds_then_customize() -> tuple[list[subprocess.CompletedProcess[str]], int]:
        twin = build(offline_ns, chroot_home, "baremetal", config, runtime_url, twin_out, *customize, "--engine",
                     "chroot", channel="1-36")  # fmt: skip
        assert twin.returncode == 0, twin.stdout[-3000:] + twin.stderr[-3000:]
        real = build(offline_ns, chroot_home, "baremetal", config, mirror_dir, real_out, *customize, "--engine",
                     "chroot", *release, channel="1-36")  # fmt: skip
        assert real.returncode == 0, real.stdout[-3000:] + real.stderr[-3000:]
        argv = [str(BIN / "image-builder"), "image.customize", "--image", str(real_gz), "-f",
                str(tmp_path / "site.yaml"), "--dest", str(custom)]  # fmt: skip
        # issue 29, image.customize: a first run killed alone (as the out-of-memory killer kills) with its guest
        # booting; the run below must end the QEMU it left running and release its working copy beside the output
        env = ns_env(chroot_home, SITE_PW=REG_SECRET)
        with vm_turn():
            killed = subprocess.Popen(["ip", "netns", "exec", offline_ns, *argv], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
            assert killed.stdout is not None
            said = next((line for line in killed.stdout if "booting" in line), None)  # read up to the guest's start
            time.sleep(random.Random(29).uniform(1, 5))
            killed.kill()
            killed.wait()
            killed.stdout.close()
            assert said and [p for p in tagged(killed.pid) if "qemu-system" in p], "its QEMU runs on"
            customized = in_ns(offline_ns, *argv, home=chroot_home, env={"SITE_PW": REG_SECRET})
        return [twin, real, customized], killed.pid

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        beside = pool.submit(chroot_builds_then_customize)
        res = build(offline_ns, home, "baremetal", config, runtime_url, out, *customize, "--signing-key",
                    str(tmp_path / "build-key.pem"), channel="1-36")  # fmt: skip
        (twin_res, real_res, custom_res), killed_pid = beside.result()
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    [gz] = out.glob("*.gz")
    assert gz.name.startswith("ubuntu-v1.36.") and gz.name.endswith("-amd64.gz"), gz.name
    stem = gz.name.removesuffix(".gz")
    assert (out / f"{gz.name}.sha256").read_text().split()[0] == subprocess.run(
        ["sha256sum", str(gz)], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    manifest = json.loads((out / f"{stem}.build-manifest.json").read_text())
    assert manifest["artifact"]["name"] == gz.name
    # Debian's Packer 1.6.6 (the modern ones run in tests/integration/test_e2e_packers.py): its plugins are built in
    assert manifest["tools"]["packer"] == "1.6.6"
    assert {p["action"] for p in manifest["packer_plugins"]} == {"not needed"}, manifest["packer_plugins"]
    assert set(manifest["steps"]) == {"source", "render", "packer", "package", "attest"}
    # the SBOM lists the packages of the image's own database, the extra package included; the provenance is signed
    # and names the release manifest
    doc = check_sbom(out / f"{stem}.spdx.json", gz)
    assert PROBE_PACKAGE in package_names(doc)
    # the runtime's binaries, with the versions the release states and the digests of the files in the image: the
    # real ones, built from source, installed from the reference bundle's layout by the Packer build's VM
    runtime = {p["comment"].rsplit(" ", 1)[-1]: p for p in doc["packages"]
               if p["SPDXID"].startswith("SPDXRef-Runtime-")}  # fmt: skip
    assert set(runtime) == {"/usr/local/bin/containerd", "/usr/local/bin/ctr", "/usr/local/bin/containerd-shim-runc-v2",
                            "/usr/local/sbin/runc", "/usr/bin/crictl"}, sorted(runtime)  # fmt: skip
    assert runtime["/usr/local/bin/containerd"]["versionInfo"] == "v2.3.1"
    assert runtime["/usr/local/sbin/runc"]["versionInfo"] == runtime_built.runc
    with raw_view(gz) as raw, mounted_root(raw) as root:
        for path, pkg in runtime.items():
            assert pkg["checksums"][0]["checksumValue"] == sha256_file(root / path.lstrip("/")), path
        built_containerd = sha256_file(runtime_built.containerd_bin / "containerd")
        assert sha256_file(root / "usr/local/bin/containerd") == built_containerd, "the one built from source"
    statement = check_provenance(out / f"{stem}.intoto.json", tmp_path / "build-key.pem.pub", gz)
    deps = {d["name"]: d for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert deps["release-manifest"]["uri"] == runtime_standin.manifest_url
    assert deps["source-image"]["digest"] == {"sha256": digest}
    assert {"config:baremetal.json", "config:build.yaml"} <= set(deps), sorted(deps)
    assert REG_SECRET not in json.dumps(statement) and PROXY_SECRET not in json.dumps(statement)
    # the reference's default for Ubuntu raw images: UEFI (the build VM ran OVMF)
    assert manifest["plan"]["firmware"] == "efi"
    log = Path(manifest["log"]).read_text()
    # the guest powered off by itself, cleanly: systemd reached logind over D-Bus, Packer did not have to kill it
    assert "Failed to connect to bus" not in log
    assert "Timeout while waiting for machine to shut" not in log
    assert not list((home / "work").iterdir()), "the workspace is removed after a build"
    assert not [p for p in out.rglob("*") if p.name.startswith(".")], "no temp file left at the output"
    # checked on disk here (its Kubernetes is the stand-in's scripts: the node check is the real release's, below)
    findings = verify_image(gz, boot=False)
    failed = [f for f in findings if not f.ok]
    assert not failed, failed
    assert "UEFI loader" in {f.name for f in findings}
    assert {f.name for f in findings} >= {"kubelet binary", "containerd enabled", "kubelet enabled"}
    # the release's runtime, not the OS's: containerd 2.3 (config version 4), the runc it pins, crictl 1.36
    assert {"containerd version", "runc version", "crictl version", "containerd config version",
            "one runtime", "containerd binaries", "crictl binaries"} <= {f.name for f in findings}  # fmt: skip
    manifest_name = Path(runtime_standin.manifest_url).stem
    assert manifest["plan"]["runtime"] == {"source": "release", "containerd": "v2.3.1", "runc": runtime_built.runc,
                                           "crictl": "v1.36.0", "config_version": 4,
                                           "why": f"{manifest_name}'s containerd tarball"}  # fmt: skip
    assert manifest["customization"]["ca_certificates"] == ["build-ca.pem"]
    assert manifest["customization"]["packages"] == [PROBE_PACKAGE]
    # the package reached the build VM through the proxy (its repository is on the namespace's loopback, which the
    # VM sees only through the proxy), and so did the controller's artifact downloads; the password is in no file
    proxied = build_proxy[1].read_text()
    assert f"{PROBE_PACKAGE}_1.0_all.deb" in proxied and f"127.0.0.1:{RUNTIME_RELEASE_PORT}" in proxied, proxied[-2000:]
    assert PROXY_SECRET not in res.stdout + res.stderr and not scan_for(PROXY_SECRET, out)
    assert "proxyuser:********@" in json.dumps(manifest["plan"]["config"])
    with raw_view(gz, work_dir=tmp_path / "raw") as raw, mounted_root(raw) as root:
        assert (root / "usr/share" / PROBE_PACKAGE / "marker").is_file(), "the extra package is installed"
        assert (root / "etc/apt/sources.list.d/image-builder-extra.list").read_text() == apt_repo
        assert not (root / "etc/apt/sources.list").exists(), "the public sources are disabled"
        placed = root / "etc/systemd/resolved.conf.d/dns.conf"
        assert placed.read_text() == "[Resolve]\nDNS=10.0.0.2\n"
        assert oct(placed.stat().st_mode & 0o777) == "0o640"
        # the proxy was the build's, not the node's: nothing in the image keeps it
        kept = subprocess.run(["grep", "-rls", "proxyuser", str(root / "etc")], capture_output=True, text=True)
        assert not kept.stdout, kept.stdout
        adm = subprocess.run(["chroot", str(root), "getent", "group", "adm"], capture_output=True, text=True)
        assert placed.stat().st_gid == int(adm.stdout.split(":")[2])
    assert REG_SECRET not in res.stdout + res.stderr and not scan_for(REG_SECRET, out)

    # the chroot engine's twin of the same inputs (above): the same image, proven the same way
    twin_gz = twin_out / gz.name
    twin_manifest = json.loads((twin_out / f"{stem}.build-manifest.json").read_text())
    assert twin_manifest["engine"] == "chroot" and twin_manifest["tools"]["packer"] is None
    assert set(twin_manifest["steps"]) == {"source", "chroot", "package", "attest"}
    twin_doc = check_sbom(twin_out / f"{stem}.spdx.json", twin_gz)
    assert package_names(twin_doc) == package_names(doc), "both engines list the same packages"
    assert twin_manifest["inputs_sha256"] != manifest["inputs_sha256"], "the engine is one of the inputs"
    assert not list((chroot_home / "work").iterdir()), "the chroot workspace is removed"
    report = diff_images(gz, twin_gz, work_dir=tmp_path / "diff")
    assert not report.unexpected, "\n".join(map(str, report.unexpected))
    assert all(d.kind == "etc" for d in report.differences), "same packages, units, binaries and preloaded images"

    # the real release through the chroot engine, from the folder mirror
    real_manifest = json.loads((real_out / f"{name}.build-manifest.json").read_text())
    assert real_manifest["engine"] == "chroot"
    assert real_manifest["plan"]["runtime"] == {"source": "release", "containerd": "v2.3.1", "runc": "v1.4.2",
                                                "crictl": "v1.36.0", "config_version": 4,
                                                "why": "kubernetes-1-36-source-3's containerd tarball"}  # fmt: skip
    # the SBOM lists Kubernetes v1.36.3's artifacts as the release manifest built from source names them
    real_doc = check_sbom(real_out / f"{name}.spdx.json", real_gz)
    assert PROBE_PACKAGE in package_names(real_doc)
    for done, where in ((twin_res, twin_out), (real_res, real_out)):
        for secret in (PROXY_SECRET, REG_SECRET):
            assert secret not in done.stdout + done.stderr and not scan_for(secret, where)
    findings = verify_image(real_gz, boot=False)
    assert not [f for f in findings if not f.ok], [f for f in findings if not f.ok]
    # the chroot engine's image holds the build's customization, and nothing of the chroot run
    with raw_view(real_gz, work_dir=tmp_path / "raw") as raw, mounted_root(raw) as root:
        assert (root / "usr/share" / PROBE_PACKAGE / "marker").is_file(), "the extra package is installed"
        # nothing the chroot run needed stays: policy-rc.d, Ansible's files, the host's resolv.conf
        assert not (root / "usr/sbin/policy-rc.d").exists() and not (root / "root/.ansible").exists()
        kept = subprocess.run(["grep", "-rls", "proxyuser", str(root / "etc")], capture_output=True, text=True)
        assert not kept.stdout, kept.stdout

    # image.customize on the real release's .gz (offline, in the namespace, above): a second CA and registry; the
    # rerun ended the QEMU its killed first run left and released that run's working copy
    res = custom_res
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert not tagged(killed_pid) and not run_folders(killed_pid), (tagged(killed_pid), run_folders(killed_pid))
    assert not [p.name for p in custom.parent.iterdir() if p.name.startswith(".")]
    assert REG_SECRET not in res.stdout + res.stderr and not scan_for(REG_SECRET, real_out)
    assert (custom.parent / f"{custom.name}.sha256").is_file()
    custom_manifest = json.loads(custom.with_name(f"{name}-site.build-manifest.json").read_text())
    assert custom_manifest["customization"]["registries"] == ["harbor.site:443"]
    assert custom_manifest["customized_from"]["image"] == real_gz.name
    # the input's members were taken for the MiBs the customization left as they were: few were compressed again
    members = custom_manifest["gzip_members"]
    assert members["reused"] > 0.8 * members["data"], members
    # the SBOM follows the customization: the customized image's own packages, the Kubernetes artifacts carried over,
    # the input named as what it descends from; no --signing-key, so no provenance claims anything about it
    custom_doc = check_sbom(custom.with_name(f"{name}-site.spdx.json"), custom)
    assert package_names(custom_doc).keys() >= package_names(real_doc).keys()
    kubernetes = {p["name"] for p in custom_doc["packages"] if p["SPDXID"].startswith("SPDXRef-Kubernetes-")}
    assert kubernetes == {p["name"] for p in real_doc["packages"] if p["SPDXID"].startswith("SPDXRef-Kubernetes-")}
    assert kubernetes >= {"kubelet", "kubeadm"}
    origin = next(p for p in custom_doc["packages"] if p["SPDXID"] == "SPDXRef-Origin")
    assert origin["name"] == real_gz.name
    assert origin["checksums"][0]["checksumValue"] == real_manifest["artifact"]["sha256"]
    assert "harbor.site:443" in custom_doc["packages"][0]["annotations"][0]["comment"]
    assert not custom.with_name(f"{name}-site.intoto.json").exists() and custom_manifest["provenance"] is None
    # the node check on the customized image (image.verify --node-check: every check of image.verify, the boot
    # included): the image's own etcd, API server, controller manager and scheduler on this host, the image booted
    # under OVMF joins them with kubeadm join, offline from the preloaded images, node Ready, kube-proxy and CoreDNS
    # Running on it, a pod Running; the site's CA and registry in containerd's config beside the build's break none of
    # it. A shared turn: the guest's work is a node's (kubeadm init inside the guest needed the machine alone and
    # still collapsed under TCG on a slower host: docs/building.md)
    with vm_turn():
        findings = verify_image(custom, kubernetes=True, node_timeout=2400, join=False)
    assert not [f for f in findings if not f.ok], "\n".join(f"{f.name}: {f.detail}" for f in findings if not f.ok)
    # a real release's image: every node program an ELF of its machine, not one stand-in script among them
    (arch,) = (f for f in findings if f.name == "architecture")
    assert "not ELF" not in arch.detail and int(arch.detail.split()[0]) >= 12, arch.detail
    assert {f.name for f in findings} >= {
        "sandbox image",
        "runtime: systemd cgroups on cgroup v2",
        "containerd binaries",
        "crictl binaries",
        "preloaded images",
        "control plane on the host",
        "boot and cloud-init",
        "kubeadm join",
        "node Ready",
        "kube-proxy and CoreDNS Running",
        "test pod Running",
        "test pod deleted",
    }
    assert "on node-check " in next(f.detail for f in findings if f.name == "test pod Running") + " "
    boot = next(f for f in findings if f.name == "boot and cloud-init")
    assert "UEFI, OVMF" in boot.detail, "the UEFI image is booted as UEFI machines boot it"
    # under TCG the throwaway copy's kernel is told its TSCs are synchronized, as real hardware's are
    assert "tsc=reliable" in boot.detail or ", kvm" in boot.detail, boot.detail
    # and its vCPUs by the rule of every guest the tool starts (emulated on 2 cores: one)
    from imagebuilder.core.arch import arch
    from imagebuilder.image.emulation import vcpus

    assert f", {vcpus(arch('amd64'))} vCPU" in boot.detail, boot.detail
    with raw_view(custom) as raw, mounted_root(raw) as root:
        # customizations add up: the build's CA and registry stay beside the site's
        for stem in ("build-ca", "site-ca"):
            assert list((root / "usr/local/share/ca-certificates").glob(f"image-builder-{stem}-*.crt")), stem
        containerd_toml = (root / "etc/containerd/config.toml").read_text()
        assert "reg.local:5000" in containerd_toml and "harbor.site:443" in containerd_toml
        verify = subprocess.run(
            ["chroot", str(root), "openssl", "verify", "-CAfile", "/etc/ssl/certs/ca-certificates.crt"],
            input=(tmp_path / "site-leaf.pem").read_bytes(), capture_output=True, check=False,
        )  # fmt: skip
        assert verify.returncode == 0, verify.stderr


def test_verify_fails_an_image_that_was_not_provisioned(base_image: tuple[Path, str], tmp_path: Path) -> None:
    from imagebuilder.builder.resolve import make_plan
    from imagebuilder.plan.model import BuildRequest

    mirror_root = tmp_path / "m"
    make_standin_release(mirror_root, load_catalog().channel("1-24"))
    plan = make_plan(BuildRequest(os="ubuntu", hypervisor="baremetal", release_channel="1-24", mirror=str(mirror_root),
                                  runtime="os"))  # fmt: skip
    manifest = tmp_path / "expected.json"
    manifest.write_text(json.dumps({"plan": plan.to_json()}))
    findings = {f.name: f for f in verify_image(base_image[0], manifest=manifest, boot=False)}
    for name in ("kubelet binary", "kubeadm binary", "cni plugins", "kubelet enabled", "sysctls", "kernel modules"):
        assert not findings[name].ok, name
    assert findings["machine-id empty"].ok and findings["no build user"].ok
