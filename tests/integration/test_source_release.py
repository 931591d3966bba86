"""Kubernetes built from upstream source (release.build), the images it makes, containerd's metadata as the node
check and image.verify read it, and the kubeadm configuration of the node check.

The slow tests build the release for real through the Go module proxy (cached under ~/.cache/image-builder, so a
machine pays about 15 minutes once) and import its images into a real containerd (Debian's)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from imagebuilder.core.errors import ExternalError
from imagebuilder.image.boltdb import BoltFile
from imagebuilder.image.nodecheck import kubeadm_config
from imagebuilder.release.imagearchive import Entry, ImageSpec, archive_refs, docker_archive, image_config
from imagebuilder.release.manifest import load_manifest
from imagebuilder.release.source import LABEL, SourceRelease
from tests.support.common import answers, reference, run, running_with, stop, wait_until
from tests.support.source_release import release_images

SOURCE_VERSION = "v1.36.3"
CNI = "v1.9.1"


# --- fast -------------------------------------------------------------------------------------------------------


def test_release_build_flags_exit_2_before_anything(tmp_path: Path) -> None:
    res = run("release.build", "--kubernetes", "v1.2x", "--dest", str(tmp_path / "r"))
    assert res.code == 2 and "v1.<minor>.<patch>" in res.err and not (tmp_path / "r").exists()
    res = run("release.build", "--kubernetes", "v1.34.2", "--base-url", "ftp://x/", "--dest", str(tmp_path / "r"))
    assert res.code == 2 and "--base-url" in res.err
    res = run("release.build", "--kubernetes", "v1.34.2", "--dest", str(tmp_path / "r"), "--dry-run")
    assert res.code == 0 and "kubernetes-1-34-source-3.yaml" in res.out and not (tmp_path / "r").exists()
    # the line's runtime, or the one asked for; never one that cannot run the line's Kubernetes
    assert "containerd v2.1.4 with the runc it pins, crictl v1.36.0" in res.out
    res = run("release.build", "--kubernetes", "v1.36.3", "--containerd", "v2.4.2", "--dest", str(tmp_path / "r"),
              "--dry-run")  # fmt: skip
    assert res.code == 0 and "containerd v2.4.2" in res.out
    for bad, why in (
        ("v1.7.28", "needs containerd 2"),
        ("2.3.1", "not a containerd version"),
        ("v2.3.1;rm -rf /", "not a containerd version"),
        ("v２.3.1", "not a containerd version"),
        # the proxy serves no v2.3.9; its list (not exhaustive: it leaves out v2.3.1, which it serves) names the close
        ("v2.3.9", "is not a published release (the Go module proxy does not serve it); did you mean 'v2.3.7'"),
    ):
        res = run("release.build", "--kubernetes", "v1.36.3", "--containerd", bad, "--dest", str(tmp_path / "r"))
        assert res.code == 2 and why in res.err and "--containerd" in res.err and "Traceback" not in res.err, res.err
        assert not (tmp_path / "r").exists()
    res = run("release.build", "--kubernetes", "v1.36.99", "--dest", str(tmp_path / "r"), "--dry-run")
    assert res.code == 2 and "--kubernetes" in res.err and "not a published release" in res.err, res.err
    # the newest upstream minor, a line the distro has not published: the newest line's runtime (containerd 2)
    res = run("release.build", "--kubernetes", "v1.37.2", "--dest", str(tmp_path / "r"), "--dry-run")
    assert res.code == 0 and "containerd v2.3.1" in res.out and "kubernetes-1-37-source-3.yaml" in res.out, res.err


# --- a real containerd ------------------------------------------------------------------------------------------


@pytest.fixture
def containerd(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """Debian's containerd on a private socket, root and state (the host's containerd, if any, is not touched)."""
    binary = shutil.which("containerd")
    assert binary, "containerd is missing: run ./scripts/setup.sh --test"
    root, state, sock = tmp_path / "root", tmp_path / "state", tmp_path / "c.sock"
    config = tmp_path / "config.toml"
    config.write_text(f'version = 2\nroot = "{root}"\nstate = "{state}"\n[grpc]\n  address = "{sock}"\n'
                      '[plugins."io.containerd.grpc.v1.cri"]\n  disable_tcp_service = true\n')  # fmt: skip
    proc = subprocess.Popen([binary, "--config", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(answers("ctr", "--address", str(sock), "version"), proc, "containerd")
        yield sock, root
    finally:
        stop(proc)


@pytest.mark.root
def test_containerds_own_metadata_is_read_back_by_the_bbolt_reader(
    containerd: tuple[Path, Path], tmp_path: Path
) -> None:
    sock, root = containerd
    refs = [f"registry.example/team/app-{i}:v{i}" for i in range(40)]  # enough names for more than one page
    for ref in refs[:3]:
        tar = tmp_path / "image.tar"
        tar.write_bytes(docker_archive(ImageSpec(ref, ({"x": Entry(ref.encode())},))))
        res = subprocess.run(["ctr", "--address", str(sock), "-n", "k8s.io", "images", "import", str(tar)],
                             capture_output=True, text=True)  # fmt: skip
        assert res.returncode == 0, res.stderr
    for ref in refs[3:]:
        subprocess.run(["ctr", "--address", str(sock), "-n", "k8s.io", "images", "tag", refs[0], ref], check=True,
                       capture_output=True)  # fmt: skip
    listed = subprocess.run(["ctr", "--address", str(sock), "-n", "k8s.io", "images", "ls", "-q"],
                            capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    db = root / "io.containerd.metadata.v1.bolt" / "meta.db"
    got = sorted(k.decode() for k in BoltFile(db).bucket("v1", "k8s.io", "images"))
    assert got == sorted(listed) and set(refs) <= set(got)
    assert BoltFile(db).bucket("v1", "no-such-namespace", "images") == {}

    # damaged copies (bytes changed past the meta pages, or cut short): names or a clear error, never a crash
    import random

    data = db.read_bytes()
    rng = random.Random(26)
    for trial in range(300):
        damaged = bytearray(data)
        if trial % 10 == 0:
            damaged = damaged[: rng.randrange(8192, len(data))]
        else:
            for _ in range(rng.randrange(1, 40)):
                damaged[rng.randrange(8192, len(data))] = rng.randrange(256)
        copy = tmp_path / "damaged.db"
        copy.write_bytes(bytes(damaged))
        try:
            names = BoltFile(copy).bucket("v1", "k8s.io", "images")
        except ExternalError as exc:
            assert str(copy) in str(exc)
        else:
            assert isinstance(names, dict)


# --- the release built from source (slow: the Go module proxy, cached under ~/.cache) --------------------------


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_release_built_from_source_is_a_distro_format_release(source_release: SourceRelease, tmp_path: Path) -> None:
    manifest = load_manifest(str(source_release.manifest_path))
    assert manifest.name == "kubernetes-1-36-source-3" and manifest.distro == "source"
    assert manifest.kubernetes_version == SOURCE_VERSION and manifest.channel == "1-36"
    # the line's runtime, built from source and stamped with its real versions
    assert dict(manifest.versions) == {"containerd": "v2.3.1", "runc": "v1.4.2", "cri-tools": "v1.36.0"}
    assert "containerd" in {a.name for a in manifest.artifacts if a.kind == "archive"}
    bins = {c.name: c.bin_dir for c in source_release.components}
    for binary, args, said in ((bins["containerd"] / "containerd", ["--version"], "containerd github.com/containerd/"
                                "containerd/v2 v2.3.1 source-v2.3.1"),
                               (bins["containerd"] / "ctr", ["--version"], "ctr github.com/containerd/containerd/v2 "
                                "v2.3.1"),
                               (bins["runc"] / "runc", ["--version"], "runc version 1.4.2"),
                               (bins["cri-tools"] / "crictl", ["--version"], "crictl version 1.36.0")):  # fmt: skip
        out = subprocess.run([str(binary), *args], capture_output=True, text=True, check=True).stdout
        assert said in out, (binary, out)
        kind = subprocess.run(["file", "-L", str(binary)], capture_output=True, text=True).stdout
        assert "statically linked" in kind or "static-pie linked" in kind, kind
    said = subprocess.run([str(bins["cni-plugins"] / "bridge"), "version"], capture_output=True, text=True).stderr
    assert f"CNI bridge plugin {CNI}" in said, said  # stamped as upstream's release script does
    seccomp = subprocess.run([str(bins["runc"] / "runc"), "--version"], capture_output=True, text=True).stdout
    assert "libseccomp: 2." in seccomp, seccomp
    tarball = next(source_release.root.rglob("containerd-v2.3.1-linux-amd64.tar.gz"))
    with tarfile.open(tarball) as tar:
        assert {m.name for m in tar.getmembers() if m.isfile()} == {
            "usr/local/bin/containerd", "usr/local/bin/ctr", "usr/local/bin/containerd-shim-runc-v2",
            "usr/local/sbin/runc", "etc/systemd/system/containerd.service"}  # fmt: skip
        unit = tar.extractfile("etc/systemd/system/containerd.service").read().decode()  # type: ignore[union-attr]
        assert "ExecStart=/usr/local/bin/containerd" in unit and "Delegate=yes" in unit
    doc = yaml.safe_load(source_release.manifest_path.read_text())
    assets = [a for c in doc["status"]["components"] for a in c["assets"]]
    assert assets and all(LABEL in a["description"] for a in assets), "every artifact says it was built from source"
    for a in assets:
        if a["type"] == "Archive":
            path = source_release.root / a["archive"]["uri"].split("://", 1)[1].split("/", 1)[1]
            data = path.read_bytes()
            assert hashlib.sha256(data).hexdigest() == a["archive"]["sha256"]
            assert hashlib.sha512(data).hexdigest() == a["archive"]["sha512"]
    kube = next(c.bin_dir for c in source_release.components if c.name == "kubernetes")
    for binary, args in (("kubelet", ["--version"]), ("kubeadm", ["version", "-o", "short"]),
                         ("kubectl", ["version", "--client"]), ("kube-apiserver", ["--version"])):  # fmt: skip
        out = subprocess.run([str(kube / binary), *args], capture_output=True, text=True, check=True).stdout
        assert SOURCE_VERSION in out, (binary, out)
    pause = subprocess.run([str(kube / "pause"), "-v"], capture_output=True, text=True, check=False)
    assert "pause.c v3.10.2-source" in pause.stdout and "statically linked" in subprocess.run(
        ["file", str(kube / "pause")], capture_output=True, text=True).stdout  # fmt: skip
    # the images are named exactly as this kubeadm asks for them, each image tar names its one reference
    listed = subprocess.run([str(kube / "kubeadm"), "config", "images", "list", "--kubernetes-version", SOURCE_VERSION],
                            capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    shipped = {a.uri for a in manifest.artifacts if a.kind == "image"}
    assert shipped == set(listed) == set(source_release.images.values())
    for a in manifest.artifacts:
        if a.kind == "image":
            tar = source_release.root / a.archive_uri.split("://", 1)[1].split("/", 1)[1]  # type: ignore[union-attr]
            assert archive_refs(tar.read_bytes()) == [a.uri]
    # kube-proxy's image runs iptables (Debian's, nf_tables backend) as upstream's distroless-iptables base does
    proxy_tar = next(source_release.root.rglob("kube-proxy.tar"))
    unpacked = tmp_path / "kube-proxy-root"
    unpacked.mkdir()
    with tarfile.open(proxy_tar) as outer:
        layers = json.loads(outer.extractfile("manifest.json").read())[0]["Layers"]  # type: ignore[union-attr]
        for name in layers:
            with tarfile.open(fileobj=outer.extractfile(name)) as layer:  # type: ignore[arg-type]
                layer.extractall(unpacked, filter="fully_trusted")
    said = subprocess.run(["chroot", str(unpacked), "/usr/sbin/iptables", "-V"], capture_output=True, text=True)
    assert "nf_tables" in said.stdout, said.stdout + said.stderr
    assert (unpacked / "usr/local/bin/kube-proxy").is_file()
    etcd = next(c.bin_dir for c in source_release.components if c.name == "etcd")
    etcd_tag = source_release.images["etcd"].rsplit(":", 1)[1].split("-")[0]  # what this kubeadm asks for
    assert f"etcd Version: {etcd_tag}" in subprocess.run([str(etcd / "etcd"), "--version"], capture_output=True,
                                                   text=True, check=True).stdout  # fmt: skip

    # a second run takes what is cached: nothing is rebuilt, the same files come out
    stamps = {c.name: (c.bin_dir.parent / "inputs.json").stat().st_mtime_ns for c in source_release.components}
    from imagebuilder.release.source import build_release

    again = build_release(SOURCE_VERSION, tmp_path / "again")
    assert {c.name: (c.bin_dir.parent / "inputs.json").stat().st_mtime_ns for c in again.components} == stamps
    assert again.manifest_path.read_bytes() == source_release.manifest_path.read_bytes()


def _emulated(binary: Path, *args: str) -> str:
    """What an arm64 program prints, run on this host through qemu-user-static (binfmt_misc). The release lays its
    files out as a web server serves them (not executable): this is the test's own copy."""
    binary.chmod(0o755)
    proc = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=300, check=False)
    return proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_an_arm64_release_is_cross_compiled_for_real_and_runs_under_emulation(tmp_path: Path) -> None:
    """release.build --arch amd64,arm64 (issue 46): one manifest with both architectures' assets, as the distro's;
    every arm64 program an ELF for aarch64, static, and run here through qemu-user it says its version (runc's
    libseccomp included: linked from Debian's arm64 package by the cross gcc); the images are arm64 images."""
    from imagebuilder.core.arch import ARCHES, elf_machine

    res = run("release.build", "--kubernetes", SOURCE_VERSION, "--arch", "amd64,arm64", "--dest",
              str(tmp_path / "rel"), timeout=3600)  # fmt: skip
    assert res.code == 0, res.out + res.err
    assert "architectures: amd64, arm64" in res.out and "--arch amd64,arm64" in res.out
    manifest_path = next((tmp_path / "rel").rglob("kubernetes-1-36-source-3.yaml"))
    amd, arm = (load_manifest(str(manifest_path), arch=a) for a in ("amd64", "arm64"))
    assert amd.kubernetes_version == arm.kubernetes_version == SOURCE_VERSION and arm.arch == "arm64"
    files = {}
    for manifest, name in ((amd, "amd64"), (arm, "arm64")):
        for a in manifest.artifacts:  # a binary or tarball by its URL, an image by its tar's
            url = a.archive_uri or a.uri
            path = tmp_path / "rel" / url.split("://", 1)[1].split("/", 1)[1]
            assert hashlib.sha256(path.read_bytes()).hexdigest() == a.sha256, path
            assert f"linux/{name}" in url or f"linux-{name}" in url, url
            files[(name, path.name)] = path
    arm_bin = files[("arm64", "kubelet")].parent
    unpacked = tmp_path / "unpacked"
    # each image's layers, unpacked: the pause binary is shipped in its image only
    for name in ("pause.tar", "kube-proxy.tar"):
        with tarfile.open(files[("arm64", name)]) as outer:
            layers = json.loads(outer.extractfile("manifest.json").read())[0]["Layers"]  # type: ignore[union-attr]
            for layer_name in layers:
                with tarfile.open(fileobj=outer.extractfile(layer_name)) as layer:  # type: ignore[arg-type]
                    layer.extractall(unpacked / name, filter="fully_trusted")
    programs = [arm_bin / b for b in ("kubelet", "kubeadm", "kubectl", "kube-apiserver")]
    [runc_bin] = (tmp_path / "rel").rglob("runc/*/bin/linux/arm64/runc")  # beside its tarball, as the distro's
    for path in [*programs, runc_bin, unpacked / "pause.tar" / "pause"]:
        assert elf_machine(path) == ARCHES["arm64"].elf_machine, path
        kind = subprocess.run(["file", "-L", str(path)], capture_output=True, text=True).stdout
        assert "ARM aarch64" in kind and ("statically linked" in kind or "static-pie" in kind), kind
    assert elf_machine(files[("amd64", "kubelet")]) == ARCHES["amd64"].elf_machine
    assert SOURCE_VERSION in _emulated(arm_bin / "kubelet", "--version")
    assert SOURCE_VERSION in _emulated(arm_bin / "kubeadm", "version", "-o", "short")
    assert "pause.c v3.10.2-source" in _emulated(unpacked / "pause.tar" / "pause", "-v")
    runc = _emulated(runc_bin, "--version")
    assert "runc version 1.4.2" in runc and "libseccomp: 2." in runc, runc
    for name in ("containerd-v2.3.1-linux-arm64.tar.gz", "crictl-v1.36.0-linux-arm64.tar.gz",
                 f"cni-plugins-linux-arm64-{CNI}.tar.gz"):  # fmt: skip
        with tarfile.open(files[("arm64", name)]) as tar:
            tar.extractall(unpacked, filter="data")
    assert "v2.3.1" in _emulated(unpacked / "usr/local/bin/containerd", "--version")
    assert "crictl version 1.36.0" in _emulated(unpacked / "crictl", "--version")
    assert f"CNI bridge plugin {CNI}" in _emulated(unpacked / "bridge", "version")
    for name in ("kube-apiserver.tar", "kube-proxy.tar", "pause.tar", "etcd.tar", "coredns.tar"):
        config = image_config(files[("arm64", name)].read_bytes())
        assert config["architecture"] == "arm64" and config["os"] == "linux", name
        assert image_config(files[("amd64", name)].read_bytes())["architecture"] == "amd64"
    # kube-proxy's iptables is Debian's arm64 one
    assert elf_machine(unpacked / "kube-proxy.tar/usr/sbin/xtables-nft-multi") == ARCHES["arm64"].elf_machine
    # the mirror takes both architectures from it
    url = next(ln.split()[1] for ln in res.out.splitlines() if ln.startswith("url:"))
    mirror = run("mirror.create", "--release-channel", "1-36", "--release-manifest", url,
                 "--source", str(tmp_path / "rel"), "--dest", str(tmp_path / "mirror"), "--arch", "amd64,arm64",
                 timeout=600)  # fmt: skip
    assert mirror.code == 0 and "(amd64, arm64)" in mirror.out, mirror.out + mirror.err


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_release_images_import_into_containerd_under_kubeadms_names(
    source_release: SourceRelease, containerd: tuple[Path, Path]
) -> None:
    sock, root = containerd
    for tar in sorted(source_release.root.rglob("*.tar")):
        res = subprocess.run(["ctr", "--address", str(sock), "-n", "k8s.io", "images", "import", str(tar)],
                             capture_output=True, text=True)  # fmt: skip
        assert res.returncode == 0, (tar, res.stderr)
    db = root / "io.containerd.metadata.v1.bolt" / "meta.db"
    names = {k.decode() for k in BoltFile(db).bucket("v1", "k8s.io", "images")}
    assert set(source_release.images.values()) <= names


def test_a_join_pins_the_ca_hash_kubeadm_documents(tmp_path: Path) -> None:
    """The joins' configuration: the host's API server at the guests' address, the bootstrap token kubeadm's phase
    creates, and the CA's public-key hash computed the way kubeadm's documentation computes it with openssl; no key
    of the cluster's goes into a guest's seed."""
    from imagebuilder.image.controlplane import pki
    from imagebuilder.image.nodecheck import NODE_NAMES, Join, _seed, join_config

    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    cluster_pki = pki(work)
    pub = subprocess.run(["openssl", "x509", "-in", str(cluster_pki.folder / "ca.crt"), "-pubkey", "-noout"],
                         capture_output=True, check=True).stdout  # fmt: skip
    der = subprocess.run(["openssl", "pkey", "-pubin", "-outform", "der"], input=pub, capture_output=True,
                         check=True).stdout  # fmt: skip
    assert cluster_pki.ca_hash == hashlib.sha256(der).hexdigest()
    # the API server's certificate names every address it is reached at: the host's, the guests', the service's
    text = subprocess.run(["openssl", "x509", "-in", str(cluster_pki.folder / "apiserver.crt"), "-noout", "-text"],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    for name in ("IP Address:127.0.0.1", "IP Address:10.0.2.2", "IP Address:10.96.0.1", "DNS:kubernetes.default.svc"):
        assert name in text, text
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in cluster_pki.folder.iterdir()} == {
        n: "0o600" for n in ("ca.crt", "ca.key", "apiserver.crt", "apiserver.key", "admin.crt", "admin.key",
                             "sa.key", "sa.pub")}  # fmt: skip
    join = Join("abcdef.0123456789abcdef", cluster_pki.ca_hash, "10.0.2.2:40123")
    images = release_images(reference("eksd", "kubernetes-1-21-eks-4.yaml"))
    init, cluster, _ = yaml.safe_load_all(kubeadm_config(images, "v1.34.2", join))
    assert init["localAPIEndpoint"] == {"advertiseAddress": "10.0.2.2", "bindPort": 40123}
    assert init["bootstrapTokens"][0]["token"] == join.token and cluster["controlPlaneEndpoint"] == join.endpoint
    joined = yaml.safe_load(join_config("v1.30.0", join, NODE_NAMES[1]))
    assert joined["apiVersion"] == "kubeadm.k8s.io/v1beta3" and joined["kind"] == "JoinConfiguration"
    token = joined["discovery"]["bootstrapToken"]
    assert token["apiServerEndpoint"] == "10.0.2.2:40123" and token["caCertHashes"] == [f"sha256:{join.ca_hash}"]
    assert joined["nodeRegistration"]["name"] == "node-check-2"
    seed = _seed(kubeadm_config(images, "v1.34.2", join), join_config("v1.34.2", join, NODE_NAMES[1]), 1)
    user_data = yaml.safe_load(seed["user-data"])
    assert {f["path"] for f in user_data["write_files"]} == {
        "/etc/cni/net.d/10-node-check.conflist", "/root/node-check/kubeadm.yaml", "/root/node-check/join.yaml",
        "/root/node-check/run.sh"}  # fmt: skip
    assert "BEGIN" not in seed["user-data"], "no key or certificate of the cluster's in a guest"
    # the script says its steps on the machine's serial console: ttyAMA0 on QEMU's arm64 virt (its ttyS0 has no UART)
    script = {f["path"]: f["content"] for f in user_data["write_files"]}["/root/node-check/run.sh"]
    assert "out=/dev/ttyS0\n" in script and "@CONSOLE@" not in script
    arm = yaml.safe_load(_seed("kind: ClusterConfiguration", "kind: JoinConfiguration", 0, "ttyAMA0")["user-data"])
    assert "out=/dev/ttyAMA0\n" in {f["path"]: f["content"] for f in arm["write_files"]}["/root/node-check/run.sh"]
    assert "10.244.1.0/24" in seed["user-data"] and "local-hostname: node-check-2" in seed["meta-data"]


def test_real_kubeadm_validates_the_node_checks_configurations(source_release: SourceRelease, tmp_path: Path) -> None:
    """kubeadm's own strict decoder (``kubeadm config validate``) accepts what the node check hands kubeadm: the
    cluster's configuration with the join's token and the join configuration, the lengthened waits included."""
    from imagebuilder.image.nodecheck import NODE_NAME, SLOW_HOST_WAIT, Join, join_config

    kubeadm = next(c.bin_dir for c in source_release.components if c.name == "kubernetes") / "kubeadm"
    join = Join("abcdef.0123456789abcdef", "a" * 64, "10.0.2.2:40123")
    for name, text in (("init", kubeadm_config(source_release.images, source_release.kubernetes_version, join)),
                       ("join", join_config(source_release.kubernetes_version, join, NODE_NAME))):  # fmt: skip
        assert f"tlsBootstrap: {SLOW_HOST_WAIT}" in text or name == "init"
        config = tmp_path / f"{name}.yaml"
        config.write_text(text)
        res = subprocess.run([str(kubeadm), "config", "validate", "--config", str(config)], capture_output=True,
                             text=True, check=False)  # fmt: skip
        assert res.returncode == 0, f"{name}: {res.stdout}{res.stderr}"
        # the decoder is strict: a misspelt field is refused, so the passes above mean something
        config.write_text(text.replace("kubernetesVersion:", "kubernetesVersoin:").replace("discovery:", "discovry:"))
        res = subprocess.run([str(kubeadm), "config", "validate", "--config", str(config)], capture_output=True,
                             text=True, check=False)  # fmt: skip
        assert res.returncode != 0, res.stderr


def test_the_node_checks_control_plane_runs_on_the_host_from_the_releases_programs(
    source_release: SourceRelease, tmp_path: Path
) -> None:
    """The node check's control plane (imagebuilder.image.controlplane) from the release's real programs: etcd, the
    API server, the controller manager and the scheduler on 127.0.0.1, then the release's kubeadm's phases against
    them. A join's every need is in place: ``cluster-info`` at the guests' address, signed for the token by the
    controller manager's bootstrap signer; the token; the RBAC rules that approve its CSRs; kubeadm's and the
    kubelet's ConfigMaps; kube-proxy and CoreDNS; the ``kubernetes`` service's endpoint at the guests' address. The
    components end with the block."""
    import base64

    from imagebuilder.image import controlplane
    from imagebuilder.image.nodecheck import Join
    from imagebuilder.image.qemu import free_port

    bins = {c.name: c.bin_dir for c in source_release.components}
    programs = {name: bins["etcd" if name == "etcd" else "kubernetes"] / name for name in controlplane.PROGRAMS}
    kubeadm, kubectl = bins["kubernetes"] / "kubeadm", bins["kubernetes"] / "kubectl"
    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    cluster_pki = controlplane.pki(work)
    port = free_port()
    join = Join("abcdef.0123456789abcdef", cluster_pki.ca_hash, f"10.0.2.2:{port}")
    config = kubeadm_config(source_release.images, source_release.kubernetes_version, join)

    def get(*args: str) -> dict[str, object]:
        res = subprocess.run([str(kubectl), "--kubeconfig", str(work / "admin.conf"), "get", *args, "-o", "json"],
                             capture_output=True, text=True, check=False)  # fmt: skip
        assert res.returncode == 0, (args, res.stderr)
        return json.loads(res.stdout)  # type: ignore[no-any-return]

    with controlplane.running(programs, kubeadm, kubectl, config, work, port) as endpoint:
        assert endpoint.host == f"https://127.0.0.1:{port}" and endpoint.guest == join.endpoint
        deadline = time.monotonic() + 120
        while "jws-kubeconfig-abcdef" not in (info := get("configmap", "cluster-info", "-n", "kube-public"))["data"]:
            assert time.monotonic() < deadline, info
            time.sleep(2)
        discovered = yaml.safe_load(info["data"]["kubeconfig"])  # type: ignore[index]
        [cluster] = discovered["clusters"]
        assert cluster["cluster"]["server"] == f"https://10.0.2.2:{port}"
        assert base64.b64decode(cluster["cluster"]["certificate-authority-data"]) == cluster_pki.ca
        secret = get("secret", "bootstrap-token-abcdef", "-n", "kube-system")
        assert base64.b64decode(secret["data"]["token-secret"]).decode() == "0123456789abcdef"  # type: ignore[index]
        get("clusterrolebinding", "kubeadm:node-autoapprove-bootstrap")
        get("configmap", "kubeadm-config", "-n", "kube-system")
        get("configmap", "kubelet-config", "-n", "kube-system")
        get("daemonset", "kube-proxy", "-n", "kube-system")
        get("deployment", "coredns", "-n", "kube-system")
        proxy = get("configmap", "kube-proxy", "-n", "kube-system")
        assert f"server: https://10.0.2.2:{port}" in json.dumps(proxy["data"]).replace("\\n", "\n")
        endpoints = json.dumps(get("endpoints", "kubernetes", "-n", "default"))
        assert '"ip": "10.0.2.2"' in endpoints and f'"port": {port}' in endpoints, endpoints
        # no secret of the token's in any component's command line
        assert not running_with("0123456789abcdef")
    assert not running_with(str(work)), "the control plane's components ended with the block"


def test_a_control_plane_that_cannot_start_says_which_component_and_why(tmp_path: Path) -> None:
    """A component that exits (here an etcd whose data folder is a file) fails the control plane at once with its
    log's end, and the components that did start end too."""
    from imagebuilder.image import controlplane

    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    controlplane.pki(work)
    fake = tmp_path / "bin"
    fake.mkdir()
    programs = {}
    for name in controlplane.PROGRAMS:
        script = fake / name
        script.write_text("#!/bin/sh\necho 'etcd: cannot access data directory' >&2; exit 3\n" if name == "etcd"
                          else "#!/bin/sh\nexec sleep 300\n")  # fmt: skip
        script.chmod(0o755)
        programs[name] = script
    kubectl = fake / "kubectl"
    kubectl.write_text("#!/bin/sh\necho 'connection refused' >&2; exit 1\n")
    kubectl.chmod(0o755)
    with (
        pytest.raises(ExternalError, match=r"etcd exited \(3\)") as err,
        controlplane.running(programs, kubectl, kubectl, "x", work, 1),
    ):
        pass
    assert "cannot access data directory" in str(err.value)
    assert not running_with(str(fake)), "the components that started were ended"


def test_a_pod_that_does_not_run_says_why(tmp_path: Path) -> None:
    """The node check's failure detail for a Pending pod: its unmet conditions (an unscheduled pod has no container
    statuses) and its events. kubectl is a stand-in here printing the API's documented Pod and Event shapes."""
    from imagebuilder.image.controlplane import Kubectl
    from imagebuilder.image.nodecheck import _pod_events, _pod_state

    pod = {"status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/2 nodes are available: 1 node(s) had untolerated taint"}]}}  # fmt: skip
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(
        '#!/bin/sh\ncase "$*" in\n'
        f"  *'get pod node-check'*) echo '{json.dumps(pod)}' ;;\n"
        "  *'get events'*) echo '2026-11-26T10:00:00Z   FailedScheduling   default-scheduler   0/2 nodes' ;;\n"
        "esac\n"
    )
    kubectl.chmod(0o755)
    client = Kubectl(kubectl, tmp_path / "kubeconfig")
    ok, detail = _pod_state(client)
    assert not ok
    why = "0/2 nodes are available: 1 node(s) had untolerated taint"
    assert detail == f"phase Pending (PodScheduled=False Unschedulable: {why})"
    assert "FailedScheduling   default-scheduler" in _pod_events(client, "node-check")


@pytest.mark.slow
@pytest.mark.root
def test_the_node_checks_runtime_report_reads_the_release_containerd(
    source_release: SourceRelease, tmp_path: Path
) -> None:
    """The lines the node check's first guest runs to report its runtime (``RUNTIME_REPORT``), run here against the
    release's own containerd 2 and crictl on a private socket: ``crictl info`` states the systemd cgroup driver the
    containerd role writes (and not when the config says otherwise), the server its version."""
    from imagebuilder.image.nodecheck import RUNTIME_REPORT, runtime_ok

    bins = {c.name: c.bin_dir for c in source_release.components}
    default = subprocess.run([str(bins["containerd"] / "containerd"), "config", "default"], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
    assert default.startswith("version = 4") and "SystemdCgroup = false" in default
    env = {**os.environ, "PATH": f"{bins['containerd']}:{bins['cri-tools']}:{os.environ['PATH']}"}
    for systemd in (True, False):
        work = tmp_path / str(systemd)
        work.mkdir()
        sock = work / "c.sock"
        config = default.replace("SystemdCgroup = false", f"SystemdCgroup = {str(systemd).lower()}")
        config = config.replace("/var/lib/containerd", str(work / "root")).replace("/run/containerd/containerd.sock",
                                                                                     str(sock))  # fmt: skip
        config = config.replace("/run/containerd", str(work / "state"))
        (work / "config.toml").write_text(config)
        proc = subprocess.Popen([str(bins["containerd"] / "containerd"), "--config", str(work / "config.toml")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)  # fmt: skip
        try:
            wait_until(answers("ctr", "--address", str(sock), "version", env=env), proc, "containerd")
            script = 'say() { echo "NODE-CHECK $*"; }\n' + RUNTIME_REPORT.replace(
                "/run/containerd/containerd.sock", str(sock)
            ).replace("ctr version", f"ctr --address {sock} version")
            out = subprocess.run(["sh", "-c", script], cwd=work, env=env, capture_output=True, text=True, check=True)
        finally:
            stop(proc)
        event, _, detail = out.stdout.strip().removeprefix("NODE-CHECK ").partition(" ")
        words = dict(w.split("=", 1) for w in detail.split())
        assert event == "runtime" and words["containerd"] == "v2.3.1", out.stdout
        assert words["systemd"] == str(systemd).lower(), (out.stdout, (work / "crictl-info.json").read_text()[:500])
        cgroup = subprocess.run(["stat", "-fc", "%T", "/sys/fs/cgroup"], capture_output=True, text=True).stdout
        assert words["cgroup"] == cgroup.strip()
        unified = detail.replace(f"cgroup={words['cgroup']}", "cgroup=cgroup2fs")
        assert runtime_ok(event, unified) is systemd, "systemd cgroups on v2 pass; cgroupfs does not"
        assert not runtime_ok(event, unified.replace("cgroup2fs", "tmpfs")), "cgroup v1 does not pass"
