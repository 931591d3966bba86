"""Helpers the tests share: where things are, the reference data, the real CLI as a subprocess, manifests of the
real format. Fixtures live in conftest.py; tests import these from here, never from conftest."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: real reference data, copied with its provenance (tests/data/README.md)
DATA = ROOT / "tests" / "data"
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
    """A file of the reference data in tests/data; a missing one fails the test (never skips)."""
    path = DATA.joinpath(*parts)
    assert path.is_file(), f"reference data missing: {path} (see tests/data/README.md)"
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


class ArgvWatcher:
    """Collects the command lines of every process while a build runs, to prove no secret is in any argv."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    with contextlib.suppress(OSError):
                        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                        self.seen.add(cmdline.replace(b"\0", b" ").decode(errors="replace"))
            time.sleep(0.2)

    def __enter__(self) -> ArgvWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def leaked_scratch(shm: Path = Path("/dev/shm")) -> list[Path]:
    """The folders runs name for themselves (``disk.scratch_dir`` in memory, ``disk.run_tempdir`` in the temp dir) of
    processes that are gone: what a run left behind."""
    out = []
    for entry in (*shm.glob("image-builder-*-*"), *Path(tempfile.gettempdir()).glob("image-builder-*-*")):
        pid = entry.name.split("-")[2]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            out.append(entry)
    return out


def tagged(run: int) -> list[str]:
    """The processes that carry run ``run``'s tag (disk.stale_processes' mark) in their environment."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and f"IMAGE_BUILDER_RUN={run}-s".encode() in (entry / "environ").read_bytes():
                found.append(f"{entry.name} {(entry / 'comm').read_text().strip()}")
    return found


def run_folders(run: int) -> list[Path]:
    return [
        *Path("/dev/shm").glob(f"image-builder-{run}-*"),
        *Path(tempfile.gettempdir()).glob(f"image-builder-{run}-*"),
    ]
