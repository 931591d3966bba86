"""``dhcp.verify``: a request and its ACK seen on the wire (tcpdump), whichever server answered."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
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
    for block in re.split(r"\n(?=[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]+ )", text):
        kind = _TYPE.search(block)
        xid = _XID.search(block)
        if kind and xid:
            mac, your = _MAC.search(block), _YOUR.search(block)
            out.append(
                Exchange(xid.group(1), mac.group(1) if mac else "", kind.group(1), your.group(1) if your else None)
            )
    return out


def capture(interface: str, timeout: float, on_listening: Callable[[], None] | None = None) -> list[Exchange]:
    """Capture DHCP traffic (UDP 67/68) until a Request and its ACK are seen, or ``timeout`` passes.

    ``on_listening`` is called once tcpdump says it listens (a request sent before then is not seen: whoever starts
    a client to check the server waits for it)."""
    tcpdump = shutil.which("tcpdump")
    if tcpdump is None:
        raise ExternalError("tcpdump is not installed", hint="run ./scripts/setup.sh (or apt-get install tcpdump)")
    proc = subprocess.Popen(
        [tcpdump, "-i", interface, "-n", "-l", "-vv", "-s", "0", "udp port 67 or udp port 68"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    os.set_blocking(fd, False)
    os.set_blocking(err_fd, False)
    raw, err = b"", b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                chunk = b""
            if on_listening is not None:
                with contextlib.suppress(BlockingIOError):
                    err += os.read(err_fd, 65536)
                if b"listening on" in err:
                    on_listening()
                    on_listening = None
            if chunk:
                raw += chunk
                if complete(parse_tcpdump(raw.decode(errors="replace"))):
                    break
            elif proc.poll() is not None:
                with contextlib.suppress(BlockingIOError):
                    err += proc.stderr.read() or b""
                raise ExternalError(
                    f"tcpdump on {interface} failed: {err.decode(errors='replace').strip()[-300:]}",
                    hint="is the interface name right?",
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
