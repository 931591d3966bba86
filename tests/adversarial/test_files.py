"""Hostile and careless files: every file a task reads, through the one loader and its models.

Alias bombs, recursion, duplicate keys, deep nesting, wrong types and values that would land in a rendered file,
a filesystem path or a remote API. Each must exit 2 naming the file, print no traceback, leak no secret and create
nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.inproc import cli

EXAMPLES = Path(__file__).resolve().parents[2] / "config" / "examples"
BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(9)
)
HOSTILE_YAML = {
    "alias bomb": BOMB,
    "recursive alias": "a: &a [*a]\n",
    "duplicate key": "{text}\n{first_key}: again\n",
    "deep nesting": "x: " + "[" * 200 + "]" * 200 + "\n",
    "not a mapping": "- a\n- b\n",
    "python tag": "!!python/object/apply:os.system ['true']\n",
    "binary junk": "\x00\x01\x02",
    "tabs": "a:\n\t- b\n",
    "empty": "",
}


def _task_args(kind: str, path: Path) -> list[str]:
    return {
        "user": ["vsphere.setup-user", "-f", str(path), "--dry-run"],
        "cluster": ["cluster.validate", "-f", str(path), "--offline"],
        "dhcp": ["dhcp.render", "--config", str(path), "--dry-run"],
        "import": ["template.import", "--from-file", str(path), "--dry-run"],
        "bundle": ["download.hook", "--manifest", str(path), "--dry-run"],
        "release": ["build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24",
                    "--release-manifest", str(path), "--dry-run"],
    }[kind]  # fmt: skip


EXAMPLE = {
    "user": EXAMPLES / "vsphere-user.yaml",
    "cluster": EXAMPLES / "vsphere-cluster.yaml",
    "dhcp": EXAMPLES / "dhcp.yaml",
    "import": None,
    "bundle": None,
    "release": None,
}


@pytest.mark.parametrize("case", list(HOSTILE_YAML))
@pytest.mark.parametrize("kind", list(EXAMPLE))
def test_hostile_yaml_is_refused_by_every_reader(tmp_path: Path, kind: str, case: str) -> None:
    example = EXAMPLE[kind]
    text = example.read_text() if example else "a: 1\n"
    first_key = next(ln.split(":")[0] for ln in text.splitlines() if ln and ln[0].isalpha())
    body = (
        HOSTILE_YAML[case].format(text=text, first_key=first_key) if "{" in HOSTILE_YAML[case] else HOSTILE_YAML[case]
    )
    path = tmp_path / "input.yaml"
    path.write_text(body)
    res = cli(*_task_args(kind, path), env={"GOVC_URL": "https://127.0.0.1:1/sdk"}, cwd=tmp_path)
    assert res.code == 2, (kind, case, res.text)
    assert str(path) in res.err, res.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["input.yaml"], "nothing created"


def dhcp(**changes: object) -> str:
    import yaml

    data = yaml.safe_load((EXAMPLES / "dhcp.yaml").read_text())
    for key, value in changes.items():
        target = data
        *parents, last = key.split(".")
        for p in parents:
            target = target[int(p)] if p.isdigit() else target[p]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    return yaml.safe_dump(data)


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


#: hostile values of the several-subnets form (issue 32): fixed leases and the inventory they come from
RACK = {"interface": "eth1", "subnet": "10.20.0.0/24", "range": {"start": "10.20.0.50", "end": "10.20.0.99"},
        "routers": ["10.20.0.1"]}  # fmt: skip
RACK_CASES: dict[str, dict[str, object]] = {
    "hostname with a block": {
        "fixed_leases": [{"mac": "02:00:00:00:00:01", "ip": "10.20.0.5", "hostname": 'a"; }\nhost evil {'}]
    },
    "hostname with a JSON quote": {
        "fixed_leases": [{"mac": "02:00:00:00:00:01", "ip": "10.20.0.5", "hostname": 'a", "ip-address": "10.20.0.1'}]
    },
    "mac with a statement": {"fixed_leases": [{"mac": "02:00:00:00:00:01; }", "ip": "10.20.0.5", "hostname": "a"}]},
    "fixed lease ip as a number": {"fixed_leases": [{"mac": "02:00:00:00:00:01", "ip": 169083909, "hostname": "a"}]},
    "interface with a quote": {"subnets": [{**RACK, "interface": 'eth1"]'}]},
    # an alias label: the kernel takes no ':' in a name, and dhcpd -t refused it as a shared network's name
    "interface alias label": {
        "subnets": [{**RACK, "interface": "eth1:0"}, {**RACK, "interface": "eth1:0", "subnet": "10.21.0.0/24"}]
    },
    "interface dot-dot": {"subnets": [{**RACK, "interface": ".."}]},
    "csv that is not there": {"fixed_leases_csv": "no-such-hardware.csv"},
    "both forms": {"interface": "eth0"},
    "overlapping racks": {"subnets": [RACK, {**RACK, "subnet": "10.20.0.0/23"}]},
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
    ("name", "content"),
    [
        ("image.gz", b"not gzip at all"),
        ("image.gz", b"\x1f\x8b\x08\x00" + b"\x00" * 20),
        ("image.ova", b"not a tar"),
        ("image.qcow2", b"QFI\xfb" + b"\x00" * 100),
        ("image.raw", b""),
    ],
)
def test_image_verify_of_things_that_are_not_images(tmp_path: Path, name: str, content: bytes) -> None:
    image = tmp_path / name
    image.write_bytes(content)
    stem = name.rsplit(".", 1)[0]
    (tmp_path / f"{stem}.build-manifest.json").write_text(
        json.dumps({"plan": {"artifacts": [], "provider": "baremetal"}})
    )
    res = cli("image.verify", "--image", str(image), "--no-boot")
    assert res.code in (1, 2), res.text
    assert str(image) in res.err or "image" in res.err


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


def test_dhcp_schema_accepts_every_documented_form_and_refuses_what_the_tool_refuses(tmp_path: Path) -> None:
    import jsonschema
    import yaml

    validator = jsonschema.Draft202012Validator(
        json.loads(cli("dhcp.schema").out), format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    documented = yaml.safe_load((EXAMPLES / "dhcp.yaml").read_text())
    validator.validate(documented)
    plain = {**documented, "control_plane_ips": ["192.168.10.50", {"ip": "192.168.10.51", "cluster": "w-2"}]}
    validator.validate(plain)  # the plain-address form the README documents
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump({**plain, "exclusion": "shrink"}))
    assert cli("dhcp.render", "--config", str(path), "--dry-run").code == 0
    for bad in ({"lease_time": {"default": True}}, {"lease_time": {"max": 2**40}}, {"interface": 5},
                {"control_plane_ips": [12345]}, {"unknown": 1}):  # fmt: skip
        data = {**documented, **bad}
        assert not validator.is_valid(data), bad
        path.write_text(yaml.safe_dump(data))
        assert cli("dhcp.render", "--config", str(path), "--dry-run").code == 2, bad


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


#: a key misspelled below the top of a file: (file name, text, the field path, the key it meant)
NESTED_TYPOS = [
    ("dhcp.yaml", "dns_servers: [10.77.0.1]\nsubnets:\n  - interface: lo\n    subnet: 10.77.0.0/24\n"
     "    rnage: {start: 10.77.0.10, end: 10.77.0.15}\n    routers: [10.77.0.1]\n", "subnets[0].rnage", "range"),
    ("dhcp.yaml", "dns_servers: [10.77.0.1]\nsubnets:\n  - interface: lo\n    subnet: 10.77.0.0/24\n"
     "    range: {strat: 10.77.0.10, end: 10.77.0.15}\n    routers: [10.77.0.1]\n", "subnets[0].range.strat", "start"),
    ("site.yaml", "registries: {'h:5000': {usrname: u, password: p}}\n", "registries.h:5000.usrname", "username"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "text", "field", "meant"), NESTED_TYPOS)
def test_a_nested_misspelling_is_named_with_what_it_meant(
    tmp_path: Path, name: str, text: str, field: str, meant: str
) -> None:
    """ "did you mean" at every depth of a file, not only among its top-level keys; a missing nested field says
    what that field expects, not what its top-level ancestor does."""
    path = tmp_path / name
    path.write_text(text)
    image = tmp_path / "x.gz"
    image.write_bytes(b"")
    args = ("dhcp.render", "--config", str(path)) if name == "dhcp.yaml" else (
        "image.customize", "--image", str(image), "-f", str(path), "--dest", str(tmp_path / "o.gz"))  # fmt: skip
    res = cli(*args, cwd=tmp_path)
    assert res.code == 2, res.text
    assert f"{field}: unknown field; did you mean '{meant}'?" in res.err, res.err
    assert "instead of the single-subnet keys" not in res.err, "a nested field's own description, not its parent's"


@pytest.mark.parametrize("kind", ["backing", "data-file", "vmdk-extent"])
def test_an_image_that_names_host_files_is_refused_before_they_are_read(tmp_path: Path, kind: str) -> None:
    """A qcow2 with a backing file (or an external data file), or a VMDK descriptor whose extent is a host file,
    would have that file read into the working copy: refused by what ``qemu-img info`` says, which opens none of
    them (outside review: image.diff read a qcow2's host backing file before refusing it)."""
    import subprocess

    secret = tmp_path / "host-secret"
    secret.write_bytes(b"S3CRET-HOST-FILE".ljust(1024 * 1024, b"\0"))
    image = tmp_path / ("disk.vmdk" if kind == "vmdk-extent" else "disk.qcow2")
    if kind == "backing":
        argv = ["qemu-img", "create", "-f", "qcow2", "-b", str(secret), "-F", "raw", str(image)]
    elif kind == "data-file":
        argv = ["qemu-img", "create", "-f", "qcow2", "-o", f"data_file={secret},data_file_raw=on", str(image), "1M"]
    else:
        head = '# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType="monolithicFlat"\n'
        image.write_text(head + f'RW 2048 FLAT "{secret}" 0\n')
        argv = []
    if argv:
        subprocess.run(argv, check=True, capture_output=True)
    before = secret.stat().st_atime_ns
    res = cli("image.diff", "--image", str(image), "--against", str(image), cwd=tmp_path)
    assert res.code == 2 and "reads other files" in res.err and str(image) in res.err, res.text
    assert "S3CRET" not in res.text
    assert secret.stat().st_atime_ns == before or secret.stat().st_atime_ns <= before, "the host file was not read"
