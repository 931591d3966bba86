"""``dhcp.verify``: a request and its ACK seen on the wire (tcpdump), whichever server answered."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass

from imagebuilder.core.errors import ExternalError


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
