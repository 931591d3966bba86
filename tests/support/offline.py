"""The offline namespace of the end-to-end builds: commands run inside it as a user would (the fixtures that make
the namespace, its stand-in upstream and its mirror are in tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.common import BIN, ROOT, vm_turn

#: the namespace's name: one per worker process, made and removed by each module that uses it
NETNS = f"ib-offline-{os.getpid()}"


def in_ns(
    ns: str, *args: str, home: Path, timeout: int = 3600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home), "IMAGE_BUILDER_WORKSPACE": str(home / "work"), **(env or {})}
    return subprocess.run(
        ["ip", "netns", "exec", ns, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


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
