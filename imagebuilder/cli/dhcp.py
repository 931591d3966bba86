"""``dhcp.*``: the cluster network's DHCP host (spec 4.9) with the control-plane IPs kept out (spec 8)."""

from __future__ import annotations

import json
from pathlib import Path

from invoke.context import Context
from invoke.tasks import task

from imagebuilder.cli import flags
from imagebuilder.cli._common import cli_task, print_json
from imagebuilder.core import grammar
from imagebuilder.core.errors import ExternalError, InputError

CONFIG_HELP = "the DHCP config file (YAML; see config/examples/dhcp.yaml)"


def _need(config: str) -> str:
    return str(flags.existing_file(flags.required(config, "--config", CONFIG_HELP), "--config"))


@task(
    name="render",
    help={
        "config": CONFIG_HELP,
        "dest": "directory to write etc/dhcp/dhcpd.conf and etc/default/isc-dhcp-server under (default ./dhcp)",
        "dry_run": "print the files; write nothing",
    },
    auto_shortflags=False,
)
@cli_task
def render_files(c: Context, config: str = "", dest: str = "dhcp", dry_run: bool = False) -> None:
    """Render dhcpd.conf and the isc-dhcp-server defaults file from the DHCP config."""
    source = _need(config)
    out = flags.dest_dir(dest, "--dest")
    from imagebuilder.core.files import atomic_write
    from imagebuilder.host.dhcp import load_dhcp_config, render

    pool = load_dhcp_config(source)
    files = render(pool)
    for note in pool.notes:
        print(f"note: {note}")
    for path, text in files.items():
        if dry_run:
            print(f"--- {path}\n{text}")
        else:
            target = out / path.lstrip("/")
            with atomic_write(target) as fh:
                fh.write(text)
            print(f"wrote {target}")


@task(
    name="install",
    help={
        "config": CONFIG_HELP,
        "prefix": "root of the DHCP host's files (default /; tests use a directory)",
        "dry_run": "print what would change; change nothing",
    },
    auto_shortflags=False,
)
@cli_task
def install_server(c: Context, config: str = "", prefix: str = "/", dry_run: bool = False) -> None:
    """On the DHCP host: install isc-dhcp-server, write its files atomically, check with dhcpd -t, restart."""
    source = _need(config)
    root = flags.dest_dir(prefix, "--prefix")
    from imagebuilder.host.dhcp import DhcpHost, install, load_dhcp_config, render

    pool = load_dhcp_config(source)
    host = DhcpHost(root)
    report = install(pool, host, dry_run=dry_run)
    verb = "would change" if dry_run else "changed"
    for path in report.changed:
        print(f"{verb} {host.path(path)}")
    if dry_run:
        for path, text in render(pool).items():
            print(f"--- {path}\n{text}")
    elif report.restarted:
        print(f"dhcpd (re)started on {pool.config.interface}" + (f", pid {report.pid}" if report.pid else ""))
    else:
        print(f"nothing to change: dhcpd already serves {pool.config.interface} with this configuration")


@task(
    help={
        "interface": "interface to capture on (UDP 67/68)",
        "timeout": "seconds to wait for a request and its ACK (default 60)",
    },
    auto_shortflags=False,
)
@cli_task
def verify(c: Context, interface: str = "", timeout: str = "60") -> None:
    """Capture DHCP on an interface and report a request and its ACK (spec 4.9)."""
    flags.required(interface, "--interface", "a network interface name")
    flags.grammar_of(grammar.interface_name, interface, "--interface")
    if not Path("/sys/class/net", interface).exists():
        raise InputError(f"no network interface {interface!r} on this host", field="--interface")
    seconds = flags.duration(timeout, "--timeout", 1, 3600)
    from imagebuilder.host.dhcp import capture, complete

    messages = capture(interface, seconds)
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


@task(auto_shortflags=False)
@cli_task
def schema(c: Context) -> None:
    """Print the JSON Schema of the DHCP config file."""
    from imagebuilder.host.dhcp import DhcpConfig

    data = DhcpConfig.model_json_schema()
    data["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    print_json(json.loads(json.dumps(data)))
