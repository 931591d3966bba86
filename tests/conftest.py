"""Shared fixtures (mirror, HTTP server, vcsim, small OVAs) and the markers; helpers are in tests/support/."""

from __future__ import annotations

import functools
import http.server
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.common import make_manifest

if TYPE_CHECKING:
    from tests.support.vcsim import Vcsim


def pytest_configure(config: pytest.Config) -> None:
    # an interrupted run (CI timeout, Ctrl-C of a parent) must still detach loop devices and unmount
    import signal

    def _terminate(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _terminate)


@pytest.fixture
def mirror_dir(tmp_path: Path) -> Path:
    """A mirror directory holding the 1-24 channel manifest at its upstream path."""
    root = tmp_path / "mirror"
    target = root / "kubernetes-1-24" / "kubernetes-1-24-eks-5.yaml"
    target.parent.mkdir(parents=True)
    target.write_text(make_manifest("1-24", 5, "v1.24.8"))
    return root


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http_server(mirror_dir: Path) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 serving the mirror directory."""
    handler = functools.partial(_QuietHandler, directory=str(mirror_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def vcsim() -> Iterator[Vcsim]:
    """A fresh vcsim on 127.0.0.1 for one test, stopped after."""
    from tests.support.vcsim import start_vcsim

    sim = start_vcsim()
    try:
        yield sim
    finally:
        sim.stop()


@pytest.fixture(scope="session")
def small_ovas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small OVAs made the way builds make theirs: OS-1 style with two disks, OS-2 style with one."""
    from imagebuilder.ova import make_ova

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
def base_image(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """image.base's Debian cloud-style image, made once per session (debootstrap takes minutes)."""
    import os

    from imagebuilder.baseimage import make_base_image
    from imagebuilder.bootcheck import check_image

    reuse = os.environ.get("IMAGE_BUILDER_TEST_BASE_IMAGE")  # a local shortcut; CI always makes its own
    if reuse:
        return Path(reuse), Path(reuse + ".sha256").read_text().split()[0]
    image, digest = make_base_image(tmp_path_factory.mktemp("base") / "debian-base.qcow2")
    # what image.base ships: a cleanly unmounted filesystem and a boot sector that points at its loader
    check = check_image(image)
    assert check.ok, check.problems
    assert any("ldlinux.sys" in n and "consistent" in n for n in check.notes), check.notes
    assert not list(image.parent.glob(".image-base-*")), "no work folder left beside the image"
    return image, digest


#: modules whose every test needs these (tests that use the vcsim fixture are marked from it)
MODULE_MARKS = {
    "test_bootcheck.py": ("root",),
    "test_dhcp.py": ("root", "netns"),
    "test_hostprep.py": ("root", "slow"),
    "test_e2e_offline.py": ("root", "netns", "qemu", "vcsim", "slow"),
    "test_customize_guest.py": ("root", "qemu", "vcsim", "slow"),
    "test_vsphere.py": ("vcsim",),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for mark in MODULE_MARKS.get(item.path.name, ()):
            item.add_marker(mark)
        if "vcsim" in getattr(item, "fixturenames", ()):
            item.add_marker("vcsim")
