"""The cluster network's DHCP service (spec 4.9) with the control-plane endpoint IPs kept out of it (spec 8).

Every cluster has a static control-plane endpoint IP (spec 2.5) that DHCP must never hand out. The spec gives
three ways; each can be chosen per IP or for all:

- ``outside``: the IP must already lie outside the dynamic range (checked, never changed);
- ``shrink``: the range is cut at the top or the bottom, whichever loses fewer addresses, so the IP falls out;
- ``reserve``: a host declaration maps the IP to a MAC address no NIC has (locally administered, derived from
  the IP). ISC dhcpd still offers such an address to other clients when it lies inside a range (we tried it), so
  the range is also split around the IP.

The file is checked here (all problems in one report, with file and field), rendered through ``templates/dhcp``,
installed atomically after ``dhcpd -t`` accepts it, and verified by capturing a real request and its ACK.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    field_validator,
    model_validator,
)

from imagebuilder.core import grammar
from imagebuilder.core.errors import ExternalError, InputError, InputErrors
from imagebuilder.core.files import atomic_write, load_yaml_mapping
from imagebuilder.core.render import template_env
from imagebuilder.core.runs import daemon_env
from imagebuilder.core.validation import StrictModel, validated

Method = Literal["outside", "shrink", "reserve"]


def _address_text(value: Any) -> Any:
    """Addresses are written as text: a bare number (or a bool) is a mistake, not 192.168.10.50 in disguise."""
    if not isinstance(value, str | ipaddress.IPv4Address):
        raise ValueError(f"expected an IPv4 address such as 192.168.10.50, got {value!r}")
    return value


IP = Annotated[ipaddress.IPv4Address, BeforeValidator(_address_text)]
PACKAGE = "isc-dhcp-server"


class Range(StrictModel):
    start: IP = Field(description="first address of the dynamic range")
    end: IP = Field(description="last address of the dynamic range")


#: DHCP carries lease times as 32-bit seconds; 0xffffffff means infinite, so longer values would wrap
LeaseSeconds = Annotated[StrictInt, Field(ge=1, le=2**31 - 1)]


class LeaseTimes(StrictModel):
    default: LeaseSeconds = Field(600, description="default-lease-time in seconds (spec 4.9: 600)")
    max: LeaseSeconds = Field(7200, description="max-lease-time in seconds (spec 4.9: 7200)")


def _address_or_object(schema: dict[str, Any]) -> None:
    """The schema says what the model accepts: a plain address is a control-plane IP too."""
    obj = dict(schema)
    schema.clear()
    schema["anyOf"] = [{"type": "string", "format": "ipv4"}, obj]


class ControlPlaneIP(StrictModel):
    """A control-plane endpoint IP: ``{ip, cluster, method}`` or just the address."""

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra=_address_or_object)

    @model_validator(mode="before")
    @classmethod
    def _plain_address(cls, value: Any) -> Any:
        return {"ip": value} if isinstance(value, str) else value

    ip: IP = Field(description="the cluster's controlPlaneConfiguration.endpoint.host")
    cluster: str | None = Field(
        None, description="cluster name (a letter, then letters, digits, '-'), for comments and the reservation"
    )
    method: Method | None = Field(None, description="outside, shrink or reserve (default: the file's exclusion)")

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, value: str | None) -> str | None:
        return None if value is None else grammar.cluster_name(value)


class DhcpConfig(StrictModel):
    """The DHCP config file (YAML)."""

    interface: str = Field(description="the DHCP host's NIC on the cluster network (INTERFACESv4)")
    subnet: ipaddress.IPv4Network = Field(description="network address with prefix, e.g. 192.168.10.0/24")
    range: Range = Field(description="dynamic range handed out to nodes")
    routers: list[IP] = Field(min_length=1, description="default gateways (option routers)")
    dns_servers: list[IP] = Field(min_length=1, description="option domain-name-servers")
    domain_name: str | None = Field(None, description="option domain-name")
    lease_time: LeaseTimes = Field(default_factory=LeaseTimes, description="lease times in seconds")
    exclusion: Method | None = Field(None, description="default method for control-plane IPs inside the range")
    control_plane_ips: list[ControlPlaneIP] = Field(
        default_factory=list,
        description="one per cluster (the management cluster and each workload cluster): an address, or an object",
    )

    @field_validator("interface")
    @classmethod
    def _iface(cls, value: str) -> str:
        return grammar.interface_name(value)

    @field_validator("subnet", mode="before")
    @classmethod
    def _subnet(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return ipaddress.IPv4Network(value, strict=True)
            except ValueError as exc:
                raise ValueError(f"{value!r} is not a network address with prefix ({exc})") from None
        return value

    @field_validator("domain_name")
    @classmethod
    def _domain(cls, value: str | None) -> str | None:
        return None if value is None else grammar.domain_name(value)


@dataclass(frozen=True)
class Reservation:
    name: str
    mac: str
    ip: IP


@dataclass(frozen=True)
class Pool:
    """What dhcpd.conf declares: the ranges left after exclusion and the reservations."""

    config: DhcpConfig
    ranges: list[tuple[IP, IP]]
    reservations: list[Reservation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def netmask(self) -> str:
        return str(self.config.subnet.netmask)

    def contains(self, ip: IP) -> bool:
        return any(lo <= ip <= hi for lo, hi in self.ranges)


def dummy_mac(ip: IP) -> str:
    """A locally administered unicast MAC that no NIC has, derived from the IP (stable across runs)."""
    return "02:00:" + ":".join(f"{b:02x}" for b in ip.packed)


def resolve(config: DhcpConfig, source: str | Path = "dhcp config") -> Pool:
    """Check the rules that span fields and apply the exclusions; every problem is reported at once."""
    problems: list[tuple[str, str]] = []
    net, rng = config.subnet, config.range
    if rng.start not in net or rng.end not in net:
        problems.append(("range", f"{rng.start}-{rng.end} is not inside the subnet {net}"))
    if rng.start > rng.end:
        problems.append(("range", f"start {rng.start} is after end {rng.end}"))
    for edge in (net.network_address, net.broadcast_address):
        if rng.start <= edge <= rng.end:
            problems.append(
                ("range", f"includes the {'network' if edge == net.network_address else 'broadcast'} address {edge}")
            )
    for i, router in enumerate(config.routers):
        if router not in net:
            problems.append((f"routers[{i}]", f"{router} is not inside the subnet {net}"))
        elif router in (net.network_address, net.broadcast_address):
            which = "network" if router == net.network_address else "broadcast"
            problems.append((f"routers[{i}]", f"{router} is the subnet's {which} address, not a host"))
        if rng.start <= router <= rng.end:
            problems.append((f"routers[{i}]", f"{router} is inside the dynamic range {rng.start}-{rng.end}"))
    lt = config.lease_time
    if lt.default > lt.max:
        problems.append(("lease_time", f"default ({lt.default}) is longer than max ({lt.max})"))

    ranges: list[tuple[IP, IP]] = [(rng.start, rng.end)]
    reservations: list[Reservation] = []
    notes: list[str] = []
    seen: dict[IP, int] = {}
    for i, cp in enumerate(config.control_plane_ips):
        where = f"control_plane_ips[{i}]"
        label = cp.cluster or str(cp.ip)
        if cp.ip in seen:
            problems.append((where, f"{cp.ip} is also control_plane_ips[{seen[cp.ip]}]: each cluster needs its own IP"))
            continue
        seen[cp.ip] = i
        if cp.ip not in net or cp.ip in (net.network_address, net.broadcast_address):
            problems.append((where, f"{cp.ip} is not a host address of the subnet {net}"))
            continue
        if cp.ip in config.routers:
            problems.append((where, f"{cp.ip} is a router address"))
            continue
        method = cp.method or config.exclusion
        inside = any(lo <= cp.ip <= hi for lo, hi in ranges)
        if method is None:
            if inside:
                problems.append(
                    (
                        where,
                        f"{cp.ip} is inside the dynamic range and no exclusion method is set "
                        "(set method, or the file's exclusion, to outside, shrink or reserve)",
                    )
                )
            continue
        if method == "outside":
            if inside:
                problems.append((where, f"{cp.ip} is declared 'outside' but lies inside the dynamic range"))
            continue
        if method == "reserve":
            reservations.append(
                # the address is in the name: two endpoints of one cluster are two host declarations
                Reservation(
                    f"control-plane-{re.sub(r'[^A-Za-z0-9-]', '-', f'{label}-{cp.ip}')}", dummy_mac(cp.ip), cp.ip
                )
            )
        if inside:
            new: list[tuple[IP, IP]] = []
            for lo, hi in ranges:
                if not lo <= cp.ip <= hi:
                    new.append((lo, hi))
                elif method == "reserve":  # split around the reserved address
                    new += [(a, b) for a, b in ((lo, cp.ip - 1), (cp.ip + 1, hi)) if a <= b]
                else:  # shrink: cut the side that loses fewer addresses
                    below, above = int(cp.ip) - int(lo), int(hi) - int(cp.ip)
                    kept = (cp.ip + 1, hi) if below <= above else (lo, cp.ip - 1)
                    lost = below + 1 if below <= above else above + 1
                    notes.append(
                        f"{label}: range shrunk at the {'bottom' if below <= above else 'top'} ({lost} addresses)"
                    )
                    if kept[0] <= kept[1]:
                        new.append(kept)
            if not new:
                problems.append((where, f"excluding {cp.ip} leaves no address in the dynamic range"))
            ranges = new
    if problems:
        raise InputErrors([InputError(msg, source=source, field=f) for f, msg in problems])
    return Pool(config, ranges, reservations, notes)


def load_dhcp_config(path: str | Path) -> Pool:
    return resolve(validated(DhcpConfig, load_yaml_mapping(path, "DHCP config"), path), path)


def render(pool: Pool) -> dict[str, str]:
    """The two files, by their path on the DHCP host."""
    env = template_env()
    ctx = {"pool": pool, "config": pool.config}
    return {
        "/etc/dhcp/dhcpd.conf": env.get_template("templates/dhcp/dhcpd.conf.j2").render(ctx),
        "/etc/default/isc-dhcp-server": env.get_template("templates/dhcp/isc-dhcp-server.j2").render(ctx),
    }


# --- installing on the DHCP host ---------------------------------------------------------------------------------


@dataclass
class DhcpHost:
    """The DHCP host's files under ``prefix`` (``/`` on a real host; a directory in tests)."""

    prefix: Path = Path("/")

    def path(self, absolute: str) -> Path:
        return self.prefix / absolute.lstrip("/")

    @property
    def conf(self) -> Path:
        return self.path("/etc/dhcp/dhcpd.conf")

    @property
    def leases(self) -> Path:
        return self.path("/var/lib/dhcp/dhcpd.leases")

    @property
    def pidfile(self) -> Path:
        return self.path("/run/dhcpd.pid")

    @property
    def uses_systemd(self) -> bool:
        return (
            self.prefix == Path("/") and Path("/run/systemd/system").is_dir() and shutil.which("systemctl") is not None
        )

    def running_pid(self) -> int | None:
        try:
            pid = int(self.pidfile.read_text().split()[0])
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            return None
        return pid


def package_installed(name: str = PACKAGE) -> bool:
    proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True, check=False)
    return proc.stdout.strip() == "install ok installed"


def check_config(text: str, directory: Path) -> None:
    """``dhcpd -t`` on a candidate file; raises with dhcpd's own words when it is refused."""
    dhcpd = shutil.which("dhcpd")
    if dhcpd is None:
        raise ExternalError("dhcpd is not installed", hint=f"install {PACKAGE} (dhcp.install does)")
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=directory, prefix=".dhcpd.conf.", suffix=".check", delete=False) as fh:
        fh.write(text)
    try:
        proc = subprocess.run(
            [dhcpd, "-t", "-4", "-cf", fh.name], capture_output=True, text=True, timeout=60, check=False
        )
    finally:
        os.unlink(fh.name)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip() and "Internet Systems" not in ln]
        raise ExternalError(
            "dhcpd -t refused the new configuration; the old one is left in place: " + " | ".join(lines[-6:]),
            hint="fix the DHCP config file and rerun",
        )


@dataclass
class InstallReport:
    changed: list[str]
    restarted: bool
    pid: int | None


def install(pool: Pool, host: DhcpHost, *, dry_run: bool = False) -> InstallReport:
    files = render(pool)
    changed = [p for p, text in files.items() if not host.path(p).is_file() or host.path(p).read_text() != text]
    running = host.running_pid() if not host.uses_systemd else None
    if host.prefix == Path("/") and os.geteuid() != 0:
        raise ExternalError("dhcp.install changes /etc and installs a package", hint="run it as root (or sudo)")
    if dry_run:
        # the same check the real run makes before writing, when dhcpd is already here to make it
        if shutil.which("dhcpd") is not None:
            from imagebuilder.core.disk import run_tempdir

            with run_tempdir("dhcpd-check") as tmp:
                check_config(files["/etc/dhcp/dhcpd.conf"], Path(tmp))
        return InstallReport(changed, bool(changed) or (not host.uses_systemd and running is None), running)
    if not package_installed():
        subprocess.run(["apt-get", "update", "-qq"], check=False)
        proc = subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", PACKAGE],
            capture_output=True, text=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise ExternalError(
                f"installing {PACKAGE} failed: {proc.stderr.strip()[-300:]}", hint="check the package archive"
            )
    check_config(files["/etc/dhcp/dhcpd.conf"], host.conf.parent)
    for path, text in files.items():
        if path in changed:
            with atomic_write(host.path(path)) as fh:
                fh.write(text)
    restart = bool(changed)
    if host.uses_systemd:
        if restart:
            proc = subprocess.run(
                ["systemctl", "restart", "isc-dhcp-server"], capture_output=True, text=True, check=False
            )
            if proc.returncode != 0:
                raise ExternalError(f"systemctl restart isc-dhcp-server failed: {proc.stderr.strip()}",
                                    hint="journalctl -u isc-dhcp-server")  # fmt: skip
        return InstallReport(changed, restart, None)
    if running is not None and not restart:
        return InstallReport(changed, False, running)
    if running is not None:
        os.kill(running, signal.SIGTERM)
        for _ in range(50):
            try:
                os.kill(running, 0)
            except OSError:
                break
            time.sleep(0.1)
    host.leases.parent.mkdir(parents=True, exist_ok=True)
    host.leases.touch(exist_ok=True)
    host.pidfile.parent.mkdir(parents=True, exist_ok=True)
    # the daemon outlives this run on purpose: started without the run's tag (core.runs.daemon_env)
    proc = subprocess.run(
        ["dhcpd", "-4", "-q", "-cf", str(host.conf), "-lf", str(host.leases), "-pf", str(host.pidfile),
         pool.config.interface],
        capture_output=True, text=True, timeout=60, check=False, env=daemon_env(),
    )  # fmt: skip
    if proc.returncode != 0:
        raise ExternalError(
            f"dhcpd did not start: {(proc.stderr or proc.stdout).strip()[-400:]}",
            hint=f"is {pool.config.interface} up with an address in {pool.config.subnet}?",
        )
    for _ in range(50):
        if host.running_pid():
            break
        time.sleep(0.1)
    return InstallReport(changed, True, host.running_pid())


# --- verifying on the wire ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Exchange:
    xid: str
    client_mac: str
    kind: str  # Request | ACK | ...
    your_ip: str | None


_XID = re.compile(r"xid 0x([0-9a-f]+)")
_MAC = re.compile(r"Client-Ethernet-Address ([0-9a-f:]{17})")
_YOUR = re.compile(r"Your-IP ([0-9.]+)")
_TYPE = re.compile(r"DHCP-Message \(53\), length 1: (\w+)")


def parse_tcpdump(text: str) -> list[Exchange]:
    """DHCP messages from ``tcpdump -vv`` output (one packet per block starting at a timestamp line)."""
    out = []
    for block in re.split(r"\n(?=\d{2}:\d{2}:\d{2}\.\d+ )", text):
        kind = _TYPE.search(block)
        xid = _XID.search(block)
        if kind and xid:
            mac, your = _MAC.search(block), _YOUR.search(block)
            out.append(
                Exchange(xid.group(1), mac.group(1) if mac else "", kind.group(1), your.group(1) if your else None)
            )
    return out


def capture(interface: str, timeout: float) -> list[Exchange]:
    """Capture DHCP traffic (UDP 67/68) until a Request and its ACK are seen, or ``timeout`` passes."""
    tcpdump = shutil.which("tcpdump")
    if tcpdump is None:
        raise ExternalError("tcpdump is not installed", hint="run ./scripts/setup.sh (or apt-get install tcpdump)")
    proc = subprocess.Popen(
        [tcpdump, "-i", interface, "-n", "-l", "-vv", "-s", "0", "udp port 67 or udp port 68"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    raw = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                chunk = b""
            if chunk:
                raw += chunk
                if complete(parse_tcpdump(raw.decode(errors="replace"))):
                    break
            elif proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise ExternalError(
                    f"tcpdump on {interface} failed: {err.strip()[-300:]}", hint="is the interface name right?"
                )
            else:
                time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()
    text = raw.decode(errors="replace")
    return parse_tcpdump(text)


def complete(messages: list[Exchange]) -> Exchange | None:
    """The first ACK that answers a Request of the same transaction."""
    requests = {m.xid for m in messages if m.kind == "Request"}
    return next((m for m in messages if m.kind == "ACK" and m.xid in requests), None)
