"""What an image says of its container runtime: the collector's digests of the runtime's binaries (the SBOM lists
them), ``image.diff`` showing a runtime change, and the node check's reading of the guest's runtime line."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from imagebuilder.attest.packages import parse_inventory
from imagebuilder.core.errors import InputError
from imagebuilder.image.diff import Inventory, compare
from imagebuilder.image.nodecheck import runtime_ok
from tests.support.runtime_cases import REFERENCE, STATUS, runtime_tarball


@pytest.mark.parametrize(
    "runtime",
    [
        {"/usr/local/bin/containerd": "not a digest"},
        {"../../etc/passwd": "a" * 64},
        {"/usr/bin/x\nInjected: 1": "a" * 64},
        {"/usr/bin/containerd": ["a" * 64]},
    ],
)
def test_a_damaged_inventory_does_not_carry_what_it_cannot_vouch_for(runtime: dict[str, object]) -> None:
    raw = {"format": 1, "os_release": "ID=debian\n", "dpkg_status": STATUS, "runtime": runtime}
    assert parse_inventory(raw, "inventory.json").runtime == {}


def test_image_diff_shows_a_runtime_change() -> None:
    def inv(runtime: dict[str, str]) -> Inventory:
        return Inventory({}, {}, frozenset(), {}, {}, runtime)

    a = inv({"/usr/local/bin/containerd": "a" * 64, "/usr/bin/containerd": "c" * 64})
    b = inv({"/usr/local/bin/containerd": "b" * 64})
    found = {(d.kind, d.name): (d.a, d.b) for d in compare(a, b)}
    assert found == {
        ("runtime", "/usr/local/bin/containerd"): ("a" * 64, "b" * 64),
        ("runtime", "/usr/bin/containerd"): ("c" * 64, None),
    }
    assert all(d.expected is None for d in compare(a, b)), "a runtime change is never an expected difference"


@pytest.mark.parametrize(
    ("event", "detail", "ok"),
    [
        ("runtime", "cgroup=cgroup2fs systemd=true containerd=v2.3.1", True),
        ("runtime", "cgroup=tmpfs systemd=true containerd=v2.3.1", False),  # cgroup v1
        ("runtime", "cgroup=cgroup2fs systemd=false containerd=v2.3.1", False),
        ("runtime", "cgroup=cgroup2fs systemd=unknown containerd=", False),
        ("containerd-down", "cgroup=cgroup2fs systemd=true", False),
        ("timeout", "none of runtime within 300 s", False),
        ("runtime", "cgroup=cgroup2fs systemd=true=x", False),
    ],
)
def test_the_node_check_reads_the_guests_runtime_line(event: str, detail: str, ok: bool) -> None:
    assert runtime_ok(event, detail) is ok


# --- the containerd role's install script, on every layout a release ships its tarball in ------------------------


# --- the runtime a product release's bundle ships: mirrored, then built from -------------------------------------


# --- image.verify: the runtime's binaries are the release tarball's ---------------------------------------------


def test_a_stand_in_release_carrying_a_runtime_is_planned_with_it(tmp_path: Path) -> None:
    """The manifest a stand-in release writes with a runtime reads back as release.build's do: components
    containerd, runc and cri-tools with their versions, the two tarballs as archives, and a plan that installs them."""
    from imagebuilder.builder.resolve import make_plan
    from imagebuilder.plan.model import BuildRequest
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.release.manifest import load_manifest
    from imagebuilder.release.standin import ReleaseRuntime, make_standin_release

    containerd = runtime_tarball(tmp_path / "c.tar.gz", REFERENCE).read_bytes()
    runtime = ReleaseRuntime(containerd, b"crictl tarball", "v1.7.28", "v1.3.3", "v1.36.0")
    release = make_standin_release(tmp_path / "mirror", load_catalog().channel("1-33"), runtime)
    manifest = load_manifest(str(release.manifest_path))
    assert dict(manifest.versions) == {"containerd": "v1.7.28", "runc": "v1.3.3", "cri-tools": "v1.36.0"}
    archives = {a.name: a for a in manifest.artifacts if a.kind == "archive"}
    assert archives["containerd"].sha256 == hashlib.sha256(containerd).hexdigest() and "crictl" in archives
    plan = make_plan(BuildRequest(os="ubuntu", hypervisor="baremetal", release_channel="1-33", offline=True,
                                  mirror=str(tmp_path / "mirror")))  # fmt: skip
    assert (plan.runtime.source, plan.runtime.containerd, plan.runtime.runc) == ("release", "v1.7.28", "v1.3.3")
    assert plan.runtime.config_version == 2
    # the same release for 1-36 is refused before anything runs: containerd 1.7 cannot run Kubernetes 1.36
    make_standin_release(tmp_path / "m36", load_catalog().channel("1-36"), runtime)
    with pytest.raises(InputError, match="needs containerd 2") as exc:
        make_plan(BuildRequest(os="ubuntu", hypervisor="baremetal", release_channel="1-36", offline=True,
                               mirror=str(tmp_path / "m36")))  # fmt: skip
    assert exc.value.field == "status.components[containerd].gitTag"
