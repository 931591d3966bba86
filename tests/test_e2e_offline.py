"""The offline flow for real: a base image made with debootstrap, a mirror created from a stand-in release served
on 127.0.0.1, a bare-metal build and a local OVA built by Packer + QEMU + Ansible inside a network namespace that
has nothing but loopback, and both images checked by image.verify (testinfra on the mounted image, then a boot to
a login prompt). Slow by nature (QEMU; TCG where KVM cannot run guests): one build per artifact kind."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagebuilder.catalog import load_catalog
from imagebuilder.disk import mounted_root, raw_view
from imagebuilder.standin import make_standin_release
from imagebuilder.verify import verify_image
from tests.support.common import BIN, ROOT, ArgvWatcher, run
from tests.support.pki import make_ca
from tests.support.vcsim import Vcsim

NETNS = f"ib-offline-{os.getpid()}"
# a QEMU build under TCG takes minutes; the first test also pays for the base image fixture
pytestmark = pytest.mark.timeout(1800)
SECRET = "vc-Pa55-never-logged-7731"
REG_SECRET = "reg-Pa55-never-logged-3319"


@pytest.fixture(scope="module")
def offline_ns() -> Iterator[str]:
    """A network namespace with only loopback: no route to anything else."""
    subprocess.run(["ip", "netns", "add", NETNS], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", NETNS, "ip", "link", "set", "lo", "up"], check=True)
        yield NETNS
    finally:
        subprocess.run(["ip", "netns", "del", NETNS], check=False)


@pytest.fixture(scope="module")
def upstream_server(offline_ns: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The stand-in release served by a real HTTP server on 127.0.0.1 inside the namespace."""
    root = tmp_path_factory.mktemp("upstream")
    make_standin_release(root, load_catalog().channel("1-24"))
    port = 18080
    proc = subprocess.Popen(
        ["ip", "netns", "exec", offline_ns, str(BIN / "python"), "-m", "http.server", str(port),
         "--bind", "127.0.0.1", "--directory", str(root)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        probe = subprocess.run(
            ["ip", "netns", "exec", offline_ns, "curl", "-sf", "-o", "/dev/null", url + "/"], check=False
        )
        if probe.returncode == 0:
            break
        time.sleep(0.1)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait()


def in_ns(
    ns: str, *args: str, home: Path, timeout: int = 3600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home), "IMAGE_BUILDER_WORKSPACE": str(home / "work"), **(env or {})}
    return subprocess.run(
        ["ip", "netns", "exec", ns, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("home")
    (home / ".ssh").mkdir()
    (home / ".ssh" / "config").write_text("HostKeyAlgorithms +ssh-rsa\nPubkeyAcceptedKeyTypes +ssh-rsa\n")
    return home


def test_the_namespace_has_no_route_out(offline_ns: str, home: Path) -> None:
    res = in_ns(
        offline_ns, "python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 80), timeout=3)", home=home
    )
    assert res.returncode != 0 and "unreachable" in res.stderr.lower()


@pytest.fixture(scope="module")
def mirror(offline_ns: str, upstream_server: str, home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("mirror")
    res = in_ns(offline_ns, str(BIN / "image-builder"), "mirror.create", "--release-channel", "1-24",
                "--dest", str(dest), "--source", upstream_server, home=home)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "12 artifacts (12 downloaded, all sha256-verified)" in res.stdout
    again = in_ns(offline_ns, str(BIN / "image-builder"), "mirror.create", "--release-channel", "1-24",
                  "--dest", str(dest), "--source", upstream_server, home=home)  # fmt: skip
    assert "(0 downloaded" in again.stdout  # a rerun converges
    return dest


def build(
    ns: str, home: Path, provider: str, config: Path, mirror: Path | str, out: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    return in_ns(
        ns, str(BIN / "image-builder"), "build", "--os", "ubuntu", "--hypervisor", provider,
        "--release-channel", "1-24", f"--{provider}-config", str(config), "--mirror", str(mirror), "--offline",
        "--output-dir", str(out), "--disk-gb", "4", "--min-disk-gb", "10", *extra, home=home,
    )  # fmt: skip


def scan_for(secret: str, *roots: Path) -> list[str]:
    hits = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and path.stat().st_size < 50_000_000 and secret.encode() in path.read_bytes():
                hits.append(str(path))
    return hits


APT_PORT = 18081
PROBE_PACKAGE = "ib-parity-probe"


@pytest.fixture(scope="module")
def apt_repo(offline_ns: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A flat APT repository with one package we build, served on 127.0.0.1 inside the namespace: the guest of a
    build reaches it at QEMU's host address 10.0.2.2. Returns the sources.list line for it."""
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
        yield f"deb [trusted=yes] http://10.0.2.2:{APT_PORT}/ ./\n"
    finally:
        proc.terminate()
        proc.wait()


def test_offline_bare_metal_build_is_verified(
    offline_ns: str,
    home: Path,
    base_image: tuple[Path, str],
    mirror: Path,
    upstream_server: str,
    apt_repo: str,
    tmp_path: Path,
) -> None:
    image, digest = base_image
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
            "additional_files_list_file": "files.json",
        })
    )  # fmt: skip
    out = tmp_path / "out"
    # build --customize: a CA baked in at build time (the registry secret must stay out of every file and log)
    make_ca(tmp_path / "build-ca.pem", "Build CA")
    (tmp_path / "build.yaml").write_text(
        "ca_certificates: [build-ca.pem]\nregistries: {'reg.local:5000': {username: u, password: " + REG_SECRET + "}}\n"
    )
    res = build(offline_ns, home, "baremetal", config, upstream_server, out,
                "--customize", str(tmp_path / "build.yaml"))  # the mirror over HTTP, in the ns  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    gz = out / "ubuntu-v1.24.8-eks-5-amd64.gz"
    assert gz.is_file()
    assert (out / f"{gz.name}.sha256").read_text().split()[0] == subprocess.run(
        ["sha256sum", str(gz)], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    manifest = json.loads((out / "ubuntu-v1.24.8-eks-5-amd64.build-manifest.json").read_text())
    assert manifest["artifact"]["name"] == gz.name and manifest["tools"]["packer"]
    assert set(manifest["steps"]) == {"source", "render", "packer", "package"}
    log = Path(manifest["log"]).read_text()
    # the guest powered off by itself, cleanly: systemd reached logind over D-Bus, Packer did not have to kill it
    assert "Failed to connect to bus" not in log
    assert "Timeout while waiting for machine to shut" not in log
    assert not list((home / "work").iterdir()), "the workspace is removed after a build"
    assert not [p for p in out.rglob("*") if p.name.startswith(".")], "no temp file left at the output"
    findings = verify_image(gz)
    failed = [f for f in findings if not f.ok]
    assert not failed, failed
    assert {f.name for f in findings} >= {"kubelet binary", "containerd enabled", "kubelet enabled", "boot"}
    assert manifest["customization"]["ca_certificates"] == ["build-ca.pem"]
    assert manifest["customization"]["packages"] == [PROBE_PACKAGE]
    with raw_view(gz, work_dir=tmp_path / "raw") as raw, mounted_root(raw) as root:
        assert (root / "usr/share" / PROBE_PACKAGE / "marker").is_file(), "the extra package is installed"
        assert (root / "etc/apt/sources.list.d/image-builder-extra.list").read_text() == apt_repo
        assert not (root / "etc/apt/sources.list").exists(), "the public sources are disabled"
        placed = root / "etc/systemd/resolved.conf.d/dns.conf"
        assert placed.read_text() == "[Resolve]\nDNS=10.0.0.2\n"
        assert oct(placed.stat().st_mode & 0o777) == "0o640"
        adm = subprocess.run(["chroot", str(root), "getent", "group", "adm"], capture_output=True, text=True)
        assert placed.stat().st_gid == int(adm.stdout.split(":")[2])
    assert REG_SECRET not in res.stdout + res.stderr and not scan_for(REG_SECRET, out)

    # image.customize on the built .gz (offline, in the namespace): a second CA and registry; image.verify passes
    make_ca(tmp_path / "site-ca.pem", "Site CA", leaf=tmp_path / "site-leaf.pem")
    (tmp_path / "site.yaml").write_text(
        "ca_certificates: [site-ca.pem]\nregistries: {'harbor.site:443': {username: robot, password_env: SITE_PW}}\n"
    )
    custom = out / "custom" / "ubuntu-v1.24.8-eks-5-amd64-site.gz"
    site = tmp_path / "site.yaml"
    res = in_ns(offline_ns, str(BIN / "image-builder"), "image.customize", "--image", str(gz), "-f", str(site),
                "--dest", str(custom), home=home, env={"SITE_PW": REG_SECRET})  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert REG_SECRET not in res.stdout + res.stderr and not scan_for(REG_SECRET, out)
    assert (custom.parent / f"{custom.name}.sha256").is_file()
    custom_manifest = json.loads(custom.with_name("ubuntu-v1.24.8-eks-5-amd64-site.build-manifest.json").read_text())
    assert custom_manifest["customization"]["registries"] == ["harbor.site:443"]
    assert custom_manifest["customized_from"]["image"] == gz.name
    findings = verify_image(custom)
    assert not [f for f in findings if not f.ok], findings
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


def test_offline_local_ova_is_valid_and_verified(
    offline_ns: str, home: Path, base_image: tuple[Path, str], mirror: Path, tmp_path: Path, vcsim: Vcsim
) -> None:
    image, digest = base_image
    config = tmp_path / "vsphere.json"
    # a local OVA: a source image and no vCenter; the unused password must never show up anywhere
    config.write_text(
        json.dumps({"source_image_url": str(image), "source_image_checksum": f"sha256:{digest}", "password": SECRET})
    )
    out = tmp_path / "out"
    with ArgvWatcher() as argv:
        res = build(offline_ns, home, "vsphere", config, mirror, out)  # the mirror directory
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ova = out / "ubuntu-v1.24.8-eks-5-amd64.ova"
    with tarfile.open(ova) as tar:
        names = tar.getnames()
        assert names[0].endswith(".ovf") and names[1].endswith(".mf") and names[2].endswith(".vmdk")
        ovf = tar.extractfile(names[0]).read().decode()  # type: ignore[union-attr]
        mf = tar.extractfile(names[1]).read().decode()  # type: ignore[union-attr]
    assert 'ovf:capacity="4294967296"' in ovf and "streamOptimized" in ovf
    assert f"SHA256({names[0]})=" in mf and f"SHA256({names[2]})=" in mf
    findings = verify_image(ova)
    assert not [f for f in findings if not f.ok], findings
    assert SECRET not in res.stdout + res.stderr
    assert not scan_for(SECRET, out, home / "work"), "a secret leaked into a file"
    assert not [c for c in argv.seen if SECRET in c], "a secret was in a child's argv"
    # the built OVA becomes a tagged template on vCenter (vcsim) and passes template validation
    imported = run("template.import", "--ova", str(ova), "--os", "ubuntu", "--kubernetes", "1.24", env=vcsim.env)
    assert imported.code == 0, imported.err
    path = "/DC0/vm/Templates/ubuntu-kubernetes-1-24-eks-5"
    valid = run("template.validate", "--template", path, "--os", "ubuntu", "--kubernetes", "1.24", env=vcsim.env)
    assert valid.code == 0, valid.err


def test_verify_fails_an_image_that_was_not_provisioned(base_image: tuple[Path, str], tmp_path: Path) -> None:
    from imagebuilder.plan import BuildRequest
    from imagebuilder.planner import make_plan

    mirror_root = tmp_path / "m"
    make_standin_release(mirror_root, load_catalog().channel("1-24"))
    plan = make_plan(BuildRequest(os="ubuntu", hypervisor="baremetal", release_channel="1-24", mirror=str(mirror_root)))
    manifest = tmp_path / "expected.json"
    manifest.write_text(json.dumps({"plan": plan.to_json()}))
    findings = {f.name: f for f in verify_image(base_image[0], manifest=manifest, boot=False)}
    for name in ("kubelet binary", "kubeadm binary", "cni plugins", "kubelet enabled", "sysctls", "kernel modules"):
        assert not findings[name].ok, name
    assert findings["machine-id empty"].ok and findings["no build user"].ok
