"""The modern Packers users run, offline for real, inside a network namespace with nothing but loopback, from
image.base's image and the mirror: Packer 1.9.4 and 1.16.0, built from their release sources with their real plugins,
the plugins installed offline from ``--packer-plugins`` into the user's own plugin folder (1.9's layout, 1.16's
``packer plugins install``). Each runs a build (1.9.4 the bare-metal one, 1.16.0 the local OVA's) through its boot,
SSH and the ansible plugin's first task, and there the user presses Ctrl-C: the build ends with 130 and leaves
nothing but its log, and the OVA's config's vCenter password (unused) shows up in no output, file or child's argv.
Before 1.9.4's, a first run is killed midway, as the out-of-memory killer kills, and the run after it must clean up.

CI time: a Packer build is minutes of a core under TCG, and three full builds (Debian's 1.6.6 in
tests/integration/test_e2e_offline.py, 1.9.4 and 1.16.0 here) did not fit the CI's 90 minutes on the 2-core machine
beside the rest of the suite. What differs between the Packers is their core (templates, every pair validated by
1.9.4 and 1.16.0 in tests/integration/test_packer_versions.py and by 1.6.6 in ``invoke lint``; the plugins' install
and start, the build VM, SSH and the ansible plugin's connection: all run here), while the playbooks and the
packaging after them are the same ones 1.6.6 runs to the end in the offline test. 1.9.4 stopped at its Ansible
from 2026-11-29 on; 1.16.0 built the OVA to the end and booted it until 2026-11-30, when a local CI run still took
over 100 minutes (it was that run's third-largest test, 879 s of CPU): the OVA's packaging is the chroot engine's
as well (tests/integration/test_reproducible.py builds two and imports one into vcsim), and image.diff finds
nothing a node sees between the engines' images of the same inputs (the offline test)."""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import packers
from tests.support.common import BIN, ROOT, ArgvWatcher, run_folders, tagged, vm_turn
from tests.support.offline import in_ns, ns_env, scan_for

pytestmark = pytest.mark.timeout(3600)
SECRET = "vc-Pa55-never-logged-7731"


def _config(path: Path, base_image: tuple[Path, str]) -> Path:
    """A bare-metal or local OVA config: a source image (and for the OVA no vCenter, and a password that is not
    used and must never show up anywhere)."""
    image, digest = base_image
    config = {"source_image_url": str(image), "source_image_checksum": f"sha256:{digest}"}
    path.write_text(json.dumps({**config, "password": SECRET} if path.name == "vsphere.json" else config))
    return path


#: what each Packer builds, and where its first run is killed (None: not killed): Packer waiting for the guest's SSH
#: (Packer and QEMU running; a kill while Ansible provisions, its children too, is the chroot engine's in
#: tests/integration/test_fault_injection.py: here it cost a boot to SSH, 3 to 5 minutes of CI under TCG)
BUILDS: dict[str, tuple[str, str | None]] = {"1.9.4": ("baremetal", "Waiting for SSH"), "1.16.0": ("vsphere", None)}


def _argv(ns: str, provider: str, config: Path, mirror: Path, out: Path, flags: tuple[str, ...]) -> list[str]:
    """The build's command line in the namespace (``ip netns exec`` execs image-builder: the same process)."""
    return ["ip", "netns", "exec", ns, str(BIN / "image-builder"), "build", "--os", "ubuntu", "--hypervisor",
            provider, "--release-channel", "1-24", f"--{provider}-config", str(config), "--mirror", str(mirror),
            "--offline", "--output-dir", str(out), "--disk-gb", "4", "--min-disk-gb", "10", *flags]  # fmt: skip


def oom_kill(
    ns: str, home: Path, provider: str, config: Path, mirror: Path, out: Path, flags: tuple[str, ...], point: str
) -> int:  # fmt: skip
    """Start the build, read its output up to ``point``, then SIGKILL the image-builder process alone; returns its
    pid (the run whose tag its children carry)."""
    proc = subprocess.Popen(
        _argv(ns, provider, config, mirror, out, flags),
        cwd=ROOT,
        env=ns_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # ip netns exec execs image-builder: the same process
        seen.append(line)
        if point in line:
            break
    else:
        raise AssertionError(f"the build ended before {point!r}:\n{''.join(seen[-40:])}")
    time.sleep(random.Random(29).uniform(0, 3))
    proc.kill()
    proc.wait()
    proc.stdout.close()
    return proc.pid


@pytest.mark.parametrize("version", packers.MODERN)
def test_a_modern_packer_builds_to_its_ansible_and_ctrl_c_leaves_nothing(
    version: str, offline_ns: str, home: Path, base_image: tuple[Path, str], mirror: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    packer = packers.packer(version)
    plugins = packers.newest_plugins()
    provider, point = BUILDS[version]
    # the user's own plugin folder (Packer's default under HOME): the first build installs into it, offline
    user_plugins = home / ".config/packer/plugins"
    for old in user_plugins.rglob("packer-plugin-*") if user_plugins.exists() else ():
        old.unlink()  # the other Packer's run installed them: this one installs its own way (1.9 layout, 1.16 CLI)
    out = tmp_path / "out"
    flags = ("--engine", "packer", "--packer", str(packer), "--packer-plugins", str(plugins))
    # issue 29, the Packer engine: a first run killed as the out-of-memory killer kills (that process alone) at a
    # point of its own progress; its Packer and QEMU run on, and the build below must end
    # them and release what the killed run held before it starts its own. The OVA's config holds a vCenter password
    # it does not use, which must show up in no output, file or child's argv
    config = _config(tmp_path / f"{provider}.json", base_image)
    killed = None
    if point is not None:
        with vm_turn():
            killed = oom_kill(offline_ns, home, provider, config, mirror, out, flags, point)
        assert [p for p in tagged(killed) if "qemu-system" in p], f"QEMU runs on after its run was killed at {point}"
        for old in user_plugins.rglob("packer-plugin-*"):
            old.unlink()  # the killed run installed them: the run below installs them again
    with ArgvWatcher() as argv:
        output = _ctrl_c_while_ansible_provisions(offline_ns, home, provider, config, mirror, out, flags, killed,
                                                  user_plugins, packer)  # fmt: skip
    assert SECRET not in output
    assert not scan_for(SECRET, out, home / "work"), "a secret leaked into a file"
    assert not [c for c in argv.seen if SECRET in c], "a secret was in a child's argv"


def _the_plugins_were_installed_offline(
    stdout: str, home: Path, user_plugins: Path, packer: Path, offline_ns: str
) -> None:  # fmt: skip
    """The run installed the newest plugins into the user's own folder, offline, and Packer itself lists them from
    its default folder (no PACKER_PLUGIN_PATH)."""
    assert "installing Packer plugin qemu 1.1.4" in stdout and "installing Packer plugin ansible 1.1.6" in stdout
    assert len(list(user_plugins.glob("github.com/hashicorp/*/packer-plugin-*_SHA256SUM"))) == 2
    listed = in_ns(offline_ns, str(packer), "plugins", "installed", home=home, env={"CHECKPOINT_DISABLE": "1"})
    assert listed.returncode == 0 and str(user_plugins / "github.com/hashicorp/qemu") in listed.stdout


def _ctrl_c_while_ansible_provisions(
    ns: str, home: Path, provider: str, config: Path, mirror: Path, out: Path, flags: tuple[str, ...],
    killed: int | None, user_plugins: Path, packer: Path,
) -> str:  # fmt: skip
    """The run (after the killed one, if any: it cleans up after it) installs the plugins, boots the build VM and
    provisions it with the ansible plugin, where the user presses Ctrl-C (SIGINT to the terminal's process group):
    it exits 130 and leaves no process, folder, output file or workspace, and no traceback. Returns its output."""
    with vm_turn():
        done = packers.ctrl_c_at(_argv(ns, provider, config, mirror, out, flags), ns_env(home))
    output, code = done.output, done.code
    assert code == 130, (code, output[-3000:])
    for run_pid in (done.pid,) if killed is None else (killed, done.pid):
        assert tagged(run_pid) == [] and run_folders(run_pid) == [], (tagged(run_pid), run_folders(run_pid))
    assert not list((home / "work").iterdir()), "the runs' workspaces are released"
    # what stays is each run's build log (the user's record of what happened): no image, no partial file
    assert sorted(p.name for p in out.iterdir()) == ["logs"], sorted(p.name for p in out.iterdir())
    logs = sorted((out / "logs").iterdir())
    assert len(logs) == (1 if killed is None else 2), logs
    assert logs[-1].read_text().rstrip().endswith("Cleanly cancelled builds after being interrupted."), logs[-1]
    assert "Traceback" not in output and output.rstrip().endswith("interrupted"), output[-3000:]
    _the_plugins_were_installed_offline(output, home, user_plugins, packer, ns)
    return output
