"""DHCP host (spec 4.9) with control-plane IP exclusion (spec 8): the rules, then a real isc-dhcp-server in one
network namespace serving real DHCP clients (busybox udhcpc on macvlans) in another, for each method."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import testinfra
import yaml

from imagebuilder.core.errors import ExternalError, InputErrors
from imagebuilder.core.runs import stat_fields
from imagebuilder.host.dhcp import DhcpConfig, DhcpHost, Pool, dummy_mac, install, load_dhcp_config, render
from tests.support.common import BIN, ROOT, run

EXAMPLE = ROOT / "config" / "examples" / "dhcp.yaml"
IP = ipaddress.IPv4Address


def write(tmp_path: Path, data: dict[str, Any], name: str = "dhcp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def base(**over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "interface": "eth0",
        "subnet": "10.77.0.0/24",
        "range": {"start": "10.77.0.10", "end": "10.77.0.31"},
        "routers": ["10.77.0.1"],
        "dns_servers": ["10.77.0.1"],
    }
    data.update(over)
    return data


def errors(tmp_path: Path, data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(InputErrors) as exc:
        load_dhcp_config(write(tmp_path, data))
    out: dict[str, str] = {}
    for e in exc.value.errors:
        out[e.field or ""] = out.get(e.field or "", "") + str(e) + "\n"
    return out


def test_example_config_and_defaults() -> None:
    pool = load_dhcp_config(EXAMPLE)
    assert pool.config.lease_time.default == 600 and pool.config.lease_time.max == 7200
    assert [(str(a), str(b)) for a, b in pool.ranges] == [
        ("192.168.10.100", "192.168.10.149"),
        ("192.168.10.151", "192.168.10.198"),
    ]
    assert [(r.ip, r.mac) for r in pool.reservations] == [(IP("192.168.10.150"), "02:00:c0:a8:0a:96")]
    conf = render(pool)["/etc/dhcp/dhcpd.conf"]
    for line in ("default-lease-time 600;", "max-lease-time 7200;", "ddns-update-style none;", "authoritative;",
                 "subnet 192.168.10.0 netmask 255.255.255.0 {", "option subnet-mask 255.255.255.0;",
                 "option routers 192.168.10.1;", "option domain-name-servers 192.168.10.2, 192.168.10.3;"):  # fmt: skip
        assert line in conf
    assert 'INTERFACESv4="eth0"' in render(pool)["/etc/default/isc-dhcp-server"]


def test_shrink_cuts_the_cheaper_side(tmp_path: Path) -> None:
    top = load_dhcp_config(write(tmp_path, base(exclusion="shrink", control_plane_ips=["10.77.0.29"])))
    assert top.ranges == [(IP("10.77.0.10"), IP("10.77.0.28"))]
    bottom = load_dhcp_config(write(tmp_path, base(exclusion="shrink", control_plane_ips=["10.77.0.12"])))
    assert bottom.ranges == [(IP("10.77.0.13"), IP("10.77.0.31"))]


def test_reserve_splits_the_range_and_uses_a_mac_no_nic_has(tmp_path: Path) -> None:
    pool = load_dhcp_config(write(tmp_path, base(control_plane_ips=[{"ip": "10.77.0.20", "method": "reserve"}])))
    assert pool.ranges == [(IP("10.77.0.10"), IP("10.77.0.19")), (IP("10.77.0.21"), IP("10.77.0.31"))]
    mac = dummy_mac(IP("10.77.0.20"))
    assert mac == "02:00:0a:4d:00:14" and int(mac.split(":")[0], 16) & 0b10  # locally administered
    assert f"hardware ethernet {mac};" in render(pool)["/etc/dhcp/dhcpd.conf"]


@pytest.mark.parametrize(
    ("data", "field", "needle"),
    [
        (base(control_plane_ips=["10.77.0.20"]), "control_plane_ips[0]", "no exclusion method"),
        (base(control_plane_ips=["10.78.0.5"], exclusion="shrink"), "control_plane_ips[0]", "not a host address"),
        (base(control_plane_ips=["10.77.0.5", "10.77.0.5"]), "control_plane_ips[1]", "each cluster needs its own IP"),
        (base(range={"start": "10.77.0.10", "end": "10.77.1.5"}), "range", "not inside the subnet"),
        (base(range={"start": "10.77.0.31", "end": "10.77.0.10"}), "range", "is after end"),
        (base(routers=["10.77.0.15"]), "routers[0]", "inside the dynamic range"),
        (base(lease_time={"default": 9000, "max": 7200}), "lease_time", "longer than max"),
        (base(lease_time={"default": 0, "max": 7200}), "lease_time.default", "greater than or equal to 1"),
        (base(lease_time={"default": 10**10}), "lease_time.default", "less than or equal to 2147483647"),
        (base(lease_time={"max": True}), "lease_time.max", "valid integer"),
        (base(routers=["10.77.0.0"]), "routers[0]", "network address, not a host"),
        (base(routers=["10.77.0.255"]), "routers[0]", "broadcast address, not a host"),
        (base(domain_name="not a domain!"), "domain_name", "not a domain name"),
        (
            base(control_plane_ips=[{"ip": "10.77.0.5", "cluster": "a\nsubnet 1.2.3.0 {"}]),
            "control_plane_ips[0].cluster",
            "not a cluster name",
        ),
        (
            base(
                range={"start": "10.77.0.10", "end": "10.77.0.10"}, control_plane_ips=["10.77.0.10"], exclusion="shrink"
            ),
            "control_plane_ips[0]",
            "leaves no address",
        ),
        (
            base(control_plane_ips=[{"ip": "10.77.0.20", "method": "outside"}]),
            "control_plane_ips[0]",
            "declared 'outside'",
        ),
        (base(subnet="10.77.0.1/24"), "subnet", "not a network address"),
        (base(intreface="eth0"), "intreface", "did you mean 'interface'"),
        (base(control_plane_ips=[{"ip": "10.77.0.5", "method": "ignore"}]), "control_plane_ips[0].method", "outside"),
    ],
)
def test_rejected_configs(tmp_path: Path, data: dict[str, Any], field: str, needle: str) -> None:
    got = errors(tmp_path, data)
    assert field in got, got
    assert needle in got[field] and "dhcp.yaml" in got[field]


def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    bad = write(tmp_path, base(control_plane_ips=["10.77.0.20"]))
    res = run("dhcp.render", "--config", str(bad), "--dest", str(tmp_path / "out"))
    assert res.code == 2 and "no exclusion method" in res.err and not (tmp_path / "out").exists()
    ok = run("dhcp.render", "--config", str(EXAMPLE), "--dest", str(tmp_path / "out"))
    assert ok.code == 0 and (tmp_path / "out" / "etc" / "dhcp" / "dhcpd.conf").is_file()
    assert "INTERFACESv4" in (tmp_path / "out" / "etc" / "default" / "isc-dhcp-server").read_text()
    assert run("dhcp.schema").code == 0


@pytest.mark.parametrize("method", ["outside", "shrink", "reserve"])
def test_dhcpd_accepts_every_method(method: str, tmp_path: Path) -> None:
    ip = "10.77.0.40" if method == "outside" else "10.77.0.20"
    pool = load_dhcp_config(write(tmp_path, base(control_plane_ips=[{"ip": ip, "method": method}])))
    conf = tmp_path / "dhcpd.conf"
    conf.write_text(render(pool)["/etc/dhcp/dhcpd.conf"])
    proc = subprocess.run(["dhcpd", "-t", "-4", "-cf", str(conf)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# --- real server, real clients -------------------------------------------------------------------------------------

SRV, CLI = f"ibdhcp-s{os.getpid()}", f"ibdhcp-c{os.getpid()}"
IFACE = "ibdhcp0"


def ns(name: str, *args: str, check: bool = True, timeout: int = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", name, *args], capture_output=True, text=True, check=check, timeout=timeout
    )


@pytest.fixture(scope="module")
def network() -> Iterator[None]:
    """Two hosts joined by a veth pair: the DHCP server and the clients. Removed afterwards."""
    subprocess.run(["ip", "netns", "add", SRV], check=True)
    subprocess.run(["ip", "netns", "add", CLI], check=True)
    try:
        subprocess.run(
            ["ip", "link", "add", IFACE, "netns", SRV, "type", "veth", "peer", "name", "ibdhcpc", "netns", CLI],
            check=True,
        )
        ns(SRV, "ip", "addr", "add", "10.77.0.1/24", "dev", IFACE)
        for name, dev in ((SRV, IFACE), (CLI, "ibdhcpc")):
            ns(name, "ip", "link", "set", dev, "up")
            ns(name, "ip", "link", "set", "lo", "up")
        for i in range(1, 23):
            ns(CLI, "ip", "link", "add", f"c{i}", "link", "ibdhcpc", "type", "macvlan", "mode", "bridge")
            ns(CLI, "ip", "link", "set", f"c{i}", "address", f"02:42:0a:00:00:{i:02x}", "up")
        yield
    finally:
        subprocess.run(["ip", "netns", "del", SRV], check=False)
        subprocess.run(["ip", "netns", "del", CLI], check=False)


def lease(i: int) -> str | None:
    res = ns(
        CLI,
        "busybox",
        "udhcpc",
        "-q",
        "-n",
        "-i",
        f"c{i}",
        "-s",
        "/bin/true",
        "-t",
        "3",
        "-T",
        "1",
        "-A",
        "1",
        check=False,
    )
    for line in (res.stdout + res.stderr).splitlines():
        if "lease of" in line:
            return line.split("lease of ")[1].split()[0]
    return None


def install_in_ns(config: Path, prefix: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return ns(
        SRV,
        str(BIN / "image-builder"),
        "dhcp.install",
        "--config",
        str(config),
        "--prefix",
        str(prefix),
        *extra,
        check=False,
    )


def stop(prefix: Path) -> None:
    pid = DhcpHost(prefix).running_pid()
    if pid:
        os.kill(pid, 15)
        time.sleep(0.3)


CASES = {
    # method: (range end, control-plane IP): every case leaves 20 or 21 addresses for 21 clients
    "outside": ("10.77.0.29", "10.77.0.40"),
    "shrink": ("10.77.0.30", "10.77.0.30"),
    "reserve": ("10.77.0.30", "10.77.0.20"),
}


@pytest.mark.parametrize("method", list(CASES))
def test_leases_never_hit_the_control_plane_ip(method: str, network: None, tmp_path: Path) -> None:
    end, cp = CASES[method]
    config = write(tmp_path, base(interface=IFACE, range={"start": "10.77.0.10", "end": end},
                                  control_plane_ips=[{"ip": cp, "cluster": "mgmt", "method": method}]))  # fmt: skip
    prefix = tmp_path / "host"
    res = install_in_ns(config, prefix)
    assert res.returncode == 0, res.stdout + res.stderr
    try:
        pool = load_dhcp_config(config)
        got = [lease(i) for i in range(1, 23)]
        leased = [IP(ip) for ip in got if ip]
        assert len(leased) >= 20, got
        assert len(set(leased)) == len(leased), "two clients got the same address"
        assert IP(cp) not in leased, f"{cp} was handed out"
        assert all(pool.contains(ip) for ip in leased), leased
        if method != "outside":
            # the pool is exactly full: without the exclusion the control-plane IP would have been handed out
            assert len(leased) == sum(int(b) - int(a) + 1 for a, b in pool.ranges)
    finally:
        stop(prefix)


def test_install_converges_keeps_old_config_on_failure_and_testinfra(network: None, tmp_path: Path) -> None:
    config = write(tmp_path, base(interface=IFACE, exclusion="reserve", control_plane_ips=["10.77.0.20"]))
    prefix = tmp_path / "host"
    first = install_in_ns(config, prefix)
    assert first.returncode == 0, first.stderr
    pid = DhcpHost(prefix).running_pid()
    try:
        # the daemon outlives dhcp.install on purpose: a later task's sweep never takes it for a dead run's
        swept = run("host.clean")
        assert swept.code == 0 and "dhcpd" not in swept.out, swept.out
        assert stat_fields(pid)[0] not in ("Z", "X"), "dhcpd was killed by the sweep"
        again = install_in_ns(config, prefix)
        assert again.returncode == 0 and "nothing to change" in again.stdout
        assert DhcpHost(prefix).running_pid() == pid
        dry = install_in_ns(config, prefix, "--dry-run")
        assert "--- /etc/dhcp/dhcpd.conf" in dry.stdout

        host = testinfra.get_host("local://")
        assert host.package("isc-dhcp-server").is_installed
        conf = host.file(str(prefix / "etc/dhcp/dhcpd.conf"))
        assert conf.contains("authoritative;") and conf.contains("fixed-address 10.77.0.20;")
        assert host.file(str(prefix / "etc/default/isc-dhcp-server")).contains(f'INTERFACESv4="{IFACE}"')
        proc = host.process.get(pid=pid)
        assert proc.comm == "dhcpd" and IFACE in proc.args and str(prefix / "etc/dhcp/dhcpd.conf") in proc.args
        listening = host.run(f"ip netns exec {SRV} ss -Hlunp sport = :67").stdout
        assert f"pid={pid}" in listening and ":67" in listening
        packet = host.run(f"ip netns exec {SRV} ss -Hl0p").stdout
        assert f"pid={pid}" in packet and IFACE in packet  # the raw socket dhcpd reads requests with

        # a configuration dhcpd -t refuses: the old one stays and keeps serving
        before = conf.content_string
        broken = Pool(DhcpConfig.model_validate(base(interface=IFACE)), [(IP("10.77.5.1"), IP("10.77.5.9"))])
        with pytest.raises(ExternalError, match="dhcpd -t refused"):
            install(broken, DhcpHost(prefix))
        assert host.file(str(prefix / "etc/dhcp/dhcpd.conf")).content_string == before
        assert DhcpHost(prefix).running_pid() == pid
        assert not [p for p in (prefix / "etc" / "dhcp").iterdir() if p.name.startswith(".")]
    finally:
        stop(prefix)


def test_verify_sees_request_and_ack_or_says_why_not(network: None, tmp_path: Path) -> None:
    config = write(tmp_path, base(interface=IFACE))
    prefix = tmp_path / "host"
    assert install_in_ns(config, prefix).returncode == 0
    try:
        result: dict[str, subprocess.CompletedProcess[str]] = {}
        watcher = threading.Thread(
            target=lambda: result.setdefault(
                "v",
                ns(
                    SRV, str(BIN / "image-builder"), "dhcp.verify", "--interface", IFACE, "--timeout", "30", check=False
                ),
            )
        )
        watcher.start()
        time.sleep(1.5)
        assert lease(21)
        watcher.join()
        verified = result["v"]
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert "acknowledged with 10.77.0." in verified.stdout and "02:42:0a:00:00:15" in verified.stdout
    finally:
        stop(prefix)
    # no server: the client asks, nobody answers
    silent: dict[str, subprocess.CompletedProcess[str]] = {}
    watcher = threading.Thread(
        target=lambda: silent.setdefault(
            "v", ns(SRV, str(BIN / "image-builder"), "dhcp.verify", "--interface", IFACE, "--timeout", "6", check=False)
        )
    )
    watcher.start()
    time.sleep(1.5)
    assert lease(22) is None
    watcher.join()
    assert silent["v"].returncode == 1
    assert "no DHCP ACK" in silent["v"].stderr and "snooping" in silent["v"].stderr
