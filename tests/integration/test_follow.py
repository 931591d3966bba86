"""Following a long child (progress.follow) and what a chroot build leaves behind when it is killed."""

from __future__ import annotations

import io
import os
import subprocess
import time
from pathlib import Path

import pytest

from imagebuilder.core import disk
from imagebuilder.core.progress import follow


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purpose (nobody waited for it yet)
    return "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]


def test_a_child_is_stopped_when_its_progress_can_no_longer_be_said(tmp_path: Path) -> None:
    """The reader of our progress went away (a closed pipe, Ctrl-C): the child must not run on unseen."""
    pidfile = tmp_path / "pid"

    def say(text: str) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    # the child cleans up when asked to stop, and says so: that goes on into the log
    script = (f"trap 'echo cleaning up; exit 0' TERM; echo $$ > '{pidfile}'; echo started; sleep 60 & wait; "
              "echo never")  # fmt: skip
    log = io.StringIO()
    with pytest.raises(BrokenPipeError):
        follow(["sh", "-c", script], env=dict(os.environ), log=log, redact=str, say=say,
               pick=lambda line: line or None)  # fmt: skip
    assert log.getvalue().splitlines()[1:] == ["started", "cleaning up"]
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


def test_a_child_that_ends_is_followed_to_its_status(tmp_path: Path) -> None:
    said: list[str] = []
    log = io.StringIO()
    code = follow(["sh", "-c", "echo one; echo two; exit 3"], env=dict(os.environ), log=log, redact=str,
                  say=said.append, pick=lambda line: line or None)  # fmt: skip
    assert code == 3 and said == ["one", "two"] and "one\ntwo\n" in log.getvalue()


def test_ansible_runs_under_a_caller_whose_stdin_is_non_blocking(tmp_path: Path) -> None:
    """ansible-playbook refuses a non-blocking stdin ("Ansible requires blocking IO"), and the caller's may be one (a
    CI runner's, a test harness's pipe: image.customize's Ansible run failed so in a CI run of 2026-11-29). The
    children this tool runs Ansible in get no stdin of the caller's: a real playbook runs here with ours made
    non-blocking, where, run with the caller's stdin, it fails as it did there."""
    from imagebuilder.core.hostinfo import tool_search_path

    playbook = tmp_path / "play.yml"
    playbook.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n    - debug: {msg: ran}\n")
    args = ["ansible-playbook", "-i", "localhost,", "-c", "local", str(playbook)]
    env = {**os.environ, "PATH": tool_search_path(), "HOME": str(tmp_path), "ANSIBLE_NOCOLOR": "1"}
    read, write = os.pipe()
    saved = os.dup(0)
    try:
        os.set_blocking(read, False)
        os.dup2(read, 0)
        inherited = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
        assert inherited.returncode != 0 and "blocking" in inherited.stdout + inherited.stderr, inherited
        log = io.StringIO()
        code = follow(args, env=env, log=log, redact=str, say=lambda _: None, pick=lambda _: None)
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read, write):
            os.close(fd)
    assert code == 0 and '"msg": "ran"' in log.getvalue(), log.getvalue()[-2000:]


@pytest.mark.root
def test_loop_devices_left_on_an_image_are_detached(tmp_path: Path) -> None:
    image = tmp_path / "disk.raw"
    with image.open("wb") as fh:
        fh.truncate(8 * 2**20)
    devs = [subprocess.run(["losetup", "--find", "--show", "--offset", str(off), "--sizelimit", str(2**20),
                            str(image)], capture_output=True, text=True, check=True).stdout.strip()
            for off in (0, 2**20)]  # fmt: skip
    other = tmp_path / "other.raw"
    other.write_bytes(bytes(2**20))
    keep = subprocess.run(["losetup", "--find", "--show", str(other)], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip
    try:
        assert sorted(disk.detach_backing(image)) == sorted(devs)
        assert disk.detach_backing(image) == []
        assert not Path(f"/sys/block/{Path(devs[0]).name}/loop/backing_file").exists()
        assert Path(f"/sys/block/{Path(keep).name}/loop/backing_file").exists()  # another image's is left alone
    finally:
        for dev in [*devs, keep]:
            subprocess.run(["losetup", "-d", dev], capture_output=True, check=False)
