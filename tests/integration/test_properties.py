"""Property-based tests (Hypothesis) for the parsers and renderers of the input boundary.

The renderers are checked by the programs that read what they write: ISC dhcpd (``dhcpd -t``), Packer's own HCL2
evaluator (``packer console``), and the YAML loader's round trip. The parsers (grammars, safe-join, byte ranges) are
checked for their invariants on any text."""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from imagebuilder.core.errors import InputError
from imagebuilder.core.render import hcl
from imagebuilder.host.dhcp import SERVERS, DhcpConfig, DhcpHost, isc_files, resolve
from tests.support.common import EXAMPLES
from tests.support.properties import SLOW, accepted, branch, mutate, reaches

# --- DHCP: any accepted config renders a file dhcpd accepts, with exactly the statements it implies -------------

hostile_text = st.text(st.characters(codec="utf-8"), max_size=40) | st.sampled_from(
    ['a"; }', "x\nsubnet 1.2.3.0 netmask 255.255.255.0 {}", "mgmt", "workload-1", "a" * 81, "w}", "#x", "\\"]
)


@st.composite
def dhcp_configs(draw: st.DrawFn) -> dict[str, object]:
    prefix = draw(st.integers(16, 28))
    base = draw(st.integers(0, 2**32 - 1)) & ~((1 << (32 - prefix)) - 1) & 0xFFFFFFFF
    net = ipaddress.IPv4Network((base, prefix))
    hosts = net.num_addresses - 2
    lo = draw(st.integers(1, hosts))
    hi = draw(st.integers(lo, hosts))

    def addr(i: int) -> str:
        return str(net.network_address + i)

    endpoints = draw(st.lists(st.integers(0, net.num_addresses - 1), max_size=4, unique=True))
    lease = st.integers(60, 86400) | st.integers(-1, 2**33)
    return {
        "interface": draw(st.sampled_from(["eth0", "ens192", "br-lan.10", "eth1", 'eth0"', "e" * 16])),
        "subnet": str(net),
        "range": {"start": addr(lo), "end": addr(hi)},
        "routers": [
            addr(
                draw(
                    st.sampled_from([lo - 1, hi + 1]).filter(lambda i: 0 < i <= hosts)
                    | st.integers(0, net.num_addresses - 1)
                )
            )
        ],
        "dns_servers": [addr(draw(st.integers(1, hosts)))],
        "domain_name": draw(st.sampled_from([None, None, "cluster.local", "a-b.example.com"]) | hostile_text),
        # routers: mostly a valid host outside the range
        "lease_time": {"default": draw(lease), "max": draw(lease)},
        "exclusion": draw(st.none() | st.sampled_from(["outside", "shrink", "reserve"])),
        "control_plane_ips": [
            {
                "ip": addr(i),
                "cluster": draw(st.none() | hostile_text),
                "method": draw(st.none() | st.sampled_from(["outside", "shrink", "reserve"])),
            }
            for i in endpoints
        ],
    }


def _statements(conf: str) -> list[str]:
    """The statements of a dhcpd.conf, comments dropped, one per entry."""
    text = "\n".join(line.split("#", 1)[0] for line in conf.splitlines())
    return [s.strip() for s in re.split(r"[;{}]", text) if s.strip()]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dhcp_configs())
@example(  # found by this test: two reserved endpoints of one cluster once became two hosts of one name
    {
        "interface": "eth0",
        "subnet": "10.0.0.0/16",
        "range": {"start": "10.0.0.2", "end": "10.0.0.9"},
        "routers": ["10.0.0.1"],
        "exclusion": "reserve",
        "control_plane_ips": [{"ip": "10.0.0.3", "cluster": "A0"}, {"ip": "10.0.0.4", "cluster": "A0"}],
    }
)
def test_any_accepted_dhcp_config_renders_what_dhcpd_accepts_and_nothing_else(data: dict[str, object]) -> None:
    try:
        config = DhcpConfig.model_validate(data)
        pool = resolve(config)
    except (InputError, ValueError):
        event("refused")
        return  # refused: exit 2 at the CLI, nothing rendered
    event("accepted")
    files = isc_files(pool)
    conf = files["/etc/dhcp/dhcpd.conf"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dhcpd.conf"
        path.write_text(conf)
        dhcpd = shutil.which("dhcpd") or "/usr/sbin/dhcpd"
        proc = subprocess.run([dhcpd, "-t", "-cf", str(path)], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, conf + proc.stderr
    statements = _statements(conf)
    kinds = [s.split()[0] for s in statements]
    allowed = {"default-lease-time", "max-lease-time", "ddns-update-style", "authoritative", "subnet", "range",
               "option", "host", "hardware", "fixed-address"}  # fmt: skip
    assert set(kinds) <= allowed, kinds
    assert kinds.count("subnet") == 1
    assert kinds.count("host") == len(pool.reservations)
    ranges = [s.split()[1:] for s in statements if s.startswith("range ")]
    assert ranges == [[str(lo), str(hi)] for lo, hi in pool.ranges]
    for cp in config.control_plane_ips:
        assert not pool.contains(cp.ip) or (cp.method or config.exclusion) is None
    defaults = files["/etc/default/isc-dhcp-server"]
    assert [ln for ln in defaults.splitlines() if ln and not ln.startswith("#")] == [
        f'INTERFACESv4="{config.interface}"',
        'INTERFACESv6=""',
    ]
    # Kea's file, built as data, says the same: its pools are exactly these ranges, its reservations these hosts
    kea = json.loads(SERVERS["kea"].files(pool, DhcpHost())["/etc/kea/kea-dhcp4.conf"].split("\n", 1)[1])["Dhcp4"]
    (subnet,) = kea["subnet4"]
    assert subnet["pools"] == [{"pool": f"{lo} - {hi}"} for lo, hi in pool.ranges]
    assert [r["ip-address"] for r in subnet["reservations"]] == [str(r.ip) for r in pool.reservations]
    assert kea["interfaces-config"]["interfaces"] == [config.interface] and kea["authoritative"] is True


# --- HCL: any string or number is one literal that Packer evaluates back to the same value -------------------------


@pytest.mark.slow
@SLOW
@given(st.lists(st.text(st.characters(codec="utf-8"), max_size=30) | st.sampled_from(["${x}", "%{if}", "$${", "\\"]),
                min_size=1, max_size=12))  # fmt: skip
def test_hcl_literals_evaluate_to_the_same_string_in_packer(values: list[str]) -> None:
    body = "".join(f"  v{i} = {hcl(v)}\n" for i, v in enumerate(values))
    template = f'locals {{\n{body}}}\nsource "null" "a" {{ communicator = "none" }}\n'
    template += 'build { sources = ["source.null.a"] }\n'
    expr = "jsonencode([" + ", ".join(f"local.v{i}" for i in range(len(values))) + "])"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.pkr.hcl"
        path.write_text(template)
        proc = subprocess.run(["packer", "console", str(path)], input=expr + "\n", capture_output=True, text=True,
                              timeout=60, cwd=tmp)  # fmt: skip
    assert proc.returncode == 0, template + proc.stdout + proc.stderr
    # split on "\n" only: str.splitlines() and strip() would also cut at U+0085 and friends inside the JSON
    assert json.loads([ln for ln in proc.stdout.split("\n") if ln][-1]) == values


# --- YAML: what safe_dump writes comes back equal; any text is data or an InputError -----------------------------


# --- grammars, safe-join, ranges ------------------------------------------------------------------------------------


# --- manifests of any shape: data or an InputError, never a crash ----------------------------------------------------

wrong_shapes = st.sampled_from([None, [], {}, "text", 0, True, [1, 2], {"a": 1}])


DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


@functools.cache
def _text(kind: str) -> str:
    from tests.support.common import make_manifest, reference

    if kind == "release":
        return make_manifest("1-24", 36, "v1.24.17")
    return reference("eksa", "bundles-testdata.yaml").read_text()


def _loaded(kind: str) -> object:
    return yaml.load(_text(kind), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=8), wrong_shapes)
def test_release_manifests_of_any_shape(path: list[int], replacement: object) -> None:
    from imagebuilder.release.manifest import parse_manifest

    doc = mutate(_loaded("release"), path, replacement)
    with contextlib.suppress(InputError):
        parse_manifest(yaml.dump(doc, Dumper=DUMPER), "release.yaml")


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=10), wrong_shapes)
def test_bundle_manifests_of_any_shape(path: list[int], replacement: object) -> None:
    from imagebuilder.release.hook import hook_assets

    doc = mutate(_loaded("bundle"), path, replacement)
    with contextlib.suppress(InputError):
        hook_assets(yaml.dump(doc, Dumper=DUMPER), "bundle.yaml")


# --- Packer templates: any accepted provider config renders a template Packer parses and formats as is ------------

VSPHERE_TEXT_FIELDS = ["datacenter", "cluster", "resource_pool", "datastore", "network", "folder",
                       "platform_library_name", "username"]  # fmt: skip


@pytest.mark.slow
@SLOW
@given(st.dictionaries(st.sampled_from(VSPHERE_TEXT_FIELDS), hostile_text, min_size=1, max_size=3))
@example(changes={"cluster": ""})  # empty is unset: no cluster line (found by CI)
def test_any_accepted_vsphere_config_renders_a_template_packer_accepts(changes: dict[str, str]) -> None:
    from imagebuilder.builder.lint import LINT_KVM
    from imagebuilder.builder.packer import PackerInfo, fmt_check, render_build
    from imagebuilder.builder.resolve import make_plan
    from imagebuilder.plan.model import BuildRequest

    base = json.loads((EXAMPLES / "vsphere-ubuntu.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "vsphere.json"
        config.write_text(json.dumps({**base, **changes}))
        try:
            plan = make_plan(BuildRequest(os="ubuntu", hypervisor="vsphere", release_channel="1-24",
                                          configs={"vsphere": str(config)}, offline=True))  # fmt: skip
        except InputError:
            event("refused")
            return
        event("accepted")
        packer = PackerInfo.detect()
        rendered = render_build(plan, Path(tmp) / "out", packer, kvm=LINT_KVM, require_artifacts=False)
        fmt = fmt_check(rendered.template, packer)
        assert fmt.returncode == 0, rendered.template.read_text() + fmt.stdout + fmt.stderr
        text = rendered.template.read_text()
        proc = subprocess.run(["packer", "validate", "-syntax-only", rendered.template.name], cwd=rendered.directory,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 0, text + proc.stdout + proc.stderr
        for field in changes:
            value = getattr(plan.config, field)
            if value is None:  # an empty optional value is unset (issue 28): the template leaves its line out
                assert changes[field] == "", (field, changes[field])
                continue
            assert hcl(value) in text, value  # each value is one escaped literal, as the model holds it


# --- issue 32: subnets, ranges, exclusions and fixed leases: the pools hold exactly what is free ------------------


#: what dhcpd's lexer and a shell treat specially: one of them, put anywhere in a name, is its hostile change
HOSTILE_CHARS = "@:/+#=%,;{}\"'$!*&?[(|^<> \\\t"


@st.composite
def hostile_change(draw: st.DrawFn, names: st.SearchStrategy[str]) -> str:
    """A name the grammar accepts, and one time in five the same with one hostile character put in it (two names in
    a config: both clean in about two draws of three)."""
    name = draw(names)
    if draw(st.sampled_from((False, False, False, False, True))):  # Hypothesis favours the first: clean
        at = draw(st.integers(0, len(name)))
        name = name[:at] + draw(st.sampled_from(HOSTILE_CHARS)) + name[at:]
    return name


#: the names each server's file may carry: an interface as the kernel names one (IFNAMSIZ), a host name of DNS labels
interfaces = hostile_change(st.from_regex(r"[A-Za-z0-9_.@-]{1,15}", fullmatch=True).filter(lambda n: n not in ".."))
host_names = hostile_change(st.from_regex(r"[a-z][a-z0-9-]{0,14}(\.[a-z][a-z0-9-]{0,10}){0,2}", fullmatch=True)
                            .filter(lambda n: not any(label.endswith("-") for label in n.split("."))))  # fmt: skip


@reaches(0.5)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(interface=interfaces, hostname=host_names)
@example(interface="x@y", hostname="node-a")  # found by outside review: dhcpd -t refused shared-network x@y
def test_every_accepted_interface_and_host_name_passes_both_servers_checks(interface: str, hostname: str) -> None:
    """A name the config's grammar accepts is one both servers accept in the file rendered from it (two subnets on
    the interface, so that ISC declares it a shared network; a fixed lease with the host name), checked by the real
    ``dhcpd -t`` and ``kea-dhcp4 -t``; a name either would refuse is refused by the grammar first. (Kea's check
    also wants the interface to exist here: it checks the host name on lo, whose file holds the same strings.)"""
    rack = {"interface": interface, "range": {"start": "10.20.0.50", "end": "10.20.0.99"}, "routers": ["10.20.0.1"]}
    data = {"dns_servers": ["10.20.0.2"],
            "subnets": [{**rack, "subnet": "10.20.0.0/24"},
                        {**rack, "subnet": "10.21.0.0/24", "range": {"start": "10.21.0.50", "end": "10.21.0.99"},
                         "routers": ["10.21.0.1"]}],
            "fixed_leases": [{"mac": "02:00:00:00:00:01", "ip": "10.20.0.5", "hostname": hostname}]}  # fmt: skip
    pool = accepted(data)
    if pool is None:
        branch("refused")
        assert any(c in HOSTILE_CHARS for c in interface + hostname) or interface in (".", ".."), (interface, hostname)
        return
    branch("positive")
    isc, kea = SERVERS["isc"], SERVERS["kea"]
    isc.check(isc.files(pool, DhcpHost())[isc.main])  # raises with the server's words if refused
    on_lo = resolve(DhcpConfig.model_validate({**data, "subnets": [{**s, "interface": "lo"} for s in data["subnets"]]}))
    kea.check(kea.files(on_lo, DhcpHost())[kea.main])


# --- issue 31: the SBOM and the TUF target names --------------------------------------------------------------


# --- issue 43: a hardware.csv of any shape: leases or problems, never a row quoted ---------------------------------
