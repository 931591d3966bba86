"""Killed at any moment, nothing leaks (issue 29): a long task's whole process group is sent SIGKILL (what an operator's
reboot or the out-of-memory killer does: no clean-up handler runs) at a point chosen from the task's own progress
lines plus a random delay, then the task is run again. The rerun must succeed, its output must verify, and nothing
of the killed run may be left: loop devices (found by their backing file), scratch directories on /dev/shm, build
workspaces, mounts in the host's namespace, processes, partial files in the output folder."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import random
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.common import (
    BIN,
    ROOT,
    group_alive,
    kill_at,
    killed_at,
    leaked_scratch,
    loops_on,
    mounts_under,
    run,
    run_folders,
    tagged,
)
from tests.support.vcsim import Vcsim

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(1800)]


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
    from imagebuilder.builder.verify import verify_image

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
    gz = out / "ubuntu-v1.24.17-eks-36-amd64.gz"
    manifest = json.loads((out / "ubuntu-v1.24.17-eks-36-amd64.build-manifest.json").read_text())
    assert manifest["artifact"]["sha256"] == (out / f"{gz.name}.sha256").read_text().split()[0]
    for pid in killed:
        assert_nothing_left(pid, tmp_path, work, out)
    findings = verify_image(gz, boot=False)
    assert not [f for f in findings if not f.ok], findings


class _StallingHandler(http.server.SimpleHTTPRequestHandler):
    """Serves a folder; a file whose name is in ``stall`` is sent half, then the connection hangs (a slow link in
    the middle of a download: the point where a run is killed with a ``.part`` file on the disk)."""

    stall: frozenset[str] = frozenset()

    def log_message(self, format: str, *args: object) -> None:
        pass

    def copyfile(self, source: Any, outputfile: Any) -> None:
        if self.path.rsplit("/", 1)[-1] not in self.stall:
            super().copyfile(source, outputfile)
            return
        data = source.read()
        outputfile.write(data[: len(data) // 2])
        outputfile.flush()
        time.sleep(120)


@contextlib.contextmanager
def serve(root: Path, stall: frozenset[str] = frozenset()) -> Iterator[str]:
    handler = type("Handler", (_StallingHandler,), {"stall": stall})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def wait_for(what: str, found: Callable[[], list[Path] | list[str]], timeout: float = 120) -> list[Path] | list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if hits := found():
            return hits
        time.sleep(0.05)
    raise AssertionError(f"{what}: not seen within {timeout} s")


def test_a_mirror_killed_mid_download_is_completed_by_the_rerun_and_leaves_no_part(tmp_path: Path) -> None:
    """mirror.create killed while a download is half on the disk (its ``.part`` file, named with the run's pid):
    the rerun releases it, completes the mirror and verifies every file; nothing partial is left anywhere."""
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.release.standin import make_standin_release

    channel = load_catalog().channel("1-24")
    upstream = tmp_path / "upstream"
    make_standin_release(upstream, channel)
    dest = tmp_path / "mirror"
    args = [str(BIN / "image-builder"), "mirror.create", "--release-channel", "1-24", "--dest", str(dest),
            "--runtime", "os"]  # fmt: skip
    with serve(upstream, stall=frozenset({"kubeadm"})) as url:
        proc = subprocess.Popen([*args, "--source", url], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        parts = wait_for("a half-downloaded kubeadm", lambda: list(dest.rglob(f".kubeadm.{proc.pid}-*.part")))
        time.sleep(random.Random(29).uniform(0, 1))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert parts[0].exists(), "the killed run left its partial download (no clean-up of its own ran)"
    with serve(upstream) as url:
        rerun = subprocess.run([*args, "--source", url], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert "12 artifacts" in rerun.stdout and "sha256-verified" in rerun.stdout, rerun.stdout
    assert not [p for p in dest.rglob(".*")], list(dest.rglob(".*"))
    assert group_alive(proc.pid) == []
    for served in upstream.rglob("*"):
        if served.is_file():
            copy = dest / served.relative_to(upstream)
            assert copy.read_bytes() == served.read_bytes(), copy


@contextlib.contextmanager
def small_filesystem(where: Path, free_kib: int) -> Iterator[Path]:
    """A loop-mounted ext4 filesystem at ``where`` with about ``free_kib`` KiB left free (a filler file takes the
    rest): an output folder that fills up during a write."""
    image = where.with_suffix(".img")
    subprocess.run(["truncate", "-s", "16M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-b", "1024", str(image)], check=True)
    where.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(where)], check=True)
    try:
        free = os.statvfs(where).f_bavail * os.statvfs(where).f_frsize
        with (where / "filler").open("wb") as fh:
            fh.write(b"\0" * max(0, free - free_kib * 1024))
            fh.flush()
            os.fsync(fh.fileno())
        (where / "filler").chmod(0o444)
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)
        image.unlink(missing_ok=True)


def test_a_full_output_filesystem_is_a_clear_failure_and_leaves_nothing(
    tmp_path: Path, base_image: tuple[Path, str]
) -> None:
    """A small loop-mounted filesystem as the output folder. A write that runs out of room (the mirror, as a disk
    that fills while a task writes) exits 1 naming the folder, the file and the room left, and keeps nothing
    partial; a build that would not fit says so before it starts, with the room it needs there."""
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.release.standin import make_standin_release

    upstream = tmp_path / "upstream"
    make_standin_release(upstream, load_catalog().channel("1-24"))
    with small_filesystem(tmp_path / "small", free_kib=120) as small, serve(upstream) as url:
        dest = small / "mirror"
        argv = [str(BIN / "image-builder"), "mirror.create", "--release-channel", "1-24", "--dest", str(dest),
                "--runtime", "os"]  # fmt: skip
        res = subprocess.run([*argv, "--source", url], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
        assert "Traceback" not in res.stderr
        assert f"no space left under {dest}/" in res.stderr and "MiB free there" in res.stderr, res.stderr
        assert "nothing partial was kept" in res.stderr
        assert not [p for p in small.rglob(".*")], list(small.rglob(".*"))
        # a build: the output folder's room is checked with the rest, before any work
        image, digest = base_image
        config = tmp_path / "bm.json"
        config.write_text(json.dumps({"source_image_url": str(image), "source_image_checksum": f"sha256:{digest}"}))
        out = small / "out"
        res = subprocess.run([str(BIN / "image-builder"), "build", "--os", "ubuntu", "--hypervisor", "baremetal",
                              "--release-channel", "1-24", "--baremetal-config", str(config), "--mirror", str(upstream),
                              "--offline", "--engine", "chroot", "--disk-gb", "4", "--output-dir", str(out),
                              "--runtime", "os"],
                             cwd=ROOT, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "IMAGE_BUILDER_WORKSPACE": str(tmp_path / "work")})  # fmt: skip
        assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
        assert f"GiB free under {out}, which needs" in res.stdout + res.stderr, res.stdout[-3000:]
        assert not [p for p in small.rglob(".*")], list(small.rglob(".*"))
        assert not out.exists() or {p.name for p in out.iterdir()} <= {"logs"}, list(out.iterdir())


def test_verify_killed_by_the_oom_killer_leaves_its_guest_and_mount_to_host_clean(
    tmp_path: Path, base_image: tuple[Path, str]
) -> None:
    """The out-of-memory killer ends one process, not its group: image.verify killed alone, once with the image
    mounted in the host's namespace and once with its QEMU guest booting, leaves a mount with its loop device and a
    QEMU running on. host.clean finds them by the run's tag and folder names (the dry run lists them with the run
    that left them), releases them, and touches nothing of a live run's."""
    from imagebuilder.builder.resolve import make_plan
    from imagebuilder.plan.model import BuildRequest
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.release.standin import make_standin_release

    make_standin_release(tmp_path / "m", load_catalog().channel("1-24"))
    plan = make_plan(
        BuildRequest(
            os="ubuntu", hypervisor="baremetal", release_channel="1-24", mirror=str(tmp_path / "m"), runtime="os"
        )
    )
    manifest = tmp_path / "expected.json"
    manifest.write_text(json.dumps({"plan": plan.to_json()}))
    args = [str(BIN / "image-builder"), "image.verify", "--image", str(base_image[0]), "--manifest", str(manifest)]
    from imagebuilder.core.runs import RUN_ENV, run_tag

    live = subprocess.Popen(["sleep", "300"], env={**os.environ, RUN_ENV: run_tag()})  # this test's own child
    tmp = Path(tempfile.gettempdir())

    def clean(*flags: str) -> str:
        res = subprocess.run([str(BIN / "image-builder"), "host.clean", *flags], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
        assert res.returncode == 0, res.stdout + res.stderr
        return res.stdout

    def guests(run: int) -> list[str]:
        return [p for p in tagged(run) if "qemu-system" in p]

    try:
        # 1: the root filesystem mounted for the offline checks (a mount in the host's namespace). The checks take
        # a second or two: the run is stopped as soon as its mount is seen and killed only if it was still mounted
        # when it stopped (else it was already unmounting: let it end, and try again)
        for _ in range(5):
            proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            mount_prefix = tmp / f"image-builder-{proc.pid}-"
            wait_for("the image mounted", functools.partial(mounts_under, mount_prefix))
            proc.send_signal(signal.SIGSTOP)
            if mounts_under(mount_prefix):
                proc.kill()
                proc.wait()
                break
            proc.send_signal(signal.SIGCONT)
            proc.wait()
        else:
            raise AssertionError("image.verify unmounted before it could be stopped, five times")
        first = proc.pid
        listed = clean("--dry-run")
        assert f"would release: mount {tmp}/image-builder-{first}-" in listed and f"left by run {first}" in listed
        assert mounts_under(tmp / f"image-builder-{first}-"), "a dry run releases nothing"
        # 2: the next run releases what the first left before it takes its own; killed with its guest booting.
        # A guest may end by itself soon after its run (seen in CI under load: its console's reader gone); then
        # there is no process to release, and the kill is tried again on the next run's guest
        runs = [first]
        for _ in range(3):
            proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_for("the guest booting", functools.partial(guests, proc.pid), timeout=300)
            previous = runs[-1]
            assert not mounts_under(tmp / f"image-builder-{previous}-") and not run_folders(previous), "swept"
            runs.append(proc.pid)
            proc.kill()
            proc.wait()
            listed = clean("--dry-run")
            if "would release: process " in listed:
                break
            assert not guests(proc.pid), f"a guest runs on after its run and is not listed: {listed}"
        else:
            raise AssertionError("each killed run's guest ended by itself, three times: nothing to release")
        assert f"(qemu-system-x86), left by run {proc.pid}" in listed, listed
        assert "cleaned" not in clean() and not guests(proc.pid)
        for run in runs:
            assert tagged(run) == [], tagged(run)
            assert run_folders(run) == [], run_folders(run)
            assert mounts_under(tmp / f"image-builder-{run}-") == []
            assert loops_on(f"/image-builder-{run}-") == []
        assert live.poll() is None, "a live run's child is never touched"
    finally:
        live.kill()
        live.wait()


#: the steps template.import is killed at, from its own progress: the library item made (empty), the OVA's first
#: file pushed (its update session open), the VM deployed, snapshotted, marked as template, the first tag attached
IMPORT_POINTS = ("created library item", "pushed ", "deployed ", "snapshot 'root'", "marked as template", "tagged os:")


def test_template_import_killed_at_each_step_converges_to_one_template(
    vcsim: Vcsim, small_ovas: dict[str, Path]
) -> None:
    """template.import on vcsim killed (SIGKILL to its process group, by the failpoint at each step in turn: the
    simulator answers an import in half a second, too fast to aim a delay between two calls), each run starting on
    what the killed ones left; the last run completes. vCenter then holds what one clean import makes: one library
    item holding the OVA, no update session left open, one VM, a template with its snapshot and both tags, and
    nothing else."""
    args = ["template.import", "--ova", str(small_ovas["ubuntu"]), "--os", "ubuntu", "--kubernetes", "1.24"]
    path = "/DC0/vm/Templates/ubuntu-kubernetes-1-24-eks-36"
    for point in IMPORT_POINTS:
        killed_at(point, *args, env=vcsim.env)
    done = run(*args, env=vcsim.env)
    assert done.code == 0, done.out + done.err
    assert vcsim.govc("library.ls").split() == ["/eksa-templates"]
    assert vcsim.govc("library.ls", "/eksa-templates/*").split() == ["/eksa-templates/ubuntu-kubernetes-1-24-eks-36"]
    files = vcsim.govc("library.info", "-l", "/eksa-templates/ubuntu-kubernetes-1-24-eks-36/*")
    assert ".ovf" in files and ".vmdk" in files, files
    sessions = vcsim.govc("library.session.ls")
    assert "ACTIVE" not in sessions, sessions
    in_folder = vcsim.govc("find", "/DC0/vm/Templates", "-type", "m").split()
    assert in_folder == [path], in_folder
    info = json.loads(vcsim.govc("vm.info", "-json", path))
    vm = (info.get("virtualMachines") or info.get("VirtualMachines"))[0]
    assert (vm.get("config") or vm.get("Config"))["template"] is True
    assert "root" in vcsim.govc("snapshot.tree", "-vm", path)
    tags = sorted(vcsim.govc("tags.attached.ls", "-r", path).split())
    assert tags == ["eksdRelease:kubernetes-1-24-eks-36", "os:ubuntu"], tags
