"""template.customize end to end with a real guest (spec 4.8): vcsim plays vCenter, QEMU plays the ESXi host.

vcsim has no guests, so this test is the bridge a real host would be, and nothing more:
- when the clone is powered on, the guest boots: image.base's Debian cloud image (cloud-init, VMware and NoCloud
  datasources) under QEMU, with a NoCloud seed made from the very bytes template.customize wrote into the clone's
  guestinfo (the VMware datasource reads the same two documents; NoCloud takes the network from its own file);
- the guest's NIC is a tap device this test makes (10.213.0.0/24, served by a real isc-dhcp-server), and the address
  it leases is what VMware Tools would report: the test sets it with vcsim's ``SET.guest.ipAddress``;
- when the guest powers itself off (its seal), the test powers the vcsim VM off, as the host would.
Everything else is the real tool: the clone, guestinfo, SSH with a per-run key, the customize role, the clean-up,
the snapshot, the template and the tags. Then the guest's disk is checked (testinfra, openssl, real containerd)
and a copy boots a second time to get a fresh machine-id and a DHCP lease.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imagebuilder.core.disk import mounted_root, raw_view
from imagebuilder.core.hostinfo import kvm_status
from imagebuilder.customization.model import SeedDocuments
from imagebuilder.release.catalog import load_catalog
from imagebuilder.vsphere.tags import expected_tags
from tests.support.common import BIN, ROOT, ArgvWatcher, vm_turn
from tests.support.pki import make_ca
from tests.support.vcsim import Vcsim

pytestmark = pytest.mark.timeout(2400)
TAP = f"ibtap{os.getpid() % 10000}"
HOST_IP, GUEST_IP = "10.213.0.1", "10.213.0.10"
GUEST_MAC, COPY_MAC = "52:54:00:21:30:01", "52:54:00:21:30:02"
SOURCE, TARGET = "/DC0/vm/DC0_H0_VM0", "/DC0/vm/ubuntu-1-24-custom"
PASSWORD = "reg-Pa55-MARK-5521"
TOKEN = "tok-MARK-7730"


def remove_stale_taps() -> list[str]:
    """The taps a run of this module killed before its teardown left (SIGKILL: none of it ran) with the host address
    on them: the route to the guest would go through the first of them, a dead end. Only this module uses the
    subnet, and one worker runs it, so any other tap holding it is stale."""
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True).stdout
    stale = sorted({line.split()[1] for line in out.splitlines() if f" {HOST_IP}/" in line and line.split()[1] != TAP})
    for name in stale:
        if name.startswith("ibtap"):
            subprocess.run(["ip", "link", "del", name], check=False)
    return stale


@pytest.fixture
def guest_network(tmp_path: Path) -> Iterator[Path]:
    """A tap device with a DHCP server that gives the guest a fixed address; yields dhcpd's lease file."""
    remove_stale_taps()
    subprocess.run(["ip", "tuntap", "add", TAP, "mode", "tap"], check=True)
    dhcpd = None
    try:
        subprocess.run(["ip", "addr", "add", f"{HOST_IP}/24", "dev", TAP], check=True)
        subprocess.run(["ip", "link", "set", TAP, "up"], check=True)
        conf, leases = tmp_path / "dhcpd.conf", tmp_path / "dhcpd.leases"
        conf.write_text(
            "default-lease-time 600;\nmax-lease-time 600;\nauthoritative;\n"
            "subnet 10.213.0.0 netmask 255.255.255.0 {\n  range 10.213.0.50 10.213.0.60;\n"
            f"  option routers {HOST_IP};\n}}\n"
            f"host guest {{ hardware ethernet {GUEST_MAC}; fixed-address {GUEST_IP}; }}\n"
        )
        leases.touch()
        dhcpd = subprocess.Popen(
            ["dhcpd", "-f", "-4", "-q", "-cf", str(conf), "-lf", str(leases), "-pf", str(tmp_path / "dhcpd.pid"), TAP],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        yield leases
    finally:
        if dhcpd is not None:
            dhcpd.terminate()
            dhcpd.wait()
        subprocess.run(["ip", "link", "del", TAP], check=False)


def qemu(disk: Path, mac: str, serial: Path, *extra: str) -> subprocess.Popen[bytes]:
    """The guest on the tap device (the test's stand-in for an ESXi host). One vCPU: under TCG each vCPU is a host
    thread, and this guest runs beside an end-to-end build; a guest whose vCPUs outnumber the free cores spins on
    locks whose holder the host has descheduled (docs/testing.md)."""
    return subprocess.Popen(
        ["qemu-system-x86_64", "-accel", kvm_status().accelerator, "-m", "2048", "-smp", "1", "-display", "none",
         "-no-reboot", "-nodefaults", "-serial", f"file:{serial}",
         "-drive", f"file={disk},if=virtio,format=qcow2",
         "-netdev", f"tap,id=n0,ifname={TAP},script=no,downscript=no",
         "-device", f"virtio-net-pci,netdev=n0,mac={mac}", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


def vm_info(sim: Vcsim, path: str) -> dict[str, Any] | None:
    data = sim.govc_json("vm.info", "-e", path)
    vms = data.get("virtualMachines") if isinstance(data, dict) else None
    return vms[0] if vms else None


class Host:
    """Plays the ESXi host for the clone: boots the real guest when vcsim powers the clone on."""

    def __init__(self, sim: Vcsim, work: Path, base: Path) -> None:
        self.sim, self.work, self.base = sim, work, base
        self.disk = work / "guest.qcow2"
        self.documents: SeedDocuments | None = None
        self.error: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            deadline = time.monotonic() + 300
            props: dict[str, str] = {}
            while time.monotonic() < deadline:
                vm = vm_info(self.sim, TARGET)
                if vm and vm["runtime"]["powerState"] == "poweredOn":
                    props = {e["key"]: e["value"] for e in vm["config"].get("extraConfig") or []}
                    break
                time.sleep(0.5)
            assert props.get("guestinfo.userdata"), "the clone was powered on without guestinfo user data"
            self.documents = SeedDocuments.from_guestinfo(props)
            seed = self.work / "seed"
            seed.mkdir()
            for name, text in self.documents.nocloud_files().items():
                (seed / name).write_text(text)
            iso = self.work / "seed.iso"
            subprocess.run(["xorriso", "-as", "mkisofs", "-quiet", "-o", str(iso), "-V", "cidata", "-J", "-r",
                            str(seed)], check=True)  # fmt: skip
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(self.base), "-F", "qcow2",
                            str(self.disk), "8G"], check=True)  # fmt: skip
            self.proc = qemu(self.disk, GUEST_MAC, self.work / "serial.log",
                             "-drive", f"file={iso},media=cdrom,readonly=on")  # fmt: skip
            self.sim.govc("vm.change", "-vm", TARGET, "-e", f"SET.guest.ipAddress={GUEST_IP}")  # VMware Tools
            self.proc.wait(timeout=1800)  # the guest seals itself and powers off
            self.sim.govc("vm.power", "-off", TARGET)  # ... and so the host reports the VM off
        except Exception as exc:  # reported by the test, with the guest's console
            self.error = f"{type(exc).__name__}: {exc}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def press_power_button(monitor: Path) -> None:
    """The host's ACPI power button through QEMU's monitor: wait for its prompt, send ``system_powerdown`` and wait for
    the next prompt, so the command was read and done before the connection closes (a command sent on a connection
    closed at once can be lost)."""

    def until_prompt(sock: socket.socket) -> None:
        seen = b""
        while b"(qemu)" not in seen:
            try:
                chunk = sock.recv(4096)
            except TimeoutError:  # the next press comes in 30 s
                return
            if not chunk:
                return
            seen += chunk

    with socket.socket(socket.AF_UNIX) as button:
        button.settimeout(30)
        button.connect(str(monitor))
        until_prompt(button)
        button.sendall(b"system_powerdown\n")
        until_prompt(button)


def test_template_customize_against_a_real_guest(
    vcsim: Vcsim, base_image: tuple[Path, str], guest_network: Path, tmp_path: Path
) -> None:
    vcsim.govc("vm.power", "-off", SOURCE)
    vcsim.govc("vm.markastemplate", SOURCE)
    make_ca(tmp_path / "ca.pem", leaf=tmp_path / "registry.pem")
    spec = tmp_path / "customize.yaml"
    spec.write_text(
        "user: {name: builder}\nca_certificates: [ca.pem]\nregistries:\n"
        "  registry.local:5000: {username: robot, password_env: REG_PASSWORD}\n"
        f"  mirror.local: {{identitytoken: {TOKEN}}}\n"
    )
    host = Host(vcsim, tmp_path, base_image[0])
    host.thread.start()
    # the run's own temp folder (short: Ansible's control sockets live under it), so the test sees what it leaves
    run_tmp = Path(tempfile.mkdtemp(prefix="ibt-"))
    env = {**os.environ, **vcsim.env, "REG_PASSWORD": PASSWORD, "TMPDIR": str(run_tmp)}
    name = TARGET.rsplit("/", 1)[1]
    args = [str(BIN / "image-builder"), "template.customize", "--template", SOURCE, "-f", str(spec),
            "--name", name, "--os", "ubuntu", "--kubernetes", "1.24", "--timeout", "1500"]  # fmt: skip
    try:
        with ArgvWatcher() as argv, vm_turn():
            proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=2200, check=False)
        host.thread.join(timeout=120)
    finally:
        host.stop()
    console = (
        (tmp_path / "serial.log").read_text(errors="replace")[-3000:] if (tmp_path / "serial.log").exists() else ""
    )
    assert host.error is None, f"{host.error}\nconsole: {console}"
    assert proc.returncode == 0, proc.stdout + proc.stderr + "\nconsole: " + console
    out = proc.stdout + proc.stderr
    for step in ("cloned", "set the four guestinfo properties", f"IP {GUEST_IP}", "builder removed",
                 "powered off by its seal", "cleared the guestinfo user data", "snapshot 'root'",
                 "marked as template", "tagged"):  # fmt: skip
        assert step in out, out

    # vCenter's side, read with govc
    vm = vm_info(vcsim, TARGET)
    assert vm is not None and vm["config"]["template"] is True
    props = {e["key"]: e["value"] for e in vm["config"].get("extraConfig") or []}
    assert not props.get("guestinfo.userdata") and not props.get("guestinfo.metadata")  # vcsim keeps empty keys
    assert "root" in vcsim.govc("snapshot.tree", "-vm", TARGET)
    attached = vcsim.govc("tags.attached.ls", "-r", TARGET).split()
    assert sorted(attached) == sorted(
        t.name for t in expected_tags(load_catalog().os("ubuntu"), load_catalog().channel("1-24"))
    )

    # no secret in what the tool printed, in any child's argv, or in files left outside the image
    assert PASSWORD not in out and TOKEN not in out
    assert not [c for c in argv.seen if PASSWORD in c or TOKEN in c]
    assert not list(run_tmp.iterdir()), "the run left temporary files (its key, its variables)"
    run_tmp.rmdir()

    check_customized_disk(host.disk, tmp_path)
    second_boot(host.disk, tmp_path, guest_network)


def whole(overlay: Path) -> Path:
    """The overlay the guest ran on, flattened into one image: the tool reads only whole disks (an overlay's backing
    file is a file it was not given)."""
    flat = overlay.with_name(overlay.stem + "-whole.qcow2")
    subprocess.run(["qemu-img", "convert", "-t", "unsafe", "-O", "qcow2", str(overlay), str(flat)], check=True)
    return flat


def check_customized_disk(disk: Path, tmp_path: Path) -> None:
    import testinfra

    with raw_view(whole(disk), work_dir=tmp_path / "raw") as raw, mounted_root(raw) as root:
        host = testinfra.get_host(str(root), connection="chroot")
        # the CA is trusted: a certificate it signed verifies inside the image
        assert len(list((root / "usr/local/share/ca-certificates").glob("image-builder-ca-*.crt"))) == 1
        verify = subprocess.run(
            ["chroot", str(root), "openssl", "verify", "-CAfile", "/etc/ssl/certs/ca-certificates.crt"],
            input=(tmp_path / "registry.pem").read_bytes(), capture_output=True, check=False,
        )  # fmt: skip
        assert verify.returncode == 0 and b"OK" in verify.stdout, verify.stdout + verify.stderr
        # containerd: TOML version 2 with one auth section per registry, accepted by real containerd
        config = root / "etc" / "containerd" / "config.toml"
        assert oct(config.stat().st_mode & 0o777) == "0o600"
        data = tomllib.loads(config.read_text())
        assert data["version"] == 2
        configs = data["plugins"]["io.containerd.grpc.v1.cri"]["registry"]["configs"]
        assert configs["registry.local:5000"]["auth"]["username"] == "robot"
        assert configs["registry.local:5000"]["auth"]["password"] == PASSWORD
        assert configs["mirror.local"]["auth"] == {"identitytoken": TOKEN}
        dump = subprocess.run(["containerd", "--config", str(config), "config", "dump"],
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert dump.returncode == 0 and "registry.local:5000" in dump.stdout, dump.stderr
        # spec 4.8 step 6
        assert host.file("/etc/machine-id").content_string == ""
        assert host.file("/var/lib/dbus/machine-id").linked_to == "/etc/machine-id"
        assert host.file("/etc/hostname").content_string.strip() == ""
        assert not host.file("/etc/netplan/50-cloud-init.yaml").exists
        assert "preserve_hostname: false" in host.file("/etc/cloud/cloud.cfg").content_string
        assert not host.file("/var/lib/cloud/instances").exists
        # the customization user, its key and its sudo rule are gone; nothing of the run is left
        assert "builder" not in host.file("/etc/passwd").content_string
        assert not host.file("/home/builder").exists
        sudoers = host.file("/etc/sudoers.d/90-cloud-init-users")
        assert not sudoers.exists or "builder" not in sudoers.content_string
        assert not host.file("/usr/local/sbin/image-builder-seal").exists


def second_boot(disk: Path, tmp_path: Path, leases: Path) -> None:
    """A clone of the template boots as a cluster deploys it: with its own instance's metadata (CAPV writes it into
    guestinfo; a NoCloud seed here), it gets a new machine-id, its own host name and a DHCP lease for its NIC."""
    copy = tmp_path / "copy.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(disk), "-F", "qcow2", str(copy)], check=True)
    seed = tmp_path / "clone-seed"
    seed.mkdir()
    (seed / "meta-data").write_text("instance-id: iid-clone-1\nlocal-hostname: clone-1\n")
    (seed / "network-config").write_text("version: 2\nethernets:\n  id0:\n    match: {name: 'ens*'}\n    dhcp4: true\n")
    (seed / "user-data").write_text("#cloud-config\n{}\n")
    iso = tmp_path / "clone-seed.iso"
    subprocess.run(["xorriso", "-as", "mkisofs", "-quiet", "-o", str(iso), "-V", "cidata", "-J", "-r", str(seed)],
                   check=True)  # fmt: skip
    monitor = tmp_path / "monitor.sock"
    proc = qemu(copy, COPY_MAC, tmp_path / "copy-serial.log", "-monitor", f"unix:{monitor},server,nowait",
                "-drive", f"file={iso},media=cdrom,readonly=on")  # fmt: skip
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and COPY_MAC not in leases.read_text():
            assert proc.poll() is None, "the copy stopped before it leased an address"
            time.sleep(2)
        assert COPY_MAC in leases.read_text(), "the copy got no DHCP lease"
        # let first-boot services settle, then power it off the way a host does (ACPI)
        serial = tmp_path / "copy-serial.log"

        def console() -> str:
            return serial.read_text(errors="replace")[-3000:]

        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and "login:" not in console():
            assert proc.poll() is None, "the copy stopped before its login prompt: " + console()
            time.sleep(2)
        assert "login:" in console(), "no login prompt: " + console()
        # A button press before logind listens is lost (a slow TCG guest on a loaded runner may still be starting
        # units at its prompt), so press it again every 30 s, as an operator would, until the guest is off.
        deadline = time.monotonic() + 900
        while proc.poll() is None and time.monotonic() < deadline:
            press_power_button(monitor)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        assert proc.poll() is not None, "the copy did not power off on ACPI: " + console()
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
    with raw_view(whole(copy), work_dir=tmp_path / "raw2") as raw, mounted_root(raw) as root:
        machine_id = (root / "etc" / "machine-id").read_text().strip()
        hostname = (root / "etc" / "hostname").read_text().strip()
    assert len(machine_id) == 32 and machine_id != "uninitialized", machine_id
    assert hostname == "clone-1"  # preserve_hostname: false
