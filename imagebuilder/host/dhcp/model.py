"""The DHCP config file (spec 4.9, issue 32) and what it resolves to: every subnet's pools with the control-plane
endpoint IPs (spec 8), the excluded addresses and the fixed leases kept out of them.

One file serves both servers (ISC dhcpd and Kea). It has two forms: the single-subnet one spec 4.9 describes
(``interface``, ``subnet``, ``range``, ``routers``... at the top), and ``subnets:``, a list of them (one per rack or
VLAN). Subnets on one interface are one shared network (one link, several address ranges). Fixed leases (MAC ->
IP, with a host name) come inline or from a ``hardware.csv`` in the product's bare-metal inventory format.

Every control-plane IP has a method (spec 8):

- ``outside``: the IP must already lie outside the dynamic range (checked, never changed);
- ``shrink``: the range is cut at the top or the bottom, whichever loses fewer addresses, so the IP falls out;
- ``reserve``: a reservation for a MAC no NIC has (locally administered, derived from the IP); ISC dhcpd still
  offers such an address to other clients when it lies inside a range (we tried it), so the range is also split
  around it.

Excluded addresses and fixed-lease addresses inside a range split it too: a pool never holds an address that is
not for any client to take. Every problem is reported at once, naming the file, the field and, for a conflict,
the other side.
"""

from __future__ import annotations

import csv
import io
import ipaddress
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, StrictInt, ValidationError, field_validator, model_validator

from imagebuilder.core import grammar
from imagebuilder.core.errors import InputError, InputErrors
from imagebuilder.core.files import load_yaml_mapping, read_text
from imagebuilder.core.validation import StrictModel, validated

Method = Literal["outside", "shrink", "reserve"]


#: a dotted quad as ipaddress accepts it (no leading zeros, each part 0-255): parsed here by the C library in a
#: fraction of ipaddress's time (a hardware.csv of 100,000 machines), anything else left to ipaddress's own words
_DOTTED_QUAD = re.compile(r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
                          r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])")  # fmt: skip


def _address_text(value: Any) -> Any:
    """Addresses are written as text: a bare number (or a bool) is a mistake, not 192.168.10.50 in disguise."""
    if not isinstance(value, str | ipaddress.IPv4Address):
        raise ValueError(f"expected an IPv4 address such as 192.168.10.50, got {value!r}")
    if isinstance(value, str) and _DOTTED_QUAD.fullmatch(value):
        return ipaddress.IPv4Address(socket.inet_aton(value))
    return value


IP = Annotated[ipaddress.IPv4Address, BeforeValidator(_address_text)]
_MAC = re.compile(r"[0-9a-f]{2}([:-][0-9a-f]{2}){5}")


def mac_address(text: str) -> str:
    """An Ethernet MAC address, as ``aa:bb:cc:dd:ee:ff`` (lower case; ``-`` separators accepted)."""
    value = text.strip().lower() if isinstance(text, str) else ""
    if not _MAC.fullmatch(value):
        raise ValueError(f"expected a MAC address such as 02:42:0a:00:00:01, got {str(text)[:40]!r}")
    return value.replace("-", ":")


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


def _network(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return ipaddress.IPv4Network(value, strict=True)
        except ValueError as exc:
            raise ValueError(f"{value!r} is not a network address with prefix ({exc})") from None
    return value


class FixedLease(StrictModel):
    """A machine that always gets the same address (the bare-metal inventory's MAC, IP and host name)."""

    mac: str = Field(description="the machine's MAC address")
    ip: IP = Field(description="the address it always gets")
    hostname: str = Field(description="its host name (option host-name)")

    @field_validator("mac", mode="before")
    @classmethod
    def _mac(cls, value: Any) -> str:
        return mac_address(value)

    @field_validator("hostname")
    @classmethod
    def _hostname(cls, value: str) -> str:
        name = grammar.hostname(value)
        if re.fullmatch(r"[0-9.]+", name) or grammar.is_ip(name):  # an IPv6 one too: dhcpd -t refuses `host ::1`
            raise ValueError(f"expected a host name, got the address {value[:60]!r}")
        return name


class _LinkFields(StrictModel):
    """The grammar of the fields a subnet and the single-subnet file share (an interface name, a network with its
    prefix, a domain name): what reaches a server's file is checked here, once."""

    @field_validator("interface", check_fields=False)
    @classmethod
    def _iface(cls, value: str | None) -> str | None:
        return None if value is None else grammar.interface_name(value)

    @field_validator("subnet", mode="before", check_fields=False)
    @classmethod
    def _net(cls, value: Any) -> Any:
        return _network(value)

    @field_validator("domain_name", check_fields=False)
    @classmethod
    def _domain(cls, value: str | None) -> str | None:
        return None if value is None else grammar.domain_name(value)


class Subnet(_LinkFields):
    """One subnet (a rack, a VLAN): its interface, dynamic range, routers and exclusions."""

    interface: str = Field(description="the DHCP host's NIC on this subnet's link (subnets sharing one are a shared "
                                       "network)")  # fmt: skip
    subnet: ipaddress.IPv4Network = Field(description="network address with prefix, e.g. 192.168.10.0/24")
    range: Range = Field(description="dynamic range handed out to nodes")
    routers: list[IP] = Field(min_length=1, description="default gateways (option routers)")
    dns_servers: list[IP] | None = Field(None, description="option domain-name-servers (default: the file's)")
    domain_name: str | None = Field(None, description="option domain-name (default: the file's)")
    exclude: list[IP] = Field(default_factory=list, description="addresses in this subnet never handed out")
    exclusion: Method | None = Field(None, description="default method for this subnet's control-plane IPs")
    control_plane_ips: list[ControlPlaneIP] = Field(default_factory=list, description="control-plane endpoint IPs")


#: the top-level keys of the single-subnet form (spec 4.9)
SINGLE = ("interface", "subnet", "range", "routers", "control_plane_ips")


class DhcpConfig(_LinkFields):
    """The DHCP config file (YAML): the single-subnet form of spec 4.9, or ``subnets:``."""

    interface: str | None = Field(None, description="the DHCP host's NIC on the cluster network (INTERFACESv4)")
    subnet: ipaddress.IPv4Network | None = Field(None, description="network address with prefix, e.g. "
                                                                   "192.168.10.0/24")  # fmt: skip
    range: Range | None = Field(None, description="dynamic range handed out to nodes")
    routers: list[IP] | None = Field(None, min_length=1, description="default gateways (option routers)")
    dns_servers: list[IP] | None = Field(None, min_length=1, description="option domain-name-servers (for every "
                                                                         "subnet that gives none)")  # fmt: skip
    domain_name: str | None = Field(None, description="option domain-name")
    lease_time: LeaseTimes = Field(default_factory=LeaseTimes, description="lease times in seconds")
    exclusion: Method | None = Field(None, description="default method for control-plane IPs inside a range")
    control_plane_ips: list[ControlPlaneIP] = Field(
        default_factory=list,
        description="one per cluster (the management cluster and each workload cluster): an address, or an object",
    )
    exclude: list[IP] = Field(default_factory=list, description="addresses never handed out, in any subnet")
    subnets: list[Subnet] = Field(default_factory=list, description="several subnets (one per rack or VLAN), "
                                                                    "instead of the single-subnet keys")  # fmt: skip
    fixed_leases: list[FixedLease] = Field(default_factory=list, description="machines that always get one address")
    fixed_leases_csv: str | None = Field(None, description="a hardware.csv (columns hostname, mac, ip_address; others "
                                                           "ignored), relative to this file")  # fmt: skip

    @model_validator(mode="after")
    def _one_form(self) -> DhcpConfig:
        single = [k for k in SINGLE if getattr(self, k)]
        if self.subnets and single:
            raise ValueError(f"give subnets, or {', '.join(SINGLE[:4])} at the top (one subnet), not both "
                             f"(found {', '.join(single)})")  # fmt: skip
        if not self.subnets:
            missing = [k for k in ("interface", "subnet", "range", "routers", "dns_servers") if not getattr(self, k)]
            if missing:
                raise ValueError(f"missing {', '.join(missing)} (or give subnets: a list of subnets)")
        return self

    def all_subnets(self) -> list[tuple[str, Subnet]]:
        """Every subnet with the field path it is reported by (the single form is one subnet at the top)."""
        if self.subnets:
            return [(f"subnets[{i}].", s) for i, s in enumerate(self.subnets)]
        assert self.interface and self.subnet and self.range and self.routers
        one = Subnet.model_construct(
            interface=self.interface, subnet=self.subnet, range=self.range, routers=self.routers,
            dns_servers=self.dns_servers, domain_name=self.domain_name, exclude=[], exclusion=self.exclusion,
            control_plane_ips=self.control_plane_ips,
        )  # fmt: skip
        return [("", one)]


@dataclass(frozen=True)
class Reservation:
    name: str
    mac: str
    ip: IP
    hostname: str | None = None  #: a fixed lease's (option host-name); None for a control-plane endpoint's


@dataclass(frozen=True)
class SubnetPool:
    """One subnet as the servers declare it."""

    id: int  #: Kea's subnet-id (1, 2, ... in file order)
    subnet: Subnet
    dns_servers: list[IP]
    domain_name: str | None
    ranges: list[tuple[IP, IP]]
    reservations: list[Reservation]

    @property
    def netmask(self) -> str:
        return str(self.subnet.subnet.netmask)


@dataclass(frozen=True)
class Pool:
    """What the servers declare: every subnet's ranges left after exclusion, and the reservations."""

    config: DhcpConfig
    subnets: list[SubnetPool]
    notes: list[str] = field(default_factory=list)

    @property
    def ranges(self) -> list[tuple[IP, IP]]:
        return [r for s in self.subnets for r in s.ranges]

    @property
    def reservations(self) -> list[Reservation]:
        return [r for s in self.subnets for r in s.reservations]

    @property
    def interfaces(self) -> list[str]:
        return list(dict.fromkeys(s.subnet.interface for s in self.subnets))

    def shared(self) -> dict[str, list[SubnetPool]]:
        """Subnets by interface: an interface with more than one is a shared network."""
        out: dict[str, list[SubnetPool]] = {}
        for s in self.subnets:
            out.setdefault(s.subnet.interface, []).append(s)
        return out

    def contains(self, ip: IP) -> bool:
        return any(lo <= ip <= hi for lo, hi in self.ranges)


def dummy_mac(ip: IP) -> str:
    """A locally administered unicast MAC that no NIC has, derived from the IP (stable across runs)."""
    return "02:00:" + ":".join(f"{b:02x}" for b in ip.packed)


def _split(ranges: list[tuple[IP, IP]], ip: IP) -> list[tuple[IP, IP]]:
    out: list[tuple[IP, IP]] = []
    for lo, hi in ranges:
        if lo <= ip <= hi:
            out += [(a, b) for a, b in ((lo, ip - 1), (ip + 1, hi)) if a <= b]
        else:
            out.append((lo, hi))
    return out


def _split_all(ranges: list[tuple[IP, IP]], held: list[IP]) -> list[tuple[IP, IP]]:
    """``ranges`` less every address of ``held``, in one sweep over both sorted (as integers): linear where
    :func:`_split` per address was quadratic (100,000 fixed leases spread over a range)."""
    cuts = sorted({int(ip) for ip in held})
    out: list[tuple[int, int]] = []
    i = 0
    for lo, hi in sorted((int(a), int(b)) for a, b in ranges):
        while i < len(cuts) and cuts[i] < lo:
            i += 1
        start = lo
        while i < len(cuts) and cuts[i] <= hi:
            if start < cuts[i]:
                out.append((start, cuts[i] - 1))
            start = cuts[i] + 1
            i += 1
        if start <= hi:
            out.append((start, hi))
    return [(ipaddress.IPv4Address(a), ipaddress.IPv4Address(b)) for a, b in out]


def _shrink(ranges: list[tuple[IP, IP]], ip: IP, label: str, notes: list[str]) -> list[tuple[IP, IP]]:
    """Cut the side of the range holding ``ip`` that loses fewer addresses."""
    out: list[tuple[IP, IP]] = []
    for lo, hi in ranges:
        if not lo <= ip <= hi:
            out.append((lo, hi))
            continue
        below, above = int(ip) - int(lo), int(hi) - int(ip)
        kept = (ip + 1, hi) if below <= above else (lo, ip - 1)
        lost = below + 1 if below <= above else above + 1
        notes.append(f"{label}: range shrunk at the {'bottom' if below <= above else 'top'} ({lost} addresses)")
        if kept[0] <= kept[1]:
            out.append(kept)
    return out


def _check_subnet(where: str, s: Subnet, problems: list[tuple[str, str]]) -> None:
    net, rng = s.subnet, s.range
    if rng.start not in net or rng.end not in net:
        problems.append((f"{where}range", f"{rng.start}-{rng.end} is not inside the subnet {net}"))
    if rng.start > rng.end:
        problems.append((f"{where}range", f"start {rng.start} is after end {rng.end}"))
    for edge in (net.network_address, net.broadcast_address):
        if rng.start <= edge <= rng.end:
            which = "network" if edge == net.network_address else "broadcast"
            problems.append((f"{where}range", f"includes the {which} address {edge}"))
    for i, router in enumerate(s.routers):
        if router not in net:
            problems.append((f"{where}routers[{i}]", f"{router} is not inside the subnet {net}"))
        elif router in (net.network_address, net.broadcast_address):
            which = "network" if router == net.network_address else "broadcast"
            problems.append((f"{where}routers[{i}]", f"{router} is the subnet's {which} address, not a host"))
        if rng.start <= router <= rng.end:
            problems.append((f"{where}routers[{i}]", f"{router} is inside the dynamic range {rng.start}-{rng.end}"))


def _subnet_of(ip: IP, subnets: list[tuple[str, Subnet]]) -> int | None:
    return next((i for i, (_, s) in enumerate(subnets) if ip in s.subnet), None)


def resolve(config: DhcpConfig, source: str | Path = "dhcp config", fixed: list[FixedLease] | None = None,
            fixed_where: list[str] | None = None) -> Pool:  # fmt: skip
    """Check the rules that span fields and apply the exclusions; every problem is reported at once. ``fixed``
    (with the field path of each, ``fixed_where``) are the fixed leases: the file's inline ones and its CSV's."""
    problems: list[tuple[str, str]] = []
    subnets = config.all_subnets()
    fixed = list(config.fixed_leases) if fixed is None else fixed
    fixed_where = [f"fixed_leases[{i}]" for i in range(len(fixed))] if fixed_where is None else fixed_where
    for where, s in subnets:
        _check_subnet(where, s, problems)
    # subnets that overlap, named by both sides
    for i, (wi, a) in enumerate(subnets):
        for wj, b in subnets[:i]:
            if a.subnet.overlaps(b.subnet):
                problems.append((f"{wi}subnet", f"{a.subnet} overlaps {wj}subnet {b.subnet}"))
    lt = config.lease_time
    if lt.default > lt.max:
        problems.append(("lease_time", f"default ({lt.default}) is longer than max ({lt.max})"))
    if config.subnets and not config.dns_servers and any(s.dns_servers is None for _, s in subnets):
        where = next(w for w, s in subnets if s.dns_servers is None)
        problems.append((f"{where}dns_servers", "no DNS servers: give them here or at the top (dns_servers)"))

    ranges = [[(s.range.start, s.range.end)] for _, s in subnets]
    reservations: list[list[Reservation]] = [[] for _ in subnets]
    notes: list[str] = []
    taken: dict[IP, str] = {}  # address -> who holds it (routers, control-plane IPs, exclusions, fixed leases)
    for where, s in subnets:
        for i, router in enumerate(s.routers):
            taken.setdefault(router, f"{where}routers[{i}]")

    def hold(ip: IP, by: str) -> bool:
        other = taken.get(ip)
        if other is not None:
            why = (
                ": each cluster needs its own IP" if "control_plane_ips" in by and "control_plane_ips" in other else ""
            )
            problems.append((by, f"{ip} is also {other}{why}"))
            return False
        taken[ip] = by
        return True

    # control-plane IPs: the file's (single form) and each subnet's
    cps: list[tuple[str, ControlPlaneIP, Method | None]]
    cps = [(f"control_plane_ips[{i}]", cp, None) for i, cp in enumerate(config.control_plane_ips)] if config.subnets \
        else []  # fmt: skip
    cps += [(f"{w}control_plane_ips[{i}]", cp, s.exclusion) for w, s in subnets for i, cp in
            enumerate(s.control_plane_ips)]  # fmt: skip
    for where, cp, subnet_default in cps:
        label = cp.cluster or str(cp.ip)
        k = _subnet_of(cp.ip, subnets)
        if k is None or cp.ip in (subnets[k][1].subnet.network_address, subnets[k][1].subnet.broadcast_address):
            of = f"the subnet {subnets[0][1].subnet}" if len(subnets) == 1 else "any subnet"
            problems.append((where, f"{cp.ip} is not a host address of {of}"))
            continue
        if not hold(cp.ip, where):
            continue
        method = cp.method or subnet_default or config.exclusion
        inside = any(lo <= cp.ip <= hi for lo, hi in ranges[k])
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
            # the address is in the name: two endpoints of one cluster are two host declarations
            name = f"control-plane-{re.sub(r'[^A-Za-z0-9-]', '-', f'{label}-{cp.ip}')}"
            reservations[k].append(Reservation(name, dummy_mac(cp.ip), cp.ip))
        if inside:
            ranges[k] = _split(ranges[k], cp.ip) if method == "reserve" else _shrink(ranges[k], cp.ip, label, notes)
            if not ranges[k]:
                problems.append((where, f"excluding {cp.ip} leaves no address in the dynamic range"))
    # excluded addresses and fixed leases: cut out of the ranges in one sweep per subnet at the end
    cut: list[list[IP]] = [[] for _ in subnets]
    # excluded addresses: the file's (in some subnet) and each subnet's (in that subnet)
    excluded: list[tuple[str, IP, int | None]] = [(f"exclude[{i}]", ip, None) for i, ip in enumerate(config.exclude)]
    excluded += [(f"{w}exclude[{i}]", ip, k) for k, (w, s) in enumerate(subnets) for i, ip in enumerate(s.exclude)]
    for where, ip, own in excluded:
        k = _subnet_of(ip, subnets)
        if k is None or (own is not None and k != own):
            problems.append((where, f"{ip} is outside " + ("every subnet" if own is None else
                                                           f"its subnet {subnets[own][1].subnet}")))  # fmt: skip
            continue
        if hold(ip, where):
            cut[k].append(ip)
    # fixed leases: one MAC, one address and one host name each
    macs: dict[str, str] = {}
    names: dict[str, str] = {}
    for where, lease in zip(fixed_where, fixed, strict=True):
        for value, seen, what in ((lease.mac, macs, "mac"), (lease.hostname, names, "hostname")):
            if value in seen:
                problems.append((f"{where}.{what}", f"{value} is also {seen[value]}.{what}"))
            else:
                seen[value] = where
        k = _subnet_of(lease.ip, subnets)
        if k is None:
            problems.append((f"{where}.ip", f"{lease.ip} is outside every subnet"))
            continue
        if hold(lease.ip, f"{where}.ip"):
            reservations[k].append(Reservation(lease.hostname, lease.mac, lease.ip, lease.hostname))
            cut[k].append(lease.ip)
    ranges = [_split_all(r, c) for r, c in zip(ranges, cut, strict=True)]
    for k, (where, _) in enumerate(subnets):
        if not ranges[k] and not any(p[0].startswith(where) and "leaves no address" in p[1] for p in problems):
            problems.append((f"{where}range", "nothing is left of the range after the exclusions"))
    if problems:
        raise InputErrors([InputError(msg, source=source, field=f) for f, msg in problems])
    pools = [
        SubnetPool(
            k + 1,
            s,
            list(s.dns_servers or config.dns_servers or []),
            s.domain_name or config.domain_name,
            ranges[k],
            reservations[k],
        )
        for k, (_, s) in enumerate(subnets)
    ]
    return Pool(config, pools, notes)


#: the hardware.csv columns a fixed lease is read from (the product's bare-metal inventory has more: BMC address and
#: credentials, labels, disk; they are never read)
CSV_COLUMNS = {"mac": "mac", "ip_address": "ip", "hostname": "hostname"}
#: what each of them must be, said without quoting the value (a row shifted by an unquoted comma in a password
#: would put a piece of it in any of them)
CSV_EXPECTED = {"mac": "not a MAC address (such as 02:42:0a:00:00:01)", "ip": "not an IPv4 address",
                "hostname": "not a host name (letters, digits, '-', dots)"}  # fmt: skip


def read_hardware_csv(path: Path) -> tuple[list[FixedLease], list[str], list[InputError]]:
    """The fixed leases of a hardware.csv, the field path of each (``hardware.csv:row 3``) and the problems.

    No message quotes a row: the file holds BMC credentials. A row whose field count is not the header's is refused
    before any of it is read (an unquoted comma in a password would shift a piece of it into the mac column)."""
    text = read_text(path, "hardware.csv")
    reader = csv.reader(io.StringIO(text))
    try:
        header = [c.strip() for c in next(reader, [])]
    except csv.Error as exc:
        return [], [], [InputError(f"is not CSV: {exc}", source=path, field="header")]
    missing = [c for c in CSV_COLUMNS if c not in header]
    if missing:
        expected = "hardware.csv columns: hostname, mac, ip_address (others are ignored)"
        return (
            [],
            [],
            [InputError(f"has no column {', '.join(missing)}", source=path, field="header", expected=expected)],
        )
    index = {CSV_COLUMNS[c]: header.index(c) for c in CSV_COLUMNS}
    leases, where, problems = [], [], []
    try:
        for n, fields in enumerate(reader, start=2):
            if not fields:
                continue  # a blank line
            if len(fields) != len(header):
                problems.append(InputError(
                    f"has {len(fields)} fields, the header {len(header)}", source=path, field=f"row {n}",
                    expected="one field per column; a value with a comma in double quotes"))  # fmt: skip
                continue
            values = {name: fields[i].strip() for name, i in index.items()}
            try:
                leases.append(FixedLease.model_validate(values))
                where.append(f"{path.name}:row {n}")
            except ValidationError as exc:  # named by column, never quoted: a shifted row may hold a password
                for column in dict.fromkeys(".".join(str(p) for p in err["loc"]) for err in exc.errors()):
                    problems.append(InputError(f"{column}: {CSV_EXPECTED.get(column, 'invalid')}", source=path,
                                               field=f"row {n}"))  # fmt: skip
    except csv.Error as exc:  # a field past the reader's limit, a NUL: named by its row, never quoted
        problems.append(InputError(f"is not CSV from here on: {exc}", source=path, field=f"line {reader.line_num}"))
    return leases, where, problems


def load_dhcp_config(path: str | Path) -> Pool:
    path = Path(path)
    config = validated(DhcpConfig, load_yaml_mapping(path, "DHCP config"), path)
    fixed = list(config.fixed_leases)
    where = [f"fixed_leases[{i}]" for i in range(len(fixed))]
    if config.fixed_leases_csv:
        csv_path = path.parent / config.fixed_leases_csv  # read only (three columns of it); absolute paths too
        if not csv_path.is_file():
            raise InputError(f"{csv_path} is not a file", source=path, field="fixed_leases_csv",
                             expected="a hardware.csv beside the config file (or its absolute path)")  # fmt: skip
        more, more_where, problems = read_hardware_csv(csv_path)
        if problems:
            raise InputErrors(problems)
        fixed += more
        where += more_where
    return resolve(config, path, fixed, where)
