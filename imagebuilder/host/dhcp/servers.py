"""The two DHCP servers a host may run, each one unit behind :data:`SERVERS`: ISC dhcpd (``isc-dhcp-server``) and
Kea (``kea-dhcp4-server``), and the install flow they share.

``install`` renders the server's files, checks the main one with the server itself (``dhcpd -t``, ``kea-dhcp4
-t``) before anything is replaced, writes them atomically, and restarts the server (systemd where it runs the
host, else the daemon under the given prefix). A server that does not come up with the new files gets the previous
ones back and is started again: the host keeps serving what it served. Leases live in the server's own lease
file (dhcpd.leases, Kea's memfile CSV), which nothing here ever truncates: they survive restarts and reinstalls.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import io
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from imagebuilder.core import grammar, untrusted
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.core.files import atomic_write
from imagebuilder.core.runs import daemon_env
from imagebuilder.host.dhcp.model import Pool
from imagebuilder.host.dhcp.render import isc_files, kea_text


@dataclass(frozen=True)
class Lease:
    """One lease as a lease file states it. Its host name and MAC are what a client sent: made printable here
    (:func:`untrusted.printable`), so no task prints a client's escape sequences."""

    ip: str
    mac: str
    hostname: str
    expires: dt.datetime | None  #: None: does not expire
    state: str  #: active, expired, declined...

    def __post_init__(self) -> None:
        for name in ("ip", "mac", "hostname", "state"):
            object.__setattr__(self, name, untrusted.printable(getattr(self, name)))


@dataclass
class DhcpHost:
    """The DHCP host's files under ``prefix`` (``/`` on a real host; a directory in tests)."""

    prefix: Path = Path("/")

    def path(self, absolute: str) -> Path:
        return self.prefix / absolute.lstrip("/")

    @property
    def uses_systemd(self) -> bool:
        return (
            self.prefix == Path("/") and Path("/run/systemd/system").is_dir() and shutil.which("systemctl") is not None
        )


class Server:
    """One DHCP server: its package, files, check, daemon and lease file."""

    name: ClassVar[str]
    package: ClassVar[str]
    unit: ClassVar[str]
    binary: ClassVar[str]
    #: the file the server's own check reads (the rest are written beside it)
    main: ClassVar[str]
    lease_file: ClassVar[str]

    def files(self, pool: Pool, host: DhcpHost) -> dict[str, str]:
        raise NotImplementedError

    def check_args(self, conf: Path) -> list[str]:
        raise NotImplementedError

    def pidfile(self, host: DhcpHost) -> Path:
        raise NotImplementedError

    def start_args(self, host: DhcpHost) -> list[str]:
        """The daemon's command line: everything it serves comes from the installed files."""
        raise NotImplementedError

    def env(self, host: DhcpHost) -> dict[str, str]:
        return daemon_env()

    def check_dirs(self, host: DhcpHost) -> list[Path]:
        """Folders the server's ``-t`` writes into (under ``host``, the check's private folder)."""
        return []

    def leases(self, host: DhcpHost) -> list[Lease]:
        raise NotImplementedError

    def lease_records(self, leases: list[Lease], pool: Pool, host: DhcpHost) -> str:
        """``leases`` as text this server's lease store takes appended (its own format)."""
        raise NotImplementedError

    # --- shared -------------------------------------------------------------------------------------------------

    def installed(self) -> bool:
        proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}", self.package], capture_output=True, text=True,
                              check=False)  # fmt: skip
        return proc.stdout.strip() == "install ok installed"

    def running_pid(self, host: DhcpHost) -> int | None:
        try:
            pid = int(self.pidfile(host).read_text().split()[0])
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            return None
        return pid

    def check(self, text: str) -> None:
        """The server's own check of a candidate main file; raises with its words when it is refused. Made in a
        private folder of the run, removed after: a refused file leaves nothing behind (not even an empty
        ``/etc/kea`` on a fresh host), and Kea's pid and lock files of ``-t`` go there too, not beside the config."""
        from imagebuilder.core.disk import run_tempdir

        if shutil.which(self.binary) is None:
            raise ExternalError(f"{self.binary} is not installed", hint=f"install {self.package} (dhcp.install does)")
        with run_tempdir(f"{self.name}-check") as tmp:
            for folder in self.check_dirs(DhcpHost(tmp)):  # Kea's lock files: a missing folder is four lines of noise
                folder.mkdir(parents=True, exist_ok=True)
            conf = tmp / Path(self.main).name
            conf.write_text(text)
            proc = subprocess.run(self.check_args(conf), capture_output=True, text=True, timeout=60, check=False,
                                  env=self.env(DhcpHost(tmp)))  # fmt: skip
        if proc.returncode != 0:
            lines = _cause(proc.stderr + proc.stdout)
            raise ExternalError(
                f"{self.binary} -t refused the new configuration; the old one is left in"
                f" place: " + " | ".join(lines[-6:]),
                hint="fix the DHCP config file and rerun",
            )

    def stop(self, host: DhcpHost) -> None:
        pid = self.running_pid(host)
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except OSError:
                return
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)

    def start(self, host: DhcpHost) -> int | None:
        """Start the daemon (the host has no systemd) and return its pid once it serves, or None if it exited."""
        self.pidfile(host).parent.mkdir(parents=True, exist_ok=True)
        self.pidfile(host).unlink(missing_ok=True)
        leases = host.path(self.lease_file)
        leases.parent.mkdir(parents=True, exist_ok=True)
        leases.touch(exist_ok=True)
        log = host.path(f"/var/log/image-builder-{self.name}-dhcp.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            # the daemon outlives this run on purpose: started without the run's tag (core.runs.daemon_env)
            proc = subprocess.Popen(self.start_args(host), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=self.env(host), start_new_session=True)  # fmt: skip
        for _ in range(100):
            pid = self.running_pid(host)
            if proc.poll() not in (None, 0):
                return None
            if pid is not None:
                time.sleep(0.5)  # a daemon that refuses its interfaces exits right after writing its pid
                return pid if self.running_pid(host) == pid and proc.poll() in (None, 0) else None
            time.sleep(0.1)
        return None

    def log_tail(self, host: DhcpHost) -> str:
        log = host.path(f"/var/log/image-builder-{self.name}-dhcp.log")
        try:
            return " | ".join(log.read_text(errors="replace").strip().splitlines()[-6:])
        except OSError:
            return ""


class IscServer(Server):
    name = "isc"
    package = "isc-dhcp-server"
    unit = "isc-dhcp-server"
    binary = "dhcpd"
    main = "/etc/dhcp/dhcpd.conf"
    lease_file = "/var/lib/dhcp/dhcpd.leases"

    def files(self, pool: Pool, host: DhcpHost) -> dict[str, str]:
        return isc_files(pool)

    def check_args(self, conf: Path) -> list[str]:
        return ["dhcpd", "-t", "-4", "-cf", str(conf)]

    def pidfile(self, host: DhcpHost) -> Path:
        return host.path("/run/dhcpd.pid")

    def start_args(self, host: DhcpHost) -> list[str]:
        # the interfaces the installed defaults file names, as the package's init script reads them: a rollback
        # starts the previous files' server on the previous files' interfaces
        defaults = _read(host.path("/etc/default/isc-dhcp-server"))
        found = re.search(r'^INTERFACESv4="([^"]*)"', defaults, re.M)
        interfaces = found.group(1).split() if found else []
        return ["dhcpd", "-4", "-q", "-cf", str(host.path(self.main)), "-lf", str(host.path(self.lease_file)),
                "-pf", str(self.pidfile(host)), *interfaces]  # fmt: skip

    def leases(self, host: DhcpHost) -> list[Lease]:
        return parse_dhcpd_leases(_read(host.path(self.lease_file)))

    def lease_records(self, leases: list[Lease], pool: Pool, host: DhcpHost) -> str:
        # dhcpd.leases blocks as dhcpd appends them (times in UTC, the weekday first); dhcpd reads the file whole
        # when it starts, the last block of an address winning
        now = dt.datetime.now(dt.UTC)
        blocks = []
        for lease in leases:
            assert lease.expires is not None
            name = f'  client-hostname "{lease.hostname}";\n' if lease.hostname else ""
            blocks.append(f"lease {lease.ip} {{\n  starts {_isc_stamp(now)};\n  ends {_isc_stamp(lease.expires)};\n"
                          f"  cltt {_isc_stamp(now)};\n  binding state active;\n  next binding state free;\n"
                          f"  rewind binding state free;\n  hardware ethernet {lease.mac};\n{name}}}\n")  # fmt: skip
        return "".join(blocks)


class KeaServer(Server):
    name = "kea"
    package = "kea-dhcp4-server"
    unit = "kea-dhcp4-server"
    binary = "kea-dhcp4"
    main = "/etc/kea/kea-dhcp4.conf"
    lease_file = "/var/lib/kea/kea-leases4.csv"

    def files(self, pool: Pool, host: DhcpHost) -> dict[str, str]:
        return {self.main: kea_text(pool, leases=str(host.path(self.lease_file)))}

    def check_args(self, conf: Path) -> list[str]:
        return ["kea-dhcp4", "-t", str(conf)]

    def env(self, host: DhcpHost) -> dict[str, str]:
        # where Kea puts its pid and logger lock files (its build's defaults are under /run/kea)
        run = str(host.path("/run/kea"))
        return {**daemon_env(), "KEA_PIDFILE_DIR": run, "KEA_LOCKFILE_DIR": run}

    def check_dirs(self, host: DhcpHost) -> list[Path]:
        return [host.path("/run/kea")]

    def pidfile(self, host: DhcpHost) -> Path:
        return host.path("/run/kea/kea-dhcp4.kea-dhcp4.pid")  # <config name>.kea-dhcp4.pid

    def start_args(self, host: DhcpHost) -> list[str]:
        return ["kea-dhcp4", "-c", str(host.path(self.main))]

    def lease_records(self, leases: list[Lease], pool: Pool, host: DhcpHost) -> str:
        # rows of Kea's memfile under the header its file already has (else Kea 2.2's, which later versions read),
        # in the subnet of the new configuration that holds the address
        existing = _first_line(host.path(self.lease_file))  # the header only: the file may hold a year of rows
        header = existing.split(",") if existing.startswith("address,") else KEA_HEADER
        now = int(dt.datetime.now(dt.UTC).timestamp())
        rows = [] if existing else [",".join(header)]
        for lease in leases:
            assert lease.expires is not None
            expire = int(lease.expires.timestamp())
            subnet = next(s.id for s in pool.subnets if ipaddress.IPv4Address(lease.ip) in s.subnet.subnet)
            values = {"address": lease.ip, "hwaddr": lease.mac, "valid_lifetime": str(max(1, expire - now)),
                      "expire": str(expire), "subnet_id": str(subnet), "fqdn_fwd": "0", "fqdn_rev": "0",
                      "hostname": lease.hostname, "state": "0", "pool_id": "0"}  # fmt: skip
            rows.append(",".join(values.get(column, "") for column in header))
        return "".join(f"{row}\n" for row in rows)

    def leases(self, host: DhcpHost) -> list[Lease]:
        # the memfile: the lease file and the ones kea-lfc is compacting (.1, .2); the newest row of an address wins
        text = "".join(_read(host.path(self.lease_file + suffix)) for suffix in (".2", ".1", ""))
        return parse_kea_leases(text)


SERVERS: dict[str, Server] = {s.name: s for s in (IscServer(), KeaServer())}


#: what dhcpd prints around every refusal (its banner, then its bug-report advice): not the cause
_BANNER = ("Internet Systems Consortium", "Copyright ", "All rights reserved", "For info, please visit")


def _cause(output: str) -> list[str]:
    """A server's refusal without its boilerplate: dhcpd's banner and everything from its bug-report advice on."""
    text = output.split("If you think you have received this message due to a bug", 1)[0]
    return [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(_BANNER)]


def _first_line(path: Path) -> str:
    try:
        with path.open(errors="replace") as fh:
            return fh.readline().strip()
    except OSError:
        return ""


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def choose(given: str | None) -> tuple[Server, str]:
    """The server to use and why: ``given``, else the one installed here, else Kea (ISC's server reached its end of
    life in 2022; Debian 12 and current Ubuntu ship Kea)."""
    if given:
        if given not in SERVERS:
            raise InputError(f"'{given}' is not a DHCP server", field="--dhcp-server", expected="kea or isc")
        return SERVERS[given], "--dhcp-server"
    have = [s for s in SERVERS.values() if s.installed()]
    if len(have) == 1:
        return have[0], f"{have[0].package} is installed here"
    if len(have) == 2:
        return SERVERS["kea"], "both servers are installed: Kea, the maintained one (--dhcp-server isc chooses dhcpd)"
    return SERVERS["kea"], "no DHCP server is installed here: Kea, the maintained one, is installed"


@dataclass
class InstallReport:
    server: str
    changed: list[str]
    restarted: bool
    pid: int | None
    stopped: list[str]
    #: (the server they came from, how many) of the leases carried into this server's lease store
    carried: tuple[str, int] | None = None


def _apt_install(package: str) -> None:
    subprocess.run(["apt-get", "update", "-qq"], check=False, capture_output=True)
    proc = subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", package],
        capture_output=True, text=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise ExternalError(
            f"installing {package} failed: {proc.stderr.strip()[-300:]}", hint="check the package archive"
        )


def _restart(server: Server, host: DhcpHost) -> int | None:
    """Restart ``server``; its pid (None under systemd), or raise when it does not come up."""
    if host.uses_systemd:
        proc = subprocess.run(["systemctl", "restart", server.unit], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ExternalError(f"systemctl restart {server.unit} failed: {proc.stderr.strip()}")
        return None
    server.stop(host)
    pid = server.start(host)
    if pid is None:
        raise ExternalError(f"{server.binary} did not come up: {server.log_tail(host)[-600:]}")
    return pid


def install(pool: Pool, host: DhcpHost, server: Server, *, dry_run: bool = False) -> InstallReport:
    files = server.files(pool, host)
    changed = [p for p, text in files.items() if not host.path(p).is_file() or host.path(p).read_text() != text]
    running = server.running_pid(host) if not host.uses_systemd else None
    others = [o for o in SERVERS.values() if o is not server and not host.uses_systemd and o.running_pid(host)]
    if host.prefix == Path("/") and os.geteuid() != 0:
        raise ExternalError("dhcp.install changes /etc and installs a package", hint="run it as root (or sudo)")
    if dry_run:
        # the same check the real run makes before writing, when the server is already here to make it
        if shutil.which(server.binary) is not None:
            server.check(files[server.main])
        restart = bool(changed) or (not host.uses_systemd and running is None)
        return InstallReport(server.name, changed, restart, running, [o.name for o in others])
    if not server.installed():
        _apt_install(server.package)
    server.check(files[server.main])
    previous = {p: host.path(p).read_text() if host.path(p).is_file() else None for p in changed}
    for path in changed:
        with atomic_write(host.path(path)) as fh:
            fh.write(files[path])
    if running is not None and not changed:
        return InstallReport(server.name, [], False, running, [])
    for other in others:  # one DHCP server per link: the other one is stopped (its leases file is kept)
        other.stop(host)
    if host.uses_systemd:
        for other in SERVERS.values():
            if other is not server:
                subprocess.run(["systemctl", "disable", "--now", other.unit], capture_output=True, check=False)
    carried = carry_leases(server, pool, host) if running is None else None
    try:
        pid = _restart(server, host)
    except ExternalError as exc:
        _roll_back(server, host, previous)
        raise ExternalError(
            f"{exc.message}; the previous configuration is back in place"
            + (" and serving" if any(v is not None for v in previous.values()) else ""),
            hint=f"fix the DHCP config file and rerun; see {server.log_tail(host) and 'the log above'}",
        ) from None
    return InstallReport(server.name, changed, True, pid, [o.name for o in others], carried)


def _roll_back(server: Server, host: DhcpHost, previous: dict[str, str | None]) -> None:
    for path, text in previous.items():
        if text is None:
            host.path(path).unlink(missing_ok=True)
        else:
            with atomic_write(host.path(path)) as fh:
                fh.write(text)
    if any(v is not None for v in previous.values()):
        try:
            if host.uses_systemd:
                subprocess.run(["systemctl", "restart", server.unit], capture_output=True, check=False)
            else:
                server.start(host)
        except OSError:
            pass


# --- leases -------------------------------------------------------------------------------------------------------

_LEASE = re.compile(r"^lease ([0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}) \{(.*?)^\}", re.M | re.S)


def _isc_time(text: str) -> dt.datetime | None:
    """``4 2026/11/26 15:20:00`` (weekday, UTC) or ``never``."""
    parts = text.split()
    if not parts or parts[0] == "never" or len(parts) < 3:
        return None
    try:
        return dt.datetime.strptime(f"{parts[1]} {parts[2]}", "%Y/%m/%d %H:%M:%S").replace(tzinfo=dt.UTC)
    except ValueError:
        return None


def parse_dhcpd_leases(text: str) -> list[Lease]:
    """dhcpd.leases: the last block of each address wins (dhcpd appends)."""
    latest: dict[str, Lease] = {}
    for ip, body in _LEASE.findall(text):
        if not grammar.is_ip(ip, 4):  # 999.1.1.1: not a lease dhcpd wrote
            continue
        fields: dict[str, str] = {}
        for raw in body.split(";"):
            line = raw.strip()
            for key in ("ends", "hardware ethernet", "client-hostname", "binding state"):
                if line.startswith(key + " "):
                    fields[key] = line[len(key) + 1 :].strip().strip('"')
        latest[ip] = Lease(ip, fields.get("hardware ethernet", ""), fields.get("client-hostname", ""),
                           _isc_time(fields.get("ends", "")), fields.get("binding state", "active"))  # fmt: skip
    return list(latest.values())


_KEA_STATES = {"0": "active", "1": "declined", "2": "expired"}
#: the memfile's columns as Kea 2.2 (Debian 12) writes them; later versions read it and add theirs
KEA_HEADER = ["address", "hwaddr", "client_id", "valid_lifetime", "expire", "subnet_id", "fqdn_fwd", "fqdn_rev",
              "hostname", "state", "user_context"]  # fmt: skip
#: what a carried lease's host name and MAC may hold: both lease stores write them unescaped (Kea's CSV has no
#: quoting, dhcpd.leases a quoted string), so anything else is carried without it
_CARRIED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}")
_CARRIED_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")


def _isc_stamp(when: dt.datetime) -> str:
    """A time as dhcpd.leases writes it: the weekday (0 is Sunday), then the UTC date and time."""
    utc = when.astimezone(dt.UTC)
    return f"{(utc.weekday() + 1) % 7} {utc:%Y/%m/%d %H:%M:%S}"


def carry_leases(server: Server, pool: Pool, host: DhcpHost) -> tuple[str, int] | None:
    """Every lease another server's store holds now (active, not expired, in a subnet of ``pool``) that ``server``'s
    store does not, appended to ``server``'s store before it starts: a machine keeps its address across a change of
    server, and the new server offers no held address to another machine. Returns (the other server, how many)."""
    mine = {lease.ip for lease in current(server.leases(host))}
    for other in SERVERS.values():
        if other is server:
            continue
        held = [lease for lease in current(other.leases(host))
                if lease.expires is not None and lease.ip not in mine and _CARRIED_MAC.fullmatch(lease.mac.lower())
                and any(ipaddress.IPv4Address(lease.ip) in s.subnet.subnet for s in pool.subnets)]  # fmt: skip
        if not held:
            continue
        held = [dataclasses.replace(lease, mac=lease.mac.lower(),
                                    hostname=lease.hostname if _CARRIED_NAME.fullmatch(lease.hostname) else "")
                for lease in held]  # fmt: skip
        store = host.path(server.lease_file)
        store.parent.mkdir(parents=True, exist_ok=True)
        with store.open("a") as fh:
            fh.write(server.lease_records(held, pool, host))
        return other.name, len(held)
    return None


def parse_kea_leases(text: str) -> list[Lease]:
    """Kea's memfile CSV (``address,hwaddr,client_id,valid_lifetime,expire,subnet_id,...,hostname,state``): the
    newest row of each address wins; a row with valid_lifetime 0 is a released lease."""
    latest: dict[str, Lease] = {}
    header: list[str] = []
    rows = csv.reader(io.StringIO(text))
    try:
        for cols in rows:
            if cols and cols[0] == "address":  # each file of the memfile starts with its header
                header = cols
                continue
            if not header or len(cols) < len(header) - 1:
                continue
            row = dict(zip(header, cols, strict=False))
            address = row.get("address") or ""
            if not grammar.is_ip(address, 4):  # not a lease Kea wrote: left out, never sorted or printed as an address
                continue
            try:
                expire = dt.datetime.fromtimestamp(grammar.integer(row.get("expire") or "0", 0, 2**40), dt.UTC)
            except (ValueError, OverflowError, OSError):  # out of range for a date: no expiry known
                expire = None
            state = _KEA_STATES.get(row.get("state") or "0", row.get("state") or "")
            if (row.get("valid_lifetime") or "") == "0":
                state = "released"
            latest[address] = Lease(address, row.get("hwaddr") or "", row.get("hostname") or "", expire, state)
    except csv.Error as exc:  # a field past the csv module's limit, a NUL: Kea writes neither
        raise InputError(f"Kea's lease file is damaged at line {rows.line_num} ({exc})",
                         source="kea-leases4.csv", expected="the CSV Kea's memfile writes") from None  # fmt: skip
    return list(latest.values())


def current(leases: list[Lease], now: dt.datetime | None = None) -> list[Lease]:
    """The leases a client holds now: active and not expired, by address."""
    now = now or dt.datetime.now(dt.UTC)
    live = [x for x in leases if x.state == "active" and (x.expires is None or x.expires > now)]
    return sorted(live, key=lambda x: tuple(int(p) for p in x.ip.split(".")))
