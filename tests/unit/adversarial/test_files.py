"""Hostile and careless files: every file a task reads, through the one loader and its models.

Alias bombs, recursion, duplicate keys, deep nesting, wrong types and values that would land in a rendered file,
a filesystem path or a remote API. Each must exit 2 naming the file, print no traceback, leak no secret and create
nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.hostile_files import EXAMPLES, RACK, RACK_CASES, dhcp
from tests.support.inproc import cli

DHCP_CASES = {
    "cluster with a newline block": {"control_plane_ips.0.cluster": "mgmt\nsubnet 10.9.9.0 netmask 255.255.255.0 {}"},
    "cluster with a host block": {"control_plane_ips.0.cluster": "x }\nhost evil { hardware ethernet 1:2:3:4:5:6; }"},
    "cluster with a quote": {"control_plane_ips.0.cluster": 'a";'},
    "cluster starting with a digit": {"control_plane_ips.0.cluster": "1abc"},
    "cluster too long": {"control_plane_ips.0.cluster": "a" * 81},
    "domain with a quote": {"domain_name": 'x"; option routers 1.1.1.1; "'},
    "domain with spaces": {"domain_name": "not a domain!"},
    "domain with a newline": {"domain_name": "a.com\n}"},
    "interface with a quote": {"interface": 'eth0"\nINTERFACESv6="eth1'},
    "interface too long": {"interface": "x" * 16},
    "lease 10^10": {"lease_time.default": 10**10},
    "lease true": {"lease_time.max": True},
    "lease text": {"lease_time.max": "7200"},
    "lease float": {"lease_time.default": 600.5},
    "lease zero": {"lease_time.default": 0},
    "router network address": {"routers": ["192.168.10.0"]},
    "router broadcast": {"routers": ["192.168.10.255"]},
    "router outside": {"routers": ["10.0.0.1"]},
    "dns not an ip": {"dns_servers": ["dns.example.com"]},
    "subnet with host bits": {"subnet": "192.168.10.1/24"},
    "range reversed": {"range.start": "192.168.10.199", "range.end": "192.168.10.100"},
    "ip as a number": {"control_plane_ips.0.ip": 3232238130},
    "unknown method": {"control_plane_ips.0.method": "ignore"},
    "ipv6 endpoint": {"control_plane_ips.0.ip": "::1"},
}


@pytest.mark.parametrize("server", ["isc", "kea"])
@pytest.mark.parametrize("case", [*DHCP_CASES, *RACK_CASES])
def test_dhcp_values_that_would_inject_or_wrap(tmp_path: Path, case: str, server: str) -> None:
    """Refused before either renderer sees them: dhcpd.conf is templated, Kea's file is JSON built as data, and no
    value reaches either unless it matched its grammar."""
    import yaml

    path = tmp_path / "dhcp.yaml"
    if case in DHCP_CASES:
        path.write_text(dhcp(**DHCP_CASES[case]))
    else:
        path.write_text(yaml.safe_dump({"dns_servers": ["10.20.0.2"], "subnets": [RACK], **RACK_CASES[case]}))
    res = cli("dhcp.render", "--config", str(path), "--dest", str(tmp_path / "out"), "--server", server)
    assert res.code == 2, (case, res.text)
    assert str(path) in res.err
    assert not (tmp_path / "out").exists()


def user_yaml(**spec: object) -> str:
    import yaml

    data = yaml.safe_load((EXAMPLES / "vsphere-user.yaml").read_text())
    data["spec"].update(spec)
    return yaml.safe_dump(data)


USER_CASES = {
    "global role ReadOnly": {"globalRole": "ReadOnly"},
    "user role Admin": {"userRole": "Admin"},
    "admin role NoAccess (any case)": {"adminRole": "noaccess"},
    "same name thrice": {"globalRole": "R", "userRole": "R", "adminRole": "R"},
    "two roles the same": {"userRole": "X", "adminRole": "X"},
    "username with @": {"username": "eksa@evil"},
    "username with a newline": {"username": "eksa\nadmin"},
    "username with a space": {"username": "eks a"},
    "group with a slash": {"group": "a/b"},
    "domain not a domain": {"vSphereDomain": "not a domain!"},
    "role with a slash": {"globalRole": "a/b"},
    "datacenter with a slash": {"datacenter": "a/b"},
    "username 301 characters": {"username": "a" * 301},
    "server with a password": {"connection": {"server": "admin:S3CRET-USER@", "insecure": False}},
    "server with a bad port": {"connection": {"server": "vc:99999", "insecure": False}},
    "insecure as text": {"connection": {"server": "vc.example.com", "insecure": "yes"}},
    "object path with a newline": {"objects": {"networks": ["/dc/network/a\nb"], "datastores": [],
                                               "resourcePools": [], "folders": [], "templates": []}},
}  # fmt: skip


@pytest.mark.parametrize("case", list(USER_CASES))
def test_user_yaml_values(tmp_path: Path, case: str) -> None:
    path = tmp_path / "user.yaml"
    path.write_text(user_yaml(**USER_CASES[case]))
    res = cli("vsphere.setup-user", "-f", str(path), "--dry-run", env={"GOVC_URL": "https://127.0.0.1:1/sdk"})
    assert res.code == 2, (case, res.text)
    assert str(path) in res.err and "S3CRET-USER" not in res.text


def cluster_yaml(replace: tuple[str, str]) -> str:
    text = (EXAMPLES / "vsphere-cluster.yaml").read_text()
    old, new = replace
    assert old in text, old
    return text.replace(old, new, 1)


def _example_value(key: str) -> str:
    for line in (EXAMPLES / "vsphere-cluster.yaml").read_text().splitlines():
        if line.strip().startswith(f"{key}:"):
            return line.strip()
    raise AssertionError(key)


CLUSTER_CASES = {
    "kubernetes 1.99": ("kubernetesVersion", 'kubernetesVersion: "1.99"'),
    "kubernetes text": ("kubernetesVersion", "kubernetesVersion: latest"),
    "os windows": ("osFamily", "osFamily: windows"),
    "endpoint 0.0.0.0": ("host", 'host: "0.0.0.0"'),
    "endpoint multicast": ("host", 'host: "224.0.0.1"'),
    "endpoint loopback": ("host", 'host: "127.0.0.1"'),
    "endpoint a name": ("host", 'host: "cp.example.com"'),
    "thumbprint junk": ("thumbprint", 'thumbprint: "not-a-thumbprint"'),
    "server junk": ("server", 'server: "not a host!"'),
    "insecure text": ("insecure", 'insecure: "yes"'),
}


@pytest.mark.parametrize("case", list(CLUSTER_CASES))
def test_cluster_spec_values(tmp_path: Path, case: str) -> None:
    key, new = CLUSTER_CASES[case]
    path = tmp_path / "cluster.yaml"
    path.write_text(cluster_yaml((_example_value(key), new)))
    res = cli("cluster.validate", "-f", str(path), "--offline")
    assert res.code == 2, (case, res.text)
    assert str(path) in res.err


@pytest.mark.parametrize(
    "manifest",
    ["not json", "[]", '{"plan": []}', '{"plan": {"provider": "baremetal"}}', '{"a": 1, "a": 2}', "NaN"],
)
def test_image_verify_with_a_bad_build_manifest(tmp_path: Path, manifest: str) -> None:
    image = tmp_path / "x.gz"
    image.write_bytes(b"\x1f\x8b")
    path = tmp_path / "m.json"
    path.write_text(manifest)
    res = cli("image.verify", "--image", str(image), "--manifest", str(path), "--no-boot")
    assert res.code == 2, res.text
    assert str(path) in res.err


@pytest.mark.parametrize(("recorded", "asked"), [(None, "arm64"), ("amd64", "arm64"), ("arm64", "amd64")])
def test_image_verify_refuses_an_image_of_the_other_architecture_before_reading_it(
    tmp_path: Path, recorded: str | None, asked: str
) -> None:
    """The manifest's arch (none: a build before issue 46, amd64) against --arch: refused naming the manifest,
    before the image is read (it is not even a gzip file here)."""
    image = tmp_path / "node.gz"
    image.write_bytes(b"\x1f\x8b")
    plan: dict[str, object] = {"provider": "baremetal", "artifacts": []}
    if recorded:
        plan["arch"] = recorded
    manifest = tmp_path / "node.build-manifest.json"
    manifest.write_text(json.dumps({"plan": plan}))
    res = cli("image.verify", "--image", str(image), "--arch", asked, "--no-boot")
    assert res.code == 2, res.text
    assert str(manifest) in res.err and "plan.arch" in res.err, res.err
    assert f"built for {recorded or 'amd64'}, not {asked}" in res.err, res.err
    # the architecture it records is the one checked: past the arch, the broken disk is what fails
    same = cli("image.verify", "--image", str(image), "--arch", recorded or "amd64", "--no-boot")
    assert "plan.arch" not in same.err and same.code != 0, same.text


@pytest.mark.parametrize("arch", ["ARM64", "aarch64", "x86_64", "arm64,amd64", "arm64 ", "ａｒｍ64"])
def test_image_verify_takes_only_the_two_architectures(tmp_path: Path, arch: str) -> None:
    image = tmp_path / "node.gz"
    image.write_bytes(b"\x1f\x8b")
    res = cli("image.verify", "--image", str(image), "--arch", arch, "--no-boot")
    assert res.code == 2 and "--arch" in res.err and "amd64 or arm64" in res.err, res.text
    with_provenance = cli("image.verify", "--image", str(image), "--arch", "arm64", "--provenance", str(image))
    assert with_provenance.code == 2 and "--arch without --provenance" in with_provenance.err, with_provenance.text


# --- the JSON Schemas accept what the tool accepts -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "example"),
    [("vsphere", "vsphere-ubuntu.json"), ("vsphere", "vsphere-redhat.json"), ("ami", "ami-ubuntu.json"),
     ("baremetal", "baremetal-redhat.json"), ("baremetal", "baremetal-ubuntu.json"),
     ("cloudstack", "cloudstack-redhat.json"), ("nutanix", "nutanix-ubuntu.json")],
)  # fmt: skip
def test_provider_schemas_accept_every_documented_example(provider: str, example: str) -> None:
    import jsonschema

    schema = json.loads(cli("config.schema", "--provider", provider).out)
    jsonschema.Draft202012Validator(schema).validate(json.loads((EXAMPLES / example).read_text()))


@pytest.mark.parametrize(
    ("example", "provider", "field", "value"),
    [
        ("vsphere-ubuntu.json", "vsphere", "platform_server", "vc.example.com:99999"),
        ("vsphere-ubuntu.json", "vsphere", "platform_server", "vc.example.com:0"),
        ("vsphere-ubuntu.json", "vsphere", "platform_server", "vc.example.com:abc"),
        ("vsphere-ubuntu.json", "vsphere", "platform_server", "https://admin:S3CRET-PROV@vc.example.com/sdk"),
        ("vsphere-ubuntu.json", "vsphere", "platform_server", "999.1.1.1"),
        ("nutanix-ubuntu.json", "nutanix", "hci_endpoint", "10.0.0.1:abc"),
        ("nutanix-ubuntu.json", "nutanix", "hci_port", "99999"),
        ("nutanix-ubuntu.json", "nutanix", "hci_port", True),
    ],
)
def test_server_addresses_in_provider_configs(
    tmp_path: Path, example: str, provider: str, field: str, value: object
) -> None:
    data = json.loads((EXAMPLES / example).read_text())
    data[field] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    os_name = example.split("-")[1].removesuffix(".json")
    res = cli("build", "--os", os_name, "--hypervisor", provider, "--release-channel", "1-24",
              f"--{provider}-config", str(path), "--dry-run", "--offline")  # fmt: skip
    assert res.code == 2, (field, value, res.text)
    assert f"{path}: {field}" in res.err and "S3CRET-PROV" not in res.text
