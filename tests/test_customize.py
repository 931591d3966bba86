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
from hypothesis import given
from hypothesis import strategies as st

from imagebuilder.core.errors import InputErrors
from imagebuilder.customization.model import (
    GUESTINFO_KEYS,
    SeedDocuments,
    _public_key,
    load_customization,
    seed_documents,
)
from tests.support.pki import make_ca

if TYPE_CHECKING:
    from imagebuilder.release.source import SourceRelease


@pytest.fixture
def public_key(tmp_path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "me@example.org", "-f", str(tmp_path / "k")],
                   check=True)  # fmt: skip
    return (tmp_path / "k.pub").read_text().strip()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "customize.yaml"
    path.write_text(text)
    return path


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


def test_an_empty_file_means_defaults(tmp_path: Path) -> None:
    c = load_customization(write(tmp_path, "{}\n"))
    assert c.user.name == "image-builder" and c.user.ssh_public_key is None
    assert c.registries == [] and c.ca_certificates == [] and c.packages == []


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    (tmp_path / "not-a-cert.pem").write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    path = write(
        tmp_path,
        """
usr: {}
ca_certificates: [not-a-cert.pem, missing.pem]
registries:
  "bad host!": {username: u}
  ok.example:5000: {username: u, password_env: NOT_SET}
""",
    )
    with pytest.raises(InputErrors) as info:
        load_customization(path, env={})
    text = str(info.value) + "\n".join(str(e) for e in info.value.errors)
    assert "usr" in text and "did you mean 'user'" in text
    assert "registries" in text and "bad host!" in text
    # the second pass (certificates, secrets) runs once the file's shape is right
    path = write(
        tmp_path,
        """
ca_certificates: [not-a-cert.pem, missing.pem]
registries:
  ok.example:5000: {username: u, password_env: NOT_SET}
""",
    )
    with pytest.raises(InputErrors) as info:
        load_customization(path, env={})
    fields = [e.field for e in info.value.errors]
    assert fields == ["ca_certificates[0]", "ca_certificates[1]", "registries.ok.example:5000.password_env"]
    assert all(e.source == str(path) for e in info.value.errors)


@pytest.mark.parametrize(
    ("registry", "message"),
    [
        ("{password: p}", "a password needs a username"),
        ("{username: u, password: p, password_env: P}", "one way only"),
        ("{username: u, password_env: 'A B'}", "environment variable name"),
        ("{identitytoken: t, identitytoken_file: f}", "one way only"),
        ("{username: u, token: t}", "unknown field"),
    ],
)
def test_registry_credentials_are_given_one_way(tmp_path: Path, registry: str, message: str) -> None:
    with pytest.raises(InputErrors) as info:
        load_customization(write(tmp_path, f"registries:\n  r.example: {registry}\n"), env={})
    assert message in "\n".join(str(e) for e in info.value.errors)


@pytest.mark.parametrize(
    "hostile",
    [
        "user: {name: 'root; rm -rf /'}",
        "user: {name: '../../etc'}",
        "user: {ssh_public_key: 'ssh-ed25519 AAAA\\nssh-ed25519 BBBB'}",
        "user: {ssh_public_key: 'command=\"sh\" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJxsROT0JCyLLJsjFpJDQa+hZLU4m'}",
        "packages: ['jq; curl evil']",
        "packages: ['-oDir::Etc=/tmp']",
        "registries: {'evil.example/../x': {}}",
        "registries: {'host\\n  auth: x': {}}",
    ],
)
def test_hostile_values_are_refused(tmp_path: Path, hostile: str) -> None:
    with pytest.raises(InputErrors):
        load_customization(write(tmp_path, hostile + "\n"), env={})


def test_a_second_key_cannot_ride_along(public_key: str) -> None:
    with pytest.raises(ValueError, match="one line"):
        _public_key(f"{public_key}\n{public_key}")


def test_a_key_under_the_wrong_type_is_refused(public_key: str) -> None:
    blob = public_key.split()[1]
    with pytest.raises(ValueError, match="not a ssh-rsa key"):
        _public_key(f"ssh-rsa {blob}")


@given(st.text(max_size=200))
def test_the_key_parser_returns_one_clean_line_or_refuses(text: str) -> None:
    try:
        key = _public_key(text)
    except ValueError:
        return
    kind, blob = key.split(" ")
    assert "\n" not in key and kind in text and blob in text


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


def test_role_variables_hold_no_secret_and_safe_certificate_names(tmp_path: Path) -> None:
    make_ca(tmp_path / "../ca name;$(x).pem".replace("../", ""))
    path = write(
        tmp_path,
        """
ca_certificates: ["ca name;$(x).pem"]
registries:
  registry.local:5000: {username: robot, password_env: REG_PASSWORD}
  other.local: {identitytoken: "tok-MARK-1"}
packages: [jq]
""",
    )
    c = load_customization(path, env={"REG_PASSWORD": "pw-MARK-2"})
    role = c.role_vars(user="builder")
    text = repr(role)
    assert "MARK" not in text
    [ca] = role["customize_ca_certificates"]
    # our name on the node: the file's stem made safe, and the bundle's digest (customizing again converges; a second
    # customization's same-named CA lands beside the first)
    assert re.fullmatch(r"image-builder-ca-name-x--[0-9a-f]{12}\.crt", ca["name"]), ca["name"]
    again = load_customization(path, env={"REG_PASSWORD": "x"}).role_vars(user="b")
    assert again["customize_ca_certificates"][0]["name"] == ca["name"]
    assert role["customize_registries"] == ["registry.local:5000", "other.local"]
    env = c.secret_env()
    auth = {r["host"]: r for r in __import__("json").loads(env["IMAGE_BUILDER_REGISTRY_AUTH"])}
    assert auth["registry.local:5000"]["password"] == "pw-MARK-2"
    assert base64.b64decode(auth["registry.local:5000"]["auth"]).decode() == "robot:pw-MARK-2"
    assert auth["other.local"]["identitytoken"] == "tok-MARK-1"
    assert set(c.secret_values()) >= {"pw-MARK-2", "tok-MARK-1"}


@given(
    user=st.from_regex(r"[a-z_][a-z0-9_-]{0,31}", fullmatch=True) | st.sampled_from(["yes", "no", "null", "on", "y"]),
    hostname=st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True) | st.sampled_from(["true", "off", "no"]),
)
def test_any_valid_user_and_hostname_render_to_exactly_themselves(user: str, hostname: str) -> None:
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHBsy6ISxdwfSJP1mjm9GeBDtpPT1Lcw1NlsoOLLHWs2"
    docs = seed_documents(user, [key], hostname=hostname)
    assert yaml.safe_load(docs.meta_data)["local-hostname"] == hostname
    (entry,) = yaml.safe_load(docs.user_data)["users"]
    assert entry["name"] == entry["primary_group"] == user and entry["ssh_authorized_keys"] == [key]


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
