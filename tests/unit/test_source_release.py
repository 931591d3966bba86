"""Kubernetes built from upstream source (release.build), in process: its version grammar, the image archives it
makes, containerd's metadata as the node check and image.verify read it, and the kubeadm configuration of the node
check. The release built for real, and its images imported into a real containerd, are in
tests/integration/test_source_release.py."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.image.boltdb import BoltFile, containerd_images
from imagebuilder.image.nodecheck import Join, join_config, kubeadm_config
from imagebuilder.release.imagearchive import Entry, ImageSpec, archive_refs, docker_archive
from imagebuilder.release.manifest import IMAGE_REF, parse_manifest
from imagebuilder.release.source import parse_version
from tests.support.common import reference
from tests.support.source_release import release_images

# --- fast -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "want"), [("v1.34.2", ("v1.34.2", 34, 2)), ("1.28.0", ("v1.28.0", 28, 0))])
def test_a_release_version_is_read(value: str, want: tuple[str, int, int]) -> None:
    assert parse_version(value) == want


@pytest.mark.parametrize("bad", ["1.34", "v1.34.2-rc.0", "v2.0.0", "v1.27.9", "v1.34.2\nx", "latest", "v1.34.2;rm"])
def test_a_bad_release_version_is_refused(bad: str) -> None:
    with pytest.raises(InputError) as exc:
        parse_version(bad)
    assert exc.value.field == "--kubernetes"


def test_an_image_archive_is_the_same_bytes_each_time_and_names_its_reference() -> None:
    layer = {"pause": Entry(b"\x7fELF...", 0o755), "tmp": Entry(None, 0o1777)}
    spec = ImageSpec("registry.k8s.io/pause:3.10.1", (layer,), ("/pause",), {"a": "b"}, "65535:65535")
    data = docker_archive(spec)
    assert data == docker_archive(spec)
    assert archive_refs(data) == ["registry.k8s.io/pause:3.10.1"]
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
        config = json.loads(tar.extractfile(manifest[0]["Config"]).read())  # type: ignore[union-attr]
        layer = tar.extractfile(manifest[0]["Layers"][0]).read()  # type: ignore[union-attr]
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    assert config["config"]["Entrypoint"] == ["/pause"] and config["config"]["User"] == "65535:65535"
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["pause"].mode == 0o755 and members["pause"].uid == 0 and members["pause"].mtime == 0
    assert members["tmp"].isdir() and members["tmp"].mode == 0o1777


def test_a_folder_becomes_layer_entries_with_its_links(tmp_path: Path) -> None:
    from imagebuilder.release.imagearchive import layer_tar, tree_entries

    (tmp_path / "usr/sbin").mkdir(parents=True)
    (tmp_path / "usr/sbin/xtables-nft-multi").write_bytes(b"\x7fELF")
    (tmp_path / "usr/sbin/xtables-nft-multi").chmod(0o755)
    (tmp_path / "usr/sbin/iptables").symlink_to("xtables-nft-multi")
    (tmp_path / "usr/share/doc").mkdir(parents=True)
    (tmp_path / "usr/share/doc/x").write_text("docs")
    entries = tree_entries(tmp_path, skip=("usr/share",))
    assert set(entries) == {"usr", "usr/sbin", "usr/sbin/xtables-nft-multi", "usr/sbin/iptables"}
    with tarfile.open(fileobj=io.BytesIO(layer_tar(entries))) as tar:
        link = tar.getmember("usr/sbin/iptables")
        assert link.issym() and link.linkname == "xtables-nft-multi"
        assert tar.getmember("usr/sbin/xtables-nft-multi").mode == 0o755


JOIN = Join("abcdef.0123456789abcdef", "a" * 64, "10.0.2.2:40123")


def test_kubeadm_is_told_the_repositories_and_tags_a_distro_release_names() -> None:
    images = release_images(reference("eksd", "kubernetes-1-21-eks-4.yaml"))
    docs = list(yaml.safe_load_all(kubeadm_config(images, "v1.21.2", JOIN)))
    init, cluster, kubelet = docs
    assert init["apiVersion"] == "kubeadm.k8s.io/v1beta3" and init["kind"] == "InitConfiguration"
    assert cluster["imageRepository"] == "public.ecr.aws/eks-distro/kubernetes"
    assert cluster["kubernetesVersion"] == images["kube-apiserver"].rsplit(":", 1)[1]
    etcd, dns = cluster["etcd"]["local"], cluster["dns"]
    assert f"{etcd['imageRepository']}/etcd:{etcd['imageTag']}" == images["etcd"]
    assert f"{dns['imageRepository']}/coredns:{dns['imageTag']}" == images["coredns"]
    assert kubelet["cgroupDriver"] == "systemd"
    assert "timeouts" not in init, "v1beta3 has no timeouts: the join's discovery.timeout instead"


def test_kubeadm_configuration_of_a_current_release_is_v1beta4() -> None:
    images = {
        "kube-apiserver": "registry.k8s.io/kube-apiserver:v1.34.2",
        "etcd": "registry.k8s.io/etcd:3.6.5-0",
        "coredns": "registry.k8s.io/coredns/coredns:v1.12.1",
        "pause": "registry.k8s.io/pause:3.10.1",
    }
    init, cluster, _ = yaml.safe_load_all(kubeadm_config(images, "v1.34.2", JOIN))
    assert init["apiVersion"] == cluster["apiVersion"] == "kubeadm.k8s.io/v1beta4"
    assert (
        cluster["imageRepository"] == "registry.k8s.io"
        and cluster["dns"]["imageRepository"] == "registry.k8s.io/coredns"
    )
    # the control plane is the host's, reached by the guests at QEMU's address of the host: kube-proxy's kubeconfig
    # and the joins' discovery say so
    assert cluster["controlPlaneEndpoint"] == "10.0.2.2:40123"
    assert init["localAPIEndpoint"] == {"advertiseAddress": "10.0.2.2", "bindPort": 40123}
    # a join under TCG waits longer than kubeadm's defaults (the host's phases need no more than them)
    joined = yaml.safe_load(join_config("v1.34.2", JOIN, "node-check"))
    assert joined["timeouts"]["tlsBootstrap"] == joined["timeouts"]["discovery"] == "20m0s" and "timeouts" not in init


def test_crictl_is_optional_in_a_release_and_installed_when_shipped(tmp_path: Path) -> None:
    doc = yaml.safe_load((reference("eksd", "kubernetes-1-21-eks-4.yaml")).read_text())
    assert "crictl" not in {a.name for a in parse_manifest(yaml.safe_dump(doc), "m").artifacts}
    sha = "a" * 64
    doc["status"]["components"].append({"name": "cri-tools", "gitTag": "v1.21.0", "assets": [
        {"name": "crictl-v1.21.0-linux-amd64.tar.gz", "type": "Archive", "os": "linux", "arch": ["amd64"],
         "archive": {"uri": "https://h/crictl-v1.21.0-linux-amd64.tar.gz", "sha256": sha}}]})  # fmt: skip
    crictl = next(a for a in parse_manifest(yaml.safe_dump(doc), "m").artifacts if a.name == "crictl")
    assert crictl.kind == "archive" and crictl.sha256 == sha


@given(st.text(min_size=1, max_size=60))
def test_an_image_reference_never_carries_what_a_config_or_shell_would_act_on(text: str) -> None:
    if IMAGE_REF.fullmatch(text):
        assert not set(text) & set("\"'`$;|&<>\\ \t\n\r{}()[]*?!#%")


@pytest.mark.parametrize(
    "ref",
    [
        'registry.k8s.io/pause:3.10"\nsandbox_image = "evil',
        "registry.k8s.io/pause:3.10|x",
        "pause:3.10",
        "registry.k8s.io/pause:3.10 --privileged",
        "registry.k8s.io/Pause:1",
    ],
)
def test_a_manifest_with_a_hostile_image_reference_is_refused(ref: str) -> None:
    doc = yaml.safe_load((reference("eksd", "kubernetes-1-21-eks-4.yaml")).read_text())
    for comp in doc["status"]["components"]:
        for asset in comp["assets"]:
            if asset.get("name") == "pause-image":
                asset["image"]["uri"] = ref
    with pytest.raises(InputError) as exc:
        parse_manifest(yaml.safe_dump(doc), "m.yaml")
    assert exc.value.field == "image.uri"


def test_a_file_that_is_not_bbolt_is_an_error_naming_it(tmp_path: Path) -> None:
    for name, data in (("empty", b""), ("text", b"not a database\n" * 600), ("zeros", bytes(8192))):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ExternalError) as exc:
            BoltFile(tmp_path / name)
        assert str(tmp_path / name) in str(exc.value)
    assert containerd_images(tmp_path) == {}  # no containerd metadata at all: nothing preloaded


# --- a real containerd ------------------------------------------------------------------------------------------


# --- the release built from source (slow: the Go module proxy, cached under ~/.cache) --------------------------


def test_the_source_cache_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from imagebuilder.release.source import source_cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert source_cache() == tmp_path / "image-builder" / "source-release"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert source_cache() == Path(os.path.expanduser("~/.cache/image-builder/source-release"))


def test_two_runs_asking_for_one_component_at_once_build_it_once(tmp_path: Path) -> None:
    """Two release.build runs on one host (or a test beside the setup that warms the cache) ask for the same
    component: the second waits for the first's build and takes it, instead of emptying the folder under it."""
    import threading
    import time

    from imagebuilder.release.source import cached_build

    builds: list[int] = []
    started = threading.Event()

    def build(bin_dir: Path) -> None:
        builds.append(threading.get_ident())
        started.set()
        time.sleep(0.5)  # the other run asks meanwhile
        (bin_dir / "kubelet").write_text("built once")

    folder, key = tmp_path / "kubernetes-v1.36.3", {"version": "v1.36.3"}
    got: list[Path] = []
    first = threading.Thread(target=lambda: got.append(cached_build(folder, key, ("kubelet",), build)))
    first.start()
    assert started.wait(10)
    second = cached_build(folder, key, ("kubelet",), build)
    first.join()
    assert len(builds) == 1 and got == [second] and (second / "kubelet").read_text() == "built once"
    # another key is built again (a component's inputs changed), under the same lock
    assert cached_build(folder, {"version": "v1.36.4"}, ("kubelet",), build) == second and len(builds) == 2
