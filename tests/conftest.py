"""Shared fixtures: the real CLI as a subprocess, the shared reference data, manifests of the real format."""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.vcsim import Vcsim

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
REFERENCE = SHARED / "reference"
EXAMPLES = ROOT / "config" / "examples"
BIN = Path(sys.executable).parent

#: the seven buildable pairs and their example configs (None: no config needed)
PAIRS: dict[tuple[str, str], str | None] = {
    ("ubuntu", "vsphere"): "vsphere-ubuntu.json",
    ("redhat", "vsphere"): "vsphere-redhat.json",
    ("ubuntu", "baremetal"): None,
    ("redhat", "baremetal"): "baremetal-redhat.json",
    ("redhat", "cloudstack"): "cloudstack-redhat.json",
    ("ubuntu", "ami"): "ami-ubuntu.json",
    ("ubuntu", "nutanix"): "nutanix-ubuntu.json",
}


def reference(*parts: str) -> Path:
    """A file of ../shared/reference; a missing one fails the test (never skips)."""
    path = REFERENCE.joinpath(*parts)
    assert path.is_file(), f"reference data missing: {path} (the project expects ../shared beside it)"
    return path


@dataclass
class Result:
    code: int
    out: str
    err: str


def run(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, program: str = "image-builder"
) -> Result:
    """Run the real console script (``image-builder`` or ``invoke``) as a user would."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [str(BIN / program), *args],
        cwd=cwd or ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return Result(proc.returncode, proc.stdout, proc.stderr)


def build_args(os_name: str, provider: str, channel: str = "1-24", *extra: str) -> list[str]:
    args = ["build", "--os", os_name, "--hypervisor", provider, "--release-channel", channel]
    config = PAIRS.get((os_name, provider))
    if config:
        args += [f"--{provider}-config", str(EXAMPLES / config)]
    return [*args, *extra]


def make_manifest(channel: str, number: int, version: str) -> str:
    """A manifest of the real format for another release, derived from the real 1-21-eks-4 sample."""
    text = reference("eksd", "kubernetes-1-21-eks-4.yaml").read_text()
    text = text.replace("kubernetes-1-21/releases/4/", f"kubernetes-{channel}/releases/{number}/")
    text = text.replace("eks-1-21-4", f"eks-{channel}-{number}")
    text = text.replace("kubernetes-1-21-eks-4", f"kubernetes-{channel}-eks-{number}")
    text = text.replace("channel: 1-21", f"channel: {channel}").replace("number: 4", f"number: {number}")
    return text.replace("v1.21.2", version)


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
    from tests.vcsim import start_vcsim

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


#: modules whose every test needs these (tests that use the vcsim fixture are marked from it)
MODULE_MARKS = {
    "test_bootcheck.py": ("root",),
    "test_dhcp.py": ("root", "netns"),
    "test_hostprep.py": ("root", "slow"),
    "test_e2e_offline.py": ("root", "netns", "qemu", "vcsim", "slow"),
    "test_vsphere.py": ("vcsim",),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for mark in MODULE_MARKS.get(item.path.name, ()):
            item.add_marker(mark)
        if "vcsim" in getattr(item, "fixturenames", ()):
            item.add_marker("vcsim")
