"""DHCP render of many fixed leases (issue 43): ``image-builder dhcp.render`` of a config whose hardware.csv holds
100,000 machines spread over one range (every other address of a /14), for each server, as the user runs it (the
whole command: the CSV read, the pool split, the file rendered and written). Target: under 10 s.

Its peer is the pool split it replaced, in the same run: cutting each held address out of the range list one at a
time (quadratic: 2,000 rows took 3 s and 5,000 rows 21 s when outside review found it), timed on 5,000 rows against
today's split of the same rows.
"""

from __future__ import annotations

import ipaddress
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MACHINES = 100_000
PEER_ROWS = 5_000
TARGET_S = 10.0


def _config(work: Path, machines: int) -> Path:
    """A one-subnet config (10.64.0.0/14) whose hardware.csv places ``machines`` machines on every other address
    of its range, so that every one of them splits the range."""
    work.mkdir(parents=True, exist_ok=True)
    net = ipaddress.IPv4Network("10.64.0.0/14")
    first = net.network_address + 10
    rows = ["hostname,bmc_ip,bmc_username,bmc_password,mac,ip_address,netmask,gateway,nameservers,labels,disk"]
    for i in range(machines):
        mac = ":".join(f"{b:02x}" for b in (2, 0, *(i + 1).to_bytes(4, "big")))
        rows.append(f"node-{i},10.200.0.1,admin,x,{mac},{first + 2 * i},255.252.0.0,10.64.0.1,,,")
    (work / "hardware.csv").write_text("\n".join(rows) + "\n")
    last = net.broadcast_address - 1
    config = work / "dhcp.yaml"
    config.write_text(
        f"dns_servers: [10.64.0.2]\nsubnets:\n  - interface: eth1\n    subnet: {net}\n"
        f"    range: {{start: {first}, end: {last}}}\n    routers: [10.64.0.1]\n"
        "fixed_leases_csv: hardware.csv\n"
    )
    return config


def _render(config: Path, server: str, dest: Path) -> float:
    t0 = time.monotonic()
    subprocess.run([str(BIN / "image-builder"), "dhcp.render", "--config", str(config), "--server", server,
                    "--dest", str(dest)], check=True, capture_output=True, cwd=ROOT)  # fmt: skip
    return time.monotonic() - t0


def _splits(machines: int) -> tuple[float, float]:
    """(the old per-address split, today's one sweep) over the same ``machines`` addresses, in seconds."""
    from imagebuilder.host.dhcp.model import _split, _split_all

    IP = ipaddress.IPv4Address
    lo, hi = IP("10.64.0.10"), IP("10.65.255.254")
    held = [lo + 2 * i for i in range(machines)]
    t0 = time.monotonic()
    ranges = [(lo, hi)]
    for ip in held:
        ranges = _split(ranges, ip)
    old = time.monotonic() - t0
    t0 = time.monotonic()
    new = _split_all([(lo, hi)], held)
    ours = time.monotonic() - t0
    assert new == ranges, "both splits give the same pools"
    return old, ours


def bench_dhcp(work: Path) -> dict[str, object]:
    config = _config(work / "dhcp", MACHINES)
    renders = {server: round(_render(config, server, work / "dhcp" / f"out-{server}"), 2) for server in ("isc", "kea")}
    isc = (work / "dhcp" / "out-isc" / "etc/dhcp/dhcpd.conf").read_text()
    assert isc.count("\nhost ") == MACHINES, "every machine is a host declaration"
    old, ours = _splits(PEER_ROWS)
    return {
        "machines": MACHINES,
        "render_isc_s": renders["isc"],
        "render_kea_s": renders["kea"],
        "target_s": TARGET_S,
        "met": max(renders.values()) < TARGET_S,
        "peer_rows": PEER_ROWS,
        "old_split_s": round(old, 3),
        "split_s": round(ours, 4),
        "split_speedup": round(old / ours, 1) if ours else None,
    }


if __name__ == "__main__":
    print(bench_dhcp(ROOT / "bench" / "work"))
