"""What each DHCP server reads, from one resolved :class:`~imagebuilder.host.dhcp.model.Pool`.

ISC dhcpd's ``dhcpd.conf`` comes from a template (``templates/dhcp``) whose every value is an address, a number or
a name the model validated to a grammar. Kea's ``kea-dhcp4.conf`` is JSON built as data and serialized, never
templated: the same semantics, in Kea's words (``authoritative``, no DDNS, memfile leases kept on disk).
"""

from __future__ import annotations

import json
from typing import Any

from imagebuilder.core.render import template_env
from imagebuilder.host.dhcp.model import Pool, SubnetPool


def isc_files(pool: Pool) -> dict[str, str]:
    """dhcpd.conf and the isc-dhcp-server defaults file, by their path on the DHCP host."""
    env = template_env()
    ctx = {"pool": pool, "config": pool.config}
    return {
        "/etc/dhcp/dhcpd.conf": env.get_template("templates/dhcp/dhcpd.conf.j2").render(ctx),
        "/etc/default/isc-dhcp-server": env.get_template("templates/dhcp/isc-dhcp-server.j2").render(ctx),
    }


def _kea_subnet(s: SubnetPool) -> dict[str, Any]:
    options = [
        {"name": "routers", "data": ", ".join(map(str, s.subnet.routers))},
        {"name": "domain-name-servers", "data": ", ".join(map(str, s.dns_servers))},
        {"name": "subnet-mask", "data": s.netmask},
    ]
    if s.domain_name:
        options.append({"name": "domain-name", "data": s.domain_name})
    subnet: dict[str, Any] = {
        "id": s.id,
        "subnet": str(s.subnet.subnet),
        "interface": s.subnet.interface,
        "pools": [{"pool": f"{lo} - {hi}"} for lo, hi in s.ranges],
        "option-data": options,
        "reservations": [
            {"hw-address": r.mac, "ip-address": str(r.ip), **({"hostname": r.hostname} if r.hostname else {})}
            for r in s.reservations
        ],
    }
    return subnet


def kea_config(pool: Pool, *, leases: str) -> dict[str, Any]:
    """``kea-dhcp4.conf`` as data; ``leases`` is the memfile lease file (a path on the host). Kea logs to its standard
    output: the journal under systemd, the daemon's log file otherwise."""
    lt = pool.config.lease_time
    subnets: list[dict[str, Any]] = []
    shared: list[dict[str, Any]] = []
    for interface, members in pool.shared().items():
        if len(members) == 1:
            subnets.append(_kea_subnet(members[0]))
        else:  # one link, several subnets: Kea's shared network, as dhcpd's
            shared.append({"name": interface, "interface": interface, "subnet4": [_kea_subnet(s) for s in members]})
    dhcp4: dict[str, Any] = {
        # every interface must open its sockets, or Kea does not start (and dhcp.install rolls back)
        "interfaces-config": {
            "interfaces": pool.interfaces,
            "dhcp-socket-type": "raw",
            "service-sockets-require-all": True,
        },
        # leases on disk, kept across restarts and reinstalls; the file is compacted hourly (kea-lfc)
        "lease-database": {"type": "memfile", "persist": True, "name": leases, "lfc-interval": 3600},
        "valid-lifetime": lt.default,
        "min-valid-lifetime": min(lt.default, lt.max),
        "max-valid-lifetime": lt.max,
        "authoritative": True,
        # no dynamic DNS (dhcpd's ddns-update-style none)
        "ddns-send-updates": False,
        "dhcp-ddns": {"enable-updates": False},
        "host-reservation-identifiers": ["hw-address"],
        "subnet4": subnets,
        "loggers": [{"name": "kea-dhcp4", "output_options": [{"output": "stdout"}], "severity": "INFO"}],
    }
    if shared:
        dhcp4["shared-networks"] = shared
    return {"Dhcp4": dhcp4}


#: one encoder for every one-line mapping (json.dumps with arguments builds an encoder per call)
_ONE_LINE = json.JSONEncoder(separators=(", ", ": "))


def _json(value: Any, indent: str = "") -> str:
    """JSON indented as ``json.dumps(indent=2)`` writes it, except that a mapping of plain values (a reservation, a
    pool, an option) is one line: as readable, and serialized by the C encoder (100,000 reservations in a fraction
    of the pure-Python indenting encoder's time)."""
    inner = indent + "  "
    if isinstance(value, dict) and value:
        if not any(isinstance(v, dict | list) for v in value.values()):
            return _ONE_LINE.encode(value)
        items = (f"{inner}{json.dumps(k)}: {_json(v, inner)}" for k, v in value.items())
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(value, list) and value:
        return "[\n" + ",\n".join(f"{inner}{_json(v, inner)}" for v in value) + f"\n{indent}]"
    return json.dumps(value)


def kea_text(pool: Pool, *, leases: str) -> str:
    return "// Written by image-builder dhcp.install (spec 4.9). Edit the DHCP config file and rerun instead.\n" + (
        _json(kea_config(pool, leases=leases)) + "\n"
    )
