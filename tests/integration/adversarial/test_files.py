"""Hostile and careless files: every file a task reads, through the one loader and its models.

Alias bombs, recursion, duplicate keys, deep nesting, wrong types and values that would land in a rendered file,
a filesystem path or a remote API. Each must exit 2 naming the file, print no traceback, leak no secret and create
nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.hostile_files import EXAMPLES
from tests.support.inproc import cli

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


# --- the JSON Schemas accept what the tool accepts -------------------------------------------------------------------


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
