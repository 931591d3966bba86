"""What an image says of its container runtime: the collector's digests of the runtime's binaries (the SBOM lists
them), ``image.diff`` showing a runtime change, and the node check's reading of the guest's runtime line."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from imagebuilder.attest.packages import COLLECTOR, parse_inventory
from tests.support.common import DATA, ROOT
from tests.support.runtime_cases import BINARIES, REFERENCE, STATUS, runtime_tarball


def _root(tmp_path: Path, files: dict[str, bytes]) -> Path:
    root = tmp_path / "root"
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(STATUS)
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def _collect(root: Path) -> dict[str, str]:
    out = subprocess.run([sys.executable, str(COLLECTOR), str(root)], capture_output=True, text=True, check=True)
    return dict(parse_inventory(json.loads(out.stdout), str(root)).runtime)


def test_the_collector_digests_the_runtime_binaries_the_image_holds(tmp_path: Path) -> None:
    files = {"usr/local/bin/containerd": b"containerd 2", "usr/local/sbin/runc": b"runc", "usr/bin/crictl": b"c"}
    root = _root(tmp_path, {**files, "usr/local/bin/other": b"not the runtime"})
    (root / "usr/bin/containerd").symlink_to("/etc/shadow")  # a link is not followed out of the image
    assert _collect(root) == {"/" + rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}


def test_an_image_without_a_runtime_lists_none(tmp_path: Path) -> None:
    assert _collect(_root(tmp_path, {})) == {}


# --- the containerd role's install script, on every layout a release ships its tarball in ------------------------

INSTALL = ROOT / "ansible/roles/containerd/files/install-runtime.sh"


def _merged_usr(tmp_path: Path) -> Path:
    """A root whose /sbin, /bin and /lib are links into /usr, as Debian 12 and Ubuntu 22.04+ have them."""
    root = tmp_path / "root"
    for d in ("usr/sbin", "usr/bin", "usr/lib", "usr/local/bin", "usr/local/sbin", "etc"):
        (root / d).mkdir(parents=True)
    for link in ("sbin", "bin", "lib"):
        (root / link).symlink_to(f"usr/{link}")
    return root


def _install(tarball: Path, root: Path, runc: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(INSTALL), str(tarball), str(runc or ""), str(root)], capture_output=True,
                          text=True, check=False)  # fmt: skip


OWN_UNIT = b"[Service]\nExecStart=/usr/local/bin/containerd\n"
RELEASE_BUILD = {**{f"usr/local/bin/{b}": b.encode() for b in BINARIES}, "usr/local/sbin/runc": b"runc",
                 "etc/systemd/system/containerd.service": OWN_UNIT}  # fmt: skip


@pytest.mark.parametrize(
    ("layout", "members", "unit"),
    [("release.build's", RELEASE_BUILD, "the tarball's"), ("the reference bundle's", REFERENCE, "containerd's own")],
)
def test_the_runtime_installs_from_every_release_layout_and_keeps_merged_usr(
    layout: str, members: dict[str, bytes], unit: str, tmp_path: Path
) -> None:
    root = _merged_usr(tmp_path)
    res = _install(runtime_tarball(tmp_path / "containerd.tar.gz", members), root)
    assert res.returncode == 0, (layout, res.stderr)
    assert (root / "sbin").is_symlink() and (root / "bin").is_symlink(), "/sbin and /bin stay links into /usr"
    for b in BINARIES:
        assert (root / "usr/local/bin" / b).read_bytes() == b.encode()
        assert (root / "usr/local/bin" / b).stat().st_mode & 0o777 == 0o755
    assert (root / "usr/local/sbin/runc").read_bytes() == b"runc"
    service = (root / "etc/systemd/system/containerd.service").read_text()
    assert "ExecStart=/usr/local/bin/containerd" in service
    assert ("Delegate=yes" in service) is (unit == "containerd's own")
    assert not (root / "usr/local/bin/CONTAINERD_ATTRIBUTION.txt").exists(), "only the runtime's binaries"
    assert not list((root / "usr/sbin").iterdir()), "nothing through the merged-/usr link"


def test_containerds_upstream_layout_takes_the_staged_runc(tmp_path: Path) -> None:
    root = _merged_usr(tmp_path)
    tarball = runtime_tarball(tmp_path / "containerd.tar.gz", {f"bin/{b}": b.encode() for b in BINARIES})
    res = _install(tarball, root)
    assert res.returncode == 1 and "no runc" in res.stderr
    runc = tmp_path / "runc.amd64"
    runc.write_bytes(b"upstream runc")
    res = _install(tarball, root, runc)
    assert res.returncode == 0, res.stderr
    assert (root / "usr/local/sbin/runc").read_bytes() == b"upstream runc"
    assert (root / "usr/local/bin/containerd").read_bytes() == b"containerd"


@pytest.mark.parametrize(
    ("members", "links", "why"),
    [
        ({}, {"usr/local/bin/containerd": "/etc/shadow", "usr/local/bin/ctr": "x",
              "usr/local/bin/containerd-shim-runc-v2": "x", "sbin/runc": "x"}, "holds no containerd"),
        ({"usr/local/bin/ctr": b"c"}, {}, "holds no containerd"),
        ({**{f"usr/local/bin/{b}": b"x" for b in BINARIES}}, {"sbin/runc": "/etc/shadow"}, "no runc"),
    ],
)  # fmt: skip
def test_a_tarball_that_links_out_or_lacks_a_binary_installs_nothing_from_outside(
    members: dict[str, bytes], links: dict[str, str], why: str, tmp_path: Path
) -> None:
    root = _merged_usr(tmp_path)
    res = _install(runtime_tarball(tmp_path / "containerd.tar.gz", members, links), root)
    assert res.returncode == 1 and why in res.stderr, res.stderr
    assert not (root / "usr/local/sbin/runc").exists()
    installed = [p for p in (root / "usr/local/bin").iterdir()]
    assert all(p.read_bytes() == b"x" for p in installed), "no host file copied in through a link"


def test_a_tarball_with_parent_paths_writes_nothing_outside(tmp_path: Path) -> None:
    import io
    import tarfile

    root = _merged_usr(tmp_path)
    tarball = tmp_path / "containerd.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        for name in ("../../escaped", "/abs-escaped", *[f"usr/local/bin/{b}" for b in BINARIES], "sbin/runc"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    res = _install(tarball, root)
    assert not (tmp_path.parent / "escaped").exists() and not Path("/abs-escaped").exists()
    # GNU tar refuses the member with '..' and strips the leading '/', and fails: nothing is installed
    assert res.returncode == 2 and "Member name contains '..'" in res.stderr, res.stderr
    assert not [p for p in root.rglob("*") if p.is_file()]


# --- the runtime a product release's bundle ships: mirrored, then built from -------------------------------------

PRODUCT_RELEASE = "v0.99.1"
#: a build that pins the product release
PINNED_BUILD = ("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--eksa-release",
                PRODUCT_RELEASE)  # fmt: skip


def _product_upstream(
    root: Path, tmp_path: Path, change: dict[str, object] | None = None, arches: tuple[str, ...] = ("amd64",)
) -> dict[str, str]:
    """At their upstream paths under ``root``: the stand-in 1-24 release, the reference's main bundle (its real
    format, tests/data/eksa) with a 1.24 versions bundle that pins that release and ships a containerd tarball in
    the reference's layout and a crictl tarball, and the product's release index naming the bundle."""
    import yaml

    from imagebuilder.core.fetch import Mirror
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.release.product import release_index_url
    from imagebuilder.release.standin import make_standin_release

    channel = load_catalog().channel("1-24")
    make_standin_release(root, channel, arches=arches)
    mirror = Mirror(str(root))
    bundles = yaml.safe_load((DATA / "eksa/main-bundle-release.yaml").read_text())
    vb = next(v for v in bundles["spec"]["versionsBundles"] if v["kubeVersion"] == "1.33")
    vb = json.loads(json.dumps(vb)) | {"kubeVersion": "1.24"}
    vb["eksD"]["manifestUrl"] = channel.manifest_url
    uris = {}
    for key, member in (("containerd", None), ("crictl", "crictl")):
        entry = vb["eksD"][key]
        uri = entry["uri"].replace("/1-33/", "/1-24/")
        path = Path(mirror.locate(uri))
        path.parent.mkdir(parents=True, exist_ok=True)
        runtime_tarball(path, REFERENCE if member is None else {"crictl": b"crictl"})
        data = path.read_bytes()
        entry.update(uri=uri, sha256=hashlib.sha256(data).hexdigest(), sha512=hashlib.sha512(data).hexdigest())
        uris[key] = uri
    for dotted, value in (change or {}).items():
        key, field = dotted.split(".")
        vb["eksD"][key][field] = value
    bundles["spec"]["versionsBundles"].append(vb)
    bundle_url = "https://anywhere-assets.eks.amazonaws.com/releases/bundles/199/manifest.yaml"
    Path(mirror.locate(bundle_url)).parent.mkdir(parents=True, exist_ok=True)
    Path(mirror.locate(bundle_url)).write_text(yaml.safe_dump(bundles))
    index = {"apiVersion": "anywhere.eks.amazonaws.com/v1alpha1", "kind": "Release",
             "spec": {"releases": [{"version": PRODUCT_RELEASE, "bundleManifestUrl": bundle_url}]}}  # fmt: skip
    Path(mirror.locate(release_index_url())).parent.mkdir(parents=True, exist_ok=True)
    Path(mirror.locate(release_index_url())).write_text(yaml.safe_dump(index))
    return uris


def test_mirror_create_carries_the_bundles_runtime_and_a_build_from_it_installs_it(
    tmp_path: Path, served: tuple[Path, str]
) -> None:
    from tests.support.common import run

    upstream, url = served
    uris = _product_upstream(upstream, tmp_path)
    copy = tmp_path / "copy"
    args = ("mirror.create", "--release-channel", "1-24", "--eksa-release", PRODUCT_RELEASE, "--source", url,
            "--dest", str(copy))  # fmt: skip
    res = run(*args)
    assert res.code == 0, res.err
    assert f"as product release {PRODUCT_RELEASE} pins it" in res.out
    for uri in uris.values():  # at their upstream paths, byte for byte
        rel = uri.split("://", 1)[1]
        assert (copy / rel.split("/", 1)[1]).read_bytes() == (upstream / rel.split("/", 1)[1]).read_bytes(), uri
    assert (copy / "releases/eks-a/manifest.yaml").is_file() and (copy / "releases/bundles/199/manifest.yaml").is_file()
    again = run(*args)
    assert again.code == 0 and "downloaded" not in again.out.replace("0 downloaded", ""), again.out
    # the air-gapped build reads the index, the bundle and the distro manifest from the copy, and the image gets
    # the bundle's runtime in place of the OS's
    res = run(
        *PINNED_BUILD,
        "--mirror", str(copy), "--offline", "--dry-run", "--output", "json")  # fmt: skip
    assert res.code == 0, res.err
    plan = json.loads(res.out)
    assert plan["runtime"]["source"] == "release" and plan["runtime"]["containerd"] == "v1.7.28"
    assert plan["runtime"]["crictl"] == "v1.36.0" and "bundle" in plan["runtime"]["why"]
    archives = {a["name"]: a["uri"] for a in plan["artifacts"] if a["kind"] == "archive"}
    assert archives["containerd"] == uris["containerd"] and archives["crictl"] == uris["crictl"]
    # --runtime os: the OS's package, the bundle's tarball not staged
    res = run(
        *PINNED_BUILD,
        "--mirror",
        str(copy),
        "--offline",
        "--dry-run",
        "--output",
        "json",
        "--runtime",
        "os",
    )
    assert res.code == 0 and "containerd" not in {a["name"] for a in json.loads(res.out)["artifacts"]}, res.err


def test_a_bundle_whose_tarball_is_not_what_it_states_mirrors_nothing_of_it(
    tmp_path: Path, served: tuple[Path, str]
) -> None:
    from tests.support.common import run

    upstream, url = served
    uris = _product_upstream(upstream, tmp_path, {"containerd.sha512": "0" * 128})  # the sha256 still matches
    copy = tmp_path / "copy"
    res = run("mirror.create", "--release-channel", "1-24", "--eksa-release", PRODUCT_RELEASE, "--source", url,
              "--dest", str(copy))  # fmt: skip
    assert res.code == 1 and "verification" in res.err, res.err
    rel = uris["containerd"].split("://", 1)[1].split("/", 1)[1]
    assert not (copy / rel).exists() and not (copy / "releases/eks-a/manifest.yaml").exists()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"containerd.sha256": "not-hex"}, "eksD.containerd.sha256"),
        ({"containerd.sha256": None}, "eksD.containerd.sha256"),
        ({"containerd.sha512": "x" * 128}, "eksD.containerd.sha512"),
        ({"containerd.uri": "file:///etc/shadow"}, "eksD.containerd.uri"),
        ({"containerd.uri": "https://h/a/../../../etc/containerd/v2.3.1/x.tar.gz"}, "eksD.containerd.uri"),
        ({"crictl.uri": "https://h/cri-tools/v1.36.0/x.tar.gz\nInjected: 1"}, "eksD.crictl.uri"),
        ({"containerd.uri": "https://release-bucket/1-24/containerd/v1.6.9/c.tar.gz"}, None),  # fine for 1.24
    ],
)
def test_a_hostile_bundle_runtime_is_bad_input_naming_its_field(
    tmp_path: Path, change: dict[str, object], field: str | None
) -> None:
    from tests.support.common import run

    upstream = tmp_path / "up"
    _product_upstream(upstream, tmp_path, change)
    res = run(
        *PINNED_BUILD,
        "--mirror", str(upstream), "--offline", "--dry-run", cwd=tmp_path)  # fmt: skip
    if field is None:
        assert res.code == 0 and "containerd v1.6.9" in res.out, res.err
        return
    assert res.code == 2 and field in res.err and "bundles/199/manifest.yaml" in res.err, res.err
    assert "\nInjected" not in res.err, "a value's line break is shown escaped, never printed"


def test_an_arm64_build_refuses_the_bundles_amd64_runtime(tmp_path: Path) -> None:
    """A product bundle names one runtime per line, its linux/amd64 tarball: an arm64 build pinned to it is refused,
    saying what to do instead (the release's arm64 artifacts are there)."""
    from tests.support.common import run

    upstream = tmp_path / "up"
    _product_upstream(upstream, tmp_path, arches=("amd64", "arm64"))
    res = run(*PINNED_BUILD, "--mirror", str(upstream), "--offline", "--dry-run", "--arch", "arm64", cwd=tmp_path)
    assert res.code == 2 and "eksD.containerd.uri" in res.err and "linux/amd64 only" in res.err, res.err
    assert "--runtime os" in res.err
    res = run(*PINNED_BUILD, "--mirror", str(upstream), "--offline", "--dry-run", cwd=tmp_path)
    assert res.code == 0 and "containerd" in res.out, res.err


# --- image.verify: the runtime's binaries are the release tarball's ---------------------------------------------


def test_verify_compares_the_runtime_binaries_with_the_release_tarball(tmp_path: Path) -> None:
    from imagebuilder.builder.verify import runtime_digests
    from imagebuilder.core.fetch import Mirror

    mirror = tmp_path / "mirror"
    uri = "https://release-bucket/artifacts/1-36/containerd/v2.3.1/containerd-linux-amd64.tar.gz"
    tarball = Path(Mirror(str(mirror)).locate(uri))
    tarball.parent.mkdir(parents=True)
    runtime_tarball(tarball, REFERENCE)
    sha256 = hashlib.sha256(tarball.read_bytes()).hexdigest()
    artifact = {"name": "containerd", "kind": "archive", "uri": uri, "sha256": sha256}
    plan = {"runtime": {"source": "release"}, "mirror": str(mirror), "artifacts": [artifact]}
    root = _merged_usr(tmp_path)
    assert _install(tarball, root).returncode == 0
    (found,) = runtime_digests(root, plan)
    assert found.ok and "/usr/local/sbin/runc" in found.detail and "/usr/local/bin/containerd" in found.detail
    (root / "usr/local/sbin/runc").write_bytes(b"another runc")
    (found,) = runtime_digests(root, plan)
    assert not found.ok and found.detail.endswith("tarball: /usr/local/sbin/runc"), found.detail
    # not on this machine: said, not fetched; the OS's runtime: nothing to compare
    (found,) = runtime_digests(root, {**plan, "mirror": None})
    assert found.ok and found.detail.startswith("not compared")
    assert runtime_digests(root, {**plan, "runtime": {"source": "os"}}) == []
