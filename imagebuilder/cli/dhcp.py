"""``dhcp.*``: the cluster network's DHCP host (spec 4.9) with the control-plane IPs kept out (spec 8)."""

from __future__ import annotations

import json
from pathlib import Path

from invoke.context import Context

from imagebuilder.cli import flags
from imagebuilder.cli._common import cli_task, print_json, task
from imagebuilder.core import grammar
from imagebuilder.core.errors import ExternalError, InputError

CONFIG_HELP = "the DHCP config file (YAML; see config/examples/dhcp.yaml)"


def _need(config: str) -> str:
    return str(flags.existing_file(flags.required(config, "--config", CONFIG_HELP), "--config"))


#: the servers' names, checked before the DHCP modules load (a bad --dhcp-server is answered at once); the same as
#: imagebuilder.host.dhcp.SERVERS' keys (tests/unit/test_untrusted_layer.py holds them equal)
SERVER_NAMES = ("kea", "isc")
SERVER_HELP = "kea or isc (default: the one installed here, else kea; the output says which and why)"


@task(
    flag_aliases={"dhcp_server": ("server",)},
    name="render",
    help={
        "config": CONFIG_HELP,
        "dest": "directory to write the server's files under, at their paths on the host (default ./dhcp)",
        "dhcp_server": SERVER_HELP,
        "dry_run": "print the files; write nothing",
    },
)
@cli_task
def render_files(
    c: Context, config: str = "", dest: str = "dhcp", dhcp_server: str = "", dry_run: bool = False
) -> None:
    """Render the DHCP server's files (dhcpd.conf and its defaults file, or kea-dhcp4.conf) from the DHCP config.

    Examples:
        image-builder dhcp.render --config dhcp.yaml --dest dhcp --dhcp-server kea --dry-run
    """
    source = _need(config)
    out = flags.dest_dir(dest, "--dest")
    from imagebuilder.core.files import atomic_write
    from imagebuilder.host.dhcp import DhcpHost, choose, load_dhcp_config

    chosen, why = choose(dhcp_server or None)
    pool = load_dhcp_config(source)
    print(f"server: {chosen.name} ({why})")
    for note in pool.notes:
        print(f"note: {note}")
    for path, text in chosen.files(pool, DhcpHost()).items():
        if dry_run:
            print(f"--- {path}\n{text}")
        else:
            target = out / path.lstrip("/")
            with atomic_write(target) as fh:
                fh.write(text)
            print(f"wrote {target}")


@task(
    flag_aliases={"dhcp_server": ("server",)},
    name="install",
    help={
        "config": CONFIG_HELP,
        "prefix": "root of the DHCP host's files (default /; tests use a directory)",
        "dhcp_server": SERVER_HELP,
        "dry_run": "print what would change; change nothing",
    },
)
@cli_task
def install_server(
    c: Context, config: str = "", prefix: str = "/", dhcp_server: str = "", dry_run: bool = False
) -> None:
    """On the DHCP host: install Kea or ISC dhcpd, check and write its files atomically, restart (rolled back to the
    previous files if it does not come up); leases are kept.

    Examples:
        image-builder dhcp.install --config dhcp.yaml --dry-run
    """
    source = _need(config)
    root = flags.dest_dir(prefix, "--prefix")
    from imagebuilder.host.dhcp import DhcpHost, choose, install, load_dhcp_config

    chosen, why = choose(dhcp_server or None)
    pool = load_dhcp_config(source)
    host = DhcpHost(root)
    print(f"server: {chosen.name} ({why})")
    report = install(pool, host, chosen, dry_run=dry_run)
    verb = "would change" if dry_run else "changed"
    for path in report.changed:
        print(f"{verb} {host.path(path)}")
    for other in report.stopped:
        print(f"{'would stop' if dry_run else 'stopped'} the {other} server (one DHCP server per link; leases kept)")
    if report.carried:
        came_from, count = report.carried
        print(
            f"carried {count} lease(s) held from {came_from}'s lease file into {chosen.name}'s: their machines keep "
            "their addresses"
        )
    interfaces = ", ".join(pool.interfaces)
    if dry_run:
        for path, text in chosen.files(pool, host).items():
            print(f"--- {path}\n{text}")
    elif report.restarted:
        print(f"{chosen.binary} (re)started on {interfaces}" + (f", pid {report.pid}" if report.pid else ""))
    else:
        print(f"nothing to change: {chosen.binary} already serves {interfaces} with this configuration")


@task(
    flag_aliases={"dhcp_server": ("server",)},
    help={
        "dhcp_server": "kea or isc (default: as dhcp.install chooses)",
        "prefix": "root of the DHCP host's files (default /)",
        "all": "also list expired and released leases",
        "output": "text (default) or json",
    },
)
@cli_task
def leases(c: Context, dhcp_server: str = "", prefix: str = "/", all: bool = False, output: str = "text") -> None:
    """List the DHCP server's leases from its lease file: hostname, MAC, IP, expiry.

    Examples:
        image-builder dhcp.leases --output json
    """
    root = flags.existing_dir(prefix, "--prefix")
    flags.choice(output, "--output", ("text", "json"))
    if dhcp_server:
        flags.choice(dhcp_server, "--dhcp-server", SERVER_NAMES)
    from imagebuilder.host.dhcp import DhcpHost, choose, current

    chosen, _ = choose(dhcp_server or None)
    found = chosen.leases(DhcpHost(root))
    shown = sorted(found, key=lambda x: tuple(int(p) for p in x.ip.split("."))) if all else current(found)
    if output == "json":
        print_json([{"ip": x.ip, "mac": x.mac, "hostname": x.hostname, "state": x.state,
                     "expires": x.expires.isoformat() if x.expires else None} for x in shown])  # fmt: skip
        return
    print(f"{'IP':<16} {'MAC':<18} {'HOSTNAME':<24} {'EXPIRES (UTC)':<20} STATE")
    for x in shown:
        when = x.expires.strftime("%Y-%m-%d %H:%M:%S") if x.expires else "never"
        print(f"{x.ip:<16} {x.mac:<18} {x.hostname or '-':<24} {when:<20} {x.state}")
    print(f"{len(shown)} lease(s) in {chosen.name}'s lease file")


@task(
    help={
        "interface": "interface to capture on (UDP 67/68)",
        "timeout": "seconds to wait for a request and its ACK (default 60)",
    },
)
@cli_task
def verify(c: Context, interface: str = "", timeout: str = "60") -> None:
    """Capture DHCP on an interface and report a request and its ACK (spec 4.9).

    Examples:
        image-builder dhcp.verify --interface eth1 --timeout 120
    """
    flags.required(interface, "--interface", "a network interface name")
    flags.grammar_of(grammar.interface_name, interface, "--interface")
    if not Path("/sys/class/net", interface).exists():
        raise InputError(f"no network interface {interface!r} on this host", field="--interface")
    seconds = flags.duration(timeout, "--timeout", 1, 3600)
    from imagebuilder.host.dhcp.wire import capture, complete

    messages = capture(
        interface, seconds, on_listening=lambda: print(f"listening for DHCP on {interface} ({seconds} s)", flush=True)
    )
    ack = complete(messages)
    for m in messages:
        print(f"{m.kind:<9} xid 0x{m.xid} client {m.client_mac or '-'}" + (f" -> {m.your_ip}" if m.your_ip else ""))
    if ack is None:
        seen = sum(1 for m in messages if m.kind in ("Discover", "Request"))
        raise ExternalError(
            f"no DHCP ACK on {interface} within {seconds} s ({seen} client message(s) seen)",
            hint="check that the DHCP server runs on this network; switches with DHCP snooping drop replies "
            "from servers they do not trust: turn snooping off or trust the server's port (spec 4.9)",
        )
    print(f"DHCP works on {interface}: request from {ack.client_mac} acknowledged with {ack.your_ip}")


@task()
@cli_task
def schema(c: Context) -> None:
    """Print the JSON Schema of the DHCP config file.

    Examples:
        image-builder dhcp.schema
    """
    from imagebuilder.host.dhcp import DhcpConfig

    data = DhcpConfig.model_json_schema()
    data["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    print_json(json.loads(json.dumps(data)))
