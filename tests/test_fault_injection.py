"""Killed at any moment, nothing leaks (issue 29): a long task's whole process group is sent SIGKILL (what an operator's
reboot or the out-of-memory killer does: no clean-up handler runs) at a point chosen from the task's own progress
lines plus a random delay, then the task is run again. The rerun must succeed, its output must verify, and nothing
of the killed run may be left: loop devices (found by their backing file), scratch directories on /dev/shm, build
workspaces, mounts in the host's namespace, processes, partial files in the output folder."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.common import BIN, ROOT, leaked_scratch

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(1800)]


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


def assert_nothing_left(killed_pid: int, tmp_path: Path, work: Path, out: Path) -> None:
    assert not group_alive(killed_pid), group_alive(killed_pid)
    # a loop on a killed run's scratch disk: named under /dev/shm, or from the tmpfs's root once the mount namespace
    # it was attached in is gone (as the chroot engine's child's is)
    left = loops_on(f"/image-builder-{killed_pid}-", str(tmp_path))
    assert not left, left
    assert not leaked_scratch(), leaked_scratch()
    assert not mounts_under(tmp_path), mounts_under(tmp_path)
    workspaces = list(work.iterdir()) if work.exists() else []
    assert not workspaces, workspaces
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")], list(out.iterdir())


#: where a chroot build is killed, from its own progress lines: the disk copied and about to be attached and mounted;
#: Ansible provisioning in the chroot (mounts, loop devices, a child in its own mount namespace); packaging the output
CHROOT_POINTS = ("working disk in memory", "TASK [", "compressing")


@pytest.mark.netns
def test_a_chroot_build_killed_at_each_step_is_rebuilt_and_leaves_nothing(
    offline_ns: str, home: Path, base_image: tuple[Path, str], mirror: Path, tmp_path: Path
) -> None:
    """The issue's own case, at every chosen point in turn: each run is killed at the next point, so each starts on
    what the runs killed before it left (and must get past it to reach its point); the last run goes to the end."""
    from imagebuilder.verify import verify_image

    image, digest = base_image
    config = tmp_path / "bm.json"
    config.write_text(json.dumps({"source_image_url": str(image), "source_image_checksum": f"sha256:{digest}"}))
    out = tmp_path / "out"
    work = home / "work"
    args = ["ip", "netns", "exec", offline_ns, str(BIN / "image-builder"), "build", "--os", "ubuntu",
            "--hypervisor", "baremetal", "--release-channel", "1-24", "--baremetal-config", str(config),
            "--mirror", str(mirror), "--offline", "--engine", "chroot", "--disk-gb", "4", "--min-disk-gb", "10",
            "--output-dir", str(out)]  # fmt: skip
    env = {**os.environ, "HOME": str(home), "IMAGE_BUILDER_WORKSPACE": str(work)}
    rng = random.Random(29)
    killed: list[int] = []
    for point in CHROOT_POINTS:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)  # fmt: skip
        said = kill_at(proc, point, rng.uniform(0, 3))
        assert proc.returncode == -signal.SIGKILL, said[-2000:]
        killed.append(proc.pid)
    # the killed runs' traces are what the last run must deal with (the kernel keeps their loop devices attached)
    rerun = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=1500)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    gz = out / "ubuntu-v1.24.8-eks-5-amd64.gz"
    manifest = json.loads((out / "ubuntu-v1.24.8-eks-5-amd64.build-manifest.json").read_text())
    assert manifest["artifact"]["sha256"] == (out / f"{gz.name}.sha256").read_text().split()[0]
    for pid in killed:
        assert_nothing_left(pid, tmp_path, work, out)
    findings = verify_image(gz, boot=False)
    assert not [f for f in findings if not f.ok], findings
