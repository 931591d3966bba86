"""Shared fixtures (mirror, HTTP server, vcsim, small OVAs) and the markers; helpers are in tests/support/."""

from __future__ import annotations

import contextlib
import functools
import http.server
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support import schedule
from tests.support.common import make_manifest
from tests.support.mutation import use_hypothesis_profile
from tests.support.schedule import HEAVY, pytest_addoption, pytest_xdist_make_scheduler  # noqa: F401 - hooks
from tests.support.timeline import (  # noqa: F401 - hooks
    pytest_runtest_call,
    pytest_runtest_logreport,
    pytest_runtest_makereport,
    pytest_runtest_setup,
    pytest_runtest_teardown,
    pytest_sessionfinish,
    pytest_sessionstart,
)

if TYPE_CHECKING:
    from imagebuilder.release.source import RuntimeBuild, SourceRelease
    from imagebuilder.release.standin import ReleaseRuntime
    from tests.support.vcsim import Vcsim

use_hypothesis_profile()  # under invoke test --mutation only: no deadlines, the same examples each run


def pytest_configure(config: pytest.Config) -> None:
    schedule.pytest_configure(config)
    # an interrupted run (CI timeout, Ctrl-C of a parent) must still detach loop devices and unmount
    import signal

    def _terminate(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _terminate)


def pytest_assertrepr_compare(config: pytest.Config, op: str, left: object, right: object) -> list[str] | None:
    """Two long byte strings that differ are shown as where they differ, not whole: pytest's full diff of a disk
    image or a database file runs to thousands of lines, and a CI log's tail then shows neither the test nor the
    difference."""
    if op != "==" or not isinstance(left, bytes | bytearray) or not isinstance(right, bytes | bytearray):
        return None
    if max(len(left), len(right)) <= 256:
        return None
    at = next((i for i, (a, b) in enumerate(zip(left, right, strict=False)) if a != b), min(len(left), len(right)))
    start = max(0, at - 16)
    return [
        f"{len(left)} bytes == {len(right)} bytes: they differ first at offset {at}",
        f"left [{start}:{at + 32}]: {bytes(left[start : at + 32]).hex(' ')}",
        f"right[{start}:{at + 32}]: {bytes(right[start : at + 32]).hex(' ')}",
    ]


@pytest.fixture
def mirror_dir(tmp_path: Path) -> Path:
    """A mirror directory holding the 1-24 channel manifest at its upstream path, and the line's runtime (stand-in
    bytes) as its projects publish it with their checksum files: the distro's manifests name none."""
    from tests.support.runtime_cases import standin_upstream_runtime

    root = tmp_path / "mirror"
    target = root / "kubernetes-1-24" / "kubernetes-1-24-eks-36.yaml"
    target.parent.mkdir(parents=True)
    target.write_text(make_manifest("1-24", 36, "v1.24.17"))
    standin_upstream_runtime(root, "1-24")
    return root


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def serve_folder(root: Path) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 serving ``root`` (as a site serves a mirror); its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def http_server(mirror_dir: Path) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 serving the mirror directory."""
    with serve_folder(mirror_dir) as url:
        yield url


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """An empty folder the test fills, served over HTTP on 127.0.0.1: the folder and its base URL."""
    root = tmp_path / "served"
    root.mkdir()
    with serve_folder(root) as url:
        yield root, url


@pytest.fixture
def vcsim() -> Iterator[Vcsim]:
    """A fresh vcsim on 127.0.0.1 for one test, stopped after."""
    from tests.support.vcsim import start_vcsim

    sim = start_vcsim()
    try:
        yield sim
    finally:
        sim.stop()


@pytest.fixture(scope="session", autouse=True)
def shared_dir(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Iterator[Path]:
    """The folder every worker of this run sees: for what they make once and share (the base image, the source
    release) and the locks they take turns by (tests.support.common.vm_turn)."""
    from tests.support.common import SHARED

    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    SHARED[:] = [shared]
    yield shared
    SHARED.clear()


@pytest.fixture(scope="session")
def small_ovas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small OVAs made the way builds make theirs: OS-1 style with two disks, OS-2 style with one."""
    from imagebuilder.image.ova import make_ova

    work = tmp_path_factory.mktemp("ova")
    disks = []
    for name, size in (("d1", "64M"), ("d2", "32M")):
        disk = work / f"{name}.qcow2"
        subprocess.run(["qemu-img", "create", "-f", "qcow2", str(disk), size], check=True, capture_output=True)
        disks.append(disk)
    return {
        "bottlerocket": make_ova(disks[0], work / "os1.ova", name="os1", extra_disks=[disks[1]]),
        "ubuntu": make_ova(disks[0], work / "os2.ova", name="os2"),
    }


@pytest.fixture(scope="session")
def base_image(shared_dir: Path) -> tuple[Path, str]:
    """image.base's Debian cloud-style image, made once per run (debootstrap takes minutes): in a parallel run
    (pytest-xdist) the first worker that needs it makes it, under a lock, and the others use that one.

    It is made the way an operator's interrupted run would make it (issue 29's fault injection for image.base, at no
    extra build): ``image.base`` is killed, its whole process group with SIGKILL, a few seconds into debootstrap
    (its disk attached to loop devices and mounted in the host's namespace, debootstrap running), then run again
    into the same place. The rerun must succeed and leave nothing of the killed run."""
    import random
    import subprocess

    from imagebuilder.core.files import held
    from imagebuilder.image.bootcheck import check_image
    from tests.support.common import BIN, ROOT, group_alive, kill_at, local_shortcut, loops_on, mounts_under, tagged

    reuse = local_shortcut("IMAGE_BUILDER_TEST_BASE_IMAGE")  # refused under CI, which always makes its own
    if reuse:
        return Path(reuse), Path(reuse + ".sha256").read_text().split()[0]
    folder = shared_dir / "base-image"
    folder.mkdir(exist_ok=True)
    with held(shared_dir / "base-image.lock"):
        done = folder / "digest"
        if done.is_file():
            return folder / "debian-base.qcow2", done.read_text().strip()
        image = folder / "debian-base.qcow2"
        argv = [str(BIN / "image-builder"), "image.base", "--dest", str(image)]
        first = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 start_new_session=True)  # fmt: skip
        kill_at(first, "$ debootstrap", random.Random(29).uniform(5, 10))
        rerun = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=3600, check=False)
        assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
        digest = Path(f"{image}.sha256").read_text().split()[0]
        # nothing of the killed run: its processes, mounts, loops and half-made image beside the output
        assert not group_alive(first.pid) and not tagged(first.pid), (group_alive(first.pid), tagged(first.pid))
        assert not mounts_under(folder) and not loops_on(str(folder)), (mounts_under(folder), loops_on(str(folder)))
        assert sorted(p.name for p in folder.iterdir()) == ["debian-base.qcow2", "debian-base.qcow2.sha256"]
        done.write_text(digest)
    # what image.base ships: a cleanly unmounted filesystem and a boot sector that points at its loader
    check = check_image(image)
    assert check.ok, check.problems
    assert any("ldlinux.sys" in n and "consistent" in n for n in check.notes), check.notes
    assert not list(image.parent.glob(".*.tmp")), "no work folder left beside the image"
    return image, digest


@pytest.fixture(scope="session")
def source_release(shared_dir: Path, worker_id: str) -> SourceRelease:
    """Kubernetes v1.36.3 (with containerd v2.3.1, the runc it pins and crictl v1.36.0) built from upstream source
    by release.build and laid out once per run; the components
    come from ~/.cache/image-builder (the first run on a machine builds them: about 15 minutes on 2 cores). A
    missing Go or gcc fails the tests that need it (CI installs both)."""
    from imagebuilder.core.files import held
    from imagebuilder.release.source import build_release
    from tests.support.sources import SOURCE_RELEASE

    with held(shared_dir / "source-release.lock"):  # one worker builds, the others wait and lay out from the cache
        return build_release(SOURCE_RELEASE, shared_dir / f"source-release-{worker_id}")


@pytest.fixture(scope="session")
def runtime_of_a_1_7_line(shared_dir: Path) -> ReleaseRuntime:
    """The real runtime of a containerd 1.7 line (v1.7.28, the runc it pins, crictl v1.36.0: what the reference's
    bundle names for 1-30 .. 1-33), built from upstream source by release.build's own recipe (cached under
    ~/.cache/image-builder: about 3 minutes once) and packed as the reference's bundle packs it (its containerd
    tarball: usr/local/bin/ and sbin/runc, no unit; its cri-tools tarball: ./crictl), for a stand-in release to
    carry."""
    from imagebuilder.release.standin import ReleaseRuntime
    from tests.support.runtime import reference_tarballs

    built = runtime_1_7_build(shared_dir)
    containerd, crictl = reference_tarballs(built)
    return ReleaseRuntime(containerd, crictl, built.containerd, built.runc, built.crictl)


def runtime_1_7_build(shared_dir: Path) -> RuntimeBuild:
    """The containerd 1.7 line's runtime built from source (the cache's, once built), one worker at a time."""
    from imagebuilder.core.files import held
    from imagebuilder.release import source
    from tests.support.sources import RUNTIME_1_7

    with held(shared_dir / "runtime-1-7.lock"):
        return source.build_runtime(*RUNTIME_1_7)


@pytest.fixture(scope="session")
def upstream_runtime_1_7(shared_dir: Path) -> RuntimeBuild:
    """The runtime every line without one of its own takes by default (config/release-channels.yaml
    runtime_defaults: containerd v1.7.28, the runc it pins, crictl v1.36.0), built from source; a test lays it out
    as its projects publish it (tests/support/runtime.py write_upstream_runtime)."""
    return runtime_1_7_build(shared_dir)


# --- the offline namespace of the end-to-end builds (made per module that uses it) ---------------------------------


@pytest.fixture(scope="module")
def offline_ns() -> Iterator[str]:
    """A network namespace with only loopback: no route to anything else."""
    from tests.support.offline import NETNS

    subprocess.run(["ip", "netns", "add", NETNS], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", NETNS, "ip", "link", "set", "lo", "up"], check=True)
        yield NETNS
    finally:
        subprocess.run(["ip", "netns", "del", NETNS], check=False)


@pytest.fixture(scope="module")
def upstream_server(
    offline_ns: str, tmp_path_factory: pytest.TempPathFactory, upstream_runtime_1_7: RuntimeBuild
) -> Iterator[str]:
    """The stand-in release served by a real HTTP server on 127.0.0.1 inside the namespace, with the line's
    runtime (the real one, built from source) as containerd, runc and cri-tools publish theirs: the distro's
    releases name none, so the images take it (issue 42)."""
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.release.standin import make_standin_release
    from tests.support.offline import served_in_ns
    from tests.support.runtime import write_upstream_runtime

    root = tmp_path_factory.mktemp("upstream")
    make_standin_release(root, load_catalog().channel("1-24"))
    write_upstream_runtime(root, load_catalog().channel("1-24"), upstream_runtime_1_7)
    with served_in_ns(offline_ns, root, 18080) as url:  # the namespace's own loopback: no other test sees it
        yield url


@pytest.fixture(scope="module")
def source_server(offline_ns: str, source_release: SourceRelease) -> Iterator[str]:
    """The release built from source, served inside the namespace as a site would serve release.build's folder."""
    from tests.support.offline import served_in_ns

    with served_in_ns(offline_ns, source_release.root, 18082) as url:
        yield url


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("home")
    (home / ".ssh").mkdir()
    (home / ".ssh" / "config").write_text("HostKeyAlgorithms +ssh-rsa\nPubkeyAcceptedKeyTypes +ssh-rsa\n")
    return home


@pytest.fixture(scope="module")
def mirror(offline_ns: str, upstream_server: str, home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A mirror made by mirror.create inside the namespace from the stand-in upstream; a rerun converges."""
    from tests.support.common import BIN
    from tests.support.offline import in_ns

    dest = tmp_path_factory.mktemp("mirror")
    res = in_ns(offline_ns, str(BIN / "image-builder"), "mirror.create", "--release-channel", "1-24",
                "--dest", str(dest), "--source", upstream_server, home=home)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "15 artifacts (15 downloaded, all sha256-verified)" in res.stdout, "12 of the release, 3 of its runtime"
    again = in_ns(offline_ns, str(BIN / "image-builder"), "mirror.create", "--release-channel", "1-24",
                  "--dest", str(dest), "--source", upstream_server, home=home)  # fmt: skip
    assert "(0 downloaded" in again.stdout  # a rerun converges
    return dest


#: modules whose every test needs these (tests that use the vcsim fixture are marked from it)
MODULE_MARKS = {
    "test_bootcheck.py": ("root",),
    "test_dhcp.py": ("root", "netns"),
    "test_hostprep.py": ("root", "slow"),
    "test_e2e_offline.py": ("root", "netns", "qemu", "slow"),
    "test_e2e_packers.py": ("root", "netns", "qemu", "slow"),
    "test_customize_guest.py": ("root", "qemu", "vcsim", "slow"),
    "test_vsphere.py": ("vcsim",),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for mark in MODULE_MARKS.get(item.path.name, ()):
            item.add_marker(mark)
        if "vcsim" in getattr(item, "fixturenames", ()):
            item.add_marker("vcsim")
    # the heavy modules (those that boot VMs first), longest first: xdist hands the first modules out one per worker
    # in turn, so the two end-to-end builds start at once on their own workers and the real-guest customization
    # follows the first; the short modules then fill the time beside and after them (on the filler worker, beside
    # them from the start: tests/support/schedule.py), rather than one long module starting last and alone
    # (xdist's default reorder, by test count, puts these last)
    items.sort(key=lambda item: HEAVY.index(item.path.name) if item.path.name in HEAVY else len(HEAVY))
