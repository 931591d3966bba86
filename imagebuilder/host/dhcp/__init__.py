"""The cluster network's DHCP host (spec 4.9, issue 32): one config file (``model``) served by ISC dhcpd or Kea
(``servers``, ``render``), checked on the wire (``wire``)."""

from imagebuilder.host.dhcp.model import (
    IP,
    ControlPlaneIP,
    DhcpConfig,
    FixedLease,
    Pool,
    Reservation,
    Subnet,
    SubnetPool,
    dummy_mac,
    load_dhcp_config,
    resolve,
)
from imagebuilder.host.dhcp.render import isc_files, kea_config
from imagebuilder.host.dhcp.servers import SERVERS, DhcpHost, InstallReport, Lease, choose, current, install
from imagebuilder.host.dhcp.wire import capture, complete, parse_tcpdump

__all__ = [
    "IP", "SERVERS", "ControlPlaneIP", "DhcpConfig", "DhcpHost", "FixedLease", "InstallReport", "Lease", "Pool",
    "Reservation", "Subnet", "SubnetPool", "capture", "choose", "complete", "current", "dummy_mac", "install",
    "isc_files", "kea_config", "load_dhcp_config", "parse_tcpdump", "resolve",
]  # fmt: skip
