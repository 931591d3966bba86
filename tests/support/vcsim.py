"""vcsim (govmomi's vCenter simulator) started on 127.0.0.1 for a test, and govc to look at it independently.

Simulator differences the tests (and, where noted, the code) work around:

- vcsim must be started with a bare user name (``-username Administrator``): its SSO simulator stores the start-up
  user as ``<name>@vsphere.local`` and matches logins by that, so ``Administrator@vsphere.local`` logs in.
- SetEntityPermissions replaces every permission on the entity (real vCenter adds/updates): tests check only the
  group's own permission.
- AddAuthorizationRole answers 0 instead of the new role id (the code reads the id back by name).
- The privilege list is empty (the code takes the Administrator role's privileges as the known set).
- Tags and content library are served under ``/rest`` only; state lives in memory, so a restarted vcsim is fresh.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.common import wait_until

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".tools" / "bin"
VCSIM = TOOLS / "vcsim"
GOVC = TOOLS / "govc"
ADMIN = "Administrator@vsphere.local"
ADMIN_PASSWORD = "Sim-Admin-Pw-7c1f"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Vcsim:
    port: int
    proc: subprocess.Popen[bytes]
    #: vcsim's own TMPDIR: it backs each simulated datastore with a folder there and leaves them when killed
    tmpdir: Path | None = field(default=None)

    @property
    def server(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """Admin credentials and server as the CLI reads them (never flags)."""
        return {
            "GOVC_URL": f"https://{self.server}/sdk",
            "GOVC_USERNAME": ADMIN,
            "GOVC_PASSWORD": ADMIN_PASSWORD,
            "GOVC_INSECURE": "1",
        }

    def govc(self, *args: str, user: str = ADMIN, password: str = ADMIN_PASSWORD, check: bool = True) -> str:
        env = {**os.environ, **self.env, "GOVC_USERNAME": user, "GOVC_PASSWORD": password}
        proc = subprocess.run([str(GOVC), *args], env=env, capture_output=True, text=True, timeout=60)
        if check:
            assert proc.returncode == 0, f"govc {' '.join(args)}: {proc.stderr}"
        return proc.stdout

    def govc_json(self, *args: str) -> object:
        return json.loads(self.govc(*args[:1], "-json", *args[1:]) or "null")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


def start_vcsim(port: int | None = None) -> Vcsim:
    """Start vcsim (a missing binary fails the test: ./scripts/setup.sh --test installs it); wait until it answers."""
    assert VCSIM.is_file() and GOVC.is_file(), f"vcsim/govc missing in {TOOLS}: run ./scripts/setup.sh --test"
    port = port or free_port()
    tmpdir = Path(tempfile.mkdtemp(prefix="vcsim-"))
    proc = subprocess.Popen(
        [str(VCSIM), "-l", f"127.0.0.1:{port}", "-username", "Administrator", "-password", ADMIN_PASSWORD],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TMPDIR": str(tmpdir)},
    )
    sim = Vcsim(port, proc, tmpdir)
    try:
        wait_until(lambda: _listening(port), proc, "vcsim")
    except AssertionError:
        sim.stop()
        raise
    return sim


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False
