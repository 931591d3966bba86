"""The customization file (spec 4.8): checked before anything boots, every problem at once, secrets only read."""

from __future__ import annotations

import base64
import gzip
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from imagebuilder.core.errors import InputErrors
from imagebuilder.customization.model import (
    GUESTINFO_KEYS,
    SeedDocuments,
    _public_key,
    load_customization,
    seed_documents,
)
from tests.support.customize import write
from tests.support.pki import make_ca

if TYPE_CHECKING:
    from imagebuilder.release.source import SourceRelease


@pytest.fixture
def public_key(tmp_path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "me@example.org", "-f", str(tmp_path / "k")],
                   check=True)  # fmt: skip
    return (tmp_path / "k.pub").read_text().strip()


def test_a_full_file_is_read_with_its_secrets(tmp_path: Path, public_key: str) -> None:
    make_ca(tmp_path / "ca.pem")
    (tmp_path / "token").write_text("tok-123\n")
    path = write(
        tmp_path,
        f"""
user: {{name: builder, ssh_public_key: "{public_key}"}}
ca_certificates: [ca.pem]
registries:
  registry.local:5000: {{username: robot, password_env: REG_PASSWORD}}
  mirror.local:443: {{identitytoken_file: token}}
packages: [jq, nfs-common, jq]
""",
    )
    c = load_customization(path, env={"REG_PASSWORD": "s3cret"})
    assert c.user.name == "builder"
    assert c.user.ssh_public_key == " ".join(public_key.split()[:2])  # the comment (an address) is dropped
    assert c.ca_certificates[0][0] == "ca.pem" and "BEGIN CERTIFICATE" in c.ca_certificates[0][1]
    first, second = c.registries
    assert first.host == "registry.local:5000" and first.password is not None
    assert first.auth is not None and base64.b64decode(first.auth.get_secret_value()) == b"robot:s3cret"
    assert second.identitytoken is not None and second.identitytoken.get_secret_value() == "tok-123"
    assert c.packages == ["jq", "nfs-common"]
    assert sorted(c.secret_values()) == sorted(["s3cret", first.auth.get_secret_value(), "tok-123"])
    assert "s3cret" not in repr(c)  # secrets stay SecretStr


def test_an_ipv6_registry_is_refused_because_containerd_cannot_read_its_key(tmp_path: Path) -> None:
    path = write(tmp_path, "registries: {'[fd00::1]:443': {identitytoken: t}}\n")
    with pytest.raises(InputErrors) as info:
        load_customization(path)
    assert "containerd cannot read an IPv6 literal" in "\n".join(str(e) for e in info.value.errors)
    # what containerd itself says of such a key (the reason for the rule)
    config = tmp_path / "config.toml"
    config.write_text(
        subprocess.run(["containerd", "config", "default"], capture_output=True, text=True, check=True).stdout
        + '[plugins."io.containerd.grpc.v1.cri".registry.configs."[fd00::1]:443".auth]\n  identitytoken = "t"\n'
    )
    dump = subprocess.run(["containerd", "--config", str(config), "config", "dump"], capture_output=True, check=False)
    assert dump.returncode != 0


def test_a_second_key_cannot_ride_along(public_key: str) -> None:
    with pytest.raises(ValueError, match="one line"):
        _public_key(f"{public_key}\n{public_key}")


def test_a_key_under_the_wrong_type_is_refused(public_key: str) -> None:
    blob = public_key.split()[1]
    with pytest.raises(ValueError, match="not a ssh-rsa key"):
        _public_key(f"ssh-rsa {blob}")


# --- the cloud-init documents (spec 4.8 steps 2 and 3) -------------------------------------------------------------


def test_the_documents_say_exactly_what_spec_4_8_lists(public_key: str) -> None:
    docs = seed_documents("builder", [public_key])
    meta = yaml.safe_load(docs.meta_data)
    assert meta["instance-id"].startswith("iid-") and meta["local-hostname"]
    assert meta["network"] == {"version": 2, "ethernets": {"id0": {"match": {"name": "ens*"}, "dhcp4": True}}}
    assert docs.user_data.startswith("#cloud-config\n")
    (user,) = yaml.safe_load(docs.user_data)["users"]
    assert user == {
        "name": "builder",
        "primary_group": "builder",
        "sudo": "ALL=(ALL) NOPASSWD:ALL",
        "groups": "sudo, wheel",
        "lock_passwd": True,
        "ssh_import_id": "None",
        "ssh_authorized_keys": [" ".join(public_key.split()[:2])],
    }
    assert seed_documents("builder", [public_key]).meta_data != docs.meta_data  # a fresh instance-id per run


def test_guestinfo_is_gzip_base64_and_decodes_to_the_same_bytes(public_key: str) -> None:
    docs = seed_documents("builder", [public_key])
    props = docs.guestinfo()
    assert list(props) == list(GUESTINFO_KEYS)
    assert props["guestinfo.metadata.encoding"] == props["guestinfo.userdata.encoding"] == "gzip+base64"
    assert gzip.decompress(base64.b64decode(props["guestinfo.userdata"])).decode() == docs.user_data
    assert SeedDocuments.from_guestinfo(props) == docs
    files = docs.nocloud_files()
    assert files["meta-data"] == docs.meta_data and files["user-data"] == docs.user_data
    assert yaml.safe_load(files["network-config"]) == yaml.safe_load(docs.meta_data)["network"]


@pytest.mark.parametrize(
    ("user", "key"),
    [
        ("root\n  sudo: ALL", None),
        ("-oops", None),
        ("builder", "ssh-ed25519 AAAA\n  - ssh-rsa AAAAB3"),
        ("builder", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA}} {{ x"),
    ],
)
def test_nothing_outside_its_grammar_reaches_the_user_data(user: str, key: str | None, public_key: str) -> None:
    with pytest.raises(ValueError):
        seed_documents(user, [key or public_key])


# --- image.customize: what is checked before a VM boots ------------------------------------------------------------


def test_image_customize_checks_formats_and_destinations_before_booting(tmp_path: Path) -> None:
    from imagebuilder.image.apply_customization import check_request
    from tests.support.common import run

    disk = tmp_path / "node.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(disk), "64M"], check=True)
    gz = tmp_path / "node.gz"
    gz.write_bytes(gzip.compress(b"\0" * 1024))
    assert check_request(disk, tmp_path / "out.qcow2") == "qcow2"
    assert check_request(gz, tmp_path / "out.gz") == "gz"
    spec = write(tmp_path, "packages: [jq]\n")
    cases = [
        (["--image", str(gz), "--dest", str(tmp_path / "out.raw")], "--dest", "does not end in .gz"),
        (["--image", str(disk), "--dest", str(disk)], "--dest", "is the input image"),
        (["--image", str(tmp_path / "customize.yaml"), "--dest", str(tmp_path / "o")], "customize.yaml", "disk image"),
    ]
    for args, where, message in cases:
        res = run("image.customize", *args, "-f", str(spec), "--dry-run")
        assert res.code == 2 and where in res.err and message in res.err, res.err
    res = run(
        "image.customize", "--image", str(disk), "-f", str(spec), "--dest", str(tmp_path / "o.qcow2"), "--dry-run"
    )
    assert res.code == 0 and "would customize" in res.out and "packages: jq" in res.out
    (tmp_path / "o.qcow2").write_text("already here")
    res = run("image.customize", "--image", str(disk), "-f", str(spec), "--dest", str(tmp_path / "o.qcow2"))
    assert res.code == 0 and "left alone" in res.out
    assert (tmp_path / "o.qcow2").read_text() == "already here"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["customize.yaml", "node.gz", "node.qcow2", "o.qcow2"]


def run_containerd_tasks(tmp_path: Path, config: Path, customization: Path, env: dict[str, str]) -> str:
    """The customize role's containerd tasks, run for real by Ansible on this host against ``config``."""
    import json
    import os
    import sys

    from imagebuilder.core.paths import BUNDLE

    c = load_customization(customization, env=env)
    # no service restart: this host's containerd is not ours to touch
    variables = {**c.role_vars(user="builder"), "customize_containerd_config": str(config),
                 "customize_restart_containerd": False}  # fmt: skip
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    play = tmp_path / "play.yml"
    play.write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - {ansible.builtin.include_role: {name: customize, tasks_from: containerd.yml}}\n"
    )
    run = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", f"@{tmp_path / 'vars.json'}", "-e", f"ansible_python_interpreter={sys.executable}", str(play)],
        env={**os.environ, **c.secret_env(), "ANSIBLE_ROLES_PATH": str(BUNDLE / "ansible" / "roles"),
             "ANSIBLE_NOCOLOR": "1", "HOME": str(tmp_path)},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:]
    for secret in c.secret_values():
        assert secret not in run.stdout + run.stderr
    return run.stdout


def test_registry_credentials_from_two_customizations_add_up_and_rerunning_converges(tmp_path: Path) -> None:
    config = tmp_path / "etc" / "config.toml"
    build = write(tmp_path, "registries: {'reg.local:5000': {username: u, password_env: PW}}\n")
    first = run_containerd_tasks(tmp_path, config, build, {"PW": "first-Secret-1"})
    assert "changed=" in first and config.stat().st_mode & 0o777 == 0o600
    after_build = config.read_text()
    site = write(tmp_path, "registries: {'harbor.site:443': {identitytoken: 'tok\"en'}}\n")
    run_containerd_tasks(tmp_path, config, site, {})
    text = config.read_text()
    assert text.startswith(after_build), "the build's registry stays as it was"
    assert text.count("# BEGIN image-builder registry credentials for") == 2
    # the same customization again changes nothing
    again = run_containerd_tasks(tmp_path, config, site, {})
    assert re.search(r"changed=0\b", again), again[-800:]
    assert config.read_text() == text
    # real containerd reads both registries' auth back, the quote in the token escaped
    dump = subprocess.run(["containerd", "--config", str(config), "config", "dump"],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert '[plugins."io.containerd.grpc.v1.cri".registry.configs."reg.local:5000".auth]' in dump
    assert 'password = "first-Secret-1"' in dump
    assert 'identitytoken = "tok\\"en"' in dump


@pytest.mark.slow
def test_registry_credentials_go_where_containerd_2_3_reads_them(tmp_path: Path, source_release: SourceRelease) -> None:
    """On the release's containerd 2.3 (its own default configuration, version 4) the role writes the credentials
    under the CRI images plugin, and that containerd reads them back."""
    containerd = next(c.bin_dir for c in source_release.components if c.name == "containerd") / "containerd"
    config = tmp_path / "etc" / "config.toml"
    config.parent.mkdir()
    default = subprocess.run([str(containerd), "config", "default"], capture_output=True, text=True, check=True)
    assert default.stdout.startswith("version = 4")
    config.write_text(default.stdout)
    build = write(tmp_path, "registries: {'reg.local:5000': {username: u, password_env: PW}}\n")
    run_containerd_tasks(tmp_path, config, build, {"PW": "second-Secret-2"})
    dump = subprocess.run([str(containerd), "--config", str(config), "config", "dump"],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "[plugins.'io.containerd.cri.v1.images'.registry.configs.'reg.local:5000'.auth]" in dump, dump[-2000:]
    assert "password = 'second-Secret-2'" in dump and "username = 'u'" in dump
