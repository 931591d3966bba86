"""The offline namespace of the end-to-end builds: commands run inside it as a user would (the fixtures that make
the namespace, its stand-in upstream and its mirror are in tests/conftest.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.support.common import BIN, ROOT, answers, stop, vm_turn, wait_until

#: the namespace's name: one per worker process, made and removed by each module that uses it
NETNS = f"ib-offline-{os.getpid()}"


def one_vcpu_config(home: Path) -> Path:
    """The product's ``config/`` with one change, made once beside ``home``: the build VM gets one vCPU, not two.

    Why: under TCG each vCPU is a host thread, and the two end-to-end modules build at the same time on a 2-core
    machine. Two builds whose VMs have two vCPUs each took 341 s apiece side by side; with one vCPU each, 287 s (alone
    a one-vCPU build takes 244 s against 197). The images are the same; --disk-gb 4 shrinks the build VM the same
    way. (The guests the tool starts itself follow its own rule: imagebuilder.image.emulation.vcpus.)"""
    dest = home.parent / f"{home.name}-config"
    if not dest.is_dir():
        staging = home.parent / f".{dest.name}"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(ROOT / "config", staging)
        matrix = staging / "matrix.yaml"
        text = matrix.read_text()
        assert "\nbuild_vm:\n  cpus: 2\n" in text, "config/matrix.yaml's build_vm changed: update this override"
        matrix.write_text(text.replace("\nbuild_vm:\n  cpus: 2\n", "\nbuild_vm:\n  cpus: 1\n"))
        staging.rename(dest)
    return dest


def ns_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a command the offline user runs: their HOME, a workspace under it, the config above."""
    return {**os.environ, "HOME": str(home), "IMAGE_BUILDER_WORKSPACE": str(home / "work"),
            "IMAGE_BUILDER_CONFIG_DIR": str(one_vcpu_config(home)), **extra}  # fmt: skip


def in_ns(
    ns: str, *args: str, home: Path, timeout: int = 3600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", ns, *args], cwd=ROOT, env=ns_env(home, **(env or {})), capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def build(
    ns: str, home: Path, provider: str, config: Path, mirror: Path | str, out: Path, *extra: str, channel: str = "1-24"
) -> subprocess.CompletedProcess[str]:
    with vm_turn():  # a Packer build runs a guest (and a chroot build both cores): never beside the node check
        return in_ns(
            ns, str(BIN / "image-builder"), "build", "--os", "ubuntu", "--hypervisor", provider,
            "--release-channel", channel, f"--{provider}-config", str(config), "--mirror", str(mirror), "--offline",
            "--output-dir", str(out), "--disk-gb", "4", "--min-disk-gb", "10", *extra, home=home,
        )  # fmt: skip


def scan_for(secret: str, *roots: Path) -> list[str]:
    hits = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and path.stat().st_size < 50_000_000 and secret.encode() in path.read_bytes():
                hits.append(str(path))
    return hits


@contextlib.contextmanager
def served_in_ns(ns: str, root: Path, port: int) -> Iterator[str]:
    """A real HTTP server (Python's) for ``root`` on 127.0.0.1:``port`` inside the namespace ``ns``."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, str(BIN / "python"), "-m", "http.server", str(port),
         "--bind", "127.0.0.1", "--directory", str(root)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            answers("ip", "netns", "exec", ns, "curl", "-sf", "-o", "/dev/null", url + "/"),
            proc,
            f"the HTTP server for {root.name}",
        )
        yield url
    finally:
        stop(proc)
