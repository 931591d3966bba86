"""Helpers the tests share: where things are, the reference data, the real CLI as a subprocess, manifests of the
real format. Fixtures live in conftest.py; tests import these from here, never from conftest."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


#: where the workers of one run share their locks (conftest sets it per session: the run's base temp folder)
SHARED: list[Path] = []


def local_shortcut(name: str) -> str | None:
    """The value of a local shortcut around a fixture (``IMAGE_BUILDER_TEST_BASE_IMAGE``...): a given image instead
    of one the fixture makes, which skips the fixture's kill-and-rerun and its checks. Under ``CI`` it is refused: the
    run fails at once, naming it, so that a CI run always makes and checks its own."""
    value = os.environ.get(name)
    if value and os.environ.get("CI"):
        import pytest

        pytest.fail(f"{name} is a local shortcut; CI makes and checks its own (unset it in the CI's environment)")
    return value or None


@contextlib.contextmanager
def vm_turn(*, alone: bool = False) -> Iterator[None]:
    """Take the run's turn for emulated guests: shared by the builds and boots, ``alone`` (exclusive) for the
    two-guest node check. Under TCG a guest's vCPUs spin on locks whose holder the host descheduled, so guests that
    oversubscribe the 2 cores slow down far beyond their share: the node check beside a Packer build took 30 minutes
    (and once let a pod wait past its deadline) where it takes 5 alone. A gate makes a waiting node check go next:
    new shared turns queue behind it rather than starve it."""
    import fcntl

    if not SHARED:  # outside a pytest session (a helper called on its own): no other worker to share with
        yield
        return
    with (SHARED[0] / "vm-turn.gate").open("w") as gate, (SHARED[0] / "vm-turn.lock").open("w") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


#: how long a server a test starts may take to answer: on a loaded run the light modules' worker runs at nice 10
#: beside two emulated guests, and moto_server's imports alone then took more than the 10 s its wait once allowed
STARTUP = 180.0


def wait_until(ready: Callable[[], bool], proc: subprocess.Popen[Any], what: str, timeout: float = STARTUP) -> None:
    """Wait until ``ready()`` for a server ``proc`` runs: fail at once, naming ``what``, when the process exits, and
    after ``timeout`` seconds when it never answers (the tests' one startup wait: a fixed count of tries measures
    the machine's load, not the server)."""
    deadline = time.monotonic() + timeout
    while True:
        if ready():
            return
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited at start (exit {proc.returncode})")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not start within {timeout:.0f} s")
        time.sleep(0.1)


def stop(proc: subprocess.Popen[Any], grace: float = STARTUP) -> None:
    """End a server a test started: SIGTERM, then SIGKILL if it has not exited after ``grace`` seconds (a server on
    the light worker, at nice 10 beside two guests, once took more than 10 s to exit: a teardown failure)."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def answers(*argv: str, env: dict[str, str] | None = None) -> Callable[[], bool]:
    """A readiness probe: ``argv`` (curl, ctr ...) exits 0."""
    return lambda: subprocess.run(argv, capture_output=True, env=env, check=False).returncode == 0


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
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    program: str = "image-builder",
    timeout: float = 120,
) -> Result:
    """Run the real console script (``image-builder`` or ``invoke``) as a user would."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [str(BIN / program), *args],
        cwd=cwd or ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return Result(proc.returncode, proc.stdout, proc.stderr)


def killed_at(point: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the console script in a process group of its own with the failpoint set at ``point``
    (:mod:`imagebuilder.core.faults`): it kills its group there, as a reboot or the OOM killer would."""
    from imagebuilder.core.faults import FAIL_ENV

    full_env = {**os.environ, **(env or {}), FAIL_ENV: point}
    proc = subprocess.run([str(BIN / "image-builder"), *args], cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=120, start_new_session=True)  # fmt: skip
    assert proc.returncode == -9, f"not killed at {point!r}: {proc.stdout}{proc.stderr}"
    return proc


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


def running_with(text: str) -> list[str]:
    """The command lines of the processes running now that contain ``text`` (one that ends while it is read is
    skipped)."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and text.encode() in (cmdline := (entry / "cmdline").read_bytes()):
                found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def run_folders(run: int) -> list[Path]:
    return [
        *Path("/dev/shm").glob(f"image-builder-{run}-*"),
        *Path(tempfile.gettempdir()).glob(f"image-builder-{run}-*"),
    ]


def kill_at(proc: subprocess.Popen[str], marker: str, delay: float, timeout: float = 900) -> str:
    """Read the task's output until a line holds ``marker``, wait ``delay`` seconds, SIGKILL its process group."""
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        seen.append(line)
        if marker in line:
            break
        assert time.monotonic() < deadline, f"{marker!r} not seen in {timeout} s:\n{''.join(seen[-40:])}"
    else:
        raise AssertionError(f"the task ended before {marker!r}:\n{''.join(seen[-40:])}")
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    return "".join(seen)


def group_alive(pgid: int) -> list[str]:
    out = subprocess.run(["pgrep", "-g", str(pgid), "-a"], capture_output=True, text=True, check=False).stdout
    return out.splitlines()


def loops_on(*parts: str) -> list[str]:
    out = subprocess.run(["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return [line for line in out.splitlines() if any(p in line for p in parts)]


def mounts_under(path: Path) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(path) in line]


def plan_for(os_name: str, provider: str, tmp_path: Path, config: dict[str, Any] | None = None, **kw: Any) -> Any:
    """The plan of a 1-24 build of ``os_name`` on ``provider``, offline: from ``config`` when given, else from the
    pair's example config."""
    from imagebuilder.builder.resolve import make_plan
    from imagebuilder.plan.model import BuildRequest

    configs = {}
    if config is not None:
        path = tmp_path / f"{provider}.json"
        path.write_text(json.dumps(config))
        configs[provider] = str(path)
    elif PAIRS[(os_name, provider)]:
        configs[provider] = str(EXAMPLES / PAIRS[(os_name, provider)])  # type: ignore[operator]
    return make_plan(
        BuildRequest(os=os_name, hypervisor=provider, release_channel="1-24", configs=configs, offline=True, **kw)
    )
